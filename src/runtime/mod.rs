//! Executing plans. `cpu` runs every primitive on host values; `gpu` (feature `gpu`)
//! runs them through wgpu, falling back to the CPU kernels node by node where WGSL has
//! no lowering. `device` decides which one a call uses.

pub mod cpu;
pub mod device;
pub mod function;
pub mod profile;

#[cfg(feature = "gpu")]
pub mod gpu;
#[cfg(not(feature = "gpu"))]
#[path = "gpu_stub.rs"]
pub mod gpu;

use crate::base::error::Result;
use crate::base::value::Value;
use crate::compile::Plan;
pub use function::{check_feed, Function};

/// One result of a run: a host value, or (for variable updates on a GPU) a buffer that
/// stays on the device.
pub enum Out {
    Host(Value),
    Resident(gpu::Resident),
}

impl Out {
    pub fn shape(&self) -> &[usize] {
        match self {
            Out::Host(v) => v.shape(),
            Out::Resident(r) => r.shape(),
        }
    }
}

/// Kernel launches and queue submissions of the last run, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunStats {
    pub dispatches: usize,
    pub submits: usize,
    /// Nodes of a GPU plan that ran their CPU kernel instead (no WGSL lowering, or a
    /// dtype or op the device does not compute exactly); 0 on the CPU device.
    pub host_nodes: usize,
    /// Shape-arithmetic nodes of a GPU plan, computed on the host from host values (no
    /// transfer); 0 on the CPU device.
    pub shape_nodes: usize,
}

/// Runs `plan` on the current device, with its CPU run state and GPU cache. The first
/// `n_host` results are returned as host values; the rest (update values) may stay on the
/// device. On the CPU the run may write update values into the variables' buffers as
/// `in_place` allows.
pub fn run(
    plan: &Plan,
    feeds: Vec<Value>,
    n_host: usize,
    state: &cpu::PlanState,
    cache: &gpu::PlanCache,
    in_place: Option<&cpu::InPlace>,
) -> Result<(Vec<Out>, RunStats)> {
    match device::current()? {
        device::Device::Cpu => {
            cpu::run(plan, state, feeds, in_place).map(|v| host_results(v, plan))
        }
        device::Device::Gpu(ctx) => gpu::run(&ctx, plan, feeds, n_host, cache),
    }
}

/// A CPU run's results as host `Out`s, with the plan's launch count.
pub fn host_results(values: Vec<Value>, plan: &Plan) -> (Vec<Out>, RunStats) {
    let stats = RunStats {
        dispatches: plan
            .schedule(&crate::compile::fuse::Target::cpu_configured())
            .dispatches,
        submits: 0,
        host_nodes: 0,
        shape_nodes: 0,
    };
    (values.into_iter().map(Out::Host).collect(), stats)
}
