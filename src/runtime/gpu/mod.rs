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
/// `transfer`).
#[derive(Clone)]
pub struct DTensor {
    pub buf: Arc<DevBuf>,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl DTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The 32-bit words it holds (`transfer::words_per` per element).
    pub fn words(&self) -> usize {
        self.numel() * transfer::words_per(self.dtype)
    }
    pub fn ctx(&self) -> &Arc<Context> {
        self.buf.ctx()
    }
    /// The same buffer, sized for a vec4 binding (a whole number of 16-byte words; pool
    /// buffers are at least 256 bytes and a multiple of 64, so this stays inside).
    pub fn as_vec4(&self) -> DTensor {
        let words = self.numel().div_ceil(4).max(1) * 4;
        DTensor {
            buf: self.buf.clone(),
            shape: vec![words],
            dtype: self.dtype,
        }
    }
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
