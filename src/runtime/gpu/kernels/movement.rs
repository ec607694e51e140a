//! GPU lowerings of the data-movement primitives (`ops::movement`): strided gathers and
//! scatters over `shaders/movement.wgsl`, indexed gathers and `scatter.wgsl`'s atomic adds.

use super::super::exec::{grid, Exec, Lazy, Slot};
use super::super::params::{self as blk, Params};
use super::super::pipelines::{self};
use super::super::pool;
use super::super::transfer::{scalar_word, words_per};
use super::super::DTensor;
use super::{c_strides, tag};
use crate::base::dtype::DType;
use crate::base::error::Result;
use crate::ops::movement::{indices, resolve_slice};
use crate::ops::SliceAxis;
use crate::value_err;

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
pub(super) fn gather_strided(
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
    ex.dispatch(pipe, &[(1, &out), (2, src)], p, grid(n))?;
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
    ex.dispatch(pipe, &[(1, out), (2, src)], p, grid(n))?;
    Ok(())
}

pub(super) fn fill(ex: &mut Exec, out: &DTensor, word: u32) -> Result<()> {
    let n = out.numel();
    let pipe = pipelines::family(ex.ctx, "movement", "fill", "u32")?;
    let p = blk::Fill { n: n as u32, word };
    ex.dispatch(pipe, &[(1, out)], Params::of(&p), grid(n))?;
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

pub(super) fn transpose(ex: &mut Exec, i: usize, perm: &[usize]) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let x = ex.dev(ins[0])?;
    let cs = c_strides(&x.shape);
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let st: Vec<i64> = perm.iter().map(|&p| cs[p]).collect();
    Ok(Slot::dev(gather_strided(ex, i, &x, &shape, 0, &st)?))
}

pub(super) fn slice(ex: &mut Exec, i: usize, spec: &[SliceAxis]) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let x = ex.dev(ins[0])?;
    let (base, st, dims) = slice_geometry(spec, &x.shape);
    if let Some(w) = contiguous(&x, base, &st, &dims) {
        return Ok(Slot::dev(w));
    }
    let n: usize = dims.iter().product();
    if ex.lay.lazy[i] && n > 0 && base >= 0 && st.iter().all(|&s| s >= 0) {
        return Ok(lazy(
            dims,
            x.dtype,
            Lazy::Slice {
                base: x,
                offset: base as usize,
                strides: st.iter().map(|&s| s as usize).collect(),
            },
        ));
    }
    Ok(Slot::dev(gather_strided(ex, i, &x, &dims, base, &st)?))
}

/// The slot of a lazy value of `shape` (`exec::Lazy`).
fn lazy(shape: Vec<usize>, dtype: DType, lazy: Lazy) -> Slot {
    Slot {
        shape,
        dtype,
        host: None,
        dev: None,
        lazy: Some(lazy),
    }
}

/// Writes lazy value `lazy` of node `j` out to a buffer of its own: the kernel the node
/// would have run, for a reader other than a generated kernel.
pub(crate) fn write_out(ex: &mut Exec, j: usize, lazy: &Lazy) -> Result<DTensor> {
    let shape = ex.slot(j).shape.clone();
    match lazy {
        Lazy::Slice {
            base,
            offset,
            strides,
        } => {
            let st: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
            gather_strided(ex, j, base, &shape, *offset as i64, &st)
        }
        Lazy::Pad { g, starts } => {
            let cs = c_strides(&shape);
            let base: i64 = starts.iter().zip(&cs).map(|(&s, &c)| s as i64 * c).sum();
            let out = ex.alloc(&shape, g.dtype, j)?;
            fill(ex, &out, 0)?;
            scatter_strided(ex, &out, g, base, &cs)?;
            Ok(out)
        }
    }
}

/// A slice of `x` whose elements are one run in C order (a range of rows, or of the
/// elements of a vector), as a window of `x`'s buffer (`DTensor::window`), which no
/// kernel copies.
fn contiguous(x: &DTensor, base: i64, st: &[i64], dims: &[usize]) -> Option<DTensor> {
    let cs = c_strides(dims);
    let run = dims
        .iter()
        .zip(st.iter().zip(&cs))
        .all(|(&d, (&s, &c))| d <= 1 || s == c);
    (run && base >= 0)
        .then(|| x.window(base as usize, dims.to_vec()))
        .flatten()
}

pub(super) fn reverse(ex: &mut Exec, i: usize, axes: &[usize]) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
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
    Ok(Slot::dev(gather_strided(ex, i, &x, &shape, base, &st)?))
}

pub(super) fn concat_grad(ex: &mut Exec, i: usize, axis: &usize, index: &usize) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let g = ex.dev(ins[0])?;
    let off: usize = ins[1..1 + index]
        .iter()
        .map(|&j| ex.slot(j).shape[*axis])
        .sum();
    let len = ex.slot(ins[1 + index]).shape[*axis];
    let cs = c_strides(&g.shape);
    let mut shape = g.shape.clone();
    shape[*axis] = len;
    Ok(Slot::dev(gather_strided(
        ex,
        i,
        &g,
        &shape,
        off as i64 * cs[*axis],
        &cs,
    )?))
}

pub(super) fn slice_grad(ex: &mut Exec, i: usize, spec: &[SliceAxis]) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let g = ex.dev(ins[0])?;
    let like = ex.slot(ins[1]).shape.clone();
    let (base, st, dims) = slice_geometry(spec, &like);
    if dims != g.shape {
        return Err(value_err!(
            "slice_grad: gradient shape {:?} does not match the slice shape {dims:?}",
            g.shape
        ));
    }
    let unit = st == c_strides(&like);
    if ex.lay.lazy[i] && unit && g.numel() > 0 {
        let starts = spec
            .iter()
            .zip(&like)
            .map(|(s, &d)| resolve_slice(s, d).0 as usize)
            .collect();
        return Ok(lazy(like, g.dtype, Lazy::Pad { g, starts }));
    }
    let out = ex.alloc(&like, g.dtype, i)?;
    fill(ex, &out, 0)?;
    scatter_strided(ex, &out, &g, base, &st)?;
    Ok(Slot::dev(out))
}

pub(super) fn pad(ex: &mut Exec, i: usize, pads: &[(usize, usize)], value: &f64) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
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
    Ok(Slot::dev(out))
}

/// The concatenation node `i`: pieces that their kernels wrote into its buffer
/// (`fusion::operands_placed`) are in place; the others are copied there.
pub(super) fn concat(ex: &mut Exec, i: usize, axis: &usize) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let shapes: Vec<Vec<usize>> = ins.iter().map(|&j| ex.slot(j).shape.clone()).collect();
    let dtype = ex.slot(ins[0]).dtype;
    let mut shape = shapes[0].clone();
    shape[*axis] = 0;
    for x in &shapes {
        let ok = x.len() == shape.len()
            && x.iter()
                .zip(&shape)
                .enumerate()
                .all(|(d, (a, b))| d == *axis || a == b);
        if !ok {
            return Err(value_err!(
                "concatenate: shapes {shapes:?} do not match outside axis {axis}"
            ));
        }
        shape[*axis] += x[*axis];
    }
    let cs = c_strides(&shape);
    let placed = ex.pieces.borrow_mut().remove(&i);
    let (out, written) = match placed {
        Some((b, w)) if b.shape == shape && b.dtype == dtype => (b, w),
        Some(_) | None => (ex.alloc(&shape, dtype, i)?, vec![false; ins.len()]),
    };
    let mut off = 0i64;
    for (k, &j) in ins.iter().enumerate() {
        let base = off * cs[*axis];
        if !written[k] {
            let x = ex.dev(j)?;
            scatter_strided(ex, &out, &x, base, &cs)?;
        }
        off += shapes[k][*axis] as i64;
    }
    Ok(Slot::dev(out))
}

pub(super) fn gather(ex: &mut Exec, i: usize, axis: &usize) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
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
    Ok(Slot::dev(out))
}

pub(super) fn scatter_add(ex: &mut Exec, i: usize, axis: &usize) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
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
    let msg = format!(
        "scatter_add: index {{index}} is out of range for an axis of size {n} (indices shape {:?})",
        idx.shape
    );
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
    Ok(Slot::dev(out))
}

/// The words of `x` as a flat tensor of raw words (what the `u32` kernels move).
fn flat_words(x: &DTensor) -> DTensor {
    x.reshaped(vec![x.words()], DType::I32)
}

/// Row `t` of `seq` (`[T, ..]`) copied into a tensor of the row's shape (a loop's step
/// input whose row is not a window, `DTensor::row`); node `i` names the buffer in errors.
pub(crate) fn copy_row(ex: &mut Exec, i: usize, seq: &DTensor, t: usize) -> Result<DTensor> {
    let row = seq.shape[1..].to_vec();
    let n = row.iter().product::<usize>() * words_per(seq.dtype);
    let out = gather_strided(ex, i, &flat_words(seq), &[n], (t * n) as i64, &[1])?;
    Ok(out.reshaped(row, seq.dtype))
}

/// Writes `src` into row `t` of `dst` (`[T, ..src.shape]`; a loop's stacked result).
pub(crate) fn write_row(ex: &mut Exec, dst: &DTensor, src: &DTensor, t: usize) -> Result<()> {
    let n = src.words();
    scatter_strided(ex, &flat_words(dst), &flat_words(src), (t * n) as i64, &[1])
}

/// `src`'s words copied into a fresh buffer, one dispatch recorded as it is
/// (`Exec::dispatch_fresh`: it writes only its fresh output).
pub(crate) fn copy(ex: &mut Exec, src: &DTensor) -> Result<DTensor> {
    let n = src.words();
    let buf = pool::alloc(ex.ctx, src.bytes(), &|| {
        format!(
            "a copy of a tensor of shape {:?} ({})",
            src.shape, src.dtype
        )
    })?;
    let out = DTensor::new(buf, src.shape.clone(), src.dtype);
    let p = strided_params(n, &[n], 0, &[1]);
    let pipe = pipelines::family(ex.ctx, "movement", "gather_strided", "u32")?;
    ex.dispatch_fresh(
        pipe,
        &[(1, &flat_words(&out)), (2, &flat_words(src))],
        p,
        grid(n),
    );
    Ok(out)
}
