//! Reverse-mode differentiation over the graph. Each primitive's VJP rule (in its family
//! file) returns graph tensors, so the gradient is itself a graph: it runs on every device
//! and can be differentiated again.

use crate::error::{Error, Result};
use crate::graph::{topo_order, Tensor};
use crate::ops::build::{add, constant_like};
use crate::ops::Op;
use std::collections::{HashMap, HashSet};

/// Gradients of `sum(y * gy)` (`gy` defaults to ones) with respect to each of `xs`;
/// `None` where `y` does not depend on that tensor, as in TensorFlow.
pub fn gradients(y: &Tensor, xs: &[Tensor], gy: Option<Tensor>) -> Result<Vec<Option<Tensor>>> {
    grads_impl(y, xs, gy, false)
}

/// Like `gradients`, but each of `xs` is a leaf: nothing flows past it to its inputs.
/// Loop bodies use this, since their captured outer tensors are fed as leaves.
pub fn gradients_at_leaves(y: &Tensor, xs: &[Tensor]) -> Result<Vec<Option<Tensor>>> {
    grads_impl(y, xs, None, true)
}

fn grads_impl(y: &Tensor, xs: &[Tensor], gy: Option<Tensor>, stop_at_xs: bool) -> Result<Vec<Option<Tensor>>> {
    if !y.dtype().is_float() {
        return Err(Error::Type(format!("gradients: the loss must be a float tensor, got {}", y.dtype())));
    }
    let targets: HashSet<u64> = xs.iter().map(|x| x.id()).collect();
    let order = topo_order(std::slice::from_ref(y), &|t| stop_at_xs && targets.contains(&t.id()));

    // Which nodes lie on a path from some x to y.
    let mut depends: HashSet<u64> = HashSet::new();
    for t in &order {
        if targets.contains(&t.id()) || t.inputs().iter().any(|i| depends.contains(&i.id())) {
            depends.insert(t.id());
        }
    }
    let mut grads: HashMap<u64, Tensor> = HashMap::new();
    if depends.contains(&y.id()) {
        let seed = match gy {
            Some(g) => g,
            None => constant_like(y, 1.0)?,
        };
        grads.insert(y.id(), seed);
    }
    // Gradients flowing into each result of a multi-result node, by result index.
    let mut tuple_grads: HashMap<u64, Vec<Option<Tensor>>> = HashMap::new();
    for t in order.iter().rev() {
        if stop_at_xs && targets.contains(&t.id()) {
            continue;
        }
        let gs = if matches!(t.op(), Op::Loop(_) | Op::HostCall(_) | Op::CtcDecode(_)) {
            // A multi-result node: gather the gradients its `TupleGet` users received.
            let Some(tg) = tuple_grads.remove(&t.id()) else { continue };
            match multi_result_vjp(t, tg)? {
                Some(gs) => gs,
                None => continue,
            }
        } else {
            let Some(g) = grads.get(&t.id()).cloned() else { continue };
            if let Op::TupleGet(k) = t.op() {
                let src = t.input(0);
                let slot = tuple_grads.entry(src.id()).or_default();
                if slot.len() <= *k {
                    slot.resize(*k + 1, None);
                }
                slot[*k] = Some(match slot[*k].take() {
                    Some(prev) => add(&prev, &g)?,
                    None => g,
                });
                continue;
            }
            if t.inputs().is_empty() || matches!(t.op(), Op::StopGradient) {
                continue;
            }
            t.op().vjp(t, &g)?
        };
        for (inp, gi) in t.inputs().iter().zip(gs) {
            let Some(gi) = gi else { continue };
            if !depends.contains(&inp.id()) || !inp.dtype().is_float() {
                continue;
            }
            let acc = match grads.remove(&inp.id()) {
                Some(prev) => add(&prev, &gi)?,
                None => gi,
            };
            grads.insert(inp.id(), acc);
        }
    }
    Ok(xs.iter().map(|x| grads.get(&x.id()).cloned()).collect())
}

/// The VJP of a multi-result node, given the gradient of each result read so far (`None`
/// when the node is not differentiable, as CTC decoding).
fn multi_result_vjp(t: &Tensor, mut gs: Vec<Option<Tensor>>) -> Result<Option<Vec<Option<Tensor>>>> {
    Ok(Some(match t.op() {
        Op::Loop(body) => {
            gs.resize(body.n_results(), None);
            crate::ops::control::vjp_loop(t, &gs)?
        }
        Op::HostCall(h) => {
            gs.resize(h.results.len(), None);
            crate::ops::host::vjp(t, &gs)?
        }
        Op::CtcDecode(_) => return Ok(None),
        other => return Err(crate::error::Error::Runtime(format!("{} has a single result", other.name()))),
    }))
}
