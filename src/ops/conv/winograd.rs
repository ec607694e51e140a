//! Winograd F(2x2, 3x3) for 2-D 3x3 convolutions with stride 1, no dilation and one group
//! (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016): each 2x2
//! output tile is `A^T [(G g G^T) . (B^T d B)] A` over a 4x4 input tile `d`, so the 9
//! multiplies per output and channel pair become 4, done as 16 `gemm`s of
//! `(tiles x cin) @ (cin x cout)` per block of tiles. The transforms only add, subtract
//! and halve (exact in binary), vectorised over channels, which are contiguous in NHWC.

use super::cpu::{pad_into, sized, Scratch, Walk, F};
use gemm::Parallelism;
use rayon::prelude::*;

/// Tiles per block: the transformed input and product blocks stay around 1 MiB of f32.
const BLOCK: usize = 96;
/// Elements between the 16 slabs of a block beyond the slab itself: a tile's 16 values
/// are written (input transform) and read (output transform) one per slab, and slabs a
/// multiple of 4 KiB apart (96 tiles x 32 or 64 channels of f32 are) all fall in the same
/// L1 sets, which 16 streams overflow; 64 bytes more per slab spreads them.
const SLAB_PAD: usize = 16;

/// Whether the walk is one this kernel computes (and is worth it for).
pub fn applies(wk: &Walk) -> bool {
    *wk.k == [1, 3, 3]
        && wk.x[0] == 1
        && *wk.s == [1; 3]
        && *wk.d == [1; 3]
        && wk.p[0] == (0, 0)
        && wk.cin >= 16
        && wk.cout >= 16
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

/// Writes `V = B^T d B` of one 4x4 input tile into row `at` of the 16 slabs of `v`
/// (slab `xi` at `xi * vs`), one channel at a time: the 16 inputs and 16 results of a
/// channel stay in registers, and the loop over channels is vectorised. `rows[i]` holds
/// the tile's row `i`: 4 pixels of `cin` channels.
#[inline(always)]
fn input_transform<T: F>(rows: [&[T]; 4], cin: usize, v: &mut [T], vs: usize, at: usize) {
    assert!(rows.iter().all(|r| r.len() >= 4 * cin) && 15 * vs + at + cin <= v.len());
    let out = v.as_mut_ptr();
    for c in 0..cin {
        // SAFETY: `j * cin + c < 4 * cin <= rows[i].len()` and `xi * vs + at + c < v.len()`
        // by the assertion above.
        unsafe {
            let d = |i: usize, j: usize| *rows[i].get_unchecked(j * cin + c);
            // t = B^T d: rows (d0 - d2, d1 + d2, d2 - d1, d1 - d3), per column.
            let mut t = [[T::zero(); 4]; 4];
            for j in 0..4 {
                let (d0, d1, d2, d3) = (d(0, j), d(1, j), d(2, j), d(3, j));
                t[0][j] = d0 - d2;
                t[1][j] = d1 + d2;
                t[2][j] = d2 - d1;
                t[3][j] = d1 - d3;
            }
            // V = t B: the same over the columns.
            for (i, r) in t.iter().enumerate() {
                let w = |xi: usize, x: T| *out.add(xi * vs + at + c) = x;
                w(i * 4, r[0] - r[2]);
                w(i * 4 + 1, r[1] + r[2]);
                w(i * 4 + 2, r[2] - r[1]);
                w(i * 4 + 3, r[1] - r[3]);
            }
        }
    }
}

/// The rows of the 4x4 input tile `(ty, tx)` of a padded image `xp` of width `pw`.
#[inline(always)]
fn tile_rows<T: F>(xp: &[T], pw: usize, cin: usize, ty: usize, tx: usize) -> [&[T]; 4] {
    std::array::from_fn(|i| {
        let o = ((2 * ty + i) * pw + 2 * tx) * cin;
        &xp[o..o + 4 * cin]
    })
}

/// `Y = A^T M A` of one tile from row `at` of the 16 product slabs of `m` (slab `xi` at
/// `xi * ms`) into its 2x2 output pixels `ys` (row-major; pixels past the output's edge
/// are given scratch to write), one channel at a time.
#[inline(always)]
fn output_transform<T: F>(m: &[T], ms: usize, at: usize, cout: usize, ys: [&mut [T]; 4]) {
    assert!(15 * ms + at + cout <= m.len() && ys.iter().all(|y| y.len() >= cout));
    let [y00, y01, y10, y11] = ys;
    for c in 0..cout {
        // SAFETY: `xi * ms + at + c < m.len()` by the assertion above.
        let mm = |xi: usize| unsafe { *m.get_unchecked(xi * ms + at + c) };
        // r = A^T m: rows (m0 + m1 + m2, m1 - m2 - m3), per column; then y = r A.
        let mut r = [[T::zero(); 4]; 2];
        for j in 0..4 {
            let (m0, m1, m2, m3) = (mm(j), mm(4 + j), mm(8 + j), mm(12 + j));
            r[0][j] = m0 + m1 + m2;
            r[1][j] = m1 - m2 - m3;
        }
        y00[c] = r[0][0] + r[0][1] + r[0][2];
        y01[c] = r[0][1] - r[0][2] - r[0][3];
        y10[c] = r[1][0] + r[1][1] + r[1][2];
        y11[c] = r[1][1] - r[1][2] - r[1][3];
    }
}

/// Writes `dM = A dY A^T` of one 2x2 tile of the output gradient (pixels past its edge
/// are given zeros) into row `at` of the 16 slabs of `m`, one channel at a time.
#[inline(always)]
fn grad_transform<T: F>(gys: [[&[T]; 2]; 2], cout: usize, m: &mut [T], ms: usize, at: usize) {
    assert!(15 * ms + at + cout <= m.len() && gys.iter().flatten().all(|g| g.len() >= cout));
    let out = m.as_mut_ptr();
    for c in 0..cout {
        // SAFETY: `c < cout <= g.len()` and `xi * ms + at + c < m.len()` by the assertion.
        unsafe {
            let g = |i: usize, j: usize| *gys[i][j].get_unchecked(c);
            // R = A dY: rows (y0, y0 + y1, y0 - y1, -y1), per column; then dM = R A^T.
            let mut r = [[T::zero(); 2]; 4];
            for j in 0..2 {
                let (y0, y1) = (g(0, j), g(1, j));
                r[0][j] = y0;
                r[1][j] = y0 + y1;
                r[2][j] = y0 - y1;
                r[3][j] = -y1;
            }
            for (i, r) in r.iter().enumerate() {
                let w = |xi: usize, x: T| *out.add(xi * ms + at + c) = x;
                w(i * 4, r[0]);
                w(i * 4 + 1, r[0] + r[1]);
                w(i * 4 + 2, r[0] - r[1]);
                w(i * 4 + 3, -r[1]);
            }
        }
    }
}

/// One image's tiling, shared by the forward and the kernel gradient: the output's size,
/// the tiles (`tw` a row, `tiles` in all), the image padded so that every 4x4 input tile
/// is inside it (`xp`, `pw` pixels wide; the image itself where no padding is needed, as
/// for a valid convolution of even size), and the 16 slabs of a block of transformed
/// inputs (`v`, `vs` apart) and of products or transformed gradients (`m`, `ms` apart).
struct Tiles<'a, T> {
    oh: usize,
    ow: usize,
    tw: usize,
    tiles: usize,
    pw: usize,
    xp: &'a [T],
    v: &'a mut [T],
    vs: usize,
    m: &'a mut [T],
    ms: usize,
}

#[inline(always)]
fn tiles<'a, T: F>(wk: &Walk, x: &'a [T], sc: &'a mut Scratch<T>) -> Tiles<'a, T> {
    let (oh, ow) = (
        wk.x[1] + wk.p[1].0 + wk.p[1].1 - 2,
        wk.x[2] + wk.p[2].0 + wk.p[2].1 - 2,
    );
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    let p = [
        (0, 0),
        (wk.p[1].0, 2 * th + 2 - wk.x[1] - wk.p[1].0),
        (wk.p[2].0, 2 * tw + 2 - wk.x[2] - wk.p[2].0),
    ];
    let Scratch { a, b, c } = sc;
    let (pw, xp): (usize, &[T]) = if p.iter().all(|&(a, b)| a == 0 && b == 0) {
        (wk.x[2], x)
    } else {
        (pad_into(wk.x, &p, wk.cin, x, a)[2], a)
    };
    let (vs, ms) = (BLOCK * wk.cin + SLAB_PAD, BLOCK * wk.cout + SLAB_PAD);
    Tiles {
        oh,
        ow,
        tw,
        tiles: th * tw,
        pw,
        xp,
        v: sized(b, 16 * vs),
        vs,
        m: sized(c, 16 * ms),
        ms,
    }
}

/// Runs `product(xi, slab, par)` for each slab of `ms` elements of `m`: on several threads
/// the products are split between them, each on one thread (a `gemm` of one block's tiles
/// is too small to split well); else one after another, each with `par`. Shared by the
/// 2-D and 1-D (`winograd1d`) forwards.
pub(super) fn slab_products<T: F>(
    m: &mut [T],
    ms: usize,
    par: Parallelism,
    product: impl Fn(usize, &mut [T], Parallelism) + Sync,
) {
    match par {
        Parallelism::Rayon(t) if t > 1 => m
            .par_chunks_mut(ms)
            .enumerate()
            .for_each(|(xi, mx)| product(xi, mx, Parallelism::None)),
        _ => m
            .chunks_mut(ms)
            .enumerate()
            .for_each(|(xi, mx)| product(xi, mx, par)),
    }
}

// `forward(wk, x, u, y, sc, par)`, one image: `y` gets the convolution of `x` with the
// transformed kernel `u`. The transforms were a quarter of the kernel's time at the CNN's
// shapes compiled for SSE2, so they run vectorised for the CPU's widest vector unit.
super::cpu::simd_kernel!(pub fn forward<T: F>(wk: &Walk, x: &[T], u: &[T], y: &mut [T], sc: &mut Scratch<T>, par: Parallelism) = forward_tiles);

#[inline(always)]
fn forward_tiles<T: F>(
    wk: &Walk,
    x: &[T],
    u: &[T],
    y: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let (cin, cout) = (wk.cin, wk.cout);
    let Tiles {
        oh,
        ow,
        tw,
        tiles,
        pw,
        xp,
        v,
        vs,
        m,
        ms,
    } = tiles(wk, x, sc);
    let mut junk = vec![T::zero(); 3 * cout];
    for t0 in (0..tiles).step_by(BLOCK) {
        let nt = BLOCK.min(tiles - t0);
        for tt in 0..nt {
            let (ty, tx) = ((t0 + tt) / tw, (t0 + tt) % tw);
            input_transform(tile_rows(xp, pw, cin, ty, tx), cin, v, vs, tt * cin);
        }
        let product = |xi: usize, mx: &mut [T], par: Parallelism| {
            let (vo, uo) = (xi * vs, xi * cin * cout);
            super::cpu::mm(
                nt,
                cout,
                cin,
                mx,
                cout,
                false,
                &v[vo..],
                (cin, 1),
                &u[uo..],
                (cout, 1),
                par,
            );
        };
        slab_products(m, ms, par, product);
        for tt in 0..nt {
            let (ty, tx) = ((t0 + tt) / tw, (t0 + tt) % tw);
            // The tile's four output pixels; those past the right or bottom edge write to
            // scratch.
            let (j1, rest) = junk.split_at_mut(cout);
            let (j2, j3) = rest.split_at_mut(cout);
            let tail = &mut y[(2 * ty * ow + 2 * tx) * cout..];
            let (top, below) = tail.split_at_mut((ow * cout).min(tail.len()));
            let (y00, top) = top.split_at_mut(cout);
            let y01 = if 2 * tx + 1 < ow {
                &mut top[..cout]
            } else {
                j1
            };
            let (y10, y11) = if 2 * ty + 1 < oh {
                let (a, b) = below.split_at_mut(cout);
                (a, if 2 * tx + 1 < ow { &mut b[..cout] } else { j3 })
            } else {
                (j2, j3)
            };
            let ys = [y00, y01, y10, y11];
            output_transform(m, ms, tt * cout, cout, ys);
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
fn kernel_grad_tiles<T: F>(
    wk: &Walk,
    x: &[T],
    gy: &[T],
    du: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let (cin, cout) = (wk.cin, wk.cout);
    let Tiles {
        oh,
        ow,
        tw,
        tiles,
        pw,
        xp,
        v,
        vs,
        m,
        ms,
    } = tiles(wk, x, sc);
    let zero = vec![T::zero(); cout];
    for t0 in (0..tiles).step_by(BLOCK) {
        let nt = BLOCK.min(tiles - t0);
        for tt in 0..nt {
            let (ty, tx) = ((t0 + tt) / tw, (t0 + tt) % tw);
            input_transform(tile_rows(xp, pw, cin, ty, tx), cin, v, vs, tt * cin);
            let g = |i: usize, j: usize| {
                let (oy, ox) = (2 * ty + i, 2 * tx + j);
                if oy < oh && ox < ow {
                    &gy[(oy * ow + ox) * cout..(oy * ow + ox + 1) * cout]
                } else {
                    &zero[..]
                }
            };
            grad_transform(
                [[g(0, 0), g(0, 1)], [g(1, 0), g(1, 1)]],
                cout,
                m,
                ms,
                tt * cout,
            );
        }
        for xi in 0..16 {
            let (vo, mo, uo) = (xi * vs, xi * ms, xi * cin * cout);
            super::cpu::mm(
                cin,
                cout,
                nt,
                &mut du[uo..],
                cout,
                true,
                &v[vo..],
                (1, cin),
                &m[mo..],
                (cout, 1),
                par,
            );
        }
    }
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
