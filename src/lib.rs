//! ferrokeras core: a lazy graph of primitives with reverse-mode autodiff, compiled into
//! plans and run on the CPU (and, with the `gpu` feature, through wgpu). The Python facade
//! `ferrokeras.backend` reaches it through the private `ferrokeras._core` module.

// Proving `Plan: Sync` for the loop runtime's static cache walks deep into wgpu's types.
#![recursion_limit = "256"]

pub mod autodiff;
pub mod base;
pub mod compile;
pub mod ops;
pub mod runtime;

#[cfg(feature = "python")]
mod py;

#[cfg(test)]
mod tests;

pub use base::dtype::DType;
pub use base::error::{Error, Result};
pub use ops::graph::Tensor;

/// The engine's allocations: small blocks from mimalloc, large ones from the system's
/// malloc (`runtime/cpu/alloc.rs` says why).
#[global_allocator]
static ALLOC: runtime::cpu::alloc::EngineAlloc = runtime::cpu::alloc::EngineAlloc;
