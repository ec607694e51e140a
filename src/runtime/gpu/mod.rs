//! The wgpu device. A plan runs as one command encoder: fused elementwise kernels
//! generated from the op -> WGSL tables (`fusion`), hand-written kernels from
//! `shaders/<family>.wgsl` (`kernels`), views that alias buffers, and nodes without a
//! WGSL lowering (f64, int64 ops not computed exactly, loops, callbacks) on the CPU inside
//! the same plan (`exec`).
//! One call submits once and maps one staging buffer for all its outputs, unless a CPU
//! node needs a GPU value mid-plan.
//!
//! Module map: `context` (adapters, device, error capture), `pool` (buffers by size
//! class), `pipelines` (the shader table and pipeline cache), `transfer` (host <-> word
//! conversion), `exec` (the executor), `fusion` (grouping and codegen), `kernels`,
//! `loops` (loops whose bodies run on the device, recorded step by step),
//! `params` (the typed parameter block of each kernel), `timestamps` (GPU pass times for
//! the profiler).

mod context;
mod exec;
mod fusion;
mod kernels;
mod loops;
mod params;
mod pipelines;
mod pool;
mod timestamps;
mod transfer;

pub use context::{adapters, open, why_none, AdapterDesc, Context};
pub use exec::{run, PlanCache};

use crate::base::dtype::DType;
use crate::base::error::Result;
use crate::base::value::Value;
use crate::ops::source::DeviceCopy;
use pool::DevBuf;
use std::sync::Arc;

/// A tensor in device memory: one 32-bit word per element (two for int64), C order (see
/// `transfer`), `words()` words from byte `offset` of `buf`. A tensor with a nonzero
/// offset is a *window* of its buffer (a row of a loop's sequence or stacked result,
/// `row`): it is bound with that offset and size, downloaded from it, and keeps the
/// whole buffer alive. Nothing writes into a buffer after its kernel produced it except
/// the loop that owns a stacked result, which writes each row once (`loops`).
#[derive(Clone)]
pub struct DTensor {
    pub buf: Arc<DevBuf>,
    /// Bytes from the start of `buf`; a multiple of the adapter's
    /// `min_storage_buffer_offset_alignment`.
    pub offset: u64,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl DTensor {
    /// A tensor at the start of `buf`.
    pub fn new(buf: Arc<DevBuf>, shape: Vec<usize>, dtype: DType) -> DTensor {
        DTensor {
            buf,
            offset: 0,
            shape,
            dtype,
        }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The 32-bit words it holds (`transfer::words_per` per element).
    pub fn words(&self) -> usize {
        self.numel() * transfer::words_per(self.dtype)
    }
    /// The bytes a kernel binds for it: its words, at least one (wgpu binds no empty
    /// range).
    pub fn bytes(&self) -> u64 {
        (self.words() as u64 * 4).max(4)
    }
    pub fn ctx(&self) -> &Arc<Context> {
        self.buf.ctx()
    }
    /// The same words under another shape (a view); `shape` has as many elements.
    pub fn reshaped(&self, shape: Vec<usize>, dtype: DType) -> DTensor {
        DTensor {
            buf: self.buf.clone(),
            offset: self.offset,
            shape,
            dtype,
        }
    }
    /// The same buffer, sized for a vec4 binding (a whole number of 16-byte words; pool
    /// buffers are at least 256 bytes and a multiple of 64, so this stays inside unless
    /// a window ends within 16 bytes of its buffer's end, where it stays as it is).
    pub fn as_vec4(&self) -> DTensor {
        let words = self.numel().div_ceil(4).max(1) * 4;
        let words = if self.offset + words as u64 * 4 <= self.buf.bytes {
            words
        } else {
            self.numel()
        };
        self.reshaped(vec![words], self.dtype)
    }
    /// Row `t` of this tensor (`[T, ..]`) as a window of its buffer: `None` where the
    /// row's byte offset is not a multiple of the adapter's
    /// `min_storage_buffer_offset_alignment` (the caller copies the row instead) or the
    /// row is empty. Offsets are multiples of 16 bytes at least, which kernels reading
    /// vec4 words (`as_vec4`) need on adapters whose limit is lower.
    pub fn row(&self, t: usize) -> Option<DTensor> {
        row_window(self, t, self.align())
    }
    /// The `shape` elements from element `start` on (C order) as a window of its
    /// buffer, where their byte offset meets the alignment of `row`.
    pub fn window(&self, start: usize, shape: Vec<usize>) -> Option<DTensor> {
        let n: usize = shape.iter().product();
        let offset = self.offset + (start * transfer::words_per(self.dtype)) as u64 * 4;
        (n > 0 && start + n <= self.numel() && offset.is_multiple_of(self.align())).then(|| {
            DTensor {
                buf: self.buf.clone(),
                offset,
                shape,
                dtype: self.dtype,
            }
        })
    }
    /// The byte alignment of a window's offset: the adapter's
    /// `min_storage_buffer_offset_alignment`, 16 bytes at least.
    fn align(&self) -> u64 {
        (self.ctx().limits.min_storage_buffer_offset_alignment as u64).max(16)
    }
    /// Whether `other` is bound from the same buffer.
    pub fn same_buffer(&self, other: &DTensor) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf)
    }
    /// Whether `other` is the same words of the same buffer (its shape aside).
    pub fn same_words(&self, other: &DTensor) -> bool {
        self.same_buffer(other) && self.offset == other.offset && self.words() == other.words()
    }
}

/// Row `t` of `x` as a window, where its byte offset is a multiple of `align`.
fn row_window(x: &DTensor, t: usize, align: u64) -> Option<DTensor> {
    let (&rows, row) = x.shape.split_first()?;
    let words = row.iter().product::<usize>() * transfer::words_per(x.dtype);
    Some(DTensor {
        buf: x.buf.clone(),
        offset: row_offset(x.offset, rows, words, t, align)?,
        shape: row.to_vec(),
        dtype: x.dtype,
    })
}

/// The byte offset of row `t` of `rows` rows of `words` words each from byte `base`, if
/// it is a multiple of `align` and the row is not empty.
fn row_offset(base: u64, rows: usize, words: usize, t: usize, align: u64) -> Option<u64> {
    let offset = base + (t * words) as u64 * 4;
    (t < rows && words > 0 && offset.is_multiple_of(align.max(4))).then_some(offset)
}

/// A variable's value kept on a GPU between calls (see `ops::source::VarState`).
#[derive(Clone)]
pub struct Resident(pub(crate) DTensor);

impl Resident {
    pub fn shape(&self) -> &[usize] {
        &self.0.shape
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    pub fn context_id(&self) -> u64 {
        self.0.ctx().id
    }
    /// Copies the value back to the host (one submit, one map).
    pub fn download(&self) -> Result<Value> {
        let ctx = self.0.ctx().clone();
        let words = exec::read_back(&ctx, std::slice::from_ref(&self.0))?;
        Ok(transfer::from_words(self.0.dtype, &self.0.shape, &words[0]))
    }
}

impl DeviceCopy for Resident {
    fn device_id(&self) -> u64 {
        self.context_id()
    }
    fn download(&self) -> Result<Value> {
        Resident::download(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Buffer-pool and pipeline-cache counters of a device, for tests and benchmarks.
pub fn stats(ctx: &Context) -> (u64, u64, usize) {
    let p = ctx.pool.lock().unwrap_or_else(|e| e.into_inner());
    let c = ctx.pipelines.lock().unwrap_or_else(|e| e.into_inner());
    (p.allocations, p.allocated, c.compiled)
}

/// Buffer-pool counters of a device (`pool::Pool::stats`).
pub fn pool_stats(ctx: &Context) -> Vec<(&'static str, u64)> {
    ctx.pool.lock().unwrap_or_else(|e| e.into_inner()).stats()
}

/// Sets the bounds on a device's idle pool memory (`None` keeps a bound), then trims to them.
pub fn pool_limits(ctx: &Context, max_idle_bytes: Option<u64>, max_idle_submits: Option<u64>) {
    let mut p = ctx.pool.lock().unwrap_or_else(|e| e.into_inner());
    p.max_idle_bytes = max_idle_bytes.unwrap_or(p.max_idle_bytes);
    p.max_idle_submits = max_idle_submits.unwrap_or(p.max_idle_submits);
    p.trim_to_bounds();
}

/// Destroys the free buffers of every opened device.
pub fn pool_clear() {
    for ctx in context::opened() {
        ctx.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Compiles a WGSL compute shader on `ctx` through the pipeline cache (tests of the
/// shader-error path).
pub fn compile_wgsl(ctx: &Arc<Context>, src: &str, entry: &str) -> Result<()> {
    pipelines::generated(ctx, src, entry).map(|_| ())
}

/// Destroys `ctx`'s device, so that it is lost (tests of the device-loss path).
pub fn lose(ctx: &Context) {
    ctx.destroy();
}

#[cfg(test)]
mod tests {
    use super::row_offset;

    /// Rows are windows exactly where their byte offset meets the alignment; the rest
    /// (and empty rows, and rows past the end) are copied by the loop.
    #[test]
    fn rows_are_windows_where_their_offset_is_aligned() {
        // 64 words = 256 bytes a row: every row aligned, for any alignment up to 256.
        for align in [16, 64, 256] {
            for t in 0..5 {
                assert_eq!(row_offset(0, 5, 64, t, align), Some(t as u64 * 256));
            }
        }
        // 15 words = 60 bytes: only row 0 is at a multiple of 16 or 256.
        assert_eq!(row_offset(0, 4, 15, 0, 256), Some(0));
        for t in 1..4 {
            assert_eq!(row_offset(0, 4, 15, t, 16), None);
        }
        // 48 words = 192 bytes: rows 0 and 4 at multiples of 256, every row of 64.
        let at256: Vec<Option<u64>> = (0..5).map(|t| row_offset(0, 5, 48, t, 256)).collect();
        assert_eq!(at256, vec![Some(0), None, None, None, Some(768)]);
        assert!((0..5).all(|t| row_offset(0, 5, 48, t, 64).is_some()));
        // A window of a window: offsets add up.
        assert_eq!(row_offset(512, 3, 64, 2, 256), Some(1024));
        assert_eq!(row_offset(512, 3, 0, 1, 256), None);
        assert_eq!(row_offset(0, 3, 64, 3, 256), None);
    }
}
