//! Products with a narrow right operand, 16 or 32 columns of f32 (a convolution with 16
//! or 32 output channels, or an input gradient with 16 or 32 input channels): each row of
//! the result is one or two vectors, summed in registers over `k` for a block of
//! `ROWS` rows from the left operand's rows where they lie, one broadcast element and one
//! multiply-add per vector at a time. `gemm` packs both operands first and fills its
//! 6-column micro-tiles 16 columns at a time, which at these widths costs more than the
//! arithmetic.

use super::im2col::Segments;
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

// ------------------------------------------------ direct convolutions (no column rows)

/// Accumulator vectors the direct kernel gradient keeps in registers: `taps * W`.
const KGRAD_REGS: usize = 24;

/// Whether the direct kernels below serve a groups=1 convolution with `cout` output
/// channels: f32 on a CPU with AVX-512, `cout` one or two vectors wide, or a single
/// channel (each window's dot product with the kernel).
pub(super) fn direct_applies<T: F>(cout: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    let avx512 = is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    avx512 && std::mem::size_of::<T>() == 4 && (cout == 1 || cout == LANES || cout == 2 * LANES)
}

/// Where the windows of consecutive output pixels start in the padded image, stepped
/// along pixel by pixel (`Segments::base` divides).
struct Bases<'a> {
    sg: &'a Segments,
    at: [usize; 3],
}

impl<'a> Bases<'a> {
    fn new(sg: &'a Segments) -> Bases<'a> {
        Bases { sg, at: [0; 3] }
    }
    #[inline(always)]
    fn next(&mut self) -> usize {
        let (o, st, pd, at) = (&self.sg.o, &self.sg.s, &self.sg.pd, &mut self.at);
        let b = ((at[0] * st[0] * pd[1] + at[1] * st[1]) * pd[2] + at[2] * st[2]) * self.sg.cin;
        at[2] += 1;
        if at[2] == o[2] {
            at[2] = 0;
            at[1] += 1;
            if at[1] == o[1] {
                at[1] = 0;
                at[0] += 1;
            }
        }
        b
    }
}

/// The vectors of one window for a single output channel (`cout == 1`): each segment's
/// taps in vectors of `LANES`, the last one masked; `(offset in the window, tap index,
/// lane mask)`.
fn dot_vectors(sg: &Segments) -> Vec<(usize, usize, u16)> {
    let seg = sg.seg;
    sg.offs
        .iter()
        .enumerate()
        .flat_map(|(si, &off)| {
            (0..seg).step_by(LANES).map(move |j| {
                let lanes = LANES.min(seg - j);
                (off + j, si * seg + j, ((1u32 << lanes) - 1) as u16)
            })
        })
        .collect()
}

/// The last element past every window of the image that `sg` walks: each output pixel's
/// window segments lie below it, so checking it against the image's length bounds every
/// unchecked load of the kernels below.
fn windows_end(sg: &Segments) -> usize {
    let last = sg.pixels().max(1) - 1;
    sg.base(last) + sg.offs.iter().max().copied().unwrap_or(0) + sg.seg
}

/// One image of a groups=1 convolution straight from its (padded) image `xp`:
/// `y[p] = sum_j xp[base(p) + tap j] * w[j]`, the taps being the window segments of
/// `sg` in the kernel's row order, `w` `width x cout` with `cout` one or two vectors
/// (`direct_applies`). The narrow product's register blocks of `ROWS` output pixels, each
/// pixel's taps read where they lie instead of from gathered column rows.
pub(super) fn forward_image<T: F>(sg: &Segments, xp: &[T], w: &[T], y: &mut [T], cout: usize) {
    assert!(windows_end(sg) <= xp.len());
    assert!(w.len() >= sg.width() * cout && y.len() >= sg.pixels() * cout);
    let f = |v: &[T]| -> &[f32] {
        // SAFETY: T is f32 (`direct_applies`): same size, alignment and bits.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const f32, v.len()) }
    };
    // SAFETY: as `f`.
    let y = unsafe { std::slice::from_raw_parts_mut(y.as_mut_ptr() as *mut f32, y.len()) };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `direct_applies` checked that the CPU has AVX-512; bounds asserted above.
    unsafe {
        if cout == 1 {
            fwd_dot_avx512(sg, f(xp), f(w), y)
        } else if cout == LANES {
            fwd_avx512::<1>(sg, f(xp), f(w), y)
        } else {
            fwd_avx512::<2>(sg, f(xp), f(w), y)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (f, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fwd_avx512<const W: usize>(sg: &Segments, xp: &[f32], w: &[f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let (n, seg, m) = (W * LANES, sg.seg, sg.pixels());
    let (xq, wp, yp) = (xp.as_ptr(), w.as_ptr(), y.as_mut_ptr());
    let mut bases = Bases::new(sg);
    let mut next = || bases.next();
    let mut i = 0;
    while i < m {
        let rows = if i + ROWS <= m { ROWS } else { 1 };
        let mut a = [xq; ROWS];
        for p in a.iter_mut().take(rows) {
            *p = xq.add(next());
        }
        if rows == ROWS {
            let mut c = [[_mm512_setzero_ps(); W]; ROWS];
            let mut bp = wp;
            for &off in &sg.offs {
                let s: [*const f32; ROWS] = std::array::from_fn(|r| a[r].add(off));
                for j in 0..seg {
                    let bv: [__m512; W] =
                        std::array::from_fn(|v| _mm512_loadu_ps(bp.add(v * LANES)));
                    for r in 0..ROWS {
                        let av = _mm512_set1_ps(*s[r].add(j));
                        for v in 0..W {
                            c[r][v] = _mm512_fmadd_ps(av, bv[v], c[r][v]);
                        }
                    }
                    bp = bp.add(n);
                }
            }
            for (r, cr) in c.iter().enumerate() {
                for (v, cv) in cr.iter().enumerate() {
                    _mm512_storeu_ps(yp.add((i + r) * n + v * LANES), *cv);
                }
            }
        } else {
            let mut c = [_mm512_setzero_ps(); W];
            let mut bp = wp;
            for &off in &sg.offs {
                let s = a[0].add(off);
                for j in 0..seg {
                    let av = _mm512_set1_ps(*s.add(j));
                    for (v, cv) in c.iter_mut().enumerate() {
                        *cv = _mm512_fmadd_ps(av, _mm512_loadu_ps(bp.add(v * LANES)), *cv);
                    }
                    bp = bp.add(n);
                }
            }
            for (v, cv) in c.iter().enumerate() {
                _mm512_storeu_ps(yp.add(i * n + v * LANES), *cv);
            }
        }
        i += rows;
    }
}

/// `dw[width x cout] += colsᵀ · gy` for one image of a groups=1 convolution straight from
/// its (padded) image `xp`, `cout` one or two vectors (`direct_applies`): for a chunk of
/// taps of one window segment at a time, their `taps * W` vector sums stay in registers
/// over every output pixel (one `gy` row and one broadcast tap per multiply-add), then
/// are added into `dw` once.
pub(super) fn kernel_grad_image<T: F>(
    sg: &Segments,
    xp: &[T],
    gy: &[T],
    dw: &mut [T],
    cout: usize,
) {
    assert!(windows_end(sg) <= xp.len());
    assert!(gy.len() >= sg.pixels() * cout && dw.len() >= sg.width() * cout);
    if cout == 1 {
        // SAFETY: `direct_applies` checked AVX-512; every window lies below `windows_end`
        // (asserted), each vector's lanes within its segment, each tap below `width`.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            kgrad_dot(sg, f32s(xp), f32s(gy), f32s_mut(dw))
        }
        return;
    }
    let w = cout / LANES;
    // Chunks of a segment: as few as the registers allow, of equal size `c`; the last
    // one starts early where `c` does not divide the segment, and adds only its taps
    // that the one before did not.
    let seg = sg.seg;
    let chunks = seg.div_ceil((KGRAD_REGS / w).max(1));
    let c = seg.div_ceil(chunks);
    let f = |v: &[T]| -> &[f32] {
        // SAFETY: T is f32 (`direct_applies`): same size, alignment and bits.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const f32, v.len()) }
    };
    // SAFETY: as `f`.
    let dw = unsafe { std::slice::from_raw_parts_mut(dw.as_mut_ptr() as *mut f32, dw.len()) };
    let (xp, gy) = (f(xp), f(gy));
    for (si, &off) in sg.offs.iter().enumerate() {
        for ch in 0..chunks {
            let j0 = (ch * c).min(seg - c);
            let skip = ch * c - j0;
            let row0 = si * seg + j0;
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `direct_applies` checked AVX-512; taps `off + j0 .. off + j0 + c` of
            // every window lie below `windows_end`, and rows `row0 .. row0 + c` of `dw`
            // below `width`.
            unsafe {
                kgrad_dispatch(w, c, sg, xp, off + j0, gy, &mut dw[row0 * cout..], skip)
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (off, row0, skip, xp, gy);
        }
    }
}

/// `kgrad_avx512::<W, C>` for the runtime `w` and `c` (`c * w <= KGRAD_REGS`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn kgrad_dispatch(
    w: usize,
    c: usize,
    sg: &Segments,
    xp: &[f32],
    off: usize,
    gy: &[f32],
    dw: &mut [f32],
    skip: usize,
) {
    macro_rules! arms {
        ($wv:literal; $($c:literal)*) => {
            match c {
                $($c => kgrad_avx512::<$wv, $c>(sg, xp, off, gy, dw, skip),)*
                _ => unreachable!("chunk of {c} taps"),
            }
        };
    }
    if w == 1 {
        arms!(1; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24)
    } else {
        arms!(2; 1 2 3 4 5 6 7 8 9 10 11 12)
    }
}

/// Taps `off .. off + C` of every window: `dw[t] += sum_p xp[base(p) + off + t] * gy[p]`
/// for `t` in `skip..C`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kgrad_avx512<const W: usize, const C: usize>(
    sg: &Segments,
    xp: &[f32],
    off: usize,
    gy: &[f32],
    dw: &mut [f32],
    skip: usize,
) {
    use std::arch::x86_64::*;
    let n = W * LANES;
    assert!(dw.len() >= C * n);
    let (o, s, pd, cin) = (sg.o, sg.s, sg.pd, sg.cin);
    let step = s[2] * cin;
    let (xq, mut g) = (xp.as_ptr().add(off), gy.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); W]; C];
    for a in 0..o[0] {
        for b in 0..o[1] {
            let mut x = xq.add((a * s[0] * pd[1] + b * s[1]) * pd[2] * cin);
            for _ in 0..o[2] {
                let gv: [__m512; W] = std::array::from_fn(|v| _mm512_loadu_ps(g.add(v * LANES)));
                for (t, at) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_ps(*x.add(t));
                    for v in 0..W {
                        at[v] = _mm512_fmadd_ps(xv, gv[v], at[v]);
                    }
                }
                x = x.add(step);
                g = g.add(n);
            }
        }
    }
    let dp = dw.as_mut_ptr();
    // Every tap's index a constant (the sums stay in registers), those below `skip`
    // passed over.
    for (t, at) in acc.iter().enumerate() {
        if t >= skip {
            for (v, av) in at.iter().enumerate() {
                let p = dp.add(t * n + v * LANES);
                _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), *av));
            }
        }
    }
}

/// `v` as f32 (`direct_applies`: T is f32, of the same size, alignment and bits).
fn f32s<T: F>(v: &[T]) -> &[f32] {
    assert_eq!(std::mem::size_of::<T>(), 4);
    // SAFETY: T is f32 (asserted size; `F` is implemented for f32 and f64 only).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const f32, v.len()) }
}

/// `v` as f32, mutable (as `f32s`).
fn f32s_mut<T: F>(v: &mut [T]) -> &mut [f32] {
    assert_eq!(std::mem::size_of::<T>(), 4);
    // SAFETY: as `f32s`.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut f32, v.len()) }
}

/// Output pixels summed together by `fwd_dot_avx512` (one kernel vector load serves them).
const DOT_ROWS: usize = 4;

/// `y[p] = xp[window(p)] · w` for a single output channel: the window's vectors
/// (`dot_vectors`) multiplied and added lane-wise for `DOT_ROWS` pixels at a time, then
/// each pixel's lanes summed.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fwd_dot_avx512(sg: &Segments, xp: &[f32], w: &[f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let vecs = dot_vectors(sg);
    let (m, xq, wp) = (sg.pixels(), xp.as_ptr(), w.as_ptr());
    let mut bases = Bases::new(sg);
    let mut i = 0;
    while i < m {
        let rows = if i + DOT_ROWS <= m { DOT_ROWS } else { 1 };
        let mut a = [xq; DOT_ROWS];
        for p in a.iter_mut().take(rows) {
            *p = xq.add(bases.next());
        }
        let mut c = [_mm512_setzero_ps(); DOT_ROWS];
        for &(off, tap, mask) in &vecs {
            let wv = _mm512_maskz_loadu_ps(mask, wp.add(tap));
            for r in 0..DOT_ROWS {
                let xv = _mm512_maskz_loadu_ps(mask, a[r].add(off));
                c[r] = _mm512_fmadd_ps(xv, wv, c[r]);
            }
        }
        for (r, cr) in c.iter().enumerate().take(rows) {
            y[i + r] = _mm512_reduce_add_ps(*cr);
        }
        i += rows;
    }
}

/// Vectors of window taps whose sums `kgrad_dot` keeps in registers at once.
const DOT_REGS: usize = 24;

/// `dw[tap] += sum_p xp[base(p) + tap] * gy[p]` for a single output channel: passes over
/// the pixels for up to `DOT_REGS` of the window's vectors (`dot_vectors`) at a time.
#[cfg(target_arch = "x86_64")]
unsafe fn kgrad_dot(sg: &Segments, xp: &[f32], gy: &[f32], dw: &mut [f32]) {
    let vecs = dot_vectors(sg);
    for part in vecs.chunks(DOT_REGS) {
        macro_rules! arms {
            ($($v:literal)*) => {
                match part.len() {
                    $($v => kgrad_dot_avx512::<$v>(sg, xp, gy, dw, part),)*
                    _ => unreachable!("{} vectors", part.len()),
                }
            };
        }
        arms!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kgrad_dot_avx512<const V: usize>(
    sg: &Segments,
    xp: &[f32],
    gy: &[f32],
    dw: &mut [f32],
    part: &[(usize, usize, u16)],
) {
    use std::arch::x86_64::*;
    let vs: [(usize, usize, u16); V] = part.try_into().expect("V vectors");
    let mut acc = [_mm512_setzero_ps(); V];
    let mut bases = Bases::new(sg);
    let xq = xp.as_ptr();
    for &g in &gy[..sg.pixels()] {
        let x = xq.add(bases.next());
        let gv = _mm512_set1_ps(g);
        for (v, av) in acc.iter_mut().enumerate() {
            let (off, _, mask) = vs[v];
            *av = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x.add(off)), gv, *av);
        }
    }
    let dp = dw.as_mut_ptr();
    for (v, av) in acc.iter().enumerate() {
        let (_, tap, mask) = vs[v];
        let p = dp.add(tap);
        _mm512_mask_storeu_ps(p, mask, _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), *av));
    }
}
