//! The im2col machinery the three kernels share: zero-padded image copies (`pad_into`),
//! window walks (`Walk`, `padded_walk`) and the contiguous window-row segments that
//! gather a tile of im2col rows or add one back (`Segments`, `im2col`).

use super::*;

/// A zero-padded copy of one channels-last image in `buf`, `(P0, P1, P2, c)` with
/// `P = x + before + after`; returns `P`.
pub fn pad_into<T: F>(
    xs: &[usize; 3],
    p: &[(usize, usize); 3],
    c: usize,
    x: &[T],
    buf: &mut Vec<T>,
) -> [usize; 3] {
    let pd = [0, 1, 2].map(|t| xs[t] + p[t].0 + p[t].1);
    let out = sized(buf, pd.iter().product::<usize>() * c);
    for a in 0..xs[0] {
        for b in 0..xs[1] {
            let src = ((a * xs[1] + b) * xs[2]) * c;
            let dst = (((a + p[0].0) * pd[1] + b + p[1].0) * pd[2] + p[2].0) * c;
            out[dst..dst + xs[2] * c].copy_from_slice(&x[src..src + xs[2] * c]);
        }
    }
    pd
}

/// The window walk of one groups=1 convolution, for `segment_fwd`.
pub struct Walk<'a> {
    pub x: &'a [usize; 3],
    pub k: &'a [usize; 3],
    pub s: &'a [usize; 3],
    pub d: &'a [usize; 3],
    pub p: &'a [(usize, usize); 3],
    pub cin: usize,
    pub cout: usize,
}

impl Walk<'_> {
    pub fn unpadded(&self) -> bool {
        self.p.iter().all(|&(a, b)| a == 0 && b == 0)
    }
    /// The image `x` as its column rows are gathered from: itself without padding, else
    /// its zero-padded copy in `buf`.
    pub fn padded<'b, T: F>(&self, x: &'b [T], buf: &'b mut Vec<T>) -> &'b [T] {
        if self.unpadded() {
            return x;
        }
        pad_into(self.x, self.p, self.cin, x, buf);
        buf
    }
    /// A 1x1 kernel at stride 1 without padding: the image's pixel rows are its column
    /// rows (dilation is immaterial for a 1x1 kernel).
    pub fn pointwise(&self) -> bool {
        *self.k == [1; 3] && *self.s == [1; 3] && self.unpadded()
    }
}

/// Where the im2col rows of a groups=1 convolution lie in a zero-padded copy of one image
/// (`pad_into`): each output pixel's window is `offs.len()` contiguous segments of `seg`
/// elements, one window row along the last dim (`kernel_width * cin`) where that dim is
/// not dilated, else one pixel's `cin` channels, in the kernel's `(k0, k1, k2, cin)` row
/// order, so column `j` of a row meets row `j` of the kernel.
pub(super) struct Segments {
    pub(super) pd: [usize; 3],
    pub(super) o: [usize; 3],
    pub(super) s: [usize; 3],
    pub(super) cin: usize,
    pub(super) offs: Vec<usize>,
    pub(super) seg: usize,
}

impl Segments {
    pub(super) fn new(wk: &Walk) -> Segments {
        let (k, s, d, cin) = (wk.k, wk.s, wk.d, wk.cin);
        let pd = [0, 1, 2].map(|t| wk.x[t] + wk.p[t].0 + wk.p[t].1);
        let o = [0, 1, 2].map(|t| (pd[t] - d[t] * (k[t] - 1) - 1) / s[t] + 1);
        let merge = d[2] == 1;
        let mut offs = Vec::new();
        for a in 0..k[0] {
            for b in 0..k[1] {
                for c in 0..(if merge { 1 } else { k[2] }) {
                    offs.push(((a * d[0] * pd[1] + b * d[1]) * pd[2] + c * d[2]) * cin);
                }
            }
        }
        Segments {
            pd,
            o,
            s: *s,
            cin,
            offs,
            seg: if merge { k[2] * cin } else { cin },
        }
    }
    /// Elements of one column row (the kernel's rows).
    pub(super) fn width(&self) -> usize {
        self.offs.len() * self.seg
    }
    pub(super) fn pixels(&self) -> usize {
        self.o.iter().product()
    }
    /// Output pixels per column tile: about 1 MiB of f32.
    pub(super) fn tile(&self) -> usize {
        ((1usize << 18) / self.width().max(1))
            .max(16)
            .min(self.pixels().max(1))
    }
    /// Where output pixel `op`'s window starts in the padded image.
    pub(super) fn base(&self, op: usize) -> usize {
        let (o, s, pd) = (&self.o, &self.s, &self.pd);
        let (c, b, a) = (op % o[2], (op / o[2]) % o[1], op / (o[2] * o[1]));
        ((a * s[0] * pd[1] + b * s[1]) * pd[2] + c * s[2]) * self.cin
    }
    /// The column rows of output pixels `r0..r0 + rows` into `col`.
    pub(super) fn gather<T: F>(&self, xp: &[T], r0: usize, rows: usize, col: &mut [T]) {
        let (w, seg) = (self.width(), self.seg);
        for r in 0..rows {
            let base = self.base(r0 + r);
            for (dst, &off) in col[r * w..(r + 1) * w]
                .chunks_exact_mut(seg)
                .zip(&self.offs)
            {
                copy_short(dst, &xp[base + off..base + off + seg]);
            }
        }
    }
    /// Adds column rows of output pixels `r0..r0 + rows` back into the padded image `xp`
    /// (col2im), one window after another, as overlapping windows require.
    pub(super) fn scatter_add<T: F>(&self, col: &[T], r0: usize, rows: usize, xp: &mut [T]) {
        let (w, seg) = (self.width(), self.seg);
        for r in 0..rows {
            let base = self.base(r0 + r);
            for (src, &off) in col[r * w..(r + 1) * w].chunks_exact(seg).zip(&self.offs) {
                xp[base + off..base + off + seg]
                    .iter_mut()
                    .zip(src)
                    .for_each(|(d, &v)| *d += v);
            }
        }
    }
}

/// `dst.copy_from_slice(src)`, in line for the short runs of a window row with few
/// channels (15 floats for a 5-wide window over 3 channels), where a call to `memmove`
/// per run costs more than the copy.
#[inline(always)]
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    if src.len() <= 32 {
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s);
    } else {
        dst.copy_from_slice(src);
    }
}

/// Output rows per im2col tile: the column buffer stays within about 512 KiB of f32.
pub(super) fn tile_rows(g: &Geom) -> usize {
    ((1usize << 17) / (g.kk() * g.cin).max(1))
        .max(8)
        .min(g.opix().max(1))
}

/// Columns `(rows, groups, kernel, cin / groups)` of output pixels `r0..r0 + rows`.
pub(super) fn im2col<T: F>(g: &Geom, x: &[T], r0: usize, rows: usize, col: &mut [T]) {
    let (kk, cg) = (g.kk(), g.cg());
    let width = kk * g.cin;
    for r in 0..rows {
        let row = &mut col[r * width..(r + 1) * width];
        for kp in 0..kk {
            match g.src_pix(r0 + r, kp) {
                Some(ip) => {
                    for gi in 0..g.groups {
                        let s = ip * g.cin + gi * cg;
                        row[(gi * kk + kp) * cg..][..cg].copy_from_slice(&x[s..s + cg]);
                    }
                }
                None => {
                    (0..g.groups).for_each(|gi| row[(gi * kk + kp) * cg..][..cg].fill(T::zero()))
                }
            }
        }
    }
}

/// Calls `f(op, ip, kp)` for every output pixel `op`, kernel offset `kp` and the pixel
/// `ip` of the zero-padded image (dims `pd`, `pad_into`) the window reads there: output
/// rows outermost, then kernel offsets, then the pixels along the row, so the depthwise
/// kernels below need no bounds and no index arithmetic per pixel.
#[inline(always)]
pub(super) fn padded_walk(g: &Geom, pd: &[usize; 3], mut f: impl FnMut(usize, usize, usize)) {
    let (o, k, s, d) = (&g.o, &g.k, &g.s, &g.d);
    for a in 0..o[0] {
        for b in 0..o[1] {
            let orow = (a * o[1] + b) * o[2];
            for ka in 0..k[0] {
                for kb in 0..k[1] {
                    let xrow = ((a * s[0] + ka * d[0]) * pd[1] + b * s[1] + kb * d[1]) * pd[2];
                    for kc in 0..k[2] {
                        let kp = (ka * k[1] + kb) * k[2] + kc;
                        for c in 0..o[2] {
                            f(orow + c, xrow + c * s[2] + kc * d[2], kp);
                        }
                    }
                }
            }
        }
    }
}

/// The column rows of every output pixel of `cnt` consecutive images `x` (a groups=1
/// convolution), one image after another, into `sc.b` (`cnt * pixels` rows of
/// `sg.width()`); an image with padding is copied into `sc.a` padded first.
pub(super) fn gather_run<T: F>(wk: &Walk, sg: &Segments, x: &[T], cnt: usize, sc: &mut Scratch<T>) {
    let (ktot, opix, xl) = (sg.width(), sg.pixels(), x.len() / cnt.max(1));
    let Scratch { a, b, .. } = sc;
    let col = sized(b, cnt * opix * ktot);
    for j in 0..cnt {
        let src = wk.padded(&x[j * xl..(j + 1) * xl], a);
        sg.gather(
            src,
            0,
            opix,
            &mut col[j * opix * ktot..(j + 1) * opix * ktot],
        );
    }
}
