//! Function -> Plan: the nodes the outputs need in execution order, with fed nodes cut to
//! leaves, constant subgraphs folded once, and the last use of every value recorded so
//! the runtime can release buffers as soon as they are dead.

use crate::base::error::Result;
use crate::base::progress::{self, Phase};
use crate::base::value::Value;
use crate::ops::control::LoopBody;
use crate::ops::graph::{topo_order, Tensor};
use crate::ops::{BinaryOp, Op, Purity, Zeros};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

pub mod fuse;
pub mod update_rule;

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
    /// The plans of the loop bodies this plan runs, keyed by `body_key`: compiled with
    /// the plan (recursively, for loops inside bodies), with the residuals each body has
    /// then.
    bodies: HashMap<usize, Arc<Plan>>,
    /// What each device kind runs (`fuse::Schedule`, indexed by `fuse::TargetKind`),
    /// built on first use.
    schedules: [OnceLock<fuse::Schedule>; 2],
}

/// A loop body's key in `Plan::bodies`: its address, which the loop node's `Arc` holds fixed.
fn body_key(body: &Arc<LoopBody>) -> usize {
    Arc::as_ptr(body) as usize
}

impl Plan {
    /// Orders and folds the subgraph `targets` need, treating `feeds` as leaves.
    pub fn new(feeds: &[Tensor], targets: &[Tensor]) -> Result<Plan> {
        let _phase = progress::enter(Phase::Optimise);
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
        let mut plan = Plan::assemble(nodes, steps, inputs, folded, outputs);
        for (node, step) in plan.nodes.iter().zip(&plan.steps) {
            if let (Op::Loop(body), Step::Compute) = (node.op(), step) {
                if let std::collections::hash_map::Entry::Vacant(e) =
                    plan.bodies.entry(body_key(body))
                {
                    e.insert(Arc::new(Plan::new(&body.feeds(), &body.targets())?));
                }
            }
        }
        Ok(plan)
    }

    /// The plan of the body of a loop node of this plan: computes `[outputs.., new
    /// states.., residuals..]` from `[step inputs.., states.., captured..]`.
    pub fn body(&self, body: &Arc<LoopBody>) -> &Arc<Plan> {
        &self.bodies[&body_key(body)]
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
            bodies: HashMap::new(),
            schedules: Default::default(),
        }
    }

    /// This plan for one set of runtime shapes, `shapes[i]` the shape of slot `i` in a run
    /// (None where unknown, as inside fused groups): `shape` nodes are folded, and
    /// `sum_to` / `broadcast_to` to the shape their input already has are dropped, so the
    /// elementwise groups on either side can fuse. A loop body runs every step with the
    /// same shapes (`runtime::cpu::loops`); in a Keras LSTM's backward body these nodes are 40 of
    /// 90 launches per step. Only valid for feeds of the recorded shapes.
    ///
    /// `values` fixes feeds by value, `(feed index, value)`: what depends on them alone is
    /// folded, and a `select` whose condition folds to one scalar becomes the branch it
    /// takes (`Switches`), as a lazy conditional would run it; only valid for feeds of
    /// these values too.
    pub fn specialize(&self, shapes: &[Option<Vec<usize>>], values: &[(usize, Value)]) -> Plan {
        let _phase = progress::enter(Phase::Specialise);
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
                let op = self.nodes[i].op();
                if let Op::ShapeOf = op {
                    folded[i] = known(ins[0]).map(|s| crate::ops::movement::shape_value(s));
                } else if matches!(op, Op::SumTo | Op::BroadcastTo)
                    && known(ins[0]).is_some()
                    && known(ins[0]) == known(i)
                {
                    alias[i] = ins[0];
                } else if pure(op) && !ins.is_empty() && ins.iter().all(|&j| folded[j].is_some()) {
                    let args: Vec<&Value> = ins
                        .iter()
                        .map(|&j| folded[j].as_ref().expect("checked"))
                        .collect();
                    folded[i] = op.cpu(&args).ok();
                } else if !values.is_empty() {
                    if let Some(to) = sw.node(op, i, &ins, &folded, &known) {
                        alias[i] = to;
                    }
                }
            }
            steps.push(step);
            inputs.push(ins);
        }
        let outputs: Vec<usize> = self.outputs.iter().map(|&o| alias[o]).collect();
        let mut plan = Plan::assemble(self.nodes.clone(), steps, inputs, folded, outputs);
        plan.bodies = self.bodies.clone();
        plan
    }

    /// The schedule for `target`, built on first use and kept for the target's kind: the
    /// first target of a kind wins (tests build an unfused CPU schedule that way), so a
    /// caller that may pass another checks `Schedule::target`.
    pub fn schedule(&self, target: &fuse::Target) -> &fuse::Schedule {
        self.schedules[target.kind as usize].get_or_init(|| {
            let _phase = progress::enter(Phase::Schedule);
            fuse::schedule(self, target)
        })
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
    /// assumes: no callback makes values of shapes it did not declare, and every shape operand
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
            // A callback whose declared results are fully static cannot change them
            // (`host::run` checks them), as ferrokeras.distributed's gradient average.
            let unknown_results = matches!(op, Op::CtcDecode(_))
                || matches!(op, Op::HostCall(h) if !h.results.iter().all(|(s, _)| s.to_known().is_some()));
            if unknown_results {
                return false;
            }
            if matches!(self.steps[i], Step::Compute)
                && op
                    .shape_operands()
                    .iter()
                    .any(|&k| ins.get(k).is_some_and(|&j| !from_shapes[j]))
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
        let same = |j: usize| known(j).is_some() && known(j) == known(i);
        let z = |k: usize| self.zero[ins[k]];
        match op.zeros() {
            Zeros::Select => {
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
            Zeros::Additive if z(0) && z(1) => {
                self.zero[i] = true;
                None
            }
            // `0 + b`; `0 - b` is not `b`.
            Zeros::Additive if z(0) && same(ins[1]) && matches!(op, Op::Binary(BinaryOp::Add)) => {
                Some(ins[1])
            }
            Zeros::Additive if z(1) && same(ins[0]) => Some(ins[0]),
            Zeros::Any if ins.iter().enumerate().any(|(k, _)| z(k)) => {
                self.zero[i] = true;
                None
            }
            Zeros::First if z(0) => {
                self.zero[i] = true;
                None
            }
            Zeros::Additive | Zeros::Any | Zeros::First | Zeros::Unknown => None,
        }
    }
}

/// What makes two nodes of the same inputs one value, for common-subexpression
/// elimination: the op itself, for pure ops (`Op::purity`); constants are folded instead.
fn cse_key(op: &Op) -> Option<String> {
    (pure(op) && !matches!(op, Op::Constant(_))).then(|| format!("{op:?}"))
}

/// Whether a node's value depends on its inputs alone, so it can be merged with a twin
/// and computed at compile time (`Op::purity`).
fn pure(op: &Op) -> bool {
    op.purity() == Purity::Pure
}
