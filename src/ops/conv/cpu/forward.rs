//! The forward convolution (`forward`): Winograd, dense 1x1 GEMM, segment im2col, the
//! depthwise loops.

use super::depthwise::{self, LANES};
use super::im2col::*;
use super::narrow;
use super::*;

pub(super) fn fwd<T: F>(
    g: &Geom,
    x: &[T],
    w: &[T],
    y: &mut [T],
    after: Option<&(dyn Fn(usize) + Sync)>,
) {
    let (xl, yl) = (g.xpix() * g.cin, g.opix() * g.cout);
    if g.groups == 1 {
        let wk = g.walk();
        dense_fwd(g.n, &wk, x, w, y, after);
    } else if g.cg() == 1 {
        per_image(g.n, y, after, |i, y, sc, _| {
            depthwise_fwd(g, &x[i * xl..(i + 1) * xl], w, y, sc)
        });
    } else {
        per_image(g.n, y, after, |i, y, _, par| {
            im2col_fwd(g, &x[i * xl..(i + 1) * xl], w, y, par)
        });
    }
    debug_assert_eq!(y.len(), g.n * yl);
}

/// A groups=1 convolution of `n` images: a 1-D one by Winograd where `winograd1d` takes
/// it; with 1, 16 or 32 f32 output channels, the direct
/// narrow kernel where Winograd does not take it (`direct_fwd`); runs of small images by
/// `segment_fwd_run`, else Winograd where it applies, else `segment_fwd`. A single small
/// image (batch 1) takes `segment_fwd` too: its few Winograd tiles do not pay for
/// transforming the kernel (3x3 512->512 at 4x4, one image: 5.6 ms by Winograd, 0.7 ms as
/// one `gemm`).
pub(super) fn dense_fwd<T: F>(
    n: usize,
    wk: &Walk,
    x: &[T],
    w: &[T],
    y: &mut [T],
    after: Option<&(dyn Fn(usize) + Sync)>,
) {
    let xl = x.len() / n.max(1);
    let pix = Segments::new(wk).pixels();
    let run = run_len(pix, n);
    let wino = winograd::applies(wk) && !small(pix);
    if winograd1d::applies(wk) {
        let k = winograd1d::Prepared::new(w, wk.k[2], wk.cin, wk.cout);
        per_run(
            n,
            winograd1d::run_len(wk),
            y,
            after,
            |i, cnt, y, sc, par| {
                winograd1d::forward(wk, &x[i * xl..(i + cnt) * xl], cnt, &k, y, sc, par)
            },
        );
    } else if direct_fwd::<T>(wk, n) && (run > 1 || !wino) {
        let sg = Segments::new(wk);
        per_image(n, y, after, |i, y, sc, _| {
            let src = wk.padded(&x[i * xl..(i + 1) * xl], &mut sc.a);
            narrow::forward_image(&sg, src, w, y, wk.cout)
        });
    } else if run > 1 {
        per_run(n, run, y, after, |i, cnt, y, sc, par| {
            segment_fwd_run(wk, &x[i * xl..(i + cnt) * xl], cnt, w, y, sc, par)
        });
    } else if wino {
        let u = winograd::transform_kernel(w, wk.cin, wk.cout);
        per_image(n, y, after, |i, y, sc, par| {
            winograd::forward(wk, &x[i * xl..(i + 1) * xl], &u, y, sc, par)
        });
    } else {
        per_image(n, y, after, |i, y, sc, par| {
            segment_fwd(wk, &x[i * xl..(i + 1) * xl], w, y, sc, par)
        });
    }
}

/// Whether `dense_fwd` runs the direct narrow kernel (`narrow::forward_image`) on `n`
/// images: 1, 16 or 32 f32 output channels, any window but a pointwise one (whose column
/// rows are the image itself, one product), and images enough for every thread (the
/// kernel runs an image on one thread; fewer images keep the parallel products).
pub(super) fn direct_fwd<T: F>(wk: &Walk, n: usize) -> bool {
    !wk.pointwise() && narrow::direct_applies::<T>(wk.cout) && n >= threads()
}

/// One image of a groups=1 convolution: the column rows of a tile of output pixels
/// (`Segments::gather` from a padded copy of the image), then one `gemm` per tile with
/// `k = prod(kernel) * cin` written straight into `y`.
pub(super) fn segment_fwd<T: F>(
    wk: &Walk,
    x: &[T],
    w: &[T],
    y: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let (cin, cout) = (wk.cin, wk.cout);
    if wk.pointwise() {
        let rows = x.len() / cin.max(1);
        mm(
            rows,
            cout,
            cin,
            y,
            cout,
            false,
            x,
            (cin, 1),
            w,
            (cout, 1),
            par,
        );
        return;
    }
    let sg = Segments::new(wk);
    let Scratch { a, b, .. } = sc;
    let src = wk.padded(x, a);
    let (ktot, tile, opix) = (sg.width(), sg.tile(), sg.pixels());
    let col = sized(b, tile * ktot);
    for r0 in (0..opix).step_by(tile) {
        let rows = tile.min(opix - r0);
        sg.gather(src, r0, rows, col);
        mm(
            rows,
            cout,
            ktot,
            &mut y[r0 * cout..],
            cout,
            false,
            col,
            (ktot, 1),
            w,
            (cout, 1),
            par,
        );
    }
}

/// A run of `cnt` small images of a groups=1 convolution as one `gemm`: their column rows
/// gathered one image after another (read in place for a pointwise convolution, whose
/// images' pixel rows are contiguous), `k = prod(kernel) * cin`, written straight into `y`.
pub(super) fn segment_fwd_run<T: F>(
    wk: &Walk,
    x: &[T],
    cnt: usize,
    w: &[T],
    y: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    if wk.pointwise() || cnt == 1 {
        return segment_fwd(wk, x, w, y, sc, par);
    }
    let cout = wk.cout;
    let sg = Segments::new(wk);
    let (ktot, opix) = (sg.width(), sg.pixels());
    gather_run(wk, &sg, x, cnt, sc);
    mm(
        cnt * opix,
        cout,
        ktot,
        y,
        cout,
        false,
        &sc.b,
        (ktot, 1),
        w,
        (cout, 1),
        par,
    );
}

fn im2col_fwd<T: F>(g: &Geom, x: &[T], w: &[T], y: &mut [T], par: Parallelism) {
    let (kk, cg, og, cout) = (g.kk(), g.cg(), g.og(), g.cout);
    let tile = tile_rows(g);
    let mut col = vec![T::zero(); tile * kk * g.cin];
    for r0 in (0..g.opix()).step_by(tile) {
        let rows = tile.min(g.opix() - r0);
        im2col(g, x, r0, rows, &mut col);
        for gi in 0..g.groups {
            let lhs = &col[gi * kk * cg..];
            mm(
                rows,
                og,
                kk * cg,
                &mut y[r0 * cout + gi * og..],
                cout,
                false,
                lhs,
                (kk * g.cin, 1),
                &w[gi * og..],
                (cout, 1),
                par,
            );
        }
    }
}

simd_kernel!(fn depthwise_fwd<T: F>(g: &Geom, x: &[T], w: &[T], y: &mut [T], sc: &mut Scratch<T>) = depthwise_fwd_rows);

/// One input channel per group: `y[o, c*m + j] = sum_k x[i(o,k), c] * w[k, 0, c*m + j]`,
/// from a zero-padded copy of the image (every element of `y` written).
#[inline(always)]
fn depthwise_fwd_rows<T: F>(g: &Geom, x: &[T], w: &[T], y: &mut [T], sc: &mut Scratch<T>) {
    let (cin, cout, m) = (g.cin, g.cout, g.og());
    if depthwise::applies(g) {
        return depthwise::forward_direct(g, x, w, y);
    }
    let pd = pad_into(&g.x, &g.p, cin, x, &mut sc.a);
    let xp = &sc.a;
    if m == 1 && cin % LANES == 0 {
        return depthwise_fwd_blocked(g, &pd, xp, w, y);
    }
    y.fill(T::zero());
    padded_walk(g, &pd, |op, ip, kp| {
        let (yr, xr, wr) = (
            &mut y[op * cout..(op + 1) * cout],
            &xp[ip * cin..(ip + 1) * cin],
            &w[kp * cout..(kp + 1) * cout],
        );
        if m == 1 {
            yr.iter_mut()
                .zip(xr)
                .zip(wr)
                .for_each(|((y, &x), &w)| *y += x * w);
        } else {
            for (c, &xv) in xr.iter().enumerate() {
                yr[c * m..(c + 1) * m]
                    .iter_mut()
                    .zip(&wr[c * m..(c + 1) * m])
                    .for_each(|(y, &w)| *y += xv * w);
            }
        }
    });
}

/// The depthwise forward with one kernel per channel (`m == 1`, `cin` a multiple of
/// `LANES`): each output pixel's `LANES` channels summed over the whole window in
/// registers, then stored once.
#[inline(always)]
fn depthwise_fwd_blocked<T: F>(g: &Geom, pd: &[usize; 3], xp: &[T], w: &[T], y: &mut [T]) {
    let (o, k, s, d, cin) = (&g.o, &g.k, &g.s, &g.d, g.cin);
    for a in 0..o[0] {
        for b in 0..o[1] {
            for c in 0..o[2] {
                let op = (a * o[1] + b) * o[2] + c;
                for ch in (0..cin).step_by(LANES) {
                    let mut acc = [T::zero(); LANES];
                    for ka in 0..k[0] {
                        for kb in 0..k[1] {
                            let xrow = ((a * s[0] + ka * d[0]) * pd[1] + b * s[1] + kb * d[1])
                                * pd[2]
                                + c * s[2];
                            for kc in 0..k[2] {
                                let kp = (ka * k[1] + kb) * k[2] + kc;
                                let xi = (xrow + kc * d[2]) * cin + ch;
                                let xs: &[T; LANES] = xp[xi..xi + LANES].try_into().expect("LANES");
                                let ws: &[T; LANES] = w[kp * cin + ch..kp * cin + ch + LANES]
                                    .try_into()
                                    .expect("LANES");
                                for j in 0..LANES {
                                    acc[j] += xs[j] * ws[j];
                                }
                            }
                        }
                    }
                    y[op * cin + ch..op * cin + ch + LANES].copy_from_slice(&acc);
                }
            }
        }
    }
}
