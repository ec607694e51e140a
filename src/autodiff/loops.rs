//! The VJP of a loop: a reverse loop whose body is the VJP of the forward body.

use crate::base::error::Result;
use crate::ops::build::*;
use crate::ops::control::{build_loop, captures, tuple_get};
use crate::ops::graph::{topo_order, Tensor};
use crate::ops::{loop_opt, Op, ReduceOp};
use std::collections::HashSet;

/// The VJP of loop `node`: a reverse loop whose body is the VJP of the forward body. The forward
/// nodes that body reads are saved per step by the forward loop (residuals, see
/// `loop_opt`) and fed to it as step inputs, so it does not compute the forward cell again.
/// `gs[k]` is the gradient flowing into result `k` (None where nothing flows); `wanted[i]`
/// whether the gradient of input `i` is asked for (the gradient of a Keras RNN's input
/// sequence, a placeholder, is not: its per-step `dx` matmul is not built).
pub fn vjp_loop(
    node: &Tensor,
    gs: &[Option<Tensor>],
    wanted: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let Op::Loop(body) = node.op() else {
        unreachable!("vjp_loop on a loop node")
    };
    let (nq, ns, no, nc) = (
        body.seq_phs.len(),
        body.state_phs.len(),
        body.outputs.len(),
        body.captured.len(),
    );
    let ins = node.inputs();
    // Per-step results with an incoming gradient: outputs, and residuals saved for an
    // earlier VJP (a second-order gradient flows into those).
    let per_step: Vec<(usize, Tensor)> = body
        .outputs
        .iter()
        .cloned()
        .enumerate()
        .chain(
            body.hidden()
                .into_iter()
                .enumerate()
                .map(|(j, h)| (no + 2 * ns + j, h)),
        )
        .filter(|(k, t)| gs.get(*k).is_some_and(|g| g.is_some()) && t.dtype().is_float())
        .collect();
    // Gradient placeholders for the body's results at one step.
    let mk = |t: &Tensor, what: &str, i: usize| {
        crate::ops::source::placeholder(
            &format!("loop_grad_{what}_{i}"),
            t.shape().clone(),
            t.dtype(),
            None,
        )
    };
    let gout_phs: Vec<Tensor> = per_step
        .iter()
        .map(|(k, t)| mk(t, "out", *k))
        .collect::<Result<_>>()?;
    let gstate_phs: Vec<Tensor> = body
        .state_phs
        .iter()
        .enumerate()
        .map(|(i, t)| mk(t, "state", i))
        .collect::<Result<_>>()?;
    // y = sum(out * g_out) + sum(new_state * g_state): its gradients are the body's VJP.
    let mut terms = Vec::new();
    let pairs = per_step
        .iter()
        .map(|(_, t)| t)
        .zip(&gout_phs)
        .chain(body.new_states.iter().zip(&gstate_phs));
    for (o, g) in pairs {
        if o.dtype().is_float() {
            terms.push(reduce(
                ReduceOp::Sum,
                &mul(o, g)?,
                &(0..o.rank()).collect::<Vec<_>>(),
                false,
            )?);
        }
    }
    let wrt: Vec<Tensor> = body
        .seq_phs
        .iter()
        .chain(&body.state_phs)
        .chain(&body.captured)
        .cloned()
        .collect();
    let mut grads: Vec<Option<Tensor>> = vec![None; wrt.len()];
    if let Some(first) = terms.first() {
        let mut y = first.clone();
        for t in &terms[1..] {
            y = add(&y, &cast(t, y.dtype())?)?;
        }
        let plain = super::gradients_at_leaves(&y, &wrt)?;
        let grad_leaves: Vec<Tensor> = gout_phs.iter().chain(&gstate_phs).cloned().collect();
        grads = loop_opt::hoist_transposes(&plain, &body.captured, &grad_leaves)?;
    }
    // Float step inputs and captured tensors the body's result depends on get a gradient:
    // stacked per step for step inputs, summed over the steps (a state) for captured.
    let float = |i: usize| {
        wrt[i].dtype().is_float() && grads[i].is_some() && wanted.get(i).copied().unwrap_or(true)
    };
    let seq_g: Vec<usize> = (0..nq).filter(|&i| float(i)).collect();
    let cap_g: Vec<usize> = (0..nc).filter(|&i| float(nq + ns + i)).collect();
    let acc_phs: Vec<Tensor> = cap_g
        .iter()
        .map(|&i| mk(&body.captured[i], "acc", i))
        .collect::<Result<_>>()?;
    let b_outputs: Vec<Tensor> = seq_g
        .iter()
        .map(|&i| grads[i].clone().expect("filtered"))
        .collect();
    let mut b_new_states = Vec::with_capacity(ns + cap_g.len());
    for i in 0..ns {
        b_new_states.push(match &grads[nq + i] {
            Some(g) => g.clone(),
            None => zeros_like(&wrt[nq + i])?,
        });
    }
    for (acc, &i) in acc_phs.iter().zip(&cap_g) {
        b_new_states.push(add(acc, grads[nq + ns + i].as_ref().expect("filtered"))?);
    }
    // Step inputs of the backward loop: the forward step inputs and state histories it
    // reads, the saved residuals, and the gradients of the per-step results.
    let fwd_leaves: Vec<Tensor> = body
        .seq_phs
        .iter()
        .chain(&body.state_phs)
        .cloned()
        .collect();
    let grad_leaves: Vec<Tensor> = gout_phs
        .iter()
        .chain(&gstate_phs)
        .chain(&acc_phs)
        .cloned()
        .collect();
    let targets: Vec<Tensor> = b_outputs.iter().chain(&b_new_states).cloned().collect();
    let saved = if crate::base::config::get()?.loop_save_residuals {
        let r = loop_opt::residuals(&fwd_leaves, &grad_leaves, &body.captured, &targets);
        // Only what the forward plan can compute from its own feeds.
        let mut roots: Vec<Tensor> = body
            .outputs
            .iter()
            .chain(&body.new_states)
            .cloned()
            .collect();
        roots.extend(r.iter().cloned());
        let caps: HashSet<u64> = body.captured.iter().map(|t| t.id()).collect();
        if captures(&fwd_leaves, &roots, &[])
            .iter()
            .all(|t| caps.contains(&t.id()))
        {
            r
        } else {
            Vec::new()
        }
    } else {
        Vec::new()
    };
    let mut b_leaves: Vec<Tensor> = saved.clone();
    b_leaves.extend(grad_leaves.iter().chain(&body.captured).cloned());
    let used = read_leaves(&fwd_leaves, &b_leaves, &targets);
    let mut b_seqs = Vec::new();
    let mut b_seq_phs = Vec::new();
    for (i, ph) in fwd_leaves.iter().enumerate() {
        if used.contains(&ph.id()) {
            b_seqs.push(if i < nq {
                ins[i].clone()
            } else {
                tuple_get(node, no + ns + (i - nq))?
            });
            b_seq_phs.push(ph.clone());
        }
    }
    for r in &saved {
        b_seqs.push(tuple_get(node, body.save(r)?)?);
        b_seq_phs.push(r.clone());
    }
    for ((k, _), ph) in per_step.iter().zip(&gout_phs) {
        b_seqs.push(gs[*k].clone().expect("filtered"));
        b_seq_phs.push(ph.clone());
    }
    if b_seqs.is_empty() {
        // Nothing per step is read; the first sequence still sets the number of steps.
        b_seqs.push(ins[0].clone());
        b_seq_phs.push(body.seq_phs[0].clone());
    }
    let mut b_init: Vec<Tensor> = Vec::with_capacity(ns + cap_g.len());
    for k in 0..ns {
        b_init.push(match gs.get(no + k).cloned().flatten() {
            Some(g) => g,
            None => zeros_like(&ins[nq + k])?,
        });
    }
    for &i in &cap_g {
        b_init.push(zeros_like(&ins[nq + ns + i])?);
    }
    let mut b_state_phs: Vec<Tensor> = gstate_phs.clone();
    b_state_phs.extend(acc_phs.iter().cloned());
    let bnode = build_loop(
        &b_seqs,
        &b_init,
        b_seq_phs,
        b_state_phs,
        b_outputs,
        b_new_states,
        !body.reverse,
    )?;
    let mut out: Vec<Option<Tensor>> = vec![None; ins.len()];
    for (j, &i) in seq_g.iter().enumerate() {
        out[i] = Some(tuple_get(&bnode, j)?);
    }
    let nb = seq_g.len();
    for k in 0..ns {
        out[nq + k] = Some(tuple_get(&bnode, nb + k)?);
    }
    for (j, &i) in cap_g.iter().enumerate() {
        out[nq + ns + i] = Some(tuple_get(&bnode, nb + ns + j)?);
    }
    // Integer inputs get no gradient.
    for (o, i) in out.iter_mut().zip(ins) {
        if !i.dtype().is_float() {
            *o = None;
        }
    }
    Ok(out)
}

/// Which of `leaves` the graph of `targets` reads, not looking past `stop`.
fn read_leaves(leaves: &[Tensor], stop: &[Tensor], targets: &[Tensor]) -> HashSet<u64> {
    let ids: HashSet<u64> = leaves.iter().chain(stop).map(|t| t.id()).collect();
    let leaf_ids: HashSet<u64> = leaves.iter().map(|t| t.id()).collect();
    topo_order(targets, &|t| ids.contains(&t.id()))
        .iter()
        .map(|t| t.id())
        .filter(|i| leaf_ids.contains(i))
        .collect()
}
