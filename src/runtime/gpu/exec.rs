//! The GPU executor. Per plan (and device) a `Placement` is computed once: where each node
//! runs (`Place`), and the plan's schedule for the device's fusion target
//! (`compile::fuse`, built by the same algorithm as the CPU's): which elementwise nodes
//! fuse into which generated kernel, and when each slot dies. Per call, the schedule's
//! items are walked in order: kernels are *recorded*, not run; views alias buffers; CPU
//! nodes download what they read (the only reason for a submit before the end); a loop
//! whose body runs on the device records its body's schedule once per step (`loops`), its
//! step rows and the rows its kernels write bound as windows of the loop's buffers
//! (`Exec::dests`); at the end one submit runs everything and one mapped staging buffer
//! brings back all outputs.
//! Update values stay on the device.

use super::params::{Indexed, Params};
use super::pipelines::{dtag, Pipe};
use super::pool::{self, DevBuf};
use super::{fusion, kernels, loops, transfer, Context, DTensor, Resident};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::fuse::{self, Item, Schedule, Target};
use crate::compile::{Plan, Step};
use crate::ops::graph::Tensor;
use crate::ops::{movement, Class, Op, ViewOp};
use crate::runtime::{profile, Out, RunStats};
use std::cell::RefCell;
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Feeds, folded constants, placeholders, variables.
    Source,
    /// CPU kernel inside the GPU plan.
    Host,
    /// A WGSL kernel (fused or hand-written).
    Gpu,
    /// Aliases its input's buffer.
    View,
    /// Computed from the input's shape.
    Meta,
    /// Shape arithmetic: a small int vector that only feeds target shapes
    /// (`fuse::shape_like`), computed by its CPU kernel from host values alone (shapes,
    /// feeds, constants), so it causes no transfer.
    Shape,
}

/// Where each node of a plan runs on one device, and the device's schedule of the plan.
pub(crate) struct Placement {
    /// The placements of the plan's loop bodies (`Plan::body`), keyed by the body plan's
    /// address (the plan holds it fixed).
    pub bodies: HashMap<usize, Placement>,
    ctx_id: u64,
    pub place: Vec<Place>,
    /// The device's fusion target (`gpu_target`).
    target: Target,
    /// The schedule for `target` when the plan keeps one built for another GPU target
    /// (`Plan::schedule` keeps one per device kind); else the plan's.
    own: Option<Schedule>,
    /// Folded constants already uploaded.
    consts: Mutex<HashMap<usize, DTensor>>,
    /// Generated pipelines per (members, input modes).
    pub fused: Mutex<HashMap<FusedKey, Arc<Pipe>>>,
    /// Per node: whether its result may stay lazy (`Lazy`): a slice or slice gradient on
    /// the device, of one word per element, not an output of the plan, whose every
    /// reader is an elementwise node on the device (a generated kernel).
    pub lazy: Vec<bool>,
    /// The pieces of concatenations that the generated kernel computing them writes
    /// into the concatenations' buffers (`fusion::operands_placed`): per node, each
    /// concatenation and its place among the inputs. A piece is an elementwise node on
    /// the device, of one word per element, read by concatenations alone (each once) and
    /// not an output of the plan; every input of such a concatenation has a length along
    /// its axis that the graph knows.
    pub pieces: HashMap<usize, Vec<(usize, usize)>>,
    /// The plans of a loop body specialised to its step shapes (`loops`), by key.
    pub special: Mutex<Vec<(SpecialKey, Arc<Special>)>>,
}

/// The key of a specialised loop body (`loops::special_key`): feed shapes and the shape
/// vectors fed by value.
pub(crate) type SpecialKey = Vec<Vec<usize>>;

/// A loop body's plan specialised to the shapes of its steps (`Plan::specialize`, as
/// `cpu::loops` does), with its placement.
pub(crate) struct Special {
    pub plan: Plan,
    pub lay: Placement,
}

/// A generated pipeline's key: the kernel's members and its inputs' modes.
pub type FusedKey = (Vec<usize>, Vec<u32>);

impl Placement {
    /// The schedule the executor lowers.
    pub fn schedule<'p>(&'p self, plan: &'p Plan) -> &'p Schedule {
        self.own
            .as_ref()
            .unwrap_or_else(|| plan.schedule(&self.target))
    }
}

/// A `Function`'s GPU state, rebuilt when the device changes.
#[derive(Default)]
pub struct PlanCache {
    placement: Mutex<Option<Arc<Placement>>>,
}

#[derive(Clone)]
pub(crate) struct Slot {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub host: Option<Value>,
    pub dev: Option<DTensor>,
    /// A value no kernel wrote (`dev` empty until one must, `Exec::dev`): elements of
    /// another tensor that the generated kernels read in place (`fusion`).
    pub lazy: Option<Lazy>,
}

/// A value that generated kernels read from another tensor's buffer, through the
/// strides of their operands (`fusion::Mode::Bcast`, `fusion::Mode::Pad`), so that no
/// kernel copies it: a slice that is not one run of elements (a gate's columns of a
/// recurrent cell's fused product), or a slice's gradient. Only values whose every
/// reader is a generated kernel are lazy (`Placement::lazy`); `Exec::dev` writes one
/// out where another kernel needs it after all.
#[derive(Clone)]
pub(crate) enum Lazy {
    /// Element `c` (C order over the slot's shape) is element
    /// `offset + sum_d c_d * strides[d]` of `base` (one word per element).
    Slice {
        base: DTensor,
        offset: usize,
        strides: Vec<usize>,
    },
    /// Zeros, but the block `starts[d] .. starts[d] + g.shape[d]` of each axis `d`,
    /// which is `g` (a slice's gradient).
    Pad { g: DTensor, starts: Vec<usize> },
}

impl Slot {
    pub fn host(v: Value) -> Slot {
        Slot {
            shape: v.shape().to_vec(),
            dtype: v.dtype(),
            host: Some(v),
            dev: None,
            lazy: None,
        }
    }
    pub fn dev(d: DTensor) -> Slot {
        Slot {
            shape: d.shape.clone(),
            dtype: d.dtype,
            host: None,
            dev: Some(d),
            lazy: None,
        }
    }
}

/// One binding of a dispatch: (binding, buffer, byte offset, bytes bound).
type Binding = (u32, Arc<DevBuf>, u64, u64);

pub(crate) struct Cmd {
    pipe: Arc<Pipe>,
    bufs: Vec<Binding>,
    /// The words of the kernel's parameter block (`params::Params`), bound at binding 0.
    params: Vec<u32>,
    groups: [u32; 3],
}

pub(crate) struct Exec<'a> {
    pub ctx: &'a Arc<Context>,
    pub plan: &'a Plan,
    pub lay: &'a Placement,
    pub slots: Vec<Option<Slot>>,
    cmds: Vec<Cmd>,
    status: Option<Arc<DevBuf>>,
    /// Error messages of kernels that report out-of-range indices, by tag.
    status_msgs: HashMap<u32, String>,
    /// Variable versions read this call, for attaching uploaded copies.
    var_versions: HashMap<usize, u64>,
    /// Results of multi-result nodes (loops), read by their `TupleGet` users.
    multi: HashMap<usize, Vec<Value>>,
    /// Results of loops recorded on the device (`loops`), read by their `TupleGet` users;
    /// `None` for a result nothing reads.
    pub(crate) loop_results: HashMap<usize, Vec<Option<Slot>>>,
    /// Rows of a loop's stacked results that node results are written into in place
    /// (`loops`), by node: set on the executor of a loop body for one step.
    pub(crate) dests: RefCell<HashMap<usize, Dest>>,
    /// The rows of `dests` handed out by `alloc` while lowering the current schedule
    /// item: the item's kernels write them (`dispatch`).
    writing: RefCell<Vec<DTensor>>,
    /// The rows of `writing` a kernel also read another part of the buffer of (a copy
    /// was made, `bindings`), for the loop to place that node elsewhere.
    pub(crate) clashes: RefCell<Vec<DTensor>>,
    /// Whether `run_items` lists each item's dispatches on stderr (the first step of a
    /// loop body under `FERROKERAS_LOOP_DEBUG`), and the entry points recorded so far.
    pub(crate) trace: Option<Vec<String>>,
    /// The shape of each slot that held a value, recorded for `Plan::specialize` where
    /// set (the first step of a loop body, `loops`).
    pub(crate) shapes: RefCell<Option<Vec<Option<Vec<usize>>>>>,
    /// The buffers of concatenations whose pieces kernels wrote in place, by node
    /// (`fusion::operands_placed`), with which of its inputs they wrote, until the
    /// concatenation is lowered.
    pub(crate) pieces: RefCell<HashMap<usize, (DTensor, Vec<bool>)>>,
    pub stats: RunStats,
}

/// Where a loop body writes one of its results in place: row `t` of a stacked result
/// of `rows` rows (`loops::Stacked`), allocated by the first `alloc` that takes the row
/// if the loop has not allocated it yet.
pub(crate) struct Dest {
    pub stack: Option<DTensor>,
    pub rows: usize,
    pub t: usize,
    /// The row, once `alloc` handed it out.
    pub given: Option<DTensor>,
}

/// Whether node `t` runs on the device: its data dtypes stored there (int64 by the
/// generated kernels only, as pairs of words, and as the indices arg-reductions write) and
/// its op lowered for them, int64 only where computed exactly (`Op::exact_int64`).
fn gpu_supports(t: &Tensor) -> bool {
    let op = t.op();
    let hargs = op.shape_operands();
    let data: Vec<DType> = t
        .inputs()
        .iter()
        .enumerate()
        .filter(|(p, _)| !hargs.contains(p))
        .map(|(_, x)| x.dtype())
        .collect();
    let generated = matches!(op.class(), Class::Elementwise(_));
    let stored = |d: DType| dtag(d).is_some() || (d == DType::I64 && generated);
    let int64 = t.dtype() == DType::I64 || data.contains(&DType::I64);
    let out_ok = stored(t.dtype()) || matches!(op, Op::Arg { .. });
    data.iter().all(|&d| stored(d))
        && out_ok
        && kernels::supports(t)
        && (!int64 || op.exact_int64())
}

/// The fusion target of `ctx`'s generated kernels: the dtypes WGSL stores, and the
/// storage buffers a kernel may bind besides its parameter block.
pub(crate) fn gpu_target(ctx: &Context) -> Target {
    const STORABLE: &[DType] = &[
        DType::F32,
        DType::F16,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::Bool,
        DType::I64,
    ];
    let buffers = ctx.limits.max_storage_buffers_per_shader_stage as usize;
    Target::gpu(STORABLE, buffers.saturating_sub(1))
}

/// Places every node of `plan` on `ctx` and takes the plan's schedule for its target. A
/// loop whose body runs on the device as a whole (`loops::on_device`) is `Place::Gpu`,
/// and so are the `TupleGet`s reading it.
pub(crate) fn build_placement(ctx: &Context, plan: &Plan, target: Target) -> Placement {
    let n = plan.nodes.len();
    // Small int vectors that only feed target shapes stay on the host: shape arithmetic
    // where they read host values only, else host nodes.
    let shape_like = fuse::shape_like(plan);
    // Loops whose bodies run on the device as a whole, decided first: what reads their
    // results then knows whether those are on the host.
    let mut bodies = HashMap::new();
    let mut loop_on_gpu = vec![false; n];
    for i in 0..n {
        if let (Op::Loop(body), Step::Compute) = (plan.nodes[i].op(), &plan.steps[i]) {
            let body_plan = plan.body(body);
            let key = Arc::as_ptr(body_plan) as usize;
            let lay = build_placement(ctx, body_plan, gpu_target(ctx));
            loop_on_gpu[i] =
                crate::base::config::settings().gpu_loops && loops::on_device(body_plan, &lay);
            bodies.insert(key, lay);
        }
    }
    let mut place: Vec<Place> = Vec::with_capacity(n);
    // Whether slot i's value is always on the host (never only on the device).
    let mut on_host: Vec<bool> = Vec::with_capacity(n);
    for i in 0..n {
        let (p, h) = match plan.steps[i] {
            Step::Fed(_) | Step::Folded(_) => (Place::Source, true),
            Step::Compute => match plan.nodes[i].op().class() {
                Class::Source => (
                    Place::Source,
                    !matches!(plan.nodes[i].op(), Op::Variable(_)),
                ),
                Class::Meta => (Place::Meta, true),
                Class::View(_) => (Place::View, on_host[plan.inputs[i][0]]),
                Class::Host if loop_on_gpu[i] => (Place::Gpu, false),
                Class::Host
                    if matches!(plan.nodes[i].op(), Op::TupleGet(_))
                        && loop_on_gpu[plan.inputs[i][0]] =>
                {
                    (Place::Gpu, false)
                }
                Class::Host => (Place::Host, true),
                Class::Elementwise(_) | Class::Kernel if shape_like[i] => {
                    if plan.inputs[i].iter().all(|&j| on_host[j]) {
                        (Place::Shape, true)
                    } else {
                        (Place::Host, true)
                    }
                }
                Class::Elementwise(_) | Class::Kernel => {
                    if gpu_supports(&plan.nodes[i]) {
                        (Place::Gpu, false)
                    } else {
                        (Place::Host, true)
                    }
                }
            },
        };
        place.push(p);
        on_host.push(h);
    }
    let own = (plan.schedule(&target).target != target).then(|| fuse::schedule(plan, &target));
    let lazy = lazy_nodes(plan, &place);
    let pieces = concat_pieces(plan, &place);
    Placement {
        bodies,
        ctx_id: ctx.id,
        place,
        target,
        own,
        consts: Mutex::new(HashMap::new()),
        fused: Mutex::new(HashMap::new()),
        lazy,
        pieces,
        special: Mutex::new(Vec::new()),
    }
}

/// The pieces of concatenations (`Placement::pieces`).
fn concat_pieces(plan: &Plan, place: &[Place]) -> HashMap<usize, Vec<(usize, usize)>> {
    let n = plan.nodes.len();
    let mut reads = vec![0usize; n];
    for ins in &plan.inputs {
        for &j in ins {
            reads[j] += 1;
        }
    }
    let one_word = |j: usize| transfer::words_per(plan.nodes[j].dtype()) == 1;
    let mut pieces: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
    for c in 0..n {
        let Op::Concat(axis) = plan.nodes[c].op() else {
            continue;
        };
        let ins = &plan.inputs[c];
        let known = ins.iter().all(|&j| {
            plan.nodes[j]
                .shape()
                .dims()
                .get(*axis)
                .is_some_and(Option::is_some)
        });
        if !matches!(plan.steps[c], Step::Compute)
            || place[c] != Place::Gpu
            || !one_word(c)
            || !known
        {
            continue;
        }
        for (k, &j) in ins.iter().enumerate() {
            let piece = matches!(plan.steps[j], Step::Compute)
                && place[j] == Place::Gpu
                && matches!(plan.nodes[j].op().class(), Class::Elementwise(_))
                && one_word(j)
                && !plan.outputs.contains(&j);
            if piece {
                pieces.entry(j).or_default().push((c, k));
            }
        }
    }
    // Only nodes nothing but such concatenations reads, each once.
    pieces.retain(|&j, at| {
        let mut cs: Vec<usize> = at.iter().map(|&(c, _)| c).collect();
        cs.dedup();
        reads[j] == at.len() && cs.len() == at.len()
    });
    pieces
}

/// The nodes whose results may stay lazy (`Placement::lazy`).
fn lazy_nodes(plan: &Plan, place: &[Place]) -> Vec<bool> {
    let n = plan.nodes.len();
    let mut ok: Vec<bool> = (0..n)
        .map(|i| {
            matches!(plan.nodes[i].op(), Op::Slice(_) | Op::SliceGrad(_))
                && matches!(plan.steps[i], Step::Compute)
                && place[i] == Place::Gpu
                && transfer::words_per(plan.nodes[i].dtype()) == 1
                && !plan.outputs.contains(&i)
        })
        .collect();
    let mut read = vec![false; n];
    for u in 0..n {
        let data = !matches!(plan.steps[u], Step::Compute)
            || place[u] != Place::Gpu
            || !matches!(plan.nodes[u].op().class(), Class::Elementwise(_));
        let hargs = plan.nodes[u].op().shape_operands();
        for (p, &j) in plan.inputs[u].iter().enumerate() {
            read[j] = true;
            if data || hargs.contains(&p) {
                ok[j] = false;
            }
        }
    }
    ok.iter().zip(&read).map(|(&o, &r)| o && r).collect()
}

/// Runs `plan` on `ctx`. Results `..n_host` come back as host values, the rest may stay
/// resident.
pub fn run(
    ctx: &Arc<Context>,
    plan: &Plan,
    feeds: Vec<Value>,
    n_host: usize,
    cache: &PlanCache,
) -> Result<(Vec<Out>, RunStats)> {
    let lay = {
        let mut l = cache.placement.lock().unwrap_or_else(|e| e.into_inner());
        match l.as_ref() {
            Some(x) if x.ctx_id == ctx.id => x.clone(),
            _ => {
                let x = Arc::new(build_placement(ctx, plan, gpu_target(ctx)));
                *l = Some(x.clone());
                x
            }
        }
    };
    ctx.check("an earlier call")?;
    let mut ex = Exec::new(ctx, plan, &lay);
    let mut feeds: Vec<Option<Slot>> = feeds.into_iter().map(|v| Some(Slot::host(v))).collect();
    ex.run_items(&mut feeds)?;
    let mut need: Vec<usize> = plan.outputs[..n_host].to_vec();
    need.sort_unstable();
    need.dedup();
    ex.ensure_host(&need, true)?;
    let outs = plan
        .outputs
        .iter()
        .enumerate()
        .map(|(k, &o)| {
            let s = ex.slots[o].as_ref().expect("outputs are kept");
            match (&s.host, &s.dev) {
                (Some(h), _) if k < n_host => Out::Host(h.clone()),
                (_, Some(d)) if k >= n_host => Out::Resident(Resident(d.clone())),
                (Some(h), _) => Out::Host(h.clone()),
                (None, _) => unreachable!("host outputs were downloaded"),
            }
        })
        .collect();
    Ok((outs, ex.stats))
}

fn annotate(e: Error, node: &Tensor) -> Error {
    match e {
        Error::Device(m) if !m.contains(&node.op().name()) => Error::Device(format!(
            "{m} (while running {} of shape {})",
            node.op().name(),
            node.shape()
        )),
        other => other,
    }
}

impl<'a> Exec<'a> {
    fn new(ctx: &'a Arc<Context>, plan: &'a Plan, lay: &'a Placement) -> Exec<'a> {
        Exec {
            ctx,
            plan,
            lay,
            slots: (0..plan.nodes.len()).map(|_| None).collect(),
            cmds: Vec::new(),
            status: None,
            status_msgs: HashMap::new(),
            var_versions: HashMap::new(),
            multi: HashMap::new(),
            loop_results: HashMap::new(),
            dests: RefCell::new(HashMap::new()),
            writing: RefCell::new(Vec::new()),
            clashes: RefCell::new(Vec::new()),
            trace: None,
            shapes: RefCell::new(None),
            pieces: RefCell::new(HashMap::new()),
            stats: RunStats::default(),
        }
    }

    /// An executor of `plan` (a loop body) that records into this one's command list:
    /// it takes the recorded commands and the error-status buffer, which `absorb` gives back.
    pub(crate) fn nested<'b>(&mut self, plan: &'b Plan, lay: &'b Placement) -> Exec<'b>
    where
        'a: 'b,
    {
        let mut child = Exec::new(self.ctx, plan, lay);
        child.cmds = std::mem::take(&mut self.cmds);
        child.status = self.status.take();
        child.status_msgs = std::mem::take(&mut self.status_msgs);
        child
    }

    /// Takes back what `nested` lent, with what the nested executor recorded and counted.
    pub(crate) fn absorb(&mut self, child: Exec<'_>) {
        self.cmds = child.cmds;
        self.status = child.status;
        self.status_msgs = child.status_msgs;
        self.stats.dispatches += child.stats.dispatches;
        self.stats.submits += child.stats.submits;
        self.stats.host_nodes += child.stats.host_nodes;
    }

    /// Lowers the plan's schedule, item by item, releasing slots as they die; `feeds`
    /// are the values of its `Step::Fed` nodes.
    pub(crate) fn run_items(&mut self, feeds: &mut [Option<Slot>]) -> Result<()> {
        let sched = self.lay.schedule(self.plan);
        let mut t = 0;
        while t < sched.items.len() {
            let item = &sched.items[t];
            // A run of groups (`Schedule::runs`) is one kernel, profiled as its first item.
            let end = sched
                .runs
                .iter()
                .find(|r| r.start == t)
                .map_or(t + 1, |r| r.end);
            let start = profile::begin();
            let before = self.stats.dispatches;
            self.writing.borrow_mut().clear();
            if end > t + 1 {
                let gs: Vec<_> = sched.items[t..end].iter().filter_map(Item::group).collect();
                fusion::record_run(self, &gs, feeds)?;
            } else {
                self.item(item, feeds)?;
            }
            if let Some(start) = start {
                self.profile_item(start, item, self.stats.dispatches - before);
            }
            if let Some(names) = self.trace.as_mut() {
                let recorded = std::mem::take(names);
                if !recorded.is_empty() {
                    let ops: Vec<String> = sched.items[t..end]
                        .iter()
                        .flat_map(|it| match it {
                            Item::Node(i) => vec![*i],
                            Item::Group(_) | Item::Update(_) => {
                                let g = it.group().expect("a group item");
                                g.first.iter().chain(&g.members).copied().collect()
                            }
                            Item::MatAcc { mm, add, .. } => vec![*mm, *add],
                        })
                        .map(|i| self.plan.nodes[i].op().name())
                        .collect();
                    eprintln!("  [{}] {}", ops.join(" "), recorded.join(" "));
                }
            }
            for frees in &sched.frees[t..end] {
                for &j in frees {
                    self.note_shape(j);
                    self.slots[j] = None;
                    self.multi.remove(&j);
                    self.loop_results.remove(&j);
                }
            }
            t = end;
        }
        for j in 0..self.slots.len() {
            self.note_shape(j);
        }
        Ok(())
    }

    /// Records slot `j`'s shape where shapes are recorded (`shapes`).
    fn note_shape(&self, j: usize) {
        if let Some(s) = &self.slots[j] {
            self.note(j, &s.shape);
        }
    }

    /// Records `shape` as node `j`'s where shapes are recorded (`shapes`): a slot's, or
    /// a fused member's that no buffer holds (`fusion`).
    pub(crate) fn note(&self, j: usize, shape: &[usize]) {
        if let Some(shapes) = self.shapes.borrow_mut().as_mut() {
            shapes[j] = Some(shape.to_vec());
        }
    }

    pub fn slot(&self, j: usize) -> &Slot {
        self.slots[j]
            .as_ref()
            .expect("inputs are computed before their users")
    }

    /// The generated pipeline cached for this plan under `key`, or `source()` compiled at
    /// entry point `entry` and cached (the lock is not held while it compiles).
    pub fn generated_pipeline(
        &self,
        key: FusedKey,
        entry: &str,
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<Pipe>> {
        let cache = || self.lay.fused.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache().get(&key).cloned() {
            return Ok(p);
        }
        let p = super::pipelines::generated(self.ctx, &source()?, entry)?;
        cache().insert(key, p.clone());
        Ok(p)
    }

    /// Lowers one schedule item: a node by its placement, a group as generated kernels
    /// (`fusion::record`).
    fn item(&mut self, item: &Item, feeds: &mut [Option<Slot>]) -> Result<()> {
        let plan = self.plan;
        match item {
            Item::Node(i) => self
                .step(*i, feeds)
                .map_err(|e| annotate(e, &plan.nodes[*i])),
            Item::Group(_) | Item::Update(_) => {
                let g = item.group().expect("a group item");
                let last = *g.members.last().expect("a group has members");
                fusion::record(self, g, feeds).map_err(|e| annotate(e, &plan.nodes[last]))
            }
            // Not built for the GPU target; the two nodes as they are.
            Item::MatAcc { mm, add, .. } => {
                for i in [*mm, *add] {
                    self.step(i, feeds)
                        .map_err(|e| annotate(e, &plan.nodes[i]))?;
                }
                Ok(())
            }
        }
    }

    /// Runs plan step `i` on its own (an elementwise node as a kernel of one member).
    pub(crate) fn step(&mut self, i: usize, feeds: &mut [Option<Slot>]) -> Result<()> {
        let lay = self.lay;
        let slot = match &self.plan.steps[i] {
            Step::Fed(f) => feeds[*f].take().expect("each feed is read once"),
            Step::Folded(v) => {
                let mut s = Slot::host(v.clone());
                s.dev = lay
                    .consts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&i)
                    .cloned();
                s
            }
            Step::Compute => match lay.place[i] {
                Place::Source => self.source(i)?,
                Place::Meta => {
                    let sh = &self.slot(self.plan.inputs[i][0]).shape;
                    Slot::host(Value::from_vec(
                        &[sh.len()],
                        sh.iter().map(|&d| d as i32).collect(),
                    )?)
                }
                Place::View => self.view(i)?,
                Place::Host => self.on_host(i)?,
                Place::Shape => self.shape_arithmetic(i)?,
                Place::Gpu if matches!(self.plan.nodes[i].op().class(), Class::Elementwise(_)) => {
                    return fusion::record_members(self, &[i], &[i]);
                }
                Place::Gpu => {
                    let op = self.plan.nodes[i].op();
                    if let Op::Loop(body) = op {
                        loops::record(self, i, body)?
                    } else if let Op::TupleGet(k) = op {
                        loops::result(self, i, *k)?
                    } else {
                        kernels::record(self, i)?
                    }
                }
            },
        };
        self.slots[i] = Some(slot);
        Ok(())
    }

    /// Records a schedule item in the profile (`runtime::profile`): a node, or a fused
    /// group with its members.
    fn profile_item(&self, start: u64, item: &Item, dispatches: usize) {
        // A group lists the producer whose kernel runs it first (`Group::first`).
        let (i, members): (usize, Vec<usize>) = match item {
            Item::Node(i) => (*i, Vec::new()),
            Item::Group(_) | Item::Update(_) => {
                let g = item.group().expect("a group item");
                let last = *g.members.last().expect("a group has members");
                (last, g.first.iter().chain(&g.members).copied().collect())
            }
            Item::MatAcc { add, .. } => (*add, Vec::new()),
        };
        let place = match self.lay.place[i] {
            Place::Source => "source",
            Place::Host => "host",
            Place::Gpu => "gpu",
            Place::View => "view",
            Place::Meta => "meta",
            Place::Shape => "shape",
        };
        let shape = |j: usize| self.slots[j].as_ref().map(|s| s.shape.clone());
        profile::gpu_node(start, self.plan, i, place, &members, dispatches, &shape);
    }

    /// Runs node `i` with its CPU kernel, downloading its inputs.
    pub(crate) fn on_host(&mut self, i: usize) -> Result<Slot> {
        self.stats.host_nodes += 1;
        self.cpu_kernel(i)
    }

    /// Runs shape-arithmetic node `i` (`Place::Shape`) with its CPU kernel on the host
    /// values it reads; should one of them be on the device only, it is a host node.
    fn shape_arithmetic(&mut self, i: usize) -> Result<Slot> {
        if self.plan.inputs[i]
            .iter()
            .any(|&j| self.slot(j).host.is_none())
        {
            return self.on_host(i);
        }
        self.stats.shape_nodes += 1;
        self.cpu_kernel(i)
    }

    /// Node `i`'s CPU kernel on the host values of its inputs (downloaded where needed).
    fn cpu_kernel(&mut self, i: usize) -> Result<Slot> {
        let ins = self.plan.inputs[i].clone();
        self.ensure_host(&ins, false)?;
        let vals: Vec<Value> = ins
            .iter()
            .map(|&j| self.slot(j).host.clone().expect("downloaded"))
            .collect();
        let args: Vec<&Value> = vals.iter().collect();
        Ok(Slot::host(crate::runtime::cpu::run_node(
            self.plan,
            i,
            &args,
            &mut self.multi,
        )?))
    }

    fn source(&mut self, i: usize) -> Result<Slot> {
        let plan = self.plan;
        let node = &plan.nodes[i];
        if let Op::Variable(cell) = node.op() {
            let (host, dev, version) = cell.snapshot();
            self.var_versions.insert(i, version);
            return Ok(match (host, dev) {
                (h, Some(r)) if r.device_id() == self.ctx.id => {
                    let r = r.as_any().downcast_ref::<Resident>().expect("a GPU copy");
                    let mut s = Slot::dev(r.0.clone());
                    s.host = h;
                    s
                }
                (Some(h), _) => Slot::host(h),
                (None, Some(r)) => {
                    // Resident on another device: bring it over through the host.
                    Slot::host(r.download()?)
                }
                (None, None) => unreachable!("a variable has a host or a device copy"),
            });
        }
        Ok(Slot::host(node.op().cpu(&[])?))
    }

    fn view(&mut self, i: usize) -> Result<Slot> {
        let plan = self.plan;
        let node = &plan.nodes[i];
        let ins = &plan.inputs[i];
        if self.slot(ins[0]).lazy.is_some() {
            self.dev(ins[0])?;
        }
        let x = self.slot(ins[0]);
        let shape = match node.op().class() {
            Class::View(ViewOp::Identity) => x.shape.clone(),
            Class::View(ViewOp::Reshape) => {
                let s = self.slot(ins[1]);
                let Some(target) = s.host.as_ref() else {
                    return Err(Error::Runtime(
                        "reshape: the target shape is not on the host".into(),
                    ));
                };
                movement::reshape_dims("reshape", &x.shape, target)?
            }
            Class::View(ViewOp::ExpandDims(axes)) => movement::expanded_dims(axes, &x.shape),
            Class::View(ViewOp::Squeeze(axes)) => movement::squeezed_dims(axes, &x.shape)?,
            Class::Source | Class::Meta | Class::Elementwise(_) | Class::Kernel | Class::Host => {
                return Err(Error::Runtime(format!(
                    "internal: {} is not a view",
                    node.op().name()
                )))
            }
        };
        Ok(Slot {
            dtype: node.dtype(),
            host: x.host.as_ref().map(|h| h.reshape(&shape)).transpose()?,
            dev: x.dev.as_ref().map(|d| d.reshaped(shape.clone(), d.dtype)),
            shape,
            lazy: None,
        })
    }

    /// The device copy of slot `j`, uploading it if needed (once per plan for folded
    /// constants, once per value for variables).
    pub fn dev(&mut self, j: usize) -> Result<DTensor> {
        let s = self.slot(j);
        if let Some(d) = &s.dev {
            return Ok(d.clone());
        }
        if let Some(lazy) = s.lazy.clone() {
            let d = kernels::write_out(self, j, &lazy)?;
            self.slots[j].as_mut().expect("slot").dev = Some(d.clone());
            return Ok(d);
        }
        let v = s
            .host
            .as_ref()
            .expect("a slot has a host or a device value");
        let words = transfer::to_words(v).ok_or_else(|| {
            Error::Runtime(format!(
                "internal: a {} value cannot be uploaded to the GPU",
                v.dtype()
            ))
        })?;
        let what = || {
            format!(
                "{} (shape {:?}, {})",
                self.plan.nodes[j].op().name(),
                v.shape(),
                v.dtype()
            )
        };
        let buf = pool::alloc(self.ctx, (words.len() as u64 * 4).max(4), &what)?;
        if !words.is_empty() {
            self.ctx
                .queue
                .write_buffer(buf.raw(), 0, bytemuck::cast_slice(&words));
        }
        let d = DTensor::new(buf, v.shape().to_vec(), v.dtype());
        match &self.plan.steps[j] {
            Step::Folded(_) => {
                self.lay
                    .consts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(j, d.clone());
            }
            Step::Compute => {
                if let (Op::Variable(cell), Some(&ver)) =
                    (self.plan.nodes[j].op(), self.var_versions.get(&j))
                {
                    cell.attach_resident(Arc::new(Resident(d.clone())), ver);
                }
            }
            Step::Fed(_) => {}
        }
        self.slots[j].as_mut().expect("slot").dev = Some(d.clone());
        Ok(d)
    }

    /// A device tensor for a result of node `node` (contents undefined): a fresh buffer,
    /// or the row of a loop's stacked result the node's result goes to (`dests`), if it
    /// has the row's shape and dtype and no earlier `alloc` of this step took the row.
    pub fn alloc(&self, shape: &[usize], dtype: DType, node: usize) -> Result<DTensor> {
        if let Some(row) = self.dest_row(shape, dtype, node)? {
            self.writing.borrow_mut().push(row.clone());
            return Ok(row);
        }
        self.fresh(shape, dtype, node)
    }

    /// The row `dests` holds for node `node`, if it takes a `shape` tensor of `dtype`
    /// and is a window (`DTensor::row`); allocates the stacked result at its first use.
    fn dest_row(&self, shape: &[usize], dtype: DType, node: usize) -> Result<Option<DTensor>> {
        let mut dests = self.dests.borrow_mut();
        let Some(d) = dests.get_mut(&node) else {
            return Ok(None);
        };
        if d.given.is_some() {
            return Ok(None);
        }
        let stack = match &d.stack {
            Some(s) if s.dtype == dtype && s.shape[1..] == *shape => s.clone(),
            Some(_) => return Ok(None),
            None => {
                let mut sh = vec![d.rows];
                sh.extend_from_slice(shape);
                let s = self.fresh(&sh, dtype, node)?;
                d.stack = Some(s.clone());
                s
            }
        };
        d.given = stack.row(d.t);
        Ok(d.given.clone())
    }

    /// A fresh device tensor (contents undefined).
    fn fresh(&self, shape: &[usize], dtype: DType, node: usize) -> Result<DTensor> {
        let n = shape.iter().product::<usize>() * transfer::words_per(dtype);
        let what = || {
            format!(
                "the result of {} (shape {shape:?}, {dtype})",
                self.plan.nodes[node].op().name()
            )
        };
        let buf = pool::alloc(self.ctx, (n as u64 * 4).max(4), &what)?;
        Ok(DTensor::new(buf, shape.to_vec(), dtype))
    }

    /// The bindings of one dispatch, each a (binding, buffer, offset, bytes) entry. wgpu
    /// lets no dispatch bind one buffer both read-only and writable, whatever the
    /// ranges: a tensor read from the buffer of a row this item writes in place
    /// (`writing`; an earlier row of the same stacked result, a loop state) is copied
    /// to a fresh buffer first, one dispatch.
    fn bindings(&mut self, bufs: &[(u32, &DTensor)], rw: &[u32]) -> Result<Vec<Binding>> {
        let mut out = Vec::with_capacity(bufs.len());
        for &(b, t) in bufs {
            if rw.contains(&b) {
                out.push((b, t.buf.clone(), t.offset, t.bytes()));
                continue;
            }
            let clash = {
                let w = self.writing.borrow();
                if w.iter().any(|r| r.same_words(t)) {
                    None
                } else {
                    w.iter().find(|r| r.same_buffer(t)).cloned()
                }
            };
            let t = match clash {
                Some(row) => {
                    self.clashes.borrow_mut().push(row);
                    kernels::copy(self, t)?
                }
                None => t.clone(),
            };
            out.push((b, t.buf.clone(), t.offset, t.bytes()));
        }
        Ok(out)
    }

    /// Records one dispatch. `bufs` are (binding, tensor) pairs; binding 0 is `params`.
    pub fn dispatch(
        &mut self,
        pipe: Arc<Pipe>,
        bufs: &[(u32, &DTensor)],
        params: Params,
        groups: [u32; 3],
    ) -> Result<()> {
        self.dispatch_rw(pipe, bufs, params, groups, &[])
    }

    /// Like `dispatch`, where the kernel declares the bindings `rw` (inputs) writable:
    /// they may be windows of a buffer the kernel writes other words of (a loop state's
    /// history, read at one row and written at the next), so `bindings` copies none of
    /// them.
    pub fn dispatch_rw(
        &mut self,
        pipe: Arc<Pipe>,
        bufs: &[(u32, &DTensor)],
        params: Params,
        groups: [u32; 3],
        rw: &[u32],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let bufs = self.bindings(bufs, rw)?;
        self.record(pipe, bufs, params, groups);
        Ok(())
    }

    /// Records one dispatch of `bufs` as they are (`dispatch` without the check of
    /// `bindings`: a kernel that writes only fresh buffers).
    pub(crate) fn dispatch_fresh(
        &mut self,
        pipe: Arc<Pipe>,
        bufs: &[(u32, &DTensor)],
        params: Params,
        groups: [u32; 3],
    ) {
        if groups.contains(&0) {
            return;
        }
        let bufs = bufs
            .iter()
            .map(|(b, t)| (*b, t.buf.clone(), t.offset, t.bytes()))
            .collect();
        self.record(pipe, bufs, params, groups);
    }

    fn record(&mut self, pipe: Arc<Pipe>, bufs: Vec<Binding>, params: Params, groups: [u32; 3]) {
        if let Some(names) = self.trace.as_mut() {
            names.push(pipe.entry.clone());
        }
        self.cmds.push(Cmd {
            pipe,
            bufs,
            params: params.0,
            groups,
        });
        self.stats.dispatches += 1;
    }

    /// Like `dispatch`, binding the call's error-status buffer at binding 4; a kernel that
    /// stores `tag` there (the `tag` field of its block) makes the call fail with `msg`,
    /// its `{index}` replaced by the index the kernel stores next to the tag.
    pub fn dispatch_checked(
        &mut self,
        pipe: Arc<Pipe>,
        bufs: &[(u32, &DTensor)],
        block: &Indexed,
        groups: [u32; 3],
        msg: String,
    ) -> Result<()> {
        let tag = block.tag;
        if groups.contains(&0) {
            return Ok(());
        }
        if let Some(names) = self.trace.as_mut() {
            names.push(pipe.entry.clone());
        }
        let status = match &self.status {
            Some(s) => s.clone(),
            None => {
                let s = pool::alloc(self.ctx, 256, &|| "the error-status buffer".into())?;
                self.ctx.queue.write_buffer(s.raw(), 0, &[0u8; 16]);
                self.status = Some(s.clone());
                s
            }
        };
        self.status_msgs.insert(tag, msg);
        let mut b = self.bindings(bufs, &[])?;
        b.push((4, status, 0, 16));
        self.cmds.push(Cmd {
            pipe,
            bufs: b,
            params: Params::of(block).0,
            groups,
        });
        self.stats.dispatches += 1;
        Ok(())
    }

    /// Makes the host values of `js` available, downloading device-only ones in one
    /// submit. `finish` submits recorded work even when nothing needs downloading.
    pub fn ensure_host(&mut self, js: &[usize], finish: bool) -> Result<()> {
        let need: Vec<usize> = js
            .iter()
            .copied()
            .filter(|&j| self.slot(j).host.is_none())
            .collect::<Vec<_>>();
        let mut need_u = need.clone();
        need_u.sort_unstable();
        need_u.dedup();
        if need_u.is_empty() && !(finish && (!self.cmds.is_empty() || self.status.is_some())) {
            return Ok(());
        }
        let mut reads: Vec<DTensor> = need_u
            .iter()
            .map(|&j| self.slot(j).dev.clone().expect("device value"))
            .collect();
        let status = self.status.take();
        if let Some(s) = &status {
            reads.push(DTensor::new(s.clone(), vec![4], DType::I32));
        }
        let cmds = std::mem::take(&mut self.cmds);
        let (start, recorded) = (profile::begin(), cmds.len());
        let mut words = submit(self.ctx, cmds, &reads)?;
        if let Some(start) = start {
            profile::gpu_submit(start, recorded, reads.len());
        }
        self.stats.submits += 1;
        if status.is_some() {
            let st = words.pop().expect("status words");
            if st[0] != 0 {
                let msg = self
                    .status_msgs
                    .get(&st[0])
                    .map(|m| m.replace("{index}", &(st[1] as i32).to_string()))
                    .unwrap_or_else(|| "an index is out of range".into());
                return Err(Error::Value(msg));
            }
        }
        for (&j, w) in need_u.iter().zip(words) {
            let s = self.slots[j].as_mut().expect("slot");
            s.host = Some(transfer::from_words(s.dtype, &s.shape, &w));
        }
        Ok(())
    }
}

/// Flat 1-D grid of 256-wide workgroups for `n` invocations (2-D past 65535 groups).
pub fn grid(n: usize) -> [u32; 3] {
    let g = n.div_ceil(256);
    if g == 0 {
        return [0, 1, 1];
    }
    let x = g.min(65535);
    [x as u32, g.div_ceil(x) as u32, 1]
}

/// Downloads device tensors outside of a call (a resident variable's value).
pub fn read_back(ctx: &Arc<Context>, ts: &[DTensor]) -> Result<Vec<Vec<u32>>> {
    ctx.check("reading back a GPU value")?;
    submit(ctx, Vec::new(), ts)
}

/// Encodes `cmds` in one compute pass, copies `reads` into one staging buffer, submits
/// once, maps once, and returns the words of each read.
fn submit(ctx: &Arc<Context>, cmds: Vec<Cmd>, reads: &[DTensor]) -> Result<Vec<Vec<u32>>> {
    let align = (ctx.limits.min_storage_buffer_offset_alignment as usize / 4).max(1);
    let mut all: Vec<u32> = Vec::new();
    let mut offs = Vec::with_capacity(cmds.len());
    for c in &cmds {
        all.resize(all.len().div_ceil(align) * align, 0);
        offs.push(all.len());
        all.extend_from_slice(&c.params);
        if c.params.is_empty() {
            all.push(0);
        }
    }
    let pbuf = if all.is_empty() {
        None
    } else {
        let b = pool::alloc(ctx, all.len() as u64 * 4, &|| "kernel parameters".into())?;
        ctx.queue
            .write_buffer(b.raw(), 0, bytemuck::cast_slice(&all));
        Some(b)
    };
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("ferrokeras call"),
        });
    let stamps = pbuf
        .as_ref()
        .and_then(|_| super::timestamps::Stamps::new(ctx));
    if let Some(pbuf) = &pbuf {
        let groups: Vec<wgpu::BindGroup> = cmds
            .iter()
            .zip(&offs)
            .map(|(c, &o)| {
                let plen = c.params.len().max(1) as u64 * 4;
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: pbuf.raw(),
                        offset: o as u64 * 4,
                        size: NonZeroU64::new(plen),
                    }),
                }];
                for (b, buf, offset, bytes) in &c.bufs {
                    entries.push(wgpu::BindGroupEntry {
                        binding: *b,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: buf.raw(),
                            offset: *offset,
                            size: NonZeroU64::new(*bytes),
                        }),
                    });
                }
                ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &c.pipe.layout,
                    entries: &entries,
                })
            })
            .collect();
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: stamps.as_ref().map(|s| s.writes()),
        });
        for (c, g) in cmds.iter().zip(&groups) {
            pass.set_pipeline(&c.pipe.pipeline);
            pass.set_bind_group(0, g, &[]);
            pass.dispatch_workgroups(c.groups[0], c.groups[1], c.groups[2]);
        }
    }
    let sizes: Vec<u64> = reads.iter().map(|t| t.words() as u64 * 4).collect();
    let total: u64 = sizes.iter().sum();
    let staging = if total > 0 {
        Some(pool::alloc_staging(ctx, total)?)
    } else {
        None
    };
    if let Some(st) = &staging {
        let mut off = 0;
        for (t, &sz) in reads.iter().zip(&sizes) {
            if sz > 0 {
                enc.copy_buffer_to_buffer(t.buf.raw(), t.offset, st.raw(), off, sz);
            }
            off += sz;
        }
    }
    if let Some(s) = &stamps {
        s.resolve(&mut enc);
    }
    ctx.queue.submit([enc.finish()]);
    let mut out: Vec<Vec<u32>> = Vec::with_capacity(reads.len());
    match &staging {
        Some(st) => {
            let slice = st.raw().slice(0..total);
            let (tx, rx) = std::sync::mpsc::channel();
            slice.map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(format!("GPU wait failed on {}: {e}", ctx.desc.name)))?;
            ctx.check("a GPU call")?;
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(Error::Device(format!(
                        "mapping the GPU results failed: {e}"
                    )))
                }
                Err(_) => {
                    return Err(Error::Device(
                        "mapping the GPU results did not complete".into(),
                    ))
                }
            }
            {
                let view = slice.get_mapped_range().map_err(|e| {
                    Error::Device(format!("reading the mapped GPU results failed: {e}"))
                })?;
                let words: &[u32] = bytemuck::cast_slice(&view);
                let mut off = 0usize;
                for &sz in &sizes {
                    let n = sz as usize / 4;
                    out.push(words[off..off + n].to_vec());
                    off += n;
                }
            }
            st.raw().unmap();
        }
        None => {
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(format!("GPU wait failed on {}: {e}", ctx.desc.name)))?;
            ctx.check("a GPU call")?;
            out.extend(reads.iter().map(|_| Vec::new()));
        }
    }
    if let Some(s) = stamps {
        s.finish(ctx);
    }
    drop(cmds);
    drop(pbuf);
    drop(staging);
    ctx.pool.lock().unwrap_or_else(|e| e.into_inner()).recycle();
    Ok(out)
}
