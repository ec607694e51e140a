//! Control flow: a loop primitive whose body is a subgraph traced once, and `TupleGet`,
//! which selects one result of a multi-result node. `rnn`, `map_fn`, `foldl` and `foldr`
//! are all this one loop, so graph size and compile time do not grow with the number of
//! steps. Its VJP is another loop, run over time in the opposite direction, whose body is
//! the VJP of the forward body; so loops can be differentiated again.

use super::build::*;
use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::compile::Plan;
use crate::ops::graph::{topo_order, Tensor};
use crate::runtime::cpu::SlotShapes;
use crate::value_err;
use ndarray::Axis;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};

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
    /// Residuals: body nodes saved per step for VJPs, appended by `vjp_loop` (only ever
    /// grows; results already read keep their index). With `plan`, behind locks since the
    /// loop node is shared and immutable otherwise.
    hidden: RwLock<Vec<Tensor>>,
    /// Computes `[outputs.., new states.., residuals..]` from `[steps.., states.., captured..]`.
    plan: RwLock<Arc<Plan>>,
    /// `plan` specialised to the shapes of its feeds (see `Plan::specialize`), for the
    /// last few feed shapes seen: (feed shapes, the plan it was made from, the result).
    specialised: Mutex<Vec<Specialised>>,
}

/// (feed shapes, the plan specialised, the specialised plan).
type Specialised = (Vec<Vec<usize>>, Arc<Plan>, Arc<Plan>);

/// Runs a body plan on the CPU, recording slot shapes when asked (`cpu::run_recording`).
pub type RunPlan<'a> = &'a dyn Fn(&Plan, Vec<Value>, Option<&mut SlotShapes>) -> Result<Vec<Value>>;

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

    pub fn plan(&self) -> Arc<Plan> {
        self.plan.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The specialised plan for feeds of shapes `key`, if one was made from `plan`.
    fn specialised(&self, plan: &Arc<Plan>, key: &[Vec<usize>]) -> Option<Arc<Plan>> {
        let cache = self.specialised.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .iter()
            .find(|(k, p, _)| k.as_slice() == key && Arc::ptr_eq(p, plan))
            .map(|(_, _, s)| s.clone())
    }

    fn remember(&self, key: Vec<Vec<usize>>, plan: Arc<Plan>, special: Arc<Plan>) {
        let mut cache = self.specialised.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= 4 {
            cache.remove(0);
        }
        cache.push((key, plan, special));
    }

    fn feeds(&self) -> Vec<Tensor> {
        self.seq_phs
            .iter()
            .chain(&self.state_phs)
            .chain(&self.captured)
            .cloned()
            .collect()
    }

    /// Result index of body node `r` stacked per step, saving it as a residual if it is
    /// not an output already.
    fn save(&self, r: &Tensor) -> Result<usize> {
        if let Some(k) = self.outputs.iter().position(|o| o.id() == r.id()) {
            return Ok(k);
        }
        let base = self.outputs.len() + 2 * self.new_states.len();
        let mut hidden = self.hidden.write().unwrap_or_else(|e| e.into_inner());
        if let Some(j) = hidden.iter().position(|h| h.id() == r.id()) {
            return Ok(base + j);
        }
        let mut targets: Vec<Tensor> = self
            .outputs
            .iter()
            .chain(&self.new_states)
            .chain(hidden.iter())
            .cloned()
            .collect();
        targets.push(r.clone());
        let plan = Plan::new(&self.feeds(), &targets)?;
        hidden.push(r.clone());
        *self.plan.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(plan);
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
    let feeds: Vec<Tensor> = leaves.iter().chain(&captured).cloned().collect();
    let targets: Vec<Tensor> = outputs.iter().chain(&new_states).cloned().collect();
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
    let plan = RwLock::new(Arc::new(Plan::new(&feeds, &targets)?));
    let hidden = RwLock::new(Vec::new());
    let specialised = Mutex::new(Vec::new());
    let body = LoopBody {
        seq_phs,
        state_phs,
        captured: captured.clone(),
        outputs,
        new_states,
        reverse,
        hidden,
        plan,
        specialised,
    };
    let mut inputs = seqs;
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

/// Runs the loop on the CPU; `args` are the loop node's input values, `read[k]` whether
/// anything reads result `k` (a stacked result nobody reads is not kept: the histories
/// of the gradient accumulators of a loop VJP are `[T, ..]` copies of weight gradients).
/// Every step feeds values of the same shapes, so steps after the first run the body plan
/// specialised to them (`Plan::specialize`, from the shapes the first step recorded).
/// Step inputs are rows of the sequences (views, no copy); each step's values of the
/// stacked results are kept and copied once into their `[T, ..]` buffer at the end.
pub fn run(
    body: &LoopBody,
    args: &[&Value],
    read: &[bool],
    run_plan: RunPlan<'_>,
) -> Result<Vec<Value>> {
    let generic = body.plan();
    let (nq, ns, no) = (body.seq_phs.len(), body.state_phs.len(), body.outputs.len());
    let nh = generic.outputs.len() - no - ns;
    let seqs = &args[..nq];
    let t_len = seqs[0].shape()[0];
    for s in seqs {
        if s.shape()[0] != t_len {
            return Err(value_err!(
                "loop: sequences have different lengths {t_len} and {}",
                s.shape()[0]
            ));
        }
    }
    if crate::base::config::settings().loop_debug {
        eprintln!(
            "loop run: {t_len} steps x {} launches, {nq} step inputs, {nh} residuals",
            generic.dispatches()
        );
    }
    let mut states: Vec<Value> = args[nq..nq + ns].iter().map(|v| (*v).clone()).collect();
    let captured = &args[nq + ns..];
    // Specialised per feed shapes and per value of the shape vectors fed to the body that
    // are the same at every step of the run: small integer vectors captured from outside,
    // or stacked per step with every row equal (a `shape` a VJP body reads as a residual,
    // which its `sum_to`s reduce to).
    let shape_like = |v: &Value| v.dtype().is_int() && v.shape().len() <= 1 && v.len() <= 8;
    let fixed_rows = |v: &Value| -> Option<Vec<usize>> {
        let sh = v.shape();
        if !v.dtype().is_int() || sh.len() != 2 || sh[1] > 8 || sh[0] == 0 {
            return None;
        }
        let all = v.to_i64_vec();
        let first = &all[..sh[1]];
        all.chunks(sh[1])
            .all(|r| r == first)
            .then(|| first.iter().map(|&x| x as usize).collect())
    };
    let mut key: Vec<Vec<usize>> = seqs
        .iter()
        .map(|s| &s.shape()[1..])
        .chain(
            states
                .iter()
                .chain(captured.iter().copied())
                .map(|v| v.shape()),
        )
        .map(<[usize]>::to_vec)
        .collect();
    // (Each such row keyed with its sequence's index, so different sets never collide.)
    let seq_fixed: Vec<bool> = seqs
        .iter()
        .enumerate()
        .map(|(f, s)| {
            fixed_rows(s)
                .map(|r| key.push([vec![usize::MAX - f], r].concat()))
                .is_some()
        })
        .collect();
    key.extend(
        captured
            .iter()
            .filter(|v| shape_like(v))
            .map(|v| v.to_i64_vec().iter().map(|&x| x as usize).collect()),
    );
    // Which feeds (of `[step rows.., states.., captured..]`) the key holds by value.
    let keyed = |f: usize| {
        if f < nq {
            seq_fixed[f]
        } else {
            f >= nq + ns && captured.get(f - nq - ns).is_some_and(|v| shape_like(v))
        }
    };
    let special = body.specialised(&generic, &key);
    let mut record = special.is_none() && generic.shapes_follow_feeds(&keyed);
    let mut plan = special.unwrap_or_else(|| generic.clone());
    let is_read = |k: usize| read.get(k).copied().unwrap_or(true);
    let mut outs: Vec<Stacked> = (0..no + nh)
        .map(|k| Stacked::new(t_len, is_read(if k < no { k } else { k + 2 * ns })))
        .collect();
    let mut hist: Vec<Stacked> = (0..ns)
        .map(|k| Stacked::new(t_len, is_read(no + ns + k)))
        .collect();
    let state_shapes: Vec<Vec<usize>> = states.iter().map(|s| s.shape().to_vec()).collect();
    for i in 0..t_len {
        let t = if body.reverse { t_len - 1 - i } else { i };
        let mut feeds = Vec::with_capacity(nq + ns + captured.len());
        feeds.extend(seqs.iter().map(|s| row(s, t)));
        for (h, s) in hist.iter_mut().zip(&states) {
            h.put(t, s)?;
        }
        feeds.append(&mut states);
        feeds.extend(captured.iter().map(|v| (*v).clone()));
        let mut res = if record {
            let mut shapes = SlotShapes::new();
            let res = run_plan(&plan, feeds, Some(&mut shapes))?;
            plan = Arc::new(generic.specialize(&shapes, &[]));
            body.remember(key.clone(), generic.clone(), plan.clone());
            if crate::base::config::settings().loop_debug {
                eprintln!(
                    "loop: specialised to its shapes, {} launches per step",
                    plan.cpu_schedule().dispatches
                );
            }
            record = false;
            res
        } else {
            run_plan(&plan, feeds, None)?
        };
        let mut rest = res.split_off(no);
        let saved = rest.split_off(ns);
        for (j, (new, old)) in rest.iter().zip(&state_shapes).enumerate() {
            if new.shape() != old.as_slice() {
                return Err(value_err!(
                    "rnn: the step function changed state {j} from shape {old:?} to {:?} at step {t}",
                    new.shape()
                ));
            }
        }
        put_rows(&mut outs, t, res.iter().chain(&saved))?;
        states = rest;
    }
    let hidden = body.hidden();
    let mut results = Vec::with_capacity(no + 2 * ns + nh);
    let saved = outs.split_off(no);
    for (o, like) in outs.into_iter().zip(&body.outputs) {
        results.push(o.finish(like)?);
    }
    results.extend(states);
    for (h, like) in hist.into_iter().zip(&body.state_phs) {
        results.push(h.finish(like)?);
    }
    for (o, like) in saved.into_iter().zip(&hidden) {
        results.push(o.finish(like)?);
    }
    Ok(results)
}

/// Bytes of a step's stacked results from which their copies are split with the loop's
/// helper thread (`team::split2`). The copies into the `[T, ..]` buffers ran on the leader
/// alone while the helper waited: ~5% of a Keras LSTM(64) training step.
const SPLIT_PUT_BYTES: usize = 32 << 10;

/// Puts each value of step `t` into its stacked result, in two halves (balanced by bytes)
/// on the loop's team when there are enough bytes.
fn put_rows<'a>(
    outs: &mut [Stacked],
    t: usize,
    vals: impl Iterator<Item = &'a Value>,
) -> Result<()> {
    let rows: Vec<(&mut Stacked, &Value)> =
        outs.iter_mut().zip(vals).filter(|(o, _)| o.read).collect();
    let bytes = |v: &Value| v.len() * v.dtype().size();
    let total: usize = rows.iter().map(|(_, v)| bytes(v)).sum();
    if rows.len() < 2 || total < SPLIT_PUT_BYTES || !crate::base::team::available() {
        return rows.into_iter().try_for_each(|(o, v)| o.put(t, v));
    }
    let (mut halves, mut load) = ([Vec::new(), Vec::new()], [0usize; 2]);
    for (o, v) in rows {
        let k = usize::from(load[1] < load[0]);
        load[k] += bytes(v);
        halves[k].push((o, v));
    }
    let halves = halves.map(Mutex::new);
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    crate::base::team::split2(&|part| {
        let mut half = halves[part].lock().unwrap_or_else(|e| e.into_inner());
        for (o, v) in half.iter_mut() {
            if let Err(e) = o.put(t, v) {
                failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(e);
                return;
            }
        }
    });
    failed
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .map_or(Ok(()), Err)
}

/// Row `t` of a sequence: a view sharing the sequence's buffer.
fn row(v: &Value, t: usize) -> Value {
    crate::map_value!(v.clone(), a => a.index_axis_move(Axis(0), t))
}

/// One stacked result, `[T, ..]`, allocated at the first step and filled a row per step
/// while the row is still in cache. The buffer starts uninitialised (every row is written
/// once), so it costs no zero-fill. One nobody reads keeps nothing.
struct Stacked {
    read: bool,
    t_len: usize,
    buf: Option<Box<dyn Rows>>,
}

impl Stacked {
    fn new(t_len: usize, read: bool) -> Stacked {
        Stacked {
            read,
            t_len,
            buf: None,
        }
    }

    fn put(&mut self, t: usize, v: &Value) -> Result<()> {
        if !self.read {
            return Ok(());
        }
        let t_len = self.t_len;
        let buf = self.buf.get_or_insert_with(
            || crate::dispatch_dtype!(v.dtype(), T => Box::new(RowBuf::<T>::new(t_len, v.shape()))),
        );
        buf.put(t, v)
    }

    /// The stacked value; an unread result is a scalar placeholder nothing looks at.
    fn finish(self, like: &Tensor) -> Result<Value> {
        if !self.read {
            return Ok(Value::scalar_f64(like.dtype(), 0.0));
        }
        match self.buf {
            Some(b) => b.finish(),
            None => {
                let mut shape = vec![0usize];
                shape.extend(like.shape().dims().iter().map(|d| d.unwrap_or(0)));
                Ok(Value::full(like.dtype(), &shape, 0.0))
            }
        }
    }
}

trait Rows: Send {
    fn put(&mut self, t: usize, v: &Value) -> Result<()>;
    fn finish(self: Box<Self>) -> Result<Value>;
}

/// `[T, ..row]` elements of one dtype; `written[t]` once row `t` has been put.
struct RowBuf<T> {
    data: Vec<T>,
    row: Vec<usize>,
    written: Vec<bool>,
}

impl<T: crate::base::value::Elem> RowBuf<T> {
    fn new(t_len: usize, row: &[usize]) -> RowBuf<T> {
        let n: usize = row.iter().product();
        RowBuf {
            data: Vec::with_capacity(t_len * n),
            row: row.to_vec(),
            written: vec![false; t_len],
        }
    }
}

impl<T: crate::base::value::Elem> Rows for RowBuf<T> {
    fn put(&mut self, t: usize, v: &Value) -> Result<()> {
        let src = T::unwrap(v).filter(|a| a.shape() == self.row.as_slice()).ok_or_else(|| {
            value_err!(
                "loop: step {t} produced a result of shape {:?} and dtype {}, earlier steps {:?} and {}; a step must keep its result shapes",
                v.shape(),
                v.dtype(),
                self.row,
                T::DTYPE
            )
        })?;
        let n = src.len();
        let dst = &mut self.data.spare_capacity_mut()[t * n..(t + 1) * n];
        match src.as_slice() {
            // SAFETY: `dst` is `n` elements of spare capacity, `s` holds `n` elements,
            // and the two cannot overlap (one is owned by this buffer).
            Some(s) => unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr(), dst.as_mut_ptr().cast::<T>(), n)
            },
            None => dst.iter_mut().zip(src.iter()).for_each(|(d, x)| {
                d.write(*x);
            }),
        }
        self.written[t] = true;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<Value> {
        if !self.written.iter().all(|&w| w) {
            return Err(crate::base::error::Error::Runtime(
                "loop: a stacked result is missing a step".into(),
            ));
        }
        let len = self.written.len() * self.row.iter().product::<usize>();
        // SAFETY: each of the `written.len()` rows of the capacity has been written by `put`.
        unsafe { self.data.set_len(len) };
        let mut shape = vec![self.written.len()];
        shape.extend_from_slice(&self.row);
        let data = std::mem::take(&mut self.data);
        Ok(T::wrap(
            crate::base::value::Arr::from_shape_vec(ndarray::IxDyn(&shape), data)
                .expect("rows fill the shape"),
        ))
    }
}

/// VJP of a loop: a reverse loop whose body is the VJP of the forward body. The forward
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
        super::source::placeholder(
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
                super::ReduceOp::Sum,
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
        grads = super::loop_opt::with_invariant(&body.captured, || {
            crate::autodiff::gradients_at_leaves(&y, &wrt)
        })?;
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
        let r = super::loop_opt::residuals(&fwd_leaves, &grad_leaves, &body.captured, &targets);
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
