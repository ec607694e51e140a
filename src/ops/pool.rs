//! Window pooling, channels-last `(n, *spatial, c)`, 1-3 spatial dims, with TensorFlow's
//! semantics: `same` padding never pads into a max, and an average divides by the number
//! of in-bounds elements of its window. Three primitives, each the VJP of another:
//!
//! - `Pool(x) -> y`: max or average over each window.
//! - `PoolGrad(x, gy) -> dx`: the VJP of `Pool` (max routes each gradient to the first
//!   maximum of its window, as TensorFlow's `MaxPoolGrad`; avg spreads it evenly).
//! - `PoolSelect(x, h) -> (pooled shape)`: the adjoint of `PoolGrad` in `gy`: max picks
//!   `h` at each window's maximum of `x`; avg is the average pool of `h`.

use super::conv::cpu::Geom;
use super::conv::{ConvSpec, Padding};
use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::base::value::{Arr, Value};
use crate::ops::graph::Tensor;
use crate::value_err;
use num_traits::Float;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::Arc;

// ---- spec ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    Avg,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolSpec {
    pub kind: PoolKind,
    pub window: Vec<usize>,
    pub strides: Vec<usize>,
    pub padding: Padding,
}

impl PoolSpec {
    /// The same window walk as a depthwise convolution with a `window` kernel.
    fn conv(&self, channels: usize) -> ConvSpec {
        ConvSpec {
            strides: self.strides.clone(),
            dilation: vec![1; self.window.len()],
            padding: self.padding.clone(),
            groups: channels.max(1),
        }
    }
    /// The window walk over an input of shape `xs` (also what the GPU lowering runs).
    pub(crate) fn geom(&self, xs: &[usize]) -> Result<Geom> {
        let c = xs[xs.len() - 1];
        let mut ws = self.window.clone();
        ws.extend([1, c]);
        Geom::new(&self.conv(c), xs, &ws, None)
    }
    fn name(&self) -> &'static str {
        match self.kind {
            PoolKind::Max => "max_pool",
            PoolKind::Avg => "avg_pool",
        }
    }
}

// ---- pool ----

pub fn pool(x: &Tensor, spec: &Arc<PoolSpec>) -> Result<Tensor> {
    Tensor::new(Op::Pool(spec.clone()), vec![x.clone()])
}

pub fn infer_pool(spec: &PoolSpec, x: &Tensor) -> Result<(Shape, DType)> {
    let what = spec.name();
    let n = spec.window.len();
    if !(1..=3).contains(&n) || spec.strides.len() != n {
        return Err(value_err!("{what}: pool_size {:?} and strides {:?} must have 1 to 3 entries each, the same number", spec.window, spec.strides));
    }
    if spec.window.contains(&0) || spec.strides.contains(&0) {
        return Err(value_err!(
            "{what}: pool_size {:?} and strides {:?} must be positive",
            spec.window,
            spec.strides
        ));
    }
    if x.rank() != n + 2 {
        return Err(value_err!(
            "{what}: x must have rank {} (batch, *spatial, channels), got shape {}",
            n + 2,
            x.shape()
        ));
    }
    if !x.dtype().is_float() {
        return Err(Error::Type(format!(
            "{what}: x must be a float tensor, got {}",
            x.dtype()
        )));
    }
    let xd = x.shape().dims();
    let mut dims = vec![xd[0]];
    for i in 0..n {
        dims.push(match xd[1 + i] {
            Some(v) => {
                let pads = spec.padding.resolve(i, v, spec.window[i], spec.strides[i]);
                Some(super::conv::out_len(v, spec.window[i], spec.strides[i], pads).ok_or_else(|| {
                    value_err!("{what}: spatial dim {i} of the input has size {v}, smaller than the pool size {}", spec.window[i])
                })?)
            }
            None => None,
        });
    }
    dims.push(xd[n + 1]);
    Ok((Shape(dims), x.dtype()))
}

pub fn vjp_pool(spec: &Arc<PoolSpec>, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(pool_grad(node.input(0), g, spec)?)])
}

pub fn cpu_pool(spec: &PoolSpec, x: &Value) -> Result<Value> {
    let g = spec.geom(x.shape())?;
    let k = spec.kind;
    run(
        x,
        None,
        &g.y_shape,
        |x, _, y| pool_fwd(k, &g, x, y),
        |x, _, y| pool_fwd(k, &g, x, y),
    )
}

/// The f32 pooling of an input one image at a time, for a pooling run on each image of a
/// fused group's result as the group writes it (`compile::fuse::Group::pooled`): the same
/// values as the whole pooling.
pub struct ImagePool {
    /// The result's shape.
    pub shape: Vec<usize>,
    /// Images of the input (and the result).
    pub images: usize,
    g: Geom,
    kind: PoolKind,
}

impl ImagePool {
    pub fn new(spec: &PoolSpec, x_shape: &[usize]) -> Result<ImagePool> {
        let g = spec.geom(x_shape)?;
        Ok(ImagePool {
            shape: g.y_shape.clone(),
            images: g.n,
            g,
            kind: spec.kind,
        })
    }
}

impl super::ImageStage for ImagePool {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn images(&self) -> usize {
        self.images
    }
    /// Writes the pooling of input image `x` into `y`.
    fn run(&self, x: &[f32], y: &mut [f32]) {
        y.fill(0.0);
        pool_fwd(self.kind, &self.g, x, y);
    }
}

/// For a fused group that runs on each image as soon as it is written
/// (`runtime::cpu::fused`): the f32 pooling of `x`, or with `gy` its gradient, as (result
/// shape, images, kernel); None for other dtypes.
pub fn f32_then<'a>(
    spec: &'a PoolSpec,
    x: &'a Value,
    gy: Option<&'a Value>,
) -> Result<Option<(Vec<usize>, usize, super::ImageKernel<'a>)>> {
    let g = spec.geom(x.shape())?;
    let (Value::F32(xa), None | Some(Value::F32(_))) = (x, gy) else {
        return Ok(None);
    };
    if let Some(gy) = gy {
        check_grad_shape(&g, gy)?;
    }
    let ga = match gy {
        Some(Value::F32(a)) => Some(a.as_standard_layout()),
        _ => None,
    };
    let xs = xa.as_standard_layout();
    let (shape, n) = (
        if gy.is_some() {
            g.x_shape.clone()
        } else {
            g.y_shape.clone()
        },
        g.n,
    );
    let k = spec.kind;
    let disjoint = if k == PoolKind::Max {
        disjoint_gaps(&g)
    } else {
        None
    };
    let kernel: super::ImageKernel<'a> = Box::new(move |out, after| {
        let xd = xs.as_slice().expect("standard");
        if n == 0 || out.is_empty() {
            return;
        }
        let (xl, yl) = (xd.len() / n, out.len() / n);
        out.par_chunks_mut(yl).enumerate().for_each(|(i, o)| {
            let xi = &xd[i * xl..(i + 1) * xl];
            match &ga {
                None => {
                    o.fill(0.0);
                    pool_fwd(k, &g, xi, o);
                }
                Some(ga) => {
                    let gd = ga.as_slice().expect("standard");
                    let gl = gd.len() / n;
                    let gi = &gd[i * gl..(i + 1) * gl];
                    if let Some(gaps) = disjoint {
                        // SAFETY: f32 has no invalid bit patterns; the kernel writes the
                        // whole image (zeroing first where a pixel is in no window).
                        let o: &mut [MaybeUninit<f32>] = unsafe {
                            std::slice::from_raw_parts_mut(o.as_mut_ptr().cast(), o.len())
                        };
                        max_pool_bwd_disjoint(&g, gaps, xi, gi, o);
                    } else {
                        o.fill(0.0);
                        pool_bwd(k, &g, xi, gi, o);
                    }
                }
            }
            after(i);
        });
    });
    Ok(Some((shape, n, kernel)))
}

// ---- pool_grad ----

pub fn pool_grad(x: &Tensor, g: &Tensor, spec: &Arc<PoolSpec>) -> Result<Tensor> {
    Tensor::new(Op::PoolGrad(spec.clone()), vec![x.clone(), g.clone()])
}

pub fn infer_pool_grad(x: &Tensor, g: &Tensor) -> Result<(Shape, DType)> {
    if x.dtype() != g.dtype() {
        return Err(Error::Type(format!(
            "pool_grad: dtypes {} and {} differ",
            x.dtype(),
            g.dtype()
        )));
    }
    Ok((x.shape().clone(), x.dtype()))
}

/// `PoolGrad` is piecewise constant in `x` (the window maxima move only at ties) and
/// linear in `gy`.
pub fn vjp_pool_grad(
    spec: &Arc<PoolSpec>,
    node: &Tensor,
    h: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![None, Some(pool_select(node.input(0), h, spec)?)])
}

pub fn cpu_pool_grad(spec: &PoolSpec, x: &Value, gy: &Value) -> Result<Value> {
    let g = spec.geom(x.shape())?;
    check_grad_shape(&g, gy)?;
    let k = spec.kind;
    if k == PoolKind::Max {
        if let Some(dx) = max_pool_grad_disjoint(&g, x, gy) {
            return Ok(dx);
        }
    }
    run(
        x,
        Some(gy),
        x.shape(),
        |x, gy, dx| pool_bwd(k, &g, x, gy, dx),
        |x, gy, dx| pool_bwd(k, &g, x, gy, dx),
    )
}

// ---- pool_select ----

pub fn pool_select(x: &Tensor, h: &Tensor, spec: &Arc<PoolSpec>) -> Result<Tensor> {
    Tensor::new(Op::PoolSelect(spec.clone()), vec![x.clone(), h.clone()])
}

pub fn infer_pool_select(spec: &PoolSpec, x: &Tensor, h: &Tensor) -> Result<(Shape, DType)> {
    if x.dtype() != h.dtype() || x.rank() != h.rank() {
        return Err(Error::Type(format!(
            "pool_select: inputs {} {} and {} {} differ",
            x.dtype(),
            x.shape(),
            h.dtype(),
            h.shape()
        )));
    }
    infer_pool(spec, x)
}

pub fn vjp_pool_select(
    spec: &Arc<PoolSpec>,
    node: &Tensor,
    g: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![None, Some(pool_grad(node.input(0), g, spec)?)])
}

pub fn cpu_pool_select(spec: &PoolSpec, x: &Value, h: &Value) -> Result<Value> {
    let g = spec.geom(x.shape())?;
    if h.shape() != x.shape() {
        return Err(value_err!(
            "pool_select: shapes {:?} and {:?} differ",
            h.shape(),
            x.shape()
        ));
    }
    let k = spec.kind;
    run(
        x,
        Some(h),
        &g.y_shape,
        |x, h, y| pool_sel(k, &g, x, h, y),
        |x, h, y| pool_sel(k, &g, x, h, y),
    )
}

// ---- helpers ----

trait PF: Float + Send + Sync + crate::base::value::Elem {}

impl PF for f32 {}

impl PF for f64 {}

/// Runs `k(x, other, out)` per image in f32/f64 (f16 widened) and wraps the result.
fn run(
    x: &Value,
    other: Option<&Value>,
    out_shape: &[usize],
    k32: impl Fn(&[f32], &[f32], &mut [f32]) + Sync,
    k64: impl Fn(&[f64], &[f64], &mut [f64]) + Sync,
) -> Result<Value> {
    fn go<T: PF>(
        x: &Arr<T>,
        o: Option<&Arr<T>>,
        shape: &[usize],
        k: impl Fn(&[T], &[T], &mut [T]) + Sync,
    ) -> Value {
        let (xd, od) = (
            x.as_slice().expect("standard"),
            o.map(|o| o.as_slice().expect("standard")).unwrap_or(&[]),
        );
        let n = shape[0];
        let mut out = vec![T::zero(); shape.iter().product()];
        if n > 0 && !out.is_empty() {
            let (xl, ol, yl) = (xd.len() / n, od.len() / n, out.len() / n);
            out.par_chunks_mut(yl)
                .enumerate()
                .for_each(|(i, y)| k(&xd[i * xl..(i + 1) * xl], &od[i * ol..(i + 1) * ol], y));
        }
        Value::from_vec(shape, out).expect("shape matches")
    }
    let other = other.cloned();
    match (x, other.as_ref()) {
        (Value::F32(a), None) => Ok(go(a, None, out_shape, k32)),
        (Value::F32(a), Some(Value::F32(b))) => Ok(go(a, Some(b), out_shape, k32)),
        (Value::F64(a), None) => Ok(go(a, None, out_shape, k64)),
        (Value::F64(a), Some(Value::F64(b))) => Ok(go(a, Some(b), out_shape, k64)),
        (Value::F16(_), o) if o.is_none_or(|o| o.dtype() == DType::F16) => {
            let Value::F32(a) = x.cast(DType::F32) else {
                unreachable!()
            };
            let b = o.map(|o| o.cast(DType::F32));
            let b = match &b {
                Some(Value::F32(b)) => Some(b),
                _ => None,
            };
            Ok(go(&a, b, out_shape, k32).cast(DType::F16))
        }
        _ => Err(Error::Type(format!(
            "pooling: unsupported dtype {}",
            x.dtype()
        ))),
    }
}

/// The input pixels (flat) of output pixel `o`'s window that lie inside the image, in
/// window order, into `ips`. Per dim, the in-bounds part of a window is a range, so
/// padding costs no per-element test.
fn window(g: &Geom, o: [usize; 3], ips: &mut Vec<usize>) {
    let (mut start, mut len) = ([0; 3], [0; 3]);
    for t in 0..3 {
        let lo = o[t] * g.s[t];
        let a = lo.max(g.p[t].0);
        let b = (lo + g.k[t]).min(g.p[t].0 + g.x[t]);
        (start[t], len[t]) = (a - g.p[t].0, b.saturating_sub(a));
    }
    ips.clear();
    for a in start[0]..start[0] + len[0] {
        for b in start[1]..start[1] + len[1] {
            let row = (a * g.x[1] + b) * g.x[2];
            ips.extend(row + start[2]..row + start[2] + len[2]);
        }
    }
}

/// The output pixel `op` of one image as `[o0, o1, o2]`.
#[inline(always)]
fn out_coords(g: &Geom, op: usize) -> [usize; 3] {
    [op / (g.o[1] * g.o[2]), (op / g.o[2]) % g.o[1], op % g.o[2]]
}

/// For each channel, the position in `ips` of the first maximum of `x` over the window
/// (`idx`), and that maximum (`best`); a NaN wins only where it comes first, as in a
/// `v > best` scan. An empty window leaves `-inf` and position 0.
#[inline(always)]
fn argmax<T: PF>(x: &[T], c: usize, ips: &[usize], best: &mut [T], idx: &mut [u32]) {
    idx.fill(0);
    let Some((&first, rest)) = ips.split_first() else {
        best.fill(T::neg_infinity());
        return;
    };
    best.copy_from_slice(&x[first * c..(first + 1) * c]);
    for (t, &ip) in rest.iter().enumerate() {
        let t = t as u32 + 1;
        for ((b, i), &v) in best
            .iter_mut()
            .zip(idx.iter_mut())
            .zip(&x[ip * c..(ip + 1) * c])
        {
            let more = v > *b;
            *i = if more { t } else { *i };
            *b = if more { v } else { *b };
        }
    }
}

// The kernels below are loops over output pixels with no closures, so that all of each is
// inlined into its `simd_kernel!` copies and vectorised over channels.

/// Whether every window of `g` lies inside the image (no padding): an average pool then
/// divides every window by its size, and the unpadded kernels below need no bounds.
fn unpadded(g: &Geom) -> bool {
    g.p.iter().all(|&(a, b)| a == 0 && b == 0)
}

/// Calls `f(op, ip)` for every output pixel `op` of one unpadded image and each input
/// pixel `ip` of its window, in window order: output pixels stepped along without the
/// per-pixel window lists of `window`.
#[inline(always)]
fn unpadded_walk(g: &Geom, mut f: impl FnMut(usize, usize)) {
    let (o, k, s, x) = (&g.o, &g.k, &g.s, &g.x);
    let mut op = 0;
    for a in 0..o[0] {
        for b in 0..o[1] {
            for c in 0..o[2] {
                for ka in 0..k[0] {
                    for kb in 0..k[1] {
                        let row = ((a * s[0] + ka) * x[1] + b * s[1] + kb) * x[2] + c * s[2];
                        for kc in 0..k[2] {
                            f(op, row + kc);
                        }
                    }
                }
                op += 1;
            }
        }
    }
}

/// Channels per block of the unpadded average and max kernels: a fixed-size array the
/// compiler keeps in vector registers.
const AVG_BLOCK: usize = 16;

/// The average pool of one unpadded image, `c` a multiple of `AVG_BLOCK`.
#[inline(always)]
fn avg_fwd_unpadded<T: PF>(g: &Geom, x: &[T], y: &mut [T]) {
    let c = g.cin;
    let n = T::from(g.kk()).expect("small count");
    for ch in (0..c).step_by(AVG_BLOCK) {
        let mut acc = [T::zero(); AVG_BLOCK];
        let mut last = 0;
        unpadded_walk(g, |op, ip| {
            if op != last {
                let yr: &mut [T; AVG_BLOCK] = (&mut y[last * c + ch..][..AVG_BLOCK])
                    .try_into()
                    .expect("block");
                for (y, a) in yr.iter_mut().zip(&mut acc) {
                    *y = *a / n;
                    *a = T::zero();
                }
                last = op;
            }
            let xr: &[T; AVG_BLOCK] = x[ip * c + ch..][..AVG_BLOCK].try_into().expect("block");
            for (a, &v) in acc.iter_mut().zip(xr) {
                *a = *a + v;
            }
        });
        if g.opix() > 0 {
            let yr = &mut y[last * c + ch..][..AVG_BLOCK];
            for (y, a) in yr.iter_mut().zip(&acc) {
                *y = *a / n;
            }
        }
    }
}

/// The average pool's gradient of one unpadded image added into `dx`, `c` a multiple of
/// `AVG_BLOCK`.
#[inline(always)]
fn avg_bwd_unpadded<T: PF>(g: &Geom, gy: &[T], dx: &mut [T]) {
    let c = g.cin;
    let n = T::from(g.kk()).expect("small count");
    for ch in (0..c).step_by(AVG_BLOCK) {
        unpadded_walk(g, |op, ip| {
            let gr: &[T; AVG_BLOCK] = gy[op * c + ch..][..AVG_BLOCK].try_into().expect("block");
            let dr: &mut [T; AVG_BLOCK] = (&mut dx[ip * c + ch..][..AVG_BLOCK])
                .try_into()
                .expect("block");
            for (d, &v) in dr.iter_mut().zip(gr) {
                *d = *d + v / n;
            }
        });
    }
}

/// `y = v > y ? v : y` channel by channel: in blocks of a fixed 64, then 16, then one
/// channel (a loop over `c` alone is compiled to 64 channels a step and runs any
/// remainder one channel at a time, so that 32 channels went through it whole, 2.5 times
/// slower than 64).
#[inline(always)]
fn max_into<T: PF>(y: &mut [T], x: &[T]) {
    #[inline(always)]
    fn blocks<T: PF, const B: usize>(y: &mut [T], x: &[T]) -> usize {
        let n = y.len() / B * B;
        for (yb, xb) in y[..n].chunks_exact_mut(B).zip(x[..n].chunks_exact(B)) {
            let yb: &mut [T; B] = yb.try_into().expect("block");
            let xb: &[T; B] = xb.try_into().expect("block");
            for (y, &v) in yb.iter_mut().zip(xb) {
                *y = if v > *y { v } else { *y };
            }
        }
        n
    }
    let a = blocks::<T, 64>(y, x);
    let b = a + blocks::<T, AVG_BLOCK>(&mut y[a..], &x[a..]);
    blocks::<T, 1>(&mut y[b..], &x[b..]);
}

/// The max pool of one unpadded image: each window's first value, then `v > max` in
/// window order, as the general loop below compares them (a NaN wins only where it comes
/// first), without its per-pixel window lists.
#[inline(always)]
fn max_fwd_unpadded<T: PF>(g: &Geom, x: &[T], y: &mut [T]) {
    match g.cin {
        16 => return max_fwd_channels::<T, 16>(g, x, y),
        32 => return max_fwd_channels::<T, 32>(g, x, y),
        64 => return max_fwd_channels::<T, 64>(g, x, y),
        _ => {}
    }
    let c = g.cin;
    let mut last = None;
    unpadded_walk(g, |op, ip| {
        let (xr, yr) = (&x[ip * c..][..c], &mut y[op * c..][..c]);
        if last != Some(op) {
            yr.copy_from_slice(xr);
            last = Some(op);
            return;
        }
        max_into(yr, xr);
    });
}

/// `max_fwd_unpadded` for `C` channels: each window's maximum kept in a fixed-size array
/// (vector registers) and stored once, where the general loop copies the first value and
/// compares every later one against the output in memory. The first value seeds the
/// maximum, then every value of the window in order replaces it when greater, as there.
/// It steps the windows itself rather than through `unpadded_walk`, whose per-pixel
/// callback measured slower here (32 channels, 2x2: 1,043-1,084 against 737-789 us).
#[inline(always)]
fn max_fwd_channels<T: PF, const C: usize>(g: &Geom, x: &[T], y: &mut [T]) {
    let (o, k, s, xs) = (&g.o, &g.k, &g.s, &g.x);
    let pixel = |ip: usize| -> &[T; C] { x[ip * C..][..C].try_into().expect("pixel") };
    let mut op = 0;
    for a in 0..o[0] {
        for b in 0..o[1] {
            for c in 0..o[2] {
                let first = ((a * s[0]) * xs[1] + b * s[1]) * xs[2] + c * s[2];
                let mut best = *pixel(first);
                for ka in 0..k[0] {
                    for kb in 0..k[1] {
                        let row = ((a * s[0] + ka) * xs[1] + b * s[1] + kb) * xs[2] + c * s[2];
                        for kc in 0..k[2] {
                            for (m, &v) in best.iter_mut().zip(pixel(row + kc)) {
                                *m = if v > *m { v } else { *m };
                            }
                        }
                    }
                }
                y[op * C..][..C].copy_from_slice(&best);
                op += 1;
            }
        }
    }
}

#[inline(always)]
fn pool_fwd_impl<T: PF>(kind: PoolKind, g: &Geom, x: &[T], y: &mut [T]) {
    let c = g.cin;
    if kind == PoolKind::Avg && unpadded(g) && c.is_multiple_of(AVG_BLOCK) {
        return avg_fwd_unpadded(g, x, y);
    }
    if kind == PoolKind::Max && unpadded(g) {
        return max_fwd_unpadded(g, x, y);
    }
    let mut ips = Vec::with_capacity(g.kk());
    for op in 0..g.opix() {
        window(g, out_coords(g, op), &mut ips);
        let yr = &mut y[op * c..(op + 1) * c];
        match (kind, ips.split_first()) {
            (PoolKind::Max, None) => yr.fill(T::neg_infinity()),
            (PoolKind::Max, Some((&first, rest))) => {
                yr.copy_from_slice(&x[first * c..(first + 1) * c]);
                for &ip in rest {
                    max_into(yr, &x[ip * c..(ip + 1) * c]);
                }
            }
            (PoolKind::Avg, _) => {
                yr.fill(T::zero());
                for &ip in &ips {
                    for (y, &v) in yr.iter_mut().zip(&x[ip * c..(ip + 1) * c]) {
                        *y = *y + v;
                    }
                }
                let n = T::from(ips.len()).expect("small count");
                for y in yr.iter_mut() {
                    *y = *y / n;
                }
            }
        }
    }
}

#[inline(always)]
fn pool_bwd_impl<T: PF>(kind: PoolKind, g: &Geom, x: &[T], gy: &[T], dx: &mut [T]) {
    let c = g.cin;
    if kind == PoolKind::Avg && unpadded(g) && c.is_multiple_of(AVG_BLOCK) {
        return avg_bwd_unpadded(g, gy, dx);
    }
    let (mut best, mut idx) = (vec![T::zero(); c], vec![0u32; c]);
    let mut ips = Vec::with_capacity(g.kk());
    for op in 0..g.opix() {
        window(g, out_coords(g, op), &mut ips);
        let gr = &gy[op * c..(op + 1) * c];
        match kind {
            PoolKind::Max => {
                argmax(x, c, &ips, &mut best, &mut idx);
                for (t, &ip) in ips.iter().enumerate() {
                    let t = t as u32;
                    for ((d, &v), &i) in dx[ip * c..(ip + 1) * c].iter_mut().zip(gr).zip(&idx) {
                        *d = *d + if i == t { v } else { T::zero() };
                    }
                }
            }
            PoolKind::Avg => {
                let n = T::from(ips.len()).expect("small count");
                for &ip in &ips {
                    for (d, &v) in dx[ip * c..(ip + 1) * c].iter_mut().zip(gr) {
                        *d = *d + v / n;
                    }
                }
            }
        }
    }
}

#[inline(always)]
fn pool_sel_impl<T: PF>(kind: PoolKind, g: &Geom, x: &[T], h: &[T], y: &mut [T]) {
    let c = g.cin;
    if kind == PoolKind::Avg {
        return pool_fwd_impl(kind, g, h, y);
    }
    let (mut best, mut idx) = (vec![T::zero(); c], vec![0u32; c]);
    let mut ips = Vec::with_capacity(g.kk());
    for op in 0..g.opix() {
        window(g, out_coords(g, op), &mut ips);
        argmax(x, c, &ips, &mut best, &mut idx);
        let yr = &mut y[op * c..(op + 1) * c];
        yr.fill(T::zero());
        for (t, &ip) in ips.iter().enumerate() {
            let t = t as u32;
            for ((y, &v), &i) in yr.iter_mut().zip(&h[ip * c..(ip + 1) * c]).zip(&idx) {
                *y = if i == t { v } else { *y };
            }
        }
    }
}

/// Max-pool gradient where no two windows overlap (strides at least the window, Keras's
/// default `pool_size` strides): each input pixel is in one window at most, so every
/// element of `dx` is written once, the window's gradient at its first maximum and zero
/// elsewhere, with no zero-fill and no read-modify-write of `dx` (a third of the traffic).
/// Pixels outside every window (gaps, padding, a remainder) are zeroed first when `gaps`.
#[inline(always)]
fn max_pool_bwd_disjoint_impl<T: PF>(
    g: &Geom,
    gaps: bool,
    x: &[T],
    gy: &[T],
    dx: &mut [MaybeUninit<T>],
) {
    let c = g.cin;
    if gaps {
        dx.iter_mut().for_each(|d| {
            d.write(T::zero());
        });
    }
    match c {
        16 => return max_pool_bwd_disjoint_channels::<T, 16>(g, x, gy, dx),
        32 => return max_pool_bwd_disjoint_channels::<T, 32>(g, x, gy, dx),
        64 => return max_pool_bwd_disjoint_channels::<T, 64>(g, x, gy, dx),
        _ => {}
    }
    let (mut best, mut idx) = (vec![T::zero(); c], vec![0u32; c]);
    let mut ips = Vec::with_capacity(g.kk());
    for op in 0..g.opix() {
        window(g, out_coords(g, op), &mut ips);
        argmax(x, c, &ips, &mut best, &mut idx);
        let gr = &gy[op * c..(op + 1) * c];
        for (t, &ip) in ips.iter().enumerate() {
            let t = t as u32;
            for ((d, &v), &i) in dx[ip * c..(ip + 1) * c].iter_mut().zip(gr).zip(&idx) {
                d.write(if i == t { v } else { T::zero() });
            }
        }
    }
}

/// `max_pool_bwd_disjoint_impl` for `C` channels: the window's maximum and its position
/// kept in fixed-size arrays (vector registers), as `argmax` finds them.
#[inline(always)]
fn max_pool_bwd_disjoint_channels<T: PF, const C: usize>(
    g: &Geom,
    x: &[T],
    gy: &[T],
    dx: &mut [MaybeUninit<T>],
) {
    let pixel = |ip: usize| -> &[T; C] { x[ip * C..][..C].try_into().expect("pixel") };
    let mut ips = Vec::with_capacity(g.kk());
    for op in 0..g.opix() {
        window(g, out_coords(g, op), &mut ips);
        let Some((&first, rest)) = ips.split_first() else {
            continue;
        };
        let (mut best, mut idx) = (*pixel(first), [0u32; C]);
        for (t, &ip) in rest.iter().enumerate() {
            let t = t as u32 + 1;
            for ((b, i), &v) in best.iter_mut().zip(idx.iter_mut()).zip(pixel(ip)) {
                let more = v > *b;
                *i = if more { t } else { *i };
                *b = if more { v } else { *b };
            }
        }
        let gr: &[T; C] = gy[op * C..][..C].try_into().expect("pixel");
        for (t, &ip) in ips.iter().enumerate() {
            let t = t as u32;
            let d: &mut [MaybeUninit<T>; C] = (&mut dx[ip * C..][..C]).try_into().expect("pixel");
            for ((d, &v), &i) in d.iter_mut().zip(gr).zip(&idx) {
                d.write(if i == t { v } else { T::zero() });
            }
        }
    }
}

use super::conv::cpu::simd_kernel;

simd_kernel!(fn max_pool_bwd_disjoint<T: PF>(g: &Geom, gaps: bool, x: &[T], gy: &[T], dx: &mut [MaybeUninit<T>]) = max_pool_bwd_disjoint_impl);

/// Where max pooling's windows do not overlap (`max_pool_bwd_disjoint` applies): whether
/// some input pixel lies in no window (`gaps`). None where windows overlap.
fn disjoint_gaps(g: &Geom) -> Option<bool> {
    (0..3)
        .all(|t| g.s[t] >= g.k[t])
        .then(|| (0..3).any(|t| g.s[t] != g.k[t] || g.p[t] != (0, 0) || g.o[t] * g.s[t] != g.x[t]))
}

/// Errors unless the gradient `gy` has the pooled shape.
fn check_grad_shape(g: &Geom, gy: &Value) -> Result<()> {
    if gy.shape() != g.y_shape.as_slice() {
        return Err(value_err!(
            "pool_grad: gradient shape {:?} does not match the pooled shape {:?}",
            gy.shape(),
            g.y_shape
        ));
    }
    Ok(())
}

/// `max_pool_bwd_disjoint` over all images, or None where it does not apply.
fn max_pool_grad_disjoint(g: &Geom, x: &Value, gy: &Value) -> Option<Value> {
    fn go<T: PF>(g: &Geom, gaps: bool, x: &Arr<T>, gy: &Arr<T>) -> Value {
        let (xd, gd) = (
            x.as_slice().expect("standard"),
            gy.as_slice().expect("standard"),
        );
        let len = xd.len();
        let mut out: Vec<T> = Vec::with_capacity(len);
        if g.n > 0 && len > 0 {
            let (xl, yl) = (len / g.n, gd.len() / g.n);
            out.spare_capacity_mut()[..len]
                .par_chunks_mut(xl)
                .enumerate()
                .for_each(|(i, dx)| {
                    max_pool_bwd_disjoint(
                        g,
                        gaps,
                        &xd[i * xl..(i + 1) * xl],
                        &gd[i * yl..(i + 1) * yl],
                        dx,
                    )
                });
        }
        // SAFETY: each image's block was written whole: zeroed first where some pixel is
        // in no window, and every pixel of every window written.
        unsafe { out.set_len(len) };
        Value::from_vec(&g.x_shape, out).expect("shape matches")
    }
    let gaps = disjoint_gaps(g)?;
    match (x, gy) {
        (Value::F32(a), Value::F32(b)) => Some(go(g, gaps, a, b)),
        (Value::F64(a), Value::F64(b)) => Some(go(g, gaps, a, b)),
        _ => None,
    }
}

simd_kernel!(fn pool_fwd<T: PF>(kind: PoolKind, g: &Geom, x: &[T], y: &mut [T]) = pool_fwd_impl);

simd_kernel!(fn pool_bwd<T: PF>(kind: PoolKind, g: &Geom, x: &[T], gy: &[T], dx: &mut [T]) = pool_bwd_impl);

simd_kernel!(fn pool_sel<T: PF>(kind: PoolKind, g: &Geom, x: &[T], h: &[T], y: &mut [T]) = pool_sel_impl);
