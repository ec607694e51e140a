//! The depthwise forward (one channel per group, multiplier 1) of a 3x3 window over
//! channels a multiple of `LANES`, read from the unpadded image, with the window's 9
//! kernel vectors in registers: for each output row and block of `LANES` channels they
//! are loaded once and used across the row's pixels (the general loop,
//! `depthwise_fwd_blocked`, reloads them for every pixel). At stride 1 the input gradient
//! is such a forward too: of the output gradient, padded by `(k - 1) * d - p`, with the
//! taps in reverse order (`input_as_forward`). The kernel gradient walks bands of output
//! rows of a zero-padded copy with the window's 9 sums in registers (`kernel_rows`).

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
/// relative to an output pixel's window origin, in elements (pixels times channels).
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
            ((ka * d[0] * pd[1] + kb * d[1]) * pd[2] + kc * d[2]) * g.cin
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
    /// Checks that output row `(a, b)`, of the output `y_len` long, reads only inside the
    /// padded image `xp_len` long, so that the row's loops may load without checks: returns
    /// the row's first output element and its first window origin, in elements.
    #[inline(always)]
    fn checked_row(&self, a: usize, b: usize, xp_len: usize, y_len: usize) -> (usize, usize) {
        let (orow, irow) = self.row(a, b);
        let (c, n) = (self.c, self.o[2]);
        if n > 0 {
            let last = (irow + (n - 1) * self.s[2]) * c + self.off.iter().max().unwrap_or(&0);
            assert!(
                last + c <= xp_len && (orow + n) * c <= y_len,
                "depthwise row in bounds"
            );
        }
        (orow * c, irow * c)
    }
}

/// The `LANES` elements at `p`.
///
/// # Safety
/// `p..p + LANES` lies inside one allocation of initialised `T`s.
#[inline(always)]
unsafe fn load<T: F>(p: *const T) -> [T; LANES] {
    // SAFETY: as the caller promises; `[T; LANES]` needs only `T`'s alignment.
    unsafe { std::ptr::read_unaligned(p as *const [T; LANES]) }
}

#[inline(always)]
fn lanes<T: F>(v: &[T], at: usize) -> &[T; LANES] {
    v[at..at + LANES].try_into().expect("LANES")
}

#[inline(always)]
fn lanes_mut<T: F>(v: &mut [T], at: usize) -> &mut [T; LANES] {
    (&mut v[at..at + LANES]).try_into().expect("LANES")
}

/// `y[op, ch] = sum_t x[window(op) + tap t, ch] * w[t, ch]` over the taps inside the
/// image (every element written), read from the unpadded image: the output pixels whose
/// whole window lies inside it run with no checks, the others (the border) tap by tap.
/// The interior sums the taps in order, as a zero-padded copy would; a border pixel leaves
/// out the taps that would read padding.
#[inline(always)]
pub(super) fn forward_direct<T: F>(g: &Geom, x: &[T], w: &[T], y: &mut [T]) {
    let (c, xd, o, s, d, k) = (g.cin, g.x, g.o, g.s, g.d, g.k);
    let p = g.p.map(|(before, _)| before as isize);
    assert!(w.len() >= TAPS * c, "depthwise kernel length");
    assert!(
        x.len() >= xd.iter().product::<usize>() * c,
        "depthwise image length"
    );
    assert!(
        y.len() >= o.iter().product::<usize>() * c,
        "depthwise output length"
    );
    // Tap t's position in the window, and its element offset from tap 0's pixel.
    let at: [[usize; 3]; TAPS] =
        std::array::from_fn(|t| [t / (k[1] * k[2]), (t / k[2]) % k[1], t % k[2]]);
    let off = at.map(|[ka, kb, kc]| ((ka * d[0] * xd[1] + kb * d[1]) * xd[2] + kc * d[2]) * c);
    let inside = |t: usize, i: isize| i >= 0 && (i as usize) < xd[t];
    // Whether all of a window's taps along dim `t` lie inside, from its first tap's index.
    let window_inside =
        |t: usize, i: isize| inside(t, i) && inside(t, i + ((k[t] - 1) * d[t]) as isize);
    // The output pixels along the last dim whose windows lie inside: `[lo, hi)`.
    let lo = (0..o[2]).find(|&q| window_inside(2, (q * s[2]) as isize - p[2]));
    let (lo, hi) = match lo {
        Some(lo) => (
            lo,
            (lo..o[2])
                .take_while(|&q| window_inside(2, (q * s[2]) as isize - p[2]))
                .last()
                .map_or(lo, |q| q + 1),
        ),
        None => (o[2], o[2]),
    };
    // Per output pixel along the last dim, and per output row, the taps that lie inside
    // the image along those dims (bit t for tap t).
    let mask =
        |f: &dyn Fn(usize) -> bool| (0..TAPS).filter(|&t| f(t)).fold(0u16, |m, t| m | 1 << t);
    let col_masks: Vec<u16> = (0..o[2])
        .map(|q| mask(&|t| inside(2, (q * s[2] + at[t][2] * d[2]) as isize - p[2])))
        .collect();
    let last = off.iter().copied().max().unwrap_or(0);
    let step = s[2] * c;
    for a in 0..o[0] {
        let ia = (a * s[0]) as isize - p[0];
        for b in 0..o[1] {
            let ib = (b * s[1]) as isize - p[1];
            let row_mask = mask(&|t| {
                inside(0, ia + (at[t][0] * d[0]) as isize)
                    && inside(1, ib + (at[t][1] * d[1]) as isize)
            });
            let orow = (a * o[1] + b) * o[2] * c;
            // Tap 0's element of output pixel 0: outside the image where the window
            // starts in the padding.
            let tap0 = ((ia * xd[1] as isize + ib) * xd[2] as isize - p[2]) * c as isize;
            // The row's interior pixels: none where the window leaves the image along the
            // first two dims.
            let (lo, hi) = if window_inside(0, ia) && window_inside(1, ib) {
                let first = (tap0 + (lo * step) as isize) as usize;
                assert!(
                    lo >= hi || first + (hi - 1 - lo) * step + last + c <= x.len(),
                    "depthwise row in bounds"
                );
                (lo, hi)
            } else {
                (o[2], o[2])
            };
            for ch in (0..c).step_by(LANES) {
                // A loop, not `array::from_fn`: its closure, left out of line, is compiled
                // without this kernel's AVX-512 and copies the vectors through memory
                // (MobileNetV2's `predict` at batch 32, one thread: 7% of its time).
                let mut wv = [[T::zero(); LANES]; TAPS];
                for (t, v) in wv.iter_mut().enumerate() {
                    *v = *lanes(w, t * c + ch);
                }
                let (xs, ys) = (x.as_ptr(), y[orow + ch..].as_mut_ptr());
                for q in (0..lo).chain(hi..o[2]) {
                    let m = row_mask & col_masks[q];
                    let e = tap0 + (q * step + ch) as isize;
                    let mut acc = [T::zero(); LANES];
                    for t in 0..TAPS {
                        if m >> t & 1 != 0 {
                            let i = (e + off[t] as isize) as usize;
                            debug_assert!(i + LANES <= x.len());
                            // SAFETY: tap t of this pixel lies inside the image (its bit of
                            // `m`), so its `LANES` channels from `ch` lie inside `x`.
                            let xv = unsafe { load(xs.add(i)) };
                            for j in 0..LANES {
                                acc[j] += xv[j] * wv[t][j];
                            }
                        }
                    }
                    *lanes_mut(y, orow + q * c + ch) = acc;
                }
                if lo >= hi {
                    continue;
                }
                let xs = x[(tap0 + (lo * step + ch) as isize) as usize..].as_ptr();
                for q in lo..hi {
                    let mut acc = [T::zero(); LANES];
                    for t in 0..TAPS {
                        // SAFETY: the row's check above bounds every tap of its interior
                        // pixels.
                        let xv = unsafe { load(xs.add((q - lo) * step + off[t])) };
                        for j in 0..LANES {
                            acc[j] += xv[j] * wv[t][j];
                        }
                    }
                    // SAFETY: `y` holds the rows' outputs (checked on entry).
                    unsafe { std::ptr::write_unaligned(ys.add(q * c) as *mut [T; LANES], acc) };
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
    if wk.o[2] == 0 {
        return;
    }
    let row_bytes = (wk.o[2] + wk.s[1] * wk.pd[2]) * c * std::mem::size_of::<T>();
    let band = (BAND_BYTES / row_bytes.max(1)).clamp(1, rows.max(1));
    for r0 in (0..rows).step_by(band) {
        kernel_band(&wk, r0..(r0 + band).min(rows), xp, gy, dw);
    }
}

/// `kernel_rows` over output rows `band` (flat over the first two output dims).
#[inline(always)]
fn kernel_band<T: F>(wk: &Walk3, band: std::ops::Range<usize>, xp: &[T], gy: &[T], dw: &mut [T]) {
    let (c, step) = (wk.c, wk.s[2] * wk.c);
    for ch in (0..c).step_by(LANES) {
        let mut acc = [[T::zero(); LANES]; TAPS];
        for r in band.clone() {
            let (orow, irow) = wk.checked_row(r / wk.o[1], r % wk.o[1], xp.len(), gy.len());
            let (xs, gs) = (xp[irow + ch..].as_ptr(), gy[orow + ch..].as_ptr());
            for px in 0..wk.o[2] {
                // SAFETY: `checked_row` bounds the row's output gradient and every tap of
                // its pixels.
                let gv = unsafe { load(gs.add(px * c)) };
                for (t, at) in acc.iter_mut().enumerate() {
                    // SAFETY: as above.
                    let xv = unsafe { load(xs.add(px * step + wk.off[t])) };
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
