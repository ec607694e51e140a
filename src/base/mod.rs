//! The base layer: what every other layer builds on and nothing here builds on them.
//! Element types (`dtype`), static shapes (`shape`), errors (`error`), host values
//! (`value`), the helper thread that splits small kernels (`team`) and the environment
//! variables the core reads (`config`).

pub mod config;
pub mod dtype;
pub mod error;
pub mod shape;
pub mod team;
pub mod value;
