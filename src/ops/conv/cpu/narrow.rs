//! Products with a narrow right operand, 16 or 32 columns of f32 (a convolution with 16
//! or 32 output channels, or an input gradient with 16 or 32 input channels): each row of
//! the result is one or two vectors, summed in registers over `k` for a block of
//! `ROWS` rows from the left operand's rows where they lie, one broadcast element and one
//! multiply-add per vector at a time. `gemm` packs both operands first and fills its
//! 6-column micro-tiles 16 columns at a time, which at these widths costs more than the
//! arithmetic.

use super::*;

/// f32 lanes of one vector (AVX-512).
const LANES: usize = 16;

/// Result rows summed together (their accumulators stay in registers: `ROWS * W` vectors).
const ROWS: usize = 8;

/// Rows handed to one task when the product is split between threads.
const TASK_ROWS: usize = 256;

/// Largest right operand (elements) copied into a contiguous block when it is strided.
const MAX_RHS: usize = 1 << 16;

/// Whether `narrow` computes `dst[m x n] (+)= lhs[m x k] @ rhs[k x n]`: f32 on a CPU with
/// AVX-512, `n` one or two vectors wide, the left operand's rows contiguous, enough rows
/// to amortise the right operand's copy.
pub(super) fn applies<T: F>(m: usize, n: usize, k: usize, l: (usize, usize)) -> bool {
    #[cfg(target_arch = "x86_64")]
    let avx512 = is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    avx512
        && std::mem::size_of::<T>() == 4
        && (n == LANES || n == 2 * LANES)
        && l.1 == 1
        && m >= 2 * ROWS
        && k * n <= MAX_RHS
}

/// `dst[m x n] (row stride drs) = [dst +] lhs[m x k] @ rhs[k x n]` where `applies`.
#[allow(clippy::too_many_arguments)]
pub(super) fn narrow<T: F>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    drs: usize,
    acc: bool,
    lhs: &[T],
    lrs: usize,
    rhs: &[T],
    r: (usize, usize),
    par: Parallelism,
) {
    // The right operand as k contiguous rows of n.
    let b: std::borrow::Cow<[T]> = if r == (n, 1) {
        std::borrow::Cow::Borrowed(&rhs[..k * n])
    } else {
        std::borrow::Cow::Owned(
            (0..k)
                .flat_map(|kk| (0..n).map(move |j| rhs[kk * r.0 + j * r.1]))
                .collect(),
        )
    };
    let threads = match par {
        Parallelism::Rayon(t) => t.max(1),
        Parallelism::None => 1,
    };
    // T is f32 (`applies`): the kernel reads and writes the same bits as f32.
    let f = |v: &[T]| -> &[f32] {
        // SAFETY: T and f32 have the same size, alignment and bits (`applies`).
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const f32, v.len()) }
    };
    let run = |i0: usize, rows: usize, d: &mut [T]| {
        // SAFETY: as `f`.
        let d = unsafe { std::slice::from_raw_parts_mut(d.as_mut_ptr() as *mut f32, d.len()) };
        let a = f(&lhs[i0 * lrs..]);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `applies` checked that the CPU has AVX-512.
        unsafe {
            if n == LANES {
                rows_avx512::<1>(rows, k, d, drs, acc, a, lrs, f(&b))
            } else {
                rows_avx512::<2>(rows, k, d, drs, acc, a, lrs, f(&b))
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rows, d, a);
    };
    if threads == 1 || m < 2 * TASK_ROWS {
        return run(0, m, dst);
    }
    let tasks = m.div_ceil(TASK_ROWS);
    let shared = crate::ops::matmul::SharedDst(dst.as_mut_ptr());
    let len = dst.len();
    (0..tasks).into_par_iter().for_each(|t| {
        let (i0, rows) = (t * TASK_ROWS, TASK_ROWS.min(m - t * TASK_ROWS));
        let d = shared;
        // SAFETY: task t writes rows i0..i0+rows of the destination (row stride drs),
        // which no other task writes; the caller checked that every row lies in `dst`.
        let part = unsafe { std::slice::from_raw_parts_mut(d.0.add(i0 * drs), len - i0 * drs) };
        run(i0, rows, part)
    });
}

/// Rows `0..m` of the result: blocks of `ROWS` rows with their `ROWS * W` vector sums in
/// registers, then the rows left one at a time. Bounds are checked per row before the
/// unchecked loads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_avx512<const W: usize>(
    m: usize,
    k: usize,
    dst: &mut [f32],
    drs: usize,
    acc: bool,
    lhs: &[f32],
    lrs: usize,
    b: &[f32],
) {
    use std::arch::x86_64::*;
    let n = W * LANES;
    assert!(b.len() >= k * n);
    let bp = b.as_ptr();
    let mut i = 0;
    while i < m {
        let rows = if i + ROWS <= m { ROWS } else { 1 };
        let a: [*const f32; ROWS] = std::array::from_fn(|r| {
            let row = i + r.min(rows - 1);
            lhs[row * lrs..row * lrs + k].as_ptr()
        });
        let d: [*mut f32; ROWS] = std::array::from_fn(|r| {
            let row = i + r.min(rows - 1);
            dst[row * drs..row * drs + n].as_mut_ptr()
        });
        if rows == ROWS {
            let mut c = [[_mm512_setzero_ps(); W]; ROWS];
            for kk in 0..k {
                let bv: [__m512; W] =
                    std::array::from_fn(|w| _mm512_loadu_ps(bp.add(kk * n + w * LANES)));
                for r in 0..ROWS {
                    let av = _mm512_set1_ps(*a[r].add(kk));
                    for w in 0..W {
                        c[r][w] = _mm512_fmadd_ps(av, bv[w], c[r][w]);
                    }
                }
            }
            for r in 0..ROWS {
                for w in 0..W {
                    let p = d[r].add(w * LANES);
                    let v = if acc {
                        _mm512_add_ps(_mm512_loadu_ps(p), c[r][w])
                    } else {
                        c[r][w]
                    };
                    _mm512_storeu_ps(p, v);
                }
            }
        } else {
            let mut c = [_mm512_setzero_ps(); W];
            for kk in 0..k {
                let av = _mm512_set1_ps(*a[0].add(kk));
                for w in 0..W {
                    c[w] = _mm512_fmadd_ps(av, _mm512_loadu_ps(bp.add(kk * n + w * LANES)), c[w]);
                }
            }
            for w in 0..W {
                let p = d[0].add(w * LANES);
                let v = if acc {
                    _mm512_add_ps(_mm512_loadu_ps(p), c[w])
                } else {
                    c[w]
                };
                _mm512_storeu_ps(p, v);
            }
        }
        i += rows;
    }
}
