//! The CPU fusion kernel: runs a `compile::fuse::Group` as one pass over chunks of
//! `CH` elements. The members become a small register program (bool values are
//! 1.0/0.0 in f32 registers), compiled once per input layout and kept with the plan's
//! run state (`cpu::PlanState`, one `Programs` per group), so a call only collects
//! pointers; members whose inputs are all single values are computed once per call, as
//! scalars, and members whose inputs all repeat with one period (per-channel values
//! broadcast over the leading dims, with single values) once per call over that period.
//! Each external input is read with its own broadcast pattern:
//! directly (same size), as one value, or gathered through strides into a register.
//! Outputs are written once per chunk, into a dead input's buffer when the plan holds its
//! only reference.
//! The per-element code is the op tables' (`UnaryOp::map`, `BinaryOp::zip`), so fused and
//! unfused results are bitwise equal.
//!
//! One concern per file:
//! - `program`: the register-program compiler (a `Body` per input layout, cached per group);
//! - `layout`: member shapes and how each input is read (strides, slices, periods);
//! - `regalloc`: the register allocator;
//! - `run`: a call (pointers, output buffers, splitting the elements over threads);
//! - `reuse`: outputs written into dead inputs' buffers;
//! - `epilogue`: groups run image by image after a conv or pool;
//! - `fold`: sums and means folded into the pass;
//! - `update`: the kernel of optimizer update rules (`compile::update_rule`);
//! - `affine`: batch norm's kernels (its output, a relu or relu6 gradient after it);
//! - `exec`: the unsafe chunk executor.

mod affine;
mod epilogue;
mod exec;
mod fold;
mod layout;
mod program;
mod regalloc;
mod reuse;
mod run;
mod update;

pub use program::Programs;
#[cfg(test)]
pub use program::{affine_chains, rules_of};
pub use run::run;

use crate::ops::{BinaryOp, UnaryOp};

/// Elements per chunk: a register is 4 KiB, so a program's registers stay in L1/L2.
const CH: usize = 1024;
/// Work (adds) from which a group below the parallel grain is split with the helper
/// thread of a loop or a short run (`team`).
const TEAM_WORK: usize = 1 << 15;
/// Virtual register ids of gathered inputs start here (instruction results are below).
const LOAD_BASE: u16 = 1 << 15;
/// A destination from here up to `LOAD_BASE` is f32 output `d - OUT_BASE`, written directly.
const OUT_BASE: u16 = 1 << 14;

#[derive(Clone, Copy, Debug)]
enum Opd {
    Reg(u16),
    /// A same-size f32 input, read in place.
    Ext(u16),
    /// A single value: scalar input or scalar-only member `.0` of the call's scalars.
    Scal(u16),
    /// An f32 output already written in this chunk (its index among the written outputs).
    Out(u16),
    /// An f32 input that repeats with a period along the flat index (a bias broadcast over
    /// the leading dims), read in place from a copy of one period tiled past a chunk.
    Tile(u16),
}

#[derive(Clone, Copy, Debug)]
enum Ins {
    /// Gathers external input `.0` (the index into `Body::loads`) into a register.
    Load(u16, u16),
    Unary(UnaryOp, Opd, u16),
    Not(Opd, u16),
    ToBool(Opd, u16),
    Binary(BinaryOp, Opd, Opd, u16),
    Select(Opd, Opd, Opd, u16),
}

#[derive(Clone, Copy)]
enum Data {
    F32(*const f32),
    Bool(*const bool),
}
#[derive(Clone, Copy)]
enum OutBuf {
    F32(*mut f32),
    Bool(*mut bool),
}

/// Output `k` of a group: an input passed through, or a value of the program.
#[derive(Clone, Copy)]
enum Out {
    Passed(usize),
    F32(Opd),
    Bool(Opd),
}
