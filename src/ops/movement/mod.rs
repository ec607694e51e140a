//! Movement primitives: reshape, broadcast and its adjoint sum-to, expand/squeeze,
//! transpose, strided slices, concat, pad, reverse, gather and scatter-add. Target shapes
//! of reshape/broadcast are int tensors, so they may depend on runtime shapes (`K.shape`).
//!
//! This file holds reshape, broadcast_to, sum_to and shape_of, and the helpers the family
//! shares; `axes.rs` (expand/squeeze, transpose), `slicing.rs` (slices, concat, pad,
//! reverse) and `indexing.rs` (gather, scatter-add) the rest, re-exported here.

use super::build::*;
use super::matmul::SharedDst;
use super::{BinaryOp, Op, ReduceOp, SliceAxis};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::{Dim, Shape};
use crate::base::value::{Arr, Elem, Value};
use crate::ops::graph::Tensor;
use crate::ops::source;
use crate::{map_value, value_err, with_value};
use ndarray::{ArrayView, ArrayViewMut, Axis, IxDyn, Slice};

mod axes;
mod indexing;
mod slicing;
mod transpose2d;

pub use axes::*;
pub use indexing::*;
pub use slicing::*;
pub(crate) use transpose2d::{transpose_into, transpose_par, transpose_strided};

// ---- reshape ----

pub fn reshape_to(x: &Tensor, shape: &Tensor) -> Result<Tensor> {
    Tensor::new(Op::Reshape, vec![x.clone(), shape.clone()])
}

pub fn reshape_like(x: &Tensor, like: &Tensor) -> Result<Tensor> {
    if x.shape() == like.shape() && x.shape().to_known().is_some() {
        return Ok(x.clone());
    }
    reshape_to(x, &shape_of(like)?)
}

pub fn infer_reshape(x: &Tensor, s: &Tensor) -> Result<(Shape, DType)> {
    let target = shape_arg("reshape", s)?;
    if target.iter().filter(|d| **d == Some(-1)).count() > 1 {
        return Err(value_err!(
            "reshape: at most one dimension of the target shape {target:?} may be -1"
        ));
    }
    if let Some(&Some(d)) = target.iter().find(|d| matches!(d, Some(v) if *v < -1)) {
        return Err(value_err!(
            "reshape: invalid dimension {d} in the target shape"
        ));
    }
    let known: Option<i64> = target
        .iter()
        .filter(|d| **d != Some(-1))
        .try_fold(1i64, |a, d| d.map(|d| a * d));
    let mut dims: Vec<Dim> = target
        .iter()
        .map(|d| d.and_then(|d| if d < 0 { None } else { Some(d as usize) }))
        .collect();
    if let (Some(n), Some(k)) = (x.shape().numel(), known) {
        if let Some(pos) = target.iter().position(|d| *d == Some(-1)) {
            if k == 0 || n as i64 % k != 0 {
                return Err(value_err!(
                    "reshape: cannot reshape a tensor of shape {} into {}",
                    x.shape(),
                    fmt_target(&target)
                ));
            }
            dims[pos] = Some(n / k as usize);
        } else if n as i64 != k {
            return Err(value_err!("reshape: cannot reshape a tensor of shape {} ({n} elements) into {} ({k} elements)", x.shape(), fmt_target(&target)));
        }
    }
    Ok((Shape(dims), x.dtype()))
}

fn fmt_target(t: &[Option<i64>]) -> String {
    let parts: Vec<String> = t
        .iter()
        .map(|d| d.map_or("None".into(), |d| d.to_string()))
        .collect();
    format!("({})", parts.join(", "))
}

pub fn vjp_reshape(node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(reshape_like(g, node.input(0))?), None])
}

pub fn cpu_reshape(x: &Value, s: &Value) -> Result<Value> {
    let target = runtime_target("reshape", x, s)?;
    x.reshape(&target)
}

fn runtime_target(op: &str, x: &Value, s: &Value) -> Result<Vec<usize>> {
    reshape_dims(op, x.shape(), s)
}

/// The runtime target shape of a reshape of a `shape` tensor to the int vector `s` (one
/// dim may be -1).
pub fn reshape_dims(op: &str, shape: &[usize], s: &Value) -> Result<Vec<usize>> {
    let t = s.to_i64_vec();
    let n: usize = shape.iter().product();
    let known: i64 = t.iter().filter(|&&d| d != -1).product();
    let mut out = Vec::with_capacity(t.len());
    for &d in &t {
        if d == -1 {
            if known == 0 || n as i64 % known != 0 {
                return Err(value_err!(
                    "{op}: cannot reshape a tensor of shape {shape:?} into {t:?}"
                ));
            }
            out.push(n / known as usize);
        } else if d < 0 {
            return Err(value_err!(
                "{op}: invalid dimension {d} in the target shape {t:?}"
            ));
        } else {
            out.push(d as usize);
        }
    }
    if out.iter().product::<usize>() != n {
        return Err(value_err!(
            "{op}: cannot reshape a tensor of shape {shape:?} ({n} elements) into {out:?}"
        ));
    }
    Ok(out)
}

// ---- broadcast_to ----

pub fn broadcast_to(x: &Tensor, shape: &Tensor) -> Result<Tensor> {
    Tensor::new(Op::BroadcastTo, vec![x.clone(), shape.clone()])
}

pub fn broadcast_like(x: &Tensor, like: &Tensor) -> Result<Tensor> {
    if x.shape() == like.shape() && x.shape().to_known().is_some() {
        return Ok(x.clone());
    }
    broadcast_to(x, &shape_of(like)?)
}

pub fn infer_broadcast_to(x: &Tensor, s: &Tensor) -> Result<(Shape, DType)> {
    let t = static_target("broadcast_to", s)?;
    if x.rank() > t.rank() {
        return Err(value_err!(
            "broadcast_to: cannot broadcast shape {} to the lower rank {}",
            x.shape(),
            t
        ));
    }
    let b = crate::base::shape::broadcast_static("broadcast_to", x.shape(), &t)?;
    Ok((
        if b.rank() == t.rank() {
            merge(&t, &b)
        } else {
            t
        },
        x.dtype(),
    ))
}

fn merge(t: &Shape, b: &Shape) -> Shape {
    Shape(
        t.dims()
            .iter()
            .zip(b.dims())
            .map(|(a, b)| a.or(*b))
            .collect(),
    )
}

pub fn vjp_broadcast_to(node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(sum_like(g, node.input(0))?), None])
}

pub fn cpu_broadcast_to(x: &Value, s: &Value) -> Result<Value> {
    let target = target_dims("broadcast_to", s)?;
    if x.shape() == target.as_slice() {
        return Ok(x.clone());
    }
    let out = crate::base::shape::broadcast_runtime("broadcast_to", x.shape(), &target)?;
    if out != target {
        return Err(value_err!(
            "broadcast_to: cannot broadcast shape {:?} to {target:?}",
            x.shape()
        ));
    }
    Ok(
        map_value!(x, a => a.broadcast(IxDyn(&target)).expect("checked").as_standard_layout().into_owned().into_shared()),
    )
}

// ---- sum_to ----

pub fn sum_to(x: &Tensor, shape: &Tensor) -> Result<Tensor> {
    Tensor::new(Op::SumTo, vec![x.clone(), shape.clone()])
}

/// Sums the broadcast dims of a gradient `x` away so it matches `like`'s runtime shape.
///
/// A product whose factors are partly constant along the summed axes sums only the rest:
/// `Σ(s · b) = s · Σb` (`factored_sum`). Batch norm's mean receives such gradients, the
/// scale times the incoming gradient and the variance's gradient times the centred
/// input; factored, their sums read only tensors that other passes read already (the
/// incoming gradient, the input), so no pass waits on a full-size product to sum it.
pub fn sum_like(x: &Tensor, like: &Tensor) -> Result<Tensor> {
    if x.shape() == like.shape() && x.shape().to_known().is_some() {
        return Ok(x.clone());
    }
    if let Some(s) = factored_sum(x, like)? {
        return Ok(s);
    }
    sum_to(x, &shape_of(like)?)
}

/// Whether `t` is `a - mean(a, axes, keepdims)` with every one of `axes` summed away
/// (`summed`, where `like`'s dim `ld` is 1): its sum is then zero as a function of `a`,
/// so a zero constant is its exact value (rounding aside) and has its exact derivatives
/// of every order. Batch norm's mean gradient holds it: the variance's gradient times
/// the centred input, summed over the batch; without it the gradient waits for a sum
/// of the centred input that only rounding makes nonzero.
fn centred_on_mean(t: &Tensor, summed: &[bool], ld: &[Dim]) -> bool {
    let Op::Binary(BinaryOp::Sub) = t.op() else {
        return false;
    };
    let (a, m) = (t.input(0), t.input(1));
    let Op::Reduce {
        op: ReduceOp::Mean,
        axes,
        keepdims: true,
    } = m.op()
    else {
        return false;
    };
    m.input(0).same(a)
        && a.rank() == summed.len()
        && !axes.is_empty()
        && axes.iter().all(|&i| summed[i] && ld[i] == Some(1))
}

/// The factors of a product, split by whether they vary along the summed axes.
#[derive(Default)]
struct Factors {
    /// Factors of static shape that is 1 on every summed axis (or of lower rank).
    scales: Vec<Tensor>,
    /// Divisors of that kind (`a / s`).
    divisors: Vec<Tensor>,
    /// The rest: what the sum must still run over.
    body: Vec<Tensor>,
    /// `broadcast_to(s, shape_of(z))` with `s` a scale: stands for `s` where `z`'s
    /// runtime shape is the body's (checked after the walk); `z` is `None` for any
    /// other target, which is sound where every shape is static.
    broadcast: Vec<(Tensor, Option<Tensor>)>,
    negated: bool,
}

/// `Σ x` over the axes that `like` sums away, as `scales · Σ body`, where `x` is a
/// product (through negations, and divisions by scales) of factors of which some are
/// constant along those axes and at least one of those is not a constant (a per-channel
/// scale, not a number: factoring numbers out changes nothing but rounding). `None`
/// where `x` is not such a product, or where the body's shape could differ from `x`'s
/// at run time.
///
/// Sound at any runtime shape: every scale has a static shape with 1 on the summed axes,
/// so it cannot widen the product there; a broadcast scale counts only where its target
/// is the shape of a body factor (or of an elementwise function of one), or where every
/// shape is static, so it widens nothing either. The body then has `x`'s runtime shape
/// and sums over the same elements.
fn factored_sum(x: &Tensor, like: &Tensor) -> Result<Option<Tensor>> {
    if x.shape() == like.shape() || !x.dtype().is_float() {
        return Ok(None);
    }
    // Negations and sums outside the product: a sum of a sum to `like`'s shape is one
    // sum (a gradient at an unknown batch dim arrives as `sum_to` to its own shape).
    let mut f = Factors::default();
    let mut x = x.clone();
    loop {
        match x.op() {
            Op::Unary(super::UnaryOp::Neg) => f.negated = !f.negated,
            Op::SumTo => {}
            _ => break,
        }
        x = x.input(0).clone();
    }
    let x = &x;
    let (xd, ld) = (x.shape().dims(), like.shape().dims());
    if xd.len() != ld.len() {
        return Ok(None);
    }
    // The axes a scale must be 1 on: every axis `like` may sum away.
    let summed: Vec<bool> = xd
        .iter()
        .zip(ld)
        .map(|(a, b)| *b != *a || b.is_none())
        .collect();
    let is_scale = |t: &Tensor| {
        let d = t.shape().dims();
        d.len() <= xd.len()
            && d.iter().all(Option::is_some)
            && d.iter()
                .zip(&summed[xd.len() - d.len()..])
                .all(|(d, s)| !s || *d == Some(1))
    };
    let mut stack = vec![x.clone()];
    while let Some(t) = stack.pop() {
        match t.op() {
            Op::Unary(super::UnaryOp::Neg) => {
                f.negated = !f.negated;
                stack.push(t.input(0).clone());
            }
            Op::Binary(BinaryOp::Mul) => stack.extend(t.inputs().iter().cloned()),
            Op::Binary(BinaryOp::Div) if is_scale(t.input(1)) => {
                f.divisors.push(t.input(1).clone());
                stack.push(t.input(0).clone());
            }
            Op::BroadcastTo if is_scale(t.input(0)) => {
                let z = matches!(t.input(1).op(), Op::ShapeOf).then(|| t.input(1).input(0).clone());
                f.broadcast.push((t.input(0).clone(), z));
            }
            _ if is_scale(&t) => f.scales.push(t),
            _ => f.body.push(t),
        }
    }
    let in_body = |z: &Tensor| f.body.iter().any(|b| b.same(z));
    let static_shape = x.shape().to_known().is_some();
    let widens_nothing = f.broadcast.iter().all(|(_, z)| match z {
        Some(z) => in_body(z) || (matches!(z.op(), Op::Unary(_)) && in_body(z.input(0))),
        None => static_shape,
    });
    let per_channel = f
        .scales
        .iter()
        .chain(f.divisors.iter())
        .chain(f.broadcast.iter().map(|(s, _)| s))
        .any(|s| !matches!(s.op(), Op::Constant(_)));
    if f.body.is_empty() || !widens_nothing || !per_channel {
        return Ok(None);
    }
    if f.body.len() == 1 && centred_on_mean(&f.body[0], &summed, ld) {
        return Ok(Some(zeros_like(like)?));
    }
    let mut body = f.body[0].clone();
    for b in &f.body[1..] {
        body = mul(&body, b)?;
    }
    if body.shape() != x.shape() {
        return Ok(None);
    }
    let mut out = sum_to(&body, &shape_of(like)?)?;
    for s in f.scales.iter().chain(f.broadcast.iter().map(|(s, _)| s)) {
        out = mul(&out, s)?;
    }
    for d in &f.divisors {
        out = div(&out, d)?;
    }
    if f.negated {
        out = neg(&out)?;
    }
    Ok((out.shape() == like.shape()).then_some(out))
}

pub fn infer_sum_to(x: &Tensor, s: &Tensor) -> Result<(Shape, DType)> {
    Ok((static_target("sum_to", s)?, x.dtype()))
}

/// The target shape `s` of `broadcast_to` or `sum_to` (`op`) as far as it is known when
/// the graph is built; a known negative entry is an error.
fn static_target(op: &str, s: &Tensor) -> Result<Shape> {
    let target = shape_arg(op, s)?;
    if let Some(d) = target.iter().flatten().find(|d| **d < 0) {
        return Err(value_err!(
            "{op}: invalid dimension {d} in the target shape {}",
            fmt_target(&target)
        ));
    }
    Ok(Shape(
        target.iter().map(|d| d.map(|d| d as usize)).collect(),
    ))
}

/// The run-time target shape `s` of `broadcast_to` or `sum_to` (`op`): its entries as
/// sizes, for every device; a negative entry is an error naming it.
pub fn target_dims(op: &str, s: &Value) -> Result<Vec<usize>> {
    let t = s.to_i64_vec();
    t.iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| value_err!("{op}: invalid dimension {d} in the target shape {t:?}"))
        })
        .collect()
}

pub fn vjp_sum_to(node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(broadcast_like(g, node.input(0))?), None])
}

pub fn cpu_sum_to(x: &Value, s: &Value) -> Result<Value> {
    let target = target_dims("sum_to", s)?;
    let xs = x.shape();
    if xs == target.as_slice() {
        return Ok(x.clone());
    }
    let axes = sum_to_axes(xs, &target)?;
    let r = super::reduce::cpu_reduce(ReduceOp::Sum, &axes, false, x)?;
    r.reshape(&target)
}

/// The axes `sum_to` reduces to bring `xs` down to `target` (then reshaped to it).
pub fn sum_to_axes(xs: &[usize], target: &[usize]) -> Result<Vec<usize>> {
    if target.len() > xs.len() {
        return Err(value_err!(
            "sum_to: cannot sum shape {xs:?} down to the higher rank {target:?}"
        ));
    }
    let lead = xs.len() - target.len();
    let mut axes: Vec<usize> = (0..lead).collect();
    for (i, &t) in target.iter().enumerate() {
        let d = xs[lead + i];
        if t == 1 && d != 1 {
            axes.push(lead + i);
        } else if t != d {
            return Err(value_err!(
                "sum_to: shape {xs:?} does not broadcast from {target:?}"
            ));
        }
    }
    Ok(axes)
}

// ---- shape_of ----

/// The runtime shape of `x`; a constant when the static shape is fully known, so shapes of
/// placeholders with static dims evaluate without a feed.
pub fn shape_of(x: &Tensor) -> Result<Tensor> {
    if let Some(s) = x.shape().to_known() {
        return Ok(int_vector(&s.iter().map(|&d| d as i64).collect::<Vec<_>>()));
    }
    Tensor::new(Op::ShapeOf, vec![x.clone()])
}

pub fn cpu_shape_of(x: &Value) -> Result<Value> {
    Ok(shape_value(x.shape()))
}

/// What `shape` returns for a value of shape `dims`.
pub fn shape_value(dims: &[usize]) -> Value {
    Value::from_vec(&[dims.len()], dims.iter().map(|&d| d as i32).collect())
        .expect("length matches")
}

// ---- helpers ----

/// What is known before running about the value of a small int tensor (a shape): one
/// entry per element, `None` where only the runtime knows it.
pub fn partial_value(t: &Tensor) -> Option<Vec<Option<i64>>> {
    if !t.dtype().is_int() || t.rank() > 1 {
        return None;
    }
    let op = t.op();
    if let Op::Constant(v) = op {
        return Some(v.to_i64_vec().into_iter().map(Some).collect());
    }
    if let Op::ShapeOf = op {
        return Some(
            t.input(0)
                .shape()
                .dims()
                .iter()
                .map(|d| d.map(|d| d as i64))
                .collect(),
        );
    }
    if matches!(
        op,
        Op::Cast(_) | Op::Reshape | Op::ExpandDims(_) | Op::Squeeze(_)
    ) {
        return partial_value(t.input(0));
    }
    if let Op::Concat(0) = op {
        let mut out = Vec::new();
        for i in t.inputs() {
            out.extend(partial_value(i)?);
        }
        return Some(out);
    }
    if let Op::Slice(spec) = op {
        let src = partial_value(t.input(0))?;
        if t.input(0).rank() != 1 {
            return None;
        }
        let (start, _, step, len) = resolve_slice(&spec[0], src.len());
        return Some(
            (0..len)
                .map(|k| src[(start + k as i64 * step) as usize])
                .collect(),
        );
    }
    if let Op::Binary(b) = op {
        let (x, y) = (partial_value(t.input(0))?, partial_value(t.input(1))?);
        let n = x.len().max(y.len());
        if !(x.len() == n || x.len() == 1) || !(y.len() == n || y.len() == 1) {
            return None;
        }
        let f = |a: i64, c: i64| -> Option<i64> {
            match b {
                BinaryOp::Add => Some(a + c),
                BinaryOp::Sub => Some(a - c),
                BinaryOp::Mul => Some(a * c),
                BinaryOp::FloorDiv | BinaryOp::Div if c != 0 => Some(a.div_euclid(c)),
                _ => None,
            }
        };
        return Some(
            (0..n)
                .map(|i| {
                    let a = x[if x.len() == 1 { 0 } else { i }]?;
                    let c = y[if y.len() == 1 { 0 } else { i }]?;
                    f(a, c)
                })
                .collect(),
        );
    }
    None
}

fn shape_arg(op: &str, s: &Tensor) -> Result<Vec<Option<i64>>> {
    if !s.dtype().is_int() || s.rank() != 1 {
        return Err(Error::Type(format!(
            "{op}: the target shape must be a 1-D int tensor, got {} of shape {}",
            s.dtype(),
            s.shape()
        )));
    }
    if let Some(p) = partial_value(s) {
        return Ok(p);
    }
    match s.shape().dims()[0] {
        Some(n) => Ok(vec![None; n]),
        None => Err(Error::Value(format!(
            "{op}: the rank of the target shape must be known"
        ))),
    }
}

/// Python's `slice.indices` followed by the element count: (start, stop, step, len).
pub fn resolve_slice(s: &SliceAxis, n: usize) -> (i64, i64, i64, usize) {
    let n = n as i64;
    let step = s.step;
    let clamp = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
    let (lo, hi) = if step > 0 { (0, n) } else { (-1, n - 1) };
    let norm = |v: Option<i64>, default: i64| match v {
        None => default,
        Some(v) if v < 0 => clamp(v + n, lo, hi),
        Some(v) => clamp(v, lo, hi),
    };
    let start = norm(s.start, if step > 0 { 0 } else { n - 1 });
    let stop = norm(s.stop, if step > 0 { n } else { -1 });
    let len = if step > 0 {
        (stop - start + step - 1).max(0) / step
    } else {
        (start - stop - step - 1).max(0) / (-step)
    };
    (start, stop, step, len as usize)
}

pub fn int_vector(v: &[i64]) -> Tensor {
    source::constant(
        Value::from_vec(&[v.len()], v.iter().map(|&d| d as i32).collect()).expect("1-D"),
    )
}

pub fn full_spec(rank: usize) -> Vec<SliceAxis> {
    vec![
        SliceAxis {
            start: None,
            stop: None,
            step: 1
        };
        rank
    ]
}

/// A C-contiguous copy of `v`, a run of its last axis at a time when that axis is unit
/// strided (a slice of a contiguous array): `as_standard_layout` on `IxDyn` steps an
/// n-d index per element, ~10x slower on the Keras LSTM's `[64, 256] -> [64, 64]` gates.
fn to_contiguous<T: Elem>(v: ArrayView<'_, T, IxDyn>) -> Arr<T> {
    let shape = v.shape().to_vec();
    let last = shape.len().wrapping_sub(1);
    let unit_rows = !shape.is_empty() && (shape[last] <= 1 || v.strides()[last] == 1);
    if v.is_standard_layout() || !unit_rows {
        return v.as_standard_layout().into_owned().into_shared();
    }
    let len = v.len();
    let mut out: Vec<T> = Vec::with_capacity(len);
    let dst = SharedDst(out.as_mut_ptr());
    let row = shape[last];
    // Rows [r0, r0 + rows of `part`) of the result (`part` a run of whole leading indices).
    let copy = |part: ArrayView<'_, T, IxDyn>, r0: usize| {
        let d = dst;
        // SAFETY: rows r0.. of the `len`-element result; the parts write disjoint rows.
        unsafe { copy_rows(&part, d.0.add(r0 * row)) };
    };
    if shape.len() >= 2 && shape[0] >= 2 && len >= TEAM_COPY && crate::base::team::available() {
        // In a loop or a short run, halves of the leading axis on two threads: the rows
        // each one wrote in the kernel before (split the same way) stay in its cache.
        let h = shape[0] / 2;
        let rows_per_index = len / shape[0] / row;
        let (a, b) = v.split_at(Axis(0), h);
        crate::base::team::split2(&|p| {
            if p == 0 {
                copy(a.view(), 0)
            } else {
                copy(b.view(), h * rows_per_index)
            }
        });
    } else {
        copy(v, 0);
    }
    // SAFETY: every row of the result was written above.
    unsafe { out.set_len(len) };
    Arr::from_shape_vec(IxDyn(&shape), out).expect("length is the product of the shape")
}

/// Copies the rows of `v` (runs of its last axis, unit strided or of length 1) one after
/// another to `dst`, stepping the leading index by hand: ndarray's lane iterator costs
/// ~30 ns per row, which made the `[B, T, F] -> [T, B, F]` input transpose of a Keras
/// LSTM (3200 rows of 32) take ~100 us.
///
/// # Safety
/// `dst` must have room for `v.len()` elements and not overlap `v`.
unsafe fn copy_rows<T: Copy>(v: &ArrayView<'_, T, IxDyn>, dst: *mut T) {
    let (shape, strides) = (v.shape(), v.strides());
    let r = shape.len();
    let row = shape[r - 1];
    let outer = &shape[..r - 1];
    let rows: usize = outer.iter().product();
    if rows == 0 || row == 0 {
        return;
    }
    let mut idx = vec![0usize; outer.len()];
    let (base, mut off) = (v.as_ptr(), 0isize);
    for k in 0..rows {
        std::ptr::copy_nonoverlapping(base.offset(off), dst.add(k * row), row);
        for d in (0..outer.len()).rev() {
            idx[d] += 1;
            off += strides[d];
            if idx[d] < outer[d] {
                break;
            }
            off -= strides[d] * outer[d] as isize;
            idx[d] = 0;
        }
    }
}

/// Elements from which a copy in a loop or short run is split with the helper thread.
const TEAM_COPY: usize = 1 << 13;
