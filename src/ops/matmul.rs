//! Batched matrix multiply with broadcasting batch dims: `(..., m, k) @ (..., k, n)`, either
//! side optionally transposed in its last two axes. f32/f64/f16 run through the `gemm`
//! crate with strides; a transposed B is copied to row-major first (see `run_gemm`), and
//! small products stay on the calling thread. Integers use a plain loop.

use super::build::*;
use super::movement::{transpose_into, transpose_par};
use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::{broadcast_runtime, broadcast_static, Dim, Shape};
use crate::base::value::{Arr, Elem, Value};
use crate::ops::graph::Tensor;
use crate::ops::small_gemm;
use crate::value_err;
use gemm::Parallelism;
use half::f16;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

fn mat_dims(d: &[Dim], t: bool) -> (Dim, Dim) {
    let (r, c) = (d[d.len() - 2], d[d.len() - 1]);
    if t {
        (c, r)
    } else {
        (r, c)
    }
}

pub fn infer(ta: bool, tb: bool, a: &Tensor, b: &Tensor) -> Result<(Shape, DType)> {
    if a.rank() < 2 || b.rank() < 2 {
        return Err(value_err!(
            "matmul: operands must have rank >= 2, got shapes {} and {}",
            a.shape(),
            b.shape()
        ));
    }
    if a.dtype() != b.dtype() {
        return Err(Error::Type(format!(
            "matmul: operands have different dtypes {} and {}",
            a.dtype(),
            b.dtype()
        )));
    }
    if a.dtype() == DType::Bool {
        return Err(Error::Type(
            "matmul: bool operands are not supported".into(),
        ));
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
    // An operand that is a transpose of the last two axes (`K.dot(x, K.transpose(w))`) is
    // read through the flag instead: the kernels read it in place, or copy it once in
    // cache-sized panels, where the transpose would copy all of it first.
    let (a, ta) = unswapped(a, ta);
    let (b, tb) = unswapped(b, tb);
    Tensor::new(Op::MatMul { ta, tb }, vec![a, b])
}

/// `(x, t)`, or the input of `x` with `!t` when `x` only swaps its last two axes.
fn unswapped(x: &Tensor, t: bool) -> (Tensor, bool) {
    if let Op::Transpose(p) = x.op() {
        let n = p.len();
        if n >= 2
            && p[n - 2] == n - 1
            && p[n - 1] == n - 2
            && p[..n - 2].iter().enumerate().all(|(i, &q)| i == q)
        {
            return (x.input(0).clone(), !t);
        }
    }
    (x.clone(), t)
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
    if t {
        (1, cols as isize)
    } else {
        (cols as isize, 1)
    }
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

trait GemmElem: Elem + Default + std::ops::Add<Output = Self> {
    fn zero() -> Self;
    fn one() -> Self;
}
impl GemmElem for f32 {
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
}
impl GemmElem for f64 {
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
}
impl GemmElem for f16 {
    fn zero() -> Self {
        f16::ZERO
    }
    fn one() -> Self {
        f16::ONE
    }
}

/// The geometry of one (batched) product: `m x k` times `k x n`, with the stored column
/// counts of the operands and whether each is read transposed.
#[derive(Clone, Copy)]
struct GemmShape {
    m: usize,
    n: usize,
    k: usize,
    a_cols: usize,
    b_cols: usize,
    ta: bool,
    tb: bool,
}

/// Multiply-adds below which a GEMM runs on the calling thread: waking the pool costs more
/// than the work it would share (the LSTM's per-step 64x64x256 is 1M).
const PAR_MIN_MACS: usize = 1 << 21;
/// Multiply-adds from which a single product in a loop body is split in two for the
/// loop's helper thread (`base::team`), which polls instead of sleeping.
const TEAM_MIN_MACS: usize = 1 << 17;
/// Columns at or below which `C = Aᵀ·B` (A stored `k x m`) is computed column-major: the
/// `gemm` microkernel runs `MR` rows of its destination at a time, so a row-major `m x 10`
/// destination, which it transposes to `10 x m`, would compute mostly padding, while
/// column-major it reads A's columns as they lie. (With A stored `m x k` the column-major
/// form packs A with a gather, which measured 6x slower than the row-major one.)
const SKINNY_N: usize = 16;
/// A single product whose result has at most this many elements and whose `k` is at least
/// `SPLIT_K_MIN_K` is split along `k`, one part per thread, and the parts summed (the CNN's
/// dense layer, 64x9216 @ 9216x128). `gemm`'s own threading splits the small result
/// instead, so each thread packs the whole of the long operand it shares with the other.
const SPLIT_K_MAX_OUT: usize = 1 << 15;
/// A single product with at most this many rows and at least `COLUMN_SPLIT_MIN_COLS`
/// columns per thread runs as one block of columns per thread, each a single-threaded
/// `gemm` that packs its own part of B and all of A (A is the small operand). `gemm`'s own
/// threading scales such products poorly: an MLP's 128x784x512 and 128x512x512 ran at
/// 150-169 GFLOP/s on two threads, against 125-130 on one (Xeon guest), and at 184-212
/// split by columns.
const COLUMN_SPLIT_MAX_M: usize = 256;
const COLUMN_SPLIT_MIN_COLS: usize = 128;
const SPLIT_K_MIN_K: usize = 1024;
/// A single `A·Bᵀ` with at most this many rows and `n` of at least `PANELS_MIN` panels is
/// run as column panels in parallel: each task transposes its rows of B (a cache-sized
/// block) and multiplies, instead of one thread transposing all of B first (the CNN's
/// dense input gradient, 64x128 @ (9216x128)ᵀ, spent half its time in that copy).
const PANELS_MAX_M: usize = 256;
/// The least rows and columns of a single `A·Bᵀ` that `gemm` reads in place (`copies_bt`).
const DIRECT_BT_MIN_M: usize = 64;
const DIRECT_BT_MIN_N: usize = 256;
const PANELS_MIN: usize = 4;

/// Columns per panel: the transposed block of B stays about 128 KiB of f32.
fn panel_width(k: usize) -> usize {
    ((1usize << 15) / k.max(1)).clamp(64, 1024) / 16 * 16
}

/// A raw destination shared by tasks that write disjoint parts of it.
#[derive(Clone, Copy)]
pub(crate) struct SharedDst<T>(pub(crate) *mut T);
// SAFETY: only used to hand one output buffer to tasks that write disjoint elements.
unsafe impl<T> Send for SharedDst<T> {}
unsafe impl<T> Sync for SharedDst<T> {}

/// The distinct matrices among `offs` copied transposed (`rows x cols` each) into one
/// buffer, and each batch element's offset into it.
pub(crate) fn transposed_copies<T: Copy + Send + Sync>(
    data: &[T],
    offs: &[usize],
    rows: usize,
    cols: usize,
) -> (Vec<T>, Vec<usize>) {
    let mut uniq: Vec<usize> = offs.to_vec();
    uniq.sort_unstable();
    uniq.dedup();
    let len = rows * cols;
    let mut buf: Vec<T> = Vec::with_capacity(uniq.len() * len);
    if let [o] = uniq[..] {
        transpose_par(&data[o..o + len], rows, cols, buf.spare_capacity_mut());
    } else {
        buf.spare_capacity_mut()[..uniq.len() * len]
            .par_chunks_mut(len.max(1))
            .zip(uniq.par_iter())
            .with_min_len(1)
            .for_each(|(dst, &o)| transpose_into(&data[o..o + len], rows, cols, dst));
    }
    // SAFETY: every element of each matrix's block was written by the transposes.
    unsafe { buf.set_len(uniq.len() * len) };
    let map = offs
        .iter()
        .map(|o| uniq.binary_search(o).expect("listed") * len)
        .collect();
    (buf, map)
}

fn run_gemm<T: GemmElem>(
    a: &Arr<T>,
    b: &Arr<T>,
    geo: GemmShape,
    out_shape: &[usize],
    aoff: &[usize],
    boff: &[usize],
) -> Value {
    let (m, n, k) = (geo.m, geo.n, geo.k);
    // Written by gemm (read_dst = false) without zeroing first.
    let total: usize = out_shape.iter().product();
    let mut out: Vec<T> = Vec::with_capacity(total);
    let (ad, mut bd) = (
        a.as_slice().expect("standard"),
        b.as_slice().expect("standard"),
    );
    let mut boff = std::borrow::Cow::Borrowed(boff);
    let (a_rs, a_cs) = strides(geo.a_cols, geo.ta);
    let (mut b_rs, mut b_cs) = strides(geo.b_cols, geo.tb);
    let macs = m * n * k;
    let threads = rayon::current_num_threads();
    let single = aoff.len() == 1 && m > 0 && n > 0 && k > 0 && macs >= PAR_MIN_MACS && threads > 1;
    let spare = &mut out.spare_capacity_mut()[..total];
    if single && geo.tb && m <= PANELS_MAX_M && n >= PANELS_MIN * panel_width(k) {
        let w = panel_width(k);
        let dst = SharedDst(spare.as_mut_ptr() as *mut T);
        let (a0, b0) = (aoff[0], boff[0]);
        (0..n.div_ceil(w))
            .into_par_iter()
            .for_each_init(Vec::new, |buf: &mut Vec<T>, pi| {
                let (j0, wj) = (pi * w, w.min(n - pi * w));
                // B's rows j0..j0+wj (k long each) as a k x wj row-major block.
                buf.clear();
                buf.reserve(k * wj);
                transpose_into(
                    &bd[b0 + j0 * k..b0 + (j0 + wj) * k],
                    wj,
                    k,
                    buf.spare_capacity_mut(),
                );
                // SAFETY: `transpose_into` wrote all k * wj elements. The gemm reads an m x k
                // block of A at its offset and the k x wj block, and writes columns
                // j0..j0+wj of every row of the m x n destination, which no other task writes.
                unsafe {
                    buf.set_len(k * wj);
                    let d = dst;
                    gemm::gemm(
                        m,
                        wj,
                        k,
                        d.0.add(j0),
                        1,
                        n as isize,
                        false,
                        ad.as_ptr().add(a0),
                        a_cs,
                        a_rs,
                        buf.as_ptr(),
                        1,
                        wj as isize,
                        T::zero(),
                        T::one(),
                        false,
                        false,
                        false,
                        Parallelism::None,
                    )
                }
            });
        // SAFETY: the panels cover all n columns of every row.
        unsafe { out.set_len(total) };
        return result(out, out_shape);
    }
    let skinny = skinny(geo.ta, m, n);
    if single && !skinny && !geo.tb && splits_k(m, n, k) {
        // At least SPLIT_K_MIN_K / 2 of k per part, so many threads do not slice k thin.
        let kp = k.div_ceil(threads.min(2 * k / SPLIT_K_MIN_K));
        let (a0, b0) = (aoff[0], boff[0]);
        let parts: Vec<Vec<T>> = (0..k.div_ceil(kp))
            .into_par_iter()
            .with_max_len(1)
            .map(|pi| {
                let (l0, kl) = (pi * kp, kp.min(k - pi * kp));
                let mut part: Vec<T> = Vec::with_capacity(m * n);
                // SAFETY: the m x kl block of A starting at column l0 and the kl x n block
                // of B starting at row l0 lie inside their buffers; gemm writes all m x n
                // elements of `part` (read_dst = false).
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        kl,
                        part.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        ad.as_ptr().add(a0).offset(l0 as isize * a_cs),
                        a_cs,
                        a_rs,
                        bd.as_ptr().add(b0).offset(l0 as isize * b_rs),
                        b_cs,
                        b_rs,
                        T::zero(),
                        T::one(),
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                    part.set_len(m * n);
                }
                part
            })
            .collect();
        let (first, rest) = parts.split_first().expect("k > 0");
        for (i, d) in spare.iter_mut().enumerate() {
            d.write(rest.iter().fold(first[i], |acc, p| acc + p[i]));
        }
        // SAFETY: every element was written just above.
        unsafe { out.set_len(total) };
        return result(out, out_shape);
    }
    // A transposed B is read by `gemm` with a gather in its packing; one transposed copy
    // (n*k moves) is cheaper once there are a few rows of A to reuse it, but not for a
    // single product with many rows and columns (`copies_bt`).
    let bt;
    if geo.tb && n > 1 && k > 1 && m >= 4 && copies_bt(aoff.len(), m, n, k) {
        let (buf, map) = transposed_copies(bd, &boff, n, k);
        (bt, boff) = (buf, std::borrow::Cow::Owned(map));
        bd = &bt;
        (b_rs, b_cs) = (n as isize, 1);
    }
    // A transposed A is read in place by `gemm` (on a Xeon measured no faster copied),
    // except where a long contraction pays for the copy (`copies_transposed`).
    let at;
    let (mut ad, mut aoff) = (ad, std::borrow::Cow::Borrowed(aoff));
    let (mut a_rs, mut a_cs) = (a_rs, a_cs);
    if geo.ta && !skinny && m > 1 && copies_transposed(k, n, m) {
        let (buf, map) = transposed_copies(ad, &aoff, k, m);
        (at, aoff) = (buf, std::borrow::Cow::Owned(map));
        ad = &at;
        (a_rs, a_cs) = (k as isize, 1);
    }
    let aoff = &aoff[..];
    let boff = &boff[..];
    let batches = aoff.len();
    let one =
        |dst: &mut [MaybeUninit<T>], ao: usize, bo: usize, par: Parallelism, tmp: &mut Vec<T>| {
            if m == 0 || n == 0 {
                return;
            }
            if k == 0 {
                dst.iter_mut().for_each(|v| {
                    v.write(T::zero());
                });
                return;
            }
            if skinny {
                // Column-major result (so `gemm` runs m down its microkernel rows), then
                // transposed into place: m*n moves against 2*m*n*k flops.
                tmp.clear();
                tmp.reserve(m * n);
                // SAFETY: as below; the n x m column-major block is tmp's spare capacity.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        tmp.as_mut_ptr(),
                        m as isize,
                        1,
                        false,
                        ad.as_ptr().add(ao),
                        a_cs,
                        a_rs,
                        bd.as_ptr().add(bo),
                        b_cs,
                        b_rs,
                        T::zero(),
                        T::one(),
                        false,
                        false,
                        false,
                        par,
                    );
                    tmp.set_len(m * n);
                }
                transpose_into(tmp, n, m, dst);
                return;
            }
            // SAFETY: every pointer addresses an m x k, k x n or m x n block inside its buffer,
            // with the strides computed for that buffer's row-major layout above.
            unsafe {
                gemm_rows(
                    (m, n, k),
                    dst.as_mut_ptr() as *mut T,
                    n,
                    false,
                    (ad.as_ptr().add(ao), a_rs, a_cs),
                    (bd.as_ptr().add(bo), b_rs, b_cs),
                    par,
                )
            }
        };
    if batches == 1 && !skinny && team_split(m, n, macs) {
        let dst = SharedDst(spare.as_mut_ptr() as *mut T);
        // SAFETY: A (at aoff[0]) and B (at boff[0]) hold m x k and k x n blocks with these
        // strides, and the destination m x n elements.
        unsafe {
            team_halves(
                (m, n, k),
                dst,
                false,
                (ad, aoff[0], a_rs, a_cs),
                (bd, boff[0], b_rs, b_cs),
            )
        };
        // SAFETY: the two parts cover the whole m x n result.
        unsafe { out.set_len(total) };
        return result(out, out_shape);
    }
    if batches == 1 && !skinny && single && splits_columns(m, n, threads) {
        let dst = SharedDst(spare.as_mut_ptr() as *mut T);
        // One block of columns per thread, each a whole number of 16-wide vectors.
        let w = n.div_ceil(threads).div_ceil(16) * 16;
        let (a0, b0) = (aoff[0], boff[0]);
        (0..n.div_ceil(w)).into_par_iter().for_each(|pi| {
            let (j0, wj) = (pi * w, w.min(n - pi * w));
            let d = dst;
            // SAFETY: columns j0..j0+wj of B and of the m x n destination (row stride n)
            // lie inside their buffers; the tasks write disjoint column blocks.
            unsafe {
                gemm_rows(
                    (m, wj, k),
                    d.0.add(j0),
                    n,
                    false,
                    (ad.as_ptr().add(a0), a_rs, a_cs),
                    (bd.as_ptr().add(b0).offset(j0 as isize * b_cs), b_rs, b_cs),
                    Parallelism::None,
                )
            }
        });
        // SAFETY: the column blocks cover the whole m x n result.
        unsafe { out.set_len(total) };
        return result(out, out_shape);
    }
    let chunk = (m * n).max(1);
    if batches > 1 && macs < PAR_MIN_MACS {
        // Small matrices: whole ones per task, enough of them per task to pay for it.
        let grain = (PAR_MIN_MACS / macs.max(1)).clamp(1, batches);
        spare
            .par_chunks_mut(chunk)
            .zip(aoff.par_iter().zip(boff.par_iter()))
            .with_min_len(grain)
            .for_each_init(Vec::new, |tmp, (dst, (&ao, &bo))| {
                one(dst, ao, bo, Parallelism::None, tmp)
            });
    } else {
        let par = if macs >= PAR_MIN_MACS {
            Parallelism::Rayon(rayon::current_num_threads())
        } else {
            Parallelism::None
        };
        let mut tmp = Vec::new();
        for (i, dst) in spare.chunks_mut(chunk).enumerate().take(batches) {
            one(dst, aoff[i], boff[i], par, &mut tmp);
        }
    }
    // SAFETY: each batch's m x n block was written above (by gemm, or zeros when k == 0).
    unsafe { out.set_len(total) };
    result(out, out_shape)
}

/// The product's value from its buffer, every element written.
fn result<T: GemmElem>(out: Vec<T>, shape: &[usize]) -> Value {
    T::wrap(
        Arr::from_shape_vec(ndarray::IxDyn(shape), out)
            .expect("shape matches")
            .into_shared(),
    )
}

fn int_matmul(
    a: &[i64],
    b: &[i64],
    geo: GemmShape,
    out_shape: &[usize],
    aoff: &[usize],
    boff: &[usize],
) -> Value {
    let (m, n, k) = (geo.m, geo.n, geo.k);
    let (a_rs, a_cs) = strides(geo.a_cols, geo.ta);
    let (b_rs, b_cs) = strides(geo.b_cols, geo.tb);
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

/// Whether a single product of `macs` multiply-adds runs as two halves on the polling
/// helper's team (`team_halves`): in a loop body or a short run, where waking the pool
/// costs more than the work it would share.
fn team_split(m: usize, n: usize, macs: usize) -> bool {
    (TEAM_MIN_MACS..PAR_MIN_MACS).contains(&macs)
        && (n >= 32 || m >= 16)
        && crate::base::team::available()
}

/// The `m x n x k` product of A and B (each a buffer, an offset and row / column strides)
/// into the row-major `m x n` destination as two halves on the team's threads
/// (`team::split2`), added to what it holds when `accumulate`. By rows where there are
/// enough: the elementwise kernels after a product split their elements in two halves as
/// well, so each thread then mostly reads the rows it wrote (Keras LSTM step 0-9% faster
/// than by columns in 4 of 6 pairs).
///
/// # Safety
/// A and B hold `m x k` and `k x n` blocks at their offsets with their strides; `dst` holds
/// `m x n` elements, read only when `accumulate`.
#[allow(clippy::type_complexity)]
unsafe fn team_halves<T: GemmElem>(
    (m, n, k): (usize, usize, usize),
    dst: SharedDst<T>,
    accumulate: bool,
    (ad, ao, a_rs, a_cs): (&[T], usize, isize, isize),
    (bd, bo, b_rs, b_cs): (&[T], usize, isize, isize),
) {
    let (by_cols, len) = if m < 32 && n >= 32 {
        (true, n)
    } else {
        (false, m)
    };
    let h = if by_cols {
        (len / 2).div_ceil(16) * 16
    } else {
        (len / 2).div_ceil(8) * 8
    };
    crate::base::team::split2(&|part| {
        let (s, e) = if part == 0 { (0, h) } else { (h, len) };
        let (i0, rows, j0, cols) = if by_cols {
            (0, m, s, e - s)
        } else {
            (s, e - s, 0, n)
        };
        let d = dst;
        // SAFETY: rows i0..i0+rows of A, columns j0..j0+cols of B and that block of the
        // m x n destination lie inside their buffers (the caller's contract); the two
        // parts touch disjoint blocks of the destination.
        unsafe {
            gemm_rows(
                (rows, cols, k),
                d.0.add(i0 * n + j0),
                n,
                accumulate,
                (ad.as_ptr().add(ao).offset(i0 as isize * a_rs), a_rs, a_cs),
                (bd.as_ptr().add(bo).offset(j0 as isize * b_cs), b_rs, b_cs),
                Parallelism::None,
            )
        }
    });
}

/// `dst[m x n]` (row stride `drs`) `= [dst +] A·B`, A and B addressed by pointer and
/// element strides as `gemm::gemm` takes them: through `gemm`, or without packing
/// (`small_gemm`) for a small f32 product on one thread whose B has contiguous rows.
///
/// # Safety
/// As `gemm::gemm`'s: every element of the `m x k`, `k x n` and `m x n` blocks lies inside
/// its buffer; `dst` is read only when `acc`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_rows<T: GemmElem>(
    (m, n, k): (usize, usize, usize),
    dst: *mut T,
    drs: usize,
    acc: bool,
    (a, a_rs, a_cs): (*const T, isize, isize),
    (b, b_rs, b_cs): (*const T, isize, isize),
    par: Parallelism,
) {
    let f32_elems = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    if f32_elems
        && matches!(par, Parallelism::None)
        && m * n * k < PAR_MIN_MACS
        && small_gemm::applies(n, k, b_cs)
    {
        // SAFETY: T is f32; the blocks are the caller's.
        unsafe {
            small_gemm::product(
                (m, n, k),
                dst as *mut f32,
                drs,
                acc,
                (a as *const f32, a_rs, a_cs),
                (b as *const f32, b_rs),
            )
        };
        return;
    }
    let alpha = if acc { T::one() } else { T::zero() };
    // SAFETY: the caller's contract is gemm's.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            drs as isize,
            acc,
            a,
            a_cs,
            a_rs,
            b,
            b_cs,
            b_rs,
            alpha,
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

/// Whether a product `A·Bᵀ` that runs through `gemm` as it is (not in column panels)
/// copies B transposed first. A single product of at least `DIRECT_BT_MIN_M` rows and
/// `DIRECT_BT_MIN_N` columns does not, on an Intel Xeon (AVX-512): `gemm` packs the
/// transposed blocks faster than the copy and its own packing of the copy take together.
/// On one thread: the MLP's `g·Wᵀ` (128x512x512) 577 -> 493 us, 128x784x512 957 -> 660
/// us, 64x128x9216 1,933 -> 1,291 us, 100x300x700 360 -> 291 us, 256x256x256 and
/// 1024x1024x1024 4% and 12% faster; with fewer columns the copy still pays (64x512x64
/// 35 -> 44 us without it). Where `copy_transposed` holds, a long contraction copies
/// anyway (`copies_transposed`). A batch keeps the copy, one per distinct B.
fn copies_bt(batches: usize, m: usize, n: usize, k: usize) -> bool {
    batches > 1 || m < DIRECT_BT_MIN_M || n < DIRECT_BT_MIN_N || copies_transposed(k, m, k)
}

/// Contraction length from which a transposed operand may be copied (`copies_transposed`).
const COPY_T_MIN_K: usize = 512;
/// The least rows (for B) or columns (for A) of the result that reuse such a copy.
const COPY_T_MIN_REUSE: usize = 128;

/// Whether a single product's transposed operand is copied transposed before `gemm`
/// packs it: a contraction of `k`, `reuse` rows (for B) or columns (for A) of the result
/// reading the copy, and `stride` elements between the operand's consecutive values
/// along the contraction as stored (B's `k`, A's `m`). Where `gemm`'s packing gathers a
/// transposed operand slowly (`copy_transposed`), a long contraction with a long stride
/// pays for the copy: on an AMD EPYC (Zen 4), one thread, GFLOP/s direct -> copied,
/// `A·Bᵀ` 128x512x512 165 -> 215, 512x1024x1024 190 -> 229, 1024x1024x1024 228 -> 248;
/// `Aᵀ·B` 784x512x1024 225 -> 250-267, 1024x512x1024 255 -> 256-266. Shorter
/// contractions lose there (`A·Bᵀ` 64x128x9216 201 -> 108-116, 100x300x700 223 -> 205;
/// `Aᵀ·B` 9216x64x128 248 -> 227-237), and so do short strides: a 1x1 convolution's
/// kernel gradient `xᵀ·gy` (stride: the input channels) 8x32x32x256 -> 256 6.1 -> 7.5 ms,
/// 32x32x32x24 -> 144 3.2 -> 3.8 ms copied.
pub(crate) fn copies_transposed(k: usize, reuse: usize, stride: usize) -> bool {
    k >= COPY_T_MIN_K && stride >= COPY_T_MIN_K && reuse >= COPY_T_MIN_REUSE && copy_transposed()
}

/// Whether `gemm` packs a transposed operand of a long contraction more slowly than a
/// transposed copy and the packing of that take together: on AMD CPUs, measured on Zen 4
/// (Intel's Xeon packs it faster: `copies_bt`). `FERROKERAS_COPY_TRANSPOSED` decides
/// instead where it is set.
fn copy_transposed() -> bool {
    static AMD: OnceLock<bool> = OnceLock::new();
    crate::base::config::settings()
        .copy_transposed
        .unwrap_or_else(|| *AMD.get_or_init(cpu_is_amd))
}

/// Whether the CPU's vendor is AMD (`cpuid` leaf 0).
fn cpu_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: cpuid leaf 0 exists on every x86_64 CPU.
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let vendor: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether a single product (large enough for the pool) runs as one block of columns per
/// thread, each a single-threaded `gemm` (`COLUMN_SPLIT_MAX_M`).
fn splits_columns(m: usize, n: usize, threads: usize) -> bool {
    m <= COLUMN_SPLIT_MAX_M && n >= COLUMN_SPLIT_MIN_COLS * threads
}

/// Whether `C = Aᵀ·B` runs column-major and is transposed into place (`SKINNY_N`).
fn skinny(ta: bool, m: usize, n: usize) -> bool {
    ta && n <= SKINNY_N && n > 1 && m > SKINNY_N
}

/// Whether a single product with these dims (large enough for the pool) is split along k
/// (`SPLIT_K_MAX_OUT`).
fn splits_k(m: usize, n: usize, k: usize) -> bool {
    m * n <= SPLIT_K_MAX_OUT && k >= SPLIT_K_MIN_K
}

/// The `(m, n, k)` of `acc += a · b` when `accumulate` can run it: `a`, `b` 2-D f32 in
/// standard layout read as `ta` says (B not transposed), `acc` an f32 `m x n` array in
/// standard layout, and a product `run_gemm` runs plainly (not skinny or k-split). `None`
/// elsewhere: the caller multiplies and adds.
pub fn accumulable(
    ta: bool,
    tb: bool,
    a: &Value,
    b: &Value,
    acc: &Value,
) -> Option<(usize, usize, usize)> {
    let (Value::F32(x), Value::F32(y), Value::F32(c)) = (a, b, acc) else {
        return None;
    };
    let (sa, sb) = (x.shape(), y.shape());
    if tb
        || sa.len() != 2
        || sb.len() != 2
        || ![
            x.is_standard_layout(),
            y.is_standard_layout(),
            c.is_standard_layout(),
        ]
        .iter()
        .all(|&s| s)
    {
        return None;
    }
    let (m, k) = if ta { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
    let n = sb[1];
    let large = m * n * k >= PAR_MIN_MACS && rayon::current_num_threads() > 1;
    let plain = k == sb[0]
        && c.shape() == [m, n]
        && m > 0
        && n > 0
        && k > 0
        && !skinny(ta, m, n)
        && !(large && splits_k(m, n, k));
    plain.then_some((m, n, k))
}

/// `acc += a · b` for operands `accumulable` returned `dims` for, with `gemm` reading `acc`
/// as its destination instead of writing a new product that an elementwise add then reads
/// back (a loop VJP's gradient accumulators, `compile::fuse::Item::MatAcc`).
pub fn accumulate(
    ta: bool,
    a: &Value,
    b: &Value,
    acc: &mut ndarray::ArrayD<f32>,
    (m, n, k): (usize, usize, usize),
) {
    let (Value::F32(x), Value::F32(y)) = (a, b) else {
        unreachable!("accumulable checked f32")
    };
    assert_eq!(
        acc.shape(),
        [m, n],
        "accumulate: the destination has the checked shape"
    );
    let (a_rs, a_cs) = strides(x.shape()[1], ta);
    let (b_rs, b_cs) = strides(n, false);
    let (ad, bd) = (
        x.as_slice().expect("standard"),
        y.as_slice().expect("standard"),
    );
    let dst = SharedDst(acc.as_mut_ptr());
    let macs = m * n * k;
    if team_split(m, n, macs) {
        // SAFETY: A and B hold m x k and k x n blocks with these strides (`accumulable`),
        // and the destination m x n elements.
        unsafe {
            team_halves(
                (m, n, k),
                dst,
                true,
                (ad, 0, a_rs, a_cs),
                (bd, 0, b_rs, b_cs),
            )
        };
        return;
    }
    let threads = rayon::current_num_threads();
    let par = if macs >= PAR_MIN_MACS && threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // SAFETY: A is m x k, B k x n and the destination m x n, each addressed with the strides
    // of its row-major buffer; gemm reads the destination and adds the product (read_dst).
    unsafe {
        gemm_rows(
            (m, n, k),
            dst.0,
            n,
            true,
            (ad.as_ptr(), a_rs, a_cs),
            (bd.as_ptr(), b_rs, b_cs),
            par,
        )
    }
}

/// The runtime geometry of a batched product of operands of shapes `sa` and `sb` (rank 2
/// or more, transposed as `ta`/`tb` say): `(m, k, n, broadcast batch shape)`, or the error
/// both devices raise for contracted dims that differ or batch dims that do not broadcast.
pub fn runtime_dims(
    ta: bool,
    tb: bool,
    sa: &[usize],
    sb: &[usize],
) -> Result<(usize, usize, usize, Vec<usize>)> {
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
    Ok((m, ka, n, bshape))
}

pub fn cpu(ta: bool, tb: bool, a: &Value, b: &Value) -> Result<Value> {
    let (sa, sb) = (a.shape(), b.shape());
    let (ra, rb) = (sa.len(), sb.len());
    let (m, ka, n, bshape) = runtime_dims(ta, tb, sa, sb)?;
    let mut out_shape = bshape.clone();
    out_shape.extend([m, n]);
    let aoff = batch_offsets(&bshape, &sa[..ra - 2], sa[ra - 2] * sa[ra - 1]);
    let boff = batch_offsets(&bshape, &sb[..rb - 2], sb[rb - 2] * sb[rb - 1]);
    let geo = GemmShape {
        m,
        n,
        k: ka,
        a_cols: sa[ra - 1],
        b_cols: sb[rb - 1],
        ta,
        tb,
    };
    Ok(match (a, b) {
        (Value::F32(x), Value::F32(y)) => run_gemm(x, y, geo, &out_shape, &aoff, &boff),
        (Value::F64(x), Value::F64(y)) => run_gemm(x, y, geo, &out_shape, &aoff, &boff),
        (Value::F16(x), Value::F16(y)) => run_gemm(x, y, geo, &out_shape, &aoff, &boff),
        _ if a.dtype() == b.dtype() => {
            let (Value::I64(x), Value::I64(y)) = (a.cast(DType::I64), b.cast(DType::I64)) else {
                unreachable!()
            };
            int_matmul(
                x.as_slice().expect("standard"),
                y.as_slice().expect("standard"),
                geo,
                &out_shape,
                &aoff,
                &boff,
            )
            .cast(a.dtype())
        }
        _ => {
            return Err(Error::Type(format!(
                "matmul: operands have dtypes {} and {}",
                a.dtype(),
                b.dtype()
            )))
        }
    })
}
