//! Winograd F(m, r) for 1-D convolutions (a text CNN's `Conv1D`): stride 1, no
//! dilation, one group, kernels of 3 to 7 taps (the transforms hold for 2 to 7). Each
//! tile of `m` outputs is `Aᵀ [(G g) . (Bᵀ d)]` over `N = m + r - 1 = 8` inputs `d`
//! (Toom-Cook at the points 0, ±1, ±2, ±1/2 and infinity; Lavin & Gray, "Fast Algorithms
//! for Convolutional Neural Networks", 2016), so the `m * r` multiplies per output and
//! channel pair become 8, done as 8 `gemm`s of `(tiles x cin) @ (cin x cout)` per block
//! of tiles: 2.5x fewer multiplies for a 5-tap kernel, 2.25x for 3 taps.
//!
//! The matrices come from the points (`Transforms::new`, in f64): the correlation
//! `y = T(g) d` is the transpose of the polynomial product that evaluates both factors
//! at the points, multiplies, and interpolates, so `Aᵀ` evaluates the output's
//! polynomial, `G` the kernel's (divided by the Lagrange denominators, so that the
//! kernel side, transformed once per call, carries the divisions), and `Bᵀ` holds the
//! coefficients of the Lagrange numerators (and of the points' product, for infinity).
//! Against the direct product in f64, a float32 tile's relative error is about 2e-6.

use super::cpu::{mm, Scratch, Walk, F};
use gemm::Parallelism;
use rayon::prelude::*;

/// Points of the transform: eight with infinity.
pub const N: usize = 8;
const POINTS: [f64; N - 1] = [0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5];
/// Tiles per block of products: about `BLOCK_ELEMS` products (`N` slabs of `cout`
/// outputs per tile) stay in cache for the output transform; at least `MIN_BLOCK` tiles.
const BLOCK_ELEMS: usize = 1 << 17;
const MIN_BLOCK: usize = 32;

/// Tiles per block for `cout` output channels.
fn block(cout: usize) -> usize {
    (BLOCK_ELEMS / (N * cout).max(1)).max(MIN_BLOCK)
}
/// Elements between the 8 slabs of a block beyond the slab itself (as in `winograd`: a
/// tile writes and reads one row per slab, and slabs a multiple of 4 KiB apart would
/// share L1 sets).
const SLAB_PAD: usize = 16;

/// Whether the walk is a 1-D convolution this kernel computes and is worth it for. The
/// products shrink by `r * m / N`, but they contract over `cin` only, and the transforms
/// cost about `N` operations per tile and output channel: one thread, against `gemm` on
/// column rows, `256 x 200 x 64 -> 128` with 5 taps took 25-27 against 38 ms,
/// `8 x 1000 x 128 -> 128` with 3 taps 5.0-5.8 against 6.5-6.7 and `32 x 200 x 64 ->
/// 128` with 7 taps 5.5 against 6.0-6.2, while 2 taps (2.3 against 2.1 ms), 16 input
/// channels or 32 output channels measured slower.
pub fn applies(wk: &Walk) -> bool {
    wk.x[0] == 1
        && wk.x[1] == 1
        && wk.k[0] == 1
        && wk.k[1] == 1
        && (3..N).contains(&wk.k[2])
        && *wk.s == [1; 3]
        && wk.d[2] == 1
        && wk.p[..2] == [(0, 0); 2]
        && wk.cin >= 32
        && wk.cout >= 64
}

/// `Aᵀ` (m x N), `Bᵀ` (N x N) and `G` (N x r) for kernels of `r` taps, `m = N + 1 - r`.
struct Transforms {
    m: usize,
    at: Vec<f64>,
    bt: Vec<f64>,
    g: Vec<f64>,
}

/// The coefficients (lowest first) of the product of `x - a` over `roots`.
fn poly_from_roots(roots: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut c = vec![1.0];
    for a in roots {
        let mut next = vec![0.0; c.len() + 1];
        for (i, &v) in c.iter().enumerate() {
            next[i] -= a * v;
            next[i + 1] += v;
        }
        c = next;
    }
    c
}

impl Transforms {
    fn new(r: usize) -> Transforms {
        let m = N + 1 - r;
        let (mut at, mut bt, mut g) = (vec![0.0; m * N], vec![0.0; N * N], vec![0.0; N * r]);
        for (j, &a) in POINTS.iter().enumerate() {
            let others = || POINTS.iter().enumerate().filter(|&(l, _)| l != j);
            let f: f64 = others().map(|(_, &b)| a - b).product();
            for k in 0..r {
                g[j * r + k] = a.powi(k as i32) / f;
            }
            for i in 0..m {
                at[i * N + j] = a.powi(i as i32);
            }
            for (i, c) in poly_from_roots(others().map(|(_, &b)| b))
                .into_iter()
                .enumerate()
            {
                bt[j * N + i] = c;
            }
        }
        // Infinity: the leading coefficients.
        g[(N - 1) * r + r - 1] = 1.0;
        at[(m - 1) * N + N - 1] = 1.0;
        for (i, c) in poly_from_roots(POINTS.iter().copied())
            .into_iter()
            .enumerate()
        {
            bt[(N - 1) * N + i] = c;
        }
        Transforms { m, at, bt, g }
    }
}

/// `Aᵀ` and `Bᵀ` for kernels of `r` taps, in `T`, with `m`: built once per call, for
/// every run of images.
pub struct Matrices<T> {
    m: usize,
    at: Vec<T>,
    bt: Vec<T>,
}

impl<T: F> Matrices<T> {
    pub fn new(r: usize) -> Matrices<T> {
        Matrices::from(&Transforms::new(r))
    }

    fn from(tr: &Transforms) -> Matrices<T> {
        Matrices {
            m: tr.m,
            at: tr.at.iter().map(|&a| cast(a)).collect(),
            bt: tr.bt.iter().map(|&a| cast(a)).collect(),
        }
    }
}

/// A kernel ready for `forward`: `U[xi][ci][co]` = `(G g)[xi]` for the Keras kernel `g`
/// of shape `(r, cin, cout)` (computed in f64), and the transforms.
pub struct Prepared<T> {
    u: Vec<T>,
    mats: Matrices<T>,
}

impl<T: F> Prepared<T> {
    pub fn new(w: &[T], r: usize, cin: usize, cout: usize) -> Prepared<T> {
        let tr = Transforms::new(r);
        let n = cin * cout;
        let mut u = vec![T::zero(); N * n];
        u.par_chunks_mut(n).enumerate().for_each(|(xi, ux)| {
            for (q, v) in ux.iter_mut().enumerate() {
                let s: f64 = (0..r)
                    .map(|k| tr.g[xi * r + k] * w[k * n + q].to_f64())
                    .sum();
                *v = cast(s);
            }
        });
        Prepared {
            u,
            mats: Matrices::from(&tr),
        }
    }
}

fn cast<T: F>(v: f64) -> T {
    T::from(v).expect("an f64 converts to a float")
}

/// Input rows `t * m .. t * m + N` of image `x` (`len` rows of `cin` channels) padded by
/// `front` rows: tile `t`'s inputs; rows in the padding or past the end are `zero`.
fn tile_rows<'a, T>(
    x: &'a [T],
    t: usize,
    m: usize,
    front: usize,
    len: usize,
    zero: &'a [T],
) -> [&'a [T]; N] {
    let cin = zero.len();
    std::array::from_fn(|j| {
        let p = t * m + j;
        if p >= front && p - front < len {
            &x[(p - front) * cin..(p - front + 1) * cin]
        } else {
            zero
        }
    })
}

/// The tiling of a run of images of one walk: outputs per image, tiles per image.
fn tiling(wk: &Walk, m: usize) -> (usize, usize) {
    let o = (wk.x[2] + wk.p[2].0 + wk.p[2].1) + 1 - wk.k[2];
    (o, o.div_ceil(m))
}

/// Images per run of `per_run`: about a block of tiles.
pub fn run_len(wk: &Walk) -> usize {
    let (_, tpi) = tiling(wk, N + 1 - wk.k[2]);
    (block(wk.cout) / tpi.max(1)).max(1)
}

// `forward(wk, x, cnt, k, y, sc, par)`: `y` gets the convolution of the `cnt` images `x`
// with the prepared kernel `k`.
super::cpu::simd_kernel!(pub fn forward<T: F>(wk: &Walk, x: &[T], cnt: usize, k: &Prepared<T>, y: &mut [T], sc: &mut Scratch<T>, par: Parallelism) = forward_tiles);

#[inline(always)]
fn forward_tiles<T: F>(
    wk: &Walk,
    x: &[T],
    cnt: usize,
    k: &Prepared<T>,
    y: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let (cin, cout, m) = (wk.cin, wk.cout, k.mats.m);
    let (u, at, bt) = (&k.u, &k.mats.at, &k.mats.bt);
    let (o, tpi) = tiling(wk, m);
    let (xl, front, len) = (wk.x[2] * cin, wk.p[2].0, wk.x[2]);
    let bl = block(cout);
    let (vs, ms) = (bl * cin + SLAB_PAD, bl * cout + SLAB_PAD);
    let Scratch { a, b, .. } = sc;
    let v = super::cpu::sized(a, N * vs);
    let mm_buf = super::cpu::sized(b, N * ms);
    let zero = vec![T::zero(); cin];
    let tiles = cnt * tpi;
    for t0 in (0..tiles).step_by(bl) {
        let nt = bl.min(tiles - t0);
        for tt in 0..nt {
            let (img, t) = ((t0 + tt) / tpi, (t0 + tt) % tpi);
            let rows = tile_rows(&x[img * xl..(img + 1) * xl], t, m, front, len, &zero);
            input_transform(bt, rows, cin, v, vs, tt * cin);
        }
        let product = |xi: usize, mx: &mut [T], par: Parallelism| {
            mm(
                nt,
                cout,
                cin,
                mx,
                cout,
                false,
                &v[xi * vs..],
                (cin, 1),
                &u[xi * cin * cout..],
                (cout, 1),
                par,
            );
        };
        super::winograd::slab_products(mm_buf, ms, par, product);
        for tt in 0..nt {
            let (img, t) = ((t0 + tt) / tpi, (t0 + tt) % tpi);
            let outs = m.min(o - t * m);
            let dst = &mut y[(img * o + t * m) * cout..(img * o + t * m + outs) * cout];
            output_transform(at, m, mm_buf, ms, tt * cout, cout, dst);
        }
    }
}

// ---------------------------------------------------------------- kernel gradient
//
// A tile's outputs are `y = Aᵀ [U . V]` with `U = G g`, so the kernel's gradient is
// `dg = Gᵀ dU` with `dU[xi] = sum over tiles of V[xi]ᵀ dM[xi]` and `dM = A dy`: the same
// input transform, a transform of the output gradient's tiles, and `N` `gemm`s of
// `(cin x tiles) @ (tiles x cout)` per block, summed in the transformed domain;
// `untransform_kernel_grad` brings the sum back once per call.

// `kernel_grad(wk, mats, x, gy, du, sc, par)`: adds the `dU[xi][ci][co]` (`N x cin x
// cout`) of the images `x` (a run of whole images, with their output gradients `gy`) to
// `du`.
super::cpu::simd_kernel!(pub fn kernel_grad<T: F>(wk: &Walk, mats: &Matrices<T>, x: &[T], gy: &[T], du: &mut [T], sc: &mut Scratch<T>, par: Parallelism) = kernel_grad_tiles);

#[inline(always)]
fn kernel_grad_tiles<T: F>(
    wk: &Walk,
    mats: &Matrices<T>,
    x: &[T],
    gy: &[T],
    du: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let (cin, cout) = (wk.cin, wk.cout);
    let (m, at, bt) = (mats.m, &mats.at, &mats.bt);
    let (o, tpi) = tiling(wk, m);
    let (xl, yl, front, len) = (wk.x[2] * cin, o * cout, wk.p[2].0, wk.x[2]);
    // The run's images (none to tile where the time axis is empty).
    let cnt = x.len().checked_div(xl).unwrap_or(0);
    let bl = block(cout);
    let (vs, ms) = (bl * cin + SLAB_PAD, bl * cout + SLAB_PAD);
    let Scratch { a, b, .. } = sc;
    let v = super::cpu::sized(a, N * vs);
    let dm = super::cpu::sized(b, N * ms);
    let (zero_in, zero_out) = (vec![T::zero(); cin], vec![T::zero(); cout]);
    let tiles = cnt * tpi;
    for t0 in (0..tiles).step_by(bl) {
        let nt = bl.min(tiles - t0);
        for tt in 0..nt {
            let (img, t) = ((t0 + tt) / tpi, (t0 + tt) % tpi);
            let rows = tile_rows(&x[img * xl..(img + 1) * xl], t, m, front, len, &zero_in);
            input_transform(bt, rows, cin, v, vs, tt * cin);
            // The tile's output gradients; those past the end are zeros.
            let gi = &gy[img * yl..(img + 1) * yl];
            let dy: [&[T]; N] = std::array::from_fn(|i| {
                if i < m && t * m + i < o {
                    &gi[(t * m + i) * cout..(t * m + i + 1) * cout]
                } else {
                    &zero_out[..]
                }
            });
            grad_transform(at, m, dy, cout, dm, ms, tt * cout);
        }
        for xi in 0..N {
            mm(
                cin,
                cout,
                nt,
                &mut du[xi * cin * cout..],
                cout,
                true,
                &v[xi * vs..],
                (1, cin),
                &dm[xi * ms..],
                (cout, 1),
                par,
            );
        }
    }
}

/// Writes `dM = A dy` of one tile (`dy`: its `m` output gradient rows of `cout`
/// channels, then unused ones) into row `at` of the `N` slabs of `dm`: slab `xi` is the
/// sum of `Aᵀ[i][xi] dy[i]` over the tile's outputs.
#[inline(always)]
fn grad_transform<T: F>(
    at_m: &[T],
    m: usize,
    dy: [&[T]; N],
    cout: usize,
    dm: &mut [T],
    ms: usize,
    at: usize,
) {
    assert!(at_m.len() == m * N && (N - 1) * ms + at + cout <= dm.len());
    for (xi, slab) in dm.chunks_mut(ms).enumerate().take(N) {
        let out = &mut slab[at..at + cout];
        let mut k = [T::zero(); N];
        for (i, ki) in k.iter_mut().enumerate().take(m) {
            *ki = at_m[i * N + xi];
        }
        combine(out, dy, k);
    }
}

/// `y = sum of k[i] p[i]`, element by element.
#[inline(always)]
fn combine<T: F>(y: &mut [T], p: [&[T]; N], k: [T; N]) {
    let n = y.len();
    let p = p.map(|s| &s[..n]);
    for i in 0..n {
        let mut s = T::zero();
        for j in 0..N {
            s += k[j] * p[j][i];
        }
        y[i] = s;
    }
}

/// The kernel gradient `dw` (Keras layout `(r, cin, cout)`) from the summed transformed
/// gradient `du` (`N x cin x cout`): `dw[k] = sum over xi of G[xi][k] dU[xi]`, in f64.
pub fn untransform_kernel_grad<T: F>(du: &[T], r: usize, cin: usize, cout: usize, dw: &mut [T]) {
    let tr = Transforms::new(r);
    let n = cin * cout;
    dw.par_chunks_mut(n).enumerate().for_each(|(k, dk)| {
        for (q, d) in dk.iter_mut().enumerate() {
            let s: f64 = (0..N)
                .map(|xi| tr.g[xi * r + k] * du[xi * n + q].to_f64())
                .sum();
            *d = cast(s);
        }
    });
}

/// Writes `V = Bᵀ d` of one tile (`rows`: its `N` input rows of `cin` channels) into row
/// `at` of the `N` slabs of `v` (slab `xi` at `xi * vs`), as loops over the channels.
///
/// `Bᵀ`'s structure at these points halves the work: row 0 (the point 0) reads the even
/// inputs, row 7 (infinity) the odd ones, and the rows of each pair of points `±a` (rows
/// `1, 2`, `3, 4`, `5, 6`) are `E ± O`, with `E` the sum of inputs 2, 4, 6 and `O` of
/// inputs 1, 3, 5 under row `2k - 1`'s coefficients (the tests check it). A loop per
/// output row over separate slices, not one loop over channels writing all eight rows:
/// the compiler vectorises only loops whose reads and writes it can tell apart (one
/// channel at a time measured 1.6x slower than `gemm` on column rows).
#[inline(always)]
fn input_transform<T: F>(bt: &[T], rows: [&[T]; N], cin: usize, v: &mut [T], vs: usize, at: usize) {
    assert!((N - 1) * vs + at + cin <= v.len());
    let b = |i: usize, j: usize| bt[i * N + j];
    let d: [&[T]; N] = rows.map(|r| &r[..cin]);
    let (v0, rest) = v[at..].split_at_mut(vs);
    sum4(
        &mut v0[..cin],
        d[0],
        d[2],
        d[4],
        d[6],
        [b(0, 0), b(0, 2), b(0, 4), b(0, 6)],
    );
    let (mid, v7) = rest.split_at_mut(6 * vs);
    sum4(
        &mut v7[..cin],
        d[1],
        d[3],
        d[5],
        d[7],
        [b(7, 1), b(7, 3), b(7, 5), b(7, 7)],
    );
    for (q, pair) in mid.chunks_mut(2 * vs).enumerate() {
        let k = 2 * q + 1;
        let (plus, minus) = pair.split_at_mut(vs);
        let kb = [b(k, 2), b(k, 4), b(k, 6), b(k, 1), b(k, 3), b(k, 5)];
        even_odd(
            &mut plus[..cin],
            &mut minus[..cin],
            [d[2], d[4], d[6], d[1], d[3], d[5]],
            kb,
        );
    }
}

/// `o = k0 a + k1 b + k2 c + k3 d`, element by element (slices of one length; separate
/// arguments, so that the compiler sees they do not overlap and vectorises the loop).
#[inline(always)]
fn sum4<T: F>(o: &mut [T], a: &[T], b: &[T], c: &[T], d: &[T], k: [T; 4]) {
    let n = o.len();
    let (a, b, c, d) = (&a[..n], &b[..n], &c[..n], &d[..n]);
    for i in 0..n {
        o[i] = k[0] * a[i] + k[1] * b[i] + k[2] * c[i] + k[3] * d[i];
    }
}

/// `plus, minus = e ± o` with `e = k0 x0 + k1 x1 + k2 x2` and `o = k3 x3 + k4 x4 + k5
/// x5`, element by element.
#[inline(always)]
fn even_odd<T: F>(plus: &mut [T], minus: &mut [T], x: [&[T]; 6], k: [T; 6]) {
    let n = plus.len();
    let minus = &mut minus[..n];
    let x = x.map(|s| &s[..n]);
    for i in 0..n {
        let e = k[0] * x[0][i] + k[1] * x[1][i] + k[2] * x[2][i];
        let o = k[3] * x[3][i] + k[4] * x[4][i] + k[5] * x[5][i];
        plus[i] = e + o;
        minus[i] = e - o;
    }
}

/// Writes the tile's outputs `Aᵀ M` (the first `dst.len() / cout` of its `m`) from row
/// `at` of the `N` product slabs of `mb` (`ms` apart). Output `i` is `[i = 0] M0 + sum
/// over the pairs of points ±a of a^i (M+a ± M-a) + [i = m - 1] M7`, the sums for even
/// `i` and the differences for odd (`Aᵀ` is the points' powers; the tests check it): half
/// the multiplies of the dense product.
#[inline(always)]
fn output_transform<T: F>(
    at_m: &[T],
    m: usize,
    mb: &[T],
    ms: usize,
    at: usize,
    cout: usize,
    dst: &mut [T],
) {
    let outs = dst.len() / cout;
    assert!(outs <= m && at_m.len() == m * N && (N - 1) * ms + at + cout <= mb.len());
    let p: [&[T]; N] = std::array::from_fn(|xi| &mb[xi * ms + at..xi * ms + at + cout]);
    for (i, y) in dst.chunks_exact_mut(cout).enumerate() {
        let k = [at_m[i * N + 1], at_m[i * N + 3], at_m[i * N + 5]];
        pairs(y, [p[1], p[2], p[3], p[4], p[5], p[6]], k, i % 2 == 1);
        if i == 0 {
            y.iter_mut().zip(p[0]).for_each(|(y, &v)| *y += v);
        }
        if i == m - 1 {
            y.iter_mut().zip(p[N - 1]).for_each(|(y, &v)| *y += v);
        }
    }
}

/// `y = k0 (x0 ± x1) + k1 (x2 ± x3) + k2 (x4 ± x5)`, element by element: the sums, or
/// with `odd` the differences.
#[inline(always)]
fn pairs<T: F>(y: &mut [T], x: [&[T]; 6], k: [T; 3], odd: bool) {
    let n = y.len();
    let x = x.map(|s| &s[..n]);
    if odd {
        for i in 0..n {
            y[i] = k[0] * (x[0][i] - x[1][i])
                + k[1] * (x[2][i] - x[3][i])
                + k[2] * (x[4][i] - x[5][i]);
        }
    } else {
        for i in 0..n {
            y[i] = k[0] * (x[0][i] + x[1][i])
                + k[1] * (x[2][i] + x[3][i])
                + k[2] * (x[4][i] + x[5][i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The structure `input_transform` and `output_transform` rely on, and the
    /// correlation the matrices compute, for every kernel size.
    #[test]
    fn the_transforms_compute_a_correlation_with_the_structure_the_kernels_use() {
        for r in 2..N {
            let tr = Transforms::new(r);
            let (m, at, bt, g) = (tr.m, &tr.at, &tr.bt, &tr.g);
            for j in 0..N {
                assert!(j % 2 == 0 || bt[j] == 0.0, "row 0 reads odd input {j}");
                assert!(j % 2 == 1 || bt[(N - 1) * N + j] == 0.0, "row 7, input {j}");
                for k in [1, 3, 5] {
                    let sign = if j % 2 == 1 { -1.0 } else { 1.0 };
                    assert_eq!(bt[(k + 1) * N + j], sign * bt[k * N + j], "rows {k}, {j}");
                    assert!(
                        j % (N - 1) != 0 || bt[k * N + j] == 0.0,
                        "row {k}, input {j}"
                    );
                }
            }
            for i in 0..m {
                for k in [1, 3, 5] {
                    let sign = if i % 2 == 1 { -1.0 } else { 1.0 };
                    assert_eq!(at[i * N + k + 1], sign * at[i * N + k], "Aᵀ row {i}, {k}");
                }
                assert_eq!(at[i * N], if i == 0 { 1.0 } else { 0.0 }, "Aᵀ row {i}");
                assert_eq!(
                    at[i * N + N - 1],
                    if i == m - 1 { 1.0 } else { 0.0 },
                    "Aᵀ row {i}"
                );
            }
            // y = Aᵀ [(G g) . (Bᵀ d)] against the direct correlation, in f64.
            let d: Vec<f64> = (0..N).map(|i| ((i * 7 + 3) % 11) as f64 - 5.0).collect();
            let w: Vec<f64> = (0..r).map(|k| ((k * 5 + 2) % 7) as f64 - 3.0).collect();
            let prod: Vec<f64> = (0..N)
                .map(|xi| {
                    let gg: f64 = (0..r).map(|k| g[xi * r + k] * w[k]).sum();
                    let bd: f64 = (0..N).map(|j| bt[xi * N + j] * d[j]).sum();
                    gg * bd
                })
                .collect();
            for i in 0..m {
                let y: f64 = (0..N).map(|xi| at[i * N + xi] * prod[xi]).sum();
                let direct: f64 = (0..r).map(|k| d[i + k] * w[k]).sum();
                assert!(
                    (y - direct).abs() < 1e-9,
                    "r {r}, output {i}: {y} vs {direct}"
                );
            }
        }
    }
}
