//! Executing plans. `cpu` runs every primitive on host values.

pub mod cpu;
pub mod value;
