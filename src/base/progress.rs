//! What the engine is compiling right now, for the compile progress report that
//! `K.function` prints on stderr from a Python thread while a slow compile runs
//! (`python/ferrokeras/_k/function.py`). One process-wide value: with compiles on several
//! threads at once it names the most recent phase entered.

use std::sync::atomic::{AtomicU8, Ordering};

/// A compile phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Building gradient graphs (`autodiff::gradients`).
    Differentiate = 1,
    /// Ordering, merging and folding a graph into a plan (`compile::Plan::new`).
    Optimise,
    /// Grouping a plan's nodes into the CPU executor's fused kernels.
    Schedule,
    /// Making a plan for the shapes of the feeds seen (`compile::Plan::specialize`).
    Specialise,
    /// Compiling WGSL kernels into GPU pipelines.
    GpuKernels,
}

impl Phase {
    /// The phase as the progress report words it.
    pub fn describe(self) -> &'static str {
        match self {
            Phase::Differentiate => "differentiating",
            Phase::Optimise => "optimising the graph",
            Phase::Schedule => "scheduling kernels",
            Phase::Specialise => "specialising to shapes",
            Phase::GpuKernels => "compiling GPU kernels",
        }
    }

    fn from_u8(v: u8) -> Option<Phase> {
        [
            Phase::Differentiate,
            Phase::Optimise,
            Phase::Schedule,
            Phase::Specialise,
            Phase::GpuKernels,
        ]
        .into_iter()
        .find(|p| *p as u8 == v)
    }
}

static CURRENT: AtomicU8 = AtomicU8::new(0);

/// The phase entered by `enter`, until the guard drops (then the one before it).
pub struct InPhase(u8);

impl Drop for InPhase {
    fn drop(&mut self) {
        CURRENT.store(self.0, Ordering::Relaxed);
    }
}

/// Marks `phase` as what the engine is doing until the returned guard drops.
pub fn enter(phase: Phase) -> InPhase {
    InPhase(CURRENT.swap(phase as u8, Ordering::Relaxed))
}

/// The phase the engine is in, if any.
pub fn current() -> Option<Phase> {
    Phase::from_u8(CURRENT.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_reads_back() {
        for p in [
            Phase::Differentiate,
            Phase::Optimise,
            Phase::Schedule,
            Phase::Specialise,
            Phase::GpuKernels,
        ] {
            assert_eq!(Phase::from_u8(p as u8), Some(p));
        }
        assert_eq!(Phase::from_u8(0), None);
    }
}
