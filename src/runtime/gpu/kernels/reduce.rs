//! GPU lowerings of the reductions, arg-reductions and scans (`ops::reduce`) over
//! `shaders/reduce.wgsl`; a long axis takes several dispatches.

use super::super::exec::{grid, Exec, Slot};
use super::super::params::{self as blk, Params};
use super::super::pipelines::{self};
use super::super::DTensor;
use super::movement::gather_strided;
use super::{c_strides, host_value, tag};
use crate::base::dtype::DType;
use crate::base::error::Result;
use crate::ops::movement::{sum_to_axes, target_dims};
use crate::ops::{ArgOp, ReduceOp, ScanOp};
use crate::value_err;

/// Steps along a reduced or scanned axis per dispatch of the `reduce`, `arg` and `scan`
/// kernels (per thread for `reduce_tree`). A long axis takes several dispatches, each
/// going on from the one before: software rasterisers (Mesa llvmpipe) end a shader after
/// 65535 loop iterations.
const LOOP_STEPS: usize = 16384;

/// Reduces `x` over `axes` with reduction op code `code` (0 sum, 1 prod, 2 max, 3 min,
/// 4 mean) into a tensor of `out_shape`.
pub(super) fn reduce(
    ex: &mut Exec,
    i: usize,
    x: &DTensor,
    axes: &[usize],
    code: u32,
    out_shape: &[usize],
) -> Result<DTensor> {
    let r = x.shape.len();
    let mut x = x.clone();
    let (lo, hi) = match (axes.first(), axes.last()) {
        (Some(&a), Some(&b)) if b + 1 - a == axes.len() => (a, b + 1),
        (Some(_), Some(_)) => {
            let mut perm: Vec<usize> = (0..r).filter(|d| !axes.contains(d)).collect();
            perm.extend_from_slice(axes);
            let cs = c_strides(&x.shape);
            let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
            let st: Vec<i64> = perm.iter().map(|&p| cs[p]).collect();
            x = gather_strided(ex, i, &x, &shape, 0, &st)?;
            (r - axes.len(), r)
        }
        _ => (r, r),
    };
    let outer: usize = x.shape[..lo].iter().product();
    let red: usize = x.shape[lo..hi].iter().product();
    let inner: usize = x.shape[hi..].iter().product();
    let nout = outer * inner;
    let out = ex.alloc(out_shape, x.dtype, i)?;
    let t = tag(x.dtype)?;
    let block = blk::Reduce {
        outer: outer as u32,
        red: red as u32,
        inner: inner as u32,
        op: code,
        ..blk::Reduce::default()
    };
    // Steps of the reduced axis per dispatch, each going on from the one before.
    let (pipe, step, groups) = if nout < 4096 && red >= 64 {
        let x_ = nout.min(65535);
        (
            pipelines::family(ex.ctx, "reduce", "reduce_tree", t)?,
            LOOP_STEPS * 256,
            [x_ as u32, nout.div_ceil(x_.max(1)) as u32, 1],
        )
    } else {
        (
            pipelines::family(ex.ctx, "reduce", "reduce_serial", t)?,
            LOOP_STEPS,
            grid(nout),
        )
    };
    for r0 in (0..red.max(1)).step_by(step) {
        let block = blk::Reduce {
            r0: r0 as u32,
            r1: (r0 + step.min(red - r0)) as u32,
            ..block
        };
        ex.dispatch(
            pipe.clone(),
            &[(1, &out), (2, &x)],
            Params::of(&block),
            groups,
        )?;
    }
    Ok(out)
}

pub(super) fn reduce_op(
    ex: &mut Exec,
    i: usize,
    op: &ReduceOp,
    axes: &[usize],
    keepdims: &bool,
) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let node = &plan.nodes[i];
    let x = ex.dev(ins[0])?;
    if axes.iter().any(|&a| x.shape[a] == 0) {
        // An empty reduction is its identity, as the CPU kernel defines it (for
        // integers, the i64 extremes wrapped to the dtype): take it from there.
        let empty = crate::base::value::Value::full(x.dtype, &x.shape, 0.0);
        return Ok(Slot::host(node.op().cpu(&[&empty])?));
    }
    let shape = crate::ops::reduce::reduced_dims(&x.shape, axes, *keepdims);
    let code = match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Mean => 4,
    };
    Ok(Slot::dev(reduce(ex, i, &x, axes, code, &shape)?))
}

pub(super) fn sum_to(ex: &mut Exec, i: usize) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let x = ex.dev(ins[0])?;
    let target = target_dims("sum_to", &host_value(ex, ins[1], "sum_to")?)?;
    let out = if target == x.shape {
        x
    } else {
        let axes = sum_to_axes(&x.shape, &target)?;
        reduce(ex, i, &x, &axes, 0, &target)?
    };
    Ok(Slot::dev(out))
}

pub(super) fn arg(ex: &mut Exec, i: usize, op: &ArgOp, axis: &usize) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let _name = ex.plan.nodes[i].op().name();
    let x = ex.dev(ins[0])?;
    let s = x.shape.clone();
    if s[*axis] == 0 {
        return Err(value_err!(
            "{}: cannot reduce an empty axis {axis} of shape {s:?}",
            op.name()
        ));
    }
    let (outer, red, inner) = (
        s[..*axis].iter().product::<usize>(),
        s[*axis],
        s[axis + 1..].iter().product::<usize>(),
    );
    let mut shape = s.clone();
    shape.remove(*axis);
    let out = ex.alloc(&shape, DType::I64, i)?;
    let code = match op {
        ArgOp::ArgMax => 0,
        ArgOp::ArgMin => 1,
    };
    let pipe = pipelines::family(ex.ctx, "reduce", "arg", tag(x.dtype)?)?;
    for r0 in (0..red).step_by(LOOP_STEPS) {
        let block = blk::Reduce {
            outer: outer as u32,
            red: red as u32,
            inner: inner as u32,
            op: code,
            r0: r0 as u32,
            r1: red.min(r0 + LOOP_STEPS) as u32,
        };
        ex.dispatch(
            pipe.clone(),
            &[(1, &out), (2, &x)],
            Params::of(&block),
            grid(outer * inner),
        )?;
    }
    Ok(Slot::dev(out))
}

pub(super) fn scan(
    ex: &mut Exec,
    i: usize,
    op: &ScanOp,
    axis: &usize,
    exclusive: &bool,
    reverse: &bool,
) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let x = ex.dev(ins[0])?;
    let s = x.shape.clone();
    let (outer, red, inner) = (
        s[..*axis].iter().product::<usize>(),
        s[*axis],
        s[axis + 1..].iter().product::<usize>(),
    );
    let out = ex.alloc(&s, x.dtype, i)?;
    let code = match op {
        ScanOp::Cumsum => 0,
        ScanOp::Cumprod => 1,
    };
    let pipe = pipelines::family(ex.ctx, "reduce", "scan", tag(x.dtype)?)?;
    // Each dispatch goes on from the last value of the one before.
    for k0 in (0..red).step_by(LOOP_STEPS) {
        let block = blk::Scan {
            outer: outer as u32,
            red: red as u32,
            inner: inner as u32,
            op: code,
            exclusive: *exclusive as u32,
            reverse: *reverse as u32,
            k0: k0 as u32,
            klen: LOOP_STEPS.min(red - k0) as u32,
        };
        let groups = grid(outer * inner);
        ex.dispatch(
            pipe.clone(),
            &[(1, &out), (2, &x)],
            Params::of(&block),
            groups,
        )?;
    }
    Ok(Slot::dev(out))
}
