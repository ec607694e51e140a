//! Strided slices and their adjoint, concatenation and its adjoint, `pad`, `reverse`.

use super::*;

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
