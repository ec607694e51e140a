//! The kernel gradient (`kernel_grad`): Winograd for 1-D and 3x3 convolutions where it
//! applies, shifted GEMMs at stride 1, else im2col; the depthwise loops.

use super::depthwise;
use super::im2col::*;
use super::narrow;
use super::*;

pub(super) fn bwd_kernel<T: F>(g: &Geom, x: &[T], gy: &[T], dw: &mut [T]) {
    let (xl, yl) = (g.xpix() * g.cin, g.opix() * g.cout);
    let wk = g.walk();
    let run = run_len(g.opix(), g.n);
    if g.groups == 1 && wk.pointwise() {
        // `dw += xᵀ · gy` over runs of images read in place, one run per thread.
        let (cin, cout) = (g.cin, g.cout);
        sum_runs(g.n, g.n.div_ceil(threads()), dw, |i, cnt, dw, _, par| {
            mm(
                cin,
                cout,
                cnt * g.opix(),
                dw,
                cout,
                true,
                &x[i * xl..(i + cnt) * xl],
                (1, cin),
                &gy[i * yl..(i + cnt) * yl],
                (cout, 1),
                par,
            )
        });
    } else if g.groups == 1
        && narrow::direct_applies::<T>(g.cout)
        && g.n >= threads()
        && (run > 1 || !g.unit_stride() || g.cout == 1)
    {
        // 16 or 32 output channels where the column rows would be gathered, or one: the
        // taps' sums straight from each image (`narrow::kernel_grad_image`), an image to
        // a thread (fewer images than threads keep the parallel products).
        let sg = Segments::new(&wk);
        sum_images(g.n, dw, |i, dw, sc, _| {
            let src = wk.padded(&x[i * xl..(i + 1) * xl], &mut sc.a);
            narrow::kernel_grad_image(&sg, src, &gy[i * yl..(i + 1) * yl], dw, g.cout)
        });
    } else if g.groups == 1 && winograd1d::applies(&wk) {
        let mut du = vec![T::zero(); winograd1d::N * g.cin * g.cout];
        let mats = winograd1d::Matrices::new(wk.k[2]);
        sum_runs(
            g.n,
            winograd1d::run_len(&wk),
            &mut du,
            |i, cnt, du, sc, par| {
                winograd1d::kernel_grad(
                    &wk,
                    &mats,
                    &x[i * xl..(i + cnt) * xl],
                    &gy[i * yl..(i + cnt) * yl],
                    du,
                    sc,
                    par,
                )
            },
        );
        winograd1d::untransform_kernel_grad(&du, wk.k[2], g.cin, g.cout, dw);
    } else if g.groups == 1 && run > 1 {
        sum_runs(g.n, run, dw, |i, cnt, dw, sc, par| {
            segment_kernel_run(
                &wk,
                &x[i * xl..(i + cnt) * xl],
                cnt,
                &gy[i * yl..(i + cnt) * yl],
                dw,
                sc,
                par,
            )
        });
    } else if g.groups == 1 && winograd::applies(&wk) {
        let mut du = vec![T::zero(); 16 * g.cin * g.cout];
        sum_images(g.n, &mut du, |i, du, sc, par| {
            winograd::kernel_grad(
                &wk,
                &x[i * xl..(i + 1) * xl],
                &gy[i * yl..(i + 1) * yl],
                du,
                sc,
                par,
            )
        });
        winograd::untransform_kernel_grad(&du, g.cin, g.cout, dw);
    } else if g.unit_stride() && g.groups == 1 {
        sum_images(g.n, dw, |i, dw, sc, par| {
            shifted_kernel(
                g,
                &x[i * xl..(i + 1) * xl],
                &gy[i * yl..(i + 1) * yl],
                dw,
                sc,
                par,
            )
        });
    } else if g.groups == 1 {
        sum_images(g.n, dw, |i, dw, sc, par| {
            segment_kernel(
                g,
                &x[i * xl..(i + 1) * xl],
                &gy[i * yl..(i + 1) * yl],
                dw,
                sc,
                par,
            )
        });
    } else if g.cg() == 1 {
        sum_images(g.n, dw, |i, dw, sc, _| {
            depthwise_kernel(
                g,
                &x[i * xl..(i + 1) * xl],
                &gy[i * yl..(i + 1) * yl],
                dw,
                sc,
            )
        });
    } else {
        sum_images(g.n, dw, |i, dw, _, par| {
            im2col_kernel(
                g,
                &x[i * xl..(i + 1) * xl],
                &gy[i * yl..(i + 1) * yl],
                dw,
                par,
            )
        });
    }
}

/// `dw[k] += X_k^T @ gy`, with `X_k` the shifted rows of the padded image (stride 1).
fn shifted_kernel<T: F>(
    g: &Geom,
    x: &[T],
    gy: &[T],
    dw: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let (k, d, cin, cout, o) = (g.k, g.d, g.cin, g.cout, g.o);
    let pd = pad_into(&g.x, &g.p, cin, x, &mut sc.a);
    let xp = &sc.a;
    let rows = ((o[0] - 1) * pd[1] + o[1] - 1) * pd[2] + o[2];
    let ext = sized(&mut sc.b, rows * cout);
    for a in 0..o[0] {
        for b in 0..o[1] {
            let dst = (a * pd[1] + b) * pd[2] * cout;
            let src = (a * o[1] + b) * o[2] * cout;
            ext[dst..dst + o[2] * cout].copy_from_slice(&gy[src..src + o[2] * cout]);
        }
    }
    let merge = d[2] == 1;
    let (lsteps, klen) = if merge { (1, k[2] * cin) } else { (k[2], cin) };
    for a in 0..k[0] {
        for b in 0..k[1] {
            for c in 0..lsteps {
                let off = ((a * d[0] * pd[1] + b * d[1]) * pd[2] + c * d[2]) * cin;
                let wo = ((a * k[1] + b) * k[2] + c) * cin * cout;
                mm(
                    klen,
                    cout,
                    rows,
                    &mut dw[wo..],
                    cout,
                    true,
                    &xp[off..],
                    (1, cin),
                    ext,
                    (cout, 1),
                    par,
                );
            }
        }
    }
}

/// `dw += colsᵀ · gy` over tiles of one image's column rows (`Segments::gather`), any
/// stride and dilation.
fn segment_kernel<T: F>(
    g: &Geom,
    x: &[T],
    gy: &[T],
    dw: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let sg = Segments::new(&g.walk());
    debug_assert_eq!(sg.o, g.o);
    let cout = g.cout;
    pad_into(&g.x, &g.p, g.cin, x, &mut sc.a);
    let (ktot, tile, opix) = (sg.width(), sg.tile(), sg.pixels());
    let col = sized(&mut sc.b, tile * ktot);
    for r0 in (0..opix).step_by(tile) {
        let rows = tile.min(opix - r0);
        sg.gather(&sc.a, r0, rows, col);
        mm(
            ktot,
            cout,
            rows,
            dw,
            cout,
            true,
            col,
            (1, ktot),
            &gy[r0 * cout..],
            (cout, 1),
            par,
        );
    }
}

/// `dw += colsᵀ · gy` over a run of `cnt` small images: their column rows gathered one
/// image after another (`gather_run`), one `gemm` with `k = cnt * pixels`.
fn segment_kernel_run<T: F>(
    wk: &Walk,
    x: &[T],
    cnt: usize,
    gy: &[T],
    dw: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let sg = Segments::new(wk);
    let (ktot, opix, cout) = (sg.width(), sg.pixels(), wk.cout);
    gather_run(wk, &sg, x, cnt, sc);
    mm(
        ktot,
        cout,
        cnt * opix,
        dw,
        cout,
        true,
        &sc.b,
        (1, ktot),
        gy,
        (cout, 1),
        par,
    );
}

fn im2col_kernel<T: F>(g: &Geom, x: &[T], gy: &[T], dw: &mut [T], par: Parallelism) {
    let (kk, cg, og, cout) = (g.kk(), g.cg(), g.og(), g.cout);
    let width = kk * g.cin;
    let tile = tile_rows(g);
    let mut col = vec![T::zero(); tile * width];
    for r0 in (0..g.opix()).step_by(tile) {
        let rows = tile.min(g.opix() - r0);
        im2col(g, x, r0, rows, &mut col);
        for gi in 0..g.groups {
            let lhs = &col[gi * kk * cg..];
            mm(
                kk * cg,
                og,
                rows,
                &mut dw[gi * og..],
                cout,
                true,
                lhs,
                (1, width),
                &gy[r0 * cout + gi * og..],
                (cout, 1),
                par,
            );
        }
    }
}

simd_kernel!(fn depthwise_kernel<T: F>(g: &Geom, x: &[T], gy: &[T], dw: &mut [T], sc: &mut Scratch<T>) = depthwise_kernel_rows);

/// The depthwise kernel gradient of one image, added into `dw`.
#[inline(always)]
fn depthwise_kernel_rows<T: F>(g: &Geom, x: &[T], gy: &[T], dw: &mut [T], sc: &mut Scratch<T>) {
    let (cin, cout, m) = (g.cin, g.cout, g.og());
    if depthwise::kernel_applies::<T>(g) {
        return depthwise::kernel_direct(g, x, gy, dw);
    }
    let pd = pad_into(&g.x, &g.p, cin, x, &mut sc.a);
    let xp = &sc.a;
    padded_walk(g, &pd, |op, ip, kp| {
        let (gr, xr, dr) = (
            &gy[op * cout..(op + 1) * cout],
            &xp[ip * cin..(ip + 1) * cin],
            &mut dw[kp * cout..(kp + 1) * cout],
        );
        if m == 1 {
            dr.iter_mut()
                .zip(gr)
                .zip(xr)
                .for_each(|((d, &gv), &xv)| *d += gv * xv);
        } else {
            for (c, &xv) in xr.iter().enumerate() {
                dr[c * m..(c + 1) * m]
                    .iter_mut()
                    .zip(&gr[c * m..(c + 1) * m])
                    .for_each(|(d, &gv)| *d += gv * xv);
            }
        }
    });
}
