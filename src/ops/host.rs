//! Host callbacks: a node that calls a function supplied by the embedding layer (Python's
//! `py_function`) on concrete values. It has several results (read with `TupleGet`), and
//! its VJP is a second callback that differentiates whatever the function computed, so
//! the op is differentiable once.

use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::ops::graph::Tensor;
use std::sync::Arc;

/// A function run on the host while a plan executes.
pub trait HostFn: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    /// Computes the results from the input values. The inputs are the function's own: one
    /// that nothing else holds (`is_unique`) may be written in place and returned, or
    /// viewed by a result, without a copy.
    fn call(&self, inputs: Vec<Value>) -> Result<Vec<Value>>;
    /// Gradients of `sum(result_k * grads_k)` w.r.t. each input (`None`: not connected).
    fn vjp(&self, inputs: &[Value], grads: &[Value]) -> Result<Vec<Option<Value>>>;
}

#[derive(Debug)]
pub struct HostCall {
    pub f: Arc<dyn HostFn>,
    /// Static shape and dtype of each result.
    pub results: Vec<(Shape, DType)>,
    /// True for the VJP node: results are the input gradients.
    pub is_grad: bool,
}

pub fn host_call(
    f: Arc<dyn HostFn>,
    inputs: &[Tensor],
    results: Vec<(Shape, DType)>,
) -> Result<Tensor> {
    Tensor::new(
        Op::HostCall(Arc::new(HostCall {
            f,
            results,
            is_grad: false,
        })),
        inputs.to_vec(),
    )
}

pub fn result_spec(h: &HostCall, k: usize) -> Result<(Shape, DType)> {
    h.results.get(k).cloned().ok_or_else(|| {
        Error::Value(format!(
            "{}: result {k} requested, the function has {} results",
            h.f.name(),
            h.results.len()
        ))
    })
}

/// Runs the callback (or its VJP) on `args` and checks the results against the declared
/// dtypes. An argument that nothing else holds reaches the callback without a copy (the
/// CPU executor moves in the inputs that die at the node).
pub fn run(h: &HostCall, args: Vec<Value>) -> Result<Vec<Value>> {
    let out = if h.is_grad {
        // A grad node's results are the forward inputs' gradients, one per input.
        let (xs, gs) = args.split_at(h.results.len());
        let grads = h.f.vjp(xs, gs)?;
        grads
            .into_iter()
            .zip(xs)
            .map(|(g, x)| {
                g.map(|g| g.cast(x.dtype()))
                    .unwrap_or_else(|| Value::full(x.dtype(), x.shape(), 0.0))
            })
            .collect()
    } else {
        h.f.call(args)?
    };
    if out.len() != h.results.len() {
        return Err(Error::Type(format!(
            "{}: the function returned {} values, but Tout declares {}",
            h.f.name(),
            out.len(),
            h.results.len()
        )));
    }
    for (i, (v, (s, d))) in out.iter().zip(&h.results).enumerate() {
        if v.dtype() != *d {
            return Err(Error::Type(format!(
                "{}: result {i} has dtype {}, but Tout declares {d}",
                h.f.name(),
                v.dtype()
            )));
        }
        let fits = v.shape().len() == s.rank()
            && s.dims()
                .iter()
                .zip(v.shape())
                .all(|(a, b)| a.is_none_or(|a| a == *b));
        if !fits {
            return Err(Error::Value(format!(
                "{}: result {i} has shape {:?}, expected {s}",
                h.f.name(),
                v.shape()
            )));
        }
    }
    Ok(out)
}

/// The VJP: a grad callback node over [inputs.., result grads..] whose results are the
/// input gradients (float inputs only; the callback's own VJP is not differentiable).
pub fn vjp(node: &Tensor, gs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
    let Op::HostCall(h) = node.op() else {
        unreachable!("host vjp on a host call")
    };
    if h.is_grad {
        return Err(Error::Unsupported(format!(
            "{}: py_function is differentiable once; its gradient cannot be differentiated again",
            h.f.name()
        )));
    }
    let ins = node.inputs();
    let mut args: Vec<Tensor> = ins.to_vec();
    for (k, (s, d)) in h.results.iter().enumerate() {
        let _ = s;
        let g = match gs.get(k).cloned().flatten() {
            Some(g) => g,
            None => super::build::zeros_like(&super::control::tuple_get(node, k)?)?,
        };
        args.push(super::build::cast(&g, *d)?);
    }
    let results: Vec<(Shape, DType)> = ins.iter().map(|x| (x.shape().clone(), x.dtype())).collect();
    let gnode = Tensor::new(
        Op::HostCall(Arc::new(HostCall {
            f: h.f.clone(),
            results,
            is_grad: true,
        })),
        args,
    )?;
    ins.iter()
        .enumerate()
        .map(|(i, x)| {
            if x.dtype().is_float() {
                super::control::tuple_get(&gnode, i).map(Some)
            } else {
                Ok(None)
            }
        })
        .collect()
}
