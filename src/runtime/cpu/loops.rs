//! Running a loop on the CPU: the body's plan once per step, rows of the sequences in,
//! stacked results out. The body's plan comes compiled with the plan holding the loop
//! (`compile::Plan::body`); after the first step it runs specialised to the step's shapes.
//! The run state of each body plan (`cpu::PlanState`) is kept here, with the plan.

use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::Plan;
use crate::ops::control::LoopBody;
use crate::ops::graph::Tensor;
use crate::runtime::cpu::{PlanState, SlotShapes};
use crate::runtime::profile;
use crate::value_err;
use ndarray::Axis;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Runs a body plan on the CPU, recording slot shapes when asked (`cpu::run_recording`).
pub type RunPlan<'a> =
    &'a dyn Fn(&Plan, &PlanState, Vec<Value>, Option<&mut SlotShapes>) -> Result<Vec<Value>>;

/// Feed shapes (and the shape vectors fed by value) a specialised body plan is made for.
type Key = Vec<Vec<usize>>;

/// A body plan with its run state.
type Runnable = (Arc<Plan>, Arc<PlanState>);

/// What is kept per generic body plan: its run state, and the plans specialised to step
/// shapes (the last few) with theirs.
struct Kept {
    plan: Weak<Plan>,
    state: Arc<PlanState>,
    specialised: Vec<(Key, Runnable)>,
}

/// `Kept` per generic body plan, keyed by that plan's address (checked against a weak
/// reference, so a dropped plan's entry is never taken for a new one at the same
/// address). Locked once per loop run, not per step.
static KEPT: Mutex<Option<HashMap<usize, Kept>>> = Mutex::new(None);

/// Specialised body plans kept per generic plan.
const MAX_SPECIALISED: usize = 4;

/// The run state of `generic`, and its plan specialised to `key` if there is one.
fn kept(generic: &Arc<Plan>, key: &[Vec<usize>]) -> (Arc<PlanState>, Option<Runnable>) {
    let mut cache = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let map = cache.get_or_insert_with(HashMap::new);
    let addr = Arc::as_ptr(generic) as usize;
    let live = map.get(&addr).is_some_and(|k| {
        std::ptr::eq(k.plan.as_ptr(), Arc::as_ptr(generic)) && k.plan.strong_count() > 0
    });
    if !live {
        map.retain(|_, k| k.plan.strong_count() > 0);
        map.insert(
            addr,
            Kept {
                plan: Arc::downgrade(generic),
                state: Default::default(),
                specialised: Vec::new(),
            },
        );
    }
    let k = &map[&addr];
    let special = k
        .specialised
        .iter()
        .find(|(k, _)| k.as_slice() == key)
        .map(|(_, r)| r.clone());
    (k.state.clone(), special)
}

fn remember(generic: &Arc<Plan>, key: Key, special: Runnable) {
    let mut cache = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let Some(k) = cache
        .as_mut()
        .and_then(|m| m.get_mut(&(Arc::as_ptr(generic) as usize)))
    else {
        return;
    };
    if k.specialised.len() >= MAX_SPECIALISED {
        k.specialised.remove(0);
    }
    k.specialised.push((key, special));
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
    generic: &Arc<Plan>,
    args: &[&Value],
    read: &[bool],
    run_plan: RunPlan<'_>,
) -> Result<Vec<Value>> {
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
            s.equal_shape_rows()
                .map(|r| key.push([vec![usize::MAX - f], r].concat()))
                .is_some()
        })
        .collect();
    key.extend(
        captured
            .iter()
            .filter(|v| v.is_shape_vector())
            .map(|v| v.to_i64_vec().iter().map(|&x| x as usize).collect()),
    );
    // Which feeds (of `[step rows.., states.., captured..]`) the key holds by value.
    let keyed = |f: usize| {
        if f < nq {
            seq_fixed[f]
        } else {
            f >= nq + ns
                && captured
                    .get(f - nq - ns)
                    .is_some_and(|v| v.is_shape_vector())
        }
    };
    let (generic_state, special) = kept(generic, &key);
    let mut record = special.is_none() && generic.shapes_follow_feeds(&keyed);
    let (mut plan, mut state) = special.unwrap_or_else(|| (generic.clone(), generic_state));
    let is_read = |k: usize| read.get(k).copied().unwrap_or(true);
    let mut outs: Vec<Stacked> = (0..no + nh)
        .map(|k| Stacked::new(t_len, is_read(if k < no { k } else { k + 2 * ns })))
        .collect();
    let mut hist: Vec<Stacked> = (0..ns)
        .map(|k| Stacked::new(t_len, is_read(no + ns + k)))
        .collect();
    let state_shapes: Vec<Vec<usize>> = states.iter().map(|s| s.shape().to_vec()).collect();
    let _in_loop = profile::enter_loop();
    let run_start = profile::begin();
    for i in 0..t_len {
        let step_start = profile::begin();
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
            let res = run_plan(&plan, &state, feeds, Some(&mut shapes))?;
            plan = Arc::new(generic.specialize(&shapes, &[]));
            state = Default::default();
            remember(generic, key.clone(), (plan.clone(), state.clone()));
            if crate::base::config::settings().loop_debug {
                eprintln!(
                    "loop: specialised to its shapes, {} launches per step",
                    plan.schedule(&crate::compile::fuse::Target::cpu_configured())
                        .dispatches
                );
            }
            record = false;
            res
        } else {
            run_plan(&plan, &state, feeds, None)?
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
        if let Some(start) = step_start {
            profile::loop_step(start, i, t, t_len);
        }
    }
    if let Some(start) = run_start {
        profile::loop_run(start, t_len);
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
