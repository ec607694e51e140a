//! Lowerings of the non-elementwise primitives to the hand-written kernels in
//! `shaders/{movement,reduce,scatter,matmul,random,conv,pool}.wgsl`. Each computes its runtime
//! output shape (raising the same errors as the CPU kernel), then records dispatches.

use super::exec::{grid, Exec, Slot};
use super::params::{self as blk, Params};
use super::pipelines::{self, dtag};
use super::transfer::scalar_word;
use super::DTensor;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::broadcast_runtime;
use crate::base::value::Value;
use crate::ops::conv::{self, cpu::Geom};
use crate::ops::graph::Tensor;
use crate::ops::movement::{indices, resolve_slice, sum_to_axes};
use crate::ops::pool::PoolKind;
use crate::ops::{random, ArgOp, Op, ReduceOp, ScanOp, SliceAxis};
use crate::value_err;

/// Whether the GPU lowering of `t` handles its dtypes (the rest run on the CPU); the
/// table is `Op::gpu_supports`.
pub(crate) fn supports(t: &Tensor) -> bool {
    t.op().gpu_supports(t.dtype())
}

fn c_strides(shape: &[usize]) -> Vec<i64> {
    let mut st = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for d in (0..shape.len()).rev() {
        st[d] = acc;
        acc *= shape[d] as i64;
    }
    st
}

fn tag(d: DType) -> Result<&'static str> {
    dtag(d).ok_or_else(|| Error::Runtime(format!("internal: {d} reached a GPU kernel")))
}

/// The `Strided` block of `n` elements iterated over `dims`, tail `dims` then `strides`.
fn strided_params(n: usize, dims: &[usize], base: i64, strides: &[i64]) -> Params {
    let block = blk::Strided {
        n: n as u32,
        rank: dims.len() as u32,
        base: base as i32,
    };
    let mut tail: Vec<u32> = dims.iter().map(|&d| d as u32).collect();
    tail.extend(strides.iter().map(|&s| s as i32 as u32));
    Params::with_tail(&block, &tail)
}

/// out[i] = src[base + sum coord_d * strides_d] over `out_shape`.
fn gather_strided(
    ex: &mut Exec,
    i: usize,
    src: &DTensor,
    out_shape: &[usize],
    base: i64,
    strides: &[i64],
) -> Result<DTensor> {
    let out = ex.alloc(out_shape, src.dtype, i)?;
    let n: usize = out_shape.iter().product();
    let p = strided_params(n, out_shape, base, strides);
    let pipe = pipelines::family(ex.ctx, "movement", "gather_strided", "u32")?;
    ex.dispatch(pipe, &[(1, &out), (2, src)], p, grid(n));
    Ok(out)
}

/// out[base + sum coord_d * strides_d] = src[i] over src's shape.
fn scatter_strided(
    ex: &mut Exec,
    out: &DTensor,
    src: &DTensor,
    base: i64,
    strides: &[i64],
) -> Result<()> {
    let n = src.numel();
    let p = strided_params(n, &src.shape, base, strides);
    let pipe = pipelines::family(ex.ctx, "movement", "scatter_strided", "u32")?;
    ex.dispatch(pipe, &[(1, out), (2, src)], p, grid(n));
    Ok(())
}

fn fill(ex: &mut Exec, out: &DTensor, word: u32) -> Result<()> {
    let n = out.numel();
    let pipe = pipelines::family(ex.ctx, "movement", "fill", "u32")?;
    let p = blk::Fill { n: n as u32, word };
    ex.dispatch(pipe, &[(1, out)], Params::of(&p), grid(n));
    Ok(())
}

/// Base offset, strides and shape of a strided slice of a tensor of `shape`.
fn slice_geometry(spec: &[SliceAxis], shape: &[usize]) -> (i64, Vec<i64>, Vec<usize>) {
    let cs = c_strides(shape);
    let mut base = 0i64;
    let mut st = Vec::with_capacity(shape.len());
    let mut dims = Vec::with_capacity(shape.len());
    for (d, s) in spec.iter().enumerate() {
        let (start, _, step, len) = resolve_slice(s, shape[d]);
        if len > 0 {
            base += start * cs[d];
        }
        st.push(step * cs[d]);
        dims.push(len);
    }
    (base, st, dims)
}

/// The most loop iterations one invocation of a convolution or pooling kernel may run:
/// past it (a convolution over some 40000 input channels per group, a pooling window of
/// 30000 elements) the node runs its CPU kernel instead, since software rasterisers
/// (Mesa llvmpipe) end a shader after 65535 loop iterations, counting inner loops.
const LOOP_BUDGET: usize = 60000;

/// Loop iterations per invocation of the convolution kernels for a GEMM contracting `k`
/// values into `cols` output channels per group: the direct kernel (under DIRECT_BELOW
/// channels) loops over them one by one, the tiled one 16 at a time with up to 25 inner
/// iterations each.
fn gemm_loop(k: usize, cols: usize) -> usize {
    if cols < DIRECT_BELOW {
        2 * k
    } else {
        k.div_ceil(16) * 25
    }
}

/// Steps along a reduced or scanned axis per dispatch of the `reduce`, `arg` and `scan`
/// kernels (per thread for `reduce_tree`). A long axis takes several dispatches, each
/// going on from the one before: software rasterisers (Mesa llvmpipe) end a shader after
/// 65535 loop iterations.
const LOOP_STEPS: usize = 16384;

/// Reduces `x` over `axes` with reduction op code `code` (0 sum, 1 prod, 2 max, 3 min,
/// 4 mean) into a tensor of `out_shape`.
fn reduce(
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
        );
    }
    Ok(out)
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

/// Records the kernel(s) of node `i`.
pub(crate) fn record(ex: &mut Exec, i: usize) -> Result<Slot> {
    let plan = ex.plan;
    let node = &plan.nodes[i];
    let ins = ex.plan.inputs[i].clone();
    let name = node.op().name();
    let out = match node.op() {
        Op::Transpose(perm) => {
            let x = ex.dev(ins[0])?;
            let cs = c_strides(&x.shape);
            let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
            let st: Vec<i64> = perm.iter().map(|&p| cs[p]).collect();
            gather_strided(ex, i, &x, &shape, 0, &st)?
        }
        Op::Slice(spec) => {
            let x = ex.dev(ins[0])?;
            let (base, st, dims) = slice_geometry(spec, &x.shape);
            gather_strided(ex, i, &x, &dims, base, &st)?
        }
        Op::Reverse(axes) => {
            let x = ex.dev(ins[0])?;
            let mut st = c_strides(&x.shape);
            let mut base = 0i64;
            for &a in axes {
                if x.shape[a] > 0 {
                    base += (x.shape[a] as i64 - 1) * st[a];
                }
                st[a] = -st[a];
            }
            let shape = x.shape.clone();
            gather_strided(ex, i, &x, &shape, base, &st)?
        }
        Op::ConcatGrad { axis, index } => {
            let g = ex.dev(ins[0])?;
            let off: usize = ins[1..1 + index]
                .iter()
                .map(|&j| ex.slot(j).shape[*axis])
                .sum();
            let len = ex.slot(ins[1 + index]).shape[*axis];
            let cs = c_strides(&g.shape);
            let mut shape = g.shape.clone();
            shape[*axis] = len;
            gather_strided(ex, i, &g, &shape, off as i64 * cs[*axis], &cs)?
        }
        Op::SliceGrad(spec) => {
            let g = ex.dev(ins[0])?;
            let like = ex.slot(ins[1]).shape.clone();
            let (base, st, dims) = slice_geometry(spec, &like);
            if dims != g.shape {
                return Err(value_err!(
                    "slice_grad: gradient shape {:?} does not match the slice shape {dims:?}",
                    g.shape
                ));
            }
            let out = ex.alloc(&like, g.dtype, i)?;
            fill(ex, &out, 0)?;
            scatter_strided(ex, &out, &g, base, &st)?;
            out
        }
        Op::Pad { pads, value } => {
            let x = ex.dev(ins[0])?;
            let shape: Vec<usize> = x
                .shape
                .iter()
                .zip(pads)
                .map(|(d, (a, b))| d + a + b)
                .collect();
            let cs = c_strides(&shape);
            let base: i64 = pads.iter().zip(&cs).map(|((a, _), s)| *a as i64 * s).sum();
            let out = ex.alloc(&shape, x.dtype, i)?;
            fill(ex, &out, scalar_word(x.dtype, *value))?;
            scatter_strided(ex, &out, &x, base, &cs)?;
            out
        }
        Op::Concat(axis) => {
            let xs: Vec<DTensor> = ins.iter().map(|&j| ex.dev(j)).collect::<Result<_>>()?;
            let mut shape = xs[0].shape.clone();
            shape[*axis] = 0;
            for x in &xs {
                let ok = x.shape.len() == shape.len()
                    && x.shape
                        .iter()
                        .zip(&shape)
                        .enumerate()
                        .all(|(d, (a, b))| d == *axis || a == b);
                if !ok {
                    let shapes: Vec<_> = xs.iter().map(|x| x.shape.clone()).collect();
                    return Err(value_err!(
                        "concatenate: shapes {shapes:?} do not match outside axis {axis}"
                    ));
                }
                shape[*axis] += x.shape[*axis];
            }
            let cs = c_strides(&shape);
            let out = ex.alloc(&shape, xs[0].dtype, i)?;
            let mut off = 0i64;
            for x in &xs {
                scatter_strided(ex, &out, x, off * cs[*axis], &cs)?;
                off += x.shape[*axis] as i64;
            }
            out
        }
        Op::Gather(axis) => {
            let p = ex.dev(ins[0])?;
            let ps = p.shape.clone();
            let (outer, n, inner) = (
                ps[..*axis].iter().product::<usize>(),
                ps[*axis],
                ps[axis + 1..].iter().product::<usize>(),
            );
            if let Some(h) = ex.slot(ins[1]).host.as_ref() {
                indices("gather", h, n)?;
            }
            let idx = ex.dev(ins[1])?;
            let mut shape = ps[..*axis].to_vec();
            shape.extend_from_slice(&idx.shape);
            shape.extend_from_slice(&ps[axis + 1..]);
            let out = ex.alloc(&shape, p.dtype, i)?;
            let total = outer * idx.numel() * inner;
            let pipe = pipelines::family(ex.ctx, "movement", "gather", "u32")?;
            let msg = format!("gather: index {{index}} is out of range for an axis of size {n} (params shape {ps:?}, indices shape {:?})", idx.shape);
            let block = blk::Indexed {
                n: total as u32,
                n_idx: idx.numel() as u32,
                axis_len: n as u32,
                inner: inner as u32,
                tag: i as u32 + 1,
            };
            ex.dispatch_checked(
                pipe,
                &[(1, &out), (2, &p), (3, &idx)],
                &block,
                grid(total),
                msg,
            )?;
            out
        }
        Op::ScatterAdd(axis) => {
            let u = ex.dev(ins[0])?;
            let ls = ex.slot(ins[2]).shape.clone();
            let (outer, n, inner) = (
                ls[..*axis].iter().product::<usize>(),
                ls[*axis],
                ls[axis + 1..].iter().product::<usize>(),
            );
            if let Some(h) = ex.slot(ins[1]).host.as_ref() {
                indices("scatter_add", h, n)?;
            }
            let idx = ex.dev(ins[1])?;
            if u.numel() != outer * idx.numel() * inner {
                return Err(value_err!(
                    "scatter_add: updates of shape {:?} do not match indices {:?} into {ls:?}",
                    u.shape,
                    idx.shape
                ));
            }
            let out = ex.alloc(&ls, u.dtype, i)?;
            fill(ex, &out, 0)?;
            let pipe = pipelines::family(ex.ctx, "scatter", "scatter_add", tag(u.dtype)?)?;
            let msg = format!("scatter_add: index {{index}} is out of range for an axis of size {n} (indices shape {:?})", idx.shape);
            let block = blk::Indexed {
                n: u.numel() as u32,
                n_idx: idx.numel() as u32,
                axis_len: n as u32,
                inner: inner as u32,
                tag: i as u32 + 1,
            };
            ex.dispatch_checked(
                pipe,
                &[(1, &out), (2, &u), (3, &idx)],
                &block,
                grid(u.numel()),
                msg,
            )?;
            out
        }
        Op::Reduce { op, axes, keepdims } => {
            let x = ex.dev(ins[0])?;
            if axes.iter().any(|&a| x.shape[a] == 0) {
                // An empty reduction is its identity, as the CPU kernel defines it (for
                // integers, the i64 extremes wrapped to the dtype): take it from there.
                let empty = crate::base::value::Value::full(x.dtype, &x.shape, 0.0);
                return Ok(Slot::host(node.op().cpu(&[&empty])?));
            }
            let shape: Vec<usize> = x
                .shape
                .iter()
                .enumerate()
                .filter_map(|(d, &n)| match (axes.contains(&d), keepdims) {
                    (false, _) => Some(n),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect();
            let code = match op {
                ReduceOp::Sum => 0,
                ReduceOp::Prod => 1,
                ReduceOp::Max => 2,
                ReduceOp::Min => 3,
                ReduceOp::Mean => 4,
            };
            reduce(ex, i, &x, axes, code, &shape)?
        }
        Op::SumTo => {
            let x = ex.dev(ins[0])?;
            let target: Vec<usize> = shape_value(ex, ins[1], "sum_to")?
                .iter()
                .map(|&d| d.max(0) as usize)
                .collect();
            if target == x.shape {
                x
            } else {
                let axes = sum_to_axes(&x.shape, &target)?;
                reduce(ex, i, &x, &axes, 0, &target)?
            }
        }
        Op::Arg { op, axis } => {
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
                );
            }
            out
        }
        Op::Scan {
            op,
            axis,
            exclusive,
            reverse,
        } => {
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
                );
            }
            out
        }
        Op::MatMul { ta, tb } => matmul(ex, i, &ins, *ta, *tb)?,
        Op::Conv(spec) => {
            let (x, w) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
            let g = conv::conv_geom(spec, &x.shape, &w.shape)?;
            if gemm_loop(g.kk() * g.cin / g.groups, g.cout / g.groups) > LOOP_BUDGET {
                return ex.on_host(i);
            }
            let out = ex.alloc(&g.y_shape, x.dtype, i)?;
            conv_fwd(ex, &g, &out, &x, &w)?;
            out
        }
        Op::ConvInputGrad(spec) => {
            let (gy, w) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
            let s = host_value(ex, ins[2], &name)?;
            let g = conv::input_grad_geom(spec, &gy.shape, &w.shape, &s)?;
            if gemm_loop(g.kk() * g.cout / g.groups, g.cin / g.groups) > LOOP_BUDGET {
                return ex.on_host(i);
            }
            let out = ex.alloc(&g.x_shape, gy.dtype, i)?;
            conv_dx(ex, &g, &out, &gy, &w)?;
            out
        }
        Op::ConvKernelGrad(spec) => {
            let (x, gy) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
            let s = host_value(ex, ins[2], &name)?;
            let g = conv::kernel_grad_geom(spec, &x.shape, &gy.shape, &s)?;
            conv_dw(ex, i, &g, &x, &gy)?
        }
        Op::Pool(spec) => {
            let x = ex.dev(ins[0])?;
            let g = spec.geom(&x.shape)?;
            // A thread walks its whole window (twice for the gradient).
            if 2 * g.kk() > LOOP_BUDGET {
                return ex.on_host(i);
            }
            let out = ex.alloc(&g.y_shape, x.dtype, i)?;
            pool_dispatch(ex, "pool_fwd", &g, pool_mode(spec.kind), &out, &x, &x)?;
            out
        }
        Op::PoolGrad(spec) => {
            let (x, gy) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
            let g = spec.geom(&x.shape)?;
            // A thread walks its whole window (twice for the gradient).
            if 2 * g.kk() > LOOP_BUDGET {
                return ex.on_host(i);
            }
            if gy.shape != g.y_shape {
                return Err(value_err!(
                    "pool_grad: gradient shape {:?} does not match the pooled shape {:?}",
                    gy.shape,
                    g.y_shape
                ));
            }
            let out = ex.alloc(&x.shape, x.dtype, i)?;
            pool_dispatch(ex, "pool_grad", &g, pool_mode(spec.kind), &out, &x, &gy)?;
            out
        }
        Op::PoolSelect(spec) => {
            let (x, h) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
            let g = spec.geom(&x.shape)?;
            // A thread walks its whole window (twice for the gradient).
            if 2 * g.kk() > LOOP_BUDGET {
                return ex.on_host(i);
            }
            if h.shape != x.shape {
                return Err(value_err!(
                    "pool_select: shapes {:?} and {:?} differ",
                    h.shape,
                    x.shape
                ));
            }
            let out = ex.alloc(&g.y_shape, x.dtype, i)?;
            match spec.kind {
                // h at each window's first maximum of x.
                PoolKind::Max => pool_dispatch(ex, "pool_fwd", &g, 2, &out, &x, &h)?,
                // The average pool of h.
                PoolKind::Avg => pool_dispatch(ex, "pool_fwd", &g, 1, &out, &h, &h)?,
            }
            out
        }
        Op::Random(st) => {
            let dims: Vec<usize> = shape_value(ex, ins[0], &name)?
                .iter()
                .map(|&d| {
                    if d < 0 {
                        Err(value_err!("{name}: negative dimension {d}"))
                    } else {
                        Ok(d as usize)
                    }
                })
                .collect::<Result<_>>()?;
            let n: usize = dims.iter().product();
            let (key, call) = random::next_call(st);
            let dist = match st.dist {
                random::RandomDist::Uniform => 0,
                random::RandomDist::Normal => 1,
                random::RandomDist::TruncatedNormal => 2,
            };
            let out = ex.alloc(&dims, node.dtype(), i)?;
            let pipe = pipelines::family(ex.ctx, "random", "random", tag(node.dtype())?)?;
            let params = blk::Random {
                n: n as u32,
                key0: key[0],
                key1: key[1],
                call_lo: call as u32,
                call_hi: (call >> 32) as u32,
                dist,
            };
            ex.dispatch(pipe, &[(1, &out)], Params::of(&params), grid(n));
            out
        }
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
        | Op::CtcDecode(_) => {
            return Err(Error::Runtime(format!(
                "internal: {name} has no hand-written GPU kernel"
            )))
        }
    };
    Ok(Slot::dev(out))
}

fn matmul(ex: &mut Exec, i: usize, ins: &[usize], ta: bool, tb: bool) -> Result<DTensor> {
    let a = ex.dev(ins[0])?;
    let b = ex.dev(ins[1])?;
    let (sa, sb) = (a.shape.clone(), b.shape.clone());
    let (ra, rb) = (sa.len(), sb.len());
    let (m, ka) = if ta {
        (sa[ra - 1], sa[ra - 2])
    } else {
        (sa[ra - 2], sa[ra - 1])
    };
    let (kb, n) = if tb {
        (sb[rb - 1], sb[rb - 2])
    } else {
        (sb[rb - 2], sb[rb - 1])
    };
    if ka != kb {
        return Err(value_err!(
            "dot: shapes {sa:?} and {sb:?} are incompatible: the contracted dims are {ka} and {kb}"
        ));
    }
    let bshape = broadcast_runtime("matmul", &sa[..ra - 2], &sb[..rb - 2])?;
    let batches: usize = bshape.iter().product();
    let mut shape = bshape.clone();
    shape.extend([m, n]);
    let out = ex.alloc(&shape, a.dtype, i)?;
    let bstrides = |own: &[usize], mat: usize| -> Vec<u32> {
        let lead = bshape.len() - own.len();
        let mut st = vec![0u32; bshape.len()];
        let mut acc = mat;
        for d in (0..own.len()).rev() {
            st[lead + d] = if own[d] == 1 { 0 } else { acc as u32 };
            acc *= own[d];
        }
        st
    };
    let (a_cols, b_cols) = (sa[ra - 1], sb[rb - 1]);
    let (a_rs, a_cs) = if ta { (1, a_cols) } else { (a_cols, 1) };
    let (b_rs, b_cs) = if tb { (1, b_cols) } else { (b_cols, 1) };
    // vec4 loads along each operand's contiguous dimension when it is a multiple of 4
    // (then every vec4 and every batch offset is 16-byte aligned).
    let a_v4 = if ta { m % 4 == 0 } else { ka % 4 == 0 };
    let b_v4 = if tb { ka % 4 == 0 } else { n % 4 == 0 };
    let block = blk::Matmul {
        m: m as u32,
        n: n as u32,
        k: ka as u32,
        batch_rank: bshape.len() as u32,
        a_rs: a_rs as u32,
        a_cs: a_cs as u32,
        b_rs: b_rs as u32,
        b_cs: b_cs as u32,
        vec4: a_v4 as u32 | (b_v4 as u32) << 1,
        ta: ta as u32,
        tb: tb as u32,
        ..blk::Matmul::default()
    };
    let mut tail: Vec<u32> = bshape.iter().map(|&d| d as u32).collect();
    tail.extend(bstrides(&sa[..ra - 2], sa[ra - 2] * sa[ra - 1]));
    tail.extend(bstrides(&sb[..rb - 2], sb[rb - 2] * sb[rb - 1]));
    let pipe = pipelines::family(ex.ctx, "matmul", "matmul", tag(a.dtype)?)?;
    let (a4, b4) = (a.as_vec4(), b.as_vec4());
    let tiles = [n.div_ceil(64), m.div_ceil(64), batches];
    for (first, groups) in split_grid(tiles, max_groups(ex)) {
        // The first slice of K writes the output, the others add to it; K = 0 writes zeros.
        for k0 in (0..ka.max(1)).step_by(MATMUL_K_STEP) {
            let block = blk::Matmul {
                col_tile0: first[0] as u32,
                row_tile0: first[1] as u32,
                batch0: first[2] as u32,
                k_lo: k0 as u32,
                k_hi: (k0 + MATMUL_K_STEP) as u32,
                add: (k0 > 0) as u32,
                ..block
            };
            let p = Params::with_tail(&block, &tail);
            ex.dispatch(
                pipe.clone(),
                &[(1, &out), (2, &a), (3, &b), (5, &a4), (6, &b4)],
                p,
                groups,
            );
        }
    }
    Ok(out)
}

/// The slice of the contracted dim one matmul dispatch sums (a multiple of its 16-deep
/// tiles): 2048 tiles of at most 25 loop iterations each stay under the 65535 loop
/// iterations after which llvmpipe ends a shader.
const MATMUL_K_STEP: usize = 32768;

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

// ---------------------------------------------------------------- convolution and pooling

/// The window geometry shared by `conv.wgsl` and `pool.wgsl`.
fn window(g: &Geom) -> blk::Window {
    let w3 = |v: [usize; 3]| v.map(|d| d as u32);
    blk::Window {
        n: g.n as u32,
        x: w3(g.x),
        k: w3(g.k),
        o: w3(g.o),
        s: w3(g.s),
        d: w3(g.d),
        pad: g.p.map(|(before, _)| before as u32),
    }
}

/// The parameter block of every `conv.wgsl` kernel, with `row_base` 0 and no stride phase.
fn conv_block(g: &Geom, splits: usize, chunk: usize) -> blk::Conv {
    blk::Conv {
        w: window(g),
        cin: g.cin as u32,
        cout: g.cout as u32,
        groups: g.groups as u32,
        cg: (g.cin / g.groups) as u32,
        og: (g.cout / g.groups) as u32,
        row_base: 0,
        splits: splits as u32,
        chunk: chunk as u32,
        ..blk::Conv::default()
    }
}

/// Below this many channels on a GEMM's column side, the one-output-per-thread kernels
/// beat the 64-wide tiles (depthwise convolutions: one channel per group).
const DIRECT_BELOW: usize = 16;

/// Records tiled kernel `kernel` over a `rows` x `cols` GEMM per z slice, as dispatches
/// of at most 65535 row tiles each (the grid limit per dimension).
#[allow(clippy::too_many_arguments)] // the GEMM geometry, spelled out at each call
fn conv_tiled(
    ex: &mut Exec,
    kernel: &str,
    dtype: DType,
    p: blk::Conv,
    bufs: &[(u32, &DTensor)],
    rows: usize,
    cols: usize,
    z: usize,
) -> Result<()> {
    if z > 65535 {
        return Err(Error::Device(format!(
            "conv: {z} groups exceed the GPU grid limit of 65535"
        )));
    }
    let pipe = pipelines::family(ex.ctx, "conv", kernel, tag(dtype)?)?;
    let tiles = rows.div_ceil(64);
    let per = 65535usize;
    for t0 in (0..tiles).step_by(per) {
        let p = blk::Conv {
            row_base: (t0 * 64) as u32,
            ..p
        };
        ex.dispatch(
            pipe.clone(),
            bufs,
            Params::of(&p),
            [
                cols.div_ceil(64) as u32,
                per.min(tiles - t0) as u32,
                z as u32,
            ],
        );
    }
    Ok(())
}

fn conv_fwd(ex: &mut Exec, g: &Geom, out: &DTensor, x: &DTensor, w: &DTensor) -> Result<()> {
    let og = g.cout / g.groups;
    let p = conv_block(g, 1, 0);
    if og < DIRECT_BELOW {
        let pipe = pipelines::family(ex.ctx, "conv", "conv_fwd_direct", tag(x.dtype)?)?;
        let groups = grid(out.numel());
        ex.dispatch(pipe, &[(1, out), (2, x), (3, w)], Params::of(&p), groups);
        Ok(())
    } else {
        conv_tiled(
            ex,
            "conv_fwd",
            x.dtype,
            p,
            &[(1, out), (2, x), (3, w)],
            g.n * g.opix(),
            og,
            g.groups,
        )
    }
}

/// The transposed convolution, an implicit GEMM over the input gradient's pixels, one
/// dispatch per stride phase (see `stride_phase`).
fn conv_dx(ex: &mut Exec, g: &Geom, out: &DTensor, gy: &DTensor, w: &DTensor) -> Result<()> {
    let cg = g.cin / g.groups;
    if cg < DIRECT_BELOW {
        let pipe = pipelines::family(ex.ctx, "conv", "conv_dx_direct", tag(gy.dtype)?)?;
        ex.dispatch(
            pipe,
            &[(1, out), (2, gy), (3, w)],
            Params::of(&conv_block(g, 1, 0)),
            grid(out.numel()),
        );
        return Ok(());
    }
    for r0 in 0..g.s[0] {
        for r1 in 0..g.s[1] {
            for r2 in 0..g.s[2] {
                let ph = [0, 1, 2].map(|t| stride_phase(g, t, [r0, r1, r2][t]));
                let rows = g.n * ph.iter().map(|q| q[1]).product::<usize>();
                let field = |f: usize| ph.map(|q| q[f] as u32);
                let p = blk::Conv {
                    first: field(0),
                    count: field(1),
                    kstart: field(2),
                    kstep: field(3),
                    kcount: field(4),
                    ..conv_block(g, 1, 0)
                };
                conv_tiled(
                    ex,
                    "conv_dx",
                    gy.dtype,
                    p,
                    &[(1, out), (2, gy), (3, w)],
                    rows,
                    cg,
                    g.groups,
                )?;
            }
        }
    }
    Ok(())
}

/// Along dim `t`, the input positions `i` with `(i + pad_before) % stride == r` and the
/// kernel offsets that reach them from an output position: `(kp * dilation) % stride == r`,
/// a residue class modulo `stride / gcd(dilation, stride)`. Returns `[first i, count of i,
/// first kp, kp step, count of kp]`.
fn stride_phase(g: &Geom, t: usize, r: usize) -> [usize; 5] {
    let (s, d, x, k, p) = (g.s[t], g.d[t], g.x[t], g.k[t], g.p[t].0);
    let first = (r + s - p % s) % s;
    let count = if first < x {
        (x - first).div_ceil(s)
    } else {
        0
    };
    let kps: Vec<usize> = (0..k).filter(|&kp| (kp * d) % s == r).collect();
    let step = if kps.len() > 1 { kps[1] - kps[0] } else { 1 };
    debug_assert!(kps.windows(2).all(|q| q[1] - q[0] == step));
    [
        first,
        count,
        kps.first().copied().unwrap_or(0),
        step,
        kps.len(),
    ]
}

/// The kernel gradient, a GEMM whose reduction runs over batch * output pixels. That axis
/// is long and the output small, so it is split into chunks reduced by separate
/// workgroups (about a thousand in all), whose partial kernels are then summed by the
/// reduce kernel.
fn conv_dw(ex: &mut Exec, i: usize, g: &Geom, x: &DTensor, gy: &DTensor) -> Result<DTensor> {
    let (cg, og) = (g.cin / g.groups, g.cout / g.groups);
    let m = g.n * g.opix();
    let wn: usize = g.w_shape.iter().product();
    if m == 0 || wn == 0 {
        let out = ex.alloc(&g.w_shape, x.dtype, i)?;
        fill(ex, &out, 0)?;
        return Ok(out);
    }
    let direct = og < DIRECT_BELOW;
    let rows = g.kk() * cg;
    let groups_z = if direct { 1 } else { g.groups };
    let workgroups = if direct {
        wn.div_ceil(256)
    } else {
        rows.div_ceil(64) * og.div_ceil(64) * g.groups
    };
    let max_parts = ((ex.ctx.max_binding / 4) as usize / wn).clamp(1, 256);
    // At most MATMUL_K_STEP positions per chunk: the chunk is a loop in the shader.
    let want = (1024 / workgroups.max(1))
        .max(m.div_ceil(MATMUL_K_STEP))
        .clamp(1, max_parts)
        .min(m.div_ceil(256))
        .min(65535 / groups_z)
        .max(1);
    let chunk = m.div_ceil(want).next_multiple_of(16);
    let splits = m.div_ceil(chunk);
    if splits == 1 {
        let out = ex.alloc(&g.w_shape, x.dtype, i)?;
        conv_dw_partials(ex, g, direct, x.dtype, &out, x, gy, 1, chunk)?;
        return Ok(out);
    }
    // Partial sums stay f32 (an f16 tensor is f32 words on the device, so the f32 kernel
    // reads it as is) and are rounded once, by the reduce kernel of the node's dtype: the
    // CPU's single rounding of an f32 accumulation.
    let mut part_shape = vec![splits];
    part_shape.extend_from_slice(&g.w_shape);
    let part = ex.alloc(&part_shape, DType::F32, i)?;
    conv_dw_partials(ex, g, direct, DType::F32, &part, x, gy, splits, chunk)?;
    let part = DTensor {
        dtype: x.dtype,
        ..part
    };
    reduce(ex, i, &part, &[0], 0, &g.w_shape)
}

/// The kernel gradient's `splits` partial sums over chunks of `chunk` batch*spatial
/// positions into `out` (`(splits, *w_shape)`, or `w_shape` for one), computed as `dtype`.
#[allow(clippy::too_many_arguments)]
fn conv_dw_partials(
    ex: &mut Exec,
    g: &Geom,
    direct: bool,
    dtype: DType,
    out: &DTensor,
    x: &DTensor,
    gy: &DTensor,
    splits: usize,
    chunk: usize,
) -> Result<()> {
    let p = conv_block(g, splits, chunk);
    if direct {
        let pipe = pipelines::family(ex.ctx, "conv", "conv_dw_direct", tag(dtype)?)?;
        let mut groups = grid(g.w_shape.iter().product());
        groups[2] = splits as u32;
        ex.dispatch(pipe, &[(1, out), (2, x), (3, gy)], Params::of(&p), groups);
        Ok(())
    } else {
        let (rows, og) = (g.kk() * g.cin / g.groups, g.cout / g.groups);
        conv_tiled(
            ex,
            "conv_dw",
            dtype,
            p,
            &[(1, out), (2, x), (3, gy)],
            rows,
            og,
            g.groups * splits,
        )
    }
}

fn pool_mode(kind: PoolKind) -> u32 {
    match kind {
        PoolKind::Max => 0,
        PoolKind::Avg => 1,
    }
}

/// One `pool.wgsl` kernel, one thread per element of `out`.
fn pool_dispatch(
    ex: &mut Exec,
    kernel: &str,
    g: &Geom,
    mode: u32,
    out: &DTensor,
    a: &DTensor,
    b: &DTensor,
) -> Result<()> {
    let p = blk::Pool {
        w: window(g),
        channels: g.cin as u32,
        mode,
    };
    let pipe = pipelines::family(ex.ctx, "pool", kernel, tag(out.dtype)?)?;
    ex.dispatch(
        pipe,
        &[(1, out), (2, a), (3, b)],
        Params::of(&p),
        grid(out.numel()),
    );
    Ok(())
}
