//! The depthwise forward (one channel per group, multiplier 1) of a 3x3 window over
//! channels a multiple of `LANES`, with the window's 9 kernel vectors in registers: for
//! each output row and block of `LANES` channels they are loaded once and used across the
//! row's pixels (the general loop, `depthwise_fwd_blocked`, reloads them for every pixel).
//! At stride 1 the input gradient is such a forward too: of the output gradient, padded by
//! `(k - 1) * d - p`, with the taps in reverse order (`input_as_forward`). The kernel
//! gradient walks bands of output rows with the window's 9 sums in registers
//! (`kernel_rows`).

use super::*;

/// Channels summed in registers at a time: one AVX-512 vector of f32.
pub(super) const LANES: usize = 16;

/// Taps of the kernels specialised here (a 3x3 window).
pub(super) const TAPS: usize = 9;

/// Whether `forward_rows` runs this depthwise convolution.
pub(super) fn applies(g: &Geom) -> bool {
    g.cg() == 1 && g.og() == 1 && g.cin.is_multiple_of(LANES) && g.kk() == TAPS
}

/// Where `applies`, at stride 1 with no padding beyond the dilated window: the geometry
/// of the forward convolution that computes the input gradient (input `gy`, output `dx`,
/// padding `(k - 1) * d - p` each side) and the kernel with its taps reversed.
pub(super) fn input_as_forward<T: F>(g: &Geom, w: &[T]) -> Option<(Geom, Vec<T>)> {
    let eff = [0, 1, 2].map(|t| g.d[t] * (g.k[t] - 1));
    let fits = (0..3).all(|t| g.p[t].0 <= eff[t] && g.p[t].1 <= eff[t]);
    if !applies(g) || !g.unit_stride() || !fits {
        return None;
    }
    let mut f = g.clone();
    (f.x, f.o) = (g.o, g.x);
    f.p = [0, 1, 2].map(|t| (eff[t] - g.p[t].0, eff[t] - g.p[t].1));
    let c = g.cin;
    let mut wf = Vec::with_capacity(TAPS * c);
    for t in (0..TAPS).rev() {
        wf.extend_from_slice(&w[t * c..(t + 1) * c]);
    }
    Some((f, wf))
}

/// The output-pixel walk over a padded image of dims `pd`: where each tap reads,
/// relative to an output pixel's window origin, in pixels.
struct Walk3 {
    o: [usize; 3],
    s: [usize; 3],
    pd: [usize; 3],
    off: [usize; TAPS],
    c: usize,
}

impl Walk3 {
    fn new(g: &Geom, pd: &[usize; 3]) -> Walk3 {
        let (k, d) = (&g.k, &g.d);
        let off = std::array::from_fn(|t| {
            let (ka, kb, kc) = (t / (k[1] * k[2]), (t / k[2]) % k[1], t % k[2]);
            (ka * d[0] * pd[1] + kb * d[1]) * pd[2] + kc * d[2]
        });
        Walk3 {
            o: g.o,
            s: g.s,
            pd: *pd,
            off,
            c: g.cin,
        }
    }
    /// `(first output pixel, padded pixel of its window origin)` of output row `(a, b)`.
    #[inline(always)]
    fn row(&self, a: usize, b: usize) -> (usize, usize) {
        let (o, s, pd) = (&self.o, &self.s, &self.pd);
        ((a * o[1] + b) * o[2], (a * s[0] * pd[1] + b * s[1]) * pd[2])
    }
}

#[inline(always)]
fn lanes<T: F>(v: &[T], at: usize) -> &[T; LANES] {
    v[at..at + LANES].try_into().expect("LANES")
}

#[inline(always)]
fn lanes_mut<T: F>(v: &mut [T], at: usize) -> &mut [T; LANES] {
    (&mut v[at..at + LANES]).try_into().expect("LANES")
}

/// `y[op, ch] = sum_t xp[window(op) + off[t], ch] * w[t, ch]` (every element written).
#[inline(always)]
pub(super) fn forward_rows<T: F>(g: &Geom, pd: &[usize; 3], xp: &[T], w: &[T], y: &mut [T]) {
    let wk = Walk3::new(g, pd);
    let (c, s2) = (wk.c, wk.s[2]);
    for a in 0..wk.o[0] {
        for b in 0..wk.o[1] {
            let (orow, irow) = wk.row(a, b);
            for ch in (0..c).step_by(LANES) {
                // A loop, not `array::from_fn`: its closure, left out of line, is compiled
                // without this kernel's AVX-512 and copies the vectors through memory
                // (MobileNetV2's `predict` at batch 32, one thread: 7% of its time).
                let mut wv = [[T::zero(); LANES]; TAPS];
                for (t, v) in wv.iter_mut().enumerate() {
                    *v = *lanes(w, t * c + ch);
                }
                for px in 0..wk.o[2] {
                    let base = irow + px * s2;
                    let mut acc = [T::zero(); LANES];
                    for t in 0..TAPS {
                        let xv = lanes(xp, (base + wk.off[t]) * c + ch);
                        for j in 0..LANES {
                            acc[j] += xv[j] * wv[t][j];
                        }
                    }
                    *lanes_mut(y, (orow + px) * c + ch) = acc;
                }
            }
        }
    }
}

/// Bytes of one band of output rows `kernel_rows` walks for every block of channels in
/// turn (the rows' output gradient and the input rows under them): the band stays in L2
/// while each block of `LANES` channels reads its 64-byte runs of it. Over the whole
/// image at once, a block of a large image re-read it from L3 or memory (one thread,
/// batch 8, 32x32x144: 3.4 ms a call).
const BAND_BYTES: usize = 192 << 10;

/// Most channels `kernel_rows` takes for an image that fits one band: with more, the loop
/// over pixels and taps with all the channels at once does better (one thread, batch 8:
/// 16x16x192 0.35 against 0.43-0.49 ms; at 16-32 channels `kernel_rows` takes half the
/// time, at 64 the two are level).
const KERNEL_MAX_CHANNELS: usize = 64;

/// Whether `kernel_rows` runs this depthwise kernel gradient: where `applies`, with few
/// channels or an image larger than a band.
pub(super) fn kernel_applies<T>(g: &Geom) -> bool {
    let image = (g.opix() + g.xpix()) * g.cin * std::mem::size_of::<T>();
    applies(g) && (g.cin <= KERNEL_MAX_CHANNELS || image > BAND_BYTES)
}

/// `dw[t, ch] += sum_op gy[op, ch] * xp[window(op) + off[t], ch]`, where `applies`: over
/// bands of output rows (`BAND_BYTES`), for each block of `LANES` channels the nine sums
/// stay in registers over the band and are added into `dw` once.
#[inline(always)]
pub(super) fn kernel_rows<T: F>(g: &Geom, pd: &[usize; 3], xp: &[T], gy: &[T], dw: &mut [T]) {
    let wk = Walk3::new(g, pd);
    let c = wk.c;
    let rows = wk.o[0] * wk.o[1];
    let row_bytes = (wk.o[2] + wk.s[1] * wk.pd[2]) * c * std::mem::size_of::<T>();
    let band = (BAND_BYTES / row_bytes.max(1)).clamp(1, rows.max(1));
    for r0 in (0..rows).step_by(band) {
        kernel_band(&wk, r0..(r0 + band).min(rows), xp, gy, dw);
    }
}

/// `kernel_rows` over output rows `band` (flat over the first two output dims).
#[inline(always)]
fn kernel_band<T: F>(wk: &Walk3, band: std::ops::Range<usize>, xp: &[T], gy: &[T], dw: &mut [T]) {
    let (c, s2) = (wk.c, wk.s[2]);
    for ch in (0..c).step_by(LANES) {
        let mut acc = [[T::zero(); LANES]; TAPS];
        for r in band.clone() {
            let (orow, irow) = wk.row(r / wk.o[1], r % wk.o[1]);
            for px in 0..wk.o[2] {
                let base = irow + px * s2;
                let gv = lanes(gy, (orow + px) * c + ch);
                for (t, at) in acc.iter_mut().enumerate() {
                    let xv = lanes(xp, (base + wk.off[t]) * c + ch);
                    for j in 0..LANES {
                        at[j] += gv[j] * xv[j];
                    }
                }
            }
        }
        for (t, at) in acc.iter().enumerate() {
            let d = lanes_mut(dw, t * c + ch);
            for j in 0..LANES {
                d[j] += at[j];
            }
        }
    }
}
