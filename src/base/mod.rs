//! The base layer: what every other layer builds on and nothing here builds on them.
//! Element types (`dtype`), static shapes (`shape`), errors (`error`), host values
//! (`value`) and the helper thread that splits small kernels (`team`).

pub mod dtype;
pub mod error;
pub mod shape;
pub mod team;
pub mod value;
