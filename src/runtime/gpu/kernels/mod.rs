//! Lowerings of the non-elementwise primitives to the hand-written kernels in
//! `shaders/{movement,reduce,scatter,matmul,random,conv,pool}.wgsl`, one file per family
//! of `src/ops` (`kernels/conv.rs` lowers the primitives of `ops/conv`, and so on). Each
//! lowering computes its runtime output shape (raising the same errors as the CPU kernel),
//! then records dispatches; `record` sends each node to its lowering.

use super::exec::{Exec, Slot};
use super::pipelines::dtag;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::fuse::Group;
use crate::ops::graph::Tensor;
use crate::ops::Op;

mod conv;
mod matmul;
mod movement;
mod pool;
mod random;
mod reduce;

pub(crate) use movement::{copy, copy_row, write_out, write_row};

/// Whether the GPU lowering of `t` handles its dtypes (the rest run on the CPU); the
/// table is `Op::gpu_supports`.
pub(crate) fn supports(t: &Tensor) -> bool {
    t.op().gpu_supports(t.dtype())
}

fn c_strides(shape: &[usize]) -> Vec<i64> {
    crate::base::shape::row_major_strides(shape)
        .into_iter()
        .map(|s| s as i64)
        .collect()
}

fn tag(d: DType) -> Result<&'static str> {
    dtag(d).ok_or_else(|| Error::Runtime(format!("internal: {d} reached a GPU kernel")))
}

fn shape_value(ex: &Exec, j: usize, what: &str) -> Result<Vec<i64>> {
    ex.slot(j)
        .host
        .as_ref()
        .map(|v| v.to_i64_vec())
        .ok_or_else(|| Error::Runtime(format!("{what}: the target shape is not on the host")))
}

/// The host value of slot `j` (a target shape).
fn host_value(ex: &Exec, j: usize, what: &str) -> Result<Value> {
    ex.slot(j)
        .host
        .clone()
        .ok_or_else(|| Error::Runtime(format!("{what}: the target shape is not on the host")))
}

/// The most loop iterations one invocation of a convolution or pooling kernel may run:
/// past it (a convolution over some 40000 input channels per group, a pooling window of
/// 30000 elements) the node runs its CPU kernel instead, since software rasterisers
/// (Mesa llvmpipe) end a shader after 65535 loop iterations, counting inner loops.
const LOOP_BUDGET: usize = 60000;

/// The adapter's largest workgroup count per grid dimension.
fn max_groups(ex: &Exec) -> usize {
    (ex.ctx.limits.max_compute_workgroups_per_dimension as usize).max(1)
}

/// Splits a grid of `counts` workgroups into dispatches of at most `limit` per dimension:
/// (first workgroup of each dimension, workgroup counts) per dispatch, none for an empty grid.
fn split_grid(counts: [usize; 3], limit: usize) -> Vec<([usize; 3], [u32; 3])> {
    let starts = |n: usize| (0..n).step_by(limit).map(move |s| (s, limit.min(n - s)));
    let mut out = Vec::new();
    for (z0, nz) in starts(counts[2]) {
        for (y0, ny) in starts(counts[1]) {
            for (x0, nx) in starts(counts[0]) {
                out.push(([x0, y0, z0], [nx as u32, ny as u32, nz as u32]));
            }
        }
    }
    out
}

/// Records the kernel of node `i` (a product or convolution) with group `g`, which reads
/// its result, as the kernel's epilogue (`fusion::Epilogue`) where it can: then the
/// group's outputs are in their slots and `i`'s result is never written (its slot holds
/// only its shape, for `shape` to read). Otherwise records `i` alone into its slot.
/// Returns whether the epilogue ran.
pub(crate) fn record_then(ex: &mut Exec, i: usize, g: &Group) -> Result<bool> {
    let node = &ex.plan.nodes[i];
    let slot = if let Op::MatMul { ta, tb } = node.op() {
        matmul::matmul(ex, i, *ta, *tb, Some(g))?
    } else if let Op::Conv(spec) = node.op() {
        conv::conv(ex, i, spec, Some(g))?
    } else {
        record(ex, i)?
    };
    let ran = slot.host.is_none() && slot.dev.is_none() && slot.lazy.is_none();
    ex.slots[i] = Some(slot);
    Ok(ran)
}

/// The slot of a result an epilogue consumed as it was computed: its shape only.
fn consumed(shape: Vec<usize>, dtype: DType) -> Slot {
    Slot {
        shape,
        dtype,
        host: None,
        dev: None,
        lazy: None,
    }
}

/// Records the kernel(s) of node `i`.
pub(crate) fn record(ex: &mut Exec, i: usize) -> Result<Slot> {
    let node = &ex.plan.nodes[i];
    match node.op() {
        Op::Transpose(perm) => movement::transpose(ex, i, perm),
        Op::Slice(spec) => movement::slice(ex, i, spec),
        Op::Reverse(axes) => movement::reverse(ex, i, axes),
        Op::ConcatGrad { axis, index } => movement::concat_grad(ex, i, axis, index),
        Op::SliceGrad(spec) => movement::slice_grad(ex, i, spec),
        Op::Pad { pads, value } => movement::pad(ex, i, pads, value),
        Op::Concat(axis) => movement::concat(ex, i, axis),
        Op::Gather(axis) => movement::gather(ex, i, axis),
        Op::ScatterAdd(axis) => movement::scatter_add(ex, i, axis),
        Op::Reduce { op, axes, keepdims } => reduce::reduce_op(ex, i, op, axes, keepdims),
        Op::SumTo => reduce::sum_to(ex, i),
        Op::Arg { op, axis } => reduce::arg(ex, i, op, axis),
        Op::Scan {
            op,
            axis,
            exclusive,
            reverse,
        } => reduce::scan(ex, i, op, axis, exclusive, reverse),
        Op::MatMul { ta, tb } => matmul::matmul(ex, i, *ta, *tb, None),
        Op::Conv(spec) => conv::conv(ex, i, spec, None),
        Op::ConvInputGrad(spec) => conv::conv_input_grad(ex, i, spec),
        Op::ConvKernelGrad(spec) => conv::conv_kernel_grad(ex, i, spec),
        Op::Pool(spec) => pool::pool(ex, i, spec),
        Op::PoolGrad(spec) => pool::pool_grad(ex, i, spec),
        Op::PoolSelect(spec) => pool::pool_select(ex, i, spec),
        Op::Random(st) => random::random(ex, i, st),
        Op::Placeholder(_)
        | Op::Constant(_)
        | Op::Variable(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Cast(_)
        | Op::StopGradient
        | Op::Reshape
        | Op::BroadcastTo
        | Op::ShapeOf
        | Op::ExpandDims(_)
        | Op::Squeeze(_)
        | Op::Loop(_)
        | Op::TupleGet(_)
        | Op::HostCall(_)
        | Op::Ctc(_)
        | Op::CtcDecode(_) => Err(Error::Runtime(format!(
            "internal: {} has no hand-written GPU kernel",
            node.op().name()
        ))),
    }
}
