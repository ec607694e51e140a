//! The input gradient (`input_grad`): the forward convolution of the flipped kernel
//! (by Winograd where it applies), or col2im of `gy · wᵀ`; the depthwise loops.

use super::depthwise;
use super::forward::dense_fwd;
use super::im2col::*;
use super::narrow;
use super::*;

/// Stride 1, one group: the input gradient is a stride-1 convolution of `gy`, padded by
/// `(k-1)*d - p` (returned), with the spatially flipped kernel whose in/out channels are
/// swapped; `None` where the padding exceeds the dilated kernel.
fn as_convolution(g: &Geom) -> Option<[(usize, usize); 3]> {
    let eff = [0, 1, 2].map(|t| g.d[t] * (g.k[t] - 1));
    let ok = g.unit_stride()
        && g.groups == 1
        && (0..3).all(|t| g.p[t].0 <= eff[t] && g.p[t].1 <= eff[t]);
    ok.then(|| [0, 1, 2].map(|t| (eff[t] - g.p[t].0, eff[t] - g.p[t].1)))
}

pub(super) fn bwd_input<T: F>(g: &Geom, gy: &[T], w: &[T], dx: &mut [T]) {
    let (xl, yl) = (g.xpix() * g.cin, g.opix() * g.cout);
    match as_convolution(g) {
        Some(_) if g.groups == 1 && g.walk().pointwise() => {
            // `dx = gy · wᵀ` over runs of images, `w` read transposed in place.
            let (cin, cout) = (g.cin, g.cout);
            let run = run_len(g.opix(), g.n);
            per_run(g.n, run, dx, None, |i, cnt, dx, _, par| {
                mm(
                    cnt * g.opix(),
                    cin,
                    cout,
                    dx,
                    cin,
                    false,
                    &gy[i * yl..(i + cnt) * yl],
                    (cout, 1),
                    w,
                    (1, cout),
                    par,
                )
            });
        }
        Some(p2)
            if !col2im_input_first(g)
                || (narrow::direct_applies::<T>(g.cin) && g.n >= threads())
                || winograd1d::applies(&flipped(g, &p2)) =>
        {
            let wf = flip_transpose(g, w);
            dense_fwd(g.n, &flipped(g, &p2), gy, &wf, dx, None);
        }
        _ if g.groups == 1 => per_run(
            g.n,
            run_len(g.opix(), g.n),
            dx,
            None,
            |i, cnt, dx, sc, par| {
                segment_input(g, &gy[i * yl..(i + cnt) * yl], cnt, w, dx, sc, par)
            },
        ),
        _ if g.cg() == 1 => per_image(g.n, dx, None, |i, dx, sc, _| {
            depthwise_input(g, &gy[i * yl..(i + 1) * yl], w, dx, sc)
        }),
        _ => per_image(g.n, dx, None, |i, dx, _, par| {
            col2im_input(g, &gy[i * yl..(i + 1) * yl], w, dx, par)
        }),
    }
    debug_assert_eq!(dx.len(), g.n * xl);
}

/// The walk of the input gradient as a convolution of `gy` padded by `p2`
/// (`as_convolution`): the flipped kernel, in and out channels swapped.
fn flipped<'a>(g: &'a Geom, p2: &'a [(usize, usize); 3]) -> Walk<'a> {
    Walk {
        x: &g.o,
        k: &g.k,
        s: &[1; 3],
        d: &g.d,
        p: p2,
        cin: g.cout,
        cout: g.cin,
    }
}

/// Whether a stride-1 groups=1 input gradient runs by col2im (`segment_input`) rather than
/// as the forward convolution of `gy` with the flipped kernel: when the latter's `gemm`
/// would write fewer than 16 columns (the input's channels) and Winograd does not apply,
/// and for runs of small images, where flipping and transposing the kernel (`w` is read
/// transposed in place by col2im) costs more than adding the columns back, and for a
/// single small image likewise; except with 1, 16 or 32 f32 input channels and images
/// enough for every thread, whose forward convolution runs the direct narrow kernel
/// (`bwd_input`, `forward::direct_fwd`).
fn col2im_input_first(g: &Geom) -> bool {
    g.groups == 1 && (g.cin < 16 || small(g.opix()))
}

/// The input gradient of `cnt` consecutive images of a groups=1 convolution by col2im:
/// the column rows `gy · wᵀ` of a tile of output pixels (one `gemm` with
/// `n = prod(kernel) * cin`; a tile spans the whole run where images are small) added back
/// along the forward's window segments into a zeroed padded image, whose interior is the
/// image's `dx` (every element written).
fn segment_input<T: F>(
    g: &Geom,
    gy: &[T],
    cnt: usize,
    w: &[T],
    dx: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let sg = Segments::new(&g.walk());
    debug_assert_eq!(sg.o, g.o);
    let cout = g.cout;
    let (ktot, opix, xl) = (sg.width(), sg.pixels(), g.xpix() * g.cin);
    let tile = if cnt > 1 { cnt * opix } else { sg.tile() };
    let Scratch { a, b, .. } = sc;
    let xp = sized(a, sg.pd.iter().product::<usize>() * g.cin);
    let col = sized(b, tile * ktot);
    // Row `r` of the run: pixel `r % opix` of image `r / opix`; a tile holds whole images
    // or lies within one.
    for r0 in (0..cnt * opix).step_by(tile) {
        let rows = tile.min(cnt * opix - r0);
        mm(
            rows,
            ktot,
            cout,
            col,
            ktot,
            false,
            &gy[r0 * cout..],
            (cout, 1),
            w,
            (1, cout),
            par,
        );
        for j in (r0 / opix)..(r0 + rows).div_ceil(opix) {
            // The part of image j in this tile: output pixels p0..p1.
            let (p0, p1) = (
                (j * opix).max(r0) - j * opix,
                ((j + 1) * opix).min(r0 + rows) - j * opix,
            );
            if p0 == 0 {
                xp.fill(T::zero());
            }
            sg.scatter_add(&col[(j * opix + p0 - r0) * ktot..], p0, p1 - p0, xp);
            if p1 == opix {
                unpad(&g.x, &g.p, g.cin, xp, &mut dx[j * xl..(j + 1) * xl]);
            }
        }
    }
}

/// The interior of a padded image (`pad_into`'s layout) into `x`.
fn unpad<T: F>(xs: &[usize; 3], p: &[(usize, usize); 3], c: usize, xp: &[T], x: &mut [T]) {
    let pd = [0, 1, 2].map(|t| xs[t] + p[t].0 + p[t].1);
    for a in 0..xs[0] {
        for b in 0..xs[1] {
            let dst = ((a * xs[1] + b) * xs[2]) * c;
            let src = (((a + p[0].0) * pd[1] + b + p[1].0) * pd[2] + p[2].0) * c;
            x[dst..dst + xs[2] * c].copy_from_slice(&xp[src..src + xs[2] * c]);
        }
    }
}

/// `w[k0, k1, k2, ci, co]` -> `w'[K0-1-k0, K1-1-k1, K2-1-k2, co, ci]`, each `ci x co`
/// matrix transposed in square blocks (a row-by-row transpose of a large kernel misses
/// the cache on every write).
fn flip_transpose<T: F>(g: &Geom, w: &[T]) -> Vec<T> {
    const B: usize = 16;
    let (kk, ci, co) = (g.kk(), g.cin, g.cout);
    let mut out = vec![T::zero(); w.len()];
    for kp in 0..kk {
        let src = &w[kp * ci * co..(kp + 1) * ci * co];
        let dst = &mut out[(kk - 1 - kp) * ci * co..(kk - kp) * ci * co];
        for i0 in (0..ci).step_by(B) {
            for o0 in (0..co).step_by(B) {
                for i in i0..(i0 + B).min(ci) {
                    for o in o0..(o0 + B).min(co) {
                        dst[o * ci + i] = src[i * co + o];
                    }
                }
            }
        }
    }
    out
}

fn col2im_input<T: F>(g: &Geom, gy: &[T], w: &[T], dx: &mut [T], par: Parallelism) {
    let (kk, cg, og, cout) = (g.kk(), g.cg(), g.og(), g.cout);
    let width = kk * g.cin;
    let tile = tile_rows(g);
    let mut col = vec![T::zero(); tile * width];
    for r0 in (0..g.opix()).step_by(tile) {
        let rows = tile.min(g.opix() - r0);
        for gi in 0..g.groups {
            let rhs = &w[gi * og..];
            mm(
                rows,
                kk * cg,
                og,
                &mut col[gi * kk * cg..],
                width,
                false,
                &gy[r0 * cout + gi * og..],
                (cout, 1),
                rhs,
                (1, cout),
                par,
            );
        }
        for r in 0..rows {
            for kp in 0..kk {
                let Some(ip) = g.src_pix(r0 + r, kp) else {
                    continue;
                };
                for gi in 0..g.groups {
                    let src = &col[r * width + (gi * kk + kp) * cg..][..cg];
                    dx[ip * g.cin + gi * cg..][..cg]
                        .iter_mut()
                        .zip(src)
                        .for_each(|(d, &v)| *d += v);
                }
            }
        }
    }
}

/// The depthwise input gradient, added into a zeroed padded image whose interior is `dx`
/// (every element written).
#[inline(always)]
fn depthwise_input_rows<T: F>(g: &Geom, gy: &[T], w: &[T], dx: &mut [T], sc: &mut Scratch<T>) {
    let (cin, cout, m) = (g.cin, g.cout, g.og());
    if let Some((f, wf)) = depthwise::input_as_forward(g, w) {
        return depthwise::forward_direct(&f, gy, &wf, dx);
    }
    let pd = [0, 1, 2].map(|t| g.x[t] + g.p[t].0 + g.p[t].1);
    let xp = sized(&mut sc.a, pd.iter().product::<usize>() * cin);
    xp.fill(T::zero());
    padded_walk(g, &pd, |op, ip, kp| {
        let (gr, dr, wr) = (
            &gy[op * cout..(op + 1) * cout],
            &mut xp[ip * cin..(ip + 1) * cin],
            &w[kp * cout..(kp + 1) * cout],
        );
        if m == 1 {
            dr.iter_mut()
                .zip(gr)
                .zip(wr)
                .for_each(|((d, &gv), &w)| *d += gv * w);
        } else {
            for (c, d) in dr.iter_mut().enumerate() {
                *d += gr[c * m..(c + 1) * m]
                    .iter()
                    .zip(&wr[c * m..(c + 1) * m])
                    .map(|(&a, &b)| a * b)
                    .sum::<T>();
            }
        }
    });
    unpad(&g.x, &g.p, cin, xp, dx);
}

simd_kernel!(fn depthwise_input<T: F>(g: &Geom, gy: &[T], w: &[T], dx: &mut [T], sc: &mut Scratch<T>) = depthwise_input_rows);
