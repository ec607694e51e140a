//! Convolution primitives: one N-d (1-3 spatial dims) grouped convolution and the two
//! linear maps its gradient needs, each a primitive whose own VJP is again one of the three:
//!
//! - `Conv(x, w) -> y`: cross-correlation, channels-last. `x` is `(n, *spatial, cin)`, `w` is
//!   Keras's `(*kernel, cin / groups, cout)`, `y` is `(n, *out, cout)`. Depthwise and
//!   separable convolutions are `groups = cin`.
//! - `ConvInputGrad(g, w, x_shape) -> dx`: the adjoint of `Conv` in `x` (the transposed
//!   convolution); `x_shape` is a 1-D int tensor, since strides make it ambiguous.
//! - `ConvKernelGrad(x, g, w_shape) -> dw`: the adjoint of `Conv` in `w`.
//!
//! With `<a, b>` the sum of elementwise products, all three come from one bilinear form
//! `<Conv(x, w), g> = <x, ConvInputGrad(g, w)> = <w, ConvKernelGrad(x, g)>`, which gives
//! every VJP below. Kernels are in `cpu.rs`.

pub mod cpu;
pub mod winograd;
pub mod winograd1d;

use super::build::*;
use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::{Dim, Shape};
use crate::base::value::Value;
use crate::ops::graph::Tensor;
use crate::ops::movement::partial_value;
use crate::value_err;
use std::sync::Arc;

// ---- spec ----

/// Padding of each spatial dim. `Same` is TensorFlow's rule, resolved against the runtime
/// input size (so spatial dims unknown until run time work): the output has
/// `ceil(in / stride)` elements and an odd total padding puts the extra element at the end.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Padding {
    /// `(before, after)` per spatial dim; `valid` is all zeros, `causal` is `(d*(k-1), 0)`.
    Explicit(Vec<(usize, usize)>),
    Same,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvSpec {
    pub strides: Vec<usize>,
    pub dilation: Vec<usize>,
    pub padding: Padding,
    pub groups: usize,
}

impl Padding {
    /// `(before, after)` of one spatial dim of size `x` under a window of effective size
    /// `eff` (dilation included) moved by `stride`.
    pub fn resolve(&self, i: usize, x: usize, eff: usize, stride: usize) -> (usize, usize) {
        match self {
            Padding::Explicit(p) => p[i],
            Padding::Same => {
                let out = x.div_ceil(stride);
                // An empty axis (out = 0) is padded one short of a window, so that
                // `out_len` finds no window position in it.
                let total = match out {
                    0 => eff - 1,
                    _ => ((out - 1) * stride + eff).saturating_sub(x),
                };
                (total / 2, total - total / 2)
            }
        }
    }
}

/// Number of window positions along one dim, or `None` when the window does not fit.
/// An empty input axis padded to one short of the window (`same`, `causal`) has none, as
/// in TensorFlow (`ceil((span - eff + 1) / stride)`).
pub fn out_len(x: usize, eff: usize, stride: usize, pads: (usize, usize)) -> Option<usize> {
    let span = x + pads.0 + pads.1;
    if x == 0 && span + 1 == eff {
        return Some(0);
    }
    (span >= eff).then(|| (span - eff) / stride + 1)
}

impl ConvSpec {
    pub fn nsp(&self) -> usize {
        self.strides.len()
    }

    /// Checks the per-dim vectors; `what` names the operation in messages.
    pub fn validate(&self, what: &str) -> Result<()> {
        let n = self.nsp();
        if !(1..=3).contains(&n) {
            return Err(value_err!(
                "{what}: 1 to 3 spatial dims are supported, got {n}"
            ));
        }
        if self.dilation.len() != n {
            return Err(value_err!(
                "{what}: dilation_rate has {} entries, expected {n}",
                self.dilation.len()
            ));
        }
        if let Padding::Explicit(p) = &self.padding {
            if p.len() != n {
                return Err(value_err!(
                    "{what}: padding has {} (before, after) pairs, expected {n}",
                    p.len()
                ));
            }
        }
        if self.strides.contains(&0) || self.dilation.contains(&0) || self.groups == 0 {
            return Err(value_err!(
                "{what}: strides {:?}, dilation_rate {:?} and groups {} must all be positive",
                self.strides,
                self.dilation,
                self.groups
            ));
        }
        Ok(())
    }

    /// Output spatial size from input spatial size `x` and kernel spatial size `k`.
    pub fn out_spatial(&self, what: &str, x: &[usize], k: &[usize]) -> Result<Vec<usize>> {
        (0..self.nsp())
            .map(|i| {
                let eff = self.dilation[i] * (k[i] - 1) + 1;
                let pads = self.padding.resolve(i, x[i], eff, self.strides[i]);
                out_len(x[i], eff, self.strides[i], pads).ok_or_else(|| {
                    value_err!(
                        "{what}: spatial dim {i} of the input has size {} but the (dilated) kernel needs at least {eff}",
                        x[i]
                    )
                })
            })
            .collect()
    }

    /// Static output spatial dims; unknown where the input or kernel dim is unknown.
    fn out_static(&self, what: &str, x: &[Dim], k: &[Dim]) -> Result<Vec<Dim>> {
        let mut out = Vec::with_capacity(self.nsp());
        for i in 0..self.nsp() {
            out.push(match (x[i], k[i]) {
                (Some(xi), Some(ki)) => {
                    let mut s = self.clone();
                    s.strides = vec![self.strides[i]];
                    s.dilation = vec![self.dilation[i]];
                    if let Padding::Explicit(p) = &self.padding {
                        s.padding = Padding::Explicit(vec![p[i]]);
                    }
                    Some(s.out_spatial(what, &[xi], &[ki])?[0])
                }
                _ => None,
            });
        }
        Ok(out)
    }
}

// ---- conv ----

/// `Conv(x, w)`. A zero padding of the spatial dims of `x` (Keras' `ZeroPadding2D` before
/// a strided convolution with `valid` padding, as in MobileNetV2) folds into an explicit
/// padding of the convolution: the kernels pad a copy of each image anyway, so the padded
/// tensor is never made, and the input gradient comes out unpadded (no slice of a padded
/// gradient). The `Pad` node stays in the graph for any other reader.
pub fn conv(x: &Tensor, w: &Tensor, spec: &Arc<ConvSpec>) -> Result<Tensor> {
    if let Some((inner, folded)) = fold_pad(x, spec) {
        return Tensor::new(Op::Conv(Arc::new(folded)), vec![inner, w.clone()]);
    }
    Tensor::new(Op::Conv(spec.clone()), vec![x.clone(), w.clone()])
}

/// The unpadded input and the spec with the padding added, where `x` is a zero `Pad` of
/// spatial dims only and `spec`'s padding is explicit.
fn fold_pad(x: &Tensor, spec: &ConvSpec) -> Option<(Tensor, ConvSpec)> {
    let Op::Pad { pads, value } = x.op() else {
        return None;
    };
    let Padding::Explicit(own) = &spec.padding else {
        return None;
    };
    let n = spec.nsp();
    let edges_unpadded = pads.len() == n + 2 && pads[0] == (0, 0) && pads[n + 1] == (0, 0);
    if *value != 0.0 || !edges_unpadded || own.len() != n {
        return None;
    }
    let padding = (0..n)
        .map(|i| (own[i].0 + pads[1 + i].0, own[i].1 + pads[1 + i].1))
        .collect();
    let folded = ConvSpec {
        padding: Padding::Explicit(padding),
        ..spec.clone()
    };
    Some((x.input(0).clone(), folded))
}

pub fn infer_conv(spec: &ConvSpec, x: &Tensor, w: &Tensor) -> Result<(Shape, DType)> {
    check_float("conv", x, w)?;
    let (_, cout) = check_xw(spec, "conv", x, w, "x")?;
    let n = spec.nsp();
    let xd = x.shape().dims();
    let mut dims = vec![xd[0]];
    dims.extend(spec.out_static("conv", &xd[1..=n], &w.shape().dims()[..n])?);
    dims.push(cout);
    Ok((Shape(dims), x.dtype()))
}

/// Checks `x` against `w` (ranks and channel counts); returns (cin, cout) where known.
fn check_xw(
    spec: &ConvSpec,
    what: &str,
    x: &Tensor,
    w: &Tensor,
    x_arg: &str,
) -> Result<(Dim, Dim)> {
    spec.validate(what)?;
    let n = spec.nsp();
    check_rank(what, x_arg, x, n + 2, "(batch, *spatial, channels)")?;
    check_rank(
        what,
        "kernel",
        w,
        n + 2,
        "(*kernel_size, in_channels / groups, out_channels)",
    )?;
    let cin = x.shape().dims()[n + 1];
    let (kin, cout) = (w.shape().dims()[n], w.shape().dims()[n + 1]);
    if let (Some(c), Some(k)) = (cin, kin) {
        if c != k * spec.groups {
            return Err(value_err!(
                "{what}: the input has {c} channels but the kernel expects {} ({k} per group x {} groups); kernel shape {}",
                k * spec.groups,
                spec.groups,
                w.shape()
            ));
        }
    }
    if let Some(co) = cout {
        if co % spec.groups != 0 {
            return Err(value_err!(
                "{what}: the kernel's {co} output channels do not split into {} groups",
                spec.groups
            ));
        }
    }
    Ok((cin, cout))
}

pub fn vjp_conv(spec: &Arc<ConvSpec>, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let (x, w) = (node.input(0), node.input(1));
    Ok(vec![
        Some(conv_input_grad(g, w, &shape_of(x)?, spec)?),
        Some(conv_kernel_grad(x, g, &shape_of(w)?, spec)?),
    ])
}

pub fn cpu_conv(spec: &ConvSpec, x: &Value, w: &Value) -> Result<Value> {
    cpu::forward(&forward_geom(spec, x.shape(), w.shape())?, x, w)
}

/// The geometry of a forward convolution of inputs of shapes `xs`, `ws`.
pub fn forward_geom(spec: &ConvSpec, xs: &[usize], ws: &[usize]) -> Result<cpu::Geom> {
    let n = spec.nsp();
    if xs[n + 1] != ws[n] * spec.groups {
        return Err(value_err!(
            "conv: the input has {} channels but the kernel expects {}",
            xs[n + 1],
            ws[n] * spec.groups
        ));
    }
    cpu::Geom::new(spec, xs, ws, None)
}

/// The geometry each primitive's kernel runs with, from runtime shapes (`s` the host value
/// of the target-shape input), raising the CPU wrappers' errors: for device lowerings,
/// which must reject exactly what the CPU path rejects.
pub fn conv_geom(spec: &ConvSpec, xs: &[usize], ws: &[usize]) -> Result<cpu::Geom> {
    let n = spec.nsp();
    if xs.len() == n + 2 && ws.len() == n + 2 && xs[n + 1] != ws[n] * spec.groups {
        return Err(value_err!(
            "conv: the input has {} channels but the kernel expects {}",
            xs[n + 1],
            ws[n] * spec.groups
        ));
    }
    cpu::Geom::new(spec, xs, ws, None)
}

// ---- conv_input_grad ----

pub fn conv_input_grad(
    g: &Tensor,
    w: &Tensor,
    x_shape: &Tensor,
    spec: &Arc<ConvSpec>,
) -> Result<Tensor> {
    Tensor::new(
        Op::ConvInputGrad(spec.clone()),
        vec![g.clone(), w.clone(), x_shape.clone()],
    )
}

pub fn infer_input_grad(
    spec: &ConvSpec,
    g: &Tensor,
    w: &Tensor,
    s: &Tensor,
) -> Result<(Shape, DType)> {
    const WHAT: &str = "conv_transpose";
    check_float(WHAT, g, w)?;
    let n = spec.nsp();
    check_rank(WHAT, "x", g, n + 2, "(batch, *spatial, channels)")?;
    check_rank(
        WHAT,
        "kernel",
        w,
        n + 2,
        "(*kernel_size, out_channels / groups, in_channels)",
    )?;
    let out = shape_input(WHAT, s, n + 2)?;
    spec.validate(WHAT)?;
    let (gc, wo) = (g.shape().dims()[n + 1], w.shape().dims()[n + 1]);
    if let (Some(a), Some(b)) = (gc, wo) {
        if a != b {
            return Err(value_err!("{WHAT}: the input has {a} channels but the kernel's last dim is {b}; kernel shape {}", w.shape()));
        }
    }
    if let (Some(c), Some(k)) = (out[n + 1], w.shape().dims()[n]) {
        if c != k * spec.groups {
            return Err(value_err!(
                "{WHAT}: output_shape has {c} channels but the kernel gives {}",
                k * spec.groups
            ));
        }
    }
    // The output must be a size whose forward convolution has g's spatial size.
    let expect = spec.out_static(WHAT, &out[1..=n], &w.shape().dims()[..n])?;
    for (i, (e, a)) in expect.iter().zip(&g.shape().dims()[1..=n]).enumerate() {
        if let (Some(e), Some(a)) = (e, a) {
            if e != a {
                return Err(value_err!(
                    "{WHAT}: output_shape {} is inconsistent with the input: spatial dim {i} would convolve back to {e}, but the input has {a}",
                    Shape(out.clone())
                ));
            }
        }
    }
    Ok((Shape(out), g.dtype()))
}

/// `dx = ConvInputGrad(gy, w)` is linear in both: upstream `h` (x-shaped) gives
/// `d gy = Conv(h, w)` and `d w = ConvKernelGrad(h, gy)`.
pub fn vjp_input_grad(
    spec: &Arc<ConvSpec>,
    node: &Tensor,
    h: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let (gy, w) = (node.input(0), node.input(1));
    Ok(vec![
        Some(conv(h, w, spec)?),
        Some(conv_kernel_grad(h, gy, &shape_of(w)?, spec)?),
        None,
    ])
}

pub fn cpu_input_grad(spec: &ConvSpec, g: &Value, w: &Value, s: &Value) -> Result<Value> {
    let xs = target("conv_transpose", s, g.shape())?;
    let geo = cpu::Geom::new(spec, &xs, w.shape(), Some(g.shape()))?;
    cpu::input_grad(&geo, g, w)
}

pub fn input_grad_geom(
    spec: &ConvSpec,
    gs: &[usize],
    ws: &[usize],
    s: &Value,
) -> Result<cpu::Geom> {
    cpu::Geom::new(spec, &target("conv_transpose", s, gs)?, ws, Some(gs))
}

// ---- conv_kernel_grad ----

pub fn conv_kernel_grad(
    x: &Tensor,
    g: &Tensor,
    w_shape: &Tensor,
    spec: &Arc<ConvSpec>,
) -> Result<Tensor> {
    Tensor::new(
        Op::ConvKernelGrad(spec.clone()),
        vec![x.clone(), g.clone(), w_shape.clone()],
    )
}

pub fn infer_kernel_grad(
    spec: &ConvSpec,
    x: &Tensor,
    g: &Tensor,
    s: &Tensor,
) -> Result<(Shape, DType)> {
    check_float("conv_kernel_grad", x, g)?;
    let n = spec.nsp();
    spec.validate("conv_kernel_grad")?;
    check_rank(
        "conv_kernel_grad",
        "x",
        x,
        n + 2,
        "(batch, *spatial, channels)",
    )?;
    check_rank(
        "conv_kernel_grad",
        "gradient",
        g,
        n + 2,
        "(batch, *spatial, channels)",
    )?;
    Ok((Shape(shape_input("conv_kernel_grad", s, n + 2)?), x.dtype()))
}

/// `dw = ConvKernelGrad(x, gy)`: upstream `h` (kernel-shaped) gives
/// `d x = ConvInputGrad(gy, h)` and `d gy = Conv(x, h)`.
pub fn vjp_kernel_grad(
    spec: &Arc<ConvSpec>,
    node: &Tensor,
    h: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let (x, gy) = (node.input(0), node.input(1));
    Ok(vec![
        Some(conv_input_grad(gy, h, &shape_of(x)?, spec)?),
        Some(conv(x, h, spec)?),
        None,
    ])
}

pub fn cpu_kernel_grad(spec: &ConvSpec, x: &Value, g: &Value, s: &Value) -> Result<Value> {
    let ws = target("conv_kernel_grad", s, x.shape())?;
    let geo = cpu::Geom::new(spec, x.shape(), &ws, Some(g.shape()))?;
    if g.is_empty() {
        // No output position (an empty batch, or `same` over an empty axis): a sum of nothing.
        return Ok(Value::full(x.dtype(), &ws, 0.0));
    }
    cpu::kernel_grad(&geo, x, g)
}

pub fn kernel_grad_geom(
    spec: &ConvSpec,
    xs: &[usize],
    gs: &[usize],
    s: &Value,
) -> Result<cpu::Geom> {
    cpu::Geom::new(spec, xs, &target("conv_kernel_grad", s, xs)?, Some(gs))
}

// ---- helpers ----

fn check_float(what: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if !a.dtype().is_float() || a.dtype() != b.dtype() {
        return Err(Error::Type(format!(
            "{what}: input and kernel must have the same float dtype, got {} and {}",
            a.dtype(),
            b.dtype()
        )));
    }
    Ok(())
}

fn check_rank(what: &str, arg: &str, t: &Tensor, rank: usize, layout: &str) -> Result<()> {
    if t.rank() != rank {
        return Err(value_err!(
            "{what}: {arg} must have rank {rank} {layout}, got shape {}",
            t.shape()
        ));
    }
    Ok(())
}

fn shape_input(what: &str, s: &Tensor, rank: usize) -> Result<Vec<Dim>> {
    if !s.dtype().is_int() || s.rank() != 1 {
        return Err(Error::Type(format!(
            "{what}: the shape argument must be a 1-D int tensor, got {} {}",
            s.dtype(),
            s.shape()
        )));
    }
    let p = partial_value(s).unwrap_or_else(|| vec![None; s.shape().dims()[0].unwrap_or(rank)]);
    if p.len() != rank {
        return Err(value_err!(
            "{what}: the shape argument has {} entries, expected {rank}",
            p.len()
        ));
    }
    Ok(p.into_iter()
        .map(|d| d.and_then(|d| (d >= 0).then_some(d as usize)))
        .collect())
}

fn target(what: &str, s: &Value, like: &[usize]) -> Result<Vec<usize>> {
    let t = s.to_i64_vec();
    if t.len() != like.len() || t.iter().any(|&d| d < 0) {
        return Err(value_err!("{what}: bad target shape {t:?}"));
    }
    Ok(t.into_iter().map(|d| d as usize).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(shape: &[usize], seed: u64) -> (Value, Vec<f64>) {
        // A small LCG: deterministic, no dependency.
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let v: Vec<f64> = (0..shape.iter().product::<usize>())
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) - 0.5
            })
            .collect();
        (Value::from_vec(shape, v.clone()).unwrap(), v)
    }

    fn dot(a: &Value, b: &[f64]) -> f64 {
        a.to_f64_vec().iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// `<Conv(x, w), g> = <x, ConvInputGrad(g, w)> = <w, ConvKernelGrad(x, g)>` on every
    /// kernel path: Winograd, padded-segment im2col, grouped im2col, depthwise loops (and
    /// the 3x3 forward with its taps in registers, which is also the stride-1 input
    /// gradient), strided col2im, 1-D and 3-D.
    #[test]
    fn the_three_primitives_are_adjoint() {
        let cases: Vec<(Vec<usize>, Vec<usize>, ConvSpec)> = vec![
            (
                vec![2, 7, 9, 16],
                vec![3, 3, 16, 17],
                spec(&[1, 1], &[1, 1], Padding::Same, 1),
            ),
            (
                vec![3, 8, 7, 5],
                vec![3, 2, 5, 4],
                spec(&[2, 1], &[1, 1], Padding::Same, 1),
            ),
            (
                vec![2, 9, 9, 4],
                vec![3, 3, 4, 6],
                spec(&[1, 1], &[2, 3], Padding::Explicit(vec![(1, 2), (0, 1)]), 1),
            ),
            (
                vec![2, 7, 6, 6],
                vec![3, 3, 2, 9],
                spec(&[2, 2], &[1, 1], Padding::Same, 3),
            ),
            (
                vec![2, 7, 6, 4],
                vec![3, 3, 1, 8],
                spec(&[1, 2], &[1, 1], Padding::Same, 4),
            ),
            (
                vec![2, 9, 8, 32],
                vec![3, 3, 1, 32],
                spec(
                    &[2, 1],
                    &[1, 2],
                    Padding::Explicit(vec![(0, 1), (2, 1)]),
                    32,
                ),
            ),
            (
                vec![2, 9, 8, 16],
                vec![3, 3, 1, 16],
                spec(
                    &[1, 1],
                    &[2, 1],
                    Padding::Explicit(vec![(1, 4), (0, 2)]),
                    16,
                ),
            ),
            (
                vec![1, 11, 3],
                vec![4, 3, 2],
                spec(&[3], &[1], Padding::Explicit(vec![(3, 0)]), 1),
            ),
            (
                vec![2, 4, 5, 6, 2],
                vec![2, 3, 2, 2, 3],
                spec(&[2, 1, 2], &[1, 1, 1], Padding::Same, 1),
            ),
        ];
        for (i, (xs, ws, sp)) in cases.into_iter().enumerate() {
            let (x, xv) = values(&xs, 1 + i as u64);
            let (w, wv) = values(&ws, 100 + i as u64);
            let y = cpu_conv(&sp, &x, &w).unwrap();
            let (g, gv) = values(y.shape(), 200 + i as u64);
            let shape = |s: &[usize]| {
                Value::from_vec(&[s.len()], s.iter().map(|&d| d as i64).collect()).unwrap()
            };
            let dx = cpu_input_grad(&sp, &g, &w, &shape(&xs)).unwrap();
            let dw = cpu_kernel_grad(&sp, &x, &g, &shape(&ws)).unwrap();
            assert_eq!((dx.shape(), dw.shape()), (xs.as_slice(), ws.as_slice()));
            let (a, b, c) = (dot(&y, &gv), dot(&dx, &xv), dot(&dw, &wv));
            assert!(
                (a - b).abs() < 1e-9 * a.abs().max(1.0) && (a - c).abs() < 1e-9 * a.abs().max(1.0),
                "case {i}: {a} {b} {c}"
            );
        }
    }

    fn spec(s: &[usize], d: &[usize], padding: Padding, groups: usize) -> ConvSpec {
        ConvSpec {
            strides: s.to_vec(),
            dilation: d.to_vec(),
            padding,
            groups,
        }
    }

    /// A zero pad of the spatial dims folds into an explicit padding; a pad of the
    /// channels, a nonzero pad and a `same` convolution keep the `Pad` node.
    #[test]
    fn a_spatial_zero_pad_folds_into_the_convolution() {
        use crate::ops::movement::pad;
        use crate::ops::source::placeholder;
        let x = placeholder(
            "x",
            Shape(vec![Some(2), Some(8), Some(6), Some(4)]),
            DType::F32,
            None,
        )
        .unwrap();
        let w = placeholder(
            "w",
            Shape(vec![Some(3), Some(3), Some(1), Some(4)]),
            DType::F32,
            None,
        )
        .unwrap();
        let own = Arc::new(spec(
            &[2, 2],
            &[1, 1],
            Padding::Explicit(vec![(1, 0), (0, 0)]),
            4,
        ));
        let p = pad(&x, &[(0, 0), (0, 1), (2, 1), (0, 0)], 0.0).unwrap();
        let y = conv(&p, &w, &own).unwrap();
        assert!(y.input(0).same(&x));
        let Op::Conv(folded) = y.op() else {
            panic!("a conv node")
        };
        assert_eq!(folded.padding, Padding::Explicit(vec![(1, 1), (2, 1)]));
        assert_eq!(y.shape().dims(), &[Some(2), Some(4), Some(4), Some(4)]);
        let channels = pad(&x, &[(0, 0), (0, 1), (0, 0), (0, 4)], 0.0).unwrap();
        let w8 = placeholder(
            "w8",
            Shape(vec![Some(3), Some(3), Some(1), Some(8)]),
            DType::F32,
            None,
        )
        .unwrap();
        let spec8 = Arc::new(spec(
            &[2, 2],
            &[1, 1],
            Padding::Explicit(vec![(0, 0); 2]),
            8,
        ));
        for (input, kernel, sp) in [
            (channels, &w8, &spec8),
            (
                pad(&x, &[(0, 0), (0, 1), (0, 1), (0, 0)], 1.0).unwrap(),
                &w,
                &own,
            ),
            (
                p.clone(),
                &w,
                &Arc::new(spec(&[2, 2], &[1, 1], Padding::Same, 4)),
            ),
        ] {
            assert!(conv(&input, kernel, sp).unwrap().input(0).same(&input));
        }
    }

    #[test]
    fn same_over_an_empty_axis_is_empty_and_so_are_its_gradients() {
        let sp = spec(&[1, 2], &[1, 1], Padding::Same, 1);
        let (x, _) = values(&[2, 0, 3, 2], 1);
        let (w, _) = values(&[2, 2, 2, 3], 2);
        let y = cpu_conv(&sp, &x, &w).unwrap();
        assert_eq!(y.shape(), &[2, 0, 2, 3]);
        let shape = |s: &[usize]| {
            Value::from_vec(&[s.len()], s.iter().map(|&d| d as i64).collect()).unwrap()
        };
        assert_eq!(
            cpu_input_grad(&sp, &y, &w, &shape(&[2, 0, 3, 2]))
                .unwrap()
                .shape(),
            &[2, 0, 3, 2]
        );
        let dw = cpu_kernel_grad(&sp, &x, &y, &shape(&[2, 2, 2, 3])).unwrap();
        assert_eq!(
            (dw.shape(), dw.to_f64_vec()),
            (&[2usize, 2, 2, 3][..], vec![0.0; 24])
        );
    }

    #[test]
    fn same_padding_puts_the_odd_element_last() {
        assert_eq!(Padding::Same.resolve(0, 5, 4, 1), (1, 2));
        assert_eq!(Padding::Same.resolve(0, 6, 3, 2), (0, 1));
        assert_eq!(Padding::Same.resolve(0, 7, 3, 2), (1, 1));
        assert_eq!(out_len(2, 3, 1, (0, 0)), None);
        // Empty axes: `same` and `causal` give no output, `valid` fits no window.
        for (eff, stride) in [(1, 1), (2, 1), (3, 2), (5, 3)] {
            assert_eq!(
                out_len(0, eff, stride, Padding::Same.resolve(0, 0, eff, stride)),
                Some(0)
            );
            assert_eq!(out_len(0, eff, 1, (eff - 1, 0)), Some(0));
        }
        assert_eq!(out_len(0, 2, 1, (0, 0)), None);
    }
}
