//! The CPU executor: walks a plan's schedule for the CPU target in order (single nodes, and fused
//! elementwise groups run by `fused`), releasing every intermediate value right after its
//! last reader.

use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::fuse::{Item, Target};
use crate::compile::{Plan, Step};
use crate::ops::source::VarCell;
use crate::ops::{Class, FusedOp, Op};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub mod alloc;
pub mod fused;
pub mod loops;

/// Runs whose previous run took this long or longer (and less than `TEAM_MAX_RUN`) have a
/// helper thread polling (`team`); shorter ones would pay its start (a hand-off to the
/// pool, ~15 us) on every call.
const TEAM_MIN_RUN: std::time::Duration = std::time::Duration::from_millis(1);
const TEAM_MAX_RUN: std::time::Duration = std::time::Duration::from_millis(10);

/// What the CPU executor keeps between runs of one plan (the compiled plan stays as the
/// compiler made it): the programs compiled for each fused group of its schedule, the
/// shapes it reads early, and the wall time of its last run. Its owner keeps it next to
/// the plan and passes it with every run of that plan (`Function`, `loops`); a state
/// serves one plan only.
#[derive(Default)]
pub struct PlanState {
    /// One per schedule item (empty for items that are not groups), made at the first run.
    programs: OnceLock<Box<[fused::Programs]>>,
    /// The `ShapeOf` nodes computed as soon as their input exists (`EarlyShapes`).
    early: OnceLock<EarlyShapes>,
    /// Per schedule item: the later item run at the same time as it (`pairs`).
    pairs: OnceLock<Vec<Option<usize>>>,
    /// Wall time of the last `run`, in nanoseconds (0 before the first): picks whether
    /// the next run keeps a helper thread polling.
    last_run_ns: AtomicU64,
}

impl PlanState {
    /// The programs of each item of `plan`'s schedule.
    pub fn programs(&self, plan: &Plan) -> &[fused::Programs] {
        let items = plan.schedule(&Target::cpu_configured()).items.len();
        let p = self
            .programs
            .get_or_init(|| (0..items).map(|_| Default::default()).collect());
        debug_assert_eq!(p.len(), items, "a PlanState serves one plan");
        p
    }

    fn early(&self, plan: &Plan) -> &EarlyShapes {
        self.early.get_or_init(|| EarlyShapes::new(plan))
    }

    fn pairs(&self, plan: &Plan) -> &[Option<usize>] {
        self.pairs.get_or_init(|| pairs(plan))
    }
}

/// Items that lie between the two items of a pair at most (`pairs`).
const PAIR_GAP: usize = 3;

/// Per schedule item: the later item it runs at the same time as, where it is a
/// convolution's kernel gradient and the next item that is not a constant or a shape is
/// an input gradient (of the same layer, as `fuse::eager` places them) that reads
/// neither the first nor anything made between them. The two read the same output
/// gradient and split their work over the pool independently, so each fills the time the
/// other's threads wait at the end of its parallel loops: the kernel gradient alone
/// scales worst on two threads (ResNet50's, one thread 199 ms a step, two 123 ms).
fn pairs(plan: &Plan) -> Vec<Option<usize>> {
    let sched = plan.schedule(&Target::cpu_configured());
    let items = &sched.items;
    let computed = |i: usize| matches!(plan.steps[i], Step::Compute);
    let mut out = vec![None; items.len()];
    for (t, item) in items.iter().enumerate() {
        let &Item::Node(i) = item else { continue };
        if !computed(i) || !matches!(plan.nodes[i].op(), Op::ConvKernelGrad(_)) {
            continue;
        }
        for (u, next) in items.iter().enumerate().skip(t + 1).take(PAIR_GAP + 1) {
            let &Item::Node(k) = next else { break };
            if plan.inputs[k].contains(&i) {
                break;
            }
            if computed(k) && matches!(plan.nodes[k].op(), Op::ConvInputGrad(_)) {
                out[t] = Some(u);
                break;
            }
            if computed(k) && !matches!(plan.nodes[k].op(), Op::ShapeOf) {
                break;
            }
        }
    }
    out
}

/// `ShapeOf` nodes computed right after the item that makes the value they read, and the
/// values then released at their last other reader instead of at a `ShapeOf` scheduled
/// later. A plan not yet specialised to its feeds' shapes (a Keras training function's
/// first call) reads the shapes of most forward activations in its backward pass, for
/// the sums and broadcasts of the gradients; holding every such activation until then
/// tripled the live memory of a ResNet50 step (1,295 MiB against 381 MiB once the shapes
/// are folded), and the process keeps that high-water mark.
#[derive(Default)]
struct EarlyShapes {
    /// Per schedule item: the `ShapeOf` nodes to compute after it.
    shapes: Vec<Vec<usize>>,
    /// Per schedule item: values to release after it, each with the `ShapeOf` nodes that
    /// must have been computed first.
    frees: Vec<Vec<(usize, Vec<usize>)>>,
    /// Whether node `i` is a `ShapeOf` computed early (its own item then has nothing to do).
    early: Vec<bool>,
}

impl EarlyShapes {
    fn new(plan: &Plan) -> EarlyShapes {
        let sched = plan.schedule(&Target::cpu_configured());
        let n = plan.nodes.len();
        let is_shape = |i: usize| {
            matches!(plan.steps[i], Step::Compute) && matches!(plan.nodes[i].op(), Op::ShapeOf)
        };
        if !(0..n).any(is_shape) {
            return EarlyShapes::default();
        }
        let (mut made, mut last) = (vec![None; n], vec![None; n]);
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (t, item) in sched.items.iter().enumerate() {
            match item {
                Item::Node(i) if is_shape(*i) => {
                    plan.inputs[*i].iter().for_each(|&j| readers[j].push(*i))
                }
                _ => crate::compile::fuse::reads(plan, item)
                    .into_iter()
                    .for_each(|j| last[j] = Some(t)),
            }
            for j in item.writes() {
                made[j].get_or_insert(t);
            }
        }
        let mut freed = vec![None; n];
        for (t, f) in sched.frees.iter().enumerate() {
            f.iter().for_each(|&j| freed[j] = Some(t));
        }
        let items = sched.items.len();
        let mut out = EarlyShapes {
            shapes: vec![Vec::new(); items],
            frees: vec![Vec::new(); items],
            early: vec![false; n],
        };
        for j in 0..n {
            let Some(p) = made[j] else { continue };
            // Only shapes read after the value is made (a `ShapeOf` of a loop-carried or
            // otherwise earlier slot keeps its place).
            let rs: Vec<usize> = readers[j]
                .iter()
                .copied()
                .filter(|&s| made[s].is_some_and(|ts| ts > p))
                .collect();
            if rs.is_empty() {
                continue;
            }
            rs.iter().for_each(|&s| out.early[s] = true);
            out.shapes[p].extend(&rs);
            let after = last[j].map_or(p, |r: usize| r.max(p));
            if freed[j].is_some_and(|f| f > after) && rs.len() == readers[j].len() {
                out.frees[after].push((j, rs));
            }
        }
        out
    }
}

/// Runs `plan` on the CPU, with `state` its run state (`PlanState`).
///
/// A short run (the last run of this plan took 1-10 ms, as a Keras MLP step does)
/// happens on a rayon worker with a second worker polling for work (`team`) for its whole
/// length: its kernels' parallel loops and halves then start without waking a sleeping
/// thread (Keras MLP step 4.2-4.9 -> 3.5-4.4 ms in six interleaved pairs). Longer runs of big kernels, which the pool already splits well,
/// measured slower that way (Keras CNN step 34-36 -> 35-40 ms) and run on the calling
/// thread; so do plans with a Python callback (the calling thread holds the GIL's
/// hand-off).
///
/// With `in_place`, the schedule's infallible tail may write the new values of the variables
/// the call assigns into the variables' own buffers (`InPlace`).
pub fn run(
    plan: &Plan,
    state: &PlanState,
    feeds: Vec<Value>,
    in_place: Option<&InPlace>,
) -> Result<Vec<Value>> {
    run_shaped(plan, state, feeds, in_place, None)
}

/// `run`, also noting in `shapes` the shape of every value put in a slot before the
/// infallible tail (what `Plan::specialize` needs; the tail, which may write variables in
/// place, is not recorded).
pub fn run_shaped(
    plan: &Plan,
    state: &PlanState,
    feeds: Vec<Value>,
    in_place: Option<&InPlace>,
    mut shapes: Option<&mut SlotShapes>,
) -> Result<Vec<Value>> {
    if let Some(s) = shapes.as_deref_mut() {
        *s = vec![None; plan.nodes.len()];
    }
    let sched = plan.schedule(&Target::cpu_configured());
    let last = state.last_run_ns.load(Ordering::Relaxed);
    let short = (TEAM_MIN_RUN.as_nanos() as u64..TEAM_MAX_RUN.as_nanos() as u64).contains(&last);
    let t0 = std::time::Instant::now();
    let all = |r: &mut Run| -> Result<()> {
        match in_place {
            Some(in_place) => {
                r.record(0..sched.tail, None, shapes)?;
                r.run_in_place(sched.tail..sched.items.len(), in_place)
            }
            None => r.record(0..sched.items.len(), None, shapes),
        }
    };
    let mut r = Run::new(plan, state, feeds);
    let done = if short && !sched.has_host {
        on_worker(plan, || crate::base::team::with_team(|| all(&mut r)))
    } else {
        all(&mut r)
    };
    state.last_run_ns.store(
        t0.elapsed().as_nanos().min(u64::MAX as u128) as u64,
        Ordering::Relaxed,
    );
    done.map(|()| r.outputs())
}

/// Runs `f` on a rayon worker, where the parallel loops of the kernels it calls are joins
/// rather than a wake-up and a sleep of the calling thread each; on the calling thread
/// when that is already a worker, or when `plan` has a Python callback (the calling
/// thread is the one that can take the GIL).
fn on_worker<R: Send>(plan: &Plan, f: impl FnOnce() -> R + Send) -> R {
    if plan.schedule(&Target::cpu_configured()).has_host || rayon::current_thread_index().is_some()
    {
        return f();
    }
    rayon::scope(|_| f())
}

/// What a call that assigns variables lets its run overwrite in place (built by
/// `runtime::Function`). A variable read at slot `j` whose last reader is a fused group in
/// the schedule's infallible tail gives that group its buffer for an output, when nothing
/// but the variable and the run holds it (`VarCell::take_for_update`). Nothing after the group can
/// fail, so the run ends by assigning the variables it updates their new values (`Run::run_in_place`).
/// Reads of such a variable on other threads wait for that assignment instead of seeing a
/// half-written buffer; on a rayon worker they stop their run instead (`Error::UpdatingInPlace`, run
/// again by `Function::call`), since a worker waiting in the pool (for a piece of the
/// updating run, say) runs other jobs, so the read may sit on top of the updating run's own
/// stack.
pub struct InPlace {
    /// Per plan slot: the variable read there, if the call assigns it.
    pub cells: Vec<Option<Arc<VarCell>>>,
    /// Per plan slot: for the new value of a variable, the slot where the variable is read
    /// (the buffer it prefers).
    pub variable_slot: Vec<Option<usize>>,
    /// The variables that may be updated in place, with the slots of their new values.
    pub assign: Vec<(Arc<VarCell>, usize)>,
}

/// Shapes of a run's slots by plan index (None for fused groups' inner values).
pub type SlotShapes = Vec<Option<Vec<usize>>>;

/// The shape of fused-group member `m` that was never written to a slot: the broadcast
/// of its data inputs' shapes (noted before it: inputs of the group, or earlier members),
/// or a `broadcast_to`'s target; None for anything else.
fn member_shape(
    plan: &Plan,
    m: usize,
    shapes: &SlotShapes,
    slots: &[Option<Value>],
) -> Option<Vec<usize>> {
    let ins = &plan.inputs[m];
    match plan.nodes[m].op().class() {
        Class::Elementwise(FusedOp::BroadcastTo) => slots[ins[1]]
            .as_ref()
            .map(|v| v.to_f64_vec().iter().map(|&d| d as usize).collect()),
        Class::Elementwise(
            FusedOp::Unary(_) | FusedOp::Binary(_) | FusedOp::Select | FusedOp::Cast(_),
        ) => {
            let mut out: Vec<usize> = Vec::new();
            for &j in ins {
                let sj = shapes[j].as_ref()?;
                out = crate::base::shape::broadcast_runtime("member", &out, sj).ok()?;
            }
            Some(out)
        }
        Class::Source | Class::View(_) | Class::Meta | Class::Kernel | Class::Host => None,
    }
}

/// Runs `plan` here, also noting in `shapes` the shape of every value put in a slot (what
/// `Plan::specialize` needs).
pub fn run_recording(
    plan: &Plan,
    state: &PlanState,
    feeds: Vec<Value>,
    mut shapes: Option<&mut SlotShapes>,
) -> Result<Vec<Value>> {
    if let Some(s) = shapes.as_deref_mut() {
        *s = vec![None; plan.nodes.len()];
    }
    let mut r = Run::new(plan, state, feeds);
    r.record(
        0..plan.schedule(&Target::cpu_configured()).items.len(),
        None,
        shapes,
    )?;
    Ok(r.outputs())
}

/// The values of one run of a plan in progress.
struct Run<'a> {
    plan: &'a Plan,
    state: &'a PlanState,
    feeds: Vec<Value>,
    slots: Vec<Option<Value>>,
    /// Results of multi-result nodes (loops), read by their TupleGet users.
    multi: HashMap<usize, Vec<Value>>,
}

impl<'a> Run<'a> {
    fn new(plan: &'a Plan, state: &'a PlanState, feeds: Vec<Value>) -> Self {
        Run {
            plan,
            state,
            feeds,
            slots: vec![None; plan.nodes.len()],
            multi: HashMap::new(),
        }
    }

    /// Runs schedule items `range`; groups may overwrite the variables `in_place` names.
    fn items(&mut self, range: std::ops::Range<usize>, in_place: Option<&InPlace>) -> Result<()> {
        self.record(range, in_place, None)
    }

    fn record(
        &mut self,
        range: std::ops::Range<usize>,
        in_place: Option<&InPlace>,
        mut shapes: Option<&mut SlotShapes>,
    ) -> Result<()> {
        let Run {
            plan,
            state,
            feeds,
            slots,
            multi,
        } = self;
        let sched = plan.schedule(&Target::cpu_configured());
        let programs = state.programs(plan);
        let early = state.early(plan);
        // Pairs run together where nothing records per item (`pairs`).
        let pairs = (shapes.is_none() && !super::profile::on()).then(|| state.pairs(plan));
        // Items up to this one were computed with an earlier item's pair.
        let mut ahead = None;
        for t in range {
            let item = &sched.items[t];
            let prof = super::profile::cpu_item_start(plan, item, slots);
            if let Some(u) = pairs
                .and_then(|p| p[t])
                .filter(|_| pays(plan, &sched.items[t], slots))
            {
                run_pair(plan, &sched.items[t..=u], feeds, slots, multi)?;
                ahead = Some(u);
            }
            match item {
                _ if ahead.is_some_and(|a| t <= a) => {}
                // Computed after the item that made its input.
                Item::Node(i) if early.early.get(*i) == Some(&true) && slots[*i].is_some() => {}
                Item::Node(i) => {
                    let i = *i;
                    let v = if let (Op::HostCall(h), Step::Compute) =
                        (plan.nodes[i].op(), &plan.steps[i])
                    {
                        run_host(plan, i, h, &sched.frees[t], slots, multi)?
                    } else {
                        step(plan, i, feeds, slots, multi)?
                    };
                    slots[i] = Some(v);
                }
                &Item::MatAcc { mm, add, acc } => {
                    let v = mat_acc(
                        plan,
                        (mm, add, acc),
                        sched.frees[t].contains(&acc),
                        slots,
                        multi,
                    )?;
                    slots[add] = Some(v);
                }
                Item::Group(_) | Item::Update(_) => {
                    let g = item.group().expect("a group item");
                    match fused::run(plan, g, &programs[t], item.update(), slots, in_place)? {
                        Some(vals) => {
                            for (o, v) in g.returned().zip(vals) {
                                slots[o] = Some(v);
                            }
                        }
                        // Outputs of different shapes: run the members one by one.
                        None => {
                            for m in g.after_first() {
                                let v = step(plan, m, feeds, slots, multi)?;
                                slots[m] = Some(v);
                            }
                        }
                    }
                }
            }
            if let Some((start, ins)) = prof {
                super::profile::cpu_item(start, plan, t, &ins, slots);
            }
            if let Some(s) = shapes.as_deref_mut() {
                let set: Vec<usize> = match item {
                    Item::Node(i) => vec![*i],
                    Item::MatAcc { add, .. } => vec![*add],
                    Item::Group(_) | Item::Update(_) => {
                        let g = item.group().expect("a group item");
                        g.after_first().collect()
                    }
                };
                for j in set {
                    s[j] = match &slots[j] {
                        Some(v) => Some(v.shape().to_vec()),
                        // A member the fused kernel kept in registers.
                        None => member_shape(plan, j, s, slots),
                    };
                }
            }
            if !early.shapes.is_empty() {
                for &sh in &early.shapes[t] {
                    if slots[plan.inputs[sh][0]].is_some() {
                        let v = step(plan, sh, feeds, slots, multi)?;
                        if let Some(s) = shapes.as_deref_mut() {
                            s[sh] = Some(v.shape().to_vec());
                        }
                        slots[sh] = Some(v);
                    }
                }
                for (j, rs) in &early.frees[t] {
                    if rs.iter().all(|&s| slots[s].is_some()) {
                        slots[*j] = None;
                        multi.remove(j);
                    }
                }
            }
            for &j in &sched.frees[t] {
                slots[j] = None;
                multi.remove(&j);
            }
        }
        Ok(())
    }

    /// Runs the infallible tail `range` with `in_place`, then assigns the variables it updates
    /// their new values. If the tail fails all the same (or panics), their updates are
    /// abandoned (`VarCell::abandon_update`) before this returns: none stays held.
    fn run_in_place(&mut self, range: std::ops::Range<usize>, in_place: &InPlace) -> Result<()> {
        struct AbandonOnDrop<'a>(&'a InPlace);
        impl Drop for AbandonOnDrop<'_> {
            fn drop(&mut self) {
                self.0.assign.iter().for_each(|(cell, _)| {
                    cell.abandon_update();
                });
            }
        }
        let guard = AbandonOnDrop(in_place);
        if let Err(e) = self.items(range, Some(in_place)) {
            let lost: Vec<&str> = in_place
                .assign
                .iter()
                .filter(|(c, _)| c.abandon_update())
                .map(|(c, _)| c.name.as_str())
                .collect();
            if lost.is_empty() {
                return Err(e);
            }
            return Err(Error::Runtime(format!(
                "{e}; internal: variables {lost:?} were being updated in place and are now NaN"
            )));
        }
        for (cell, slot) in &in_place.assign {
            if cell.is_updating() {
                cell.set(self.slots[*slot].clone().expect("update values are kept"))?;
            }
        }
        drop(guard);
        Ok(())
    }

    fn outputs(self) -> Vec<Value> {
        self.plan
            .outputs
            .iter()
            .map(|&o| self.slots[o].clone().expect("outputs are kept"))
            .collect()
    }
}

/// Multiply-adds of a kernel gradient from which it runs on its own rather than in a pair
/// (`pays`).
const PAIR_MAX_MACS: usize = 1 << 29;

/// Whether the kernel gradient `item` starts a pair with these inputs: where it is
/// small enough that its own split leaves threads waiting. ResNet50's (batch 8, at most
/// 310 M multiply-adds each) gain, its training step 0.427 -> 0.398 s on two threads; the
/// Keras CNN's (batch 64, 679 M) ran 3-5% slower paired, each kernel's tasks evicting
/// the other's blocks from the cache.
fn pays(plan: &Plan, item: &Item, slots: &[Option<Value>]) -> bool {
    let &Item::Node(i) = item else { return false };
    let ins = &plan.inputs[i];
    let (Some(gy), Some(ws)) = (&slots[ins[1]], &slots[ins[2]]) else {
        return false;
    };
    // The kernel's shape [kh, kw, cin / groups, cout]: each output-gradient element meets
    // kh * kw * cin / groups of its taps.
    let w = ws.to_i64_vec();
    let taps = w[..w.len().saturating_sub(1)]
        .iter()
        .product::<i64>()
        .max(0) as usize;
    gy.shape().iter().product::<usize>().saturating_mul(taps) < PAIR_MAX_MACS
}

/// Runs the pair of nodes that `items` starts and ends with at the same time, after the
/// constants and shapes between them (`pairs`), leaving every value in `slots`.
fn run_pair(
    plan: &Plan,
    items: &[Item],
    feeds: &mut [Value],
    slots: &mut [Option<Value>],
    multi: &mut HashMap<usize, Vec<Value>>,
) -> Result<()> {
    let node = |item: &Item| match item {
        &Item::Node(i) => i,
        _ => unreachable!("a pair holds nodes"),
    };
    let (first, last) = (node(&items[0]), node(&items[items.len() - 1]));
    for item in &items[1..items.len() - 1] {
        let h = node(item);
        if slots[h].is_none() {
            slots[h] = Some(step(plan, h, feeds, slots, multi)?);
        }
    }
    let run = |i: usize| plan.nodes[i].op().cpu(&args(plan, i, slots));
    let (a, b) = rayon::join(|| run(first), || run(last));
    slots[first] = Some(a?);
    slots[last] = Some(b?);
    Ok(())
}

/// Runs `Item::MatAcc`: `acc + mm` with the product added into a buffer holding `acc` (its
/// own when it dies here, `dies`, and nothing else holds it; else a copy). Where
/// `matmul::accumulable` says no (runtime shapes, layouts), the product and the add run as
/// plain nodes.
fn mat_acc(
    plan: &Plan,
    (mm, add, acc): (usize, usize, usize),
    dies: bool,
    slots: &mut [Option<Value>],
    multi: &mut HashMap<usize, Vec<Value>>,
) -> Result<Value> {
    let Op::MatMul { ta, tb } = *plan.nodes[mm].op() else {
        unreachable!("MatAcc holds a matmul")
    };
    let (a, b) = (plan.inputs[mm][0], plan.inputs[mm][1]);
    let (av, bv) = (
        slots[a].clone().expect("computed"),
        slots[b].clone().expect("computed"),
    );
    let accv = slots[acc].as_ref().expect("computed");
    if let Some(dims) = crate::ops::matmul::accumulable(ta, tb, &av, &bv, accv) {
        // The operands were cloned above, so a buffer shared with them is not unique.
        let held = if dies && acc != a && acc != b {
            slots[acc].take()
        } else {
            None
        };
        let mut buf = match held {
            Some(Value::F32(x)) => x.try_into_owned_nocopy().unwrap_or_else(|x| x.to_owned()),
            _ => match &slots[acc] {
                Some(Value::F32(x)) => x.to_owned(),
                _ => unreachable!("accumulable checked f32"),
            },
        };
        crate::ops::matmul::accumulate(ta, &av, &bv, &mut buf, dims);
        return Ok(Value::F32(buf.into_shared()));
    }
    let product = run_node(plan, mm, &[&av, &bv], multi)?;
    let args: Vec<&Value> = plan.inputs[add]
        .iter()
        .map(|&j| {
            if j == mm {
                &product
            } else {
                slots[acc].as_ref().expect("computed")
            }
        })
        .collect();
    plan.nodes[add].op().cpu(&args)
}

/// Runs host callback node `i`, moving into it the inputs that die at its item (`dying`):
/// a value that nothing else holds then reaches the callback as its own, to write in place
/// or hand back without a copy (`HostFn::call`).
fn run_host(
    plan: &Plan,
    i: usize,
    h: &crate::ops::host::HostCall,
    dying: &[usize],
    slots: &mut [Option<Value>],
    multi: &mut HashMap<usize, Vec<Value>>,
) -> Result<Value> {
    let ins = &plan.inputs[i];
    let args = ins
        .iter()
        .enumerate()
        .map(|(k, &j)| {
            let last = dying.contains(&j) && !ins[k + 1..].contains(&j);
            let v = if last {
                slots[j].take()
            } else {
                slots[j].clone()
            };
            v.expect("inputs are computed before their users")
        })
        .collect();
    multi.insert(i, crate::ops::host::run(h, args)?);
    Ok(Value::scalar_f64(plan.nodes[i].dtype(), 0.0))
}

fn step(
    plan: &Plan,
    i: usize,
    feeds: &mut [Value],
    slots: &[Option<Value>],
    multi: &mut HashMap<usize, Vec<Value>>,
) -> Result<Value> {
    let node = &plan.nodes[i];
    Ok(match &plan.steps[i] {
        Step::Fed(f) => std::mem::replace(&mut feeds[*f], Value::scalar_f64(node.dtype(), 0.0)),
        Step::Folded(v) => v.clone(),
        Step::Compute => run_node(plan, i, &args(plan, i, slots), multi)?,
    })
}

/// The values of node `i`'s inputs, each computed before it.
fn args<'s>(plan: &Plan, i: usize, slots: &'s [Option<Value>]) -> Vec<&'s Value> {
    plan.inputs[i]
        .iter()
        .map(|&j| {
            slots[j]
                .as_ref()
                .expect("inputs are computed before their users")
        })
        .collect()
}

/// Runs compute node `i` of `plan` on host values. Multi-result nodes (loops, host
/// callbacks, CTC decoding) keep their results in `multi`, where their `TupleGet` users find them; the
/// GPU executor uses this too for the nodes it runs on the CPU.
pub fn run_node(
    plan: &Plan,
    i: usize,
    args: &[&Value],
    multi: &mut HashMap<usize, Vec<Value>>,
) -> Result<Value> {
    let node = &plan.nodes[i];
    match node.op() {
        Op::Loop(body) => {
            // A loop runs hundreds of small kernels per call: always worth a worker
            // (Keras LSTM step: 1.26x, docs/performance.md), with a second one polling
            // for halves of them (`team`).
            let read = results_read(plan, i, body.n_results());
            let body_plan = plan.body(body);
            let results = on_worker(body_plan, || {
                crate::base::team::with_team(|| {
                    loops::run(body, body_plan, args, &read, &run_recording)
                })
            })?;
            multi.insert(i, results);
            Ok(Value::scalar_f64(node.dtype(), 0.0))
        }
        Op::HostCall(h) => {
            let args = args.iter().map(|&v| v.clone()).collect();
            multi.insert(i, crate::ops::host::run(h, args)?);
            Ok(Value::scalar_f64(node.dtype(), 0.0))
        }
        Op::CtcDecode(d) => {
            multi.insert(i, crate::ops::ctc::run_decode(*d, args)?);
            Ok(Value::scalar_f64(node.dtype(), 0.0))
        }
        Op::TupleGet(k) => {
            let src = plan.inputs[i][0];
            multi
                .get(&src)
                .and_then(|r| r.get(*k))
                .cloned()
                .ok_or_else(|| {
                    Error::Runtime(format!(
                        "result {k} of a multi-result node was not computed"
                    ))
                })
        }
        op => op.cpu(args),
    }
}

/// Which results of multi-result node `i` some `TupleGet` of `plan` reads.
pub(crate) fn results_read(plan: &Plan, i: usize, n: usize) -> Vec<bool> {
    let mut read = vec![false; n];
    for (node, ins) in plan.nodes.iter().zip(&plan.inputs) {
        if let (Op::TupleGet(k), [src]) = (node.op(), ins.as_slice()) {
            if *src == i && *k < n {
                read[*k] = true;
            }
        }
    }
    read
}

#[cfg(test)]
mod fusion_tests;
#[cfg(test)]
mod pair_tests;
#[cfg(test)]
mod specialize_tests;
