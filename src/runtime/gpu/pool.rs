//! Device buffers by size class. Sizes are rounded up to a quarter of their power of two
//! (at most 25% slack), so steady-state calls find every buffer in a free list and
//! allocate nothing. Reuse is safe without locking calls against each other: a recorded
//! dispatch holds its buffers (`Arc<DevBuf>`) until its submit has completed, so a buffer
//! in the pool is never read or written by pending GPU work. Dropped buffers are parked
//! in `pending` and join the free lists after the next completed submit. Calls on
//! several threads, or nested calls (a `py_function` callback evaluating a tensor), each
//! own their buffers.

use super::context::Context;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Free memory kept for reuse beyond which freed buffers are destroyed instead.
const KEEP_FREE_BYTES: u64 = 1 << 30;

#[derive(Default)]
pub struct Pool {
    free: HashMap<(u64, bool), Vec<wgpu::Buffer>>,
    pending: Vec<(u64, bool, wgpu::Buffer)>,
    free_bytes: u64,
    pub allocated: u64,
    pub allocations: u64,
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
    /// submit).
    pub fn recycle(&mut self) {
        for (class, staging, buf) in self.pending.drain(..) {
            if self.free_bytes + class > KEEP_FREE_BYTES {
                buf.destroy();
                self.allocated -= class;
                continue;
            }
            self.free_bytes += class;
            self.free.entry((class, staging)).or_default().push(buf);
        }
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
    let class = if class > ctx.limits.max_buffer_size { bytes.div_ceil(64) * 64 } else { class };
    take(ctx, class, false, what)
}

/// A MAP_READ staging buffer for readbacks.
pub fn alloc_staging(ctx: &Arc<Context>, bytes: u64) -> Result<Arc<DevBuf>> {
    take(ctx, size_class(bytes), true, &|| "readback staging buffer".to_string())
}

fn take(ctx: &Arc<Context>, class: u64, staging: bool, what: &dyn Fn() -> String) -> Result<Arc<DevBuf>> {
    let reused = {
        let mut p = ctx.pool.lock().unwrap_or_else(|e| e.into_inner());
        let b = p.free.get_mut(&(class, staging)).and_then(|v| v.pop());
        if b.is_some() {
            p.free_bytes -= class;
        }
        b
    };
    let buf = match reused {
        Some(b) => b,
        None => {
            let usage = if staging {
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST
            } else {
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST
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
    Ok(Arc::new(DevBuf { buf: Some(buf), bytes: class, staging, ctx: ctx.clone() }))
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
            assert!(c >= b && (c as f64) <= b as f64 * 1.25 + 64.0 && c % 4 == 0);
        }
    }
}
