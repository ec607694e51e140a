//! Axis relabelling primitives: `expand_dims`, `squeeze`, `transpose`.

use super::*;

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
