//! Control flow: a loop primitive whose body is a subgraph traced once, and `TupleGet`,
//! which selects one result of a multi-result node. `rnn`, `map_fn`, `foldl` and `foldr`
//! are all this one loop, so graph size and compile time do not grow with the number of
//! steps. Its VJP is another loop, run over time in the opposite direction, whose body is
//! the VJP of the forward body; so loops can be differentiated again.

use super::build::*;
use super::Op;
use crate::compile::Plan;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{topo_order, Tensor};
use crate::runtime::value::Value;
use crate::shape::Shape;
use crate::value_err;
use std::collections::HashSet;
use std::sync::Arc;

/// A loop over axis 0 of its sequence inputs.
///
/// Inputs of the `Loop` node: `[sequences.., initial states.., captured..]`. Results, read
/// with `TupleGet`: `[stacked per-step outputs.., final states.., state histories..]`, where
/// the history of a state stacks its value *before* each step (what the VJP needs).
#[derive(Debug)]
pub struct LoopBody {
    pub seq_phs: Vec<Tensor>,
    pub state_phs: Vec<Tensor>,
    /// Outer tensors the body reads (variables, placeholders, values built outside);
    /// fed to the body as leaves and passed to the loop node as inputs.
    pub captured: Vec<Tensor>,
    pub outputs: Vec<Tensor>,
    pub new_states: Vec<Tensor>,
    /// Iterate from the last index to the first (results stay at their own index).
    pub reverse: bool,
    pub plan: Plan,
}

impl LoopBody {
    pub fn n_results(&self) -> usize {
        self.outputs.len() + 2 * self.new_states.len()
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
        } else {
            stacked(&self.state_phs[k - no - ns])
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
        return Err(value_err!("loop: needs at least one sequence to iterate over"));
    }
    if seqs.len() != seq_phs.len() || init.len() != state_phs.len() || new_states.len() != state_phs.len() {
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
            && s.shape().dims().iter().zip(ns.shape().dims()).all(|(a, b)| a.is_none() || b.is_none() || a == b);
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
    let leaves: Vec<Tensor> = seq_phs.iter().chain(&state_phs).cloned().collect();
    let captured = captures(&leaves, &outputs, &new_states);
    let feeds: Vec<Tensor> = leaves.iter().chain(&captured).cloned().collect();
    let targets: Vec<Tensor> = outputs.iter().chain(&new_states).cloned().collect();
    let plan = Plan::new(&feeds, &targets)?;
    let body = LoopBody { seq_phs, state_phs, captured: captured.clone(), outputs, new_states, reverse, plan };
    let mut inputs: Vec<Tensor> = seqs.to_vec();
    inputs.extend(init.iter().cloned());
    inputs.extend(captured);
    Tensor::new(Op::Loop(Arc::new(body)), inputs)
}

/// The outer tensors a body reads: nodes that do not depend on the body's own leaves but
/// feed a node that does. Constants stay inside the body.
fn captures(leaves: &[Tensor], outputs: &[Tensor], new_states: &[Tensor]) -> Vec<Tensor> {
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
        if !dependent.contains(&t.id()) && !matches!(t.op(), Op::Constant(_)) && seen.insert(t.id()) {
            out.push(t.clone());
        }
    };
    for t in &order {
        if dependent.contains(&t.id()) {
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
            return Err(value_err!("loop: a sequence of shape {} does not match the step input {}", s.shape(), ph.shape()));
        }
        if let (Some(a), Some(b)) = (t, s.shape().dims()[0]) {
            if a != b {
                return Err(value_err!("loop: sequences have different lengths {a} and {b}"));
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
                return Err(value_err!("tuple_get: index {k} out of range for a loop with {} results", body.n_results()));
            }
            let t = x.inputs()[0].shape().dims()[0];
            Ok(body.result_spec(k, t))
        }
        Op::HostCall(h) => super::host::result_spec(h, k),
        Op::CtcDecode(d) => super::ctc::decode_result_spec(*d, x, k),
        other => Err(Error::Type(format!("tuple_get: {} has a single result", other.name()))),
    }
}

/// Runs the loop on the CPU; `args` are the loop node's input values.
pub fn run(body: &LoopBody, args: &[&Value], run_plan: &dyn Fn(&Plan, Vec<Value>) -> Result<Vec<Value>>) -> Result<Vec<Value>> {
    let (nq, ns) = (body.seq_phs.len(), body.state_phs.len());
    let seqs = &args[..nq];
    let t_len = seqs[0].shape()[0];
    for s in seqs {
        if s.shape()[0] != t_len {
            return Err(value_err!("loop: sequences have different lengths {t_len} and {}", s.shape()[0]));
        }
    }
    let mut states: Vec<Value> = args[nq..nq + ns].iter().map(|v| (*v).clone()).collect();
    let captured: Vec<Value> = args[nq + ns..].iter().map(|v| (*v).clone()).collect();
    let mut outs: Vec<Vec<Value>> = vec![Vec::with_capacity(t_len); body.outputs.len()];
    let mut hist: Vec<Vec<Value>> = vec![Vec::with_capacity(t_len); ns];
    let order: Vec<usize> = if body.reverse { (0..t_len).rev().collect() } else { (0..t_len).collect() };
    for &t in &order {
        let mut feeds = Vec::with_capacity(nq + ns + captured.len());
        for s in seqs {
            feeds.push(index0(s, t)?);
        }
        for (h, s) in hist.iter_mut().zip(&states) {
            h.push(s.clone());
        }
        feeds.extend(states.iter().cloned());
        feeds.extend(captured.iter().cloned());
        let mut res = run_plan(&body.plan, feeds)?;
        let new_states = res.split_off(body.outputs.len());
        for (i, (ns_v, old)) in new_states.iter().zip(&states).enumerate() {
            if ns_v.shape() != old.shape() {
                return Err(value_err!(
                    "rnn: the step function changed state {i} from shape {:?} to {:?} at step {t}",
                    old.shape(),
                    ns_v.shape()
                ));
            }
        }
        for (o, v) in outs.iter_mut().zip(res) {
            o.push(v);
        }
        states = new_states;
    }
    if body.reverse {
        outs.iter_mut().for_each(|o| o.reverse());
        hist.iter_mut().for_each(|h| h.reverse());
    }
    let mut results = Vec::with_capacity(body.n_results());
    for (o, ph) in outs.iter().zip(&body.outputs) {
        results.push(stack(o, ph, t_len)?);
    }
    results.extend(states);
    for (h, ph) in hist.iter().zip(&body.state_phs) {
        results.push(stack(h, ph, t_len)?);
    }
    Ok(results)
}

fn index0(v: &Value, t: usize) -> Result<Value> {
    let spec: Vec<super::SliceAxis> = (0..v.shape().len())
        .map(|a| if a == 0 { super::SliceAxis { start: Some(t as i64), stop: Some(t as i64 + 1), step: 1 } } else { super::SliceAxis { start: None, stop: None, step: 1 } })
        .collect();
    let s = super::movement::cpu_slice(&spec, v)?;
    s.reshape(&v.shape()[1..])
}

fn stack(items: &[Value], like: &Tensor, t_len: usize) -> Result<Value> {
    if items.is_empty() {
        let mut shape = vec![0usize];
        shape.extend(like.shape().dims().iter().map(|d| d.unwrap_or(0)));
        return Ok(Value::full(like.dtype(), &shape, 0.0));
    }
    let expanded: Vec<Value> = items
        .iter()
        .map(|v| {
            let mut s = vec![1];
            s.extend_from_slice(v.shape());
            v.reshape(&s)
        })
        .collect::<Result<_>>()?;
    let refs: Vec<&Value> = expanded.iter().collect();
    let out = super::movement::cpu_concat(0, &refs)?;
    debug_assert_eq!(out.shape()[0], t_len);
    Ok(out)
}

/// VJP of a loop: a reverse loop whose body is the VJP of the forward body.
/// `gs[k]` is the gradient flowing into result `k` (None where nothing flows).
pub fn vjp_loop(node: &Tensor, gs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
    let Op::Loop(body) = node.op() else { unreachable!("vjp_loop on a loop node") };
    let (nq, ns, no, nc) = (body.seq_phs.len(), body.state_phs.len(), body.outputs.len(), body.captured.len());
    let ins = node.inputs();
    // Gradient placeholders for the body's results at one step.
    let mk = |t: &Tensor, what: &str, i: usize| {
        super::source::placeholder(&format!("loop_grad_{what}_{i}"), t.shape().clone(), t.dtype(), None)
    };
    let gout_phs: Vec<Tensor> = body.outputs.iter().enumerate().map(|(i, t)| mk(t, "out", i)).collect::<Result<_>>()?;
    let gstate_phs: Vec<Tensor> = body.state_phs.iter().enumerate().map(|(i, t)| mk(t, "state", i)).collect::<Result<_>>()?;
    // y = sum(out * g_out) + sum(new_state * g_state): its gradients are the body's VJP.
    let mut terms = Vec::new();
    for (o, g) in body.outputs.iter().zip(&gout_phs) {
        if o.dtype().is_float() {
            terms.push(reduce(super::ReduceOp::Sum, &mul(o, g)?, &(0..o.rank()).collect::<Vec<_>>(), false)?);
        }
    }
    for (o, g) in body.new_states.iter().zip(&gstate_phs) {
        if o.dtype().is_float() {
            terms.push(reduce(super::ReduceOp::Sum, &mul(o, g)?, &(0..o.rank()).collect::<Vec<_>>(), false)?);
        }
    }
    let wrt: Vec<Tensor> = body.seq_phs.iter().chain(&body.state_phs).chain(&body.captured).cloned().collect();
    let mut grads: Vec<Option<Tensor>> = vec![None; wrt.len()];
    if let Some(first) = terms.first() {
        let mut y = first.clone();
        for t in &terms[1..] {
            y = add(&y, &cast(t, y.dtype())?)?;
        }
        grads = crate::autodiff::gradients_at_leaves(&y, &wrt)?;
    }
    let g_of = |i: usize| -> Result<Tensor> {
        match &grads[i] {
            Some(g) => Ok(g.clone()),
            None => zeros_like(&wrt[i]),
        }
    };
    // Backward body: sequences [x.., state history.., g_out..], states [g_state.., acc..].
    // Gradient accumulators, one per float captured tensor (others get no gradient).
    let float_caps: Vec<usize> = (0..nc).filter(|&i| body.captured[i].dtype().is_float()).collect();
    let acc_phs: Vec<Tensor> = float_caps.iter().map(|&i| mk(&body.captured[i], "acc", i)).collect::<Result<_>>()?;
    // The VJP graph reads seq_phs/state_phs/gout/gstate; the backward loop feeds those
    // same placeholders (the forward history as the states), so nothing is copied.
    let mut b_outputs = Vec::with_capacity(nq);
    for i in 0..nq {
        b_outputs.push(g_of(i)?);
    }
    let mut b_new_states = Vec::with_capacity(ns + nc);
    for i in 0..ns {
        b_new_states.push(g_of(nq + i)?);
    }
    for (acc, &i) in acc_phs.iter().zip(&float_caps) {
        b_new_states.push(add(acc, &g_of(nq + ns + i)?)?);
    }
    // Outer values for the backward loop.
    let results: Vec<Tensor> = (0..body.n_results()).map(|k| tuple_get(node, k)).collect::<Result<_>>()?;
    let mut b_seqs: Vec<Tensor> = ins[..nq].to_vec();
    b_seqs.extend(results[no + ns..].iter().cloned());
    for k in 0..no {
        b_seqs.push(match &gs[k] {
            Some(g) => g.clone(),
            None => zeros_like(&results[k])?,
        });
    }
    let mut b_init: Vec<Tensor> = Vec::with_capacity(ns + float_caps.len());
    for k in 0..ns {
        b_init.push(match &gs[no + k] {
            Some(g) => g.clone(),
            None => zeros_like(&ins[nq + k])?,
        });
    }
    for &i in &float_caps {
        b_init.push(zeros_like(&ins[nq + ns + i])?);
    }
    let mut b_seq_phs: Vec<Tensor> = body.seq_phs.clone();
    b_seq_phs.extend(body.state_phs.iter().cloned());
    b_seq_phs.extend(gout_phs.iter().cloned());
    let mut b_state_phs: Vec<Tensor> = gstate_phs.clone();
    b_state_phs.extend(acc_phs.iter().cloned());
    let bnode = build_loop(&b_seqs, &b_init, b_seq_phs, b_state_phs, b_outputs, b_new_states, !body.reverse)?;
    let mut out = Vec::with_capacity(ins.len());
    for i in 0..nq {
        out.push(Some(tuple_get(&bnode, i)?));
    }
    for k in 0..ns {
        out.push(Some(tuple_get(&bnode, nq + k)?));
    }
    let mut cap_grads: Vec<Option<Tensor>> = vec![None; nc];
    for (j, &i) in float_caps.iter().enumerate() {
        cap_grads[i] = Some(tuple_get(&bnode, nq + ns + j)?);
    }
    out.extend(cap_grads);
    // Integer inputs get no gradient.
    for (o, i) in out.iter_mut().zip(ins) {
        if !i.dtype().is_float() {
            *o = None;
        }
    }
    Ok(out)
}
