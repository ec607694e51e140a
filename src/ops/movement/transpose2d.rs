//! The matrix transpose kernel: `dst = srcᵀ` for a `rows x cols` block of strided rows,
//! the copy that every permutation moving the last axis is made of (`cpu_transpose`, one
//! matrix per index of the other axes) and that the products make of a transposed operand
//! (`matmul`).
//!
//! The block is walked in 8 x 8 blocks, four at a time as a 16 x 16 square, down 16
//! columns of the source and then the next 16 (`tiles` says why this order). On x86-64
//! with AVX2 a block of 4-byte elements is eight 32-byte loads, the 24 shuffles of the
//! classic 8 x 8 transpose and eight 32-byte stores; elements of other sizes, and CPUs
//! without AVX2, move one at a time in the same order.

use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use std::mem::size_of;
use std::mem::MaybeUninit;

/// Side of the block moved through registers.
const B: usize = 8;
/// Elements from which a transpose is shared among the pool's threads, in runs of
/// columns of the source (rows of the result).
const PAR_MIN: usize = 1 << 19;

/// `dst[c * rows + r] = src[r * cols + c]` for the row-major `rows x cols` matrix `src`,
/// on the calling thread.
pub(crate) fn transpose_into<T: Copy>(
    src: &[T],
    rows: usize,
    cols: usize,
    dst: &mut [MaybeUninit<T>],
) {
    let (src, dst) = (&src[..rows * cols], &mut dst[..rows * cols]);
    // SAFETY: `src` holds the rows x cols matrix and `dst` its transpose.
    unsafe {
        transpose_strided(
            src.as_ptr(),
            cols,
            rows,
            cols,
            dst.as_mut_ptr() as *mut T,
            rows,
        )
    }
}

/// `dst[c * dr + r] = src[r * sr + c]` for `r < rows`, `c < cols`: one matrix of a
/// permutation's source (rows `sr` apart) transposed into the result (rows `dr` apart), on
/// the calling thread.
///
/// # Safety
/// Every element so addressed lies inside its buffer, and no two destinations coincide.
pub(crate) unsafe fn transpose_strided<T: Copy>(
    src: *const T,
    sr: usize,
    rows: usize,
    cols: usize,
    dst: *mut T,
    dr: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { columns((src, sr), rows, 0, cols, (dst, dr)) }
}

/// `transpose_into`, shared among the pool's threads when the matrix is large.
pub(crate) fn transpose_par<T: Copy + Send + Sync>(
    src: &[T],
    rows: usize,
    cols: usize,
    dst: &mut [MaybeUninit<T>],
) {
    let threads = rayon::current_num_threads();
    if threads < 2 || rows * cols < PAR_MIN {
        return transpose_into(src, rows, cols, dst);
    }
    let (src, dst) = (&src[..rows * cols], &mut dst[..rows * cols]);
    // Whole squares of columns per task, about two tasks per thread.
    let w = cols.div_ceil(2 * threads).div_ceil(2 * B) * (2 * B);
    dst.par_chunks_mut(w * rows)
        .enumerate()
        .for_each(|(i, part)| {
            let c0 = i * w;
            // SAFETY: `part` holds rows c0..c0 + w of the transpose (fewer at the end),
            // the columns c0.. of `src` it is written from.
            unsafe {
                columns(
                    (src.as_ptr(), cols),
                    rows,
                    c0,
                    (c0 + w).min(cols),
                    ((part.as_mut_ptr() as *mut T).sub(c0 * rows), rows),
                )
            }
        });
}

/// Columns `c0..c1` of the matrix of `rows` rows at `src` (rows `sr` apart) written as
/// rows `c0..c1` of its transpose at `dst` (rows `dr` apart), with the fastest kernel the
/// CPU runs.
///
/// # Safety
/// `src` addresses the matrix; `dst` the transpose's rows `c0..c1` (`dst` itself points
/// at where its row 0 would be); no two destinations coincide.
unsafe fn columns<T: Copy>(
    (src, sr): (*const T, usize),
    rows: usize,
    c0: usize,
    c1: usize,
    (dst, dr): (*mut T, usize),
) {
    #[cfg(target_arch = "x86_64")]
    if size_of::<T>() == 4 && crate::ops::vmath::isa() != crate::ops::vmath::Isa::Base {
        // SAFETY: T is 4 bytes and Copy, so its values move as u32 bit patterns; the CPU
        // has AVX2 (isa() checked); the caller's contract.
        unsafe { tiles_avx2((src as *const u32, sr), rows, c0, c1, (dst as *mut u32, dr)) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { tiles::<T, Scalar>((src, sr), rows, c0, c1, (dst, dr)) }
}

/// How an 8 x 8 block moves.
trait Block<T> {
    /// Moves the block at `s` (rows `sr` apart) transposed to `d` (rows `dr` apart).
    ///
    /// # Safety
    /// `s` addresses 8 rows of 8 readable elements `sr` apart, `d` 8 rows of 8 writable
    /// ones `dr` apart, and the CPU has the instructions the kernel uses.
    unsafe fn block(s: *const T, sr: usize, d: *mut T, dr: usize);
}

/// An element at a time.
struct Scalar;

impl<T: Copy> Block<T> for Scalar {
    #[inline(always)]
    unsafe fn block(s: *const T, sr: usize, d: *mut T, dr: usize) {
        for i in 0..B {
            for j in 0..B {
                unsafe { *d.add(j * dr + i) = *s.add(i * sr + j) };
            }
        }
    }
}

/// The whole walk compiled with AVX2, so that the block kernel inlines into it.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tiles_avx2(
    src: (*const u32, usize),
    rows: usize,
    c0: usize,
    c1: usize,
    dst: (*mut u32, usize),
) {
    // SAFETY: the caller's contract.
    unsafe { tiles::<u32, Avx2>(src, rows, c0, c1, dst) }
}

/// Walks columns `c0..c1` of the matrix in 8 x 8 blocks moved by `K`, and the edges that
/// do not fill a block one element at a time.
///
/// # Safety
/// As `columns`'s; `K` runs on this CPU; `c0` is a multiple of 8.
#[inline(always)]
unsafe fn tiles<T: Copy, K: Block<T>>(
    (s, sr): (*const T, usize),
    rows: usize,
    c0: usize,
    c1: usize,
    (d, dr): (*mut T, usize),
) {
    let (full_r, full_c) = (rows / B * B, c0 + (c1 - c0) / B * B);
    // One 16 x 16 square (four 8 x 8 blocks) after another down 16 columns of `src`, then
    // the next 16: a square reads 16 whole 64-byte lines of 4-byte elements and writes 16
    // whole lines, and the destination is written as 16 sequential streams, which the
    // prefetchers follow. Walking along the source's rows instead writes each square to 16
    // lines a whole destination row apart, each fetched before it is written, all of them
    // in one set of the L1 when the rows are a power of two long. A 1024 x 1024 f32
    // transpose on one AMD EPYC (Zen 5) core: 0.75 ms an element at a time in 8-row
    // strips, 1.0 ms in squares along the rows, 0.46 ms in squares down the columns.
    let block = |r: usize, c: usize| {
        if r < full_r && c < full_c {
            // SAFETY: rows r..r+8 and columns c..c+8 lie inside the matrix and the
            // caller's columns, and the destination's rows c..c+8, columns r..r+8 inside
            // its transpose; the caller picked a kernel the CPU runs.
            unsafe { K::block(s.add(r * sr + c), sr, d.add(c * dr + r), dr) };
        }
    };
    for c in (c0..full_c).step_by(2 * B) {
        for r in (0..full_r).step_by(2 * B) {
            block(r, c);
            block(r + B, c);
            block(r, c + B);
            block(r + B, c + B);
        }
    }
    // The right edge (columns past the last whole block), then the bottom one.
    for r in 0..full_r {
        for c in full_c..c1 {
            // SAFETY: inside the matrix and the caller's rows of the transpose.
            unsafe { *d.add(c * dr + r) = *s.add(r * sr + c) };
        }
    }
    for r in full_r..rows {
        for c in c0..c1 {
            // SAFETY: as above.
            unsafe { *d.add(c * dr + r) = *s.add(r * sr + c) };
        }
    }
}

/// 4-byte elements through AVX2 registers.
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Block<u32> for Avx2 {
    #[inline(always)]
    unsafe fn block(s: *const u32, sr: usize, d: *mut u32, dr: usize) {
        // SAFETY: the trait's contract (the CPU has AVX2).
        unsafe { block_avx2(s, sr, d, dr) }
    }
}

/// One 8 x 8 block of 4-byte elements through AVX2 registers.
///
/// # Safety
/// As `Block::block`'s, and the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2(s: *const u32, sr: usize, d: *mut u32, dr: usize) {
    use std::arch::x86_64::*;
    let r: [__m256; 8] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(s.add(i * sr) as *const f32) });
    // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves swapped.
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let out = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (j, v) in out.into_iter().enumerate() {
        unsafe { _mm256_storeu_ps(d.add(j * dr) as *mut f32, v) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Transposes the `rows x cols` matrix of `f(0), f(1), ...` with `run` and checks every
    /// element against its source, compared as `key` says.
    fn check<T: Copy, K: PartialEq + std::fmt::Debug>(
        rows: usize,
        cols: usize,
        f: impl Fn(usize) -> T,
        key: impl Fn(T) -> K,
        run: impl FnOnce(&[T], &mut [MaybeUninit<T>]),
    ) {
        let src: Vec<T> = (0..rows * cols).map(&f).collect();
        let mut dst: Vec<MaybeUninit<T>> = vec![MaybeUninit::uninit(); rows * cols];
        run(&src, &mut dst);
        for r in 0..rows {
            for c in 0..cols {
                // SAFETY: the transposes write every element.
                let got = unsafe { dst[c * rows + r].assume_init() };
                assert_eq!(
                    key(got),
                    key(src[r * cols + c]),
                    "{rows}x{cols} at ({r}, {c})"
                );
            }
        }
    }

    fn serial<T: Copy>(rows: usize, cols: usize) -> impl FnOnce(&[T], &mut [MaybeUninit<T>]) {
        move |s, d| transpose_into(s, rows, cols, d)
    }

    #[test]
    fn transposes_every_shape_around_the_blocks_and_tiles() {
        for &rows in &[0, 1, 3, 7, 8, 9, 16, 63, 64, 65, 130] {
            for &cols in &[0, 1, 5, 8, 15, 64, 67, 129] {
                let (r, c) = (rows, cols);
                check(r, c, |i| i as f32 * 0.5 - 3.0, f32::to_bits, serial(r, c));
                check(r, c, |i| i as i32 - 100, |v| v, serial(r, c));
                check(r, c, |i| i as f64, f64::to_bits, serial(r, c));
                check(r, c, |i| (i % 251) as u8, |v| v, serial(r, c));
            }
        }
    }

    #[test]
    fn shares_a_large_transpose_among_threads() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for &(rows, cols) in &[(1024, 1024), (515, 1001), (300, 900)] {
            check(
                rows,
                cols,
                |i| i as f32,
                f32::to_bits,
                |s, d| pool.install(|| transpose_par(s, rows, cols, d)),
            );
        }
    }

    #[test]
    fn moves_the_bits_of_nan_and_negative_zero() {
        let vals = [f32::NAN, -0.0, f32::from_bits(0x7fc0_1234), f32::INFINITY];
        check(16, 16, |i| vals[i % 4], f32::to_bits, serial(16, 16));
    }
}
