//! CPU kernels of the three convolution primitives, chosen per shape:
//!
//! - 2-D 3x3, stride 1, one group, 16+ channels each side: Winograd F(2x2, 3x3) in
//!   `winograd.rs` (forward, and the input gradient, which is such a convolution too).
//! - other one-group convolutions: im2col from a zero-padded copy of each image, where a
//!   window row along the last dim is one contiguous `kernel_width * channels` segment
//!   (`Segments`), into a cache-sized tile; then one `gemm` per tile with
//!   `k = prod(kernel) * channels` (a 1x1 unpadded convolution is one `gemm` on the input
//!   itself). The same segments serve the kernel gradient at any stride (`colsᵀ · gy`) and
//!   the input gradient (`gy · wᵀ` added back along them, col2im) where the stride is not
//!   1 or the input has fewer than 16 channels; at stride 1 with 16+ input channels the
//!   input gradient is the forward convolution of the output gradient with the flipped,
//!   transposed kernel.
//! - kernel gradient, stride 1, one group: "shifted GEMM". For each kernel offset, the
//!   rows of the padded image starting at that offset *are* the im2col rows (with a few
//!   junk rows where a window wraps around a row end, whose output gradient is zero), so
//!   each offset is one strided `gemm` with a long `k` and no im2col copy.
//! - one input channel per group (depthwise): direct loops over a zero-padded copy of each
//!   image, output row by row, vectorised over channels.
//! - otherwise: im2col (or col2im) of a tile of output rows and one `gemm` per group.
//!
//! All three parallelise over images when there are at least as many images as threads,
//! else inside `gemm`. Spatial dims are canonicalised to three (leading dims of size 1).
//! f16 is computed in f32.

use super::{out_len, winograd, ConvSpec};
use crate::base::error::{Error, Result};
use crate::base::value::{Arr, Elem, Value};
use crate::value_err;
use gemm::Parallelism;
use num_traits::Float;
use rayon::prelude::*;

/// Element types the kernels compute in.
pub trait F: Float + Elem + Send + Sync + std::iter::Sum + std::ops::AddAssign {}
impl F for f32 {}
impl F for f64 {}

/// The geometry of one convolution, spatial dims canonicalised to three.
#[derive(Clone, Debug)]
pub struct Geom {
    pub n: usize,
    pub x: [usize; 3],
    pub k: [usize; 3],
    pub o: [usize; 3],
    pub s: [usize; 3],
    pub d: [usize; 3],
    pub p: [(usize, usize); 3],
    pub cin: usize,
    pub cout: usize,
    pub groups: usize,
    pub x_shape: Vec<usize>,
    pub w_shape: Vec<usize>,
    pub y_shape: Vec<usize>,
}

impl Geom {
    /// From runtime input and kernel shapes; `y` (when given) is checked against the output.
    pub fn new(spec: &ConvSpec, xs: &[usize], ws: &[usize], y: Option<&[usize]>) -> Result<Geom> {
        let n = spec.nsp();
        if xs.len() != n + 2 || ws.len() != n + 2 {
            return Err(value_err!(
                "conv: shapes {xs:?} and {ws:?} do not have rank {}",
                n + 2
            ));
        }
        let (cin, cout) = (xs[n + 1], ws[n + 1]);
        if cin != ws[n] * spec.groups || cout % spec.groups != 0 {
            return Err(value_err!(
                "conv: input shape {xs:?} does not match kernel shape {ws:?} with {} groups",
                spec.groups
            ));
        }
        let mut g = Geom {
            n: xs[0],
            x: [1; 3],
            k: [1; 3],
            o: [1; 3],
            s: [1; 3],
            d: [1; 3],
            p: [(0, 0); 3],
            cin,
            cout,
            groups: spec.groups,
            x_shape: xs.to_vec(),
            w_shape: ws.to_vec(),
            y_shape: vec![],
        };
        let lead = 3 - n;
        for i in 0..n {
            let (x, k, s, d) = (xs[1 + i], ws[i], spec.strides[i], spec.dilation[i]);
            let eff = d * (k - 1) + 1;
            let p = spec.padding.resolve(i, x, eff, s);
            let o = out_len(x, eff, s, p).ok_or_else(|| {
                value_err!(
                    "conv: spatial dim {i} of size {x} is smaller than the dilated kernel ({eff})"
                )
            })?;
            (
                g.x[lead + i],
                g.k[lead + i],
                g.o[lead + i],
                g.s[lead + i],
                g.d[lead + i],
                g.p[lead + i],
            ) = (x, k, o, s, d, p);
        }
        g.y_shape = std::iter::once(g.n)
            .chain(g.o[lead..].iter().copied())
            .chain([cout])
            .collect();
        if let Some(y) = y {
            if y != g.y_shape.as_slice() {
                return Err(value_err!(
                    "conv: a gradient of shape {y:?} does not match the convolution output {:?} of input {xs:?}",
                    g.y_shape
                ));
            }
        }
        Ok(g)
    }
    fn cg(&self) -> usize {
        self.cin / self.groups
    }
    fn og(&self) -> usize {
        self.cout / self.groups
    }
    pub(crate) fn kk(&self) -> usize {
        self.k.iter().product()
    }
    pub(crate) fn xpix(&self) -> usize {
        self.x.iter().product()
    }
    pub(crate) fn opix(&self) -> usize {
        self.o.iter().product()
    }
    /// The window walk of this convolution (one group), for the dense kernels.
    fn walk(&self) -> Walk<'_> {
        Walk {
            x: &self.x,
            k: &self.k,
            s: &self.s,
            d: &self.d,
            p: &self.p,
            cin: self.cin,
            cout: self.cout,
        }
    }
    fn unit_stride(&self) -> bool {
        self.s == [1; 3]
    }
    /// Input index along dim `t` for output index `o` and kernel index `k`, if in bounds.
    #[inline(always)]
    fn src(&self, t: usize, o: usize, k: usize) -> Option<usize> {
        (o * self.s[t] + k * self.d[t])
            .checked_sub(self.p[t].0)
            .filter(|&i| i < self.x[t])
    }
    /// Input pixel (flat) read by output pixel `op` at kernel offset `kp`, if any.
    #[inline(always)]
    pub(crate) fn src_pix(&self, op: usize, kp: usize) -> Option<usize> {
        let (o2, o1, o0) = (
            op % self.o[2],
            (op / self.o[2]) % self.o[1],
            op / (self.o[2] * self.o[1]),
        );
        let (k2, k1, k0) = (
            kp % self.k[2],
            (kp / self.k[2]) % self.k[1],
            kp / (self.k[2] * self.k[1]),
        );
        Some(
            (self.src(0, o0, k0)? * self.x[1] + self.src(1, o1, k1)?) * self.x[2]
                + self.src(2, o2, k2)?,
        )
    }
}

/// Defines `fn $name<T: $bound>(args)` that runs `$kernel(args)` compiled for the widest
/// vector unit the CPU has (AVX-512F, else AVX2 + FMA, else the build's baseline, SSE2 on
/// x86-64), chosen at run time. The crate is built for the baseline, so a kernel's loops
/// vectorise wider only where they are inlined into one of these copies: `$kernel` and the
/// helpers its loops call must be `#[inline(always)]`, and its loops should not sit in
/// closures (a closure called from three copies is not inlined).
macro_rules! simd_kernel {
    ($vis:vis fn $name:ident<$t:ident: $bound:path>($($a:ident: $ty:ty),* $(,)?) = $kernel:ident) => {
        $vis fn $name<$t: $bound>($($a: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn v4<$t: $bound>($($a: $ty),*) {
                    $kernel($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3<$t: $bound>($($a: $ty),*) {
                    $kernel($($a),*)
                }
                if is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has the features `v4` is compiled for.
                    return unsafe { v4($($a),*) };
                }
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    // SAFETY: as above, for `v3`.
                    return unsafe { v3($($a),*) };
                }
            }
            $kernel($($a),*)
        }
    };
}
pub(crate) use simd_kernel;

// ---------------------------------------------------------------- dtype dispatch

/// `zero`: whether the kernel needs its output zeroed (it accumulates), else it writes
/// every element.
fn run2(
    a: &Value,
    b: &Value,
    shape: &[usize],
    zero: bool,
    f32k: impl Fn(&[f32], &[f32], &mut [f32]),
    f64k: impl Fn(&[f64], &[f64], &mut [f64]),
) -> Result<Value> {
    let len = shape.iter().product();
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => Ok(go(x, y, shape, len, zero, f32k)),
        (Value::F64(x), Value::F64(y)) => Ok(go(x, y, shape, len, zero, f64k)),
        (Value::F16(_), Value::F16(_)) => {
            let (Value::F32(x), Value::F32(y)) = (
                a.cast(crate::base::dtype::DType::F32),
                b.cast(crate::base::dtype::DType::F32),
            ) else {
                unreachable!("cast to f32")
            };
            Ok(go(&x, &y, shape, len, zero, f32k).cast(crate::base::dtype::DType::F16))
        }
        _ => Err(Error::Type(format!(
            "conv: operands must be float tensors of one dtype, got {} and {}",
            a.dtype(),
            b.dtype()
        ))),
    }
}

fn go<T: F>(
    a: &Arr<T>,
    b: &Arr<T>,
    shape: &[usize],
    len: usize,
    zero: bool,
    k: impl Fn(&[T], &[T], &mut [T]),
) -> Value {
    let (a, b) = (a.as_standard_layout(), b.as_standard_layout());
    let mut out = if zero {
        vec![T::zero(); len]
    } else {
        crate::base::value::uninit(len)
    };
    k(
        a.as_slice().expect("standard"),
        b.as_slice().expect("standard"),
        &mut out,
    );
    Value::from_vec(shape, out).expect("shape matches")
}

pub fn forward(g: &Geom, x: &Value, w: &Value) -> Result<Value> {
    run2(
        x,
        w,
        &g.y_shape,
        false,
        |x, w, y| fwd(g, x, w, y, None),
        |x, w, y| fwd(g, x, w, y, None),
    )
}

/// The f32 forward convolution into `y` (every element written), calling `after(i)` once
/// image `i` of `y` is complete, on the thread that computed it (while it is in cache: a
/// fused elementwise group reading the result runs there, see `fused::run`).
pub fn forward_f32_then(
    g: &Geom,
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    after: &(dyn Fn(usize) + Sync),
) {
    fwd(g, x, w, y, Some(after))
}

pub fn input_grad(g: &Geom, gy: &Value, w: &Value) -> Result<Value> {
    // The groups=1 and depthwise paths write every element; the grouped ones add into a
    // zeroed `dx`.
    let zero = g.groups != 1 && g.cg() != 1;
    run2(
        gy,
        w,
        &g.x_shape,
        zero,
        |gy, w, dx| bwd_input(g, gy, w, dx),
        |gy, w, dx| bwd_input(g, gy, w, dx),
    )
}
pub fn kernel_grad(g: &Geom, x: &Value, gy: &Value) -> Result<Value> {
    run2(
        x,
        gy,
        &g.w_shape,
        true,
        |x, gy, dw| bwd_kernel(g, x, gy, dw),
        |x, gy, dw| bwd_kernel(g, x, gy, dw),
    )
}

// ---------------------------------------------------------------- scheduling

fn threads() -> usize {
    rayon::current_num_threads()
}

/// Per-thread buffers a kernel keeps across the images it runs (padded image, im2col
/// tile, ...), so only the first image of a thread allocates. Within one kernel call the
/// geometry is fixed, so zero borders written once stay zero.
#[derive(Default)]
pub struct Scratch<T> {
    pub a: Vec<T>,
    pub b: Vec<T>,
    pub c: Vec<T>,
}

/// `buf` resized to `len` elements; zero-filled only when its size changes.
pub fn sized<T: F>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() != len {
        buf.clear();
        buf.resize(len, T::zero());
    }
    buf
}

/// Runs `f(image, out_chunk, scratch, parallelism)` for every image: images in parallel
/// when there are enough of them, else one after another with a parallel `gemm` inside.
/// `after(image)` runs once the image's chunk is written.
fn per_image<T: F>(
    n: usize,
    out: &mut [T],
    after: Option<&(dyn Fn(usize) + Sync)>,
    f: impl Fn(usize, &mut [T], &mut Scratch<T>, Parallelism) + Sync,
) {
    if n == 0 || out.is_empty() {
        return;
    }
    let chunk = out.len() / n;
    let then = |i: usize| {
        if let Some(a) = after {
            a(i)
        }
    };
    if n >= threads() && n > 1 {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each_init(Scratch::default, |sc, (i, o)| {
                f(i, o, sc, Parallelism::None);
                then(i);
            });
    } else {
        let mut sc = Scratch::default();
        out.chunks_mut(chunk).enumerate().for_each(|(i, o)| {
            f(i, o, &mut sc, Parallelism::Rayon(threads()));
            then(i);
        });
    }
}

/// Sums `f(image, acc, scratch, parallelism)` over images into `out` (the kernel gradient).
fn sum_images<T: F>(
    n: usize,
    out: &mut [T],
    f: impl Fn(usize, &mut [T], &mut Scratch<T>, Parallelism) + Sync,
) {
    if n >= threads() && n > 1 {
        let len = out.len();
        let per = n.div_ceil(threads());
        let parts: Vec<Vec<T>> = (0..n.div_ceil(per))
            .into_par_iter()
            .map(|t| {
                let (mut acc, mut sc) = (vec![T::zero(); len], Scratch::default());
                (t * per..((t + 1) * per).min(n))
                    .for_each(|i| f(i, &mut acc, &mut sc, Parallelism::None));
                acc
            })
            .collect();
        for p in parts {
            out.iter_mut().zip(p).for_each(|(o, v)| *o += v);
        }
    } else {
        let mut sc = Scratch::default();
        (0..n).for_each(|i| f(i, out, &mut sc, Parallelism::Rayon(threads())));
    }
}

/// `dst[m x n] (row stride drs) = [dst +] lhs[m x k] @ rhs[k x n]`, strides in elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm<T: F>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    drs: usize,
    acc: bool,
    lhs: &[T],
    l: (usize, usize),
    rhs: &[T],
    r: (usize, usize),
    par: Parallelism,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let par = if m * n * k < 1 << 18 {
        Parallelism::None
    } else {
        par
    };
    // Every access stays inside the slices: the last element each operand touches is
    // asserted here, so the unsafe call below cannot read or write out of bounds.
    assert!((m - 1) * drs + n <= dst.len());
    assert!((m - 1) * l.0 + (k - 1) * l.1 < lhs.len());
    assert!((k - 1) * r.0 + (n - 1) * r.1 < rhs.len());
    // SAFETY: bounds checked above; dst does not alias lhs or rhs (distinct borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            drs as isize,
            acc,
            lhs.as_ptr(),
            l.1 as isize,
            l.0 as isize,
            rhs.as_ptr(),
            r.1 as isize,
            r.0 as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

// ---------------------------------------------------------------- forward

fn fwd<T: F>(g: &Geom, x: &[T], w: &[T], y: &mut [T], after: Option<&(dyn Fn(usize) + Sync)>) {
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

/// A groups=1 convolution of `n` images: Winograd where it applies, else `segment_fwd`.
fn dense_fwd<T: F>(
    n: usize,
    wk: &Walk,
    x: &[T],
    w: &[T],
    y: &mut [T],
    after: Option<&(dyn Fn(usize) + Sync)>,
) {
    let xl = x.len() / n.max(1);
    if winograd::applies(wk) {
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

/// Where the im2col rows of a groups=1 convolution lie in a zero-padded copy of one image
/// (`pad_into`): each output pixel's window is `offs.len()` contiguous segments of `seg`
/// elements, one window row along the last dim (`kernel_width * cin`) where that dim is
/// not dilated, else one pixel's `cin` channels, in the kernel's `(k0, k1, k2, cin)` row
/// order, so column `j` of a row meets row `j` of the kernel.
struct Segments {
    pd: [usize; 3],
    o: [usize; 3],
    s: [usize; 3],
    cin: usize,
    offs: Vec<usize>,
    seg: usize,
}

impl Segments {
    fn new(wk: &Walk) -> Segments {
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
    fn width(&self) -> usize {
        self.offs.len() * self.seg
    }
    fn pixels(&self) -> usize {
        self.o.iter().product()
    }
    /// Output pixels per column tile: about 1 MiB of f32.
    fn tile(&self) -> usize {
        ((1usize << 18) / self.width().max(1))
            .max(16)
            .min(self.pixels().max(1))
    }
    /// Where output pixel `op`'s window starts in the padded image.
    fn base(&self, op: usize) -> usize {
        let (o, s, pd) = (&self.o, &self.s, &self.pd);
        let (c, b, a) = (op % o[2], (op / o[2]) % o[1], op / (o[2] * o[1]));
        ((a * s[0] * pd[1] + b * s[1]) * pd[2] + c * s[2]) * self.cin
    }
    /// The column rows of output pixels `r0..r0 + rows` into `col`.
    fn gather<T: F>(&self, xp: &[T], r0: usize, rows: usize, col: &mut [T]) {
        let (w, seg) = (self.width(), self.seg);
        for r in 0..rows {
            let base = self.base(r0 + r);
            for (dst, &off) in col[r * w..(r + 1) * w]
                .chunks_exact_mut(seg)
                .zip(&self.offs)
            {
                dst.copy_from_slice(&xp[base + off..base + off + seg]);
            }
        }
    }
    /// Adds column rows of output pixels `r0..r0 + rows` back into the padded image `xp`
    /// (col2im), one window after another, as overlapping windows require.
    fn scatter_add<T: F>(&self, col: &[T], r0: usize, rows: usize, xp: &mut [T]) {
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

/// One image of a groups=1 convolution: the column rows of a tile of output pixels
/// (`Segments::gather` from a padded copy of the image), then one `gemm` per tile with
/// `k = prod(kernel) * cin` written straight into `y`.
fn segment_fwd<T: F>(
    wk: &Walk,
    x: &[T],
    w: &[T],
    y: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let (cin, cout) = (wk.cin, wk.cout);
    let unpadded = wk.p.iter().all(|&(a, b)| a == 0 && b == 0);
    if wk.k.iter().product::<usize>() == 1 && *wk.s == [1; 3] && unpadded {
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
    pad_into(wk.x, wk.p, cin, x, &mut sc.a);
    let (ktot, tile, opix) = (sg.width(), sg.tile(), sg.pixels());
    let col = sized(&mut sc.b, tile * ktot);
    for r0 in (0..opix).step_by(tile) {
        let rows = tile.min(opix - r0);
        sg.gather(&sc.a, r0, rows, col);
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

/// Output rows per im2col tile: the column buffer stays within about 512 KiB of f32.
fn tile_rows(g: &Geom) -> usize {
    ((1usize << 17) / (g.kk() * g.cin).max(1))
        .max(8)
        .min(g.opix().max(1))
}

/// Columns `(rows, groups, kernel, cin / groups)` of output pixels `r0..r0 + rows`.
fn im2col<T: F>(g: &Geom, x: &[T], r0: usize, rows: usize, col: &mut [T]) {
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

/// Calls `f(op, ip, kp)` for every output pixel `op`, kernel offset `kp` and the pixel
/// `ip` of the zero-padded image (dims `pd`, `pad_into`) the window reads there: output
/// rows outermost, then kernel offsets, then the pixels along the row, so the depthwise
/// kernels below need no bounds and no index arithmetic per pixel.
#[inline(always)]
fn padded_walk(g: &Geom, pd: &[usize; 3], mut f: impl FnMut(usize, usize, usize)) {
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

simd_kernel!(fn depthwise_fwd<T: F>(g: &Geom, x: &[T], w: &[T], y: &mut [T], sc: &mut Scratch<T>) = depthwise_fwd_rows);

/// One input channel per group: `y[o, c*m + j] = sum_k x[i(o,k), c] * w[k, 0, c*m + j]`,
/// from a zero-padded copy of the image (every element of `y` written).
#[inline(always)]
fn depthwise_fwd_rows<T: F>(g: &Geom, x: &[T], w: &[T], y: &mut [T], sc: &mut Scratch<T>) {
    let (cin, cout, m) = (g.cin, g.cout, g.og());
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

// ---------------------------------------------------------------- input gradient

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

fn bwd_input<T: F>(g: &Geom, gy: &[T], w: &[T], dx: &mut [T]) {
    let (xl, yl) = (g.xpix() * g.cin, g.opix() * g.cout);
    match as_convolution(g) {
        Some(p2) if !col2im_input_first(g) => {
            let wf = flip_transpose(g, w);
            let wk = Walk {
                x: &g.o,
                k: &g.k,
                s: &[1; 3],
                d: &g.d,
                p: &p2,
                cin: g.cout,
                cout: g.cin,
            };
            dense_fwd(g.n, &wk, gy, &wf, dx, None);
        }
        _ if g.groups == 1 => per_image(g.n, dx, None, |i, dx, sc, par| {
            segment_input(g, &gy[i * yl..(i + 1) * yl], w, dx, sc, par)
        }),
        _ if g.cg() == 1 => per_image(g.n, dx, None, |i, dx, sc, _| {
            depthwise_input(g, &gy[i * yl..(i + 1) * yl], w, dx, sc)
        }),
        _ => per_image(g.n, dx, None, |i, dx, _, par| {
            col2im_input(g, &gy[i * yl..(i + 1) * yl], w, dx, par)
        }),
    }
    debug_assert_eq!(dx.len(), g.n * xl);
}

/// Whether a stride-1 groups=1 input gradient runs by col2im (`segment_input`) rather than
/// as the forward convolution of `gy` with the flipped kernel: when the latter's `gemm`
/// would write fewer than 16 columns (the input's channels) and Winograd does not apply.
fn col2im_input_first(g: &Geom) -> bool {
    g.groups == 1 && g.cin < 16
}

/// One image's input gradient of a groups=1 convolution by col2im: a tile's column rows
/// `gy · wᵀ` (one `gemm` with `n = prod(kernel) * cin`) added back along the forward's
/// window segments into a zeroed padded image, whose interior is `dx` (every element
/// written).
fn segment_input<T: F>(
    g: &Geom,
    gy: &[T],
    w: &[T],
    dx: &mut [T],
    sc: &mut Scratch<T>,
    par: Parallelism,
) {
    let sg = Segments::new(&g.walk());
    debug_assert_eq!(sg.o, g.o);
    let cout = g.cout;
    let xp = sized(&mut sc.a, sg.pd.iter().product::<usize>() * g.cin);
    xp.fill(T::zero());
    let (ktot, tile, opix) = (sg.width(), sg.tile(), sg.pixels());
    let col = sized(&mut sc.b, tile * ktot);
    for r0 in (0..opix).step_by(tile) {
        let rows = tile.min(opix - r0);
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
        sg.scatter_add(col, r0, rows, xp);
    }
    unpad(&g.x, &g.p, g.cin, xp, dx);
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

/// `w[k0, k1, k2, ci, co]` -> `w'[K0-1-k0, K1-1-k1, K2-1-k2, co, ci]`.
fn flip_transpose<T: F>(g: &Geom, w: &[T]) -> Vec<T> {
    let (kk, ci, co) = (g.kk(), g.cin, g.cout);
    let mut out = vec![T::zero(); w.len()];
    for kp in 0..kk {
        let src = &w[kp * ci * co..(kp + 1) * ci * co];
        let dst = &mut out[(kk - 1 - kp) * ci * co..(kk - kp) * ci * co];
        for i in 0..ci {
            for o in 0..co {
                dst[o * ci + i] = src[i * co + o];
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

/// Channels a depthwise forward sums in registers at a time.
const LANES: usize = 16;

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

simd_kernel!(fn depthwise_input<T: F>(g: &Geom, gy: &[T], w: &[T], dx: &mut [T], sc: &mut Scratch<T>) = depthwise_input_rows);

/// The depthwise input gradient, added into a zeroed padded image whose interior is `dx`
/// (every element written).
#[inline(always)]
fn depthwise_input_rows<T: F>(g: &Geom, gy: &[T], w: &[T], dx: &mut [T], sc: &mut Scratch<T>) {
    let (cin, cout, m) = (g.cin, g.cout, g.og());
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

// ---------------------------------------------------------------- kernel gradient

fn bwd_kernel<T: F>(g: &Geom, x: &[T], gy: &[T], dw: &mut [T]) {
    let (xl, yl) = (g.xpix() * g.cin, g.opix() * g.cout);
    let wk = g.walk();
    if g.groups == 1 && winograd::applies(&wk) {
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
