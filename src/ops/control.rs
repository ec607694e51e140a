//! Control flow: a loop primitive whose body is a subgraph traced once, and `TupleGet`,
//! which selects one result of a multi-result node. `rnn`, `map_fn`, `foldl` and `foldr`
//! are all this one loop, so graph size and compile time do not grow with the number of
//! steps. The loop is built here; its VJP (another loop, over time in the opposite
//! direction) is built by `autodiff::loops`, and it runs in `runtime::cpu::loops`.

use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::ops::graph::{topo_order, Tensor};
use crate::value_err;
use std::collections::HashSet;
use std::sync::{Arc, RwLock};

/// A loop over axis 0 of its sequence inputs.
///
/// Inputs of the `Loop` node: `[sequences.., initial states.., captured..]`. Results, read
/// with `TupleGet`: `[stacked per-step outputs.., final states.., state histories..,
/// stacked residuals..]`, where the history of a state stacks its value *before* each step
/// and the residuals are body nodes a VJP of this loop reads (both what the VJP needs).
#[derive(Debug)]
pub struct LoopBody {
    /// Step inputs, fed with row `t` of each sequence.
    pub seq_phs: Vec<Tensor>,
    pub state_phs: Vec<Tensor>,
    /// Outer tensors the body reads (variables, placeholders, values built outside);
    /// fed to the body as leaves and passed to the loop node as inputs.
    pub captured: Vec<Tensor>,
    pub outputs: Vec<Tensor>,
    pub new_states: Vec<Tensor>,
    /// Iterate from the last index to the first (results stay at their own index).
    pub reverse: bool,
    /// Residuals: body nodes saved per step for VJPs, appended by the loop's VJP
    /// (`autodiff::loops`; only ever grows, so results already read keep their index).
    /// Behind a lock, since the loop node is shared and immutable otherwise. A plan compiles
    /// the body with the residuals it has then (`compile::Plan::body`).
    hidden: RwLock<Vec<Tensor>>,
}

impl LoopBody {
    pub fn n_results(&self) -> usize {
        self.outputs.len() + 2 * self.new_states.len() + self.hidden().len()
    }

    pub fn hidden(&self) -> Vec<Tensor> {
        self.hidden
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What the body is computed from: `[step inputs.., states.., captured..]`.
    pub fn feeds(&self) -> Vec<Tensor> {
        self.seq_phs
            .iter()
            .chain(&self.state_phs)
            .chain(&self.captured)
            .cloned()
            .collect()
    }

    /// What the body computes: `[outputs.., new states.., residuals..]`.
    pub fn targets(&self) -> Vec<Tensor> {
        let hidden = self.hidden();
        self.outputs
            .iter()
            .chain(&self.new_states)
            .chain(&hidden)
            .cloned()
            .collect()
    }

    /// Result index of body node `r` stacked per step, saving it as a residual if it is
    /// not an output already.
    pub fn save(&self, r: &Tensor) -> Result<usize> {
        if let Some(k) = self.outputs.iter().position(|o| o.id() == r.id()) {
            return Ok(k);
        }
        let base = self.outputs.len() + 2 * self.new_states.len();
        let mut hidden = self.hidden.write().unwrap_or_else(|e| e.into_inner());
        if let Some(j) = hidden.iter().position(|h| h.id() == r.id()) {
            return Ok(base + j);
        }
        hidden.push(r.clone());
        Ok(base + hidden.len() - 1)
    }

    /// Static shape and dtype of result `k`, given the sequence length `t`.
    pub fn result_spec(&self, k: usize, t: Option<usize>) -> (Shape, DType) {
        let (no, ns) = (self.outputs.len(), self.new_states.len());
        let stacked = |x: &Tensor| {
            let mut d = vec![t];
            d.extend_from_slice(x.shape().dims());
            (Shape(d), x.dtype())
        };
        if k < no {
            stacked(&self.outputs[k])
        } else if k < no + ns {
            let s = &self.state_phs[k - no];
            (s.shape().clone(), s.dtype())
        } else if k < no + 2 * ns {
            stacked(&self.state_phs[k - no - ns])
        } else {
            stacked(&self.hidden()[k - no - 2 * ns])
        }
    }
}

/// Builds a loop. `seq_phs`/`state_phs` are the placeholders the body was traced on;
/// `outputs`/`new_states` are the body's results. Returns the loop node.
#[allow(clippy::too_many_arguments)]
pub fn build_loop(
    seqs: &[Tensor],
    init: &[Tensor],
    seq_phs: Vec<Tensor>,
    state_phs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    new_states: Vec<Tensor>,
    reverse: bool,
) -> Result<Tensor> {
    if seqs.is_empty() {
        return Err(value_err!(
            "loop: needs at least one sequence to iterate over"
        ));
    }
    if seqs.len() != seq_phs.len()
        || init.len() != state_phs.len()
        || new_states.len() != state_phs.len()
    {
        return Err(value_err!(
            "loop: {} sequences for {} step inputs, {} initial states and {} new states for {} states",
            seqs.len(),
            seq_phs.len(),
            init.len(),
            new_states.len(),
            state_phs.len()
        ));
    }
    for (i, (s, ns)) in state_phs.iter().zip(&new_states).enumerate() {
        let compatible = s.rank() == ns.rank()
            && s.shape()
                .dims()
                .iter()
                .zip(ns.shape().dims())
                .all(|(a, b)| a.is_none() || b.is_none() || a == b);
        if !compatible || s.dtype() != ns.dtype() {
            return Err(value_err!(
                "rnn: the step function returns state {i} with shape {} and dtype {}, but the state has shape {} and dtype {}; states must keep their shape between steps",
                ns.shape(),
                ns.dtype(),
                s.shape(),
                s.dtype()
            ));
        }
    }
    let seqs = seqs.to_vec();
    let leaves: Vec<Tensor> = seq_phs.iter().chain(&state_phs).cloned().collect();
    let captured = captures(&leaves, &outputs, &new_states);
    if crate::base::config::get()?.loop_debug {
        let names = |v: &[Tensor]| {
            v.iter()
                .map(|t| t.op().name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        eprintln!(
            "build_loop: seqs [{}] phs [{}] states [{}] captured [{}]",
            names(&seqs),
            names(&seq_phs),
            names(&state_phs),
            names(&captured)
        );
    }
    let body = LoopBody {
        seq_phs,
        state_phs,
        captured: captured.clone(),
        outputs,
        new_states,
        reverse,
        hidden: RwLock::new(Vec::new()),
    };
    let mut inputs = seqs;
    inputs.extend(init.iter().cloned());
    inputs.extend(captured);
    Tensor::new(Op::Loop(Arc::new(body)), inputs)
}

/// The outer tensors a body reads: nodes that do not depend on the body's own leaves but
/// feed a node that does. Constants stay inside the body.
pub fn captures(leaves: &[Tensor], outputs: &[Tensor], new_states: &[Tensor]) -> Vec<Tensor> {
    let leaf_ids: HashSet<u64> = leaves.iter().map(|t| t.id()).collect();
    let roots: Vec<Tensor> = outputs.iter().chain(new_states).cloned().collect();
    let order = topo_order(&roots, &|t| leaf_ids.contains(&t.id()));
    let mut dependent: HashSet<u64> = leaf_ids.clone();
    for t in &order {
        if t.inputs().iter().any(|i| dependent.contains(&i.id())) {
            dependent.insert(t.id());
        }
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut take = |t: &Tensor| {
        if !dependent.contains(&t.id()) && !matches!(t.op(), Op::Constant(_)) && seen.insert(t.id())
        {
            out.push(t.clone());
        }
    };
    for t in &order {
        // A leaf may be an interior node (a residual): its inputs are
        // not read in the body.
        if dependent.contains(&t.id()) && !leaf_ids.contains(&t.id()) {
            for i in t.inputs() {
                take(i);
            }
        }
    }
    // A result that does not depend on the leaves at all is read from outside too.
    for r in &roots {
        take(r);
    }
    out
}

pub fn infer_loop(body: &LoopBody, inputs: &[Tensor]) -> Result<(Shape, DType)> {
    let ns = body.seq_phs.len();
    let mut t: Option<usize> = None;
    for (s, ph) in inputs[..ns].iter().zip(&body.seq_phs) {
        if s.rank() != ph.rank() + 1 {
            return Err(value_err!(
                "loop: a sequence of shape {} does not match the step input {}",
                s.shape(),
                ph.shape()
            ));
        }
        if let (Some(a), Some(b)) = (t, s.shape().dims()[0]) {
            if a != b {
                return Err(value_err!(
                    "loop: sequences have different lengths {a} and {b}"
                ));
            }
        }
        t = t.or(s.shape().dims()[0]);
    }
    Ok((Shape::scalar(), DType::Bool))
}

pub fn tuple_get(x: &Tensor, k: usize) -> Result<Tensor> {
    Tensor::new(Op::TupleGet(k), vec![x.clone()])
}

pub fn infer_tuple_get(k: usize, x: &Tensor) -> Result<(Shape, DType)> {
    match x.op() {
        Op::Loop(body) => {
            if k >= body.n_results() {
                return Err(value_err!(
                    "tuple_get: index {k} out of range for a loop with {} results",
                    body.n_results()
                ));
            }
            let t = x.inputs()[0].shape().dims()[0];
            Ok(body.result_spec(k, t))
        }
        Op::HostCall(h) => super::host::result_spec(h, k),
        Op::CtcDecode(d) => super::ctc::decode_result_spec(*d, x, k),
        other => Err(Error::Type(format!(
            "tuple_get: {} has a single result",
            other.name()
        ))),
    }
}
