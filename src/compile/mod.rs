//! Function -> Plan: the nodes the outputs need in execution order, with fed nodes cut to
//! leaves, constant subgraphs folded once, and the last use of every value recorded so
//! the runtime can release buffers as soon as they are dead.

use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::ops::graph::{topo_order, Tensor};
use crate::ops::{Op, VarCell};
use crate::runtime::{Out, RunStats};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

pub mod fuse;

#[derive(Debug)]
pub enum Step {
    /// Value comes from feed number `usize`.
    Fed(usize),
    /// Computed once at compile time (constants and what only depends on them).
    Folded(Value),
    /// Computed by the node's op from the slots in `inputs`.
    Compute,
}

#[derive(Debug)]
pub struct Plan {
    pub nodes: Vec<Tensor>,
    pub steps: Vec<Step>,
    pub inputs: Vec<Vec<usize>>,
    /// Slots whose last reader is step i; released after it runs.
    pub frees: Vec<Vec<usize>>,
    pub outputs: Vec<usize>,
    /// What the CPU executor runs (fusion groups), built on first use.
    cpu: OnceLock<fuse::Schedule>,
}

impl Plan {
    /// Orders and folds the subgraph `targets` need, treating `feeds` as leaves.
    pub fn new(feeds: &[Tensor], targets: &[Tensor]) -> Result<Plan> {
        let feed_index: HashMap<u64, usize> =
            feeds.iter().enumerate().map(|(i, t)| (t.id(), i)).collect();
        let nodes = topo_order(targets, &|t| feed_index.contains_key(&t.id()));
        let slot: HashMap<u64, usize> =
            nodes.iter().enumerate().map(|(i, t)| (t.id(), i)).collect();
        let mut steps = Vec::with_capacity(nodes.len());
        let mut inputs = Vec::with_capacity(nodes.len());
        let mut foldable = vec![false; nodes.len()];
        // Common subexpressions: a node with the op and inputs of an earlier one is that
        // one (`canon`); nothing reads it, so `assemble` drops it.
        let mut canon: Vec<usize> = (0..nodes.len()).collect();
        let mut seen: HashMap<(String, Vec<usize>), usize> = HashMap::new();
        for (i, t) in nodes.iter().enumerate() {
            if let Some(&f) = feed_index.get(&t.id()) {
                steps.push(Step::Fed(f));
                inputs.push(vec![]);
                continue;
            }
            let ins: Vec<usize> = t.inputs().iter().map(|x| canon[slot[&x.id()]]).collect();
            if let Some(key) = cse_key(t.op()) {
                match seen.entry((key, ins.clone())) {
                    std::collections::hash_map::Entry::Occupied(e) => {
                        canon[i] = *e.get();
                        steps.push(Step::Compute);
                        inputs.push(vec![]);
                        continue;
                    }
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(i);
                    }
                }
            }
            foldable[i] = match t.op() {
                Op::Constant(_) => true,
                op => pure(op) && !ins.is_empty() && ins.iter().all(|&j| foldable[j]),
            };
            steps.push(Step::Compute);
            inputs.push(ins);
        }
        // Fold: evaluate foldable nodes now; a failure is left for run time to report.
        let mut folded: Vec<Option<Value>> = vec![None; nodes.len()];
        for i in 0..nodes.len() {
            if !foldable[i] {
                continue;
            }
            let args: Option<Vec<&Value>> = inputs[i].iter().map(|&j| folded[j].as_ref()).collect();
            if let Some(args) = args {
                if let Ok(v) = nodes[i].op().cpu(&args) {
                    folded[i] = Some(v);
                }
            }
        }
        let outputs: Vec<usize> = targets.iter().map(|t| canon[slot[&t.id()]]).collect();
        Ok(Plan::assemble(nodes, steps, inputs, folded, outputs))
    }

    /// Drops what the outputs do not need (inputs of folded nodes), turns folded nodes
    /// into `Step::Folded` and records the last use of every slot.
    fn assemble(
        nodes: Vec<Tensor>,
        mut steps: Vec<Step>,
        mut inputs: Vec<Vec<usize>>,
        folded: Vec<Option<Value>>,
        outputs: Vec<usize>,
    ) -> Plan {
        // A folded node whose users are all folded needs no slot at run time.
        let mut needed = vec![false; nodes.len()];
        for &o in &outputs {
            needed[o] = true;
        }
        for i in (0..nodes.len()).rev() {
            if needed[i] && folded[i].is_none() {
                for &j in &inputs[i] {
                    needed[j] = true;
                }
            }
        }
        for (i, f) in folded.into_iter().enumerate() {
            if let Some(v) = f {
                if needed[i] {
                    steps[i] = Step::Folded(v);
                }
                inputs[i].clear();
            }
        }
        // Drop steps nothing needs (inputs of folded nodes), keeping order.
        let keep: Vec<usize> = (0..nodes.len()).filter(|&i| needed[i]).collect();
        let remap: HashMap<usize, usize> = keep.iter().enumerate().map(|(n, &o)| (o, n)).collect();
        let mut nodes_k = Vec::with_capacity(keep.len());
        let mut steps_k = Vec::with_capacity(keep.len());
        let mut inputs_k = Vec::with_capacity(keep.len());
        let mut steps_iter: Vec<Option<Step>> = steps.into_iter().map(Some).collect();
        for &o in &keep {
            nodes_k.push(nodes[o].clone());
            steps_k.push(steps_iter[o].take().expect("each step once"));
            inputs_k.push(inputs[o].iter().map(|j| remap[j]).collect::<Vec<_>>());
        }
        let outputs: Vec<usize> = outputs.iter().map(|o| remap[o]).collect();
        let mut last_use: Vec<Option<usize>> = vec![None; keep.len()];
        for (i, ins) in inputs_k.iter().enumerate() {
            for &j in ins {
                last_use[j] = Some(i);
            }
        }
        let mut frees = vec![Vec::new(); keep.len()];
        for (j, lu) in last_use.iter().enumerate() {
            if let Some(i) = lu {
                if !outputs.contains(&j) {
                    frees[*i].push(j);
                }
            }
        }
        Plan {
            nodes: nodes_k,
            steps: steps_k,
            inputs: inputs_k,
            frees,
            outputs,
            cpu: OnceLock::new(),
        }
    }

    /// This plan for one set of runtime shapes, `shapes[i]` the shape of slot `i` in a run
    /// (None where unknown, as inside fused groups): `shape` nodes are folded, and
    /// `sum_to` / `broadcast_to` to the shape their input already has are dropped, so the
    /// elementwise groups on either side can fuse. A loop body runs every step with the
    /// same shapes (`control::run`); in a Keras LSTM's backward body these nodes are 40 of
    /// 90 launches per step. Only valid for feeds of the recorded shapes.
    ///
    /// `values` fixes feeds by value, `(feed index, value)`: what depends on them alone is
    /// folded, and a `select` whose condition folds to one scalar becomes the branch it
    /// takes (`Switches`), as a lazy conditional would run it; only valid for feeds of
    /// these values too.
    pub fn specialize(&self, shapes: &[Option<Vec<usize>>], values: &[(usize, Value)]) -> Plan {
        let n = self.nodes.len();
        let mut alias: Vec<usize> = (0..n).collect();
        let mut folded: Vec<Option<Value>> = vec![None; n];
        let mut sw = Switches {
            zero: vec![false; n],
        };
        let mut steps = Vec::with_capacity(n);
        let mut inputs: Vec<Vec<usize>> = Vec::with_capacity(n);
        // Shapes the run did not record (the values a fused group kept in registers, the
        // tail that updates variables) where the graph knows them whole.
        let shapes: Vec<Option<Vec<usize>>> = (0..n)
            .map(|j| {
                shapes
                    .get(j)
                    .cloned()
                    .flatten()
                    .or_else(|| self.nodes[j].shape().to_known())
            })
            .collect();
        for i in 0..n {
            let ins: Vec<usize> = self.inputs[i].iter().map(|&j| alias[j]).collect();
            let step = match &self.steps[i] {
                Step::Fed(f) => {
                    folded[i] = values.iter().find(|(k, _)| k == f).map(|(_, v)| v.clone());
                    Step::Fed(*f)
                }
                Step::Folded(v) => {
                    folded[i] = Some(v.clone());
                    Step::Compute
                }
                Step::Compute => Step::Compute,
            };
            if matches!(step, Step::Compute) && folded[i].is_none() {
                let known = |j: usize| shapes.get(j).and_then(|s| s.as_ref());
                match self.nodes[i].op() {
                    Op::ShapeOf => {
                        folded[i] = known(ins[0]).map(|s| crate::ops::movement::shape_value(s))
                    }
                    Op::SumTo | Op::BroadcastTo
                        if known(ins[0]).is_some() && known(ins[0]) == known(i) =>
                    {
                        alias[i] = ins[0];
                    }
                    op if pure(op)
                        && !ins.is_empty()
                        && ins.iter().all(|&j| folded[j].is_some()) =>
                    {
                        let args: Vec<&Value> = ins
                            .iter()
                            .map(|&j| folded[j].as_ref().expect("checked"))
                            .collect();
                        folded[i] = op.cpu(&args).ok();
                    }
                    op if !values.is_empty() => {
                        if let Some(to) = sw.node(op, i, &ins, &folded, &known) {
                            alias[i] = to;
                        }
                    }
                    _ => {}
                }
            }
            steps.push(step);
            inputs.push(ins);
        }
        let outputs: Vec<usize> = self.outputs.iter().map(|&o| alias[o]).collect();
        Plan::assemble(self.nodes.clone(), steps, inputs, folded, outputs)
    }

    /// The CPU executor's schedule: elementwise chains fused into groups unless
    /// `FERROKERAS_CPU_FUSION=0` (`base::config`) is set.
    pub fn cpu_schedule(&self) -> &fuse::Schedule {
        self.cpu
            .get_or_init(|| fuse::schedule(self, crate::base::config::settings().cpu_fusion))
    }

    /// Builds the CPU schedule now, fused or not (tests compare the two); no effect once built.
    pub fn init_cpu_schedule(&self, fuse: bool) {
        let _ = self.cpu.get_or_init(|| fuse::schedule(self, fuse));
    }

    /// Number of kernel launches one unfused CPU run performs (sources and folded values excluded).
    /// On a GPU, `Function::last` has the launches of the last call (fused kernels count once).
    pub fn dispatches(&self) -> usize {
        self.steps
            .iter()
            .zip(&self.nodes)
            .filter(|(s, n)| matches!(s, Step::Compute) && !n.inputs().is_empty())
            .count()
    }
}

impl Plan {
    /// Whether every slot's shape is a function of the feeds' shapes, as `specialize`
    /// assumes: no callback makes values of its own shapes, and every shape operand
    /// (of reshape, broadcast_to, sum_to, random, the conv gradients) is computed from
    /// `shape` nodes, constants and the feeds `keyed` says the caller specialises on by
    /// value as well (a loop's captured shape vectors), not from data
    /// (`reshape(x, cast(sum(mask)))`).
    pub fn shapes_follow_feeds(&self, keyed: &dyn Fn(usize) -> bool) -> bool {
        let mut from_shapes = vec![false; self.nodes.len()];
        for i in 0..self.nodes.len() {
            let op = self.nodes[i].op();
            let ins = &self.inputs[i];
            from_shapes[i] = match (&self.steps[i], op) {
                (Step::Fed(f), _) => keyed(*f),
                (Step::Folded(_), _) | (_, Op::ShapeOf) => true,
                (_, op) => pure(op) && !ins.is_empty() && ins.iter().all(|&j| from_shapes[j]),
            };
            let shape_operand = match op {
                Op::HostCall(_) | Op::CtcDecode(_) => return false,
                Op::Reshape | Op::BroadcastTo | Op::SumTo => Some(1),
                Op::Random(_) => Some(0),
                Op::ConvInputGrad(_) | Op::ConvKernelGrad(_) => Some(2),
                _ => None,
            };
            if matches!(self.steps[i], Step::Compute)
                && shape_operand.is_some_and(|k| ins.get(k).is_some_and(|&j| !from_shapes[j]))
            {
                return false;
            }
        }
        true
    }
}

/// `Plan::specialize`'s view of `select`s whose condition is fixed (a Keras learning
/// phase fed as 0 or 1). Keras builds both branches of `K.in_train_phase` (dropout, batch
/// normalisation's batch and moving statistics) and the gradient of a `select` sends
/// `select(c, g, 0)` to one branch and `select(c, 0, g)` to the other, so a fixed
/// condition leaves one branch's work and a gradient of zeros flowing back through the
/// other. A `select` with a fixed scalar condition becomes the branch it takes; a value
/// that is the zero of such a `select` (or follows from one through products, negation,
/// sums and reshapes) is marked `zero`, and an `add` (or `subtract`) of a zero to a value of
/// the result's shape becomes that value, so the untaken branch's gradient is never
/// computed, as under TensorFlow's lazy `cond`. A zero that is read otherwise is computed
/// as before.
struct Switches {
    zero: Vec<bool>,
}

impl Switches {
    /// For node `i` (op `op`, aliased inputs `ins`): the slot it can be replaced by, if
    /// any, noting in `zero` whether it is a zero of an untaken branch.
    fn node<'s>(
        &mut self,
        op: &Op,
        i: usize,
        ins: &[usize],
        folded: &[Option<Value>],
        known: &dyn Fn(usize) -> Option<&'s Vec<usize>>,
    ) -> Option<usize> {
        use crate::ops::{BinaryOp, UnaryOp};
        let same = |j: usize| known(j).is_some() && known(j) == known(i);
        let z = |k: usize| self.zero[ins[k]];
        match op {
            Op::Select => {
                let taken = match folded[ins[0]].as_ref().filter(|c| c.len() == 1) {
                    Some(c) => {
                        if c.to_f64_vec()[0] != 0.0 {
                            ins[1]
                        } else {
                            ins[2]
                        }
                    }
                    None => {
                        self.zero[i] = z(1) && z(2);
                        return None;
                    }
                };
                let zero_value = folded[taken]
                    .as_ref()
                    .is_some_and(|v| v.len() <= 64 && v.to_f64_vec().iter().all(|&x| x == 0.0));
                if zero_value || self.zero[taken] {
                    self.zero[i] = true;
                    return None;
                }
                same(taken).then_some(taken)
            }
            Op::Binary(BinaryOp::Add) if z(0) && z(1) => {
                self.zero[i] = true;
                None
            }
            Op::Binary(BinaryOp::Add) if z(0) && same(ins[1]) => Some(ins[1]),
            Op::Binary(BinaryOp::Add | BinaryOp::Sub) if z(1) && same(ins[0]) => Some(ins[0]),
            Op::Binary(BinaryOp::Mul) | Op::MatMul { .. } if z(0) || z(1) => {
                self.zero[i] = true;
                None
            }
            Op::Binary(BinaryOp::Div)
            | Op::Unary(UnaryOp::Neg)
            | Op::Cast(_)
            | Op::SumTo
            | Op::BroadcastTo
            | Op::Reshape
            | Op::ExpandDims(_)
            | Op::Squeeze(_)
            | Op::Transpose(_)
            | Op::Reduce {
                op: crate::ops::ReduceOp::Sum | crate::ops::ReduceOp::Mean,
                ..
            } if z(0) => {
                self.zero[i] = true;
                None
            }
            _ => None,
        }
    }
}

/// What makes two nodes of the same inputs one value, for common-subexpression
/// elimination: the op itself, for ops whose value follows from their inputs (not feeds,
/// variables, random draws, callbacks or loops; constants are folded instead).
fn cse_key(op: &Op) -> Option<String> {
    (matches!(op, Op::TupleGet(_)) || (pure(op) && !matches!(op, Op::Constant(_))))
        .then(|| format!("{op:?}"))
}

/// Whether a node's value depends on its inputs alone, so it can be computed at compile time.
fn pure(op: &Op) -> bool {
    !matches!(
        op,
        Op::Placeholder(_)
            | Op::Variable(_)
            | Op::Random(_)
            | Op::HostCall(_)
            | Op::CtcDecode(_)
            | Op::Loop(_)
            | Op::TupleGet(_)
    )
}

/// A compiled `K.function`: feeds, outputs and variable updates. Every output and every
/// update value is computed from the values before the call; then the updates are
/// assigned together, so a failed call changes nothing.
pub struct Function {
    pub feeds: Vec<Tensor>,
    pub plan: Plan,
    pub n_outputs: usize,
    pub updates: Vec<Arc<VarCell>>,
    /// Per-plan GPU state (placement, fusion groups, uploaded constants).
    pub gpu: crate::runtime::gpu::PlanCache,
    /// Kernel launches and submits of the last call.
    pub last: std::sync::Mutex<Option<RunStats>>,
    /// The variables a CPU run may overwrite with their new values (`cpu::Lend`); `None`
    /// when an update's shape is known only at run time (its check could then fail after
    /// the overwrite).
    lend: Option<crate::runtime::cpu::Lend>,
    /// Whether every update value has its variable's static shape (see `lending`).
    fixed_updates: bool,
    /// Whether CPU runs use the plan specialised to the feeds' shapes (`Specialised`).
    specialises: bool,
    /// The plans specialised so far, most recently made last.
    specialised: std::sync::Mutex<Vec<Arc<Specialised>>>,
    /// Feed-shape sets seen once (most recent last): a set is specialised to when it comes
    /// again, so calls whose shapes never repeat do not pay for specialising.
    seen: std::sync::Mutex<Vec<Key>>,
    /// The feeds a specialised plan is also keyed on by value (`switch_feeds`).
    switches: Vec<usize>,
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
    lend: Option<crate::runtime::cpu::Lend>,
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
        let lend = lending(&plan, outputs.len(), &cells, fixed_updates);
        let specialises = plan.shapes_follow_feeds(&|_| false) && loops_keep_shapes(&plan);
        let switches = switch_feeds(&plan);
        Ok(Function {
            feeds,
            plan,
            n_outputs: outputs.len(),
            updates: cells,
            gpu: Default::default(),
            last: std::sync::Mutex::new(None),
            lend,
            fixed_updates,
            specialises,
            specialised: Default::default(),
            seen: Default::default(),
            switches,
        })
    }

    /// Runs the plan. A run that stopped on a variable lent to another call's in-place
    /// update (`Error::Lent`: the run was on a rayon worker, where it must not wait) runs
    /// again once no variable is lent; it changed nothing.
    ///
    /// On the CPU, the plan specialised to the feeds' shapes (and the values of its switch
    /// feeds) runs; the first call with new shapes runs the generic plan, the second
    /// records the shapes to specialise it to.
    fn run(&self, feeds: Vec<Value>) -> Result<(Vec<Out>, RunStats)> {
        use crate::runtime::{cpu, device, host_results};
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
                Some(sp) => cpu::run(&sp.plan, feeds.clone(), sp.lend.as_ref())
                    .map(|v| host_results(v, &sp.plan)),
                None if on_cpu && self.seen_before(&key) => {
                    let mut shapes = cpu::SlotShapes::new();
                    let r = cpu::run_shaped(
                        &self.plan,
                        feeds.clone(),
                        self.lend.as_ref(),
                        Some(&mut shapes),
                    )
                    .map(|v| host_results(v, &self.plan));
                    if r.is_ok() {
                        self.remember(key.clone(), &shapes, &feeds);
                    }
                    r
                }
                None => crate::runtime::run(
                    &self.plan,
                    feeds.clone(),
                    self.n_outputs,
                    &self.gpu,
                    self.lend.as_ref(),
                ),
            };
            match r {
                Err(Error::Lent(_)) => crate::ops::source::wait_for_lent_variables(),
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
    fn remember(&self, key: Key, shapes: &crate::runtime::cpu::SlotShapes, feeds: &[Value]) {
        let values: Vec<(usize, Value)> = self
            .switches
            .iter()
            .map(|&f| (f, feeds[f].clone()))
            .collect();
        let plan = self.plan.specialize(shapes, &values);
        let lend = lending(&plan, self.n_outputs, &self.updates, self.fixed_updates);
        let mut cache = self.specialised.lock().unwrap_or_else(|e| e.into_inner());
        if cache.iter().any(|sp| sp.key == key) {
            return;
        }
        if cache.len() >= MAX_SPECIALISED {
            cache.remove(0);
        }
        cache.push(Arc::new(Specialised { key, plan, lend }));
    }

    /// Runs the plan on `feeds` (already validated), assigns the updates and returns the outputs.
    pub fn call(&self, feeds: Vec<Value>) -> Result<Vec<Value>> {
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
                Out::Resident(r) => cell.set_resident(r),
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
        fed[i] = match (&plan.steps[i], plan.nodes[i].op()) {
            (Step::Fed(f), _)
                if plan.nodes[i].rank() == 0
                    && plan.nodes[i].dtype() != crate::base::dtype::DType::I64 =>
            {
                Some(*f)
            }
            (Step::Compute, Op::Cast(_)) => fed[plan.inputs[i][0]],
            _ => None,
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
    plan.nodes.iter().all(|n| match n.op() {
        Op::Loop(body) => {
            let p = body.plan();
            p.shapes_follow_feeds(&|_| false) && loops_keep_shapes(&p)
        }
        _ => true,
    })
}

/// What a run of `plan` may overwrite in place (`cpu::Lend`): the variables assigned
/// `cells` (the updates `n_outputs..` of the plan's outputs), when every update value has
/// the variable's static shape (`fixed`: the call's checks after the run cannot fail),
/// each variable is assigned once and read at one slot (a second read would wait for its
/// own run).
/// `FERROKERAS_CPU_INPLACE=0` (`base::config`) turns this off.
fn lending(
    plan: &Plan,
    n_outputs: usize,
    cells: &[Arc<VarCell>],
    fixed: bool,
) -> Option<crate::runtime::cpu::Lend> {
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
    let mut lend = crate::runtime::cpu::Lend {
        cells: vec![None; n],
        donor: vec![None; n],
        assign: Vec::new(),
    };
    for (k, cell) in cells.iter().enumerate() {
        let reads: Vec<usize> = (0..n)
            .filter(|&i| matches!(plan.nodes[i].op(), Op::Variable(c) if c.id == cell.id))
            .collect();
        match reads.as_slice() {
            [] => {}
            [j] => {
                lend.cells[*j] = Some(cell.clone());
                lend.donor[plan.outputs[n_outputs + k]] = Some(*j);
                lend.assign
                    .push((cell.clone(), plan.outputs[n_outputs + k]));
            }
            _ => return None,
        }
    }
    Some(lend)
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

#[cfg(test)]
mod specialize_tests {
    use super::{Plan, Step};
    use crate::base::dtype::DType;
    use crate::base::shape::Shape;
    use crate::base::value::Value;
    use crate::ops::build::*;
    use crate::ops::source::placeholder;
    use crate::ops::Op;
    use crate::runtime::cpu::{run_recording, SlotShapes};

    fn count(plan: &Plan, pred: impl Fn(&Op) -> bool) -> usize {
        plan.nodes
            .iter()
            .zip(&plan.steps)
            .filter(|(n, s)| matches!(s, Step::Compute) && pred(n.op()))
            .count()
    }

    /// `y = sum_to(x * w, shape(x)) + sum_to(x * w, shape(w))`, `w` of shape `[1, 3]`:
    /// the first `sum_to` is the identity at every batch size, the second only at batch 1.
    #[test]
    fn specialised_plans_match_the_generic_one() {
        let x = placeholder("x", Shape(vec![None, Some(3)]), DType::F32, None).unwrap();
        let w = placeholder("w", Shape(vec![Some(1), Some(3)]), DType::F32, None).unwrap();
        let p = mul(&x, &w).unwrap();
        let a = sum_to(&p, &shape_of(&x).unwrap()).unwrap();
        let b = sum_to(&p, &shape_of(&w).unwrap()).unwrap();
        let plan = Plan::new(&[x.clone(), w.clone()], &[a, b]).unwrap();
        let wv = Value::from_vec(&[1, 3], vec![0.5f32, -2.0, 3.0]).unwrap();
        for batch in [1usize, 4] {
            let xv = Value::from_vec(
                &[batch, 3],
                (0..3 * batch).map(|i| i as f32 - 2.5).collect::<Vec<f32>>(),
            )
            .unwrap();
            let mut shapes = SlotShapes::new();
            let want =
                run_recording(&plan, vec![xv.clone(), wv.clone()], Some(&mut shapes)).unwrap();
            let special = plan.specialize(&shapes, &[]);
            assert_eq!(
                count(&special, |op| matches!(op, Op::ShapeOf)),
                0,
                "shapes are folded"
            );
            let sums = count(&special, |op| matches!(op, Op::SumTo));
            assert_eq!(
                sums,
                if batch == 1 { 0 } else { 1 },
                "only the identity sum_to is dropped (batch {batch})"
            );
            let got = run_recording(&special, vec![xv, wv.clone()], None).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.shape(), w.shape());
                assert_eq!(g.to_f64_vec(), w.to_f64_vec());
            }
        }
    }
}
