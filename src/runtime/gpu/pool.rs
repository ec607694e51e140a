//! Device buffers by size class. Sizes are rounded up to a quarter of their power of two
//! (at most 25% slack), so steady-state calls find every buffer in a free list and
//! allocate nothing. Reuse is safe without locking calls against each other: a recorded
//! dispatch holds its buffers (`Arc<DevBuf>`) until its submit has completed, and a
//! window of a buffer (`DTensor::row`) holds the whole buffer, so a buffer in the pool is
//! never read or written by pending GPU work. Dropped buffers are parked
//! in `pending` and join the free lists after the next completed submit. Calls on
//! several threads, or nested calls (a `py_function` callback evaluating a tensor), each
//! own their buffers.
//!
//! Idle memory is bounded, so one large call does not pin its buffers for the life of
//! the process: a free buffer not reused within `max_idle_submits` submits is destroyed,
//! and free bytes over `max_idle_bytes` are destroyed least recently used first
//! (`FERROKERAS_GPU_POOL_MAX_IDLE_MB`, default 256; `FERROKERAS_GPU_POOL_MAX_IDLE_SUBMITS`,
//! default 1000; read by `base::config`). `clear` (from `K.clear_session`) destroys every free buffer.

use super::context::Context;
use crate::base::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// A free buffer and the submit count when it was last given back.
struct Idle {
    buf: wgpu::Buffer,
    since: u64,
}

pub struct Pool {
    free: HashMap<(u64, bool), Vec<Idle>>,
    pending: Vec<(u64, bool, wgpu::Buffer)>,
    free_bytes: u64,
    free_buffers: u64,
    /// Completed submits (the pool's clock).
    submits: u64,
    pub max_idle_bytes: u64,
    pub max_idle_submits: u64,
    /// Bytes of every buffer that exists (live, pending and free).
    pub allocated: u64,
    /// Buffers created, taken from a free list, and destroyed.
    pub allocations: u64,
    pub reuses: u64,
    pub released: u64,
}

impl Default for Pool {
    fn default() -> Pool {
        Pool {
            free: HashMap::new(),
            pending: Vec::new(),
            free_bytes: 0,
            free_buffers: 0,
            submits: 0,
            max_idle_bytes: crate::base::config::settings().gpu_pool_max_idle_bytes,
            max_idle_submits: crate::base::config::settings().gpu_pool_max_idle_submits,
            allocated: 0,
            allocations: 0,
            reuses: 0,
            released: 0,
        }
    }
}

pub fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(256);
    let base = 1u64 << (63 - b.leading_zeros());
    if b == base {
        return b;
    }
    let q = base / 4;
    b.div_ceil(q) * q
}

impl Pool {
    /// Makes buffers freed since the last call reusable (the caller has waited for its
    /// submit), then trims idle memory to the bounds.
    pub fn recycle(&mut self) {
        self.submits += 1;
        let now = self.submits;
        for (class, staging, buf) in self.pending.drain(..) {
            self.free_bytes += class;
            self.free_buffers += 1;
            self.free
                .entry((class, staging))
                .or_default()
                .push(Idle { buf, since: now });
        }
        // Ageing needs a scan of every free buffer; once per 16 submits is plenty.
        let expire = if now.is_multiple_of(16) {
            now.checked_sub(self.max_idle_submits)
        } else {
            None
        };
        if expire.is_some() || self.free_bytes > self.max_idle_bytes {
            self.trim(expire, self.max_idle_bytes);
        }
    }

    /// Destroys free buffers last given back at or before submit `expire`, then the least
    /// recently used ones until at most `keep` free bytes remain.
    fn trim(&mut self, expire: Option<u64>, keep: u64) {
        let mut dead: Vec<Idle> = Vec::new();
        if let Some(t) = expire {
            for v in self.free.values_mut() {
                // Each list is in the order buffers came back, oldest first.
                let n = v.iter().take_while(|b| b.since <= t).count();
                dead.extend(v.drain(..n));
            }
        }
        let mut bytes = self.free_bytes - dead.iter().map(|b| b.buf.size()).sum::<u64>();
        if bytes > keep {
            let mut all: Vec<(u64, (u64, bool))> = self
                .free
                .iter()
                .flat_map(|(&k, v)| v.iter().map(move |b| (b.since, k)))
                .collect();
            all.sort_unstable();
            for (_, k) in all {
                if bytes <= keep {
                    break;
                }
                let b = self.free.get_mut(&k).expect("listed").remove(0);
                bytes -= b.buf.size();
                dead.push(b);
            }
        }
        self.free.retain(|_, v| !v.is_empty());
        for b in dead {
            self.free_bytes -= b.buf.size();
            self.free_buffers -= 1;
            self.allocated -= b.buf.size();
            self.released += 1;
            b.buf.destroy();
        }
    }

    /// Trims to the current bounds now (after they changed).
    pub fn trim_to_bounds(&mut self) {
        let expire = self.submits.checked_sub(self.max_idle_submits);
        self.trim(expire, self.max_idle_bytes);
    }

    /// Destroys every free buffer (buffers in use are untouched).
    pub fn clear(&mut self) {
        self.trim(Some(u64::MAX), 0);
    }

    /// Named counters, for `ferrokeras._core.gpu_pool_stats()`.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        let pending: u64 = self.pending.iter().map(|p| p.0).sum();
        vec![
            ("pooled_bytes", self.free_bytes),
            ("pooled_buffers", self.free_buffers),
            ("live_bytes", self.allocated - self.free_bytes - pending),
            ("allocated_bytes", self.allocated),
            ("allocations", self.allocations),
            ("reuses", self.reuses),
            ("released", self.released),
            ("submits", self.submits),
            ("max_idle_bytes", self.max_idle_bytes),
            ("max_idle_submits", self.max_idle_submits),
        ]
    }
}

/// A pooled buffer; returns to the pool when the last reference drops.
pub struct DevBuf {
    buf: Option<wgpu::Buffer>,
    pub bytes: u64,
    staging: bool,
    ctx: Arc<Context>,
}

impl DevBuf {
    pub fn raw(&self) -> &wgpu::Buffer {
        self.buf.as_ref().expect("live buffer")
    }
    pub fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut p = self.ctx.pool.lock().unwrap_or_else(|e| e.into_inner());
            p.pending.push((b.size(), self.staging, b));
        }
    }
}

/// A storage buffer of at least `bytes` bytes. `what` names the tensor it will hold, for
/// the errors: over the binding limit, out of memory.
pub fn alloc(ctx: &Arc<Context>, bytes: u64, what: &dyn Fn() -> String) -> Result<Arc<DevBuf>> {
    if bytes > ctx.max_binding {
        return Err(Error::Device(format!(
            "{}: needs a {bytes}-byte GPU buffer, over the adapter's limit of {} bytes per storage buffer ({}); \
             run this function on the CPU (ferrokeras.set_device('cpu')) or make the tensor smaller",
            what(),
            ctx.max_binding,
            ctx.desc.name
        )));
    }
    let class = size_class(bytes);
    let class = if class > ctx.limits.max_buffer_size {
        bytes.div_ceil(64) * 64
    } else {
        class
    };
    take(ctx, class, false, what)
}

/// A MAP_READ staging buffer for readbacks.
pub fn alloc_staging(ctx: &Arc<Context>, bytes: u64) -> Result<Arc<DevBuf>> {
    take(ctx, size_class(bytes), true, &|| {
        "readback staging buffer".to_string()
    })
}

fn take(
    ctx: &Arc<Context>,
    class: u64,
    staging: bool,
    what: &dyn Fn() -> String,
) -> Result<Arc<DevBuf>> {
    let reused = {
        let mut p = ctx.pool.lock().unwrap_or_else(|e| e.into_inner());
        let b = p
            .free
            .get_mut(&(class, staging))
            .and_then(|v| v.pop())
            .map(|i| i.buf);
        if b.is_some() {
            p.free_bytes -= class;
            p.free_buffers -= 1;
            p.reuses += 1;
        }
        b
    };
    let buf = match reused {
        Some(b) => b,
        None => {
            let usage = if staging {
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST
            } else {
                wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST
            };
            let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let b = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: class,
                usage,
                mapped_at_creation: false,
            });
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(Error::Device(format!(
                    "out of GPU memory allocating {class} bytes for {} on {}: {e}",
                    what(),
                    ctx.desc.name
                )));
            }
            let mut p = ctx.pool.lock().unwrap_or_else(|e| e.into_inner());
            p.allocated += class;
            p.allocations += 1;
            b
        }
    };
    Ok(Arc::new(DevBuf {
        buf: Some(buf),
        bytes: class,
        staging,
        ctx: ctx.clone(),
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        use super::size_class;
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(1025), 1280);
        assert_eq!(size_class(1600), 1792);
        for b in [300u64, 5000, 123_457, 10_000_000] {
            let c = size_class(b);
            assert!(c >= b && (c as f64) <= b as f64 * 1.25 + 64.0 && c.is_multiple_of(4));
        }
    }
}
