//! The base layer: what every other layer builds on and nothing here builds on them.
//! Element types (`dtype`), static shapes (`shape`), errors (`error`), host values
//! (`value`), the helper thread that splits small kernels (`team`), the environment
//! variables the core reads (`config`) and the compile phase in progress (`progress`).

pub mod config;
pub mod dtype;
pub mod error;
pub mod progress;
pub mod shape;
pub mod team;
pub mod value;
