//! A compiled `K.function` as the runtime runs it: the plan, its feeds, outputs and
//! variable updates, the plans specialised to the shapes of the feeds seen, the CPU run
//! state of each (`cpu::PlanState`), the GPU plan cache, the in-place updates
//! (`cpu::InPlace`), the statistics of the last call and the lock that makes a call's
//! variable updates atomic.

use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::{Plan, Step};
use crate::ops::graph::Tensor;
use crate::ops::{Op, VarCell};
use crate::runtime::{cpu, device, gpu, host_results, profile, Out, RunStats};
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
        })
    }

    /// The function, named `name` (in its profile spans).
    pub fn named(mut self, name: &str) -> Function {
        self.name = name.to_string();
        self
    }

    /// Runs the plan. A run that stopped on a variable held by another call's in-place
    /// update (`Error::UpdatingInPlace`: the run was on a rayon worker, where it must not wait) runs
    /// again once no variable is being updated in place; it changed nothing.
    ///
    /// On the CPU, the plan specialised to the feeds' shapes (and the values of its switch
    /// feeds) runs; the first call with new shapes runs the generic plan, the second
    /// records the shapes to specialise it to.
    fn run(&self, feeds: Vec<Value>) -> Result<(Vec<Out>, RunStats)> {
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
                Some(sp) => cpu::run(&sp.plan, &sp.state, feeds.clone(), sp.in_place.as_ref())
                    .map(|v| host_results(v, &sp.plan)),
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
                    r
                }
                None => super::run(
                    &self.plan,
                    feeds.clone(),
                    self.n_outputs,
                    &self.cpu,
                    &self.gpu,
                    self.in_place.as_ref(),
                ),
            };
            match r {
                Err(Error::UpdatingInPlace(_)) => crate::ops::source::wait_for_in_place_updates(),
                r => return r,
            }
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
        }));
    }

    /// Runs the plan on `feeds` (already validated), assigns the updates and returns the
    /// outputs. A call that assigns variables holds the update lock (`with_update_lock`)
    /// from the run to the last assignment.
    pub fn call(&self, feeds: Vec<Value>) -> Result<Vec<Value>> {
        let start = profile::begin();
        let r = if self.updates.is_empty() {
            self.call_unlocked(feeds)
        } else {
            with_update_lock(|| self.call_unlocked(feeds))
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

    fn call_unlocked(&self, feeds: Vec<Value>) -> Result<Vec<Value>> {
        let (mut values, stats) = self.run(feeds)?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
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
                Out::Host(v) => cell.set(v)?,
                Out::Resident(r) => cell.set_resident(Arc::new(r)),
            }
        }
        values
            .into_iter()
            .map(|o| match o {
                Out::Host(v) => Ok(v),
                Out::Resident(r) => r.download(),
            })
            .collect()
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
