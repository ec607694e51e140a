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
    // Matrices transposed by the blocked kernel where the permutation is one (a 2-D
    // transpose, NHWC <-> NCHW, the last two axes swapped); otherwise a run of the last
    // axis at a time when it stays last (the `[B, T, F] -> [T, B, F]` of every `K.rnn`:
    // 10x faster than stepping an n-d index per element).
    Ok(
        map_value!(x, a => match (a.as_slice(), matrix_transposes(a.shape(), perm)) {
            (Some(data), Some(dims)) => transposed(data, dims, perm, a.shape()),
            _ => to_contiguous(a.view().permuted_axes(IxDyn(perm))),
        }),
    )
}

/// `(batches, rows, cols)` where permuting a row-major array of `shape` by `perm` moves
/// its elements as transposing `batches` row-major `rows x cols` matrices one after
/// another does: once axes of size 1 are dropped and axes that stay adjacent and in order
/// are merged, the permutation is `[1, 0]` or `[0, 2, 1]`.
fn matrix_transposes(shape: &[usize], perm: &[usize]) -> Option<(usize, usize, usize)> {
    // Each moving axis's place among the input's axes of size > 1.
    let mut place = vec![usize::MAX; shape.len()];
    let mut n = 0;
    for (axis, &d) in shape.iter().enumerate() {
        if d != 1 {
            place[axis] = n;
            n += 1;
        }
    }
    // Merged groups in output order: (place of the first axis, elements).
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut last = usize::MAX;
    for &p in perm.iter().filter(|&&p| shape[p] != 1) {
        match groups.last_mut() {
            Some(g) if place[p] == last + 1 => g.1 *= shape[p],
            _ => groups.push((place[p], shape[p])),
        }
        last = place[p];
    }
    match groups[..] {
        [(b, cols), (a, rows)] if a < b => Some((1, rows, cols)),
        [(a, batches), (c, cols), (b, rows)] if a < b && b < c => Some((batches, rows, cols)),
        _ => None,
    }
}

/// The array of `batches` row-major `rows x cols` matrices in `data` with each one
/// transposed, shaped as `shape` permuted by `perm`.
fn transposed<T: Elem>(
    data: &[T],
    (batches, rows, cols): (usize, usize, usize),
    perm: &[usize],
    shape: &[usize],
) -> Arr<T> {
    let len = batches * rows * cols;
    let mut out: Vec<T> = Vec::with_capacity(len);
    let mat = rows * cols;
    if batches == 1 {
        transpose_par(data, rows, cols, out.spare_capacity_mut());
    } else if mat > 0 {
        use rayon::prelude::*;
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(mat)
            .zip(data.par_chunks(mat))
            .with_min_len((1 << 16) / mat.max(1) + 1)
            .for_each(|(dst, src)| transpose_into(src, rows, cols, dst));
    }
    // SAFETY: each matrix's every element was written above.
    unsafe { out.set_len(len) };
    let dims: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    Arr::from_shape_vec(IxDyn(&dims), out)
        .expect("length is the product of the shape")
        .into_shared()
}
