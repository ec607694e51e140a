//! A compiled `K.function` as the runtime runs it: the plan, its feeds, outputs and
//! variable updates, the plans specialised to the shapes of the feeds seen, the CPU run
//! state of each (`cpu::PlanState`), the GPU plan cache, the in-place updates
//! (`cpu::InPlace`), the update tails that finish after a call returns (`TailJob`), the
//! statistics of the last call and the lock that makes a call's variable updates atomic.

use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::{Plan, Step};
use crate::ops::graph::Tensor;
use crate::ops::{Op, VarCell};
use crate::runtime::{cpu, device, gpu, host_results, profile, Out, RunStats};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A compiled `K.function`: feeds, outputs and variable updates. Every output and every
/// update value is computed from the values before the call; then the updates are
/// assigned together, so a failed call changes nothing.
pub struct Function {
    pub feeds: Vec<Tensor>,
    pub plan: Plan,
    pub n_outputs: usize,
    pub updates: Vec<Arc<VarCell>>,
    /// The CPU executor's state for `plan` (compiled fusion programs, run times).
    pub cpu: cpu::PlanState,
    /// Per-plan GPU state (placement, fusion groups, uploaded constants).
    pub gpu: gpu::PlanCache,
    /// Kernel launches and submits of the last call.
    pub last: Mutex<Option<RunStats>>,
    /// The variables a CPU run may overwrite with their new values (`cpu::InPlace`); `None`
    /// when an update's shape is known only at run time (its check could then fail after
    /// the overwrite).
    in_place: Option<cpu::InPlace>,
    /// Whether every update value has its variable's static shape (see `in_place_updates`).
    fixed_updates: bool,
    /// Whether CPU runs use the plan specialised to the feeds' shapes (`Specialised`).
    specialises: bool,
    /// The plans specialised so far, most recently made last.
    specialised: Mutex<Vec<Arc<Specialised>>>,
    /// Feed-shape sets seen once (most recent last): a set is specialised to when it comes
    /// again, so calls whose shapes never repeat do not pay for specialising.
    seen: Mutex<Vec<Key>>,
    /// The feeds a specialised plan is also keyed on by value (`switch_feeds`).
    switches: Vec<usize>,
    /// The name `K.function` was given (empty: none), which its profile spans carry.
    pub name: String,
    /// Every variable the plan reads (its loop bodies' included) or assigns: a call waits
    /// for the pending update tails of these (`VarCell::wait_settled`) before it runs.
    touches: Vec<Arc<VarCell>>,
    /// Whether the last call returned before its variable updates ended (`TailJob`).
    pub last_async: AtomicBool,
    /// Makes the next update tail that runs after its call fail (tests of `TailJob`).
    #[cfg(test)]
    fail_next_tail: AtomicBool,
}

/// What a specialised plan is made for: the shape of every feed, and the values of the
/// feeds that are `select` conditions (`switch_feeds`).
#[derive(Clone, PartialEq)]
struct Key {
    shapes: Vec<Vec<usize>>,
    values: Vec<f64>,
}

/// The plan of a `Function` specialised to one set of feed shapes (`Plan::specialize`):
/// its `shape` nodes folded and the `sum_to` / `broadcast_to` nodes that change nothing
/// dropped, so the elementwise chains of a gradient fuse across them. Every gradient of a
/// broadcasting op ends in a `sum_to` back to its operand's shape, which the batch
/// dimension's `None` keeps in the generic plan: a Keras MLP's backward pass ran five
/// `[128, 512]` passes per layer where one does.
struct Specialised {
    key: Key,
    plan: Plan,
    state: cpu::PlanState,
    in_place: Option<cpu::InPlace>,
    /// Where a run may return its outputs and leave the in-place tail to a `TailJob`.
    split: Option<cpu::TailSplit>,
}

/// Feed-shape sets a `Function` keeps specialised plans for (a Keras epoch's full and
/// last batches, a validation batch...).
const MAX_SPECIALISED: usize = 4;

impl Function {
    pub fn new(
        feeds: Vec<Tensor>,
        outputs: Vec<Tensor>,
        updates: Vec<(Tensor, Tensor)>,
    ) -> Result<Function> {
        let mut targets = outputs.clone();
        let mut cells = Vec::with_capacity(updates.len());
        for (var, val) in &updates {
            let Op::Variable(cell) = var.op() else {
                return Err(Error::Type(format!(
                    "function: an update target must be a variable, got {}",
                    var.op().name()
                )));
            };
            if val.dtype() != cell.dtype {
                return Err(Error::Type(format!(
                    "function: the update of variable '{}' ({}) has dtype {}",
                    cell.name,
                    cell.dtype,
                    val.dtype()
                )));
            }
            let ok = val.rank() == cell.shape.len()
                && val
                    .shape()
                    .dims()
                    .iter()
                    .zip(&cell.shape)
                    .all(|(d, &s)| d.is_none_or(|d| d == s));
            if !ok {
                return Err(Error::Value(format!(
                    "function: the update of variable '{}' has shape {}, the variable has shape {:?}",
                    cell.name, val.shape(), cell.shape
                )));
            }
            cells.push(cell.clone());
            targets.push(val.clone());
        }
        let plan = Plan::new(&feeds, &targets)?;
        let fixed_updates = updates
            .iter()
            .zip(&cells)
            .all(|((_, val), cell)| val.shape().to_known().is_some_and(|s| s == cell.shape));
        let in_place = in_place_updates(&plan, outputs.len(), &cells, fixed_updates);
        let specialises = plan.shapes_follow_feeds(&|_| false) && loops_keep_shapes(&plan);
        let switches = switch_feeds(&plan);
        let mut touches = cells.clone();
        variables_read(&plan, &mut touches);
        Ok(Function {
            feeds,
            plan,
            n_outputs: outputs.len(),
            updates: cells,
            cpu: Default::default(),
            gpu: Default::default(),
            last: Mutex::new(None),
            in_place,
            fixed_updates,
            specialises,
            specialised: Default::default(),
            seen: Default::default(),
            switches,
            name: String::new(),
            touches,
            last_async: AtomicBool::new(false),
            #[cfg(test)]
            fail_next_tail: AtomicBool::new(false),
        })
    }

    /// The function, named `name` (in its profile spans).
    pub fn named(mut self, name: &str) -> Function {
        self.name = name.to_string();
        self
    }

    /// Runs the plan. A run that stopped on a variable held by another call's in-place
    /// update or update tail (`Error::UpdatingInPlace`: the run was on a rayon worker, where it
    /// must not wait) runs again once its variables are free (`wait_for_variables`); it
    /// changed nothing.
    ///
    /// On the CPU, the plan specialised to the feeds' shapes (and the values of its switch
    /// feeds) runs; the first call with new shapes runs the generic plan, the second
    /// records the shapes to specialise it to. A specialised run with a `cpu::TailSplit`
    /// may stop there, with `tail` (`tail_allowed`): it then returns the outputs only and
    /// the `TailJob` that finishes it.
    fn run(&self, feeds: Vec<Value>, tail: bool) -> Result<(Vec<Out>, RunStats, Option<TailJob>)> {
        let on_cpu = self.specialises && matches!(device::current()?, device::Device::Cpu);
        let key = Key {
            shapes: if on_cpu {
                feeds.iter().map(|v| v.shape().to_vec()).collect()
            } else {
                Vec::new()
            },
            values: if on_cpu {
                self.switches
                    .iter()
                    .map(|&f| feeds[f].to_f64_vec()[0])
                    .collect()
            } else {
                Vec::new()
            },
        };
        let special = if on_cpu {
            self.specialised_for(&key)
        } else {
            None
        };
        loop {
            let r = match &special {
                Some(sp) => match (&sp.split, &sp.in_place) {
                    (Some(split), Some(in_place)) if tail => {
                        cpu::run_to_tail(&sp.plan, &sp.state, feeds.clone(), split).and_then(
                            |(mut outs, rest)| {
                                if rest.borrows() {
                                    outs.extend(rest.finish(&sp.plan, &sp.state, split, in_place)?);
                                    let (v, stats) = host_results(outs, &sp.plan);
                                    return Ok((v, stats, None));
                                }
                                let (v, stats) = host_results(outs, &sp.plan);
                                let job = TailJob {
                                    sp: sp.clone(),
                                    rest,
                                    updates: self.updates.clone(),
                                    #[cfg(test)]
                                    fail: self.fail_next_tail.swap(false, Ordering::Relaxed),
                                };
                                Ok((v, stats, Some(job)))
                            },
                        )
                    }
                    _ => cpu::run(&sp.plan, &sp.state, feeds.clone(), sp.in_place.as_ref())
                        .map(|v| host_results(v, &sp.plan))
                        .map(|(v, stats)| (v, stats, None)),
                },
                None if on_cpu && self.seen_before(&key) => {
                    let mut shapes = cpu::SlotShapes::new();
                    let r = cpu::run_shaped(
                        &self.plan,
                        &self.cpu,
                        feeds.clone(),
                        self.in_place.as_ref(),
                        Some(&mut shapes),
                    )
                    .map(|v| host_results(v, &self.plan));
                    if r.is_ok() {
                        self.remember(key.clone(), &shapes, &feeds);
                    }
                    r.map(|(v, stats)| (v, stats, None))
                }
                None => super::run(
                    &self.plan,
                    feeds.clone(),
                    self.n_outputs,
                    &self.cpu,
                    &self.gpu,
                    self.in_place.as_ref(),
                )
                .map(|(v, stats)| (v, stats, None)),
            };
            match r {
                Err(Error::UpdatingInPlace(_)) => self.wait_for_variables(),
                r => return r,
            }
        }
    }

    /// Waits until no run or pending update tail holds a variable the plan reads or
    /// assigns (`touches`); on a rayon worker, where `VarCell::wait_settled` does not
    /// wait, until none holds any variable at all.
    fn wait_for_variables(&self) {
        if rayon::current_thread_index().is_some() {
            return crate::ops::source::wait_for_in_place_updates();
        }
        for cell in &self.touches {
            // A lost value raises where the run reads it.
            let _ = cell.wait_settled();
        }
    }

    /// Whether feeds of these shapes came before (noting them if not).
    fn seen_before(&self, key: &Key) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.iter().any(|k| k == key) {
            return true;
        }
        if seen.len() >= 2 * MAX_SPECIALISED {
            seen.remove(0);
        }
        seen.push(key.clone());
        false
    }

    /// The plan specialised to feeds of these shapes, if one was made.
    fn specialised_for(&self, key: &Key) -> Option<Arc<Specialised>> {
        let cache = self.specialised.lock().unwrap_or_else(|e| e.into_inner());
        cache.iter().rev().find(|sp| &sp.key == key).cloned()
    }

    /// Specialises the plan to the slot shapes a run with feeds of shapes `key` recorded
    /// and the values of its switch feeds.
    fn remember(&self, key: Key, shapes: &cpu::SlotShapes, feeds: &[Value]) {
        let values: Vec<(usize, Value)> = self
            .switches
            .iter()
            .map(|&f| (f, feeds[f].clone()))
            .collect();
        let plan = self.plan.specialize(shapes, &values);
        let in_place = in_place_updates(&plan, self.n_outputs, &self.updates, self.fixed_updates);
        let split = match &in_place {
            Some(_) if crate::base::config::settings().cpu_async_updates => {
                cpu::tail_split(&plan, self.n_outputs)
            }
            _ => None,
        };
        let mut cache = self.specialised.lock().unwrap_or_else(|e| e.into_inner());
        if cache.iter().any(|sp| sp.key == key) {
            return;
        }
        if cache.len() >= MAX_SPECIALISED {
            cache.remove(0);
        }
        cache.push(Arc::new(Specialised {
            key,
            plan,
            state: Default::default(),
            in_place,
            split,
        }));
    }

    /// Runs the plan on `feeds` (already validated), assigns the updates and returns the
    /// outputs. A call that assigns variables holds the update lock (`with_update_lock`)
    /// from the run to the last assignment, or to the start of its `TailJob`.
    pub fn call(&self, feeds: Vec<Value>) -> Result<Vec<Value>> {
        let start = profile::begin();
        let depth = CALL_DEPTH.with(|d| d.replace(d.get() + 1));
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                CALL_DEPTH.with(|d| d.set(d.get() - 1));
            }
        }
        let _leave = Leave;
        let r = if self.updates.is_empty() {
            self.call_unlocked(feeds, false)
        } else {
            with_update_lock(|| self.call_unlocked(feeds, depth == 0))
        };
        if let Some(start) = start {
            let stats = match r {
                Ok(_) => (*self.last.lock().unwrap_or_else(|e| e.into_inner())).unwrap_or_default(),
                Err(_) => RunStats::default(),
            };
            let device = device::current().map(|d| d.name()).unwrap_or_default();
            profile::call(
                start,
                &self.name,
                &device,
                stats.dispatches,
                stats.submits,
                r.is_ok(),
            );
        }
        r
    }

    /// `call` without the update lock. With `outermost` (a call from outside any other),
    /// the run may return before its update tail ends (`tail_allowed`).
    fn call_unlocked(&self, feeds: Vec<Value>, outermost: bool) -> Result<Vec<Value>> {
        // Waits for the update tails of earlier calls that assign the variables this call
        // reads or assigns (a pending tail assigns later than this call would, otherwise),
        // running those no worker has started yet here.
        if rayon::current_thread_index().is_none() && self.touches.iter().any(|c| c.is_held()) {
            run_queued();
        }
        for cell in &self.touches {
            match cell.wait_settled() {
                Ok(()) | Err(Error::UpdatingInPlace(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let tail = outermost && tail_allowed();
        let (mut values, stats, job) = self.run(feeds, tail)?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
        self.last_async.store(job.is_some(), Ordering::Relaxed);
        if let Some(job) = job {
            job.start();
            return values.into_iter().map(host_value).collect();
        }
        let upd = values.split_off(self.n_outputs);
        for (cell, v) in self.updates.iter().zip(&upd) {
            if v.shape() != cell.shape.as_slice() {
                return Err(Error::Value(format!(
                    "function: the update of variable '{}' has shape {:?}, the variable has shape {:?}",
                    cell.name,
                    v.shape(),
                    cell.shape
                )));
            }
        }
        for (cell, v) in self.updates.iter().zip(upd) {
            match v {
                Out::Host(v) => cell.finish_update(v)?,
                Out::Resident(r) => cell.set_resident(Arc::new(r)),
            }
        }
        values.into_iter().map(host_value).collect()
    }
}

/// An output as a host value, downloaded if it stayed on a device.
fn host_value(o: Out) -> Result<Value> {
    match o {
        Out::Host(v) => Ok(v),
        Out::Resident(r) => r.download(),
    }
}

thread_local! {
    /// `Function::call`s running on this thread (a `py_function` may call another).
    static CALL_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether a call on this thread may leave its update tail to a `TailJob`: it is switched
/// on (`FERROKERAS_CPU_ASYNC_UPDATES`), and the thread is not a rayon worker, so the job
/// goes to the pool's shared queue (a worker that waits for a pending tail may be running
/// on top of it: reads there stop instead, `VarCell::get`).
fn tail_allowed() -> bool {
    crate::base::config::settings().cpu_async_updates && rayon::current_thread_index().is_none()
}

/// The rest of a call's CPU run after its outputs (`cpu::run_to_tail`): the schedule's
/// infallible tail, which writes the new values of the variables the call assigns (in
/// place where it can), and their assignment. A Keras training call's outputs (loss,
/// metrics) come before its optimizer updates, so the call returns them and this runs on
/// a rayon worker meanwhile, while Keras' Python loop goes on (MLP step: see
/// docs/performance.md). Before the call returns every variable it assigns is marked
/// pending (`VarCell::mark_pending`): any read of one (`get`, `set`, a run, a GPU upload,
/// the next call, which waits for it first) waits for the assignment. Should the tail
/// fail all the same (a panic), the variables become NaN and reads of them raise the
/// error, naming them, until they are assigned again.
struct TailJob {
    sp: Arc<Specialised>,
    rest: cpu::Tail,
    updates: Vec<Arc<VarCell>>,
    #[cfg(test)]
    fail: bool,
}

/// A started `TailJob` that no thread has taken yet.
type Queued = Arc<Mutex<Option<TailJob>>>;

/// The started `TailJob`s not yet taken, process-wide: a rayon worker takes each
/// (`TailJob::start`), unless a call that must wait for one takes it first (`run_queued`),
/// so a wait never outlasts a worker's wake-up.
static QUEUED: Mutex<Vec<Queued>> = Mutex::new(Vec::new());

fn queued() -> std::sync::MutexGuard<'static, Vec<Queued>> {
    QUEUED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes `q`'s job, if no one has, and runs it here.
fn take_and_finish(q: &Queued) {
    let job = q.lock().unwrap_or_else(|e| e.into_inner()).take();
    queued().retain(|other| !Arc::ptr_eq(other, q));
    if let Some(job) = job {
        job.finish();
    }
}

/// Runs here every started `TailJob` that no worker has taken yet (a call about to wait
/// for the variables one assigns).
fn run_queued() {
    let all: Vec<Queued> = std::mem::take(&mut *queued());
    all.iter().for_each(take_and_finish);
}

impl TailJob {
    /// Marks the variables pending and hands the job to the rayon pool; runs it here
    /// instead where a variable is held already (which the call's wait rules out).
    fn start(self) {
        let marked: Vec<bool> = self.updates.iter().map(|c| c.mark_pending()).collect();
        if marked.iter().all(|&m| m) {
            let q: Queued = Arc::new(Mutex::new(Some(self)));
            queued().push(q.clone());
            rayon::spawn(move || take_and_finish(&q));
            return;
        }
        for (cell, m) in self.updates.iter().zip(marked) {
            if m {
                cell.release_pending(None);
            }
        }
        self.finish();
    }

    fn finish(self) {
        let TailJob {
            sp,
            rest,
            updates,
            #[cfg(test)]
            fail,
        } = self;
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
            let (Some(split), Some(in_place)) = (&sp.split, &sp.in_place) else {
                unreachable!("a tail job comes from a split plan")
            };
            let values = rest.finish(&sp.plan, &sp.state, split, in_place)?;
            for (cell, v) in updates.iter().zip(values) {
                cell.finish_update(v)?;
            }
            #[cfg(test)]
            if fail {
                panic!("a tail made to fail");
            }
            Ok(())
        }));
        let why = match run {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(p) => Some(
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into()),
            ),
        };
        let lost: Option<Arc<str>> = why.map(|e| {
            let names: Vec<&str> = updates.iter().map(|c| c.name.as_str()).collect();
            format!(
                "internal: the update of variables {names:?} failed after its call returned \
                 ({e}); they hold NaN until assigned"
            )
            .into()
        });
        for cell in &updates {
            cell.release_pending(lost.clone());
        }
    }
}

/// Adds to `out` the variables `plan` reads, its loop bodies' included, each once.
fn variables_read(plan: &Plan, out: &mut Vec<Arc<VarCell>>) {
    for n in &plan.nodes {
        if let Op::Variable(c) = n.op() {
            if !out.iter().any(|d| d.id == c.id) {
                out.push(c.clone());
            }
        }
        if let Op::Loop(body) = n.op() {
            variables_read(plan.body(body), out);
        }
    }
}

/// The feeds a specialised plan fixes by value: scalar feeds that are, directly or through
/// casts, the condition of a `select` (Keras' learning phase, fed 1 in training and 0 in
/// evaluation, picks between the two branches of every `K.in_train_phase`). Not int64
/// feeds, whose values `Key` (in f64) would not tell apart.
fn switch_feeds(plan: &Plan) -> Vec<usize> {
    let mut fed = vec![None; plan.nodes.len()];
    let mut out = Vec::new();
    for i in 0..plan.nodes.len() {
        let scalar = plan.nodes[i].rank() == 0 && plan.nodes[i].dtype() != DType::I64;
        fed[i] = match &plan.steps[i] {
            Step::Fed(f) => scalar.then_some(*f),
            Step::Compute if matches!(plan.nodes[i].op(), Op::Cast(_)) => fed[plan.inputs[i][0]],
            Step::Compute | Step::Folded(_) => None,
        };
        if let (Step::Compute, Op::Select) = (&plan.steps[i], plan.nodes[i].op()) {
            if let Some(f) = fed[plan.inputs[i][0]] {
                if !out.contains(&f) {
                    out.push(f);
                }
            }
        }
    }
    out.sort_unstable();
    out
}

/// Whether the results of every loop in `plan` have shapes that follow the loop's input
/// shapes: its body's own shapes follow its feeds' shapes, counting none of them by value
/// (a loop VJP body whose `sum_to`s read captured shape vectors fails this, conservatively).
/// A Python callback or a CTC decode inside a body makes shapes of its own.
fn loops_keep_shapes(plan: &Plan) -> bool {
    plan.nodes.iter().all(|n| {
        let Op::Loop(body) = n.op() else {
            return true;
        };
        let p = plan.body(body);
        p.shapes_follow_feeds(&|_| false) && loops_keep_shapes(p)
    })
}

/// What a run of `plan` may overwrite in place (`cpu::InPlace`): the variables assigned
/// `cells` (the updates `n_outputs..` of the plan's outputs), when every update value has
/// the variable's static shape (`fixed`: the call's checks after the run cannot fail),
/// each variable is assigned once and read at one slot (a second read would wait for its
/// own run).
/// `FERROKERAS_CPU_INPLACE=0` (`base::config`) turns this off.
fn in_place_updates(
    plan: &Plan,
    n_outputs: usize,
    cells: &[Arc<VarCell>],
    fixed: bool,
) -> Option<cpu::InPlace> {
    if !crate::base::config::settings().cpu_inplace {
        return None;
    }
    let once = cells
        .iter()
        .enumerate()
        .all(|(k, c)| cells[..k].iter().all(|d| d.id != c.id));
    if cells.is_empty() || !fixed || !once {
        return None;
    }
    let n = plan.nodes.len();
    let mut in_place = cpu::InPlace {
        cells: vec![None; n],
        variable_slot: vec![None; n],
        assign: Vec::new(),
    };
    for (k, cell) in cells.iter().enumerate() {
        let reads: Vec<usize> = (0..n)
            .filter(|&i| matches!(plan.nodes[i].op(), Op::Variable(c) if c.id == cell.id))
            .collect();
        match reads.as_slice() {
            [] => {}
            [j] => {
                in_place.cells[*j] = Some(cell.clone());
                in_place.variable_slot[plan.outputs[n_outputs + k]] = Some(*j);
                in_place
                    .assign
                    .push((cell.clone(), plan.outputs[n_outputs + k]));
            }
            _ => return None,
        }
    }
    Some(in_place)
}

/// Checks a fed value against the placeholder (or tensor) it feeds, converting its dtype.
pub fn check_feed(t: &Tensor, v: Value) -> Result<Value> {
    let name = match t.op() {
        Op::Placeholder(p) => p.name.clone(),
        other => other.name(),
    };
    let s = v.shape();
    let ok = s.len() == t.rank()
        && t.shape()
            .dims()
            .iter()
            .zip(s)
            .all(|(d, &n)| d.is_none_or(|d| d == n));
    if !ok {
        return Err(Error::Value(format!(
            "cannot feed a value of shape {s:?} to '{name}', which has shape {}",
            t.shape()
        )));
    }
    if v.dtype() != t.dtype() {
        if v.dtype().is_float() && !t.dtype().is_float() {
            return Err(Error::Type(format!(
                "cannot feed a {} value to '{name}', which has dtype {}",
                v.dtype(),
                t.dtype()
            )));
        }
        return Ok(v.cast(t.dtype()));
    }
    Ok(v)
}

static UPDATE_LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    static HOLDS_UPDATE_LOCK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a call that assigns variables under one process-wide lock, so that concurrent calls
/// do not lose each other's read-modify-write updates (4 threads x 500 `update_add(v, 1)`
/// calls ended below 2000). Re-entrant, for a `py_function` body that calls another
/// updating function on the same thread.
fn with_update_lock<T>(f: impl FnOnce() -> T) -> T {
    if HOLDS_UPDATE_LOCK.with(|h| h.get()) {
        return f();
    }
    let _guard = UPDATE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            HOLDS_UPDATE_LOCK.with(|h| h.set(false));
        }
    }
    HOLDS_UPDATE_LOCK.with(|h| h.set(true));
    let _release = Release;
    f()
}

#[cfg(test)]
mod tests {
    use super::{Function, VarCell};
    use crate::base::dtype::DType;
    use crate::base::shape::Shape;
    use crate::base::value::Value;
    use crate::ops::build::{add, reduce};
    use crate::ops::source::{constant, placeholder, variable};
    use crate::ops::ReduceOp;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    const N: usize = 1 << 20;

    /// `sum(x)` with the update `w <- w + 1` over `N` float32 elements (a tail that writes
    /// `w` in place), and the value of `x` to feed.
    fn counter(name: &str) -> (Arc<VarCell>, Function, Value) {
        let x = placeholder("x", Shape(vec![None]), DType::F32, None).unwrap();
        let (w, wt) = variable(name, Value::full(DType::F32, &[N], 0.0));
        let one = constant(Value::scalar_f64(DType::F32, 1.0));
        let total = reduce(ReduceOp::Sum, &x, &[0], false).unwrap();
        let f = Function::new(
            vec![x],
            vec![total],
            vec![(wt.clone(), add(&wt, &one).unwrap())],
        );
        (w, f.unwrap(), Value::full(DType::F32, &[3], 2.0))
    }

    fn all_equal(v: &Value, want: f64) -> bool {
        v.to_f64_vec().iter().all(|&x| x == want)
    }

    #[test]
    fn a_specialised_training_call_returns_before_its_tail_and_reads_wait_for_it() {
        let (w, f, x) = counter("w_async");
        for k in 1..=6 {
            let out = f.call(vec![x.clone()]).unwrap();
            assert_eq!(out[0].to_f64_vec(), vec![6.0]);
            // The third call runs the specialised plan, whose tail finishes on a worker.
            assert_eq!(
                f.last_async.load(Ordering::Relaxed),
                k >= 3 && crate::base::config::settings().cpu_async_updates,
                "call {k}"
            );
            assert!(all_equal(&w.get().unwrap(), k as f64), "call {k}");
        }
        // Back to back: each call waits for the previous tail before it reads `w`.
        for _ in 0..20 {
            f.call(vec![x.clone()]).unwrap();
        }
        assert!(all_equal(&w.get().unwrap(), 26.0));
    }

    #[test]
    fn a_failing_tail_leaves_nan_and_raises_at_the_next_read_and_call() {
        let (w, f, x) = counter("w_fails");
        for _ in 0..3 {
            f.call(vec![x.clone()]).unwrap();
        }
        if !f.last_async.load(Ordering::Relaxed) {
            return; // FERROKERAS_CPU_ASYNC_UPDATES=0: no tail runs after its call
        }
        f.fail_next_tail.store(true, Ordering::Relaxed);
        f.call(vec![x.clone()]).unwrap();
        let e = w.get().unwrap_err().to_string();
        assert!(e.contains("w_fails") && e.contains("NaN"), "{e}");
        let e = f.call(vec![x.clone()]).unwrap_err().to_string();
        assert!(e.contains("w_fails"), "{e}");
        let (host, _, _) = w.snapshot();
        assert!(host.unwrap().to_f64_vec().iter().all(|v| v.is_nan()));
        // Assigning the variable makes it usable again.
        w.set(Value::full(DType::F32, &[N], 10.0)).unwrap();
        f.call(vec![x.clone()]).unwrap();
        assert!(all_equal(&w.get().unwrap(), 11.0));
    }

    #[test]
    fn calls_on_several_threads_lose_no_update() {
        let (w, f, x) = counter("w_threads");
        let f = Arc::new(f);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (f, x) = (f.clone(), x.clone());
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        f.call(vec![x.clone()]).unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert!(all_equal(&w.get().unwrap(), 100.0));
    }
}
