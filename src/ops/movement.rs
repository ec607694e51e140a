//! Movement primitives: reshape, broadcast and its adjoint sum-to, expand/squeeze,
//! transpose, strided slices, concat, pad, reverse, gather and scatter-add. Target shapes
//! of reshape/broadcast are int tensors, so they may depend on runtime shapes (`K.shape`).

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
    let target = shape_arg("broadcast_to", s)?;
    let t = Shape(target.iter().map(|d| d.map(|d| d as usize)).collect());
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
    let target: Vec<usize> = s.to_i64_vec().iter().map(|&d| d.max(0) as usize).collect();
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
pub fn sum_like(x: &Tensor, like: &Tensor) -> Result<Tensor> {
    if x.shape() == like.shape() && x.shape().to_known().is_some() {
        return Ok(x.clone());
    }
    sum_to(x, &shape_of(like)?)
}

pub fn infer_sum_to(x: &Tensor, s: &Tensor) -> Result<(Shape, DType)> {
    let target = shape_arg("sum_to", s)?;
    Ok((
        Shape(target.iter().map(|d| d.map(|d| d as usize)).collect()),
        x.dtype(),
    ))
}

pub fn vjp_sum_to(node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(broadcast_like(g, node.input(0))?), None])
}

pub fn cpu_sum_to(x: &Value, s: &Value) -> Result<Value> {
    let target: Vec<usize> = s.to_i64_vec().iter().map(|&d| d.max(0) as usize).collect();
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

// ---- expand_dims ----

pub fn expand_dims(x: &Tensor, axes: &[usize]) -> Result<Tensor> {
    if axes.is_empty() {
        return Ok(x.clone());
    }
    Tensor::new(Op::ExpandDims(axes.to_vec()), vec![x.clone()])
}

pub fn infer_expand_dims(axes: &[usize], x: &Tensor) -> Result<(Shape, DType)> {
    let r = x.rank() + axes.len();
    if axes.iter().any(|&a| a >= r) {
        return Err(value_err!(
            "expand_dims: axes {axes:?} out of range for the result rank {r}"
        ));
    }
    let mut src = x.shape().dims().iter();
    let dims = (0..r)
        .map(|i| {
            if axes.contains(&i) {
                Some(1)
            } else {
                *src.next().expect("rank checked")
            }
        })
        .collect();
    Ok((Shape(dims), x.dtype()))
}

pub fn vjp_expand_dims(axes: &[usize], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(squeeze(g, axes)?)])
}

pub fn cpu_expand_dims(axes: &[usize], x: &Value) -> Result<Value> {
    x.reshape(&expanded_dims(axes, x.shape()))
}

/// The shape `expand_dims` gives a tensor of `shape`.
pub fn expanded_dims(axes: &[usize], shape: &[usize]) -> Vec<usize> {
    let r = shape.len() + axes.len();
    let mut src = shape.iter();
    (0..r)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                *src.next().expect("rank")
            }
        })
        .collect()
}

// ---- squeeze ----

pub fn squeeze(x: &Tensor, axes: &[usize]) -> Result<Tensor> {
    if axes.is_empty() {
        return Ok(x.clone());
    }
    Tensor::new(Op::Squeeze(axes.to_vec()), vec![x.clone()])
}

pub fn infer_squeeze(axes: &[usize], x: &Tensor) -> Result<(Shape, DType)> {
    for &a in axes {
        match x.shape().dims().get(a) {
            None => {
                return Err(value_err!(
                    "squeeze: axis {a} is out of range for shape {}",
                    x.shape()
                ))
            }
            Some(Some(d)) if *d != 1 => {
                return Err(value_err!(
                    "squeeze: cannot squeeze axis {a} of shape {}: its size is {d}, not 1",
                    x.shape()
                ))
            }
            Some(_) => {}
        }
    }
    let dims = x
        .shape()
        .dims()
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, d)| *d)
        .collect();
    Ok((Shape(dims), x.dtype()))
}

pub fn vjp_squeeze(axes: &[usize], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(expand_dims(g, axes)?)])
}

pub fn cpu_squeeze(axes: &[usize], x: &Value) -> Result<Value> {
    x.reshape(&squeezed_dims(axes, x.shape())?)
}

/// The shape `squeeze` gives a tensor of `shape`; every squeezed axis must have size 1.
pub fn squeezed_dims(axes: &[usize], shape: &[usize]) -> Result<Vec<usize>> {
    if let Some(&a) = axes.iter().find(|&&a| shape[a] != 1) {
        return Err(value_err!(
            "squeeze: axis {a} of shape {shape:?} has size {}, not 1",
            shape[a]
        ));
    }
    Ok(shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect())
}

// ---- transpose ----

pub fn transpose(x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    if perm.iter().enumerate().all(|(i, &p)| i == p) && perm.len() == x.rank() {
        return Ok(x.clone());
    }
    Tensor::new(Op::Transpose(perm.to_vec()), vec![x.clone()])
}

pub fn infer_transpose(perm: &[usize], x: &Tensor) -> Result<(Shape, DType)> {
    let mut sorted = perm.to_vec();
    sorted.sort_unstable();
    if sorted != (0..x.rank()).collect::<Vec<_>>() {
        return Err(value_err!(
            "permute_dimensions: pattern {perm:?} is not a permutation of the {} axes of shape {}",
            x.rank(),
            x.shape()
        ));
    }
    Ok((
        Shape(perm.iter().map(|&p| x.shape().dims()[p]).collect()),
        x.dtype(),
    ))
}

pub fn vjp_transpose(perm: &[usize], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    Ok(vec![Some(transpose(g, &inv)?)])
}

pub fn cpu_transpose(perm: &[usize], x: &Value) -> Result<Value> {
    // A run of the last axis at a time when it stays last (the `[B, T, F] -> [T, B, F]` of
    // every `K.rnn`: 10x faster than stepping an n-d index per element).
    Ok(map_value!(x, a => to_contiguous(a.view().permuted_axes(IxDyn(perm)))))
}

// ---- slice, slice_grad ----

pub fn slice(x: &Tensor, spec: &[SliceAxis]) -> Result<Tensor> {
    Tensor::new(Op::Slice(spec.to_vec()), vec![x.clone()])
}

pub fn slice_grad(g: &Tensor, like: &Tensor, spec: &[SliceAxis]) -> Result<Tensor> {
    Tensor::new(Op::SliceGrad(spec.to_vec()), vec![g.clone(), like.clone()])
}

pub fn infer_slice(spec: &[SliceAxis], x: &Tensor) -> Result<(Shape, DType)> {
    if spec.len() != x.rank() {
        return Err(value_err!(
            "slice: {} slices given for a tensor of rank {}",
            spec.len(),
            x.rank()
        ));
    }
    if spec.iter().any(|s| s.step == 0) {
        return Err(value_err!("slice: step cannot be zero"));
    }
    let dims = spec
        .iter()
        .zip(x.shape().dims())
        .map(|(s, d)| d.map(|n| resolve_slice(s, n).3))
        .collect();
    Ok((Shape(dims), x.dtype()))
}

pub fn infer_slice_grad(_spec: &[SliceAxis], g: &Tensor, like: &Tensor) -> Result<(Shape, DType)> {
    Ok((like.shape().clone(), g.dtype()))
}

pub fn vjp_slice(spec: &[SliceAxis], node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(slice_grad(g, node.input(0), spec)?)])
}

pub fn vjp_slice_grad(spec: &[SliceAxis], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(slice(g, spec)?), None])
}

pub fn cpu_slice(spec: &[SliceAxis], x: &Value) -> Result<Value> {
    Ok(map_value!(x, a => {
        let mut v = a.view();
        for (ax, sa) in spec.iter().enumerate() {
            let n = v.shape()[ax];
            v.slice_axis_inplace(Axis(ax), nd_slice(sa, n));
        }
        to_contiguous(v)
    }))
}

pub fn cpu_slice_grad(spec: &[SliceAxis], g: &Value, like: &Value) -> Result<Value> {
    fn go<T: Elem>(g: &Arr<T>, shape: &[usize], spec: &[SliceAxis]) -> Result<Value> {
        let mut out = ndarray::Array::<T, _>::default(IxDyn(shape));
        {
            let mut v = out.view_mut();
            for (ax, sa) in spec.iter().enumerate() {
                let n = v.shape()[ax];
                v.slice_axis_inplace(Axis(ax), nd_slice(sa, n));
            }
            if v.shape() != g.shape() {
                return Err(value_err!(
                    "slice_grad: gradient shape {:?} does not match the slice shape {:?}",
                    g.shape(),
                    v.shape()
                ));
            }
            copy_into(v, g.view());
        }
        Ok(T::wrap(out.into_shared()))
    }
    with_value!(g, a => go(a, like.shape(), spec))
}

/// The ndarray slice that selects NumPy's `start:stop:step` from an axis of size `n`.
fn nd_slice(s: &SliceAxis, n: usize) -> Slice {
    let (start, _, step, len) = resolve_slice(s, n);
    if len == 0 {
        Slice::new(0, Some(0), 1)
    } else if step > 0 {
        Slice::new(
            start as isize,
            Some((start + (len as i64 - 1) * step + 1) as isize),
            step as isize,
        )
    } else {
        let lo = start + (len as i64 - 1) * step;
        Slice::new(lo as isize, Some((start + 1) as isize), step as isize)
    }
}

/// `dst.assign(src)` (same shapes), a run of the last axis at a time where both are unit
/// strided along it.
fn copy_into<T: Elem>(mut dst: ArrayViewMut<'_, T, IxDyn>, src: ArrayView<'_, T, IxDyn>) {
    let last = dst.ndim().wrapping_sub(1);
    let unit = |s: &[isize], n: usize| n <= 1 || s[last] == 1;
    if dst.ndim() == 0
        || !unit(dst.strides(), dst.shape()[last])
        || !unit(src.strides(), src.shape()[last])
    {
        dst.assign(&src);
        return;
    }
    for (mut d, s) in dst
        .lanes_mut(Axis(last))
        .into_iter()
        .zip(src.lanes(Axis(last)))
    {
        d.as_slice_mut()
            .expect("unit stride checked")
            .copy_from_slice(s.to_slice().expect("unit stride checked"));
    }
}

// ---- concat, concat_grad ----

pub fn concat(xs: &[Tensor], axis: usize) -> Result<Tensor> {
    if xs.len() == 1 {
        return Ok(xs[0].clone());
    }
    Tensor::new(Op::Concat(axis), xs.to_vec())
}

pub fn infer_concat(axis: usize, xs: &[Tensor]) -> Result<(Shape, DType)> {
    let first = xs
        .first()
        .ok_or_else(|| value_err!("concatenate: needs at least one tensor"))?;
    let r = first.rank();
    if axis >= r {
        return Err(value_err!(
            "concatenate: axis {axis} is out of range for rank {r}"
        ));
    }
    let mut dims = first.shape().dims().to_vec();
    for x in &xs[1..] {
        if x.rank() != r {
            return Err(value_err!(
                "concatenate: tensors have ranks {} and {}; all must have the same rank",
                r,
                x.rank()
            ));
        }
        if x.dtype() != first.dtype() {
            return Err(Error::Type(format!(
                "concatenate: tensors have dtypes {} and {}",
                first.dtype(),
                x.dtype()
            )));
        }
        for (i, d) in x.shape().dims().iter().enumerate() {
            if i == axis {
                dims[i] = match (dims[i], d) {
                    (Some(a), Some(b)) => Some(a + b),
                    _ => None,
                };
            } else {
                match (dims[i], d) {
                    (Some(a), Some(b)) if a != *b => {
                        return Err(value_err!(
                            "concatenate: shapes {} and {} differ in axis {i}, which is not the concatenation axis {axis}",
                            first.shape(),
                            x.shape()
                        ))
                    }
                    (None, Some(b)) => dims[i] = Some(*b),
                    _ => {}
                }
            }
        }
    }
    Ok((Shape(dims), first.dtype()))
}

pub fn infer_concat_grad(axis: usize, index: usize, ins: &[Tensor]) -> Result<(Shape, DType)> {
    let _ = axis;
    Ok((ins[1 + index].shape().clone(), ins[0].dtype()))
}

pub fn vjp_concat(axis: usize, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let ins = node.inputs();
    let sizes: Option<Vec<usize>> = ins.iter().map(|x| x.shape().dims()[axis]).collect();
    let mut out = Vec::with_capacity(ins.len());
    match sizes {
        Some(sizes) => {
            let mut off = 0i64;
            for s in sizes {
                let mut spec = full_spec(node.rank());
                spec[axis] = SliceAxis {
                    start: Some(off),
                    stop: Some(off + s as i64),
                    step: 1,
                };
                out.push(Some(slice(g, &spec)?));
                off += s as i64;
            }
        }
        None => {
            let mut args = vec![g.clone()];
            args.extend(ins.iter().cloned());
            for index in 0..ins.len() {
                out.push(Some(Tensor::new(
                    Op::ConcatGrad { axis, index },
                    args.clone(),
                )?));
            }
        }
    }
    Ok(out)
}

pub fn vjp_concat_grad(axis: usize, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    // Only the gradient's piece flows back; the other pieces are zeros of their shapes.
    let Op::ConcatGrad { index, .. } = node.op() else {
        unreachable!("called for ConcatGrad")
    };
    let parts: Result<Vec<Tensor>> = node.inputs()[1..]
        .iter()
        .enumerate()
        .map(|(i, x)| {
            if i == *index {
                Ok(g.clone())
            } else {
                zeros_like(x)
            }
        })
        .collect();
    let mut out = vec![Some(concat(&parts?, axis)?)];
    out.extend(std::iter::repeat_n(None, node.inputs().len() - 1));
    Ok(out)
}

pub fn cpu_concat(axis: usize, xs: &[&Value]) -> Result<Value> {
    fn go<T: Elem>(xs: &[&Value], axis: usize) -> Result<Value> {
        let arrs: Vec<&Arr<T>> = xs
            .iter()
            .map(|v| T::unwrap(v).expect("same dtype checked"))
            .collect();
        let first = arrs[0].shape();
        let fits = arrs.iter().all(|a| {
            a.ndim() == first.len()
                && a.shape()
                    .iter()
                    .zip(first)
                    .enumerate()
                    .all(|(i, (m, n))| i == axis || m == n)
        });
        let slices: Option<Vec<&[T]>> = arrs.iter().map(|a| a.as_slice()).collect();
        let (true, Some(slices)) = (fits && axis < first.len(), slices) else {
            let views: Vec<_> = arrs.iter().map(|a| a.view()).collect();
            let out = ndarray::concatenate(Axis(axis), &views).map_err(|e| {
                let shapes: Vec<_> = xs.iter().map(|v| v.shape().to_vec()).collect();
                value_err!("concatenate: shapes {shapes:?} do not match outside axis {axis}: {e}")
            })?;
            return Ok(T::wrap(out.as_standard_layout().into_owned().into_shared()));
        };
        // C-contiguous pieces: each outer index takes one contiguous chunk of every piece.
        let outer: usize = first[..axis].iter().product();
        let inner: usize = first[axis + 1..].iter().product();
        let chunks: Vec<usize> = arrs.iter().map(|a| a.shape()[axis] * inner).collect();
        let mut shape = first.to_vec();
        shape[axis] = arrs.iter().map(|a| a.shape()[axis]).sum();
        let stride: usize = chunks.iter().sum();
        let total = outer * stride;
        let mut out: Vec<T> = Vec::with_capacity(total);
        let dst = SharedDst(out.as_mut_ptr());
        let rows = |o0: usize, o1: usize| {
            for o in o0..o1 {
                let mut at = o * stride;
                for (s, &c) in slices.iter().zip(&chunks) {
                    let d = dst;
                    // SAFETY: outer index o's run [o * stride, (o + 1) * stride) of the
                    // `total`-element result; the halves write disjoint runs.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            s[o * c..(o + 1) * c].as_ptr(),
                            d.0.add(at),
                            c,
                        )
                    };
                    at += c;
                }
            }
        };
        if outer >= 2 && total >= TEAM_COPY && crate::base::team::available() {
            // As in `to_contiguous`: each thread copies the rows it is likely to have written.
            let h = outer / 2;
            crate::base::team::split2(&|p| {
                if p == 0 {
                    rows(0, h)
                } else {
                    rows(h, outer)
                }
            });
        } else {
            rows(0, outer);
        }
        // SAFETY: all `outer` runs were written above.
        unsafe { out.set_len(total) };
        Ok(T::wrap(
            Arr::from_shape_vec(IxDyn(&shape), out).expect("length is the product of the shape"),
        ))
    }
    crate::dispatch_dtype!(xs[0].dtype(), T => go::<T>(xs, axis))
}

pub fn cpu_concat_grad(axis: usize, index: usize, ins: &[&Value]) -> Result<Value> {
    let off: usize = ins[1..1 + index].iter().map(|v| v.shape()[axis]).sum();
    let n = ins[1 + index].shape()[axis];
    let mut spec = full_spec(ins[0].shape().len());
    spec[axis] = SliceAxis {
        start: Some(off as i64),
        stop: Some((off + n) as i64),
        step: 1,
    };
    cpu_slice(&spec, ins[0])
}

// ---- pad ----

pub fn pad(x: &Tensor, pads: &[(usize, usize)], value: f64) -> Result<Tensor> {
    Tensor::new(
        Op::Pad {
            pads: pads.to_vec(),
            value,
        },
        vec![x.clone()],
    )
}

pub fn infer_pad(pads: &[(usize, usize)], x: &Tensor) -> Result<(Shape, DType)> {
    if pads.len() != x.rank() {
        return Err(value_err!(
            "pad: {} (before, after) pairs given for a tensor of rank {}",
            pads.len(),
            x.rank()
        ));
    }
    let dims = x
        .shape()
        .dims()
        .iter()
        .zip(pads)
        .map(|(d, (a, b))| d.map(|d| d + a + b))
        .collect();
    Ok((Shape(dims), x.dtype()))
}

pub fn vjp_pad(pads: &[(usize, usize)], node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let _ = node;
    let spec: Vec<SliceAxis> = pads
        .iter()
        .map(|&(a, b)| SliceAxis {
            start: Some(a as i64),
            stop: if b == 0 { None } else { Some(-(b as i64)) },
            step: 1,
        })
        .collect();
    Ok(vec![Some(slice(g, &spec)?)])
}

pub fn cpu_pad(pads: &[(usize, usize)], value: f64, x: &Value) -> Result<Value> {
    fn go<T: Elem>(a: &Arr<T>, pads: &[(usize, usize)], value: f64) -> Value {
        let shape: Vec<usize> = a
            .shape()
            .iter()
            .zip(pads)
            .map(|(d, (p, q))| d + p + q)
            .collect();
        let mut out = ndarray::Array::from_elem(IxDyn(&shape), T::from_f64(value));
        {
            let mut v: ArrayViewMut<'_, T, IxDyn> = out.view_mut();
            for (ax, ((p, _), d)) in pads.iter().zip(a.shape()).enumerate() {
                v.slice_axis_inplace(
                    Axis(ax),
                    Slice::new(*p as isize, Some((*p + d) as isize), 1),
                );
            }
            v.assign(a);
        }
        T::wrap(out.into_shared())
    }
    Ok(with_value!(x, a => go(a, pads, value)))
}

// ---- reverse ----

pub fn reverse(x: &Tensor, axes: &[usize]) -> Result<Tensor> {
    Tensor::new(Op::Reverse(axes.to_vec()), vec![x.clone()])
}

pub fn infer_reverse(axes: &[usize], x: &Tensor) -> Result<(Shape, DType)> {
    if let Some(a) = axes.iter().find(|&&a| a >= x.rank()) {
        return Err(value_err!(
            "reverse: axis {a} is out of range for rank {}",
            x.rank()
        ));
    }
    Ok((x.shape().clone(), x.dtype()))
}

pub fn vjp_reverse(axes: &[usize], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(reverse(g, axes)?)])
}

pub fn cpu_reverse(axes: &[usize], x: &Value) -> Result<Value> {
    Ok(map_value!(x, a => {
        let mut v = a.view();
        for &ax in axes {
            v.invert_axis(Axis(ax));
        }
        v.as_standard_layout().into_owned().into_shared()
    }))
}

// ---- gather, scatter_add ----

pub fn gather(p: &Tensor, i: &Tensor, axis: usize) -> Result<Tensor> {
    Tensor::new(Op::Gather(axis), vec![p.clone(), i.clone()])
}

pub fn scatter_add(u: &Tensor, i: &Tensor, like: &Tensor, axis: usize) -> Result<Tensor> {
    Tensor::new(
        Op::ScatterAdd(axis),
        vec![u.clone(), i.clone(), like.clone()],
    )
}

fn check_indices(op: &str, i: &Tensor) -> Result<()> {
    if !i.dtype().is_int() {
        return Err(Error::Type(format!(
            "{op}: indices must be integers, got {}",
            i.dtype()
        )));
    }
    Ok(())
}

pub fn infer_gather(axis: usize, p: &Tensor, i: &Tensor) -> Result<(Shape, DType)> {
    check_indices("gather", i)?;
    if axis >= p.rank() {
        return Err(value_err!(
            "gather: axis {axis} is out of range for rank {}",
            p.rank()
        ));
    }
    let d = p.shape().dims();
    let mut dims = d[..axis].to_vec();
    dims.extend_from_slice(i.shape().dims());
    dims.extend_from_slice(&d[axis + 1..]);
    Ok((Shape(dims), p.dtype()))
}

pub fn infer_scatter_add(axis: usize, ins: &[Tensor]) -> Result<(Shape, DType)> {
    check_indices("scatter_add", &ins[1])?;
    if axis >= ins[2].rank() {
        return Err(value_err!(
            "scatter_add: axis {axis} is out of range for rank {}",
            ins[2].rank()
        ));
    }
    Ok((ins[2].shape().clone(), ins[0].dtype()))
}

pub fn vjp_gather(axis: usize, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![
        Some(scatter_add(g, node.input(1), node.input(0), axis)?),
        None,
    ])
}

pub fn vjp_scatter_add(axis: usize, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(gather(g, node.input(1), axis)?), None, None])
}

pub fn cpu_gather(axis: usize, p: &Value, i: &Value) -> Result<Value> {
    let ps = p.shape();
    let (outer, n, inner) = (
        ps[..axis].iter().product::<usize>(),
        ps[axis],
        ps[axis + 1..].iter().product::<usize>(),
    );
    let idx = indices("gather", i, n)?;
    let mut shape = ps[..axis].to_vec();
    shape.extend_from_slice(i.shape());
    shape.extend_from_slice(&ps[axis + 1..]);
    fn go<T: Elem>(
        a: &Arr<T>,
        idx: &[usize],
        outer: usize,
        n: usize,
        inner: usize,
        shape: &[usize],
    ) -> Result<Value> {
        let src = a.as_slice().expect("standard");
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            for &k in idx {
                let base = (o * n + k) * inner;
                out.extend_from_slice(&src[base..base + inner]);
            }
        }
        Value::from_vec(shape, out)
    }
    with_value!(p, a => go(a, &idx, outer, n, inner, &shape))
}

pub fn cpu_scatter_add(axis: usize, u: &Value, i: &Value, like: &Value) -> Result<Value> {
    let ls = like.shape();
    let (outer, n, inner) = (
        ls[..axis].iter().product::<usize>(),
        ls[axis],
        ls[axis + 1..].iter().product::<usize>(),
    );
    let idx = indices("scatter_add", i, n)?;
    if u.len() != outer * idx.len() * inner {
        return Err(value_err!(
            "scatter_add: updates of shape {:?} do not match indices {:?} into {ls:?}",
            u.shape(),
            i.shape()
        ));
    }
    let f = u.cast(if u.dtype() == DType::F64 {
        DType::F64
    } else if u.dtype().is_float() {
        DType::F32
    } else {
        DType::I64
    });
    fn go<T: Elem + std::ops::AddAssign>(
        a: &Arr<T>,
        idx: &[usize],
        outer: usize,
        n: usize,
        inner: usize,
        shape: &[usize],
    ) -> Result<Value> {
        let src = a.as_slice().expect("standard");
        let mut out = vec![T::default(); outer * n * inner];
        let mut s = 0;
        for o in 0..outer {
            for &k in idx {
                let base = (o * n + k) * inner;
                for (d, &v) in out[base..base + inner].iter_mut().zip(&src[s..s + inner]) {
                    *d += v;
                }
                s += inner;
            }
        }
        Value::from_vec(shape, out)
    }
    let r = match &f {
        Value::F32(a) => go(a, &idx, outer, n, inner, ls)?,
        Value::F64(a) => go(a, &idx, outer, n, inner, ls)?,
        Value::I64(a) => go(a, &idx, outer, n, inner, ls)?,
        _ => unreachable!("widened above"),
    };
    Ok(r.cast(u.dtype()))
}

pub fn indices(op: &str, i: &Value, n: usize) -> Result<Vec<usize>> {
    i.to_i64_vec()
        .into_iter()
        .map(|k| {
            if k < 0 || k as usize >= n {
                Err(value_err!(
                    "{op}: index {k} is out of range for an axis of size {n}"
                ))
            } else {
                Ok(k as usize)
            }
        })
        .collect()
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
