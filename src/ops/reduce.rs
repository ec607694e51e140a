//! Reductions along axes, arg-reductions and cumulative scans. Kernels see a tensor as
//! (outer, reduced, inner) blocks: reducing trailing axes sums contiguous rows, reducing
//! leading axes accumulates whole rows (vectorised over `inner`), and other axis sets are
//! first permuted into one of those forms.

use super::build::*;
use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::ops::graph::Tensor;
use rayon::prelude::*;

// ---- reduce ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    Mean,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Mean => "mean",
        }
    }
    pub fn from_name(s: &str) -> Option<ReduceOp> {
        Some(match s {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "max" => ReduceOp::Max,
            "min" => ReduceOp::Min,
            "mean" => ReduceOp::Mean,
            _ => return None,
        })
    }
}

/// Reduces `x` over `axes` (already normalised). Products over several axes are chained
/// single-axis products, so their gradient rule stays exact at zeros.
pub fn reduce(op: ReduceOp, x: &Tensor, axes: &[usize], keepdims: bool) -> Result<Tensor> {
    let mut axes = axes.to_vec();
    axes.sort_unstable();
    axes.dedup();
    if op == ReduceOp::Prod && axes.len() > 1 {
        let mut t = x.clone();
        for &a in axes.iter().rev() {
            t = Tensor::new(
                Op::Reduce {
                    op,
                    axes: vec![a],
                    keepdims,
                },
                vec![t],
            )?;
        }
        return Ok(t);
    }
    if op == ReduceOp::Sum {
        if let Some(z) = sum_of_zeros(x, &axes, keepdims)? {
            return Ok(z);
        }
    }
    Tensor::new(Op::Reduce { op, axes, keepdims }, vec![x.clone()])
}

/// A float sum over a broadcast scalar zero (Keras' zero initial state is
/// `sum(zeros_like(inputs), axis=(1, 2))`) is zeros of the result's shape: no pass over
/// the broadcast tensor.
fn sum_of_zeros(x: &Tensor, axes: &[usize], keepdims: bool) -> Result<Option<Tensor>> {
    let Op::BroadcastTo = x.op() else {
        return Ok(None);
    };
    let (zero, shape) = (x.input(0), x.input(1));
    let is_zero =
        matches!(zero.op(), Op::Constant(v) if v.shape().is_empty() && v.to_f64_vec() == [0.0]);
    if !is_zero || !x.dtype().is_float() || axes.iter().any(|&a| a >= x.rank()) {
        return Ok(None);
    }
    let r = x.rank();
    let kept = if let Some(dims) = x.shape().to_known() {
        let d: Vec<i64> = (0..r)
            .filter_map(|a| {
                if axes.contains(&a) {
                    keepdims.then_some(1)
                } else {
                    Some(dims[a] as i64)
                }
            })
            .collect();
        int_vector(&d)
    } else {
        // Only where no static dim would be lost: every kept dim is unknown.
        let idx: Vec<i64> = (0..r as i64)
            .filter(|a| !axes.contains(&(*a as usize)))
            .collect();
        if keepdims || idx.iter().any(|&a| x.shape().dims()[a as usize].is_some()) {
            return Ok(None);
        }
        gather(shape, &int_vector(&idx), 0)?
    };
    Ok(Some(broadcast_to(zero, &kept)?))
}

pub fn infer_reduce(
    op: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    x: &Tensor,
) -> Result<(Shape, DType)> {
    if x.dtype() == DType::Bool && !matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return Err(Error::Type(format!(
            "{}: bool tensors must be cast to a number type first",
            op.name()
        )));
    }
    if let Some(&a) = axes.iter().find(|&&a| a >= x.rank()) {
        return Err(Error::Value(format!(
            "{}: axis {a} is out of range for rank {}",
            op.name(),
            x.rank()
        )));
    }
    Ok((reduced_shape(x.shape(), axes, keepdims), x.dtype()))
}

pub fn vjp_reduce(
    op: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    node: &Tensor,
    g: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let x = node.input(0);
    let keep = |t: &Tensor| -> Result<Tensor> {
        if keepdims {
            Ok(t.clone())
        } else {
            expand_dims(t, axes)
        }
    };
    let gk = keep(g)?;
    let gx = match op {
        ReduceOp::Sum => broadcast_like(&gk, x)?,
        ReduceOp::Mean => div(&broadcast_like(&gk, x)?, &count(x, node)?)?,
        ReduceOp::Max | ReduceOp::Min => {
            let yk = keep(node)?;
            let mask = cast(&binary(super::BinaryOp::Equal, x, &yk)?, x.dtype())?;
            let ties = reduce(ReduceOp::Sum, &mask, axes, true)?;
            mul(&mask, &div(&gk, &ties)?)?
        }
        // A product over no axis (of a 0-d tensor, say) is the identity.
        ReduceOp::Prod if axes.is_empty() => broadcast_like(&gk, x)?,
        ReduceOp::Prod => {
            // d prod / d x_i = product of the others = exclusive cumprods from both sides.
            let a = axes[0];
            let left = scan(ScanOp::Cumprod, x, a, true, false)?;
            let right = scan(ScanOp::Cumprod, x, a, true, true)?;
            mul(&broadcast_like(&gk, x)?, &mul(&left, &right)?)?
        }
    };
    Ok(vec![Some(gx)])
}

/// The number of elements reduced into each output element, as a scalar of `x`'s dtype.
fn count(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    if let (Some(a), Some(b)) = (x.shape().numel(), y.shape().numel()) {
        return Ok(scalar_like(
            x,
            if b == 0 { 0.0 } else { a as f64 / b as f64 },
        ));
    }
    let n = |t: &Tensor| -> Result<Tensor> {
        cast(
            &reduce(ReduceOp::Prod, &shape_of(t)?, &[0], false)?,
            x.dtype(),
        )
    };
    div(&n(x)?, &n(y)?)
}

pub fn cpu_reduce(op: ReduceOp, axes: &[usize], keepdims: bool, x: &Value) -> Result<Value> {
    let out_shape = reduced_dims(x.shape(), axes, keepdims);
    let (t, lo, hi) = contiguous_block(x, axes)?;
    let (outer, red, inner) = blocks(t.shape(), lo, hi);
    if red == 0 && !x.dtype().is_float() && matches!(op, ReduceOp::Max | ReduceOp::Min) {
        // The i64 identities would wrap on the cast back to a narrower type (the max of an
        // empty int8 axis came out 0, of an empty bool axis True); f64 -> int casts saturate.
        let v = match (op, x.dtype()) {
            (ReduceOp::Max, DType::Bool) => 0.0,
            (ReduceOp::Min, DType::Bool) => 1.0,
            (ReduceOp::Max, _) => f64::NEG_INFINITY,
            _ => f64::INFINITY,
        };
        return Ok(Value::full(x.dtype(), &out_shape, v));
    }
    let s = out_shape.clone();
    let s2 = out_shape.clone();
    let s3 = out_shape;
    Ok(in_class(
        &t,
        x.dtype(),
        |d| (reduce_blocks(op, d, outer, red, inner), s),
        |d| (reduce_blocks(op, d, outer, red, inner), s2),
        |d| (reduce_blocks(op, d, outer, red, inner), s3),
    ))
}

/// The f32 maximum or minimum over a contiguous run of axes that leaves the batch axis
/// (axis 0), one image at a time, for a reduction run on each image of a fused group's
/// result as the group writes it (`compile::fuse::Group::pooled`): a Keras global max
/// pooling. The values equal the whole reduction's (a maximum does not depend on the
/// order it reads its terms in).
pub struct ImageReduce {
    shape: Vec<usize>,
    images: usize,
    op: ReduceOp,
    /// Each image as (outer, reduced, inner) blocks.
    outer: usize,
    red: usize,
    inner: usize,
}

impl ImageReduce {
    /// `None` unless `op` is a maximum or minimum over a non-empty contiguous run of
    /// axes of `x_shape` without axis 0.
    pub fn new(op: ReduceOp, axes: &[usize], keepdims: bool, x_shape: &[usize]) -> Option<Self> {
        let (&lo, &last) = (axes.first()?, axes.last()?);
        let hi = last + 1;
        if !matches!(op, ReduceOp::Max | ReduceOp::Min)
            || lo == 0
            || hi > x_shape.len()
            || hi - lo != axes.len()
        {
            return None;
        }
        let (outer, red, inner) = blocks(&x_shape[1..], lo - 1, hi - 1);
        Some(ImageReduce {
            shape: reduced_dims(x_shape, axes, keepdims),
            images: x_shape[0],
            op,
            outer,
            red,
            inner,
        })
    }
}

impl super::ImageStage for ImageReduce {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn images(&self) -> usize {
        self.images
    }
    fn run(&self, x: &[f32], y: &mut [f32]) {
        let (op, red, inner) = (self.op, self.red, self.inner);
        if red == 0 {
            // An empty reduced axis: the reduction's identity, as `cpu_reduce` gives it.
            y.fill(reduce_row(op, &[]));
            return;
        }
        if inner == 1 {
            y.iter_mut()
                .zip(x.chunks(red))
                .for_each(|(o, row)| *o = reduce_row(op, row));
            return;
        }
        let init = if op == ReduceOp::Max {
            f32::lowest()
        } else {
            f32::highest()
        };
        y.fill(init);
        y.chunks_mut(inner)
            .zip(x.chunks(red * inner))
            .take(self.outer)
            .for_each(|(o, b)| fold_rows(op, o, b, red, inner, 0));
    }
}

/// Moves `axes` to the end (keeping order) when they are not already one contiguous block,
/// returning the value to reduce and the block [lo, hi) holding the axes.
fn contiguous_block(x: &Value, axes: &[usize]) -> Result<(Value, usize, usize)> {
    let r = x.shape().len();
    if axes.is_empty() {
        return Ok((x.clone(), r, r));
    }
    let (lo, hi) = (axes[0], axes[axes.len() - 1] + 1);
    if hi - lo == axes.len() {
        return Ok((x.clone(), lo, hi));
    }
    let mut perm: Vec<usize> = (0..r).filter(|i| !axes.contains(i)).collect();
    perm.extend_from_slice(axes);
    Ok((super::movement::cpu_transpose(&perm, x)?, r - axes.len(), r))
}

fn reduce_blocks<T: Acc>(
    op: ReduceOp,
    data: &[T],
    outer: usize,
    red: usize,
    inner: usize,
) -> Vec<T> {
    if inner == 1 {
        let mut out = vec![T::zero(); outer];
        if red == 0 {
            out.iter_mut().for_each(|o| *o = reduce_row(op, &[]));
        } else if outer * red >= 1 << 15 {
            out.par_iter_mut()
                .zip(data.par_chunks(red))
                .for_each(|(o, row)| *o = reduce_row(op, row));
        } else {
            out.iter_mut()
                .zip(data.chunks(red))
                .for_each(|(o, row)| *o = reduce_row(op, row));
        }
        return out;
    }
    let init = match op {
        ReduceOp::Sum | ReduceOp::Mean => T::zero(),
        ReduceOp::Prod => T::one(),
        ReduceOp::Max => T::lowest(),
        ReduceOp::Min => T::highest(),
    };
    let mut out = vec![init; outer * inner];
    let per_outer = |o: &mut [T], block: &[T]| fold_rows(op, o, block, red, inner, 0);
    if red * inner == 0 {
        if op == ReduceOp::Mean {
            out.iter_mut().for_each(|a| *a = a.div_count(0));
        }
        return out;
    }
    let threads = rayon::current_num_threads();
    if outer > 1 && outer * red * inner >= 1 << 15 {
        out.par_chunks_mut(inner)
            .zip(data.par_chunks(red * inner))
            .for_each(|(o, b)| per_outer(o, b));
    } else if inner >= 4096 && red * inner >= 1 << 15 {
        // One outer block, wide rows: split the columns across threads.
        let cols = 1024;
        for (oi, block) in out.chunks_mut(inner).zip(data.chunks(red * inner)) {
            oi.par_chunks_mut(cols)
                .enumerate()
                .for_each(|(ci, o)| fold_rows(op, o, block, red, inner, ci * cols));
        }
    } else if outer == 1 && threads > 1 && red * inner >= 2 * ROWS_GRAIN_ELEMS {
        // One block of many narrow rows (a bias gradient): each task folds a run of rows
        // into its own partial result, then the partials are folded like rows.
        let per = (ROWS_GRAIN_ELEMS / inner).max(red.div_ceil(threads));
        let parts: Vec<T> = (0..red.div_ceil(per))
            .into_par_iter()
            .flat_map_iter(|t| {
                let rows = per.min(red - t * per);
                let mut part = vec![init; inner];
                let sub = if op == ReduceOp::Mean {
                    ReduceOp::Sum
                } else {
                    op
                };
                fold_rows(sub, &mut part, &data[t * per * inner..], rows, inner, 0);
                part
            })
            .collect();
        let sub = if op == ReduceOp::Mean {
            ReduceOp::Sum
        } else {
            op
        };
        fold_rows(sub, &mut out, &parts, parts.len() / inner, inner, 0);
        if op == ReduceOp::Mean {
            out.iter_mut().for_each(|a| *a = a.div_count(red));
        }
    } else {
        out.chunks_mut(inner)
            .zip(data.chunks(red * inner))
            .for_each(|(o, b)| per_outer(o, b));
    }
    out
}

/// Adds the `red` rows of `inner` f32 columns in `block` into `o` (Kahan-compensated
/// register strips, as a reduction over leading axes runs): for a fused group folding its
/// tiles (`runtime::cpu::fused`).
pub(crate) fn fold_sum_f32(o: &mut [f32], block: &[f32], red: usize, inner: usize) {
    fold_rows(ReduceOp::Sum, o, block, red, inner, 0);
}

/// The pairwise sum of `xs`.
pub(crate) fn sum_f32(xs: &[f32]) -> f32 {
    pairwise_sum(xs)
}

// ---- arg ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgOp {
    ArgMax,
    ArgMin,
}

impl ArgOp {
    pub fn name(self) -> &'static str {
        match self {
            ArgOp::ArgMax => "argmax",
            ArgOp::ArgMin => "argmin",
        }
    }
}

pub fn arg(op: ArgOp, x: &Tensor, axis: usize) -> Result<Tensor> {
    Tensor::new(Op::Arg { op, axis }, vec![x.clone()])
}

pub fn infer_arg(axis: usize, x: &Tensor) -> Result<(Shape, DType)> {
    if axis >= x.rank() {
        return Err(Error::Value(format!(
            "argmax/argmin: axis {axis} is out of range for rank {}",
            x.rank()
        )));
    }
    Ok((reduced_shape(x.shape(), &[axis], false), DType::I64))
}

pub fn cpu_arg(op: ArgOp, axis: usize, x: &Value) -> Result<Value> {
    let shape = x.shape().to_vec();
    if shape[axis] == 0 {
        return Err(Error::Value(format!(
            "{}: cannot reduce an empty axis {axis} of shape {shape:?}",
            op.name()
        )));
    }
    let b = blocks(&shape, axis, axis + 1);
    let mut out_shape = shape.clone();
    out_shape.remove(axis);
    // TF's start (see `arg_blocks`): the dtype's most negative (most positive) finite value.
    let v = match x {
        Value::F32(a) => arg_blocks(
            op,
            a.as_slice().expect("standard"),
            b,
            (-f32::MAX, f32::MAX),
        ),
        Value::F64(a) => arg_blocks(
            op,
            a.as_slice().expect("standard"),
            b,
            (-f64::MAX, f64::MAX),
        ),
        Value::F16(_) => {
            let Value::F32(a) = x.cast(DType::F32) else {
                unreachable!()
            };
            let m = f32::from(half::f16::MAX);
            arg_blocks(op, a.as_slice().expect("standard"), b, (-m, m))
        }
        _ => {
            let Value::I64(a) = x.cast(DType::I64) else {
                unreachable!()
            };
            arg_blocks(op, a.as_slice().expect("standard"), b, (i64::MIN, i64::MAX))
        }
    };
    Value::from_vec(&out_shape, v)
}

/// The index of the first maximum (minimum) along the reduced axis, as TF's ArgMax (ArgMin)
/// finds it: starting from index 0 holding `start.0` (`start.1`), an element replaces the
/// best only where it is strictly greater (less). A NaN never compares so, hence never
/// wins: `argmax([1, nan, 3]) == 2`, and a slice of NaN (or of values no greater than the
/// start, such as -inf) gives 0.
fn arg_blocks<T: Acc>(
    op: ArgOp,
    data: &[T],
    (outer, red, inner): (usize, usize, usize),
    start: (T, T),
) -> Vec<i64> {
    let mut out = vec![0i64; outer * inner];
    for o in 0..outer {
        for j in 0..inner {
            let (mut best, mut bv) = match op {
                ArgOp::ArgMax => (0usize, start.0),
                ArgOp::ArgMin => (0usize, start.1),
            };
            for r in 0..red {
                let v = data[(o * red + r) * inner + j];
                let better = match op {
                    ArgOp::ArgMax => v > bv,
                    ArgOp::ArgMin => v < bv,
                };
                if better {
                    best = r;
                    bv = v;
                }
            }
            out[o * inner + j] = best as i64;
        }
    }
    out
}

// ---- scan ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanOp {
    Cumsum,
    Cumprod,
}

impl ScanOp {
    pub fn name(self) -> &'static str {
        match self {
            ScanOp::Cumsum => "cumsum",
            ScanOp::Cumprod => "cumprod",
        }
    }
}

pub fn scan(op: ScanOp, x: &Tensor, axis: usize, exclusive: bool, reverse: bool) -> Result<Tensor> {
    Tensor::new(
        Op::Scan {
            op,
            axis,
            exclusive,
            reverse,
        },
        vec![x.clone()],
    )
}

pub fn infer_scan(op: ScanOp, axis: usize, x: &Tensor) -> Result<(Shape, DType)> {
    if axis >= x.rank() {
        return Err(Error::Value(format!(
            "{}: axis {axis} is out of range for rank {}",
            op.name(),
            x.rank()
        )));
    }
    if x.dtype() == DType::Bool {
        return Err(Error::Type(format!(
            "{}: bool tensors must be cast to a number type first",
            op.name()
        )));
    }
    Ok((x.shape().clone(), x.dtype()))
}

pub fn vjp_scan(
    op: ScanOp,
    axis: usize,
    exclusive: bool,
    reverse: bool,
    node: &Tensor,
    g: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let x = node.input(0);
    let gx = match op {
        ScanOp::Cumsum => scan(ScanOp::Cumsum, g, axis, exclusive, !reverse)?,
        ScanOp::Cumprod => vjp_cumprod(x, node, g, axis, exclusive, reverse)?,
    };
    Ok(vec![Some(gx)])
}

/// The gradient of a cumulative product, exact at zeros. d y_j / d x_i is the product of
/// y_j's factors other than x_i, so gx_i = sum over the y_j holding x_i of g_j * y_j / x_i
/// (a reversed cumsum divided by x_i) wherever no zero comes at or before i along the scan.
/// Past the first zero every such product holds that zero: the gradient is 0. At the first
/// zero it is the same reversed cumsum with the scan taken over x with that zero replaced
/// by one.
fn vjp_cumprod(
    x: &Tensor,
    y: &Tensor,
    g: &Tensor,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> Result<Tensor> {
    use super::BinaryOp::{And, Equal};
    let (zero, one) = (scalar_like(x, 0.0), scalar_like(x, 1.0));
    let is_zero = binary(Equal, x, &zero)?;
    let zeros_so_far = scan(
        ScanOp::Cumsum,
        &cast(&is_zero, x.dtype())?,
        axis,
        false,
        reverse,
    )?;
    let before = binary(Equal, &zeros_so_far, &zero)?;
    let first = binary(And, &is_zero, &binary(Equal, &zeros_so_far, &one)?)?;
    let back = |y: &Tensor| scan(ScanOp::Cumsum, &mul(g, y)?, axis, exclusive, !reverse);
    let g_before = div(&back(y)?, &select(&before, x, &one)?)?;
    let y_first = scan(
        ScanOp::Cumprod,
        &select(&first, &one, x)?,
        axis,
        exclusive,
        reverse,
    )?;
    let g_first = back(&y_first)?;
    select(&before, &g_before, &select(&first, &g_first, &zero)?)
}

pub fn cpu_scan(
    op: ScanOp,
    axis: usize,
    exclusive: bool,
    reverse: bool,
    x: &Value,
) -> Result<Value> {
    let shape = x.shape().to_vec();
    let (outer, red, inner) = blocks(&shape, axis, axis + 1);
    let (s1, s2, s3) = (shape.clone(), shape.clone(), shape);
    Ok(in_class(
        x,
        x.dtype(),
        |d| {
            (
                scan_blocks(op, d, outer, red, inner, exclusive, reverse),
                s1,
            )
        },
        |d| {
            (
                scan_blocks(op, d, outer, red, inner, exclusive, reverse),
                s2,
            )
        },
        |d| {
            (
                scan_blocks(op, d, outer, red, inner, exclusive, reverse),
                s3,
            )
        },
    ))
}

fn scan_blocks<T: Acc>(
    op: ScanOp,
    data: &[T],
    outer: usize,
    red: usize,
    inner: usize,
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    let mut out = vec![T::zero(); data.len()];
    let init = match op {
        ScanOp::Cumsum => T::zero(),
        ScanOp::Cumprod => T::one(),
    };
    for o in 0..outer {
        let mut acc = vec![init; inner];
        for k in 0..red {
            let r = if reverse { red - 1 - k } else { k };
            let base = (o * red + r) * inner;
            for j in 0..inner {
                let v = data[base + j];
                if exclusive {
                    out[base + j] = acc[j];
                }
                acc[j] = match op {
                    ScanOp::Cumsum => acc[j].add(v),
                    ScanOp::Cumprod => acc[j].mul(v),
                };
                if !exclusive {
                    out[base + j] = acc[j];
                }
            }
        }
    }
    out
}

// ---- helpers ----

/// The runtime shape of a reduction of `shape` over `axes` (both devices' kernels).
pub(crate) fn reduced_dims(shape: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

fn reduced_shape(s: &Shape, axes: &[usize], keepdims: bool) -> Shape {
    Shape(
        s.dims()
            .iter()
            .enumerate()
            .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
                (false, _) => Some(d),
                (true, true) => Some(Some(1)),
                (true, false) => None,
            })
            .collect(),
    )
}

/// Runs `f` on a compute-class copy of `x` (f32, f64 or i64) and casts the result back.
fn in_class(
    x: &Value,
    back: DType,
    f32f: impl FnOnce(&[f32]) -> (Vec<f32>, Vec<usize>),
    f64f: impl FnOnce(&[f64]) -> (Vec<f64>, Vec<usize>),
    i64f: impl FnOnce(&[i64]) -> (Vec<i64>, Vec<usize>),
) -> Value {
    let out = match x {
        Value::F32(a) => {
            let (v, s) = f32f(a.as_slice().expect("standard"));
            Value::from_vec(&s, v)
        }
        Value::F64(a) => {
            let (v, s) = f64f(a.as_slice().expect("standard"));
            Value::from_vec(&s, v)
        }
        Value::F16(_) => {
            let Value::F32(a) = x.cast(DType::F32) else {
                unreachable!()
            };
            let (v, s) = f32f(a.as_slice().expect("standard"));
            Value::from_vec(&s, v)
        }
        _ => {
            let Value::I64(a) = x.cast(DType::I64) else {
                unreachable!()
            };
            let (v, s) = i64f(a.as_slice().expect("standard"));
            Value::from_vec(&s, v)
        }
    };
    out.expect("kernel output matches its shape").cast(back)
}

/// Splits `shape` around a contiguous block of axes [lo, hi) into (outer, reduced, inner).
fn blocks(shape: &[usize], lo: usize, hi: usize) -> (usize, usize, usize) {
    (
        shape[..lo].iter().product(),
        shape[lo..hi].iter().product(),
        shape[hi..].iter().product(),
    )
}

trait Acc: Copy + Send + Sync + PartialOrd + 'static {
    fn zero() -> Self;
    fn one() -> Self;
    fn lowest() -> Self;
    fn highest() -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn is_nan(self) -> bool;
    fn div_count(self, n: usize) -> Self;
}

macro_rules! acc_float {
    ($t:ty) => {
        impl Acc for $t {
            fn zero() -> Self {
                0.0
            }
            fn one() -> Self {
                1.0
            }
            fn lowest() -> Self {
                <$t>::NEG_INFINITY
            }
            fn highest() -> Self {
                <$t>::INFINITY
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                self != self
            }
            fn div_count(self, n: usize) -> Self {
                self / n as $t
            }
        }
    };
}

acc_float!(f32);

acc_float!(f64);

impl Acc for i64 {
    fn zero() -> Self {
        0
    }
    fn one() -> Self {
        1
    }
    fn lowest() -> Self {
        i64::MIN
    }
    fn highest() -> Self {
        i64::MAX
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self.wrapping_sub(o)
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        false
    }
    fn div_count(self, n: usize) -> Self {
        if n == 0 {
            0
        } else {
            self / n as i64
        }
    }
}

/// Pairwise summation: error grows with log(n), not n, and the 8-lane base case vectorises.
fn pairwise_sum<T: Acc>(xs: &[T]) -> T {
    if xs.len() <= 256 {
        let mut lanes = [T::zero(); 8];
        let mut chunks = xs.chunks_exact(8);
        for c in &mut chunks {
            for i in 0..8 {
                lanes[i] = lanes[i].add(c[i]);
            }
        }
        let mut s = T::zero();
        for &v in chunks.remainder() {
            s = s.add(v);
        }
        let l = lanes;
        return s
            .add(((l[0].add(l[1])).add(l[2].add(l[3]))).add((l[4].add(l[5])).add(l[6].add(l[7]))));
    }
    let mid = xs.len() / 2 / 8 * 8;
    pairwise_sum(&xs[..mid]).add(pairwise_sum(&xs[mid..]))
}

#[inline(always)]
fn pick_max<T: Acc>(a: T, b: T) -> T {
    if b > a || b.is_nan() {
        b
    } else {
        a
    }
}

#[inline(always)]
fn pick_min<T: Acc>(a: T, b: T) -> T {
    if b < a || b.is_nan() {
        b
    } else {
        a
    }
}

fn reduce_row<T: Acc>(op: ReduceOp, row: &[T]) -> T {
    match op {
        ReduceOp::Sum => pairwise_sum(row),
        ReduceOp::Mean => pairwise_sum(row).div_count(row.len()),
        ReduceOp::Prod => row.iter().fold(T::one(), |a, &b| a.mul(b)),
        ReduceOp::Max => lanes_fold(row, T::lowest(), pick_max),
        ReduceOp::Min => lanes_fold(row, T::highest(), pick_min),
    }
}

/// `row` folded by `f` in 16 interleaved lanes, then the lanes in order and the tail: the
/// lanes' steps are independent, so they vectorise where one chain of compares and
/// selects ran at ~2 ns an element. For `pick_max`/`pick_min`, NaN still wins wherever it
/// is; of equal values (`-0.0` and `0.0`) the one kept may come from another place.
#[inline(always)]
fn lanes_fold<T: Acc>(row: &[T], init: T, f: impl Fn(T, T) -> T) -> T {
    const LANES: usize = 16;
    let mut lanes = [init; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            lanes[i] = f(lanes[i], c[i]);
        }
    }
    let head = lanes.into_iter().fold(init, &f);
    chunks.remainder().iter().fold(head, |a, &b| f(a, b))
}

/// One Kahan step: `a + b` into `a`, with the running compensation `c`. A compensation
/// that is not finite (an infinite or NaN term, or an overflow) is dropped, so infinities
/// sum as IEEE says.
#[inline(always)]
fn kahan<T: Acc>(a: &mut T, c: &mut T, b: T) {
    let y = b.sub(*c);
    let t = a.add(y);
    let d = t.sub(*a).sub(y);
    *c = if d.sub(d) == T::zero() { d } else { T::zero() };
    *a = t;
}

/// Columns per register strip: one 64-byte vector of sums and one of compensations.
const fn strip<T>() -> usize {
    64 / std::mem::size_of::<T>()
}

/// Folds `red` rows into the columns `o`: row `r` is `block[r * inner + start..][..o.len()]`.
/// Columns go in register strips, each strip walking a run of rows, so the accumulators
/// stay in registers between rows; runs of rows are sized to stay in cache while all the
/// strips walk them. Sums add each 8 rows as a tree, then Kahan-add that into the strip:
/// the compensation's dependency chain runs once per 8 rows, and the error stays a few
/// ulps of the sum of magnitudes, where plain accumulation of a million float32 terms
/// drifts by ~1%. The compensation is folded into `o` at the end.
#[inline(always)]
fn fold_rows_strips<T: Acc>(
    op: ReduceOp,
    o: &mut [T],
    block: &[T],
    red: usize,
    inner: usize,
    start: usize,
) {
    let n = o.len();
    let w = strip::<T>();
    let wide = n / w * w;
    let sum = matches!(op, ReduceOp::Sum | ReduceOp::Mean);
    let mut comp = vec![T::zero(); if sum { wide } else { 0 }];
    // Rows per run: about 32 KiB of the block, a multiple of 8.
    let run = ((1usize << 15) / (inner.max(1) * std::mem::size_of::<T>())).max(8) / 8 * 8;
    macro_rules! strip_sum {
        ($w:expr, $j:expr, $r0:expr, $r1:expr) => {{
            const W: usize = $w;
            let (j, r1) = ($j, $r1);
            macro_rules! row {
                ($r:expr) => {{
                    let x: &[T; W] = block[$r * inner + start + j..][..W]
                        .try_into()
                        .expect("strip");
                    x
                }};
            }
            let (mut acc, mut cmp) = ([T::zero(); W], [T::zero(); W]);
            acc.copy_from_slice(&o[j..j + W]);
            cmp.copy_from_slice(&comp[j..j + W]);
            let mut r = $r0;
            while r + 8 <= r1 {
                let rs = [
                    row!(r),
                    row!(r + 1),
                    row!(r + 2),
                    row!(r + 3),
                    row!(r + 4),
                    row!(r + 5),
                    row!(r + 6),
                    row!(r + 7),
                ];
                for i in 0..W {
                    let t = ((rs[0][i].add(rs[1][i])).add(rs[2][i].add(rs[3][i])))
                        .add((rs[4][i].add(rs[5][i])).add(rs[6][i].add(rs[7][i])));
                    kahan(&mut acc[i], &mut cmp[i], t);
                }
                r += 8;
            }
            for r in r..r1 {
                let x = row!(r);
                for i in 0..W {
                    kahan(&mut acc[i], &mut cmp[i], x[i]);
                }
            }
            o[j..j + W].copy_from_slice(&acc);
            comp[j..j + W].copy_from_slice(&cmp);
        }};
    }
    macro_rules! strip_fold {
        ($w:expr, $j:expr, $r0:expr, $r1:expr, $f:expr) => {{
            const W: usize = $w;
            let j = $j;
            let mut acc = [T::zero(); W];
            acc.copy_from_slice(&o[j..j + W]);
            for r in $r0..$r1 {
                let x: &[T; W] = block[r * inner + start + j..][..W]
                    .try_into()
                    .expect("strip");
                for i in 0..W {
                    acc[i] = $f(acc[i], x[i]);
                }
            }
            o[j..j + W].copy_from_slice(&acc);
        }};
    }
    macro_rules! all_strips {
        ($one:ident $(, $f:expr)?) => {{
            let mut r0 = 0;
            while r0 < red {
                let r1 = red.min(r0 + run);
                // Two vectors per strip where the columns allow: two independent chains
                // (one vector's once-per-8-rows Kahan chain left a 64-column bias
                // gradient latency-bound).
                let mut j = 0;
                while j < wide {
                    let two = j + 2 * w <= wide;
                    match (w == 16, two) {
                        (true, true) => $one!(32, j, r0, r1 $(, $f)?),
                        (true, false) => $one!(16, j, r0, r1 $(, $f)?),
                        (false, true) => $one!(16, j, r0, r1 $(, $f)?),
                        (false, false) => $one!(8, j, r0, r1 $(, $f)?),
                    }
                    j += if two { 2 * w } else { w };
                }
                r0 = r1;
            }
        }};
    }
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            all_strips!(strip_sum);
            for (a, &c) in o[..wide].iter_mut().zip(&comp) {
                *a = if c.sub(c) == T::zero() { a.sub(c) } else { *a };
            }
        }
        ReduceOp::Prod => all_strips!(strip_fold, |a: T, b: T| a.mul(b)),
        ReduceOp::Max => all_strips!(strip_fold, pick_max::<T>),
        ReduceOp::Min => all_strips!(strip_fold, pick_min::<T>),
    }
    if wide < n {
        // Fewer columns than a strip: rows outer, the remaining columns inner.
        let sub = if op == ReduceOp::Mean {
            ReduceOp::Sum
        } else {
            op
        };
        fold_rows_rowwise(sub, &mut o[wide..], block, red, inner, start + wide);
    }
    if op == ReduceOp::Mean {
        o.iter_mut().for_each(|a| *a = a.div_count(red));
    }
}

super::conv::cpu::simd_kernel!(fn fold_rows<T: Acc>(op: ReduceOp, o: &mut [T], block: &[T], red: usize, inner: usize, start: usize) = fold_rows_strips);

/// `fold_rows` a row at a time (Kahan-compensated sums): for the columns left over after
/// the register strips.
#[inline(always)]
fn fold_rows_rowwise<T: Acc>(
    op: ReduceOp,
    o: &mut [T],
    block: &[T],
    red: usize,
    inner: usize,
    start: usize,
) {
    let n = o.len();
    let rows = (0..red).map(|r| &block[r * inner + start..r * inner + start + n]);
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            let mut comp = vec![T::zero(); n];
            for row in rows {
                for ((a, c), &b) in o.iter_mut().zip(comp.iter_mut()).zip(row) {
                    let y = b.sub(*c);
                    let t = a.add(y);
                    let d = t.sub(*a).sub(y);
                    *c = if d.sub(d) == T::zero() { d } else { T::zero() };
                    *a = t;
                }
            }
            if op == ReduceOp::Mean {
                o.iter_mut().for_each(|a| *a = a.div_count(red));
            }
        }
        ReduceOp::Prod => {
            rows.for_each(|row| o.iter_mut().zip(row).for_each(|(a, &b)| *a = a.mul(b)))
        }
        ReduceOp::Max => rows.for_each(|row| {
            o.iter_mut()
                .zip(row)
                .for_each(|(a, &b)| *a = pick_max(*a, b))
        }),
        ReduceOp::Min => rows.for_each(|row| {
            o.iter_mut()
                .zip(row)
                .for_each(|(a, &b)| *a = pick_min(*a, b))
        }),
    }
}

/// Rows per task when one block of many rows is split across threads.
const ROWS_GRAIN_ELEMS: usize = 1 << 16;
