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
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::runtime::value::{Arr, Value};
use crate::shape::Shape;
use crate::value_err;
use num_traits::Float;
use rayon::prelude::*;
use std::sync::Arc;

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

// ---------------------------------------------------------------- shape rules

pub fn infer_pool(spec: &PoolSpec, x: &Tensor) -> Result<(Shape, DType)> {
    let what = spec.name();
    let n = spec.window.len();
    if !(1..=3).contains(&n) || spec.strides.len() != n {
        return Err(value_err!("{what}: pool_size {:?} and strides {:?} must have 1 to 3 entries each, the same number", spec.window, spec.strides));
    }
    if spec.window.contains(&0) || spec.strides.contains(&0) {
        return Err(value_err!("{what}: pool_size {:?} and strides {:?} must be positive", spec.window, spec.strides));
    }
    if x.rank() != n + 2 {
        return Err(value_err!("{what}: x must have rank {} (batch, *spatial, channels), got shape {}", n + 2, x.shape()));
    }
    if !x.dtype().is_float() {
        return Err(Error::Type(format!("{what}: x must be a float tensor, got {}", x.dtype())));
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

pub fn infer_pool_grad(x: &Tensor, g: &Tensor) -> Result<(Shape, DType)> {
    if x.dtype() != g.dtype() {
        return Err(Error::Type(format!("pool_grad: dtypes {} and {} differ", x.dtype(), g.dtype())));
    }
    Ok((x.shape().clone(), x.dtype()))
}

pub fn infer_pool_select(spec: &PoolSpec, x: &Tensor, h: &Tensor) -> Result<(Shape, DType)> {
    if x.dtype() != h.dtype() || x.rank() != h.rank() {
        return Err(Error::Type(format!("pool_select: inputs {} {} and {} {} differ", x.dtype(), x.shape(), h.dtype(), h.shape())));
    }
    infer_pool(spec, x)
}

// ---------------------------------------------------------------- builders and VJPs

pub fn pool(x: &Tensor, spec: &Arc<PoolSpec>) -> Result<Tensor> {
    Tensor::new(Op::Pool(spec.clone()), vec![x.clone()])
}
pub fn pool_grad(x: &Tensor, g: &Tensor, spec: &Arc<PoolSpec>) -> Result<Tensor> {
    Tensor::new(Op::PoolGrad(spec.clone()), vec![x.clone(), g.clone()])
}
pub fn pool_select(x: &Tensor, h: &Tensor, spec: &Arc<PoolSpec>) -> Result<Tensor> {
    Tensor::new(Op::PoolSelect(spec.clone()), vec![x.clone(), h.clone()])
}

pub fn vjp_pool(spec: &Arc<PoolSpec>, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(pool_grad(node.input(0), g, spec)?)])
}
/// `PoolGrad` is piecewise constant in `x` (the window maxima move only at ties) and
/// linear in `gy`.
pub fn vjp_pool_grad(spec: &Arc<PoolSpec>, node: &Tensor, h: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![None, Some(pool_select(node.input(0), h, spec)?)])
}
pub fn vjp_pool_select(spec: &Arc<PoolSpec>, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![None, Some(pool_grad(node.input(0), g, spec)?)])
}

// ---------------------------------------------------------------- kernels

trait PF: Float + Send + Sync + crate::runtime::value::Elem {}
impl PF for f32 {}
impl PF for f64 {}

/// Runs `k(x, other, out)` per image in f32/f64 (f16 widened) and wraps the result.
fn run(x: &Value, other: Option<&Value>, out_shape: &[usize], k32: impl Fn(&[f32], &[f32], &mut [f32]) + Sync, k64: impl Fn(&[f64], &[f64], &mut [f64]) + Sync) -> Result<Value> {
    fn go<T: PF>(x: &Arr<T>, o: Option<&Arr<T>>, shape: &[usize], k: impl Fn(&[T], &[T], &mut [T]) + Sync) -> Value {
        let (xd, od) = (x.as_slice().expect("standard"), o.map(|o| o.as_slice().expect("standard")).unwrap_or(&[]));
        let n = shape[0];
        let mut out = vec![T::zero(); shape.iter().product()];
        if n > 0 && !out.is_empty() {
            let (xl, ol, yl) = (xd.len() / n, od.len() / n, out.len() / n);
            out.par_chunks_mut(yl).enumerate().for_each(|(i, y)| k(&xd[i * xl..(i + 1) * xl], &od[i * ol..(i + 1) * ol], y));
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
            let Value::F32(a) = x.cast(DType::F32) else { unreachable!() };
            let b = o.map(|o| o.cast(DType::F32));
            let b = match &b {
                Some(Value::F32(b)) => Some(b),
                _ => None,
            };
            Ok(go(&a, b, out_shape, k32).cast(DType::F16))
        }
        _ => Err(Error::Type(format!("pooling: unsupported dtype {}", x.dtype()))),
    }
}

/// Index (pixel) of the first maximum of each channel in output pixel `op`'s window.
fn argmax<T: PF>(g: &Geom, x: &[T], op: usize, best: &mut [T], idx: &mut [usize]) {
    let c = g.cin;
    best.fill(T::neg_infinity());
    idx.fill(usize::MAX);
    for kp in 0..g.kk() {
        let Some(ip) = g.src_pix(op, kp) else { continue };
        for ((b, i), &v) in best.iter_mut().zip(idx.iter_mut()).zip(&x[ip * c..(ip + 1) * c]) {
            if v > *b || *i == usize::MAX {
                *b = v;
                *i = ip;
            }
        }
    }
}

fn count<T: PF>(g: &Geom, op: usize) -> T {
    T::from((0..g.kk()).filter(|&kp| g.src_pix(op, kp).is_some()).count()).expect("small count")
}

fn pool_fwd<T: PF>(kind: PoolKind, g: &Geom, x: &[T], y: &mut [T]) {
    let c = g.cin;
    let mut idx = vec![0; c];
    for op in 0..g.opix() {
        let yr = &mut y[op * c..(op + 1) * c];
        match kind {
            PoolKind::Max => argmax(g, x, op, yr, &mut idx),
            PoolKind::Avg => {
                for kp in 0..g.kk() {
                    let Some(ip) = g.src_pix(op, kp) else { continue };
                    yr.iter_mut().zip(&x[ip * c..(ip + 1) * c]).for_each(|(y, &v)| *y = *y + v);
                }
                let n: T = count(g, op);
                yr.iter_mut().for_each(|y| *y = *y / n);
            }
        }
    }
}

fn pool_bwd<T: PF>(kind: PoolKind, g: &Geom, x: &[T], gy: &[T], dx: &mut [T]) {
    let c = g.cin;
    let (mut best, mut idx) = (vec![T::zero(); c], vec![0; c]);
    for op in 0..g.opix() {
        let gr = &gy[op * c..(op + 1) * c];
        match kind {
            PoolKind::Max => {
                argmax(g, x, op, &mut best, &mut idx);
                for (ch, (&ip, &v)) in idx.iter().zip(gr).enumerate() {
                    if ip != usize::MAX {
                        dx[ip * c + ch] = dx[ip * c + ch] + v;
                    }
                }
            }
            PoolKind::Avg => {
                let n: T = count(g, op);
                for kp in 0..g.kk() {
                    let Some(ip) = g.src_pix(op, kp) else { continue };
                    dx[ip * c..(ip + 1) * c].iter_mut().zip(gr).for_each(|(d, &v)| *d = *d + v / n);
                }
            }
        }
    }
}

fn pool_sel<T: PF>(kind: PoolKind, g: &Geom, x: &[T], h: &[T], y: &mut [T]) {
    let c = g.cin;
    match kind {
        PoolKind::Avg => pool_fwd(kind, g, h, y),
        PoolKind::Max => {
            let (mut best, mut idx) = (vec![T::zero(); c], vec![0; c]);
            for op in 0..g.opix() {
                argmax(g, x, op, &mut best, &mut idx);
                for (ch, &ip) in idx.iter().enumerate() {
                    y[op * c + ch] = if ip == usize::MAX { T::zero() } else { h[ip * c + ch] };
                }
            }
        }
    }
}

pub fn cpu_pool(spec: &PoolSpec, x: &Value) -> Result<Value> {
    let g = spec.geom(x.shape())?;
    let k = spec.kind;
    run(x, None, &g.y_shape, |x, _, y| pool_fwd(k, &g, x, y), |x, _, y| pool_fwd(k, &g, x, y))
}

pub fn cpu_pool_grad(spec: &PoolSpec, x: &Value, gy: &Value) -> Result<Value> {
    let g = spec.geom(x.shape())?;
    if gy.shape() != g.y_shape.as_slice() {
        return Err(value_err!("pool_grad: gradient shape {:?} does not match the pooled shape {:?}", gy.shape(), g.y_shape));
    }
    let k = spec.kind;
    run(x, Some(gy), x.shape(), |x, gy, dx| pool_bwd(k, &g, x, gy, dx), |x, gy, dx| pool_bwd(k, &g, x, gy, dx))
}

pub fn cpu_pool_select(spec: &PoolSpec, x: &Value, h: &Value) -> Result<Value> {
    let g = spec.geom(x.shape())?;
    if h.shape() != x.shape() {
        return Err(value_err!("pool_select: shapes {:?} and {:?} differ", h.shape(), x.shape()));
    }
    let k = spec.kind;
    run(x, Some(h), &g.y_shape, |x, h, y| pool_sel(k, &g, x, h, y), |x, h, y| pool_sel(k, &g, x, h, y))
}
