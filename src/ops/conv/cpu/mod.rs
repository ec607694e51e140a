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
//! - one group, 1, 16 or 32 f32 output channels on AVX-512, images enough for every
//!   thread (`narrow.rs`): the forward (outside Winograd, and not a pointwise product)
//!   and the kernel gradient (where columns would be gathered, or one output channel)
//!   read each window's taps from the padded image where they lie, with no column rows;
//!   a stride-1 input gradient with 1, 16 or 32 input channels runs as the flipped
//!   kernel's convolution through them.
//! - one input channel per group (depthwise): direct loops over a zero-padded copy of each
//!   image, output row by row, vectorised over channels; a 3x3 window with multiplier 1
//!   and channels a multiple of 16 reads the unpadded image instead (`depthwise.rs`): its
//!   forward keeps the 9 kernel vectors in registers along each row and serves as the
//!   stride-1 input gradient too, its kernel gradient keeps the 9 sums in registers.
//! - otherwise: im2col (or col2im) of a tile of output rows and one `gemm` per group.
//!
//! All three parallelise over images when there are at least as many images as threads,
//! else inside `gemm`. Spatial dims are canonicalised to three (leading dims of size 1).
//! f16 is computed in f32.

use super::{out_len, winograd, winograd1d, ConvSpec};
use crate::base::error::{Error, Result};
use crate::base::value::{Arr, Elem, Value};
use crate::ops::matmul::{copies_transposed, transposed_copies};
use crate::value_err;
use gemm::Parallelism;
use num_traits::Float;
use rayon::prelude::*;

mod depthwise;
mod forward;
mod im2col;
mod input_grad;
mod kernel_grad;
mod narrow;

use forward::fwd;
pub use im2col::{pad_into, Walk};
use input_grad::bwd_input;
use kernel_grad::bwd_kernel;

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
    per_run(n, 1, out, after, |i, _, o, sc, par| f(i, o, sc, par))
}

/// Runs `f(first image, images, out_chunk, scratch, parallelism)` for runs of `run`
/// consecutive images (the last run may be shorter): runs in parallel when there are
/// enough of them, else one after another with a parallel `gemm` inside. `after(image)`
/// runs for each image of a run once the run's chunk is written.
fn per_run<T: F>(
    n: usize,
    run: usize,
    out: &mut [T],
    after: Option<&(dyn Fn(usize) + Sync)>,
    f: impl Fn(usize, usize, &mut [T], &mut Scratch<T>, Parallelism) + Sync,
) {
    if n == 0 || out.is_empty() {
        return;
    }
    let (img, run) = (out.len() / n, run.clamp(1, n));
    let runs = n.div_ceil(run);
    if runs >= threads() && runs > 1 {
        out.par_chunks_mut(run * img)
            .enumerate()
            .for_each_init(Scratch::default, |sc, (r, o)| {
                let (i0, cnt) = (r * run, o.len() / img);
                f(i0, cnt, o, sc, Parallelism::None);
                if let Some(a) = after {
                    (i0..i0 + cnt).for_each(a);
                }
            });
    } else {
        let mut sc = Scratch::default();
        out.chunks_mut(run * img).enumerate().for_each(|(r, o)| {
            let (i0, cnt) = (r * run, o.len() / img);
            f(i0, cnt, o, &mut sc, Parallelism::Rayon(threads()));
            match after {
                Some(a) if cnt > 1 => (i0..i0 + cnt).into_par_iter().for_each(a),
                Some(a) => a(i0),
                None => {}
            }
        });
    }
}

/// Sums `f(image, acc, scratch, parallelism)` over images into `out` (the kernel gradient).
fn sum_images<T: F>(
    n: usize,
    out: &mut [T],
    f: impl Fn(usize, &mut [T], &mut Scratch<T>, Parallelism) + Sync,
) {
    sum_runs(n, 1, out, |i, _, acc, sc, par| f(i, acc, sc, par))
}

/// Sums `f(first image, images, acc, scratch, parallelism)` over runs of `run` consecutive
/// images into `out`: runs split between the threads when there are enough of them (each
/// thread summing into an accumulator of its own), else one after another with a parallel
/// `gemm` inside.
fn sum_runs<T: F>(
    n: usize,
    run: usize,
    out: &mut [T],
    f: impl Fn(usize, usize, &mut [T], &mut Scratch<T>, Parallelism) + Sync,
) {
    let run = run.clamp(1, n.max(1));
    let runs = n.div_ceil(run);
    let each = |r: usize| (r * run, run.min(n - r * run));
    if runs >= threads() && runs > 1 {
        let len = out.len();
        let per = runs.div_ceil(threads());
        let parts: Vec<Vec<T>> = (0..runs.div_ceil(per))
            .into_par_iter()
            .map(|t| {
                let (mut acc, mut sc) = (vec![T::zero(); len], Scratch::default());
                (t * per..((t + 1) * per).min(runs)).for_each(|r| {
                    let (i0, cnt) = each(r);
                    f(i0, cnt, &mut acc, &mut sc, Parallelism::None)
                });
                acc
            })
            .collect();
        for p in parts {
            out.iter_mut().zip(p).for_each(|(o, v)| *o += v);
        }
    } else {
        let mut sc = Scratch::default();
        (0..runs).for_each(|r| {
            let (i0, cnt) = each(r);
            f(i0, cnt, out, &mut sc, Parallelism::Rayon(threads()))
        });
    }
}

/// Output pixels one `gemm` of a run of small images aims at: below this many per image,
/// a `gemm` per image has few rows and packs the whole kernel again for each image, so
/// consecutive images share one (`run_len`).
const RUN_ROWS: usize = 256;

/// Images per run for `n` images of `pix` output pixels (1: one image at a time).
fn run_len(pix: usize, n: usize) -> usize {
    RUN_ROWS.div_ceil(pix.max(1)).clamp(1, n.max(1))
}

/// Whether an image of `pix` output pixels is small: fewer than `RUN_ROWS`, so a `gemm`
/// per image has few rows (runs of such images share one, `run_len`).
fn small(pix: usize) -> bool {
    pix < RUN_ROWS
}

/// The least output channels for which a 1x1 kernel gradient `xᵀ · gy` copies `xᵀ`
/// transposed (where `matmul::copies_transposed` says so): on an AMD EPYC, one thread,
/// 8x16x16x512 -> 128 read 5.1-5.3 ms in place against 6.0-6.6 copied, while 8x8x8x1024
/// -> 256 gained (6.6 -> 5.6 ms for both gradients).
const COPY_X_MIN_REUSE: usize = 256;

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
    if narrow::applies::<T>(m, n, k, l) {
        return narrow::narrow(m, n, k, dst, drs, acc, lhs, l.0, rhs, r, par);
    }
    // A transposed operand stored with long rows, over a long contraction (a 1x1
    // convolution's `gy · wᵀ` or `xᵀ · gy` with 512+ channels), is copied transposed
    // first where `gemm` packs it slowly (`matmul::copies_transposed`). The image side
    // `xᵀ` is as large as the product's input, so its copy pays only where it serves
    // `COPY_X_MIN_REUSE` output channels or more.
    let (lcopy, rcopy): (Vec<T>, Vec<T>);
    let (lhs, l) = if l == (1, m) && n >= COPY_X_MIN_REUSE && copies_transposed(k, n, m) {
        lcopy = transposed_copies(lhs, &[0], k, m).0;
        (&lcopy[..], (k, 1))
    } else {
        (lhs, l)
    };
    let (rhs, r) = if r == (1, k) && copies_transposed(k, m, k) {
        rcopy = transposed_copies(rhs, &[0], n, k).0;
        (&rcopy[..], (n, 1))
    } else {
        (rhs, r)
    };
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
