//! Batched matrix multiply with broadcasting batch dims: `(..., m, k) @ (..., k, n)`, either
//! side optionally transposed in its last two axes. f32/f64/f16 run through the `gemm`
//! crate with strides (a transposed operand is never copied); integers use a plain loop.

use super::build::*;
use super::Op;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::runtime::value::{Arr, Elem, Value};
use crate::shape::{broadcast_runtime, broadcast_static, Dim, Shape};
use crate::value_err;
use gemm::Parallelism;
use half::f16;
use rayon::prelude::*;
use std::mem::MaybeUninit;

fn mat_dims(d: &[Dim], t: bool) -> (Dim, Dim) {
    let (r, c) = (d[d.len() - 2], d[d.len() - 1]);
    if t { (c, r) } else { (r, c) }
}

pub fn infer(ta: bool, tb: bool, a: &Tensor, b: &Tensor) -> Result<(Shape, DType)> {
    if a.rank() < 2 || b.rank() < 2 {
        return Err(value_err!("matmul: operands must have rank >= 2, got shapes {} and {}", a.shape(), b.shape()));
    }
    if a.dtype() != b.dtype() {
        return Err(Error::Type(format!("matmul: operands have different dtypes {} and {}", a.dtype(), b.dtype())));
    }
    if a.dtype() == DType::Bool {
        return Err(Error::Type("matmul: bool operands are not supported".into()));
    }
    let (m, ka) = mat_dims(a.shape().dims(), ta);
    let (kb, n) = mat_dims(b.shape().dims(), tb);
    if let (Some(x), Some(y)) = (ka, kb) {
        if x != y {
            return Err(value_err!(
                "dot: shapes {} and {} are incompatible: the contracted dims are {x} and {y}",
                a.shape(),
                b.shape()
            ));
        }
    }
    let ba = Shape(a.shape().dims()[..a.rank() - 2].to_vec());
    let bb = Shape(b.shape().dims()[..b.rank() - 2].to_vec());
    let mut dims = broadcast_static("matmul", &ba, &bb)?.0;
    dims.push(m);
    dims.push(n);
    Ok((Shape(dims), a.dtype()))
}

pub fn matmul(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Result<Tensor> {
    Tensor::new(Op::MatMul { ta, tb }, vec![a.clone(), b.clone()])
}

pub fn vjp(ta: bool, tb: bool, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let (a, b) = (node.input(0), node.input(1));
    let (ga, gb) = match (ta, tb) {
        (false, false) => (matmul(g, b, false, true)?, matmul(a, g, true, false)?),
        (true, false) => (matmul(b, g, false, true)?, matmul(a, g, false, false)?),
        (false, true) => (matmul(g, b, false, false)?, matmul(g, a, true, false)?),
        (true, true) => (matmul(b, g, true, true)?, matmul(g, a, true, true)?),
    };
    Ok(vec![Some(sum_like(&ga, a)?), Some(sum_like(&gb, b)?)])
}

/// Row-major strides (row, col) of one operand's matrix, as read after the optional transpose.
fn strides(cols: usize, t: bool) -> (isize, isize) {
    if t { (1, cols as isize) } else { (cols as isize, 1) }
}

/// Offsets of each batch element into a broadcast operand.
fn batch_offsets(bshape: &[usize], own: &[usize], mat: usize) -> Vec<usize> {
    let total: usize = bshape.iter().product();
    let lead = bshape.len() - own.len();
    let mut st = vec![0usize; own.len()];
    let mut acc = mat;
    for i in (0..own.len()).rev() {
        st[i] = if own[i] == 1 { 0 } else { acc };
        acc *= own[i];
    }
    (0..total)
        .map(|mut flat| {
            let mut off = 0;
            for i in (0..bshape.len()).rev() {
                let idx = flat % bshape[i];
                flat /= bshape[i];
                if i >= lead {
                    off += idx * st[i - lead];
                }
            }
            off
        })
        .collect()
}

trait GemmElem: Elem + Default {
    fn zero() -> Self;
    fn one() -> Self;
}
impl GemmElem for f32 {
    fn zero() -> Self { 0.0 }
    fn one() -> Self { 1.0 }
}
impl GemmElem for f64 {
    fn zero() -> Self { 0.0 }
    fn one() -> Self { 1.0 }
}
impl GemmElem for f16 {
    fn zero() -> Self { f16::ZERO }
    fn one() -> Self { f16::ONE }
}

#[derive(Clone, Copy)]
struct Plan {
    m: usize,
    n: usize,
    k: usize,
    a_cols: usize,
    b_cols: usize,
    ta: bool,
    tb: bool,
}

fn run_gemm<T: GemmElem>(a: &Arr<T>, b: &Arr<T>, p: Plan, out_shape: &[usize], aoff: &[usize], boff: &[usize]) -> Value {
    let (m, n, k) = (p.m, p.n, p.k);
    // Written by gemm (read_dst = false) without zeroing first.
    let total: usize = out_shape.iter().product();
    let mut out: Vec<T> = Vec::with_capacity(total);
    let (ad, bd) = (a.as_slice().expect("standard"), b.as_slice().expect("standard"));
    let (a_rs, a_cs) = strides(p.a_cols, p.ta);
    let (b_rs, b_cs) = strides(p.b_cols, p.tb);
    let batches = aoff.len();
    let flops = m * n * k;
    let one = |dst: &mut [MaybeUninit<T>], ao: usize, bo: usize, par: Parallelism| {
        if m == 0 || n == 0 {
            return;
        }
        if k == 0 {
            dst.iter_mut().for_each(|v| {
                v.write(T::zero());
            });
            return;
        }
        // SAFETY: every pointer addresses an m x k, k x n or m x n block inside its buffer,
        // with the strides computed for that buffer's row-major layout above.
        unsafe {
            gemm::gemm(
                m, n, k,
                dst.as_mut_ptr() as *mut T, 1, n as isize, false,
                ad.as_ptr().add(ao), a_cs, a_rs,
                bd.as_ptr().add(bo), b_cs, b_rs,
                T::zero(), T::one(), false, false, false, par,
            )
        }
    };
    let spare = &mut out.spare_capacity_mut()[..total];
    if batches > 1 && flops < 1 << 20 {
        spare.par_chunks_mut((m * n).max(1)).zip(aoff.par_iter().zip(boff.par_iter())).for_each(|(dst, (&ao, &bo))| {
            one(dst, ao, bo, Parallelism::None)
        });
    } else {
        let par = if flops >= 1 << 18 { Parallelism::Rayon(rayon::current_num_threads()) } else { Parallelism::None };
        for (i, dst) in spare.chunks_mut((m * n).max(1)).enumerate().take(batches) {
            one(dst, aoff[i], boff[i], par);
        }
    }
    // SAFETY: each batch's m x n block was written above (by gemm, or zeros when k == 0).
    unsafe { out.set_len(total) };
    T::wrap(Arr::from_shape_vec(ndarray::IxDyn(out_shape), out).expect("shape matches").into_shared())
}

fn int_matmul(a: &[i64], b: &[i64], p: Plan, out_shape: &[usize], aoff: &[usize], boff: &[usize]) -> Value {
    let (m, n, k) = (p.m, p.n, p.k);
    let (a_rs, a_cs) = strides(p.a_cols, p.ta);
    let (b_rs, b_cs) = strides(p.b_cols, p.tb);
    let mut out = vec![0i64; out_shape.iter().product()];
    for (bi, dst) in out.chunks_mut((m * n).max(1)).enumerate().take(aoff.len()) {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0i64;
                for l in 0..k {
                    let x = a[(aoff[bi] as isize + i as isize * a_rs + l as isize * a_cs) as usize];
                    let y = b[(boff[bi] as isize + l as isize * b_rs + j as isize * b_cs) as usize];
                    s = s.wrapping_add(x.wrapping_mul(y));
                }
                dst[i * n + j] = s;
            }
        }
    }
    Value::from_vec(out_shape, out).expect("shape matches")
}

pub fn cpu(ta: bool, tb: bool, a: &Value, b: &Value) -> Result<Value> {
    let (sa, sb) = (a.shape(), b.shape());
    let (ra, rb) = (sa.len(), sb.len());
    let (m, ka) = if ta { (sa[ra - 1], sa[ra - 2]) } else { (sa[ra - 2], sa[ra - 1]) };
    let (kb, n) = if tb { (sb[rb - 1], sb[rb - 2]) } else { (sb[rb - 2], sb[rb - 1]) };
    if ka != kb {
        return Err(value_err!("dot: shapes {sa:?} and {sb:?} are incompatible: the contracted dims are {ka} and {kb}"));
    }
    let bshape = broadcast_runtime("matmul", &sa[..ra - 2], &sb[..rb - 2])?;
    let mut out_shape = bshape.clone();
    out_shape.extend([m, n]);
    let aoff = batch_offsets(&bshape, &sa[..ra - 2], sa[ra - 2] * sa[ra - 1]);
    let boff = batch_offsets(&bshape, &sb[..rb - 2], sb[rb - 2] * sb[rb - 1]);
    let p = Plan { m, n, k: ka, a_cols: sa[ra - 1], b_cols: sb[rb - 1], ta, tb };
    Ok(match (a, b) {
        (Value::F32(x), Value::F32(y)) => run_gemm(x, y, p, &out_shape, &aoff, &boff),
        (Value::F64(x), Value::F64(y)) => run_gemm(x, y, p, &out_shape, &aoff, &boff),
        (Value::F16(x), Value::F16(y)) => run_gemm(x, y, p, &out_shape, &aoff, &boff),
        _ if a.dtype() == b.dtype() => {
            let (Value::I64(x), Value::I64(y)) = (a.cast(DType::I64), b.cast(DType::I64)) else { unreachable!() };
            int_matmul(x.as_slice().expect("standard"), y.as_slice().expect("standard"), p, &out_shape, &aoff, &boff)
                .cast(a.dtype())
        }
        _ => return Err(Error::Type(format!("matmul: operands have dtypes {} and {}", a.dtype(), b.dtype()))),
    })
}
