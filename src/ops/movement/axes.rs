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
    // Where the last axis moves, matrices transposed by the blocked kernel (a 2-D
    // transpose, NHWC <-> NCHW, the last two axes swapped: after merging, one matrix or a
    // batch of them; otherwise one per index of the other axes); where it stays last, a run
    // of it at a time (the `[B, T, F] -> [T, B, F]` of every `K.rnn`: 10x faster than
    // stepping an n-d index per element).
    let (shape, merged_perm) = merged_permutation(x.shape(), perm);
    let last_moves = merged_perm
        .last()
        .is_some_and(|&p| p + 1 != merged_perm.len());
    Ok(map_value!(x, a => match a.as_slice() {
        Some(data) if last_moves => {
            let dims: Vec<usize> = perm.iter().map(|&p| a.shape()[p]).collect();
            permuted(data, &shape, &merged_perm, &dims)
        }
        _ => to_contiguous(a.view().permuted_axes(IxDyn(perm))),
    }))
}

/// `(shape, perm)` moving a row-major array's elements as `shape`, `perm` do, with the
/// axes of size 1 dropped and the axes that stay adjacent and in order merged into one.
fn merged_permutation(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // Each axis of size > 1 by its place among them.
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
            Some(g) if place[p] == last.wrapping_add(1) => g.1 *= shape[p],
            _ => groups.push((place[p], shape[p])),
        }
        last = place[p];
    }
    // The groups numbered by their order in the input.
    let mut by_input: Vec<usize> = (0..groups.len()).collect();
    by_input.sort_by_key(|&g| groups[g].0);
    let mut merged_perm = vec![0; groups.len()];
    for (i, &g) in by_input.iter().enumerate() {
        merged_perm[g] = i;
    }
    (by_input.iter().map(|&g| groups[g].1).collect(), merged_perm)
}

/// `data` (row-major, of `shape`) permuted by `perm`, which moves the last axis: for each
/// index of the other axes, the matrix of the axis that becomes the last by the last axis,
/// transposed into place. The result is shaped `dims`.
fn permuted<T: Elem>(data: &[T], shape: &[usize], perm: &[usize], dims: &[usize]) -> Arr<T> {
    use rayon::prelude::*;
    let n = shape.len();
    let len: usize = shape.iter().product();
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let (src_st, dst_st) = (
        crate::base::shape::row_major_strides(shape),
        crate::base::shape::row_major_strides(&out_shape),
    );
    // The matrix: rows along the axis that becomes the last, columns along the last.
    let p = perm[n - 1];
    let q = perm
        .iter()
        .position(|&a| a == n - 1)
        .expect("a permutation");
    let (rows, cols) = (shape[p], shape[n - 1]);
    let mut out: Vec<T> = Vec::with_capacity(len);
    if n == 2 {
        transpose_par(data, rows, cols, out.spare_capacity_mut());
    } else if len > 0 {
        // The other axes, in output order: (size, source stride, destination stride).
        let outer: Vec<(usize, usize, usize)> = (0..n)
            .filter(|&o| o != n - 1 && o != q)
            .map(|o| (out_shape[o], src_st[perm[o]], dst_st[o]))
            .collect();
        let count: usize = outer.iter().map(|o| o.0).product();
        let dst = SharedDst(out.as_mut_ptr());
        let (sr, dr) = (src_st[p], dst_st[q]);
        (0..count)
            .into_par_iter()
            .with_min_len((1 << 16) / (rows * cols) + 1)
            .for_each(|mut i| {
                let (mut so, mut d_o) = (0, 0);
                for &(size, ss, ds) in outer.iter().rev() {
                    so += i % size * ss;
                    d_o += i % size * ds;
                    i /= size;
                }
                let d = dst;
                // SAFETY: the matrix at `so` lies inside `data` and its transpose at `d_o`
                // inside the result; the indices of the other axes give each task its own
                // elements of the result.
                unsafe {
                    transpose_strided(data.as_ptr().add(so), sr, rows, cols, d.0.add(d_o), dr)
                };
            });
    }
    // SAFETY: each element of the result was written above (every index of the other
    // axes, every row and column of its matrix).
    unsafe { out.set_len(len) };
    Arr::from_shape_vec(IxDyn(dims), out)
        .expect("length is the product of the shape")
        .into_shared()
}
