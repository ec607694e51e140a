//! The depthwise convolution (one channel per group, multiplier 1) of a 3x3 window over
//! channels a multiple of `LANES`, read from the unpadded image (`Walk`): the output
//! pixels whose whole window lies inside it run with no checks, the border ones sum the
//! taps inside it. The forward keeps the window's 9 kernel vectors in registers: for each
//! output row and block of `LANES` channels they are loaded once and used across the
//! row's pixels (the general loop, `depthwise_fwd_blocked`, reloads them for every pixel).
//! At stride 1 the input gradient is such a forward too: of the output gradient, padded
//! by `(k - 1) * d - p`, with the taps in reverse order (`input_as_forward`). The kernel
//! gradient walks bands of output rows with the window's 9 sums in registers
//! (`kernel_direct`).

use super::*;

/// Channels summed in registers at a time: one AVX-512 vector of f32.
pub(super) const LANES: usize = 16;

/// Taps of the kernels specialised here (a 3x3 window).
pub(super) const TAPS: usize = 9;

/// Whether `forward_direct` runs this depthwise convolution.
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

/// The output-pixel walk over an unpadded image: where each tap reads, and which output
/// pixels read only inside the image.
struct Walk {
    xd: [usize; 3],
    o: [usize; 3],
    k: [usize; 3],
    s: [usize; 3],
    d: [usize; 3],
    p: [isize; 3],
    c: usize,
    /// Tap t's position in the window.
    at: [[usize; 3]; TAPS],
    /// Tap t's element offset from tap 0's, in a window inside the image.
    off: [usize; TAPS],
    /// The output pixels along the last dim whose windows lie inside the image along it.
    lo: usize,
    hi: usize,
    /// Per output pixel along the last dim: the taps inside the image along it (bit t).
    col_masks: Vec<u16>,
}

/// One output row (the first two output dims fixed) of a `Walk`.
struct Row {
    /// The row's first output element.
    out: usize,
    /// Tap 0's element of the row's output pixel 0 (negative or past the image where the
    /// window starts in the padding).
    tap0: isize,
    /// The taps inside the image along the first two dims (bit t).
    mask: u16,
    /// The row's pixels whose windows lie inside the image: `[lo, hi)` (empty where the
    /// window leaves it along the first two dims).
    lo: usize,
    hi: usize,
}

impl Walk {
    /// The walk of `g` over an image of `x_len` elements and an output of `y_len`: panics
    /// where either is shorter than the geometry says, so that the rows' loops may load
    /// without checks.
    fn new(g: &Geom, x_len: usize, y_len: usize) -> Walk {
        let (c, xd, o, s, d, k) = (g.cin, g.x, g.o, g.s, g.d, g.k);
        assert!(
            x_len >= xd.iter().product::<usize>() * c,
            "depthwise image length"
        );
        assert!(
            y_len >= o.iter().product::<usize>() * c,
            "depthwise output length"
        );
        let at: [[usize; 3]; TAPS] =
            std::array::from_fn(|t| [t / (k[1] * k[2]), (t / k[2]) % k[1], t % k[2]]);
        let off = at.map(|[ka, kb, kc]| ((ka * d[0] * xd[1] + kb * d[1]) * xd[2] + kc * d[2]) * c);
        let mut w = Walk {
            xd,
            o,
            k,
            s,
            d,
            p: g.p.map(|(before, _)| before as isize),
            c,
            at,
            off,
            lo: 0,
            hi: 0,
            col_masks: Vec::new(),
        };
        let inside: Vec<bool> = (0..o[2])
            .map(|q| w.window_inside(2, (q * s[2]) as isize - w.p[2]))
            .collect();
        w.lo = inside.iter().position(|&i| i).unwrap_or(o[2]);
        w.hi = (w.lo..o[2]).find(|&q| !inside[q]).unwrap_or(o[2]);
        w.col_masks = (0..o[2])
            .map(|q| w.mask(|t| w.inside(2, (q * s[2] + at[t][2] * d[2]) as isize - w.p[2])))
            .collect();
        w
    }
    fn inside(&self, dim: usize, i: isize) -> bool {
        i >= 0 && (i as usize) < self.xd[dim]
    }
    /// Whether all of a window's taps along `dim` lie inside, from its first tap's index.
    fn window_inside(&self, dim: usize, i: isize) -> bool {
        let last = ((self.k[dim] - 1) * self.d[dim]) as isize;
        self.inside(dim, i) && self.inside(dim, i + last)
    }
    fn mask(&self, f: impl Fn(usize) -> bool) -> u16 {
        (0..TAPS).filter(|&t| f(t)).fold(0, |m, t| m | 1 << t)
    }
    /// Output row `(a, b)`.
    #[inline(always)]
    fn row(&self, a: usize, b: usize) -> Row {
        let (xd, s, d, p, c, at) = (&self.xd, &self.s, &self.d, &self.p, self.c, &self.at);
        let (ia, ib) = ((a * s[0]) as isize - p[0], (b * s[1]) as isize - p[1]);
        let mask = self.mask(|t| {
            self.inside(0, ia + (at[t][0] * d[0]) as isize)
                && self.inside(1, ib + (at[t][1] * d[1]) as isize)
        });
        let tap0 = ((ia * xd[1] as isize + ib) * xd[2] as isize - p[2]) * c as isize;
        let (lo, hi) = if self.window_inside(0, ia) && self.window_inside(1, ib) {
            (self.lo, self.hi)
        } else {
            (self.o[2], self.o[2])
        };
        Row {
            out: (a * self.o[1] + b) * self.o[2] * c,
            tap0,
            mask,
            lo,
            hi,
        }
    }
    /// Output row number `r` (over the first two output dims).
    #[inline(always)]
    fn row_at(&self, r: usize) -> Row {
        self.row(r / self.o[1], r % self.o[1])
    }
    /// The element of channel `ch` of tap 0 for the row's pixel `q`.
    #[inline(always)]
    fn tap0(&self, row: &Row, q: usize, ch: usize) -> isize {
        row.tap0 + (q * self.s[2] * self.c + ch) as isize
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
/// image (every element written). The interior sums the taps in order, as a zero-padded
/// copy would; a border pixel leaves out the taps that would read padding.
#[inline(always)]
pub(super) fn forward_direct<T: F>(g: &Geom, x: &[T], w: &[T], y: &mut [T]) {
    let wk = Walk::new(g, x.len(), y.len());
    let (c, off) = (wk.c, &wk.off);
    assert!(w.len() >= TAPS * c, "depthwise kernel length");
    for a in 0..wk.o[0] {
        for b in 0..wk.o[1] {
            let row = wk.row(a, b);
            for ch in (0..c).step_by(LANES) {
                // A loop, not `array::from_fn`: its closure, left out of line, is compiled
                // without this kernel's AVX-512 and copies the vectors through memory
                // (MobileNetV2's `predict` at batch 32, one thread: 7% of its time).
                let mut wv = [[T::zero(); LANES]; TAPS];
                for (t, v) in wv.iter_mut().enumerate() {
                    *v = *lanes(w, t * c + ch);
                }
                let (xs, ys) = (x.as_ptr(), y[row.out + ch..].as_mut_ptr());
                for q in (0..row.lo).chain(row.hi..wk.o[2]) {
                    let m = row.mask & wk.col_masks[q];
                    let e = wk.tap0(&row, q, ch);
                    let mut acc = [T::zero(); LANES];
                    for t in 0..TAPS {
                        if m >> t & 1 != 0 {
                            // SAFETY: tap t of this pixel lies inside the image (its bit
                            // of `m`), so its `LANES` channels from `ch` lie inside `x`
                            // (`Walk::new`).
                            let xv = unsafe { load(xs.offset(e + off[t] as isize)) };
                            for j in 0..LANES {
                                acc[j] += xv[j] * wv[t][j];
                            }
                        }
                    }
                    *lanes_mut(y, row.out + q * c + ch) = acc;
                }
                for q in row.lo..row.hi {
                    let e = wk.tap0(&row, q, ch);
                    let mut acc = [T::zero(); LANES];
                    for t in 0..TAPS {
                        // SAFETY: every tap of an interior pixel lies inside the image.
                        let xv = unsafe { load(xs.offset(e + off[t] as isize)) };
                        for j in 0..LANES {
                            acc[j] += xv[j] * wv[t][j];
                        }
                    }
                    // SAFETY: `y` holds the row's outputs (`Walk::new`).
                    unsafe { std::ptr::write_unaligned(ys.add(q * c) as *mut [T; LANES], acc) };
                }
            }
        }
    }
}

/// Bytes of one band of output rows `kernel_direct` walks for every block of channels in
/// turn (the rows' output gradient and the input rows under them): the band stays in L2
/// while each block of `LANES` channels reads its 64-byte runs of it. Over the whole
/// image at once, a block of a large image re-read it from L3 or memory (one thread,
/// batch 8, 32x32x144: 3.4 ms a call).
const BAND_BYTES: usize = 192 << 10;

/// Most channels `kernel_direct` takes for an image that fits one band: with more, the loop
/// over pixels and taps with all the channels at once does better (one thread, batch 8:
/// 16x16x192 0.35 against 0.43-0.49 ms; at 16-32 channels `kernel_direct` takes half the
/// time, at 64 the two are level).
const KERNEL_MAX_CHANNELS: usize = 64;

/// Whether `kernel_direct` runs this depthwise kernel gradient: where `applies`, with few
/// channels or an image larger than a band.
pub(super) fn kernel_applies<T>(g: &Geom) -> bool {
    let image = (g.opix() + g.xpix()) * g.cin * std::mem::size_of::<T>();
    applies(g) && (g.cin <= KERNEL_MAX_CHANNELS || image > BAND_BYTES)
}

/// `dw[t, ch] += sum_op gy[op, ch] * x[window(op) + tap t, ch]` over the taps inside the
/// image, where `applies`: over bands of output rows (`BAND_BYTES`), for each block of
/// `LANES` channels the nine sums stay in registers over the band and are added into `dw`
/// once. Each row's pixels are taken in order, so the sums are those over a zero-padded
/// copy with the padding's terms left out.
#[inline(always)]
pub(super) fn kernel_direct<T: F>(g: &Geom, x: &[T], gy: &[T], dw: &mut [T]) {
    let wk = Walk::new(g, x.len(), gy.len());
    let (c, o) = (wk.c, wk.o);
    assert!(dw.len() >= TAPS * c, "depthwise kernel gradient length");
    let rows = o[0] * o[1];
    let row_bytes = (o[2] + wk.s[1] * wk.xd[2]) * c * std::mem::size_of::<T>();
    let band = (BAND_BYTES / row_bytes.max(1)).clamp(1, rows.max(1));
    for r0 in (0..rows).step_by(band) {
        for ch in (0..c).step_by(LANES) {
            let mut acc = [[T::zero(); LANES]; TAPS];
            for r in r0..(r0 + band).min(rows) {
                let row = wk.row_at(r);
                let gs = &gy[row.out + ch..];
                kernel_pixels::<T, true>(&wk, &row, 0..row.lo, ch, x, gs, &mut acc);
                kernel_pixels::<T, false>(&wk, &row, row.lo..row.hi, ch, x, gs, &mut acc);
                kernel_pixels::<T, true>(&wk, &row, row.hi..o[2], ch, x, gs, &mut acc);
            }
            for (t, at) in acc.iter().enumerate() {
                let d = lanes_mut(dw, t * c + ch);
                for j in 0..LANES {
                    d[j] += at[j];
                }
            }
        }
    }
}

/// `kernel_direct`'s sums over pixels `qs` of a row, whose output gradient from channel
/// `ch` starts `gs`: the taps each pixel's mask selects (`MASKED`), or all of them (the
/// row's interior).
#[inline(always)]
fn kernel_pixels<T: F, const MASKED: bool>(
    wk: &Walk,
    row: &Row,
    qs: std::ops::Range<usize>,
    ch: usize,
    x: &[T],
    gs: &[T],
    acc: &mut [[T; LANES]; TAPS],
) {
    let xs = x.as_ptr();
    for q in qs {
        let gv = *lanes(gs, q * wk.c);
        let e = wk.tap0(row, q, ch);
        let m = row.mask & wk.col_masks[q];
        for (t, at) in acc.iter_mut().enumerate() {
            if !MASKED || m >> t & 1 != 0 {
                // SAFETY: tap t of this pixel lies inside the image (its bit of `m`; every
                // tap of an interior pixel), so its `LANES` channels from `ch` lie inside
                // `x` (`Walk::new`).
                let xv = unsafe { load(xs.offset(e + wk.off[t] as isize)) };
                for j in 0..LANES {
                    at[j] += gv[j] * xv[j];
                }
            }
        }
    }
}
