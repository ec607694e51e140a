//! Rewrites of a loop body at graph-build time (called from `autodiff::loops::vjp_loop`),
//! so the compiler and the executors see plain loops:
//!
//! - **The VJP reads saved residuals.** The forward nodes the backward body reads (gate
//!   activations, `1 - y²`, shapes) become extra stacked results of the forward loop and
//!   step inputs of the backward loop, so the backward loop does not run the forward cell
//!   again. A residual is an interior node of the body graph fed as a leaf (a plan treats
//!   any fed tensor as a leaf), so no graph is copied. `FERROKERAS_LOOP_OPT=0`
//!   (`base::config`) turns this off. On the 2-core machine of `docs/performance.md` it
//!   takes a Keras LSTM(64) training step from ~12.5 to ~11.5 ms of CPU.
//! - **Loop-invariant operands are transposed once.** A product `x·W` in the body, `W`
//!   read from outside, has the gradient `g·Wᵀ`; the backward body is rewritten to read
//!   `Wᵀ` built once outside the loop (`hoist_transposes`), so `gemm` does not copy `W`
//!   transposed at every step.

use super::build::transpose;
use super::{Class, FusedOp, Op};
use crate::base::error::Result;
use crate::ops::graph::{topo_order, Tensor};
use std::collections::{HashMap, HashSet};

/// Rewrites a loop body's VJP (`grads`, as the plain VJP rules build it) so that each
/// product `g·Wᵀ` (`MatMul { tb: true }`) computed from the incoming gradients
/// (`grad_leaves`), `W` a matrix the body reads from outside (`captured`), reads `Wᵀ`
/// instead: a `transpose` of `W` alone, which the backward loop then captures, so it is
/// computed once per call rather than by `gemm` at every step. One transpose per captured
/// matrix; nodes that depend on the rewritten products are rebuilt on the new ones; the
/// rest of the graph (the forward nodes) is left as it is.
pub fn hoist_transposes(
    grads: &[Option<Tensor>],
    captured: &[Tensor],
    grad_leaves: &[Tensor],
) -> Result<Vec<Option<Tensor>>> {
    let caps: HashSet<u64> = captured.iter().map(|t| t.id()).collect();
    let gl: HashSet<u64> = grad_leaves.iter().map(|t| t.id()).collect();
    let stop = |t: &Tensor| caps.contains(&t.id()) || gl.contains(&t.id());
    let roots: Vec<Tensor> = grads.iter().flatten().cloned().collect();
    let mut dependent = gl.clone();
    let mut rebuilt: HashMap<u64, Tensor> = HashMap::new();
    let mut transposed: HashMap<u64, Tensor> = HashMap::new();
    for t in topo_order(&roots, &stop) {
        if stop(&t) || !t.inputs().iter().any(|i| dependent.contains(&i.id())) {
            continue;
        }
        dependent.insert(t.id());
        let ins: Vec<Tensor> = t
            .inputs()
            .iter()
            .map(|i| rebuilt.get(&i.id()).unwrap_or(i).clone())
            .collect();
        let reads_captured_wt = matches!(
            t.op(),
            Op::MatMul {
                ta: false,
                tb: true
            }
        ) && ins[1].rank() == 2
            && caps.contains(&ins[1].id());
        let new = if reads_captured_wt {
            let wt = match transposed.get(&ins[1].id()) {
                Some(wt) => wt.clone(),
                None => {
                    let wt = transpose(&ins[1], &[1, 0])?;
                    transposed.insert(ins[1].id(), wt.clone());
                    wt
                }
            };
            // Not through `matmul`, which would read the transpose through the flag.
            let plain = Op::MatMul {
                ta: false,
                tb: false,
            };
            Tensor::new(plain, vec![ins[0].clone(), wt])?
        } else if ins.iter().zip(t.inputs()).any(|(a, b)| a.id() != b.id()) {
            Tensor::new(t.op().clone(), ins)?
        } else {
            continue;
        };
        rebuilt.insert(t.id(), new);
    }
    Ok(grads
        .iter()
        .map(|g| {
            g.as_ref()
                .map(|g| rebuilt.get(&g.id()).unwrap_or(g).clone())
        })
        .collect())
}

/// The residuals of a VJP body: nodes computed from the forward body's step inputs and
/// states alone (`fwd_leaves`) that a node depending on the incoming gradients
/// (`grad_leaves`) reads, or that is itself a target. Saving these per step cuts the
/// backward body off from the forward computation.
pub fn residuals(
    fwd_leaves: &[Tensor],
    grad_leaves: &[Tensor],
    stop: &[Tensor],
    targets: &[Tensor],
) -> Vec<Tensor> {
    let fwd_ids: HashSet<u64> = fwd_leaves.iter().map(|t| t.id()).collect();
    let grad_ids: HashSet<u64> = grad_leaves.iter().map(|t| t.id()).collect();
    let stop_ids: HashSet<u64> = stop.iter().map(|t| t.id()).collect();
    let is_leaf = |t: &Tensor| {
        fwd_ids.contains(&t.id()) || grad_ids.contains(&t.id()) || stop_ids.contains(&t.id())
    };
    let order = topo_order(targets, &is_leaf);
    let (mut fwd, mut grad) = (fwd_ids.clone(), grad_ids.clone());
    for t in &order {
        if is_leaf(t) {
            continue;
        }
        if t.inputs().iter().any(|i| grad.contains(&i.id())) {
            grad.insert(t.id());
        } else if t.inputs().iter().any(|i| fwd.contains(&i.id())) {
            fwd.insert(t.id());
        }
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut take = |x: &Tensor| {
        if fwd.contains(&x.id()) && !fwd_ids.contains(&x.id()) && seen.insert(x.id()) {
            out.push(x.clone());
        }
    };
    for t in &order {
        if grad.contains(&t.id()) && !grad_ids.contains(&t.id()) {
            t.inputs().iter().for_each(&mut take);
        }
    }
    targets.iter().for_each(take);
    recompute_cheap(out, &fwd_ids, &stop_ids)
}

/// Drops from `saved` the nodes the backward body can compute again almost for free from
/// what it has anyway (leaves, captured, constants and the other saved nodes): `shape`,
/// and elementwise ops of cost 1 (`1 - y`, `y * (1 - y)`, `c = f * c' + i * g`). They
/// then run fused with the gradient's own elementwise work, instead of being stacked
/// `[T, ..]` by the forward loop and copied in and out (for a Keras LSTM: 26 residuals
/// per step down to 5). Until nothing changes, since one drop can make another possible.
fn recompute_cheap(
    mut saved: Vec<Tensor>,
    leaves: &HashSet<u64>,
    captured: &HashSet<u64>,
) -> Vec<Tensor> {
    loop {
        let ids: HashSet<u64> = saved.iter().map(|t| t.id()).collect();
        let have = |x: &Tensor| {
            leaves.contains(&x.id()) || captured.contains(&x.id()) || ids.contains(&x.id())
        };
        let Some(k) = saved
            .iter()
            .position(|r| cheap(r) && r.inputs().iter().all(|x| recomputable(x, &have, 4)))
        else {
            return saved;
        };
        saved.remove(k);
    }
}

/// `shape`, and elementwise ops of cost 1.
fn cheap(t: &Tensor) -> bool {
    match t.op() {
        Op::ShapeOf => true,
        op => match op.class() {
            Class::Elementwise(FusedOp::Binary(b)) => b.cost() <= 1,
            Class::Elementwise(FusedOp::Unary(u)) => u.cost() <= 1,
            Class::Elementwise(FusedOp::Select | FusedOp::Cast(_) | FusedOp::BroadcastTo) => true,
            Class::Source | Class::View(_) | Class::Meta | Class::Kernel | Class::Host => false,
        },
    }
}

/// Whether `x` is available (`have`), a constant, or a cheap node of such inputs at most
/// `depth` deep.
fn recomputable(x: &Tensor, have: &dyn Fn(&Tensor) -> bool, depth: usize) -> bool {
    have(x)
        || matches!(x.op(), Op::Constant(_))
        || (depth > 0
            && cheap(x)
            && !x.inputs().is_empty()
            && x.inputs().iter().all(|i| recomputable(i, have, depth - 1)))
}
