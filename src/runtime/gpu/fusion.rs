//! Fused elementwise kernels: the GPU lowering of the schedule's groups
//! (`compile::fuse::Group`, built for the GPU's target). A group becomes one generated
//! WGSL kernel over the elements of its outputs' shape: each external input is loaded
//! once per element (directly, as a scalar, as an inlined folded constant, or through
//! strides: broadcast operands, and slices no kernel wrote, read from the buffer they
//! are a slice of (`exec::Lazy`); a slice's gradient as its block, zero outside), then
//! each member is one `let` built from the op -> WGSL expression
//! tables of `ops::elementwise`, rounded to its dtype, and each output is written to a
//! buffer of its own, or through strides into its block of the buffer of the
//! concatenation that alone reads it (`operands_placed`). An input bound from the buffer
//! an output writes other words of (a loop state's history) is declared writable
//! (`writable`). A group that runs after a product or convolution it reads
//! (`Group::first`) is generated as that kernel's epilogue instead (`Epilogue`): the same
//! body as a function `epi(i, v)` that the kernel calls where it would store element `i`
//! of its result, so `relu(x @ w + b) * 2` is one dispatch. A group the kernel cannot run
//! as a whole (a member placed on the host, outputs whose shapes differ at run time) runs
//! member by member.
//!
//! int64 values are `vec2<u32>` (low word, high word) in the kernel and two words per
//! element in buffers, computed with the helpers of `shaders/int64.wgsl` by the ops
//! `Op::exact_int64` lists, with the CPU kernels' results bit for bit (`int64_unary`,
//! `int64_binary`, `cast_expr`). Groups touching int64 run as kernels of their own (not
//! as epilogues or in runs of update groups).

use super::exec::{grid, Exec, Lazy, Place, Slot};
use super::params::{self, Params, EPILOGUE_BINDING, EPILOGUE_WGSL, FUSED_WGSL};
use super::pipelines::{self, dtag, is_float, norm_fn, Pipe};
use super::transfer::{self, words_per};
use super::{pool, DTensor};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::broadcast_runtime;
use crate::compile::fuse::Group;
use crate::compile::Step;
use crate::ops::elementwise::{BinaryClass, BinaryOp, UnaryOp};
use crate::ops::{Class, FusedOp};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Same element count as the output: index i.
    Same,
    /// One element: index 0.
    Scalar,
    /// Strided: index through strides and an offset in the parameter tail (a broadcast
    /// operand, or a lazy slice read from the buffer it is a slice of, `exec::Lazy`).
    Bcast,
    /// A lazy slice gradient (`exec::Lazy::Pad`) of the kernel's shape: its gradient's
    /// element where the index lies in the block the tail gives, else zero.
    Pad,
    /// A folded scalar constant, passed in the parameter tail as its words (the second
    /// for int64 only). (Not a WGSL literal: drivers fold and reassociate literals,
    /// turning `(1 - p) + eps` into `(1 + eps) - p`.)
    Param([u32; 2]),
    /// The result of the kernel an epilogue runs in: the value it stores (`epi`'s `v`).
    Stored,
}

/// Where a generated body runs.
#[derive(Clone, Copy)]
enum Frame<'a> {
    /// A kernel of its own with entry point `entry`, its parameters `p` at binding 0.
    Kernel(&'a str),
    /// `fn epi(i, v)` in a product's or convolution's kernel, its parameters `ep` at
    /// `EPILOGUE_BINDING`.
    Epilogue,
}

impl Frame<'_> {
    /// The parameter block's name.
    fn params(self) -> &'static str {
        match self {
            Frame::Kernel(_) => "p",
            Frame::Epilogue => "ep",
        }
    }

    /// The binding of the first output (inputs follow the outputs).
    fn first_binding(self) -> u32 {
        match self {
            Frame::Kernel(_) => 1,
            Frame::Epilogue => EPILOGUE_BINDING + 1,
        }
    }
}

/// The int64 helpers of the generated kernels.
const INT64_WGSL: &str = include_str!("../../../shaders/int64.wgsl");

/// Whether any member of `members` or any of their inputs is int64.
fn touches_int64(ex: &Exec, members: &[usize]) -> bool {
    let plan = ex.plan;
    members
        .iter()
        .flat_map(|&m| plan.inputs[m].iter().copied().chain([m]))
        .any(|j| plan.nodes[j].dtype() == DType::I64)
}

fn fused_op(op: &crate::ops::Op) -> Result<FusedOp> {
    match op.class() {
        Class::Elementwise(f) => Ok(f),
        Class::Source | Class::Meta | Class::View(_) | Class::Kernel | Class::Host => Err(
            Error::Runtime(format!("internal: {} is not an elementwise op", op.name())),
        ),
    }
}

fn wty(d: DType) -> &'static str {
    match d {
        DType::I64 => "vec2<u32>",
        _ if is_float(d) => "f32",
        _ => "i32",
    }
}

/// The name of that type in generated helper names (`wty` is not an identifier for int64).
fn tname(d: DType) -> &'static str {
    match d {
        DType::I64 => "i64",
        _ if is_float(d) => "f32",
        _ => "i32",
    }
}

/// The WGSL expression of a unary op on an int64 `x` (`shaders/int64.wgsl`), for the ops
/// that take integers.
fn int64_unary(u: UnaryOp) -> Option<&'static str> {
    Some(match u {
        UnaryOp::Neg => "q_neg(x)",
        UnaryOp::Abs => "q_abs(x)",
        UnaryOp::Sign => "q_sign(x)",
        UnaryOp::Square => "q_mul(x, x)",
        UnaryOp::Relu => "q_relu(x)",
        UnaryOp::Round | UnaryOp::Floor | UnaryOp::Ceil => "x",
        UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Exp
        | UnaryOp::Expm1
        | UnaryOp::Elu
        | UnaryOp::Log
        | UnaryOp::Log1p
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Tan
        | UnaryOp::Tanh
        | UnaryOp::Sigmoid
        | UnaryOp::Recip
        | UnaryOp::Softplus
        | UnaryOp::Not => return None,
    })
}

/// The WGSL expression of a binary op on int64 `a`, `b` (predicates give an `i32` 0/1),
/// for the ops computed exactly (`Op::exact_int64`).
fn int64_binary(b: BinaryOp) -> Option<&'static str> {
    Some(match b {
        BinaryOp::Add => "q_add(a, b)",
        BinaryOp::Sub => "q_sub(a, b)",
        BinaryOp::Mul => "q_mul(a, b)",
        BinaryOp::Maximum => "q_max(a, b)",
        BinaryOp::Minimum => "q_min(a, b)",
        BinaryOp::Equal => "i32(q_eq(a, b))",
        BinaryOp::NotEqual => "i32(!q_eq(a, b))",
        BinaryOp::Less => "i32(q_lt(a, b))",
        BinaryOp::LessEqual => "i32(!q_lt(b, a))",
        BinaryOp::Greater => "i32(q_lt(b, a))",
        BinaryOp::GreaterEqual => "i32(!q_lt(a, b))",
        // Logical ops take bool operands only (`infer_binary`).
        BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Div
        | BinaryOp::FloorDiv
        | BinaryOp::Mod
        | BinaryOp::Pow => return None,
    })
}

/// C-order strides of `shape` seen from the right-aligned `out` shape; 0 on broadcast dims.
fn bcast_strides(shape: &[usize], out: &[usize]) -> Vec<u32> {
    let lead = out.len() - shape.len();
    let mut st = vec![0u32; out.len()];
    let mut acc = 1usize;
    for d in (0..shape.len()).rev() {
        st[lead + d] = if shape[d] == 1 { 0 } else { acc as u32 };
        acc *= shape[d];
    }
    st
}

/// WGSL converting `v` (of `from`'s compute type) to dtype `to`, before rounding.
fn cast_expr(from: DType, to: DType, v: &str) -> String {
    match (from, to) {
        (DType::I64, DType::I64) => return v.to_string(),
        (DType::I64, DType::F32 | DType::F64) => return format!("q_to_float({v}, 24u)"),
        (DType::I64, DType::F16) => return format!("q_to_float({v}, 11u)"),
        (DType::I64, DType::Bool) => return format!("i32(!q_eq({v}, vec2<u32>(0u)))"),
        (DType::I64, DType::I32 | DType::I16 | DType::I8 | DType::U8) => {
            return format!("bitcast<i32>({v}.x)")
        }
        (_, DType::I64) if is_float(from) => return format!("q_from_f32({v})"),
        (_, DType::I64) => return format!("q_from_i32({v})"),
        _ => {}
    }
    match (is_float(from), to) {
        (true, DType::F32 | DType::F16 | DType::F64) => v.to_string(),
        (true, DType::I32 | DType::I64) => format!("fk_f2i32({v})"),
        (true, DType::I16) => format!("fk_f2i({v}, -32768.0, 32767.0)"),
        (true, DType::I8) => format!("fk_f2i({v}, -128.0, 127.0)"),
        (true, DType::U8) => format!("fk_f2i({v}, 0.0, 255.0)"),
        (true, DType::Bool) => format!("i32(!({v} == 0.0))"),
        (false, DType::F32 | DType::F16 | DType::F64) => format!("f32({v})"),
        (false, DType::Bool) => format!("i32({v} != 0)"),
        (false, DType::I32 | DType::I64 | DType::I16 | DType::I8 | DType::U8) => v.to_string(),
    }
}

/// Records group `g` as one kernel (with the product or convolution it runs after, as
/// that kernel's epilogue, where it can), or member by member where it cannot run as a
/// whole.
pub(crate) fn record(ex: &mut Exec, g: &Group, feeds: &mut [Option<Slot>]) -> Result<()> {
    if !g.folds.is_empty() {
        return record_folded(ex, g, feeds);
    }
    if let Some(f) = g.first {
        let fused = ex.lay.place[f] == Place::Gpu && super::kernels::record_then(ex, f, g)?;
        if fused {
            return Ok(());
        }
        if ex.slots[f].is_none() {
            ex.step(f, feeds)?;
        }
    }
    record_written(ex, &g.members, &g.outputs, feeds)
}

/// Records `members` as one kernel writing `outputs` where it can run them as a whole
/// (every member on the device, the outputs of the last member's shape), else member by
/// member, keeping only the slots of `outputs`.
fn record_written(
    ex: &mut Exec,
    members: &[usize],
    outputs: &[usize],
    feeds: &mut [Option<Slot>],
) -> Result<()> {
    let whole = members.iter().all(|&m| ex.lay.place[m] == Place::Gpu) && {
        let shapes = member_shapes(ex, members)?;
        let last = members.last().expect("a group has members");
        outputs.iter().all(|o| shapes[o] == shapes[last])
    };
    if whole {
        return record_members(ex, members, outputs);
    }
    for &m in members {
        ex.step(m, feeds)?;
    }
    for &m in members {
        if !outputs.contains(&m) {
            ex.slots[m] = None;
        }
    }
    Ok(())
}

/// Records group `g` with its folds (`Group::folds`): one kernel computing the members,
/// writing the outputs and each fold's sum or mean (`fold_layout`, `generate_folded`)
/// where this run's shapes allow; else the group writes its hidden members too and each
/// fold runs as its own reduction, the hidden members released after. A group with a
/// producer (`Group::first`) runs after the producer's own kernel.
fn record_folded(ex: &mut Exec, g: &Group, feeds: &mut [Option<Slot>]) -> Result<()> {
    if let Some(f) = g.first {
        if ex.slots[f].is_none() {
            ex.step(f, feeds)?;
        }
    }
    let on_device = g
        .members
        .iter()
        .copied()
        .chain(g.fold_nodes())
        .all(|m| ex.lay.place[m] == Place::Gpu);
    if on_device {
        let shapes = member_shapes(ex, &g.members)?;
        let shape = shapes[g.members.last().expect("a group has members")].clone();
        if g.outputs.iter().all(|o| shapes[o] == shape) {
            if let Some(layout) = fold_layout(ex, g, &shapes, &shape) {
                if record_fold_kernel(ex, g, &shape, &layout)? {
                    return Ok(());
                }
            }
        }
    }
    let written: Vec<usize> = g.written().collect();
    record_written(ex, &g.members, &written, feeds)?;
    for f in &g.folds {
        ex.step(f.node, feeds)?;
    }
    for &h in &g.hidden {
        ex.slots[h] = None;
    }
    Ok(())
}

/// Workgroup size of the folding kernel (`generate_folded`), a power of two.
const FOLD_WG: usize = 256;
/// Most outputs (columns) one workgroup of the folding kernel adds up over leading axes.
const FOLD_COLUMNS: usize = 16;
/// Most elements one thread of the folding kernel adds up. The kernel has one thread per
/// `FOLD_WG / cb` rows of a column block, so a long reduction over few outputs (batch
/// norm's statistics over `[65536, 32]`: two workgroups, 4096 elements a thread) would
/// leave a GPU nearly idle where the group and a separate reduction spread the same work
/// over the whole device; such runs take that path. (Software rasterisers, Mesa llvmpipe,
/// also end a shader loop after 65535 iterations.)
const FOLD_STEPS: usize = 128;

/// How the folding kernel adds up the folds of one group run: each fold's result has
/// `nout` elements, element `o` the sum of the member at `o * ostride + r * rstride` for
/// `r` in `0..red` (leading axes reduced: `ostride` 1, `rstride` the kept block's size;
/// trailing axes: `ostride` `red`, `rstride` 1). A workgroup takes `cb` outputs, its
/// `FOLD_WG / cb` lanes per output splitting the `red` steps.
struct FoldLayout {
    nout: usize,
    red: usize,
    ostride: usize,
    rstride: usize,
    cb: usize,
    /// Per fold: its result's shape and the factor its sum is scaled by (1 / `red` for
    /// a mean).
    results: Vec<(Vec<usize>, f32)>,
}

/// The layout of `g`'s folds over its members of runtime `shapes` (the group's is
/// `shape`), or `None` where the folds run as reductions of their own: a member of
/// another shape (broadcast), a reduction of neither a leading nor a trailing block of
/// axes, folds of different layouts, an empty group, or more steps per thread than a
/// shader loop may take.
fn fold_layout(
    ex: &Exec,
    g: &Group,
    shapes: &HashMap<usize, Vec<usize>>,
    shape: &[usize],
) -> Option<FoldLayout> {
    let plan = ex.plan;
    let s = shape;
    let mut kind: Option<(bool, bool, usize, usize)> = None;
    let mut results = Vec::with_capacity(g.folds.len());
    for f in &g.folds {
        if shapes.get(&f.member).map(Vec::as_slice) != Some(s) {
            return None;
        }
        let target = plan.inputs[f.node]
            .get(1)
            .and_then(|&j| ex.slot(j).host.as_ref());
        let a = f.axes(plan, s, target)?;
        let k = (a.leading, a.trailing, a.kept, a.red);
        match kind {
            None => kind = Some(k),
            Some(prev) => {
                let (lead, trail) = (prev.0 && a.leading, prev.1 && a.trailing);
                if (prev.2, prev.3) != (k.2, k.3) || !(lead || trail) {
                    return None;
                }
                kind = Some((lead, trail, k.2, k.3));
            }
        }
        let scale = if a.mean {
            (1.0 / a.red as f64) as f32
        } else {
            1.0
        };
        results.push((a.out, scale));
    }
    let (leading, trailing, nout, red) = kind?;
    if nout == 0 || red == 0 || nout.checked_mul(red)? > u32::MAX as usize {
        return None;
    }
    let p2 = |n: usize| n.next_power_of_two().min(FOLD_WG);
    // Over trailing axes (or all of them) a workgroup takes whole rows, over leading ones
    // a block of adjacent columns, so neighbouring threads read neighbouring elements.
    let (ostride, rstride, cb) = if trailing && (!leading || nout == 1) {
        (red, 1, FOLD_WG / p2(red))
    } else if leading {
        (1, nout, p2(nout).min(FOLD_COLUMNS).max(FOLD_WG / p2(red)))
    } else {
        return None;
    };
    if red.div_ceil(FOLD_WG / cb) > FOLD_STEPS {
        return None;
    }
    Some(FoldLayout {
        nout,
        red,
        ostride,
        rstride,
        cb,
        results,
    })
}

/// Records the folding kernel of group `g` (members of shape `shape`, folds laid out as
/// `layout`) and puts its outputs and folds' results in their slots; false (nothing
/// recorded) where it would bind more storage buffers than the adapter allows.
fn record_fold_kernel(
    ex: &mut Exec,
    g: &Group,
    shape: &[usize],
    layout: &FoldLayout,
) -> Result<bool> {
    let n: usize = shape.iter().product();
    settle(ex, &g.members, n, true, None)?;
    let ext = ext_modes(ex, &g.members, n, None);
    let binds = ext
        .iter()
        .filter(|(_, m)| matches!(m, Mode::Same | Mode::Scalar | Mode::Bcast | Mode::Pad))
        .count();
    let limit = ex.ctx.limits.max_storage_buffers_per_shader_stage as usize;
    if 1 + g.outputs.len() + binds + g.folds.len() > limit {
        return Ok(false);
    }
    let (mut words, bound, outs) = operands(ex, &g.outputs, &ext, shape, Frame::Kernel(""))?;
    let rw = writable(&bound, &outs, Frame::Kernel(""), g.outputs.len());
    let key = (
        g.members
            .iter()
            .copied()
            .chain([usize::MAX])
            .chain(g.fold_nodes())
            .collect::<Vec<_>>(),
        mode_key(&ext, &rw),
    );
    let pipe = ex.generated_pipeline(key, "fused_fold", || generate_folded(ex, g, &ext, &rw))?;
    // The fold layout follows the tail's shape, strides and constants (`with_tail` pads
    // an empty tail with a word, which goes).
    let (mul, add) = block_words(&ext, 0);
    let tail = shape.len() * mul + add + param_words(ex, &ext);
    words
        .0
        .truncate(std::mem::size_of::<params::Fused>() / 4 + tail);
    let l = layout;
    words
        .0
        .extend([l.nout, l.red, l.ostride, l.rstride, l.cb].map(|w| w as u32));
    words
        .0
        .extend(l.results.iter().map(|(_, scale)| scale.to_bits()));
    let sums = g
        .folds
        .iter()
        .zip(&l.results)
        .map(|(f, (out, _))| ex.alloc(out, DType::F32, f.node))
        .collect::<Result<Vec<_>>>()?;
    let first_sum = 1 + (g.outputs.len() + ext.len()) as u32;
    let mut bufs: Vec<(u32, &DTensor)> = outs
        .iter()
        .enumerate()
        .map(|(k, t)| (1 + k as u32, t))
        .collect();
    bufs.extend(bound.iter().map(|(b, t)| (*b, t)));
    bufs.extend(
        sums.iter()
            .enumerate()
            .map(|(k, t)| (first_sum + k as u32, t)),
    );
    let wgs = l.nout.div_ceil(l.cb);
    let x = wgs.min(65535);
    let rw_binds = rw_bindings(&rw, Frame::Kernel(""), g.outputs.len());
    ex.dispatch_rw(
        pipe,
        &bufs,
        words,
        [x as u32, wgs.div_ceil(x) as u32, 1],
        &rw_binds,
    )?;
    drop(bufs);
    for (&o, t) in g.outputs.iter().zip(outs) {
        ex.slots[o] = Some(Slot::dev(t));
    }
    for (f, t) in g.folds.iter().zip(sums) {
        ex.slots[f.node] = Some(Slot::dev(t));
    }
    Ok(true)
}

/// A group of a run (`record_run`), the shape it computes and its inputs' modes.
type Segment<'g> = (&'g Group, Vec<usize>, Vec<(usize, Mode)>);

/// Records a run of groups that nothing reads (`Schedule::runs`: the optimizer's updates)
/// as one kernel over their concatenated index spaces: element `i` of the run belongs to
/// the group whose range holds it, which computes its element `i - start`. Each group
/// reads its own parameter block in the kernel's tail; an input read by several groups
/// (a learning rate) is bound once. Groups the kernel cannot run whole are recorded as
/// `record` does; the run stays within the adapter's storage-buffer limit (else the
/// groups run one kernel each).
pub(crate) fn record_run(ex: &mut Exec, gs: &[&Group], feeds: &mut [Option<Slot>]) -> Result<()> {
    let mut segs: Vec<Segment> = Vec::new();
    for &g in gs {
        let whole = g.first.is_none()
            && g.folds.is_empty()
            && g.hidden.is_empty()
            && g.members.iter().all(|&m| ex.lay.place[m] == Place::Gpu)
            && !touches_int64(ex, &g.members);
        let shape = if whole {
            let shapes = member_shapes(ex, &g.members)?;
            let last = &shapes[g.members.last().expect("a group has members")];
            g.outputs
                .iter()
                .all(|o| &shapes[o] == last)
                .then(|| last.clone())
        } else {
            None
        };
        match shape {
            Some(shape) => {
                let n = shape.iter().product();
                settle(ex, &g.members, n, false, None)?;
                let ext = ext_modes(ex, &g.members, n, None);
                segs.push((g, shape, ext));
            }
            None => record(ex, g, feeds)?,
        }
    }
    let mut inputs: Vec<usize> = Vec::new();
    for (_, _, ext) in &segs {
        for (j, m) in ext {
            if matches!(m, Mode::Same | Mode::Scalar | Mode::Bcast | Mode::Pad)
                && !inputs.contains(j)
            {
                inputs.push(*j);
            }
        }
    }
    let outputs: usize = segs.iter().map(|(g, _, _)| g.outputs.len()).sum();
    let limit = ex.ctx.limits.max_storage_buffers_per_shader_stage as usize;
    if segs.len() < 2 || 1 + outputs + inputs.len() > limit {
        for (g, _, _) in segs {
            record_members(ex, &g.members, &g.outputs)?;
        }
        return Ok(());
    }
    // Tail: the segments' element starts (k + 1 words), the word offset in the tail of
    // each segment's block, then the blocks (a `Fused` block and its tail each).
    let k = segs.len();
    let mut starts = vec![0u32];
    for (_, shape, _) in &segs {
        let n: usize = shape.iter().product();
        starts.push(starts.last().expect("a start") + n as u32);
    }
    let mut tail = starts.clone();
    let mut blocks: Vec<u32> = Vec::new();
    let mut heads = Vec::new();
    let mut outs: Vec<(usize, DTensor)> = Vec::new();
    for (g, shape, ext) in &segs {
        let (words, _, o) = operands(ex, &g.outputs, ext, shape, Frame::Kernel(""))?;
        heads.push((2 * k + 1 + blocks.len()) as u32);
        blocks.extend(words.0);
        outs.extend(g.outputs.iter().copied().zip(o));
    }
    tail.extend(heads);
    tail.extend(blocks);
    let total = *starts.last().expect("a start") as usize;
    // Bindings: the outputs in order, then the inputs.
    let members: Vec<usize> = segs
        .iter()
        .flat_map(|(g, _, _)| g.members.iter().copied().chain([usize::MAX]))
        .collect();
    let key = (
        members,
        segs.iter()
            .flat_map(|(_, _, ext)| mode_key(ext, &[]))
            .collect(),
    );
    let pipe = ex.generated_pipeline(key, "fused_run", || generate_run(ex, &segs, &inputs))?;
    let ins: Vec<DTensor> = inputs
        .iter()
        .map(|&j| operand(ex, j))
        .collect::<Result<_>>()?;
    let mut bufs: Vec<(u32, &DTensor)> = outs
        .iter()
        .enumerate()
        .map(|(b, (_, t))| (1 + b as u32, t))
        .collect();
    let first_in = 1 + outs.len() as u32;
    bufs.extend(
        ins.iter()
            .enumerate()
            .map(|(b, t)| (first_in + b as u32, t)),
    );
    let block = params::Fused {
        n: total as u32,
        rank: k as u32,
    };
    ex.dispatch(pipe, &bufs, Params::with_tail(&block, &tail), grid(total))?;
    drop(bufs);
    for (o, t) in outs {
        ex.slots[o] = Some(Slot::dev(t));
    }
    Ok(())
}

/// The WGSL of a run of groups (`record_run`): segment `k` computes element
/// `i - starts[k]` of its group, reading its block at word `heads[k]` of the tail.
fn generate_run(ex: &Exec, segs: &[Segment], inputs: &[usize]) -> Result<String> {
    let mut src = pipelines::common(ex.ctx.has_f16) + FUSED_WGSL;
    let mut binding = 1;
    for (g, _, _) in segs {
        for o in &g.outputs {
            let _ = writeln!(
                src,
                "@group(0) @binding({binding}) var<storage, read_write> o{o}: array<u32>;"
            );
            binding += 1;
        }
    }
    for j in inputs {
        let _ = writeln!(
            src,
            "@group(0) @binding({binding}) var<storage, read> s{j}: array<u32>;"
        );
        binding += 1;
    }
    src.push_str(
        "fn sbidx(i: u32, h: u32, base: u32) -> u32 {\n    let r = p.tail[h + 1u];\n    var rem = i;\n    \
         var off = p.tail[h + 2u + base + r];\n    for (var k = 0u; k < r; k++) {\n        let d = r - 1u - k;\n        \
         let dim = p.tail[h + 2u + d];\n        off += (rem % dim) * p.tail[h + 2u + base + d];\n        \
         rem = rem / dim;\n    }\n    return off;\n}\n",
    );
    let access = Access {
        rank: "p.tail[h + 1u]".into(),
        tail: "p.tail[h + 2u + ".into(),
        bidx: "sbidx(i, h, ".into(),
        // Lazy slice gradients are written out before a run (`settle`).
        pidx: String::new(),
        sout: Vec::new(),
        xout: Vec::new(),
    };
    let mut helpers = Vec::new();
    let k = segs.len();
    let mut main = String::new();
    for (s, (g, _, ext)) in segs.iter().enumerate() {
        let b = body(
            ex,
            &g.members,
            &g.outputs,
            ext,
            &access,
            &mut helpers,
            &|q| format!("o{}", g.outputs[q]),
            &|q| format!("s{}", ext[q].0),
        )?;
        let cond = if s + 1 < k {
            format!("if (gi < p.tail[{}u]) ", s + 1)
        } else {
            String::new()
        };
        let _ = write!(
            main,
            "{}{cond}{{\n    let i = gi - p.tail[{s}u];\n    let h = p.tail[{}u];\n{b}}}",
            if s == 0 { "    " } else { " else " },
            k + 1 + s
        );
    }
    for h in helpers {
        src.push_str(&h);
    }
    let _ = write!(
        src,
        "@compute @workgroup_size(256)\nfn fused_run(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{\n    \
         let gi = fk_index(g, nw);\n    if (gi >= p.n) {{ return; }}\n{main}\n}}\n"
    );
    Ok(src)
}

/// Runtime shapes of `members` (in plan order), from their inputs' slots.
fn member_shapes(ex: &Exec, members: &[usize]) -> Result<HashMap<usize, Vec<usize>>> {
    member_shapes_from(ex, members, HashMap::new())
}

/// Runtime shapes of `members` (in plan order), from `shapes` (slots not computed yet)
/// and their inputs' slots.
fn member_shapes_from(
    ex: &Exec,
    members: &[usize],
    mut shapes: HashMap<usize, Vec<usize>>,
) -> Result<HashMap<usize, Vec<usize>>> {
    let plan = ex.plan;
    for &m in members {
        let ins = &plan.inputs[m];
        let sh = |j: usize| -> Vec<usize> {
            shapes
                .get(&j)
                .cloned()
                .unwrap_or_else(|| ex.slot(j).shape.clone())
        };
        let shape = match fused_op(plan.nodes[m].op())? {
            FusedOp::Unary(_) | FusedOp::Cast(_) => sh(ins[0]),
            FusedOp::Binary(b) => broadcast_runtime(b.name(), &sh(ins[0]), &sh(ins[1]))?,
            FusedOp::Select => broadcast_runtime(
                "select",
                &broadcast_runtime("select", &sh(ins[0]), &sh(ins[1]))?,
                &sh(ins[2]),
            )?,
            FusedOp::BroadcastTo => {
                let t = ex.slot(ins[1]).host.as_ref().ok_or_else(|| {
                    Error::Runtime("broadcast_to: target shape not on the host".into())
                })?;
                let target = crate::ops::movement::target_dims("broadcast_to", t)?;
                let x = sh(ins[0]);
                if x.len() > target.len()
                    || broadcast_runtime("broadcast_to", &x, &target)? != target
                {
                    return Err(Error::Value(format!(
                        "broadcast_to: cannot broadcast shape {x:?} to {target:?}"
                    )));
                }
                target
            }
        };
        ex.note(m, &shape);
        shapes.insert(m, shape);
    }
    Ok(shapes)
}

/// Records one generated kernel computing `members` (in plan order) per element of the
/// last member's shape and writing `outputs`, which have that shape; puts the outputs
/// in their slots.
pub(crate) fn record_members(ex: &mut Exec, members: &[usize], outputs: &[usize]) -> Result<()> {
    let plan = ex.plan;
    let shapes = member_shapes(ex, members)?;
    let s = *members.last().expect("a kernel has members");
    let out_shape = shapes[&s].clone();
    let n: usize = out_shape.iter().product();
    settle(ex, members, n, true, None)?;
    let ext = ext_modes(ex, members, n, None);
    let tag = match plan.nodes[s].dtype() {
        DType::I64 => "i64",
        d => dtag(d).expect("gpu dtype"),
    };
    let entry = format!("fused_{tag}");
    let frame = Frame::Kernel("");
    let (words, bound, outs, placed, extra) =
        operands_placed(ex, outputs, &ext, &out_shape, frame, true)?;
    let rw = writable(&bound, &outs, frame, outputs.len());
    let sout: Vec<usize> = placed.iter().map(|(k, _)| *k).collect();
    let xout: Vec<usize> = extra.iter().map(|(k, _)| *k).collect();
    let mut key = mode_key(&ext, &rw);
    key.extend(sout.iter().map(|&k| 1000 + k as u32));
    key.extend(xout.iter().map(|&k| 2000 + k as u32));
    let pipe = ex.generated_pipeline((members.to_vec(), key), &entry, || {
        let strided = (&sout[..], &xout[..]);
        generate(
            ex,
            members,
            outputs,
            &ext,
            Frame::Kernel(&entry),
            &rw,
            strided,
        )
    })?;
    let mut bufs: Vec<(u32, &DTensor)> = outs
        .iter()
        .enumerate()
        .map(|(k, t)| (1 + k as u32, t))
        .collect();
    bufs.extend(bound.iter().map(|(b, t)| (*b, t)));
    let first_extra = 1 + (outputs.len() + ext.len()) as u32;
    bufs.extend(
        extra
            .iter()
            .enumerate()
            .map(|(e, (_, t))| (first_extra + e as u32, t)),
    );
    let rw_binds = rw_bindings(&rw, Frame::Kernel(""), outputs.len());
    ex.dispatch_rw(pipe, &bufs, words, grid(n), &rw_binds)?;
    drop(bufs);
    let mut placed = placed.into_iter().peekable();
    for (k, (&o, t)) in outputs.iter().zip(outs).enumerate() {
        ex.slots[o] = Some(match placed.next_if(|(p, _)| *p == k) {
            Some((_, slot)) => slot,
            None => Slot::dev(t),
        });
    }
    Ok(())
}

/// The modes of a kernel's inputs, and which it declares writable (`rw`, indices into
/// `ext`), as a pipeline cache key.
fn mode_key(ext: &[(usize, Mode)], rw: &[usize]) -> Vec<u32> {
    ext.iter()
        .enumerate()
        .flat_map(|(k, (_, m))| {
            let mode = match m {
                Mode::Same => 0,
                Mode::Scalar => 1,
                Mode::Bcast => 2,
                Mode::Param(_) => 3,
                Mode::Stored => 4,
                Mode::Pad => 5,
            };
            [mode, rw.contains(&k) as u32]
        })
        .collect()
}

/// The inputs (indices into the kernel's `ext`) bound from a buffer that one of the
/// kernel's outputs `outs` is a window of: a loop state read from its history's row
/// while the kernel writes the next row. The kernel declares them writable, as wgpu binds
/// no buffer both read-only and writable in one dispatch; the words read and written
/// are disjoint.
fn writable(bound: &[(u32, DTensor)], outs: &[DTensor], frame: Frame, n_out: usize) -> Vec<usize> {
    let first_in = frame.first_binding() + n_out as u32;
    bound
        .iter()
        .filter(|(_, t)| outs.iter().any(|o| o.same_buffer(t) && !o.same_words(t)))
        .map(|(b, _)| (b - first_in) as usize)
        .collect()
}

/// The bindings of the inputs `rw` (indices into the kernel's `ext`).
fn rw_bindings(rw: &[usize], frame: Frame, n_out: usize) -> Vec<u32> {
    let first_in = frame.first_binding() + n_out as u32;
    rw.iter().map(|&k| first_in + k as u32).collect()
}

/// Writes out the lazy values (`exec::Lazy`) among the inputs of `members` that a kernel
/// over `n` elements cannot read in place: slice gradients not of the kernel's shape,
/// or any where `pads` is false. `stored` (an epilogue's product) is not computed yet.
fn settle(
    ex: &mut Exec,
    members: &[usize],
    n: usize,
    pads: bool,
    stored: Option<usize>,
) -> Result<()> {
    let plan = ex.plan;
    for &m in members {
        let h = plan.nodes[m].op().shape_operands();
        for (p, &j) in plan.inputs[m].iter().enumerate() {
            if h.contains(&p) || members.contains(&j) || stored == Some(j) {
                continue;
            }
            let out = match ex.slots[j].as_ref() {
                Some(s) if s.dev.is_none() => match &s.lazy {
                    Some(Lazy::Pad { .. }) => !pads || s.shape.iter().product::<usize>() != n,
                    Some(Lazy::Slice { .. }) | None => false,
                },
                Some(_) | None => false,
            };
            if out {
                ex.dev(j)?;
            }
        }
    }
    Ok(())
}

/// The tensor a kernel binds for input `j`: the buffer a lazy value reads from
/// (`exec::Lazy`), else its device value.
fn operand(ex: &mut Exec, j: usize) -> Result<DTensor> {
    let s = ex.slot(j);
    match (&s.dev, &s.lazy) {
        (None, Some(Lazy::Slice { base, .. })) => Ok(base.clone()),
        (None, Some(Lazy::Pad { g, .. })) => Ok(g.clone()),
        (Some(_), _) | (None, None) => ex.dev(j),
    }
}

/// Where the tail's constants start, past the shape, the blocks of the strided outputs
/// (`rank + 1` words each) and of the strided inputs of `ext` (`rank + 1` words for each
/// `Bcast`, `2 * rank` for each `Pad`), as (`mul`, `add`): word `rank * mul + add`.
fn block_words(ext: &[(usize, Mode)], strided_outputs: usize) -> (usize, usize) {
    let (mut mul, mut add) = (1 + strided_outputs, strided_outputs);
    for (_, m) in ext {
        match m {
            Mode::Bcast => {
                mul += 1;
                add += 1;
            }
            Mode::Pad => mul += 2,
            Mode::Same | Mode::Scalar | Mode::Param(_) | Mode::Stored => {}
        }
    }
    (mul, add)
}

/// The strides of a lazy slice of `shape` (its own `strides`) seen from the
/// right-aligned `out` shape; 0 on broadcast dims.
fn lazy_strides(shape: &[usize], strides: &[usize], out: &[usize]) -> Vec<u32> {
    let lead = out.len() - shape.len();
    let mut st = vec![0u32; out.len()];
    for d in 0..shape.len() {
        st[lead + d] = if shape[d] == 1 { 0 } else { strides[d] as u32 };
    }
    st
}

/// The external inputs of `members`, in first-use order, and how the kernel reads each
/// per element of an `n`-element result; `stored` is the result of the kernel an
/// epilogue runs in.
fn ext_modes(ex: &Exec, members: &[usize], n: usize, stored: Option<usize>) -> Vec<(usize, Mode)> {
    let plan = ex.plan;
    let mut ext: Vec<(usize, Mode)> = Vec::new();
    for &m in members {
        let h = plan.nodes[m].op().shape_operands();
        for (p, &j) in plan.inputs[m].iter().enumerate() {
            if h.contains(&p) || members.contains(&j) || ext.iter().any(|e| e.0 == j) {
                continue;
            }
            let mode = match &plan.steps[j] {
                _ if stored == Some(j) => Mode::Stored,
                Step::Folded(v) if v.len() == 1 && transfer::to_words(v).is_some() => {
                    let w = transfer::to_words(v).expect("a device dtype");
                    Mode::Param([w[0], w.get(1).copied().unwrap_or(0)])
                }
                _ => {
                    let s = ex.slot(j);
                    let c: usize = s.shape.iter().product();
                    let lazy = if s.dev.is_none() {
                        s.lazy.as_ref()
                    } else {
                        None
                    };
                    if let Some(Lazy::Slice { .. }) = lazy {
                        Mode::Bcast
                    } else if let Some(Lazy::Pad { .. }) = lazy {
                        Mode::Pad
                    } else if c == n {
                        Mode::Same
                    } else if c == 1 {
                        Mode::Scalar
                    } else {
                        Mode::Bcast
                    }
                }
            };
            ext.push((j, mode));
        }
    }
    ext
}

/// What a generated body binds for a result of shape `out_shape`: its parameter words
/// (the `Fused` block and its tail: `out_shape`, the strides of each broadcast input, the
/// scalar constants), its inputs' (binding, tensor) pairs, and fresh buffers for
/// `outputs`.
#[allow(clippy::type_complexity)] // the three parts of one binding plan
fn operands(
    ex: &mut Exec,
    outputs: &[usize],
    ext: &[(usize, Mode)],
    out_shape: &[usize],
    frame: Frame,
) -> Result<(Params, Vec<(u32, DTensor)>, Vec<DTensor>)> {
    let (words, bound, outs, _, _) = operands_placed(ex, outputs, ext, out_shape, frame, false)?;
    Ok((words, bound, outs))
}

/// What `operands_placed` returns: the parameter words, the bound inputs, the output
/// buffers, the (output index, slot) of each output written into a concatenation, and
/// the (output index, buffer) of each further concatenation an output is written into.
type Placed = (
    Params,
    Vec<(u32, DTensor)>,
    Vec<DTensor>,
    Vec<(usize, Slot)>,
    Vec<(usize, DTensor)>,
);

/// `operands`, where with `pieces` an output that is a piece of concatenations
/// (`Placement::pieces`) is written into its block of the first one's buffer (the buffer
/// it binds), through strides and an offset in the tail after the shape: with (output
/// index, slot) for each such output, its slot a lazy slice of that buffer. It is also
/// written into its blocks of the others, through further bindings past the inputs (their
/// strides and offsets next in the tail), as many as the adapter's buffer limit allows;
/// those concatenations copy the rest.
fn operands_placed(
    ex: &mut Exec,
    outputs: &[usize],
    ext: &[(usize, Mode)],
    out_shape: &[usize],
    frame: Frame,
    pieces: bool,
) -> Result<Placed> {
    let plan = ex.plan;
    // Inputs first (an upload fails before a result's allocation, naming the input).
    let mut in_tail: Vec<u32> = Vec::new();
    let mut bound = Vec::new();
    let first_in = frame.first_binding() + outputs.len() as u32;
    for (k, (j, mode)) in ext.iter().enumerate() {
        if matches!(mode, Mode::Same | Mode::Scalar) {
            bound.push((first_in + k as u32, ex.dev(*j)?));
        }
        if !matches!(mode, Mode::Bcast | Mode::Pad) {
            continue;
        }
        let s = ex.slot(*j);
        let lazy = if s.dev.is_none() {
            s.lazy.as_ref()
        } else {
            None
        };
        match (mode, lazy) {
            (
                Mode::Bcast,
                Some(Lazy::Slice {
                    offset, strides, ..
                }),
            ) => {
                in_tail.extend(lazy_strides(&s.shape, strides, out_shape));
                in_tail.push(*offset as u32);
            }
            (Mode::Bcast, _) => {
                in_tail.extend(bcast_strides(&s.shape, out_shape));
                in_tail.push(0);
            }
            (Mode::Pad, Some(Lazy::Pad { g, starts })) => {
                // Of the kernel's shape but for leading axes of length 1 (`settle`).
                let lead = out_shape.len() - starts.len();
                in_tail.extend((0..lead).map(|_| 0));
                in_tail.extend(starts.iter().map(|&x| x as u32));
                in_tail.extend(out_shape[..lead].iter().map(|&d| d as u32));
                in_tail.extend(g.shape.iter().map(|&d| d as u32));
            }
            (Mode::Pad, _) => {
                return Err(Error::Runtime(
                    "internal: a padded operand that is not a lazy slice gradient".into(),
                ))
            }
            (Mode::Same | Mode::Scalar | Mode::Param(_) | Mode::Stored, _) => {}
        }
        bound.push((first_in + k as u32, operand(ex, *j)?));
    }
    let mut tail: Vec<u32> = out_shape.iter().map(|&d| d as u32).collect();
    let mut outs = Vec::with_capacity(outputs.len());
    let mut placed = Vec::new();
    let mut extra: Vec<(usize, DTensor)> = Vec::new();
    let mut extra_tail: Vec<u32> = Vec::new();
    let limit = ex.ctx.limits.max_storage_buffers_per_shader_stage as usize;
    let mut spare = limit.saturating_sub(1 + outputs.len() + bound.len());
    for (k, &o) in outputs.iter().enumerate() {
        let dtype = plan.nodes[o].dtype();
        let targets = match pieces {
            true => ex.lay.pieces.get(&o).cloned().unwrap_or_default(),
            false => Vec::new(),
        };
        let mut first = None;
        for (c, at) in targets {
            if first.is_some() && spare == 0 {
                break;
            }
            let Some((buf, offset, strides)) = piece(ex, c, at, out_shape)? else {
                continue;
            };
            if let Some(e) = ex.pieces.borrow_mut().get_mut(&c) {
                e.1[at] = true;
            }
            if first.is_none() {
                first = Some((buf, offset, strides));
            } else {
                extra_tail.extend(strides.iter().map(|&s| s as u32));
                extra_tail.push(offset as u32);
                extra.push((k, buf));
                spare -= 1;
            }
        }
        match first {
            Some((buf, offset, strides)) => {
                tail.extend(strides.iter().map(|&s| s as u32));
                tail.push(offset as u32);
                let slot = Slot {
                    shape: out_shape.to_vec(),
                    dtype,
                    host: None,
                    dev: None,
                    lazy: Some(Lazy::Slice {
                        base: buf.clone(),
                        offset,
                        strides,
                    }),
                };
                placed.push((k, slot));
                outs.push(buf);
            }
            None => outs.push(ex.alloc(out_shape, dtype, o)?),
        }
    }
    tail.extend(extra_tail);
    tail.extend(in_tail);
    for (j, m) in ext {
        if let Mode::Param(w) = m {
            tail.extend(&w[..words_per(plan.nodes[*j].dtype())]);
        }
    }
    let block = params::Fused {
        n: out_shape.iter().product::<usize>() as u32,
        rank: out_shape.len() as u32,
    };
    Ok((Params::with_tail(&block, &tail), bound, outs, placed, extra))
}

/// Where a piece of shape `shape` is written as input `k` of concatenation `c`
/// (`Placement::pieces`): the concatenation's buffer (allocated by its first piece,
/// `Exec::pieces`), the piece's offset in it and its strides; `None` where the piece is
/// not of the length along the axis the graph gives it.
#[allow(clippy::type_complexity)] // a buffer and a piece's place in it
fn piece(
    ex: &Exec,
    c: usize,
    k: usize,
    shape: &[usize],
) -> Result<Option<(DTensor, usize, Vec<usize>)>> {
    let plan = ex.plan;
    let crate::ops::Op::Concat(axis) = plan.nodes[c].op() else {
        return Ok(None);
    };
    let axis = *axis;
    let lens: Vec<usize> = plan.inputs[c]
        .iter()
        .map(|&j| plan.nodes[j].shape().dims()[axis].unwrap_or(0))
        .collect();
    if shape.len() <= axis || shape[axis] != lens[k] {
        return Ok(None);
    }
    let mut full = shape.to_vec();
    full[axis] = lens.iter().sum();
    let dtype = plan.nodes[c].dtype();
    let kept = ex.pieces.borrow().get(&c).map(|e| e.0.clone());
    let buf = match kept {
        Some(b) if b.shape == full && b.dtype == dtype => b,
        Some(_) => return Ok(None),
        None => {
            let b = ex.alloc(&full, dtype, c)?;
            let n = plan.inputs[c].len();
            ex.pieces
                .borrow_mut()
                .insert(c, (b.clone(), vec![false; n]));
            b
        }
    };
    let mut strides = vec![1usize; full.len()];
    for d in (0..full.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * full[d + 1];
    }
    let offset = lens[..k].iter().sum::<usize>() * strides[axis];
    Ok(Some((buf, offset, strides)))
}

/// A group computed in the kernel of the product or convolution it reads
/// (`Group::first`), as the kernel stores each element of its result, which is then
/// never written (`epilogue`).
pub(crate) struct Epilogue {
    /// The bindings, helpers and `fn epi(i: u32, v: f32)` that the kernel's module gets.
    src: String,
    /// (binding, tensor) pairs bound besides the kernel's operands: the parameter block,
    /// the outputs and the inputs.
    pub bufs: Vec<(u32, DTensor)>,
    /// The bindings of the inputs it declares writable (`writable`), for
    /// `Exec::dispatch_rw`.
    pub rw: Vec<u32>,
    /// The group's outputs and their buffers.
    outputs: Vec<(usize, DTensor)>,
    /// The pipeline cache key of the group (its members, then the producer) and its
    /// inputs' modes.
    key: (Vec<usize>, Vec<u32>),
}

impl Epilogue {
    /// The pipeline of entry point `entry` of `module` (a hand-written kernel's WGSL,
    /// which stores its result through one line `fn st(i: u32, v: T) { ... }`) with that
    /// store replaced by the epilogue; cached per plan by the group, its inputs' modes
    /// and the entry point.
    pub fn pipeline(
        &self,
        ex: &Exec,
        module: impl FnOnce() -> String,
        entry: &str,
    ) -> Result<Arc<Pipe>> {
        let mut key = self.key.clone();
        key.1.extend(entry.bytes().map(u32::from));
        ex.generated_pipeline(key, entry, || {
            let module = module();
            let start = module
                .find("\nfn st(")
                .ok_or_else(|| Error::Runtime("internal: the kernel has no store line".into()))?
                + 1;
            let end = module[start..]
                .find('\n')
                .map_or(module.len(), |e| start + e);
            // The entry point heads the source, which keys the device's pipeline cache.
            Ok(format!(
                "// {entry} with an epilogue\n{}fn st(i: u32, v: T) {{ epi(i, t_norm(v)); }}{}{}",
                &module[..start],
                &module[end..],
                self.src
            ))
        })
    }

    /// Puts the group's outputs in their slots (after the kernel is recorded).
    pub fn finish(self, ex: &mut Exec) {
        for (o, t) in self.outputs {
            ex.slots[o] = Some(Slot::dev(t));
        }
    }
}

/// The epilogue computing group `g` in the kernel of node `f` (a product or convolution
/// whose result has shape `shape`, not computed yet), which binds `used` storage buffers
/// of its own besides its parameter block: `None` where the group cannot run so (a
/// member on the host, outputs of another shape, more buffers than the adapter binds).
pub(crate) fn epilogue(
    ex: &mut Exec,
    g: &Group,
    f: usize,
    shape: &[usize],
    used: usize,
) -> Result<Option<Epilogue>> {
    let plan = ex.plan;
    if g.first != Some(f)
        || !g.folds.is_empty()
        || plan.nodes[f].dtype() != DType::F32
        || !g.members.iter().all(|&m| ex.lay.place[m] == Place::Gpu)
        || touches_int64(ex, &g.members)
    {
        return Ok(None);
    }
    let shapes = member_shapes_from(ex, &g.members, HashMap::from([(f, shape.to_vec())]))?;
    let last = g.members.last().expect("a group has members");
    if shapes[last] != shape || g.outputs.iter().any(|o| shapes[o] != shape) {
        return Ok(None);
    }
    let n: usize = shape.iter().product();
    settle(ex, &g.members, n, true, Some(f))?;
    let ext = ext_modes(ex, &g.members, n, Some(f));
    let binds = ext
        .iter()
        .filter(|(_, m)| matches!(m, Mode::Same | Mode::Scalar | Mode::Bcast | Mode::Pad))
        .count();
    let limit = ex.ctx.limits.max_storage_buffers_per_shader_stage as usize;
    if 1 + used + 1 + g.outputs.len() + binds > limit {
        return Ok(None);
    }
    let (words, bound, outs) = operands(ex, &g.outputs, &ext, shape, Frame::Epilogue)?;
    let rw = writable(&bound, &outs, Frame::Epilogue, g.outputs.len());
    let none: (&[usize], &[usize]) = (&[], &[]);
    let src = generate(ex, &g.members, &g.outputs, &ext, Frame::Epilogue, &rw, none)?;
    let pbuf = pool::alloc(ex.ctx, words.0.len() as u64 * 4, &|| {
        "epilogue parameters".into()
    })?;
    ex.ctx
        .queue
        .write_buffer(pbuf.raw(), 0, bytemuck::cast_slice(&words.0));
    let block = DTensor::new(pbuf, vec![words.0.len()], DType::I32);
    let first = Frame::Epilogue.first_binding();
    let mut bufs = vec![(EPILOGUE_BINDING, block)];
    bufs.extend(
        outs.iter()
            .enumerate()
            .map(|(k, t)| (first + k as u32, t.clone())),
    );
    bufs.extend(bound);
    Ok(Some(Epilogue {
        src,
        rw: rw_bindings(&rw, Frame::Epilogue, g.outputs.len()),
        bufs,
        outputs: g.outputs.iter().copied().zip(outs).collect(),
        key: (
            g.members.iter().copied().chain([f]).collect(),
            mode_key(&ext, &rw),
        ),
    }))
}

/// How a generated body reads its parameters: its block's `rank`, the start of its tail
/// (word `e` of the tail is `{tail}e]`), and the broadcast index helper's call up to its
/// last argument.
struct Access {
    rank: String,
    tail: String,
    bidx: String,
    /// The padded index helper's call up to its last argument (`Mode::Pad`).
    pidx: String,
    /// The outputs written through strides (pieces of a concatenation,
    /// `operands_placed`), whose tail blocks follow the shape.
    sout: Vec<usize>,
    /// The outputs also written into a further concatenation each, through binding
    /// `xout{e}` (past the inputs) and the tail block after those of `sout`.
    xout: Vec<usize>,
}

/// The WGSL of `members` computed per element `i` and written to `outputs`: a module
/// with its entry point (`Frame::Kernel`), or the declarations and `fn epi(i, v)` that an
/// epilogue adds to its kernel's module (`Frame::Epilogue`).
fn generate(
    ex: &Exec,
    members: &[usize],
    outputs: &[usize],
    ext: &[(usize, Mode)],
    frame: Frame,
    rw: &[usize],
    (sout, xout): (&[usize], &[usize]),
) -> Result<String> {
    let (mut src, access) = declarations(ex, members, outputs, ext, frame, rw, (sout, xout));
    let mut helpers: Vec<String> = Vec::new();
    let body = body(
        ex,
        members,
        outputs,
        ext,
        &access,
        &mut helpers,
        &|k| format!("out{k}"),
        &|k| format!("in{k}"),
    )?;
    for h in helpers {
        src.push_str(&h);
    }
    match frame {
        Frame::Kernel(entry) => {
            let _ = write!(
                src,
                "@compute @workgroup_size(256)\nfn {entry}(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{\n    \
                 let i = fk_index(g, nw);\n    if (i >= p.n) {{ return; }}\n{body}}}\n"
            );
        }
        Frame::Epilogue => {
            // Reading `ep.n` keeps the parameter binding in the pipeline's layout.
            let _ = write!(
                src,
                "fn epi(i: u32, v: f32) {{\n    if (i >= ep.n) {{ return; }}\n{body}}}\n"
            );
        }
    }
    Ok(src)
}

/// The WGSL of group `g` with its folds (`record_fold_kernel`), entry point
/// `fused_fold`: workgroup `w` takes outputs `w * cb ..` of the folds (`FoldLayout`), lane
/// `l / cb` of output `o` computes the group's members at the elements `o * ostride +
/// r * rstride` for `r` = lane, lane + `FOLD_WG / cb`, ... in turn, writing the group's
/// outputs there and adding up each folded member; the lanes' sums then meet in a tree
/// in workgroup memory (a fixed order: runs give equal results), scaled for a mean. The
/// fold layout follows the `Fused` tail (`rank` words per broadcast input and the
/// constants' words after the shape); the folds' results are bound after the inputs.
fn generate_folded(ex: &Exec, g: &Group, ext: &[(usize, Mode)], rw: &[usize]) -> Result<String> {
    let (mut src, access) = declarations(
        ex,
        &g.members,
        &g.outputs,
        ext,
        Frame::Kernel(""),
        rw,
        (&[], &[]),
    );
    let first_sum = 1 + g.outputs.len() + ext.len();
    for k in 0..g.folds.len() {
        let _ = writeln!(
            src,
            "@group(0) @binding({}) var<storage, read_write> sum{k}: array<u32>;\n\
             var<workgroup> part{k}: array<f32, {FOLD_WG}>;",
            first_sum + k
        );
    }
    let mut helpers: Vec<String> = Vec::new();
    let body = body(
        ex,
        &g.members,
        &g.outputs,
        ext,
        &access,
        &mut helpers,
        &|k| format!("out{k}"),
        &|k| format!("in{k}"),
    )?;
    for h in helpers {
        src.push_str(&h);
    }
    let (mul, add) = block_words(ext, 0);
    let consts = add + param_words(ex, ext);
    let (mut init, mut add, mut tree, mut store) =
        (String::new(), String::new(), String::new(), String::new());
    for (k, f) in g.folds.iter().enumerate() {
        let _ = writeln!(init, "    var acc{k} = 0.0;");
        let _ = writeln!(add, "    acc{k} = acc{k} + v{};", f.member);
        let _ = writeln!(
            tree,
            "            part{k}[l.x] = part{k}[l.x] + part{k}[l.x + s * f_cb];"
        );
        let _ = writeln!(
            store,
            "        sum{k}[o] = bitcast<u32>(part{k}[l.x] * bitcast<f32>(p.tail[fb + {}u]));",
            5 + k
        );
    }
    let parts: String = (0..g.folds.len())
        .map(|k| format!("    part{k}[l.x] = acc{k};\n"))
        .collect();
    let _ = write!(
        src,
        "@compute @workgroup_size({FOLD_WG})\n\
         fn fused_fold(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>, \
         @builtin(num_workgroups) nw: vec3<u32>) {{\n    \
         let fb = p.rank * {mul}u + {consts}u;\n    \
         let f_nout = p.tail[fb];\n    let f_red = p.tail[fb + 1u];\n    \
         let f_os = p.tail[fb + 2u];\n    let f_rs = p.tail[fb + 3u];\n    \
         let f_cb = p.tail[fb + 4u];\n    let f_rb = {FOLD_WG}u / f_cb;\n    \
         let wg = w.x + w.y * nw.x;\n    if (wg * f_cb >= f_nout) {{ return; }}\n    \
         let lane = l.x / f_cb;\n    let o = wg * f_cb + l.x % f_cb;\n{init}    \
         if (o < f_nout) {{\n        for (var r = lane; r < f_red; r += f_rb) {{\n            \
         let i = o * f_os + r * f_rs;\n{body}{add}        }}\n    }}\n{parts}    \
         workgroupBarrier();\n    for (var s = f_rb / 2u; s > 0u; s >>= 1u) {{\n        \
         if (lane < s) {{\n{tree}        }}\n        workgroupBarrier();\n    }}\n    \
         if (lane == 0u && o < f_nout) {{\n{store}    }}\n}}\n"
    );
    Ok(src)
}

/// The words of the folded constants `ext` passes in the parameter tail.
fn param_words(ex: &Exec, ext: &[(usize, Mode)]) -> usize {
    ext.iter()
        .map(|(j, m)| match m {
            Mode::Param(_) => words_per(ex.plan.nodes[*j].dtype()),
            Mode::Same | Mode::Scalar | Mode::Bcast | Mode::Pad | Mode::Stored => 0,
        })
        .sum()
}

/// The start of a generated module for `frame`: the dtype prelude and parameter block
/// (a kernel's) or the epilogue's parameter block, the int64 helpers where a value is
/// int64, the bindings of `outputs` and of the buffers `ext` reads, and the broadcast
/// index helper; with how a body reads the parameters.
fn declarations(
    ex: &Exec,
    members: &[usize],
    outputs: &[usize],
    ext: &[(usize, Mode)],
    frame: Frame,
    rw: &[usize],
    (sout, xout): (&[usize], &[usize]),
) -> (String, Access) {
    let has_f16 = ex.ctx.has_f16;
    let (mut src, bidx, pidx) = match frame {
        Frame::Kernel(_) => (pipelines::common(has_f16) + FUSED_WGSL, "bidx", "pidx"),
        Frame::Epilogue => (EPILOGUE_WGSL.to_string(), "ep_bidx", "ep_pidx"),
    };
    let plan = ex.plan;
    let int64 = members
        .iter()
        .chain(ext.iter().map(|(j, _)| j))
        .any(|&j| plan.nodes[j].dtype() == DType::I64);
    if int64 {
        src.push_str(INT64_WGSL);
    }
    let p = frame.params();
    let first = frame.first_binding() as usize;
    for k in 0..outputs.len() {
        let _ = writeln!(
            src,
            "@group(0) @binding({}) var<storage, read_write> out{k}: array<u32>;",
            first + k
        );
    }
    for (k, (_, m)) in ext.iter().enumerate() {
        if matches!(m, Mode::Same | Mode::Scalar | Mode::Bcast | Mode::Pad) {
            let access = if rw.contains(&k) {
                "read_write"
            } else {
                "read"
            };
            let _ = writeln!(
                src,
                "@group(0) @binding({}) var<storage, {access}> in{k}: array<u32>;",
                first + outputs.len() + k
            );
        }
    }
    let first_extra = first + outputs.len() + ext.len();
    for e in 0..xout.len() {
        let _ = writeln!(
            src,
            "@group(0) @binding({}) var<storage, read_write> xout{e}: array<u32>;",
            first_extra + e
        );
    }
    if ext.iter().any(|e| e.1 == Mode::Bcast) || !sout.is_empty() || !xout.is_empty() {
        let _ = write!(
            src,
            "fn {bidx}(i: u32, base: u32) -> u32 {{\n    let r = {p}.rank;\n    var rem = i;\n    var off = {p}.tail[base + r];\n    \
             for (var k = 0u; k < r; k++) {{\n        let d = r - 1u - k;\n        let dim = {p}.tail[d];\n        \
             off += (rem % dim) * {p}.tail[base + d];\n        rem = rem / dim;\n    }}\n    return off;\n}}\n",
        );
    }
    if ext.iter().any(|e| e.1 == Mode::Pad) {
        // The element of a block (starts at `base`, lengths at `base + rank`) at output
        // element `i`, or 0xffffffff outside it.
        let _ = write!(
            src,
            "fn {pidx}(i: u32, base: u32) -> u32 {{\n    let r = {p}.rank;\n    var rem = i;\n    var off = 0u;\n    \
             var acc = 1u;\n    for (var k = 0u; k < r; k++) {{\n        let d = r - 1u - k;\n        \
             let dim = {p}.tail[d];\n        let c = rem % dim;\n        rem = rem / dim;\n        \
             let s = {p}.tail[base + d];\n        let len = {p}.tail[base + r + d];\n        \
             if (c < s || c >= s + len) {{ return 0xffffffffu; }}\n        off += (c - s) * acc;\n        \
             acc *= len;\n    }}\n    return off;\n}}\n",
        );
    }
    let access = Access {
        rank: format!("{p}.rank"),
        tail: format!("{p}.tail["),
        bidx: format!("{bidx}(i, "),
        pidx: format!("{pidx}(i, "),
        sout: sout.to_vec(),
        xout: xout.to_vec(),
    };
    (src, access)
}

/// The statements computing `members` at element `i` and storing `outputs` (output `k`
/// to buffer `out_buf(k)`, input `k` of `ext` read from buffer `in_buf(k)`), the helper
/// functions they call added to `helpers`.
#[allow(clippy::too_many_arguments)] // a body's members, buffers and parameter access
fn body(
    ex: &Exec,
    members: &[usize],
    outputs: &[usize],
    ext: &[(usize, Mode)],
    access: &Access,
    helpers: &mut Vec<String>,
    out_buf: &dyn Fn(usize) -> String,
    in_buf: &dyn Fn(usize) -> String,
) -> Result<String> {
    let plan = ex.plan;
    let has_f16 = ex.ctx.has_f16;
    let Access {
        rank,
        tail,
        bidx,
        pidx,
        sout,
        xout,
    } = access;
    let mut body = String::new();
    // The tail block of the next strided input is at word `rank * bm + ba`, past those
    // of the strided outputs; the constants follow the last (`block_words`).
    let strided = sout.len() + xout.len();
    let (mut bm, mut ba) = (1 + strided, strided);
    let (pm, pa) = block_words(ext, strided);
    let mut param_k = 0usize;
    let mut name: HashMap<usize, String> = HashMap::new();
    for (k, (j, mode)) in ext.iter().enumerate() {
        let d = plan.nodes[*j].dtype();
        if let Mode::Stored = mode {
            let _ = writeln!(body, "    let x{j} = v;");
            name.insert(*j, format!("x{j}"));
            continue;
        }
        if let Mode::Pad = mode {
            let _ = writeln!(body, "    let q{j} = {pidx}{rank} * {bm}u + {ba}u);");
        }
        // Word `w` of the element (int64: 0 low, 1 high).
        let word = |w: usize| match mode {
            Mode::Same if d == DType::I64 => format!("{}[2u * i + {w}u]", in_buf(k)),
            Mode::Same | Mode::Stored => format!("{}[i]", in_buf(k)),
            Mode::Scalar => format!("{}[{w}u]", in_buf(k)),
            Mode::Bcast if d == DType::I64 => {
                format!("{}[2u * {bidx}{rank} * {bm}u + {ba}u) + {w}u]", in_buf(k))
            }
            Mode::Bcast => format!("{}[{bidx}{rank} * {bm}u + {ba}u)]", in_buf(k)),
            Mode::Pad => {
                let b = in_buf(k);
                format!("select(0u, {b}[min(q{j}, arrayLength(&{b}) - 1u)], q{j} != 0xffffffffu)")
            }
            Mode::Param(_) => format!("{tail}{rank} * {pm}u + {}u]", pa + param_k + w),
        };
        let load = if d == DType::I64 {
            format!("vec2<u32>({}, {})", word(0), word(1))
        } else {
            format!("bitcast<{}>({})", wty(d), word(0))
        };
        match mode {
            Mode::Bcast => {
                bm += 1;
                ba += 1;
            }
            Mode::Pad => bm += 2,
            Mode::Param(_) => param_k += words_per(d),
            Mode::Same | Mode::Scalar | Mode::Stored => {}
        }
        let _ = writeln!(body, "    let x{j} = {load};");
        name.insert(*j, format!("x{j}"));
    }
    for &m in members {
        let node = &plan.nodes[m];
        let ins = &plan.inputs[m];
        let arg = |p: usize| name[&ins[p]].clone();
        let in_dt = |p: usize| plan.nodes[ins[p]].dtype();
        let expr = match fused_op(node.op())? {
            FusedOp::Unary(u) => {
                let fl = is_float(in_dt(0));
                let e = if in_dt(0) == DType::I64 {
                    int64_unary(u)
                } else {
                    u.wgsl(fl)
                };
                let e = e.ok_or_else(|| {
                    Error::Runtime(format!("{}: no integer WGSL lowering", u.name()))
                })?;
                let f = format!("u_{}_{}", u.name(), tname(in_dt(0)));
                let h = format!(
                    "fn {f}(x: {t}) -> {t} {{ return {e}; }}\n",
                    t = wty(in_dt(0))
                );
                if !helpers.contains(&h) {
                    helpers.push(h);
                }
                format!("{f}({})", arg(0))
            }
            FusedOp::Binary(b) => {
                let t = wty(in_dt(0));
                let r = match b.class() {
                    BinaryClass::Arith => t,
                    BinaryClass::Compare | BinaryClass::Logical => "i32",
                };
                let e = if in_dt(0) == DType::I64 {
                    int64_binary(b).ok_or_else(|| {
                        Error::Runtime(format!(
                            "internal: {} of int64 reached a GPU kernel",
                            b.name()
                        ))
                    })?
                } else {
                    b.wgsl(is_float(in_dt(0)))
                };
                let f = format!("b_{}_{}", b.name(), tname(in_dt(0)));
                let h = format!("fn {f}(a: {t}, b: {t}) -> {r} {{ return {e}; }}\n");
                if !helpers.contains(&h) {
                    helpers.push(h);
                }
                format!("{f}({}, {})", arg(0), arg(1))
            }
            FusedOp::Select => format!("select({}, {}, {} != 0)", arg(2), arg(1), arg(0)),
            FusedOp::Cast(to) => cast_expr(in_dt(0), to, &arg(0)),
            FusedOp::BroadcastTo => arg(0),
        };
        let norm = norm_fn(node.dtype(), has_f16);
        let _ = writeln!(body, "    let v{m} = {norm}({expr});");
        name.insert(m, format!("v{m}"));
    }
    for (k, &o) in outputs.iter().enumerate() {
        if plan.nodes[o].dtype() == DType::I64 {
            let b = out_buf(k);
            let _ = writeln!(
                body,
                "    {b}[2u * i] = v{o}.x;\n    {b}[2u * i + 1u] = v{o}.y;"
            );
        } else if let Some(p) = sout.iter().position(|&s| s == k) {
            let _ = writeln!(
                body,
                "    {}[{bidx}{rank} * {}u + {p}u)] = bitcast<u32>(v{o});",
                out_buf(k),
                1 + p
            );
        } else {
            let _ = writeln!(body, "    {}[i] = bitcast<u32>(v{o});", out_buf(k));
        }
    }
    for (e, &k) in xout.iter().enumerate() {
        let o = outputs[k];
        let p = sout.len() + e;
        let _ = writeln!(
            body,
            "    xout{e}[{bidx}{rank} * {}u + {p}u)] = bitcast<u32>(v{o});",
            1 + p
        );
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Op;

    /// The ops `Op::exact_int64` admits on int64 are those with an int64 lowering here
    /// (`logical_not`, `logical_and` and `logical_or` take bool operands only).
    #[test]
    fn int64_lowerings_are_the_exact_int64_ops() {
        for &u in UnaryOp::ALL.iter().filter(|&&u| u != UnaryOp::Not) {
            let exact = Op::Unary(u).exact_int64();
            assert_eq!(int64_unary(u).is_some(), exact, "{}", u.name());
        }
        for &b in BinaryOp::ALL {
            if b.class() != BinaryClass::Logical {
                let exact = Op::Binary(b).exact_int64();
                assert_eq!(int64_binary(b).is_some(), exact, "{}", b.name());
            }
        }
    }
}
