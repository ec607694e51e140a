//! Small f32 products without packing: `C (+)= A·B` for a row-major B whose width is a
//! multiple of 16, read where it lies.
//!
//! The products of a recurrent step (a Keras LSTM(64)'s `h·U`, 64x64 by 64x256, its
//! weight-gradient accumulations, each half of them when the loop's team splits them) take
//! 5-15 us, and `gemm` packs both operands into its panel layout on every call, the same
//! weights fifty times a sequence: ~5% of a Keras LSTM training step on one thread went to
//! that packing. Here each block of `R` rows by `W` vectors of the result is summed in
//! registers over `k` (R x W accumulators, W loads of B's row and R broadcasts of A per
//! step of k), B's rows and A's elements read from the operands as they lie; a panel of
//! B (`k` rows of 64 columns) stays in L1 or L2 while every row block passes over it.

/// f32 lanes of one vector (AVX-512).
const LANES: usize = 16;
/// Result rows summed together.
const ROWS: usize = 6;
/// Vectors per row of a block (`ROWS * VECS` accumulators, `VECS` loads of B per step).
const VECS: usize = 4;
/// Largest `k` (B's panel of `k x 64` f32 is 256 KiB at this bound).
const MAX_K: usize = 1024;

/// Whether `product` applies: an AVX-512 CPU, B's rows contiguous, `n` a multiple of 16,
/// `k` within `MAX_K`.
pub fn applies(n: usize, k: usize, b_cs: isize) -> bool {
    #[cfg(target_arch = "x86_64")]
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    avx512 && b_cs == 1 && n > 0 && n.is_multiple_of(LANES) && k > 0 && k <= MAX_K
}

/// `dst[m x n]` (row stride `drs`) `= [dst +] A·B` with `A(i, l) = a[i·a_rs + l·a_cs]` and
/// `B(l, j) = b[l·b_rs + j]`, where `applies(n, k, 1)`.
///
/// # Safety
/// `a`, `b` and `dst` address every element of their `m x k`, `k x n` and `m x n` blocks
/// with these strides; `dst` is read only when `acc`, and overlaps neither operand.
pub unsafe fn product(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    drs: usize,
    acc: bool,
    (a, a_rs, a_cs): (*const f32, isize, isize),
    (b, b_rs): (*const f32, isize),
) {
    debug_assert!(applies(n, k, 1));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `applies` checked the CPU; the caller vouches for the blocks.
    unsafe {
        let vecs = n / LANES;
        let mut j = 0;
        while j < vecs {
            let w = (vecs - j).min(VECS);
            let (bj, dj) = (b.add(j * LANES), dst.add(j * LANES));
            let mut i = 0;
            while i < m {
                let r = (m - i).min(ROWS);
                let ai = a.offset(i as isize * a_rs);
                let di = dj.add(i * drs);
                let blk = Block {
                    k,
                    a: ai,
                    a_rs,
                    a_cs,
                    b: bj,
                    b_rs,
                    dst: di,
                    drs,
                    acc,
                };
                match (r, w) {
                    (6, 4) => blk.run::<6, 4>(),
                    (6, 3) => blk.run::<6, 3>(),
                    (6, 2) => blk.run::<6, 2>(),
                    (6, 1) => blk.run::<6, 1>(),
                    (_, 4) => blk.rows::<4>(r),
                    (_, 3) => blk.rows::<3>(r),
                    (_, 2) => blk.rows::<2>(r),
                    _ => blk.rows::<1>(r),
                }
                i += r;
            }
            j += w;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (m, n, k, dst, drs, acc, a, a_rs, a_cs, b, b_rs);
}

/// One block's operands: `k`, A's first row with its strides, B's first column block with
/// its row stride, the destination's first element with its row stride.
#[cfg(target_arch = "x86_64")]
struct Block {
    k: usize,
    a: *const f32,
    a_rs: isize,
    a_cs: isize,
    b: *const f32,
    b_rs: isize,
    dst: *mut f32,
    drs: usize,
    acc: bool,
}

#[cfg(target_arch = "x86_64")]
impl Block {
    /// The last rows of a column block, fewer than `ROWS`.
    #[target_feature(enable = "avx512f")]
    unsafe fn rows<const W: usize>(&self, r: usize) {
        // SAFETY: the caller's blocks (`product`).
        unsafe {
            match r {
                5 => self.run::<5, W>(),
                4 => self.run::<4, W>(),
                3 => self.run::<3, W>(),
                2 => self.run::<2, W>(),
                _ => self.run::<1, W>(),
            }
        }
    }

    /// `R` rows by `W` vectors, summed in registers over `k`.
    #[target_feature(enable = "avx512f")]
    unsafe fn run<const R: usize, const W: usize>(&self) {
        use std::arch::x86_64::*;
        // SAFETY: every address lies in the caller's blocks (`product`): rows 0..R of A and
        // of the destination, columns 0..W*16 of B's and the destination's rows.
        unsafe {
            let mut c = [[_mm512_setzero_ps(); W]; R];
            for l in 0..self.k {
                let bp = self.b.offset(l as isize * self.b_rs);
                let bv: [__m512; W] = std::array::from_fn(|w| _mm512_loadu_ps(bp.add(w * LANES)));
                let ap = self.a.offset(l as isize * self.a_cs);
                for (r, cr) in c.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.offset(r as isize * self.a_rs));
                    for (cw, bw) in cr.iter_mut().zip(&bv) {
                        *cw = _mm512_fmadd_ps(av, *bw, *cw);
                    }
                }
            }
            for (r, cr) in c.iter().enumerate() {
                let dp = self.dst.add(r * self.drs);
                for (w, cw) in cr.iter().enumerate() {
                    let p = dp.add(w * LANES);
                    let v = if self.acc {
                        _mm512_add_ps(_mm512_loadu_ps(p), *cw)
                    } else {
                        *cw
                    };
                    _mm512_storeu_ps(p, v);
                }
            }
        }
    }
}
