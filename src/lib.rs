//! ferrokeras core: a lazy graph of primitives with reverse-mode autodiff, compiled into
//! plans and run on the CPU (and, with the `gpu` feature, through wgpu). The Python facade
//! `ferrokeras.backend` reaches it through the private `ferrokeras._core` module.

pub mod dtype;
pub mod error;
pub mod shape;
#[macro_use]
pub mod runtime;
pub mod autodiff;
pub mod compile;
pub mod graph;
pub mod ops;

#[cfg(feature = "python")]
mod py;

#[cfg(test)]
mod tests;

pub use dtype::DType;
pub use error::{Error, Result};
pub use graph::Tensor;
