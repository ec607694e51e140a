//! Rewrites of a loop body at graph-build time (called from `control::vjp_loop`), so the
//! compiler and the executors see plain loops:
//!
//! - **The VJP reads saved residuals.** The forward nodes the backward body reads (gate
//!   activations, `1 - y²`, shapes) become extra stacked results of the forward loop and
//!   step inputs of the backward loop, so the backward loop does not run the forward cell
//!   again. A residual is an interior node of the body graph fed as a leaf (a plan treats
//!   any fed tensor as a leaf), so no graph is copied. `FERROKERAS_LOOP_OPT=0`
//!   (`base::config`) turns this off. On the 2-core machine of `docs/performance.md` it
//!   takes a Keras LSTM(64) training step from ~12.5 to ~11.5 ms of CPU.
//! - **Loop-invariant operands are transposed once.** A product `x·W` in the body, `W`
//!   read from outside, has the gradient `g·Wᵀ`; in a loop VJP that reads `Wᵀ` built
//!   once outside the loop (`invariant`, read by `matmul::vjp`), so `gemm` does not copy
//!   `W` transposed at every step.

use super::{Class, FusedOp, Op};
use crate::ops::graph::{topo_order, Tensor};
use std::cell::RefCell;
use std::collections::HashSet;

thread_local! {
    /// Ids of the outer tensors the loop body whose VJP is being built reads.
    static INVARIANT: RefCell<HashSet<u64>> = RefCell::new(HashSet::new());
}

/// Runs `f` (building a loop body's VJP) with the body's `captured` tensors marked
/// loop-invariant; the marks of an enclosing loop come back after.
pub fn with_invariant<R>(captured: &[Tensor], f: impl FnOnce() -> R) -> R {
    let ids: HashSet<u64> = captured.iter().map(|t| t.id()).collect();
    let outer = INVARIANT.with(|s| s.replace(ids));
    let r = f();
    INVARIANT.with(|s| s.replace(outer));
    r
}

/// Whether `t` is read from outside the loop body whose VJP is being built.
pub fn invariant(t: &Tensor) -> bool {
    INVARIANT.with(|s| s.borrow().contains(&t.id()))
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
            _ => false,
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
