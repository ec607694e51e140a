//! Rewrites of a loop body at graph-build time (called from `control::build_loop` and
//! `control::vjp_loop`), so the compiler and the executors see plain loops:
//!
//! - **Sequence matmuls leave the body.** `x_t · W`, with `x_t` a step input and `W` read
//!   from outside, is computed once over the whole sequence (one `[T*B, F] · [F, N]` GEMM)
//!   and fed back in as a new step input. Work on captured values alone already runs
//!   outside: `control::captures` makes every node that does not depend on the step inputs
//!   or states a captured input.
//! - **The VJP reads saved residuals.** The forward nodes the backward body reads (gate
//!   activations, `1 - y²`, shapes) become extra stacked results of the forward loop and
//!   step inputs of the backward loop, so the backward loop does not run the forward cell
//!   again.
//!
//! - **Loop-invariant operands are transposed once.** A product `x·W` in the body, `W`
//!   read from outside, has the gradient `g·Wᵀ`; in a loop VJP that reads `Wᵀ` built
//!   once outside the loop (`invariant`, read by `matmul::vjp`), so `gemm` does not copy
//!   `W` transposed at every step.
//!
//! The first two rewrites feed an interior node of the body graph as a leaf (a plan treats any fed
//! tensor as a leaf), so no graph is copied. `FERROKERAS_LOOP_OPT`, read when a loop is
//! built, picks them: unset, saved residuals only (the default); `0` / `off`: neither;
//! `1` / `on`: both; `save`, `hoist`: that one. On the 2-core machine of
//! `docs/performance.md` saving residuals takes a Keras LSTM(64) training step from ~12.5 to
//! ~11.5 ms of CPU (once stacked results stopped being zero-filled and loop bodies were
//! specialised to their shapes); hoisting still costs more than it saves there (the
//! `[T*B, F]` GEMMs; see the "Loops" sections there).

use super::build::*;
use super::{FusedOp, GpuKind, Op, SliceAxis};
use crate::base::error::Result;
use crate::graph::{topo_order, Tensor};
use std::cell::RefCell;
use std::collections::HashSet;

/// Which rewrites are on, read from `FERROKERAS_LOOP_OPT` when a loop is built.
pub struct Switches {
    pub hoist: bool,
    pub save: bool,
}

pub fn switches() -> Switches {
    let v = std::env::var("FERROKERAS_LOOP_OPT")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match v.as_str() {
        "" => Switches {
            hoist: false,
            save: true,
        },
        "1" | "on" => Switches {
            hoist: true,
            save: true,
        },
        _ => Switches {
            hoist: v.contains("hoist"),
            save: v.contains("save"),
        },
    }
}

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

/// Ids of every node of the body (reachable from `roots`, stopping at `leaves`) that
/// depends on one of `leaves`.
fn dependents(leaves: &[Tensor], roots: &[Tensor]) -> (Vec<Tensor>, HashSet<u64>) {
    let leaf_ids: HashSet<u64> = leaves.iter().map(|t| t.id()).collect();
    let order = topo_order(roots, &|t| leaf_ids.contains(&t.id()));
    let mut dep = leaf_ids.clone();
    for t in &order {
        if !leaf_ids.contains(&t.id()) && t.inputs().iter().any(|i| dep.contains(&i.id())) {
            dep.insert(t.id());
        }
    }
    (order, dep)
}

/// Finds matmuls of one step input with a loop-invariant matrix and computes them over
/// the whole sequence. Returns `(outer sequence, body node)` pairs: the body node is fed
/// as one more step input, so its users read the hoisted product.
pub fn hoist_sequence_matmuls(
    seqs: &[Tensor],
    seq_phs: &[Tensor],
    state_phs: &[Tensor],
    roots: &[Tensor],
) -> Result<Vec<(Tensor, Tensor)>> {
    let leaves: Vec<Tensor> = seq_phs.iter().chain(state_phs).cloned().collect();
    let (order, dep) = dependents(&leaves, roots);
    let leaf_ids: HashSet<u64> = leaves.iter().map(|t| t.id()).collect();
    let mut out = Vec::new();
    for t in &order {
        let Op::MatMul { ta, tb } = t.op() else {
            continue;
        };
        if leaf_ids.contains(&t.id()) {
            continue;
        }
        let (a, b) = (t.input(0), t.input(1));
        let seq_of = |x: &Tensor| seq_phs.iter().position(|p| p.id() == x.id());
        let hoisted = match (seq_of(a), seq_of(b)) {
            // x_t · W: with W a matrix, one GEMM over the flattened sequence.
            (Some(i), None) if !dep.contains(&b.id()) && b.rank() <= a.rank() => {
                Some(seq_times_matrix(&seqs[i], b, *ta, *tb)?)
            }
            // W · x_t: a batched matmul, W broadcast over the steps.
            (None, Some(i)) if !dep.contains(&a.id()) && a.rank() <= b.rank() => {
                Some(matmul(a, &seqs[i], *ta, *tb)?)
            }
            _ => None,
        };
        if let Some(s) = hoisted {
            out.push((s, t.clone()));
        }
    }
    Ok(out)
}

/// `S · W` for every step of the sequence `S` (`[T, .., m, k]`).
fn seq_times_matrix(s: &Tensor, w: &Tensor, ta: bool, tb: bool) -> Result<Tensor> {
    let k = s.shape().dims()[s.rank() - 1];
    let (Some(k), false, 2) = (k, ta, w.rank()) else {
        return matmul(s, w, ta, tb);
    };
    let all = |start: i64, stop: Option<i64>| SliceAxis {
        start: Some(start),
        stop,
        step: 1,
    };
    let flat = reshape_to(s, &int_vector(&[-1, k as i64]))?;
    let prod = matmul(&flat, w, false, tb)?;
    let lead = slice(&shape_of(s)?, &[all(0, Some(s.rank() as i64 - 1))])?;
    let n_axis = if tb { 0 } else { 1 };
    let n = slice(&shape_of(w)?, &[all(n_axis, Some(n_axis + 1))])?;
    reshape_to(&prod, &concat(&[lead, n], 0)?)
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
        op => match op.gpu_kind() {
            GpuKind::Fused(FusedOp::Binary(b)) => b.cost() <= 1,
            GpuKind::Fused(FusedOp::Unary(u)) => u.cost() <= 1,
            GpuKind::Fused(FusedOp::Select | FusedOp::Cast(_) | FusedOp::BroadcastTo) => true,
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
