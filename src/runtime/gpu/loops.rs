//! Loops on the GPU. A loop whose body runs on the device as a whole (`on_device`) is
//! recorded into the command list of the plan holding it: its body's schedule is lowered
//! once per step by a nested executor (`Exec::nested`), so the whole call still submits
//! once. The trip count is the sequences' length when the call runs. Step inputs are
//! rows of the sequences, bound as windows of their buffers (`DTensor::row`; a copy
//! kernel where a row's byte offset is not a multiple of the adapter's
//! `min_storage_buffer_offset_alignment`); states carry over as device tensors. Each
//! stacked result (`[T, ..]`: outputs, state histories, residuals) is allocated at the
//! first step; the kernel that computes a step's result writes it straight into its row
//! where it can (`Exec::dests`: the body's executor hands the row out as that node's
//! output buffer), else a kernel copies it there; a stacked result nothing reads is not
//! kept. A state's next value goes to the row of its history for the next step, so the
//! history costs nothing more. wgpu binds no buffer both read-only and writable in one
//! dispatch: a generated kernel that reads a state from its history's row while it
//! writes the next row declares that input writable (`fusion::writable`); a node whose
//! kernel turned out to read its own stacked result otherwise (`Exec::clashes`) is given
//! no row in a buffer a state of the step lives in (another of its stacked results, or
//! none that step).
//!
//! The body's first step runs its plan as built, recording the shape of every slot and
//! fused member (`Exec::shapes`); the other steps run it specialised to those shapes
//! (`Plan::specialize`, as `cpu::loops` does: a `sum_to` or `broadcast_to` to the shape
//! its input has goes, so the groups on either side fuse), kept in the body's placement
//! per feed shapes and shape values (`special_key`), so later runs start specialised. Buffers a call drops return to the pool only after its submit, so
//! a loop whose recorded steps hold more new buffer bytes than the pool keeps idle
//! (`FERROKERAS_GPU_POOL_MAX_IDLE_MB`) submits them and goes on. A body that needs the host (a `py_function`, an op or dtype
//! without a WGSL lowering) makes the whole loop run on the CPU (`Place::Host`).

use super::exec::{build_placement, gpu_target, Dest, Exec, Place, Placement, Slot, Special};
use super::pipelines::dtag;
use super::{kernels, pool, transfer, DTensor};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::fuse;
use crate::compile::{Plan, Step};
use crate::ops::control::LoopBody;
use crate::ops::graph::Tensor;
use crate::runtime::profile;
use crate::value_err;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Whether every node of the body plan `plan` runs on the device (placed by `lay`; loops
/// inside it are placed `Place::Gpu` only when their own bodies are) and every value fed
/// to it is one the device stores, or a shape vector kept on the host.
pub(crate) fn on_device(plan: &Plan, lay: &Placement) -> bool {
    let shape_like = fuse::shape_like(plan);
    (0..plan.nodes.len()).all(|i| match plan.steps[i] {
        Step::Fed(_) => shape_like[i] || dtag(plan.nodes[i].dtype()).is_some(),
        Step::Folded(_) => true,
        Step::Compute => lay.place[i] != Place::Host,
    })
}

/// The body feed each `Step::Fed` index is read by, if any.
fn fed_nodes(plan: &Plan, n_feeds: usize) -> Vec<Option<usize>> {
    let mut fed = vec![None; n_feeds];
    for (i, s) in plan.steps.iter().enumerate() {
        if let Step::Fed(f) = s {
            if *f < n_feeds {
                fed[*f] = Some(i);
            }
        }
    }
    fed
}

/// Where a step input comes from.
enum Rows {
    /// Nothing in the body reads it.
    Unread,
    /// A host sequence of shape vectors: row `t` is a host view.
    Host(Value),
    /// A device sequence: row `t` is a window of it, or copied by a kernel.
    Dev(DTensor),
}

/// One stacked result, `[T, ..]`: on the device, allocated at the first step and written
/// a row per step; or, for shape vectors computed on the host, rows kept on the host.
struct Stacked {
    read: bool,
    row: Option<(Vec<usize>, DType)>,
    dev: Option<DTensor>,
    host: Vec<Option<Value>>,
}

impl Stacked {
    fn new(t_len: usize, read: bool) -> Stacked {
        Stacked {
            read,
            row: None,
            dev: None,
            host: if read { vec![None; t_len] } else { Vec::new() },
        }
    }

    /// Row `t` as a destination for the body (`Exec::dests`), unless its rows are on the
    /// host or nothing reads it.
    fn dest(&self, t: usize) -> Option<Dest> {
        let on_host = self.row.is_some() && self.dev.is_none();
        (self.read && !on_host).then(|| Dest {
            stack: self.dev.clone(),
            rows: self.host.len(),
            t,
            given: None,
        })
    }

    /// Writes `v` as row `t` (nothing where the body wrote it in place). `placed` is the
    /// buffer the body allocated for the stacked result, if it did (`Dest::stack`).
    fn put(
        &mut self,
        ex: &mut Exec,
        node: usize,
        t: usize,
        v: &Slot,
        placed: Option<DTensor>,
    ) -> Result<()> {
        if !self.read {
            return Ok(());
        }
        let t_len = self.host.len();
        match &self.row {
            Some((shape, dtype)) if shape != &v.shape || *dtype != v.dtype => {
                return Err(value_err!(
                    "loop: step {t} produced a result of shape {:?} and dtype {}, earlier steps {shape:?} and {dtype}; a step must keep its result shapes",
                    v.shape,
                    v.dtype
                ));
            }
            Some(_) => {}
            None => {
                self.row = Some((v.shape.clone(), v.dtype));
                let on_host =
                    v.dev.is_none() && v.host.as_ref().is_some_and(Value::is_shape_vector);
                if !on_host {
                    let mut shape = vec![t_len];
                    shape.extend_from_slice(&v.shape);
                    self.dev = Some(match placed {
                        Some(p) if p.shape == shape && p.dtype == v.dtype => p,
                        _ => ex.alloc(&shape, v.dtype, node)?,
                    });
                }
            }
        }
        match &self.dev {
            Some(dst) => {
                let dst = dst.clone();
                let src = match (&v.dev, &v.host) {
                    (Some(d), _) => d.clone(),
                    (None, Some(h)) => upload(ex, h)?,
                    (None, None) => unreachable!("a slot has a host or a device value"),
                };
                if dst.row(t).is_some_and(|r| r.same_words(&src)) {
                    return Ok(());
                }
                let src = if src.same_buffer(&dst) {
                    kernels::copy(ex, &src)?
                } else {
                    src
                };
                kernels::write_row(ex, &dst, &src, t)
            }
            None => {
                let h = v.host.clone().ok_or_else(|| {
                    Error::Runtime(format!(
                        "internal: loop: step {t} computed on the device a result earlier steps computed on the host"
                    ))
                })?;
                self.host[t] = Some(h);
                Ok(())
            }
        }
    }

    /// The stacked value; `None` for a result nothing reads.
    fn finish(self, like: &Tensor) -> Result<Option<Slot>> {
        if !self.read {
            return Ok(None);
        }
        if let Some(d) = self.dev {
            return Ok(Some(Slot::dev(d)));
        }
        let rows: Vec<Value> = self.host.into_iter().flatten().collect();
        if rows.is_empty() {
            let mut shape = vec![0usize];
            shape.extend(like.shape().dims().iter().map(|d| d.unwrap_or(0)));
            return Ok(Some(Slot::host(Value::full(like.dtype(), &shape, 0.0))));
        }
        let views: Vec<Value> = rows
            .iter()
            .map(|r| {
                let mut sh = vec![1];
                sh.extend_from_slice(r.shape());
                r.reshape(&sh)
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Value> = views.iter().collect();
        Ok(Some(Slot::host(crate::ops::Op::Concat(0).cpu(&refs)?)))
    }
}

/// A host value copied to a device tensor.
fn upload(ex: &Exec, v: &Value) -> Result<DTensor> {
    let words = transfer::to_words(v).ok_or_else(|| {
        Error::Runtime(format!(
            "internal: a {} value cannot be uploaded to the GPU",
            v.dtype()
        ))
    })?;
    let buf = pool::alloc(ex.ctx, (words.len() as u64 * 4).max(4), &|| {
        format!("a loop step value (shape {:?}, {})", v.shape(), v.dtype())
    })?;
    if !words.is_empty() {
        ex.ctx
            .queue
            .write_buffer(buf.raw(), 0, bytemuck::cast_slice(&words));
    }
    Ok(DTensor::new(buf, v.shape().to_vec(), v.dtype()))
}

/// Records loop node `i` of `ex`'s plan, its body run once per step by a nested
/// executor; keeps its results for its `TupleGet` users (`result`).
pub(crate) fn record<'a>(ex: &mut Exec<'a>, i: usize, body: &Arc<LoopBody>) -> Result<Slot> {
    let plan: &'a Plan = ex.plan;
    let outer: &'a Placement = ex.lay;
    let body_plan: &'a Plan = plan.body(body);
    let lay: &'a Placement = outer
        .bodies
        .get(&(Arc::as_ptr(plan.body(body)) as usize))
        .ok_or_else(|| Error::Runtime("internal: a loop body without a placement".into()))?;
    let ins = plan.inputs[i].clone();
    let (nq, ns, no) = (body.seq_phs.len(), body.state_phs.len(), body.outputs.len());
    let nh = body_plan.outputs.len() - no - ns;
    let read = crate::runtime::cpu::results_read(plan, i, body.n_results());
    let is_read = |k: usize| read.get(k).copied().unwrap_or(true);
    let t_len = ex.slot(ins[0]).shape[0];
    for &q in &ins[..nq] {
        let len = ex.slot(q).shape[0];
        if len != t_len {
            return Err(value_err!(
                "loop: sequences have different lengths {t_len} and {len}"
            ));
        }
    }
    let fed = fed_nodes(body_plan, ins.len());
    let shape_like = fuse::shape_like(body_plan);
    let host_feed = |f: usize| fed[f].is_some_and(|n| shape_like[n]);
    // Shape vectors the body reads on the host: downloaded if they were computed on the
    // device (a submit before the loop).
    let on_device_only: Vec<usize> = ins
        .iter()
        .enumerate()
        .filter(|&(f, &j)| host_feed(f) && ex.slot(j).host.is_none())
        .map(|(_, &j)| j)
        .collect();
    ex.ensure_host(&on_device_only, false)?;
    let mut seqs = Vec::with_capacity(nq);
    for (f, &q) in ins[..nq].iter().enumerate() {
        let s = ex.slot(q);
        seqs.push(match (fed[f], &s.host) {
            (None, _) => Rows::Unread,
            (Some(_), Some(h)) if host_feed(f) => Rows::Host(h.clone()),
            (Some(_), _) => Rows::Dev(ex.dev(q)?),
        });
    }
    let mut states: Vec<Slot> = ins[nq..nq + ns]
        .iter()
        .map(|&j| ex.slot(j).clone())
        .collect();
    let mut captured = Vec::with_capacity(ins.len() - nq - ns);
    for (f, &j) in ins.iter().enumerate().skip(nq + ns) {
        if fed[f].is_some() && !host_feed(f) {
            ex.dev(j)?;
        }
        captured.push(ex.slot(j).clone());
    }
    let state_shapes: Vec<Vec<usize>> = states.iter().map(|s| s.shape.clone()).collect();
    // The body specialised to its step shapes, as `cpu::loops` does: kept per key, else
    // made from the shapes the first step records where the body's shapes follow from
    // its feeds'.
    let key = special_key(ex, &ins, &seqs, &states, &captured);
    let mut special: Option<Arc<Special>> = lay
        .special
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(k, _)| *k == key.0)
        .map(|(_, s)| s.clone());
    let mut record_shapes = special.is_none() && body_plan.shapes_follow_feeds(&key.1);
    let mut outs: Vec<Stacked> = (0..no + nh)
        .map(|k| Stacked::new(t_len, is_read(if k < no { k } else { k + 2 * ns })))
        .collect();
    let mut hist: Vec<Stacked> = (0..ns)
        .map(|k| Stacked::new(t_len, is_read(no + ns + k)))
        .collect();
    let debug = crate::base::config::settings().loop_debug;
    // Body results whose kernels read a buffer they were to write a row of (`dests`).
    let mut clashed: HashSet<usize> = HashSet::new();
    let mut base = held(ex);
    let _in_loop = profile::enter_loop();
    let run_start = profile::begin();
    for step in 0..t_len {
        let step_start = profile::begin();
        let t = if body.reverse { t_len - 1 - step } else { step };
        let next = (step + 1 < t_len).then(|| if body.reverse { t - 1 } else { t + 1 });
        let before = ex.stats.dispatches;
        let mut feeds: Vec<Option<Slot>> = Vec::with_capacity(ins.len());
        for s in &seqs {
            feeds.push(match s {
                Rows::Unread => None,
                Rows::Host(v) => Some(Slot::host(row(v, t))),
                Rows::Dev(d) => Some(Slot::dev(match d.row(t) {
                    Some(r) => r,
                    None => kernels::copy_row(ex, i, d, t)?,
                })),
            });
        }
        for (h, s) in hist.iter_mut().zip(&states) {
            h.put(ex, i, t, s, None)?;
        }
        let current = special.clone();
        let (step_plan, step_lay): (&Plan, &Placement) = match &current {
            Some(sp) => (&sp.plan, &sp.lay),
            None => (body_plan, lay),
        };
        let dests = destinations(step_plan, no, &outs, &hist, &states, t, next, &clashed);
        let which: HashMap<usize, Which> = dests.iter().map(|(n, w, _)| (*n, *w)).collect();
        feeds.extend(states.drain(..).map(Some));
        feeds.extend(captured.iter().cloned().map(Some));
        let mut child = ex.nested(step_plan, step_lay);
        if debug && step < 2 {
            child.trace = Some(Vec::new());
        }
        if record_shapes {
            *child.shapes.get_mut() = Some(vec![None; step_plan.nodes.len()]);
        }
        *child.dests.get_mut() = dests.into_iter().map(|(n, _, d)| (n, d)).collect();
        let ran = child.run_items(&mut feeds);
        let res: Vec<Slot> = step_plan
            .outputs
            .iter()
            .map(|&o| child.slots[o].clone())
            .collect::<Option<_>>()
            .unwrap_or_default();
        let given = child.dests.take();
        let clashes = child.clashes.take();
        let shapes = child.shapes.get_mut().take();
        ex.absorb(child);
        ran?;
        if let Some(shapes) = shapes.filter(|_| record_shapes) {
            record_shapes = false;
            special = specialise(ex, body_plan, lay, key.0.clone(), &shapes);
            if debug {
                if let Some(sp) = &special {
                    eprintln!(
                        "gpu loop: specialised to its shapes, {} of {} nodes computed",
                        sp.plan
                            .steps
                            .iter()
                            .filter(|s| matches!(s, Step::Compute))
                            .count(),
                        body_plan.nodes.len()
                    );
                }
            }
        }
        // The stacked results, allocated by the body where it wrote their first row.
        let mut placed: HashMap<Which, DTensor> = HashMap::new();
        for (node, d) in given {
            if d.given
                .as_ref()
                .is_some_and(|g| clashes.iter().any(|c| c.same_words(g)))
            {
                clashed.insert(node);
            }
            if let (Some(s), Some(&w)) = (d.stack, which.get(&node)) {
                placed.insert(w, s);
            }
        }
        if res.len() != step_plan.outputs.len() {
            return Err(Error::Runtime(
                "internal: a loop body did not compute its results".into(),
            ));
        }
        let mut res = res;
        let mut rest = res.split_off(no);
        let saved = rest.split_off(ns);
        for (j, (new, old)) in rest.iter().zip(&state_shapes).enumerate() {
            if &new.shape != old {
                return Err(value_err!(
                    "rnn: the step function changed state {j} from shape {old:?} to {:?} at step {t}",
                    new.shape
                ));
            }
        }
        for (k, (o, v)) in outs.iter_mut().zip(res.iter().chain(&saved)).enumerate() {
            o.put(ex, i, t, v, placed.remove(&Which::Out(k)))?;
        }
        states = rest;
        if held(ex).0.saturating_sub(base.0) > base.1 {
            ex.ensure_host(&[], true)?;
            base = held(ex);
        }
        if debug && step < 2 {
            eprintln!(
                "gpu loop run: step {step} of {t_len}: {} dispatches, {nq} step inputs, {nh} residuals",
                ex.stats.dispatches - before
            );
        }
        if let Some(start) = step_start {
            profile::loop_step(start, step, t, t_len);
        }
    }
    if let Some(start) = run_start {
        profile::loop_run(start, t_len);
    }
    let hidden = body.hidden();
    let mut results: Vec<Option<Slot>> = Vec::with_capacity(body.n_results());
    let saved = outs.split_off(no);
    for (o, like) in outs.into_iter().zip(&body.outputs) {
        results.push(o.finish(like)?);
    }
    results.extend(states.into_iter().map(Some));
    for (h, like) in hist.into_iter().zip(&body.state_phs) {
        results.push(h.finish(like)?);
    }
    for (o, like) in saved.into_iter().zip(&hidden) {
        results.push(o.finish(like)?);
    }
    ex.loop_results.insert(i, results);
    Ok(Slot::host(Value::scalar_f64(plan.nodes[i].dtype(), 0.0)))
}

/// The key a loop run's specialised body is kept under (`Placement::special`): the
/// shapes of its step rows, states and captured values, and the values of the shape
/// vectors it reads on the host that are the same at every step (captured ones, and
/// host sequences whose rows are all equal); with which feeds the key holds by value.
#[allow(clippy::type_complexity)] // the key and its by-value feeds
fn special_key(
    ex: &Exec,
    ins: &[usize],
    seqs: &[Rows],
    states: &[Slot],
    captured: &[Slot],
) -> (Vec<Vec<usize>>, Box<dyn Fn(usize) -> bool>) {
    let (nq, ns) = (seqs.len(), states.len());
    let mut key: Vec<Vec<usize>> = ins[..nq]
        .iter()
        .map(|&q| ex.slot(q).shape[1..].to_vec())
        .chain(states.iter().chain(captured).map(|s| s.shape.clone()))
        .collect();
    let mut seq_fixed = vec![false; nq];
    for (f, s) in seqs.iter().enumerate() {
        if let Rows::Host(v) = s {
            if let Some(r) = v.equal_shape_rows() {
                key.push([vec![usize::MAX - f], r].concat());
                seq_fixed[f] = true;
            }
        }
    }
    let cap_fixed: Vec<bool> = captured
        .iter()
        .map(|c| c.host.as_ref().is_some_and(Value::is_shape_vector))
        .collect();
    for c in captured {
        if let Some(v) = c.host.as_ref().filter(|v| v.is_shape_vector()) {
            key.push(v.to_i64_vec().iter().map(|&x| x as usize).collect());
        }
    }
    let keyed = move |f: usize| {
        if f < nq {
            seq_fixed[f]
        } else {
            f >= nq + ns && cap_fixed.get(f - nq - ns).copied().unwrap_or(false)
        }
    };
    (key, Box::new(keyed))
}

/// Most specialised bodies kept per body plan.
const MAX_SPECIAL: usize = 4;

/// `body` specialised to the slot shapes its first step recorded (`Plan::specialize`),
/// placed, and kept in `lay` under `key`; `None` where the specialised body would not
/// run on the device as a whole.
fn specialise(
    ex: &Exec,
    body: &Plan,
    lay: &Placement,
    key: Vec<Vec<usize>>,
    shapes: &[Option<Vec<usize>>],
) -> Option<Arc<Special>> {
    let plan = body.specialize(shapes, &[]);
    let placed = build_placement(ex.ctx, &plan, gpu_target(ex.ctx));
    if !on_device(&plan, &placed) {
        return None;
    }
    let sp = Arc::new(Special { plan, lay: placed });
    let mut kept = lay.special.lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() >= MAX_SPECIAL {
        kept.remove(0);
    }
    kept.push((key, sp.clone()));
    Some(sp)
}

/// A stacked result of a loop: `Out(k)`, output `k` or, from the loop's output count
/// on, a residual; `Hist(k)`, the history of state `k`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Which {
    Out(usize),
    Hist(usize),
}

/// The rows the body writes its results into this step (`Exec::dests`), by body node,
/// for a body plan with `no` outputs: row `t` of the outputs, then row `next` of the
/// state histories (the next step's state is this step's new state), then row `t` of
/// the residuals; one row per node, the first that applies. A node in `clashed` (its
/// kernel read a buffer it wrote a row of) gets no row in a buffer that one of the
/// step's `states` is a window of.
#[allow(clippy::too_many_arguments)]
fn destinations(
    plan: &Plan,
    no: usize,
    outs: &[Stacked],
    hist: &[Stacked],
    states: &[Slot],
    t: usize,
    next: Option<usize>,
    clashed: &HashSet<usize>,
) -> Vec<(usize, Which, Dest)> {
    let ns = hist.len();
    let node = |w: Which| match w {
        Which::Out(k) if k < no => plan.outputs[k],
        Which::Out(k) => plan.outputs[k + ns],
        Which::Hist(k) => plan.outputs[no + k],
    };
    let order = (0..no)
        .map(Which::Out)
        .chain((0..ns).map(Which::Hist))
        .chain((no..outs.len()).map(Which::Out));
    let mut out: Vec<(usize, Which, Dest)> = Vec::new();
    for w in order {
        let n = node(w);
        if out.iter().any(|(m, _, _)| *m == n) {
            continue;
        }
        let d = match w {
            Which::Out(k) => outs[k].dest(t),
            Which::Hist(k) => next.and_then(|r| hist[k].dest(r)),
        };
        let Some(d) = d else { continue };
        let beside_state = d.stack.as_ref().is_some_and(|s| {
            states
                .iter()
                .any(|x| x.dev.as_ref().is_some_and(|b| b.same_buffer(s)))
        });
        if clashed.contains(&n) && beside_state {
            continue;
        }
        out.push((n, w, d));
    }
    out
}

/// Bytes of the device's buffers in use or waiting for the call's submit, and the bytes
/// its pool keeps idle at most (`pool::Pool::stats`).
fn held(ex: &Exec) -> (u64, u64) {
    let stats = super::pool_stats(ex.ctx);
    let get = |name: &str| {
        stats
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    };
    (
        get("allocated_bytes").saturating_sub(get("pooled_bytes")),
        get("max_idle_bytes"),
    )
}

/// Result `k` of the loop node `TupleGet` node `i` reads.
pub(crate) fn result(ex: &mut Exec, i: usize, k: usize) -> Result<Slot> {
    let src = ex.plan.inputs[i][0];
    ex.loop_results
        .get(&src)
        .and_then(|r| r.get(k))
        .and_then(Option::clone)
        .ok_or_else(|| Error::Runtime(format!("result {k} of a loop was not computed")))
}

/// Row `t` of a host sequence: a view sharing its buffer.
fn row(v: &Value, t: usize) -> Value {
    crate::map_value!(v.clone(), a => a.index_axis_move(ndarray::Axis(0), t))
}
