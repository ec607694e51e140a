//! Elementwise fusion: which nodes of a plan a device runs as one kernel, for every device.
//!
//! One algorithm builds the schedule for each `Target` (`Target::cpu`, and the GPU target
//! the GPU runtime describes from its adapter's limits); each runtime lowers it: the CPU
//! executor runs a group with its register-program kernel (`runtime::cpu::fused`), the GPU
//! executor generates one WGSL kernel per group (`runtime::gpu::fusion`).
//!
//! A group is a set of elementwise nodes (the ops `Op::class` calls `Elementwise`) of dtypes
//! the target fuses and of one output shape, joined producer to consumer. A member of a
//! smaller shape may join a reader that broadcasts it where the target computes members per
//! element of the group's shape (`Target::broadcast`) and every reader of the member's part
//! of the group is that one node. A group runs at the position of its last member, so a
//! node may join only if no other node placed before it reads a member (nothing has to
//! move). Members read outside the group (or returned) are its outputs; the rest never get
//! a buffer. Where the target allows: a slice (`view`) may be a member too, read as a
//! strided view of its input; sums folded into the group, convolution and pooling
//! epilogues and product accumulations (`Item::MatAcc`) join the schedule; a group that
//! computes an optimizer update rule becomes an `Item::Update` (`update_rule`).

use super::update_rule::{self, Update};
use super::{Plan, Step};
use crate::base::dtype::DType;
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::ops::{Class, Op, ReduceOp};

/// Which device kind a `Target` describes; `Plan::schedule` caches one schedule per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    Cpu,
    Gpu,
}

/// What a device's fusion kernel runs: the parameters of `schedule`. Plain data, so the
/// runtime describes its device without `compile` depending on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: TargetKind,
    /// Whether nodes fuse at all (off: every node is an `Item::Node`).
    pub fuse: bool,
    /// Dtypes a member may compute and read.
    pub dtypes: &'static [DType],
    /// Most members of one group.
    pub max_members: usize,
    /// Most buffers one group binds: its outputs and the external inputs it reads.
    pub max_buffers: usize,
    /// Whether a folded scalar constant is passed in the kernel's parameters rather than
    /// bound as a buffer (it then does not count toward `max_buffers`).
    pub scalar_params: bool,
    /// Whether the kernel computes every member per element of the group's shape, so a
    /// member of a smaller shape may join the reader that broadcasts it.
    pub broadcast: bool,
    /// Whether a slice joins its readers' group as a strided view of its input (`view`).
    pub views: bool,
    /// Whether sums and means of members fold into the group (`Group::folds`).
    pub folds: bool,
    /// The producers a group that reads one may run after (`Group::first`): on the CPU
    /// per image of a convolution or pooling result, on the GPU in the convolution's or
    /// product's kernel, as it stores each element.
    pub epilogues: &'static [Producer],
    /// Whether a pooling (or global max pooling) that reads only the result of a group
    /// run after a convolution runs on each image of it right after the group
    /// (`Group::pooled`).
    pub pooled: bool,
    /// Whether a group computing an optimizer update rule becomes an `Item::Update`.
    pub updates: bool,
    /// Whether a product added into an accumulator becomes an `Item::MatAcc`.
    pub accumulations: bool,
    /// Whether adjacent groups that nothing reads, at the end of the schedule (the
    /// optimizer's updates), run as one kernel over their concatenated index spaces
    /// (`Schedule::runs`), as many as `max_buffers` allows.
    pub runs: bool,
    /// Whether a group computes again the members of another group that it reads, from
    /// inputs it reads anyway, instead of reading them back (`recompute`).
    pub recompute: bool,
}

impl Target {
    /// The CPU fusion kernel: f32 and bool registers, any number of buffers, every
    /// schedule item kind. `fuse` false gives the unfused schedule.
    pub fn cpu(fuse: bool) -> Target {
        Target {
            kind: TargetKind::Cpu,
            fuse,
            dtypes: &[DType::F32, DType::Bool],
            max_members: 64,
            max_buffers: usize::MAX,
            scalar_params: false,
            broadcast: false,
            views: true,
            folds: true,
            epilogues: &[Producer::Conv, Producer::Pool],
            pooled: true,
            updates: true,
            accumulations: true,
            runs: false,
            recompute: true,
        }
    }

    /// The CPU target as configured: fused unless `FERROKERAS_CPU_FUSION=0` (`base::config`).
    pub fn cpu_configured() -> Target {
        Target::cpu(crate::base::config::settings().cpu_fusion)
    }

    /// A GPU whose generated kernels read and write the storable `dtypes` and bind at most
    /// `max_buffers` storage buffers besides their parameter block: groups, plain nodes
    /// and groups run in the kernel of the convolution or product they read (checked
    /// against the buffer limit at run time), members computed per element of the
    /// group's shape, sums and means folded into the group's kernel (its workgroups
    /// adding up blocks of the member's rows or columns, `runtime::gpu::fusion`).
    pub fn gpu(dtypes: &'static [DType], max_buffers: usize) -> Target {
        Target {
            kind: TargetKind::Gpu,
            fuse: true,
            dtypes,
            max_members: usize::MAX,
            max_buffers: max_buffers.max(2),
            scalar_params: true,
            broadcast: true,
            views: false,
            folds: true,
            epilogues: &[Producer::Conv, Producer::Product],
            pooled: false,
            updates: false,
            accumulations: false,
            runs: true,
            recompute: false,
        }
    }
}

/// A kind of node a group may run after as its epilogue (`Target::epilogues`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Producer {
    /// A forward convolution (`Op::Conv`).
    Conv,
    /// A pooling or pooling gradient (`Op::Pool`, `Op::PoolGrad`).
    Pool,
    /// A matrix product (`Op::MatMul`).
    Product,
}

impl Producer {
    /// The producer kind of `op`, if it is one.
    pub fn of(op: &Op) -> Option<Producer> {
        match op {
            Op::Conv(_) => Some(Producer::Conv),
            Op::Pool(_) | Op::PoolGrad(_) => Some(Producer::Pool),
            Op::MatMul { .. } => Some(Producer::Product),
            Op::Placeholder(_)
            | Op::Constant(_)
            | Op::Variable(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast(_)
            | Op::StopGradient
            | Op::Reshape
            | Op::BroadcastTo
            | Op::ShapeOf
            | Op::ExpandDims(_)
            | Op::Squeeze(_)
            | Op::Transpose(_)
            | Op::Slice(_)
            | Op::Reverse(_)
            | Op::ConcatGrad { .. }
            | Op::SliceGrad(_)
            | Op::Pad { .. }
            | Op::Concat(_)
            | Op::Gather(_)
            | Op::ScatterAdd(_)
            | Op::Reduce { .. }
            | Op::SumTo
            | Op::Arg { .. }
            | Op::Scan { .. }
            | Op::ConvInputGrad(_)
            | Op::ConvKernelGrad(_)
            | Op::PoolSelect(_)
            | Op::Random(_)
            | Op::Loop(_)
            | Op::TupleGet(_)
            | Op::HostCall(_)
            | Op::Ctc(_)
            | Op::CtcDecode(_) => None,
        }
    }
}

/// What a device runs, in order (built for one `Target`).
#[derive(Debug)]
pub struct Schedule {
    /// The target the schedule was built for.
    pub target: Target,
    pub items: Vec<Item>,
    /// Slots released after each item (their last reader in schedule order).
    pub frees: Vec<Vec<usize>>,
    /// Kernel launches of one run on the CPU (a group counts once; sources and folded
    /// values none).
    pub dispatches: usize,
    /// Whether a host callback runs (here or in a loop body): such plans stay on the
    /// calling thread, so a callback never waits for the GIL on a pool worker.
    pub has_host: bool,
    /// Items from this index on cannot fail at run time (`infallible`): a run there may
    /// overwrite variables in place (`runtime::cpu::InPlace`), since the call will assign them.
    pub tail: usize,
    /// Ranges of adjacent items, each of two or more groups that nothing reads, that the
    /// target runs as one kernel (`Target::runs`); empty where it has none.
    pub runs: Vec<std::ops::Range<usize>>,
}

#[derive(Debug)]
pub enum Item {
    /// Plan step `i`, as the plain executor runs it.
    Node(usize),
    Group(Group),
    /// A group that computes an optimizer update rule (`update_rule`), run by the CPU
    /// executor with the rule's kernel where the run's shapes allow.
    Update(Box<Update>),
    /// `add = acc + mm` where plan step `mm` is a 2-D f32 product read by that add alone:
    /// the product is added into `acc`'s buffer by `gemm` (taken when `acc` dies here and
    /// nothing else holds it, else copied) instead of written out and read back
    /// (`accumulations`).
    MatAcc {
        mm: usize,
        add: usize,
        acc: usize,
    },
}

#[derive(Debug)]
pub struct Group {
    /// Plan slots, in plan order.
    pub members: Vec<usize>,
    /// Members whose values are read after the group.
    pub outputs: Vec<usize>,
    /// Slots read by members that are not members (data inputs only), in first-use order.
    pub ext: Vec<usize>,
    /// Slots released after the group runs (inputs it is the last reader of).
    pub frees: Vec<usize>,
    /// Estimated cost per element, in adds (for the parallel grain).
    pub cost: usize,
    /// A convolution, pooling (or pooling gradient) or product the group runs first, its
    /// only data reader (`Target::epilogues`): the CPU then runs the group on each image
    /// of the result as soon as that image is computed, while it is in cache; the GPU
    /// computes the group in the producer's kernel as it stores each element.
    pub first: Option<usize>,
    /// Sums and means of members the group folds as it computes them (`folds`).
    pub folds: Vec<Fold>,
    /// Reduced members read by nothing else: computed tile by tile, never written out.
    pub hidden: Vec<usize>,
    /// A pooling (`Op::Pool`), or a maximum or minimum over axes other than the batch
    /// axis (a global max pooling), of the group's one output, its only reader, for a
    /// group run after a convolution (`Target::pooled`): the CPU pools each image right
    /// after the group computes it, while it is in cache, instead of reading the whole
    /// result back from memory (a Keras conv-batch-norm-relu-max-pool block, or a text
    /// CNN's convolution and global max pooling, in inference).
    pub pooled: Option<usize>,
}

/// A sum or mean (`Op::Reduce` or `Op::SumTo`, f32), plan step `node`, of group member
/// `member`: the group adds up each tile of the member right after computing it, while it
/// is in cache, instead of writing it out for a reduction pass to read back.
#[derive(Clone, Copy, Debug)]
pub struct Fold {
    pub node: usize,
    pub member: usize,
}

/// What a fold reduces in one run of its group (`Fold::axes`), for the lowering of each
/// device.
#[derive(Debug)]
pub struct FoldAxes {
    /// Per axis of the members' run-time shape: whether the fold sums over it.
    pub reduced: Vec<bool>,
    /// A mean (the sum scaled by 1 / `red`).
    pub mean: bool,
    /// The shape of the fold's result.
    pub out: Vec<usize>,
    /// Whether the reduced axes come before the kept ones (dims of size 1 go either way).
    pub leading: bool,
    /// Whether the reduced axes come after the kept ones.
    pub trailing: bool,
    /// Whether the reduced axes are one run between kept ones (a global pooling's
    /// `[batch, rows, cols, channels]` over rows and cols), or lead or trail.
    pub run: bool,
    /// Elements of the kept axes (the result's size) and of the reduced ones.
    pub kept: usize,
    pub red: usize,
    /// Elements of the kept axes after the last reduced one.
    pub inner: usize,
}

impl Fold {
    /// The axes the fold reduces over members of run-time shape `s`; `target` is the
    /// run-time value of a `sum_to`'s target shape. `None` where it is not a reduction of
    /// `s` (run on its own, the op reports why).
    pub fn axes(&self, plan: &Plan, s: &[usize], target: Option<&Value>) -> Option<FoldAxes> {
        let node_op = plan.nodes[self.node].op();
        let (reduced, mean, out) = if let Op::Reduce {
            op: op @ (ReduceOp::Sum | ReduceOp::Mean),
            axes,
            keepdims,
        } = node_op
        {
            let reduced: Vec<bool> = (0..s.len()).map(|d| axes.contains(&d)).collect();
            let out = (0..s.len())
                .filter_map(|d| match (reduced[d], keepdims) {
                    (false, _) => Some(s[d]),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect();
            (reduced, *op == ReduceOp::Mean, out)
        } else if let Op::SumTo = node_op {
            let target = target?.to_i64_vec();
            let lead = s.len().checked_sub(target.len())?;
            let mut reduced = vec![true; lead];
            for (k, &t) in target.iter().enumerate() {
                let d = s[lead + k];
                match t {
                    1 => reduced.push(d != 1),
                    t if t >= 0 && t as usize == d => reduced.push(false),
                    _ => return None,
                }
            }
            (reduced, false, target.iter().map(|&t| t as usize).collect())
        } else {
            return None;
        };
        let kinds: Vec<bool> = (0..s.len())
            .filter(|&d| s[d] != 1)
            .map(|d| reduced[d])
            .collect();
        let prod = |r: bool| {
            (0..s.len())
                .filter(|&d| reduced[d] == r)
                .map(|d| s[d])
                .product::<usize>()
        };
        let last = (0..s.len()).rfind(|&d| reduced[d] && s[d] != 1);
        Some(FoldAxes {
            leading: kinds.windows(2).all(|w| w[0] || !w[1]),
            trailing: kinds.windows(2).all(|w| !w[0] || w[1]),
            run: match (
                kinds.iter().position(|&r| r),
                kinds.iter().rposition(|&r| r),
            ) {
                (Some(a), Some(b)) => kinds[a..=b].iter().all(|&r| r),
                _ => true,
            },
            kept: prod(false),
            red: prod(true),
            inner: last.map_or(1, |l| s[l + 1..].iter().product()),
            reduced,
            mean,
            out,
        })
    }
}

impl Item {
    /// The fused group the item runs (a group or an update rule), if any.
    pub fn group(&self) -> Option<&Group> {
        match self {
            Item::Group(g) => Some(g),
            Item::Update(u) => Some(&u.group),
            Item::Node(_) | Item::MatAcc { .. } => None,
        }
    }

    /// The update rule the item's group computes, if it is an `Item::Update`.
    pub fn update(&self) -> Option<&Update> {
        match self {
            Item::Update(u) => Some(u),
            Item::Group(_) | Item::Node(_) | Item::MatAcc { .. } => None,
        }
    }

    /// The plan slots the item may fill.
    pub fn writes(&self) -> Vec<usize> {
        match self {
            Item::Node(i) => vec![*i],
            Item::MatAcc { add, .. } => vec![*add],
            Item::Group(_) | Item::Update(_) => {
                self.group().expect("a group item").computed().collect()
            }
        }
    }
}

impl Group {
    /// The members the kernel computes into buffers: the outputs, then the hidden members.
    pub fn written(&self) -> impl Iterator<Item = usize> + '_ {
        self.outputs.iter().chain(&self.hidden).copied()
    }

    /// The plan steps of the group's folds, whose values it returns after its outputs.
    pub fn fold_nodes(&self) -> impl Iterator<Item = usize> + '_ {
        self.folds.iter().map(|f| f.node)
    }

    /// The plan steps the group computes: its producer, then `after_first`.
    pub fn computed(&self) -> impl Iterator<Item = usize> + '_ {
        self.first.into_iter().chain(self.after_first())
    }

    /// The plan steps the group computes from its producer's result (or its inputs): its
    /// members, its folds and its pooling.
    pub fn after_first(&self) -> impl Iterator<Item = usize> + '_ {
        self.members
            .iter()
            .copied()
            .chain(self.fold_nodes())
            .chain(self.pooled)
    }

    /// The plan steps whose values a run of the group returns, in order: its outputs, its
    /// folds, its pooling.
    pub fn returned(&self) -> impl Iterator<Item = usize> + '_ {
        self.outputs
            .iter()
            .copied()
            .chain(self.fold_nodes())
            .chain(self.pooled)
    }
}

/// Whether the target's fusion kernel runs node `i` (`shape_like` nodes stay plain). A
/// target that fuses int64 does so only for the ops computed exactly on it
/// (`Op::exact_int64`).
fn fusible(plan: &Plan, t: &Target, shape_like: &[bool], i: usize) -> bool {
    if !matches!(plan.steps[i], Step::Compute) || shape_like[i] {
        return false;
    }
    let node = &plan.nodes[i];
    let reg = |d: DType| t.dtypes.contains(&d);
    let int64 = node.dtype() == DType::I64
        || data_inputs(plan, i).any(|j| plan.nodes[j].dtype() == DType::I64);
    matches!(node.op().class(), Class::Elementwise(_))
        && reg(node.dtype())
        && data_inputs(plan, i).all(|j| reg(plan.nodes[j].dtype()))
        && (!int64 || node.op().exact_int64())
}

/// Small integer vectors (rank 0 or 1) computed only to become shape operands
/// (`Op::shape_operands`), directly or through other such vectors: a device keeps them on
/// the host, and no target fuses them.
pub fn shape_like(plan: &Plan) -> Vec<bool> {
    let n = plan.nodes.len();
    let mut consumers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
    for (i, ins) in plan.inputs.iter().enumerate() {
        for (p, &j) in ins.iter().enumerate() {
            consumers[j].push((i, p));
        }
    }
    let mut shape_like = vec![false; n];
    for i in (0..n).rev() {
        let t = &plan.nodes[i];
        shape_like[i] = t.dtype().is_int()
            && t.rank() <= 1
            && !consumers[i].is_empty()
            && consumers[i]
                .iter()
                .all(|&(c, p)| plan.nodes[c].op().shape_operands().contains(&p) || shape_like[c]);
    }
    shape_like
}

/// The slots schedule item `item` reads: a node's inputs, a product's and its
/// accumulator, a group's inputs from outside it (its producer's and folds' included).
pub fn reads(plan: &Plan, item: &Item) -> Vec<usize> {
    match item {
        Item::Node(i) => plan.inputs[*i].clone(),
        Item::MatAcc { mm, acc, .. } => plan.inputs[*mm].iter().copied().chain([*acc]).collect(),
        Item::Group(_) | Item::Update(_) => {
            let g = item.group().expect("a group item");
            g.computed()
                .flat_map(|m| plan.inputs[m].iter().copied())
                .filter(|j| !g.members.contains(j))
                .collect()
        }
    }
}

/// Whether a plan runs a host callback, here or in a loop body.
fn has_host(plan: &Plan) -> bool {
    plan.nodes.iter().any(|t| {
        if let Op::Loop(body) = t.op() {
            has_host(plan.body(body))
        } else {
            matches!(t.op(), Op::HostCall(_))
        }
    })
}

/// Whether node `i` is a slice the CPU fusion kernel can read as a strided view of its
/// input (f32, steps of at least 1): it joins a group of its readers instead of copying
/// (the Keras LSTM's four gate slices of `z` per step).
pub fn view(plan: &Plan, i: usize) -> bool {
    let node = &plan.nodes[i];
    matches!(plan.steps[i], Step::Compute)
        && matches!(node.op(), Op::Slice(spec) if spec.iter().all(|a| a.step >= 1))
        && node.dtype() == DType::F32
        && node.rank() <= 16
}

/// Input slots of node `i` that carry data (not target shapes).
pub fn data_inputs(plan: &Plan, i: usize) -> impl Iterator<Item = usize> + '_ {
    let h = plan.nodes[i].op().shape_operands();
    plan.inputs[i]
        .iter()
        .enumerate()
        .filter(move |(p, _)| !h.contains(p))
        .map(|(_, &j)| j)
}

/// Same rank and equal where both dims are known.
fn compatible(a: &Shape, b: &Shape) -> bool {
    a.rank() == b.rank()
        && a.dims()
            .iter()
            .zip(b.dims())
            .all(|(x, y)| x.is_none() || y.is_none() || x == y)
}

/// Builds the schedule of `plan` for target `t`.
pub fn schedule(plan: &Plan, t: &Target) -> Schedule {
    let n = plan.nodes.len();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, ins) in plan.inputs.iter().enumerate() {
        for &j in ins {
            users[j].push(i);
        }
    }
    let is_output: Vec<bool> = (0..n).map(|i| plan.outputs.contains(&i)).collect();
    let shape_like = shape_like(plan);
    let view = |i: usize| t.views && view(plan, i);
    // Whether reading slot `j` takes one of the group's buffers.
    let binds = |j: usize| {
        !(t.scalar_params
            && matches!(&plan.steps[j], Step::Folded(v) if v.len() == 1 && t.dtypes.contains(&v.dtype())))
    };
    // group[i]: index into `groups` of the group node i belongs to.
    let mut group: Vec<Option<usize>> = vec![None; n];
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in 0..n {
        if !t.fuse || !(fusible(plan, t, &shape_like, i) || view(i)) {
            continue;
        }
        if view(i) {
            // Starts a group of its own (its input is read in place, not fused), which
            // readers of the slice may join.
            group[i] = Some(groups.len());
            groups.push(vec![i]);
            continue;
        }
        let shape = plan.nodes[i].shape();
        // Groups i may join: through an input of its shape, or (`Target::broadcast`) one
        // it broadcasts, a group of which i would be the only reader (`closed`).
        let closed = |g: usize| {
            groups[g]
                .iter()
                .all(|&m| !is_output[m] && users[m].iter().all(|&u| u <= i))
        };
        let mut cands: Vec<usize> = Vec::new();
        for j in data_inputs(plan, i) {
            if let Some(g) = group[j] {
                if !cands.contains(&g)
                    && (compatible(plan.nodes[j].shape(), shape)
                        || (t.broadcast && plan.nodes[j].rank() <= shape.rank() && closed(g)))
                {
                    cands.push(g);
                }
            }
        }
        // The buffers the group of i and `cs` binds (outputs read by nodes outside it yet).
        let buffers = |cs: &[usize]| {
            let inside = |j: usize| j == i || group[j].is_some_and(|h| cs.contains(&h));
            let members = || {
                cs.iter()
                    .flat_map(|&g| groups[g].iter().copied())
                    .chain([i])
            };
            let mut ext: Vec<usize> = Vec::new();
            for m in members() {
                for j in data_inputs(plan, m) {
                    if !inside(j) && binds(j) && !ext.contains(&j) {
                        ext.push(j);
                    }
                }
            }
            let outputs = members()
                .filter(|&m| is_output[m] || users[m].iter().any(|&u| !inside(u)))
                .count();
            ext.len() + outputs
        };
        // Every reader of a member placed before i must be in the merged group.
        let ok = |cs: &[usize]| {
            cs.iter().map(|&g| groups[g].len()).sum::<usize>() < t.max_members
                && cs.iter().all(|&g| {
                    groups[g].iter().all(|&m| {
                        users[m]
                            .iter()
                            .all(|&u| u >= i || group[u].is_some_and(|h| cs.contains(&h)))
                    })
                })
                && (t.max_buffers == usize::MAX || buffers(cs) <= t.max_buffers)
        };
        let chosen: Vec<usize> = if ok(&cands) {
            cands
        } else {
            cands
                .iter()
                .copied()
                .find(|&g| ok(&[g]))
                .into_iter()
                .collect()
        };
        match chosen.split_first() {
            None => {
                group[i] = Some(groups.len());
                groups.push(vec![i]);
            }
            Some((&g, rest)) => {
                for &h in rest {
                    let moved = std::mem::take(&mut groups[h]);
                    for &m in &moved {
                        group[m] = Some(g);
                    }
                    groups[g].extend(moved);
                }
                groups[g].push(i);
                group[i] = Some(g);
            }
        }
    }
    let rc = recompute(plan, t, &users, &is_output, &group, &groups, &view);
    let mut items = Vec::new();
    let mut dispatches = 0;
    for i in 0..n {
        let Some(g) = group[i] else {
            if matches!(plan.steps[i], Step::Compute) && !plan.nodes[i].inputs().is_empty() {
                dispatches += 1;
            }
            items.push(Item::Node(i));
            continue;
        };
        let mut members = groups[g].clone();
        members.sort_unstable();
        if members.iter().all(|&m| view(m)) {
            // A slice no reader joined runs as a plain node.
            dispatches += 1;
            items.push(Item::Node(i));
            continue;
        }
        if members.last() != Some(&i) {
            continue;
        }
        // Members computed again by every group that reads them (`recompute`) are not
        // written; copies computed here never are.
        let inside = |j: usize| group[j] == Some(g) || rc.clones[g].contains(&j);
        let outputs: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&m| {
                !rc.gone[m]
                    && (is_output[m] || rc.pinned[m] || users[m].iter().any(|&u| !inside(u)))
            })
            .collect();
        members.extend(&rc.clones[g]);
        members.sort_unstable();
        let mut ext: Vec<usize> = Vec::new();
        for &m in &members {
            for j in data_inputs(plan, m) {
                if !inside(j) && !ext.contains(&j) {
                    ext.push(j);
                }
            }
        }
        let cost = members
            .iter()
            .map(|&m| plan.nodes[m].op().cost())
            .sum::<usize>()
            .max(1);
        dispatches += 1;
        items.push(Item::Group(Group {
            members,
            outputs,
            ext,
            frees: Vec::new(),
            cost,
            first: None,
            folds: Vec::new(),
            hidden: Vec::new(),
            pooled: None,
        }));
    }
    if t.fuse && !t.epilogues.is_empty() {
        epilogues(plan, t, &users, &is_output, &mut items);
    }
    if t.fuse && t.accumulations {
        dispatches -= accumulations(plan, &users, &is_output, &mut items);
    }
    if t.fuse && t.folds {
        dispatches -= folds(plan, &users, &is_output, &mut items);
    }
    if t.fuse && t.pooled {
        dispatches -= pooled(plan, &users, &is_output, &mut items);
    }
    let items = eager(plan, items);
    // Groups that nothing reads (they compute update values and outputs only) and that
    // cannot fail run last, in order: the run may then overwrite variables in place there
    // (`tail`). Keras places each parameter's update right after its gradient. A target
    // that runs such groups together (`Target::runs`) and overwrites nothing in place
    // moves those that may fail (a bias's update reads a `sum_to` of a runtime shape)
    // there too.
    // A group that computes its producer (`Group::first`) moves only when nothing else
    // reads the producer either (a `shape` of a product is read where it stands).
    let unread = |item: &Item| match item.group() {
        Some(g) => {
            g.folds.is_empty()
                && g.outputs
                    .iter()
                    .chain(&g.first)
                    .all(|&o| users[o].iter().all(|u| g.members.contains(u)))
        }
        None => false,
    };
    let (last_items, mut items): (Vec<Item>, Vec<Item>) = items
        .into_iter()
        .partition(|item| unread(item) && (t.runs || infallible(plan, item)));
    let first_last = items.len();
    if t.runs {
        // Groups that run in their producer's kernel first, then those a run may join.
        let (after, own): (Vec<Item>, Vec<Item>) = last_items
            .into_iter()
            .partition(|item| item.group().is_some_and(|g| g.first.is_some()));
        items.extend(after);
        items.extend(own);
    } else {
        items.extend(last_items);
    }
    // Runs of those groups within the target's buffers, the inputs they share bound once.
    let mut runs = Vec::new();
    let mut start = first_last;
    while t.fuse && t.runs && start < items.len() {
        let (mut bound, mut outputs, mut end) = (Vec::new(), 0, start);
        while let Some(Item::Group(g)) = items.get(end) {
            if g.first.is_some() {
                break;
            }
            let mut more = bound.clone();
            for &j in &g.ext {
                if binds(j) && !more.contains(&j) {
                    more.push(j);
                }
            }
            if end > start && more.len() + outputs + g.outputs.len() > t.max_buffers {
                break;
            }
            (bound, outputs, end) = (more, outputs + g.outputs.len(), end + 1);
        }
        if end > start + 1 {
            runs.push(start..end);
        }
        start = end.max(start + 1);
    }
    // A group runs later than its first members, so last uses are recounted by item.
    let mut last: Vec<Option<usize>> = vec![None; n];
    for (t, item) in items.iter().enumerate() {
        for j in reads(plan, item) {
            last[j] = Some(t);
        }
    }
    let mut frees: Vec<Vec<usize>> = vec![Vec::new(); items.len()];
    for (j, l) in last.iter().enumerate() {
        if let Some(t) = l {
            if !is_output[j] && !frees[*t].contains(&j) {
                frees[*t].push(j);
            }
        }
    }
    for (item, f) in items.iter_mut().zip(&frees) {
        if let Item::Group(g) = item {
            g.frees = f.clone();
        }
    }
    let tail = items
        .iter()
        .rposition(|item| !infallible(plan, item))
        .map_or(0, |t| t + 1);
    if t.fuse && t.updates {
        items = items
            .into_iter()
            .map(|item| match item {
                Item::Group(g) => update_rule::recognise(plan, g),
                Item::Node(_) | Item::MatAcc { .. } | Item::Update(_) => item,
            })
            .collect();
    }
    Schedule {
        target: t.clone(),
        items,
        frees,
        dispatches,
        has_host: has_host(plan),
        tail,
        runs,
    }
}

/// Whether plan step `i` runs as soon as its inputs exist (`eager`): a convolution's
/// kernel gradient, which reads two tensors of activation size and makes one of weight
/// size.
fn runs_eagerly(plan: &Plan, i: usize) -> bool {
    matches!(plan.steps[i], Step::Compute) && matches!(plan.nodes[i].op(), Op::ConvKernelGrad(_))
}

/// `items` with each item that `runs_eagerly` moved up to right after the last item that
/// makes one of its inputs, the constants it reads with it.
///
/// The plan's order is a depth-first walk from its targets, which places a node just
/// before its first reader: a Keras training function reads its gradients in its updates,
/// so every kernel gradient of a convolutional network waited for the whole backward
/// pass, holding each layer's output gradient that long, and read it back from memory.
/// Moved up, it reads that gradient right after the batch norm's backward group wrote it,
/// next to the input gradient that reads it too, and the gradient is released there.
fn eager(plan: &Plan, items: Vec<Item>) -> Vec<Item> {
    let n = plan.nodes.len();
    let mut made = vec![None; n];
    for (t, item) in items.iter().enumerate() {
        for j in item.writes() {
            made[j] = Some(t);
        }
    }
    let constant =
        |t: usize| matches!(&items[t], Item::Node(h) if matches!(plan.steps[*h], Step::Folded(_)));
    let eager_at = |t: usize| matches!(&items[t], Item::Node(i) if runs_eagerly(plan, *i));
    // after[s]: the eager items placed right after item s, with the constants they read.
    let mut after: Vec<Vec<(usize, Vec<usize>)>> = vec![Vec::new(); items.len()];
    let mut moved = vec![false; items.len()];
    for (t, item) in items.iter().enumerate() {
        let Item::Node(i) = item else { continue };
        if !runs_eagerly(plan, *i) {
            continue;
        }
        let producers: Vec<usize> = plan.inputs[*i].iter().filter_map(|&j| made[j]).collect();
        let (consts, others): (Vec<usize>, Vec<usize>) =
            producers.into_iter().partition(|&p| constant(p));
        if others.iter().any(|&p| eager_at(p) || p >= t) {
            continue;
        }
        let Some(last) = others.into_iter().max() else {
            continue;
        };
        if last + 1 < t {
            moved[t] = true;
            after[last].push((t, consts));
        }
    }
    if !moved.contains(&true) {
        return items;
    }
    let mut slots: Vec<Option<Item>> = items.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(slots.len());
    for s in 0..slots.len() {
        if !moved[s] {
            out.extend(slots[s].take());
        }
        for (t, consts) in std::mem::take(&mut after[s]) {
            out.extend(consts.into_iter().filter_map(|c| slots[c].take()));
            out.push(slots[t].take().expect("an eager item is placed once"));
        }
    }
    out
}

/// Most members one recomputed value is computed from.
const MAX_RECOMPUTE: usize = 8;
/// Elements below which a value of known shape is not recomputed: it stays in the L2
/// cache between its writer and its readers, where reading it back costs less than
/// computing it again.
const MIN_RECOMPUTE: usize = 1 << 19;
/// Relative costs per element, in adds (`Op::cost`, an instruction's cost): reading a
/// tensor from memory, writing one (the line is read first, then written back).
const READ_COST: usize = 2;
const WRITE_COST: usize = 4;

/// Members of groups computed again by the groups that read them (`Target::recompute`),
/// from inputs those groups read anyway or read instead, where that moves less memory:
/// per group, the members of other groups it computes (`clones`); per node, whether its
/// own group no longer writes it (`gone`, every reader computes it) and whether a
/// recomputed value reads it from memory (`pinned`: it stays written).
///
/// Batch norm in training with relu6: the forward pass wrote the output `x̂·γ + β`, its
/// relu and the relu6, and relu6's gradient read the first two back; it computes them from
/// the centred input and the scale, which it reads anyway, and only the relu6 is written.
struct Recomputed {
    clones: Vec<Vec<usize>>,
    gone: Vec<bool>,
    pinned: Vec<bool>,
}

fn recompute(
    plan: &Plan,
    t: &Target,
    users: &[Vec<usize>],
    is_output: &[bool],
    group: &[Option<usize>],
    groups: &[Vec<usize>],
    view: &dyn Fn(usize) -> bool,
) -> Recomputed {
    let n = plan.nodes.len();
    let mut r = Recomputed {
        clones: vec![Vec::new(); groups.len()],
        gone: vec![false; n],
        pinned: vec![false; n],
    };
    if !t.recompute {
        return r;
    }
    // A shape not known here (a batch dim) is taken to be large.
    let small = |j: usize| {
        plan.nodes[j]
            .shape()
            .to_known()
            .is_some_and(|s| s.iter().product::<usize>() < MIN_RECOMPUTE)
    };
    for j in 0..n {
        let Some(a) = group[j] else { continue };
        if view(j) || is_output[j] || r.pinned[j] || small(j) {
            continue;
        }
        let has =
            |r: &Recomputed, g: usize, i: usize| group[i] == Some(g) || r.clones[g].contains(&i);
        // The groups that read j: every reader is a member (or a copy) in a group.
        let outside: Vec<usize> = users[j]
            .iter()
            .copied()
            .filter(|&u| !has(&r, a, u))
            .collect();
        if outside.is_empty() || outside.iter().any(|&u| group[u].is_none()) {
            continue;
        }
        let mut readers: Vec<usize> = Vec::new();
        for &u in &outside {
            let gs = (0..groups.len()).filter(|&g| has(&r, g, u) && g != a);
            for g in gs {
                if !readers.contains(&g) {
                    readers.push(g);
                }
            }
        }
        if readers.iter().any(|&b| groups[b].iter().any(|&m| view(m)))
            || readers.iter().any(|&b| {
                !outside.iter().any(|&u| {
                    has(&r, b, u) && compatible(plan.nodes[u].shape(), plan.nodes[j].shape())
                })
            })
        {
            continue;
        }
        // The members of `a` (or copies in it) that j is computed from.
        let mut cone = vec![j];
        let mut k = 0;
        let mut leaves: Vec<usize> = Vec::new();
        while k < cone.len() && cone.len() <= MAX_RECOMPUTE {
            let m = cone[k];
            k += 1;
            for i in data_inputs(plan, m) {
                if has(&r, a, i) && !view(i) {
                    if !cone.contains(&i) {
                        cone.push(i);
                    }
                } else if !leaves.contains(&i) {
                    leaves.push(i);
                }
            }
        }
        if cone.len() > MAX_RECOMPUTE || cone.iter().any(|&m| view(m)) {
            continue;
        }
        // Members of the cone that `a` writes (read outside it) whose every reader
        // outside `a` is in a reader group: `a` stops writing them.
        let in_readers = |r: &Recomputed, u: usize| readers.iter().any(|&b| has(r, b, u));
        let dropped: Vec<usize> = cone
            .iter()
            .copied()
            .filter(|&m| {
                group[m] == Some(a)
                    && !is_output[m]
                    && !r.pinned[m]
                    && users[m].iter().any(|&u| !has(&r, a, u))
                    && users[m].iter().all(|&u| has(&r, a, u) || in_readers(&r, u))
            })
            .collect();
        if !dropped.contains(&j) {
            continue;
        }
        // Each reader: the values of the cone it no longer reads, the tensors it reads
        // instead, the instructions it adds; leaves it reads must stay written.
        let full = |i: usize| compatible(plan.nodes[i].shape(), plan.nodes[j].shape());
        let mut gain = (dropped.len() * WRITE_COST) as isize;
        let mut ok = true;
        for &b in &readers {
            let reads_b = |i: usize| {
                groups[b]
                    .iter()
                    .chain(&r.clones[b])
                    .any(|&m| data_inputs(plan, m).any(|x| x == i))
            };
            let saved = cone
                .iter()
                .filter(|&&m| !has(&r, b, m) && reads_b(m))
                .count();
            let added: usize = cone
                .iter()
                .filter(|&&m| !has(&r, b, m))
                .map(|&m| plan.nodes[m].op().cost().max(1))
                .sum();
            let anew: Vec<usize> = leaves
                .iter()
                .copied()
                .filter(|&i| !has(&r, b, i) && full(i) && !reads_b(i))
                .collect();
            let extra = anew.len();
            ok &= leaves.iter().all(|&i| has(&r, b, i) || !r.gone[i]);
            // A tensor of the value's size is read anew only where it is written and read
            // outside `a` already: a convolution's output that only `a` reads would lose
            // its epilogue, a dropout's random values would stay alive (the Keras CNN step
            // 13% slower); batch norm's input, read by its mean too, is read again in
            // place of the centred input.
            ok &= anew.iter().all(|&i| {
                users[i].iter().any(|&u| {
                    group[u] != Some(a)
                        && !matches!(plan.nodes[u].op(), Op::ShapeOf)
                        && data_inputs(plan, u).any(|x| x == i)
                })
            });
            ok &= groups[b].len() + r.clones[b].len() + added <= t.max_members;
            gain += (saved * READ_COST) as isize - (extra * READ_COST + added) as isize;
        }
        // `a` still writes a member that something else reads.
        let keeps = groups[a].iter().any(|&m| {
            !dropped.contains(&m)
                && !r.gone[m]
                && (is_output[m] || r.pinned[m] || users[m].iter().any(|&u| !has(&r, a, u)))
        });
        if !ok || !keeps || gain <= 0 {
            continue;
        }
        for &b in &readers {
            for &m in &cone {
                if !has(&r, b, m) {
                    r.clones[b].push(m);
                }
            }
            for &i in &leaves {
                if !has(&r, b, i) {
                    r.pinned[i] = true;
                }
            }
        }
        for m in dropped {
            r.gone[m] = true;
        }
    }
    r
}

/// Hands each f32 producer of the target's kinds (`Target::epilogues`: a forward
/// convolution, pooling or pooling gradient, a matrix product) that one fused group of
/// its shape reads (a bias add and activation, a dropout mask, an activation's gradient;
/// otherwise only `shape` reads it) to that group (`Group::first`), out of the schedule:
/// on the CPU the group then runs image by image right after the node writes each image,
/// instead of reading the whole result back from memory (the CNN's `[64, 24, 24, 64]`
/// add-relu pass took 1.2-1.5 ms of a 35 ms step); on the GPU the producer's kernel
/// computes the group as it stores each element, one dispatch for both.
fn epilogues(
    plan: &Plan,
    t: &Target,
    users: &[Vec<usize>],
    is_output: &[bool],
    items: &mut Vec<Item>,
) {
    let mut taken = Vec::new();
    for item in items.iter_mut() {
        let Item::Group(g) = item else { continue };
        // Shapes are checked again at run time (`fused::run`). Besides the group, only
        // `shape` may read the result (a gradient's `sum_to` target), after the group.
        let shape = plan.nodes[g.outputs[0]].shape();
        let last = *g.members.last().expect("a group has members");
        let fits = |j: usize| {
            Producer::of(plan.nodes[j].op()).is_some_and(|p| t.epilogues.contains(&p))
                && matches!(plan.steps[j], Step::Compute)
                && plan.nodes[j].dtype() == DType::F32
                && compatible(plan.nodes[j].shape(), shape)
                && !is_output[j]
                && users[j].iter().all(|&u| {
                    g.members.contains(&u)
                        || (matches!(plan.nodes[u].op(), Op::ShapeOf) && u > last)
                })
        };
        g.first = g.ext.iter().copied().find(|&j| fits(j));
        taken.extend(g.first);
    }
    items.retain(|item| !matches!(item, Item::Node(i) if taken.contains(i)));
}

/// Hands each f32 pooling, or maximum or minimum over axes other than the batch axis,
/// whose only input is the one output of a group run after a convolution
/// (`Group::first`), and which is that output's only reader, to the group
/// (`Group::pooled`), out of the schedule. Returns the launches saved.
fn pooled(plan: &Plan, users: &[Vec<usize>], is_output: &[bool], items: &mut Vec<Item>) -> usize {
    let mut taken = Vec::new();
    for item in items.iter_mut() {
        let Item::Group(g) = item else { continue };
        let (Some(f), [o]) = (g.first, g.outputs.as_slice()) else {
            continue;
        };
        if !matches!(plan.nodes[f].op(), Op::Conv(_))
            || !g.folds.is_empty()
            || !g.hidden.is_empty()
            || is_output[*o]
        {
            continue;
        }
        let [p] = users[*o].as_slice() else { continue };
        let p = *p;
        let per_image = match plan.nodes[p].op() {
            Op::Pool(_) => true,
            // A global max (or min) pooling: a reduction that keeps the batch axis.
            Op::Reduce { op, axes, .. } => {
                matches!(op, crate::ops::ReduceOp::Max | crate::ops::ReduceOp::Min)
                    && !axes.is_empty()
                    && !axes.contains(&0)
                    && axes.windows(2).all(|a| a[1] == a[0] + 1)
            }
            _ => false,
        };
        if per_image
            && matches!(plan.steps[p], Step::Compute)
            && plan.nodes[p].dtype() == DType::F32
            && plan.inputs[p].as_slice() == [*o]
        {
            g.pooled = Some(p);
            taken.push(p);
        }
    }
    items.retain(|item| !matches!(item, Item::Node(i) if taken.contains(i)));
    taken.len()
}

/// Turns each single-add group `acc + mm` (either operand order) whose `mm` is an f32
/// matrix product (2-D operands, B not transposed) read by nothing else into an
/// `Item::MatAcc` run where the add was, the product's own item removed. A Keras LSTM's
/// VJP body adds `xᵀ·dz` and `hᵀ·dz` into its gradient accumulators at every step (its
/// forward body's `x·W + h·U` joins the bias add's group and stays as it is). Returns the
/// launches saved.
fn accumulations(
    plan: &Plan,
    users: &[Vec<usize>],
    is_output: &[bool],
    items: &mut Vec<Item>,
) -> usize {
    let product = |j: usize| {
        matches!(plan.nodes[j].op(), Op::MatMul { tb: false, .. })
            && matches!(plan.steps[j], Step::Compute)
            && plan.nodes[j].dtype() == DType::F32
            && plan.nodes[j].rank() == 2
            && plan.inputs[j].iter().all(|&i| plan.nodes[i].rank() == 2)
            && !is_output[j]
            && users[j].len() == 1
    };
    let mut moved = Vec::new();
    for item in items.iter_mut() {
        let Item::Group(g) = item else { continue };
        let &[add] = g.members.as_slice() else {
            continue;
        };
        if g.first.is_some()
            || !matches!(plan.nodes[add].op(), Op::Binary(crate::ops::BinaryOp::Add))
            || plan.nodes[add].dtype() != DType::F32
        {
            continue;
        }
        let &[p, q] = plan.inputs[add].as_slice() else {
            continue;
        };
        let shape = plan.nodes[add].shape();
        let pick = [(q, p), (p, q)].into_iter().find(|&(mm, acc)| {
            mm != acc
                && product(mm)
                && !moved.contains(&mm)
                && compatible(plan.nodes[acc].shape(), shape)
                && compatible(plan.nodes[mm].shape(), shape)
                && plan.nodes[acc].dtype() == DType::F32
        });
        if let Some((mm, acc)) = pick {
            moved.push(mm);
            *item = Item::MatAcc { mm, add, acc };
        }
    }
    items.retain(|item| !matches!(item, Item::Node(i) if moved.contains(i)));
    moved.len()
}

/// Most folds one group carries.
const MAX_FOLDS: usize = 4;

/// Hands each f32 sum or mean (`Op::Reduce` or `Op::SumTo`) of a member of a fused group,
/// of the group's shape, to that group (`Group::folds`), out of the schedule, when its
/// other inputs are ready before the group runs and its readers run after it. A member
/// read by nothing else then stays hidden: tiles of it live in cache only. Batch norm's
/// variance `mean(square(x - m))` and gradients `sum_to(dy * (x - m))`, `sum_to(-dx)`
/// had each been a pass writing a `[64, 32, 32, 32]` tensor and another reading it back.
/// Whether a fold runs fused is decided at run time from the shapes (`fused::fold_run`).
/// Returns the launches saved.
fn folds(plan: &Plan, users: &[Vec<usize>], is_output: &[bool], items: &mut Vec<Item>) -> usize {
    let n = plan.nodes.len();
    let mut pos = vec![usize::MAX; n];
    for (t, item) in items.iter().enumerate() {
        match item {
            Item::Node(i) => pos[*i] = t,
            Item::MatAcc { mm, add, .. } => {
                pos[*mm] = t;
                pos[*add] = t;
            }
            Item::Group(_) | Item::Update(_) => {
                // A member computed again in a later group (`recompute`) stands where
                // its own group does.
                let g = item.group().expect("a group item");
                g.members.iter().chain(&g.first).for_each(|&m| {
                    if pos[m] == usize::MAX {
                        pos[m] = t
                    }
                })
            }
        }
    }
    let reducible = |r: usize| {
        matches!(
            plan.nodes[r].op(),
            Op::Reduce {
                op: crate::ops::ReduceOp::Sum | crate::ops::ReduceOp::Mean,
                ..
            } | Op::SumTo
        ) && matches!(plan.steps[r], Step::Compute)
            && plan.nodes[r].dtype() == DType::F32
    };
    // Whether input `j` of a fold is computed before item `t` runs: folded or fed, placed
    // before it, or a shape of a tensor placed before it (then moved ahead: `hoisted`).
    let mut hoisted: Vec<(usize, usize)> = Vec::new();
    let ready = |pos: &[usize], j: usize, t: usize| {
        matches!(plan.steps[j], Step::Folded(_) | Step::Fed(_))
            || pos[j] < t
            || (matches!(plan.nodes[j].op(), Op::ShapeOf)
                && plan.inputs[j].iter().all(|&k| pos[k] < t))
    };
    let mut moved = Vec::new();
    for r in 0..n {
        if !reducible(r) {
            continue;
        }
        let m = plan.inputs[r][0];
        let t = pos[m];
        let Some(Item::Group(g)) = items.get_mut(t) else {
            continue;
        };
        let shape = plan.nodes[g.written().next().unwrap_or(m)].shape().clone();
        let ok = g.members.contains(&m)
            && g.folds.len() < MAX_FOLDS
            && plan.nodes[m].dtype() == DType::F32
            && compatible(plan.nodes[m].shape(), &shape)
            && plan.inputs[r][1..].iter().all(|&j| ready(&pos, j, t))
            && users[r].iter().all(|&u| pos[u] > t && pos[u] != usize::MAX);
        if ok {
            g.folds.push(Fold { node: r, member: m });
            g.cost += 1;
            moved.push(r);
            pos[r] = t;
            // A target shape read off a tensor computed before the group (a gradient's
            // `sum_to` placed right after its producer) moves ahead of the group.
            for &j in &plan.inputs[r][1..] {
                if pos[j] > t && !hoisted.iter().any(|&(h, _)| h == j) {
                    hoisted.push((j, t));
                }
            }
        }
    }
    if !hoisted.is_empty() {
        let old = std::mem::take(items);
        for (t, item) in old.into_iter().enumerate() {
            for &(j, _) in hoisted.iter().filter(|&&(_, at)| at == t) {
                items.push(Item::Node(j));
            }
            if !matches!(item, Item::Node(i) if hoisted.iter().any(|&(h, _)| h == i)) {
                items.push(item);
            }
        }
    }
    for item in items.iter_mut() {
        let Item::Group(g) = item else { continue };
        if g.folds.is_empty() {
            continue;
        }
        let inside = |u: usize| g.members.contains(&u) || g.fold_nodes().any(|r| r == u);
        let reduced: Vec<usize> = g.folds.iter().map(|f| f.member).collect();
        let kept = |o: usize| {
            !reduced.contains(&o) || is_output[o] || users[o].iter().any(|&u| !inside(u))
        };
        let (outputs, hidden): (Vec<usize>, Vec<usize>) = g.outputs.iter().partition(|&&o| kept(o));
        g.outputs = outputs;
        g.hidden = hidden;
    }
    items.retain(|item| !matches!(item, Item::Node(i) if moved.contains(i)));
    moved.len()
}

/// Whether `item` cannot fail at run time once its inputs are computed: folded values,
/// feeds, variable reads, and elementwise nodes and fused groups whose every value has a
/// static shape (broadcasting was checked when the graph was built; the kernels report
/// nothing else), the groups' outputs of one shape (so the fusion kernel runs them).
fn infallible(plan: &Plan, item: &Item) -> bool {
    let fixed = |j: usize| {
        plan.nodes[j]
            .shape()
            .to_known()
            .is_some_and(|s| s.len() <= 16)
    };
    let elementwise = |i: usize| {
        matches!(plan.nodes[i].op().class(), Class::Elementwise(_))
            && fixed(i)
            && data_inputs(plan, i).all(fixed)
    };
    match item {
        Item::Group(_) | Item::Update(_) => {
            let g = item.group().expect("a group item");
            let shape = |o: &usize| plan.nodes[*o].shape().to_known();
            g.first.is_none()
                && g.folds.is_empty()
                && g.members.iter().all(|&m| elementwise(m))
                && g.outputs.iter().all(|o| shape(o) == shape(&g.outputs[0]))
        }
        Item::Node(i) => match plan.steps[*i] {
            Step::Folded(_) | Step::Fed(_) => true,
            Step::Compute => matches!(plan.nodes[*i].op(), Op::Variable(_)) || elementwise(*i),
        },
        Item::MatAcc { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{schedule, Item, Schedule, Target};
    use crate::base::dtype::DType;
    use crate::base::shape::Shape;
    use crate::compile::Plan;
    use crate::ops::build::reduce;
    use crate::ops::build::{add, mul, sub, unary};
    use crate::ops::graph::Tensor;
    use crate::ops::source::placeholder;
    use crate::ops::{ReduceOp, UnaryOp};

    fn ph(name: &str, dims: &[usize]) -> Tensor {
        let dims = dims.iter().map(|&d| Some(d)).collect();
        placeholder(name, Shape(dims), DType::F32, None).unwrap()
    }

    fn groups(s: &Schedule) -> Vec<&super::Group> {
        s.items.iter().filter_map(Item::group).collect()
    }

    fn gpu(max_buffers: usize) -> Target {
        Target::gpu(&[DType::F32, DType::I32, DType::Bool], max_buffers)
    }

    #[test]
    fn a_member_joins_the_reader_that_broadcasts_it_where_the_target_allows() {
        // y = x + exp(w), w of shape [5] broadcast over x's [3, 5].
        let (x, w) = (ph("x", &[3, 5]), ph("w", &[5]));
        let y = add(&x, &unary(UnaryOp::Exp, &w).unwrap()).unwrap();
        let plan = Plan::new(&[x, w], &[y]).unwrap();
        let g = schedule(&plan, &gpu(usize::MAX));
        assert_eq!(groups(&g).len(), 1);
        assert_eq!(groups(&g)[0].members.len(), 2);
        assert_eq!(g.target, gpu(usize::MAX));
        let c = schedule(&plan, &Target::cpu(true));
        assert_eq!(groups(&c).len(), 2);
    }

    #[test]
    fn a_broadcast_member_read_elsewhere_stays_out() {
        // e = exp(w) is also returned, so it cannot be computed per element of [3, 5].
        let (x, w) = (ph("x", &[3, 5]), ph("w", &[5]));
        let e = unary(UnaryOp::Exp, &w).unwrap();
        let y = add(&x, &e).unwrap();
        let plan = Plan::new(&[x, w], &[y, e]).unwrap();
        let g = schedule(&plan, &gpu(usize::MAX));
        assert_eq!(groups(&g).len(), 2);
        assert!(groups(&g).iter().all(|g| g.members.len() == 1));
    }

    #[test]
    fn a_group_writes_each_value_read_after_it() {
        // t = x * x feeds both returned values: one group, three outputs.
        let x = ph("x", &[4]);
        let t = mul(&x, &x).unwrap();
        let a = unary(UnaryOp::Exp, &t).unwrap();
        let b = add(&t, &x).unwrap();
        let plan = Plan::new(&[x], &[a, b, t]).unwrap();
        let g = schedule(&plan, &gpu(usize::MAX));
        let gs = groups(&g);
        assert_eq!(gs.len(), 1);
        assert_eq!(gs[0].members.len(), 3);
        assert_eq!(gs[0].outputs.len(), 3);
    }

    #[test]
    fn a_group_binds_no_more_buffers_than_the_target_has() {
        // x0 + x1 + ... + x7: eight inputs and one output.
        let xs: Vec<Tensor> = (0..8).map(|k| ph(&format!("x{k}"), &[6])).collect();
        let mut y = xs[0].clone();
        for x in &xs[1..] {
            y = add(&y, x).unwrap();
        }
        let plan = Plan::new(&xs, &[y]).unwrap();
        assert_eq!(groups(&schedule(&plan, &gpu(usize::MAX))).len(), 1);
        for limit in [3, 4, 6] {
            let s = schedule(&plan, &gpu(limit));
            let gs = groups(&s);
            assert!(gs.len() > 1, "limit {limit}");
            for g in &gs {
                assert!(g.ext.len() + g.outputs.len() <= limit, "limit {limit}");
            }
            assert_eq!(
                gs.iter().map(|g| g.members.len()).sum::<usize>(),
                7,
                "limit {limit}"
            );
        }
    }

    #[test]
    fn a_gpu_group_runs_in_the_kernel_of_the_product_it_reads() {
        // relu(x @ w + b): on the GPU the group {add, relu} takes the product as its first
        // and the product leaves the schedule; the CPU runs no product epilogue.
        let (x, w, b) = (ph("x", &[3, 4]), ph("w", &[4, 5]), ph("b", &[5]));
        let mm = crate::ops::matmul::matmul(&x, &w, false, false).unwrap();
        let y = unary(UnaryOp::Relu, &add(&mm, &b).unwrap()).unwrap();
        let plan = Plan::new(&[x, w, b], &[y]).unwrap();
        let product = |s: &Schedule| {
            s.items.iter().any(
                |i| matches!(i, Item::Node(j) if matches!(plan.nodes[*j].op(), crate::ops::Op::MatMul { .. })),
            )
        };
        let g = schedule(&plan, &gpu(usize::MAX));
        let gs = groups(&g);
        assert_eq!(gs.len(), 1);
        assert!(gs[0].first.is_some());
        assert!(!product(&g));
        let c = schedule(&plan, &Target::cpu(true));
        assert!(groups(&c).iter().all(|g| g.first.is_none()));
        assert!(product(&c));
    }

    #[test]
    fn a_dense_relu_layer_in_training_writes_only_the_relu_output() {
        // relu(x @ w + b) with the gradients of w and b: the relu's gradient reads its
        // output, so the group {add, relu} writes the relu's result alone; the sum before
        // it, which the mask would otherwise read, gets no buffer.
        let (x, w, b) = (ph("x", &[8, 4]), ph("w", &[4, 5]), ph("b", &[5]));
        let mm = crate::ops::matmul::matmul(&x, &w, false, false).unwrap();
        let y = unary(UnaryOp::Relu, &add(&mm, &b).unwrap()).unwrap();
        let loss = reduce(ReduceOp::Sum, &mul(&y, &y).unwrap(), &[0, 1], false).unwrap();
        let grads: Vec<Tensor> = crate::autodiff::gradients(&loss, &[w.clone(), b.clone()], None)
            .unwrap()
            .into_iter()
            .map(Option::unwrap)
            .collect();
        let plan = Plan::new(&[x, w, b], &[vec![loss], grads].concat()).unwrap();
        let relu = (0..plan.nodes.len())
            .find(|&j| matches!(plan.nodes[j].op(), crate::ops::Op::Unary(UnaryOp::Relu)))
            .unwrap();
        let c = schedule(&plan, &Target::cpu(true));
        let forward = groups(&c)
            .into_iter()
            .find(|g| g.members.contains(&relu))
            .unwrap();
        assert_eq!(forward.outputs, [relu]);
    }

    #[test]
    fn a_group_computing_a_product_whose_shape_is_read_keeps_its_place() {
        // y = relu(x @ w + b) and s = shape(x @ w) are both returned: the group computes
        // the product in its kernel, so it must run before `shape` reads the product,
        // not move to the end with the groups nothing reads.
        let (x, w, b) = (ph("x", &[3, 4]), ph("w", &[4, 5]), ph("b", &[5]));
        let mm = crate::ops::matmul::matmul(&x, &w, false, false).unwrap();
        let y = unary(UnaryOp::Relu, &add(&mm, &b).unwrap()).unwrap();
        let s = Tensor::new(crate::ops::Op::ShapeOf, vec![mm.clone()]).unwrap();
        let plan = Plan::new(&[x, w, b], &[y, s]).unwrap();
        let g = schedule(&plan, &gpu(usize::MAX));
        let at = |pred: &dyn Fn(&Item) -> bool| g.items.iter().position(pred).unwrap();
        let group = at(&|i| i.group().is_some_and(|g| g.first.is_some()));
        let shape = at(
            &|i| matches!(i, Item::Node(j) if matches!(plan.nodes[*j].op(), crate::ops::Op::ShapeOf)),
        );
        assert!(
            group < shape,
            "the group runs at {group}, shape reads at {shape}"
        );
    }

    #[test]
    fn groups_nothing_reads_form_runs_within_the_buffer_limit() {
        // Three returned values, each a group of its own reading one input: one run where
        // six buffers fit, runs of at most two groups where four do, none on the CPU.
        let xs: Vec<Tensor> = (0..3).map(|k| ph(&format!("x{k}"), &[k + 2])).collect();
        let ys: Vec<Tensor> = xs
            .iter()
            .map(|x| unary(UnaryOp::Exp, &mul(x, x).unwrap()).unwrap())
            .collect();
        let plan = Plan::new(&xs, &ys).unwrap();
        assert_eq!(schedule(&plan, &gpu(6)).runs.len(), 1);
        let s = schedule(&plan, &gpu(4));
        assert!(!s.runs.is_empty());
        for r in &s.runs {
            assert!(r.len() == 2);
            assert!(s.items[r.clone()].iter().all(|i| i.group().is_some()));
        }
        assert!(schedule(&plan, &Target::cpu(true)).runs.is_empty());
    }

    #[test]
    fn a_gpu_group_folds_its_sums_and_hides_what_only_they_read() {
        // s = sum(exp(x * x), 0) and m = mean(x * x, 1): both reductions leave the schedule
        // for the group's folds; exp(x * x) is read by its sum alone (hidden), x * x is
        // also returned (an output).
        let x = ph("x", &[6, 5]);
        let t = mul(&x, &x).unwrap();
        let e = unary(UnaryOp::Exp, &t).unwrap();
        let red = |op, v: &Tensor, axis: usize| {
            crate::ops::reduce::reduce(op, v, &[axis], false).unwrap()
        };
        let s = red(crate::ops::ReduceOp::Sum, &e, 0);
        let m = red(crate::ops::ReduceOp::Mean, &t, 1);
        let plan = Plan::new(&[x], &[s, m, t]).unwrap();
        let g = schedule(&plan, &gpu(usize::MAX));
        let reduces = g.items.iter().filter(|i| {
            matches!(i, Item::Node(j) if matches!(plan.nodes[*j].op(), crate::ops::Op::Reduce { .. }))
        });
        assert_eq!(reduces.count(), 0, "{:?}", g.items);
        let gs = groups(&g);
        assert_eq!(gs.len(), 1);
        assert_eq!(gs[0].folds.len(), 2);
        assert_eq!(gs[0].hidden.len(), 1);
        assert_eq!(gs[0].outputs.len(), 1);
    }

    #[test]
    fn a_later_group_computes_again_what_it_would_read_back() {
        // a = {p = x * w, r = relu(p), y = exp(r)}; y goes through a sum (not fused), and
        // b = {q = x * s, q + p + r} reads p and r: b computes them again from x (which it
        // reads anyway) and w (broadcast), and a writes only y. Not where x is small.
        for (rows, again) in [(64, true), (4, false)] {
            let (x, w) = (ph("x", &[rows, 8192]), ph("w", &[8192]));
            let p = mul(&x, &w).unwrap();
            let r = unary(UnaryOp::Relu, &p).unwrap();
            let y = unary(UnaryOp::Exp, &r).unwrap();
            let s = reduce(ReduceOp::Sum, &y, &[0, 1], false).unwrap();
            let q = mul(&x, &s).unwrap();
            let o = add(&add(&q, &p).unwrap(), &r).unwrap();
            let plan = Plan::new(&[x.clone(), w.clone()], &[o.clone(), y.clone()]).unwrap();
            let slot = |t: &Tensor| {
                let ids = plan.nodes.iter().position(|n| n.id() == t.id());
                ids.expect("a node of the plan")
            };
            let s = schedule(&plan, &Target::cpu(true));
            let gs = groups(&s);
            assert_eq!(gs.len(), 2);
            let b_members = if again { 5 } else { 3 };
            assert_eq!(gs[1].members.len(), b_members);
            assert_eq!(gs[1].outputs, vec![slot(&o)]);
            if again {
                assert_eq!(gs[0].outputs, vec![slot(&y)]);
                assert!(!gs[1].ext.contains(&slot(&p)) && !gs[1].ext.contains(&slot(&r)));
            } else {
                assert_eq!(gs[0].outputs.len(), 3);
            }
            // Where `p` is returned too, `a` writes it, and `b` computes it still to
            // compute `r`.
            let plan = Plan::new(&[x, w], &[o, y, p]).unwrap();
            let s = schedule(&plan, &Target::cpu(true));
            assert_eq!(groups(&s)[1].members.len(), b_members);
            assert_eq!(groups(&s)[0].outputs.len(), if again { 2 } else { 3 });
            // The GPU target computes nothing twice.
            let g = schedule(&plan, &gpu(usize::MAX));
            let members: Vec<usize> = groups(&g).iter().flat_map(|g| g.members.clone()).collect();
            assert!((0..members.len()).all(|k| !members[k + 1..].contains(&members[k])));
        }
    }

    #[test]
    fn a_recomputed_value_reads_anew_only_a_tensor_read_outside_its_group() {
        // a = {c = x - m, q = c * c} (q goes through a sum), b = {c * v} after the sum: b
        // computes c again from x where x is read by m's sum too (batch norm's input and
        // its mean), and reads c back where only a reads x (a convolution's output and its
        // epilogue: m a separate input).
        for read_elsewhere in [true, false] {
            let x = ph("x", &[64, 8192]);
            let mp = ph("m", &[1, 8192]);
            let m = if read_elsewhere {
                reduce(ReduceOp::Mean, &x, &[0], true).unwrap()
            } else {
                mp.clone()
            };
            let c = sub(&x, &m).unwrap();
            let q = mul(&c, &c).unwrap();
            let v = reduce(ReduceOp::Sum, &q, &[0], true).unwrap();
            let o = mul(&c, &v).unwrap();
            let plan = Plan::new(&[x.clone(), mp.clone()], std::slice::from_ref(&o)).unwrap();
            let slot = |t: &Tensor| {
                let ids = plan.nodes.iter().position(|n| n.id() == t.id());
                ids.expect("a node of the plan")
            };
            let s = schedule(&plan, &Target::cpu(true));
            let gs = groups(&s);
            let b = gs.last().expect("the reader's group");
            assert_eq!(b.outputs, vec![slot(&o)]);
            assert_eq!(b.ext.contains(&slot(&x)), read_elsewhere);
            assert_eq!(b.ext.contains(&slot(&c)), !read_elsewhere);
            assert_eq!(gs[0].outputs.contains(&slot(&c)), !read_elsewhere);
        }
    }

    #[test]
    fn an_unfused_target_schedules_every_node_alone() {
        let x = ph("x", &[4]);
        let y = unary(UnaryOp::Exp, &mul(&x, &x).unwrap()).unwrap();
        let plan = Plan::new(&[x], &[y]).unwrap();
        let s = schedule(&plan, &Target::cpu(false));
        assert!(groups(&s).is_empty());
        assert_eq!(s.dispatches, 2);
        assert_eq!(groups(&schedule(&plan, &Target::cpu(true))).len(), 1);
    }
}
