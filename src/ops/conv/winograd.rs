//! Winograd F(2x2, 3x3) for 2-D 3x3 convolutions with stride 1, no dilation and one group
//! (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016): each 2x2
//! output tile is `A^T [(G g G^T) . (B^T d B)] A` over a 4x4 input tile `d`, so the 9
//! multiplies per output and channel pair become 4, done as 16 `gemm`s of
//! `(tiles x cin) @ (cin x cout)` per block of tiles. The transforms only add, subtract
//! and halve (exact in binary), vectorised over channels, which are contiguous in NHWC.

use super::cpu::{pad_into, sized, Scratch, Walk, F};
use gemm::Parallelism;

/// Tiles per block: the transformed input and product blocks stay around 1 MiB of f32.
const BLOCK: usize = 96;
/// Elements between the 16 slabs of a block beyond the slab itself: a tile's 16 values
/// are written (input transform) and read (output transform) one per slab, and slabs a
/// multiple of 4 KiB apart (96 tiles x 32 or 64 channels of f32 are) all fall in the same
/// L1 sets, which 16 streams overflow; 64 bytes more per slab spreads them.
const SLAB_PAD: usize = 16;

/// Whether the walk is one this kernel computes (and is worth it for).
pub fn applies(wk: &Walk) -> bool {
    *wk.k == [1, 3, 3] && wk.x[0] == 1 && *wk.s == [1; 3] && *wk.d == [1; 3] && wk.p[0] == (0, 0) && wk.cin >= 16 && wk.cout >= 16
}

/// `U[xi][ci][co]` = `(G g G^T)[xi]` for Keras kernel `w` of shape `(1, 3, 3, cin, cout)`.
pub fn transform_kernel<T: F>(w: &[T], cin: usize, cout: usize) -> Vec<T> {
    let h = T::from(0.5).expect("0.5");
    let n = cin * cout;
    let mut u = vec![T::zero(); 16 * n];
    for q in 0..n {
        let g = |i: usize, j: usize| w[(i * 3 + j) * n + q];
        // Gg: 4x3, rows G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1].
        let mut gg = [[T::zero(); 3]; 4];
        for j in 0..3 {
            let (a, b, c) = (g(0, j), g(1, j), g(2, j));
            gg[0][j] = a;
            gg[1][j] = (a + b + c) * h;
            gg[2][j] = (a - b + c) * h;
            gg[3][j] = c;
        }
        for (i, r) in gg.iter().enumerate() {
            let (a, b, c) = (r[0], r[1], r[2]);
            let row = [a, (a + b + c) * h, (a - b + c) * h, c];
            for (j, v) in row.into_iter().enumerate() {
                u[(i * 4 + j) * n + q] = v;
            }
        }
    }
    u
}

/// `out = a + b` or `a - b`, elementwise (the compiler vectorises these loops).
#[inline(always)]
fn add2<T: F>(out: &mut [T], a: &[T], b: &[T], minus: bool) {
    if minus {
        out.iter_mut().zip(a).zip(b).for_each(|((o, &a), &b)| *o = a - b);
    } else {
        out.iter_mut().zip(a).zip(b).for_each(|((o, &a), &b)| *o = a + b);
    }
}

/// `out = a + b + c` or `a - b - c`.
#[inline(always)]
fn add3<T: F>(out: &mut [T], a: &[T], b: &[T], c: &[T], minus: bool) {
    if minus {
        out.iter_mut().zip(a).zip(b).zip(c).for_each(|(((o, &a), &b), &c)| *o = a - b - c);
    } else {
        out.iter_mut().zip(a).zip(b).zip(c).for_each(|(((o, &a), &b), &c)| *o = a + b + c);
    }
}

// `forward(wk, x, u, y, sc, par)`, one image: `y` gets the convolution of `x` with the
// transformed kernel `u`. The transforms were a quarter of the kernel's time at the CNN's
// shapes compiled for SSE2, so they run vectorised for the CPU's widest vector unit.
super::cpu::simd_kernel!(pub fn forward<T: F>(wk: &Walk, x: &[T], u: &[T], y: &mut [T], sc: &mut Scratch<T>, par: Parallelism) = forward_tiles);

#[inline(always)]
fn forward_tiles<T: F>(wk: &Walk, x: &[T], u: &[T], y: &mut [T], sc: &mut Scratch<T>, par: Parallelism) {
    let (cin, cout) = (wk.cin, wk.cout);
    let (oh, ow) = (wk.x[1] + wk.p[1].0 + wk.p[1].1 - 2, wk.x[2] + wk.p[2].0 + wk.p[2].1 - 2);
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    // Pad the bottom/right further so every 4x4 input tile is in the buffer.
    let p = [(0, 0), (wk.p[1].0, 2 * th + 2 - wk.x[1] - wk.p[1].0), (wk.p[2].0, 2 * tw + 2 - wk.x[2] - wk.p[2].0)];
    // A copy only where some padding is needed (not for a valid convolution of even size).
    let unpadded = p.iter().all(|&(a, b)| a == 0 && b == 0);
    let pd = if unpadded { *wk.x } else { pad_into(wk.x, &p, cin, x, &mut sc.a) };
    let xp: &[T] = if unpadded { x } else { &sc.a };
    let tiles = th * tw;
    let mut t = vec![T::zero(); 16 * cin];
    let (vs, ms) = (BLOCK * cin + SLAB_PAD, BLOCK * cout + SLAB_PAD);
    let v = sized(&mut sc.b, 16 * vs);
    let m = sized(&mut sc.c, 16 * ms + 8 * cout);
    for t0 in (0..tiles).step_by(BLOCK) {
        let nt = BLOCK.min(tiles - t0);
        for tt in 0..nt {
            let (ty, tx) = ((t0 + tt) / tw, (t0 + tt) % tw);
            let d = |i: usize, j: usize| {
                let o = ((2 * ty + i) * pd[2] + 2 * tx + j) * cin;
                &xp[o..o + cin]
            };
            // t = B^T d (rows), then V = t B (columns).
            for j in 0..4 {
                let (d0, d1, d2, d3) = (d(0, j), d(1, j), d(2, j), d(3, j));
                add2(&mut t[j * cin..(j + 1) * cin], d0, d2, true);
                add2(&mut t[(4 + j) * cin..(5 + j) * cin], d1, d2, false);
                add2(&mut t[(8 + j) * cin..(9 + j) * cin], d2, d1, true);
                add2(&mut t[(12 + j) * cin..(13 + j) * cin], d1, d3, true);
            }
            for i in 0..4 {
                let r = |j: usize| &t[(i * 4 + j) * cin..(i * 4 + j + 1) * cin];
                let out = |xi: usize| xi * vs + tt * cin;
                let (o0, o1, o2, o3) = (out(i * 4), out(i * 4 + 1), out(i * 4 + 2), out(i * 4 + 3));
                add2(&mut v[o0..o0 + cin], r(0), r(2), true);
                add2(&mut v[o1..o1 + cin], r(1), r(2), false);
                add2(&mut v[o2..o2 + cin], r(2), r(1), true);
                add2(&mut v[o3..o3 + cin], r(1), r(3), true);
            }
        }
        for xi in 0..16 {
            let (vo, mo, uo) = (xi * vs, xi * ms, xi * cin * cout);
            super::cpu::mm(nt, cout, cin, &mut m[mo..], cout, false, &v[vo..], (cin, 1), &u[uo..], (cout, 1), par);
        }
        let (mb, rb) = m.split_at_mut(16 * ms);
        for tt in 0..nt {
            let (ty, tx) = ((t0 + tt) / tw, (t0 + tt) % tw);
            let mm = |i: usize, j: usize| &mb[(i * 4 + j) * ms + tt * cout..][..cout];
            // r = A^T m: two rows of four; then y = r A: two columns.
            for j in 0..4 {
                add3(&mut rb[j * cout..(j + 1) * cout], mm(0, j), mm(1, j), mm(2, j), false);
                add3(&mut rb[(4 + j) * cout..(5 + j) * cout], mm(1, j), mm(2, j), mm(3, j), true);
            }
            for i in 0..2 {
                let oy = 2 * ty + i;
                if oy >= oh {
                    continue;
                }
                let r = |j: usize| &rb[(i * 4 + j) * cout..(i * 4 + j + 1) * cout];
                let o0 = (oy * ow + 2 * tx) * cout;
                add3(&mut y[o0..o0 + cout], r(0), r(1), r(2), false);
                if 2 * tx + 1 < ow {
                    add3(&mut y[o0 + cout..o0 + 2 * cout], r(1), r(2), r(3), true);
                }
            }
        }
    }
}

// ---------------------------------------------------------------- kernel gradient
//
// The forward tile is `Y = A^T [U . V] A` with `U = G g G^T`, so the kernel's gradient is
// `dg = G^T dU G` with `dU[xi] = sum over tiles of V[xi]^T dM[xi]` and `dM = A dY A^T`:
// the same input transform, a transform of the output gradient's 2x2 tiles, and 16
// `gemm`s of `(cin x tiles) @ (tiles x cout)` per block, summed in the transformed
// domain; `untransform_kernel_grad` brings the sum back once per call.

// `kernel_grad(wk, x, gy, du, sc, par)`, one image: adds the image's `dU[xi][ci][co]`
// (16 x cin x cout) to `du`.
super::cpu::simd_kernel!(pub fn kernel_grad<T: F>(wk: &Walk, x: &[T], gy: &[T], du: &mut [T], sc: &mut Scratch<T>, par: Parallelism) = kernel_grad_tiles);

#[inline(always)]
fn kernel_grad_tiles<T: F>(wk: &Walk, x: &[T], gy: &[T], du: &mut [T], sc: &mut Scratch<T>, par: Parallelism) {
    let (cin, cout) = (wk.cin, wk.cout);
    let (oh, ow) = (wk.x[1] + wk.p[1].0 + wk.p[1].1 - 2, wk.x[2] + wk.p[2].0 + wk.p[2].1 - 2);
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    let p = [(0, 0), (wk.p[1].0, 2 * th + 2 - wk.x[1] - wk.p[1].0), (wk.p[2].0, 2 * tw + 2 - wk.x[2] - wk.p[2].0)];
    let unpadded = p.iter().all(|&(a, b)| a == 0 && b == 0);
    let pd = if unpadded { *wk.x } else { pad_into(wk.x, &p, cin, x, &mut sc.a) };
    let xp: &[T] = if unpadded { x } else { &sc.a };
    let tiles = th * tw;
    let mut t = vec![T::zero(); 16 * cin];
    let mut r = vec![T::zero(); 8 * cout];
    let zero = vec![T::zero(); cout];
    let (vs, ms) = (BLOCK * cin + SLAB_PAD, BLOCK * cout + SLAB_PAD);
    let v = sized(&mut sc.b, 16 * vs);
    let m = sized(&mut sc.c, 16 * ms);
    for t0 in (0..tiles).step_by(BLOCK) {
        let nt = BLOCK.min(tiles - t0);
        for tt in 0..nt {
            let (ty, tx) = ((t0 + tt) / tw, (t0 + tt) % tw);
            let d = |i: usize, j: usize| {
                let o = ((2 * ty + i) * pd[2] + 2 * tx + j) * cin;
                &xp[o..o + cin]
            };
            // V = B^T d B, as in the forward.
            for j in 0..4 {
                let (d0, d1, d2, d3) = (d(0, j), d(1, j), d(2, j), d(3, j));
                add2(&mut t[j * cin..(j + 1) * cin], d0, d2, true);
                add2(&mut t[(4 + j) * cin..(5 + j) * cin], d1, d2, false);
                add2(&mut t[(8 + j) * cin..(9 + j) * cin], d2, d1, true);
                add2(&mut t[(12 + j) * cin..(13 + j) * cin], d1, d3, true);
            }
            for i in 0..4 {
                let rr = |j: usize| &t[(i * 4 + j) * cin..(i * 4 + j + 1) * cin];
                let out = |xi: usize| xi * vs + tt * cin;
                let (o0, o1, o2, o3) = (out(i * 4), out(i * 4 + 1), out(i * 4 + 2), out(i * 4 + 3));
                add2(&mut v[o0..o0 + cin], rr(0), rr(2), true);
                add2(&mut v[o1..o1 + cin], rr(1), rr(2), false);
                add2(&mut v[o2..o2 + cin], rr(2), rr(1), true);
                add2(&mut v[o3..o3 + cin], rr(1), rr(3), true);
            }
            // dM = A dY A^T over the 2x2 tile of the output gradient (zero past its edge):
            // rows R = (y0, y0 + y1, y0 - y1, -y1), then the same over the columns.
            let g = |i: usize, j: usize| {
                let (oy, ox) = (2 * ty + i, 2 * tx + j);
                if oy < oh && ox < ow {
                    let o = (oy * ow + ox) * cout;
                    &gy[o..o + cout]
                } else {
                    &zero[..]
                }
            };
            for j in 0..2 {
                let (y0, y1) = (g(0, j), g(1, j));
                r[j * cout..(j + 1) * cout].copy_from_slice(y0);
                add2(&mut r[(2 + j) * cout..(3 + j) * cout], y0, y1, false);
                add2(&mut r[(4 + j) * cout..(5 + j) * cout], y0, y1, true);
                neg(&mut r[(6 + j) * cout..(7 + j) * cout], y1);
            }
            for i in 0..4 {
                let (a, b) = (&r[2 * i * cout..(2 * i + 1) * cout], &r[(2 * i + 1) * cout..(2 * i + 2) * cout]);
                let out = |xi: usize| xi * ms + tt * cout;
                let (o0, o1, o2, o3) = (out(i * 4), out(i * 4 + 1), out(i * 4 + 2), out(i * 4 + 3));
                m[o0..o0 + cout].copy_from_slice(a);
                add2(&mut m[o1..o1 + cout], a, b, false);
                add2(&mut m[o2..o2 + cout], a, b, true);
                neg(&mut m[o3..o3 + cout], b);
            }
        }
        for xi in 0..16 {
            let (vo, mo, uo) = (xi * vs, xi * ms, xi * cin * cout);
            super::cpu::mm(cin, cout, nt, &mut du[uo..], cout, true, &v[vo..], (1, cin), &m[mo..], (cout, 1), par);
        }
    }
}

/// `out = -a`.
#[inline(always)]
fn neg<T: F>(out: &mut [T], a: &[T]) {
    out.iter_mut().zip(a).for_each(|(o, &a)| *o = -a);
}

/// The kernel gradient `dw` (Keras layout `(3, 3, cin, cout)`) from the summed
/// transformed gradient `du` (`16 x cin x cout`): `dw = G^T dU G`.
pub fn untransform_kernel_grad<T: F>(du: &[T], cin: usize, cout: usize, dw: &mut [T]) {
    let h = T::from(0.5).expect("0.5");
    let n = cin * cout;
    for q in 0..n {
        let u = |a: usize, b: usize| du[(a * 4 + b) * n + q];
        // T = dU G (4x3), G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1].
        let mut tg = [[T::zero(); 3]; 4];
        for (a, row) in tg.iter_mut().enumerate() {
            let (u0, u1, u2, u3) = (u(a, 0), u(a, 1), u(a, 2), u(a, 3));
            *row = [u0 + (u1 + u2) * h, (u1 - u2) * h, (u1 + u2) * h + u3];
        }
        // dw = G^T T.
        for j in 0..3 {
            let (t0, t1, t2, t3) = (tg[0][j], tg[1][j], tg[2][j], tg[3][j]);
            dw[j * n + q] = t0 + (t1 + t2) * h;
            dw[(3 + j) * n + q] = (t1 - t2) * h;
            dw[(6 + j) * n + q] = (t1 + t2) * h + t3;
        }
    }
}
