//! Reverse-mode differentiation over the graph. Each primitive's VJP rule (in its family
//! file) returns graph tensors, so the gradient is itself a graph: it runs on every device
//! and can be differentiated again.

use crate::base::error::{Error, Result};
use crate::ops::build::{add, concat, constant_like};
use crate::ops::graph::{topo_order, Tensor};
use crate::ops::movement::resolve_slice;
use crate::ops::{Op, SliceAxis};
use std::collections::{HashMap, HashSet};

mod loops;

/// Gradients of `sum(y * gy)` (`gy` defaults to ones) with respect to each of `xs`;
/// `None` where `y` does not depend on that tensor, as in TensorFlow.
pub fn gradients(y: &Tensor, xs: &[Tensor], gy: Option<Tensor>) -> Result<Vec<Option<Tensor>>> {
    let _phase = crate::base::progress::enter(crate::base::progress::Phase::Differentiate);
    grads_impl(y, xs, gy, false)
}

/// Like `gradients`, but each of `xs` is a leaf: nothing flows past it to its inputs.
/// Loop bodies use this, since their captured outer tensors are fed as leaves.
pub fn gradients_at_leaves(y: &Tensor, xs: &[Tensor]) -> Result<Vec<Option<Tensor>>> {
    grads_impl(y, xs, None, true)
}

fn grads_impl(
    y: &Tensor,
    xs: &[Tensor],
    gy: Option<Tensor>,
    stop_at_xs: bool,
) -> Result<Vec<Option<Tensor>>> {
    if !y.dtype().is_float() {
        return Err(Error::Type(format!(
            "gradients: the loss must be a float tensor, got {}",
            y.dtype()
        )));
    }
    let targets: HashSet<u64> = xs.iter().map(|x| x.id()).collect();
    let order = topo_order(std::slice::from_ref(y), &|t| {
        stop_at_xs && targets.contains(&t.id())
    });

    // Which nodes lie on a path from some x to y.
    let mut depends: HashSet<u64> = HashSet::new();
    for t in &order {
        if targets.contains(&t.id()) || t.inputs().iter().any(|i| depends.contains(&i.id())) {
            depends.insert(t.id());
        }
    }
    // The gradient contributions each node has received; summed when it is reached.
    let mut grads: HashMap<u64, Vec<Tensor>> = HashMap::new();
    if depends.contains(&y.id()) {
        let seed = match gy {
            Some(g) => g,
            None => constant_like(y, 1.0)?,
        };
        grads.insert(y.id(), vec![seed]);
    }
    // Gradients flowing into each result of a multi-result node, by result index.
    let mut tuple_grads: HashMap<u64, Vec<Option<Tensor>>> = HashMap::new();
    for t in order.iter().rev() {
        if stop_at_xs && targets.contains(&t.id()) {
            continue;
        }
        let gs = if matches!(t.op(), Op::Loop(_) | Op::HostCall(_) | Op::CtcDecode(_)) {
            // A multi-result node: gather the gradients its `TupleGet` users received.
            let Some(tg) = tuple_grads.remove(&t.id()) else {
                continue;
            };
            let wanted: Vec<bool> = t
                .inputs()
                .iter()
                .map(|i| depends.contains(&i.id()) && i.dtype().is_float())
                .collect();
            match multi_result_vjp(t, tg, &wanted)? {
                Some(gs) => gs,
                None => continue,
            }
        } else {
            let Some(g) = summed(&mut grads, t.id())? else {
                continue;
            };
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
            grads.entry(inp.id()).or_default().push(gi);
        }
    }
    xs.iter().map(|x| summed(&mut grads, x.id())).collect()
}

/// The total gradient of node `id`: its contributions summed (and kept as one).
fn summed(grads: &mut HashMap<u64, Vec<Tensor>>, id: u64) -> Result<Option<Tensor>> {
    let Some(parts) = grads.get_mut(&id) else {
        return Ok(None);
    };
    if parts.len() > 1 {
        let total = sum_parts(std::mem::take(parts))?;
        parts.push(total);
    }
    Ok(parts.first().cloned())
}

/// Adds gradient contributions in the order they arrived. Slice gradients that tile one
/// axis of the same tensor (the gradient of `z` when a cell slices `z` into gates) are
/// one concatenation instead: no zero-filled buffers and no adds.
fn sum_parts(mut parts: Vec<Tensor>) -> Result<Tensor> {
    if let Some((used, cat)) = tiling_slice_grads(&parts)? {
        let at = used[0];
        parts[at] = cat;
        let mut k = 0;
        parts.retain(|_| {
            k += 1;
            k - 1 == at || !used.contains(&(k - 1))
        });
    }
    let mut total = parts[0].clone();
    for p in &parts[1..] {
        total = add(&total, p)?;
    }
    Ok(total)
}

/// Indices of the `SliceGrad` parts that together cover an axis of one tensor exactly
/// (unit steps, static bounds, full on every other axis), and their concatenation.
fn tiling_slice_grads(parts: &[Tensor]) -> Result<Option<(Vec<usize>, Tensor)>> {
    // (part, like, axis, start, len)
    let mut pieces: Vec<(usize, u64, usize, usize, usize)> = Vec::new();
    for (k, p) in parts.iter().enumerate() {
        let Op::SliceGrad(spec) = p.op() else {
            continue;
        };
        let like = p.input(1);
        let full = |s: &SliceAxis| s.start.is_none() && s.stop.is_none() && s.step == 1;
        let mut cut = spec.iter().enumerate().filter(|(_, s)| !full(s));
        let (Some((axis, s)), None) = (cut.next(), cut.next()) else {
            continue;
        };
        let Some(n) = like.shape().dims()[axis] else {
            continue;
        };
        let (start, _, step, len) = resolve_slice(s, n);
        if step == 1 && spec.len() == like.rank() && p.input(0).dtype() == like.dtype() {
            pieces.push((k, like.id(), axis, start as usize, len));
        }
    }
    while let Some(&(_, like, axis, _, _)) = pieces.first() {
        let (mut group, rest): (Vec<_>, Vec<_>) =
            pieces.into_iter().partition(|p| p.1 == like && p.2 == axis);
        pieces = rest;
        group.sort_by_key(|p| p.3);
        let n = parts[group[0].0].input(1).shape().dims()[axis].expect("static, checked");
        let mut end = 0;
        let tiles = group.len() > 1
            && group.iter().all(|p| {
                let ok = p.3 == end;
                end += p.4;
                ok
            })
            && end == n;
        if tiles {
            let gs: Vec<Tensor> = group.iter().map(|p| parts[p.0].input(0).clone()).collect();
            let mut used: Vec<usize> = group.iter().map(|p| p.0).collect();
            used.sort_unstable();
            return Ok(Some((used, concat(&gs, axis)?)));
        }
    }
    Ok(None)
}

/// The VJP of a multi-result node, given the gradient of each result read so far (`None`
/// when the node is not differentiable, as CTC decoding).
/// `wanted[i]`: whether a gradient of input `i` is needed (the loop VJP skips the others).
fn multi_result_vjp(
    t: &Tensor,
    mut gs: Vec<Option<Tensor>>,
    wanted: &[bool],
) -> Result<Option<Vec<Option<Tensor>>>> {
    Ok(Some(match t.op() {
        Op::Loop(body) => {
            gs.resize(body.n_results(), None);
            loops::vjp_loop(t, &gs, wanted)?
        }
        Op::HostCall(h) => {
            gs.resize(h.results.len(), None);
            crate::ops::host::vjp(t, &gs)?
        }
        Op::CtcDecode(_) => return Ok(None),
        other => {
            return Err(crate::base::error::Error::Runtime(format!(
                "{} has a single result",
                other.name()
            )))
        }
    }))
}
