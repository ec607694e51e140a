//! The CPU fusion kernel: runs a `compile::fuse::Group` as one pass over chunks of
//! `CH` elements. The members become a small register program (bool values are
//! 1.0/0.0 in f32 registers), compiled once per input layout and kept on the group, so a
//! call only collects pointers; members whose inputs are all single values are computed
//! once per call, as scalars. Each external input is read with its own broadcast pattern: directly (same
//! size), as one value, or gathered through strides into a register. Outputs are written
//! once per chunk, into a dead input's buffer when the plan holds its only reference.
//! The per-element code is the op tables' (`UnaryOp::map`, `BinaryOp::zip`), so fused and
//! unfused results are bitwise equal.

use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::broadcast_runtime;
use crate::base::team;
use crate::base::value::{uninit, Arr, Value};
use crate::compile::fuse::{Fold, Group};
use crate::compile::Plan;
use crate::ops::elementwise::{grain, Lane, Splat};
use crate::ops::movement::resolve_slice;
use crate::ops::ImageKernel;
use crate::ops::{BinaryOp, FusedOp, GpuKind, Op, SliceAxis, UnaryOp};
use crate::runtime::cpu::fused_rules::{self, Leaf, Special};
use crate::runtime::cpu::Lend;
use ndarray::IxDyn;
use rayon::prelude::*;
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

/// Elements per chunk: a register is 4 KiB, so a program's registers stay in L1/L2.
const CH: usize = 1024;
/// Work (adds) from which a group below the parallel grain is split with the helper
/// thread of a loop or a short run (`team`).
const TEAM_WORK: usize = 1 << 15;
/// Virtual register ids of gathered inputs start here (instruction results are below).
const LOAD_BASE: u16 = 1 << 15;
/// A destination from here up to `LOAD_BASE` is f32 output `d - OUT_BASE`, written directly.
const OUT_BASE: u16 = 1 << 14;

#[derive(Clone, Copy, Debug)]
enum Opd {
    Reg(u16),
    /// A same-size f32 input, read in place.
    Ext(u16),
    /// A single value: scalar input or scalar-only member `.0` of the call's scalars.
    Scal(u16),
    /// An f32 output already written in this chunk (its index among the written outputs).
    Out(u16),
    /// An f32 input that repeats with a period along the flat index (a bias broadcast over
    /// the leading dims), read in place from a copy of one period tiled past a chunk.
    Tile(u16),
}

#[derive(Clone, Copy, Debug)]
enum Ins {
    /// Gathers external input `.0` (the index into `Body::loads`) into a register.
    Load(u16, u16),
    Unary(UnaryOp, Opd, u16),
    Not(Opd, u16),
    ToBool(Opd, u16),
    Binary(BinaryOp, Opd, Opd, u16),
    Select(Opd, Opd, Opd, u16),
}

#[derive(Clone, Copy)]
enum Data {
    F32(*const f32),
    Bool(*const bool),
}

/// How a gathered input is read: broadcast dims at stride 0, dims merged where possible.
struct Layout {
    dims: Vec<usize>,
    strides: Vec<usize>,
    /// Element offset of the first read (a slice's start).
    offset: usize,
}

#[derive(Clone, Copy)]
enum OutBuf {
    F32(*mut f32),
    Bool(*mut bool),
}

/// Output `k` of a group: an input passed through, or a value of the program.
#[derive(Clone, Copy)]
enum Out {
    Passed(usize),
    F32(Opd),
    Bool(Opd),
}

/// Programs compiled for a group (`Group::programs`), one per input layout.
#[derive(Default)]
pub struct Programs(Mutex<Vec<Arc<Program>>>);

impl std::fmt::Debug for Programs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Programs")
    }
}

/// Layouts a group keeps programs for; a group fed more shapes than this recompiles.
const MAX_PROGRAMS: usize = 8;

/// A group compiled for one input layout: everything except data pointers and scalar
/// values is fixed by the dtypes and shapes of the inputs (and broadcast_to targets).
pub struct Program {
    ext: Vec<(DType, Vec<usize>)>,
    target_slots: Vec<usize>,
    targets: Vec<Vec<i64>>,
    /// `None` when the outputs' runtime shapes differ (run unfused).
    body: Option<Body>,
}

struct Body {
    shape: Vec<usize>,
    n: usize,
    /// Per external input: `Scal` (one value), `Ext` (same size, in place) or `Reg` (a load).
    inputs: Vec<Opd>,
    /// Members whose operands are all single values; result `k` goes to scalar
    /// `scalar_inputs + k`.
    prelude: Vec<Ins>,
    scalars: usize,
    prog: Vec<Ins>,
    nregs: usize,
    loads: Vec<Layout>,
    /// Per load, the external input it reads (an index into `Group::ext`).
    load_src: Vec<usize>,
    /// Per `Opd::Tile` input: (index into `Group::ext`, period).
    tiles: Vec<(usize, usize)>,
    outs: Vec<Out>,
    /// Same-size f32 inputs that die here and may donate their buffers to the first
    /// `spare.len()` f32 outputs, one each.
    spare: Vec<usize>,
    /// The group is an optimizer update run with its values in registers (`fused_rules`).
    special: Option<Special>,
}

struct Kernel<'a> {
    prog: &'a [Ins],
    nregs: usize,
    ext: &'a [*const f32],
    loads: &'a [Layout],
    data: &'a [Data],
    /// Per `Opd::Tile`: (one period tiled to `period + min(CH, n)` elements, period).
    tiles: &'a [(*const f32, usize)],
    scal: &'a [f32],
    outs: &'a [(Opd, OutBuf)],
    /// A recognised update rule and the outputs' buffers in group output order.
    special: Option<(&'a Special, &'a [*mut f32])>,
    /// The group's folds, when they run fused: `exec` then runs tile by tile.
    folds: Option<&'a FoldRun>,
}

// SAFETY: the pointers are into buffers that outlive the parallel loop; tasks write
// disjoint ranges of the outputs and only read the inputs.
unsafe impl Sync for Kernel<'_> {}
unsafe impl Send for Kernel<'_> {}

/// The runtime shape of member or input `j` of a group.
fn shape_of<'a>(
    g: &Group,
    shapes: &'a [Vec<usize>],
    slots: &'a [Option<Value>],
    j: usize,
) -> &'a [usize] {
    match g.members.iter().position(|&m| m == j) {
        Some(p) => &shapes[p],
        None => slots[j]
            .as_ref()
            .expect("inputs are computed before their users")
            .shape(),
    }
}

fn fused_op(plan: &Plan, m: usize) -> FusedOp {
    match plan.nodes[m].op().gpu_kind() {
        GpuKind::Fused(f) => f,
        GpuKind::Source | GpuKind::Meta | GpuKind::View(_) | GpuKind::Kernel | GpuKind::Host => {
            unreachable!("fusion groups hold elementwise nodes only")
        }
    }
}

/// Runtime shapes of the members; errors as the unfused kernels report them.
fn member_shapes(plan: &Plan, g: &Group, slots: &[Option<Value>]) -> Result<Vec<Vec<usize>>> {
    let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(g.members.len());
    for &m in &g.members {
        let ins = &plan.inputs[m];
        let sh = |p: usize| shape_of(g, &shapes, slots, ins[p]);
        if let Op::Slice(spec) = plan.nodes[m].op() {
            let s = slice_shape(sh(0), spec);
            shapes.push(s);
            continue;
        }
        let s = match fused_op(plan, m) {
            FusedOp::Unary(_) | FusedOp::Cast(_) => sh(0).to_vec(),
            FusedOp::Binary(b) => broadcast_runtime(b.name(), sh(0), sh(1))?,
            FusedOp::Select => {
                broadcast_runtime("select", &broadcast_runtime("select", sh(0), sh(1))?, sh(2))?
            }
            FusedOp::BroadcastTo => {
                let t = slots[ins[1]].as_ref().expect("computed");
                let target: Vec<usize> =
                    t.to_i64_vec().iter().map(|&d| d.max(0) as usize).collect();
                let x = sh(0);
                if x != target.as_slice()
                    && broadcast_runtime("broadcast_to", x, &target)? != target
                {
                    return Err(Error::Value(format!(
                        "broadcast_to: cannot broadcast shape {x:?} to {target:?}"
                    )));
                }
                target
            }
        };
        shapes.push(s);
    }
    Ok(shapes)
}

/// Strides of `shape` read as the right-aligned `out` shape, with size-1 dims dropped
/// and neighbours merged where one stride continues the other.
fn gather_layout(shape: &[usize], out: &[usize]) -> Layout {
    let mut strides = vec![0usize; shape.len()];
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc *= shape[d];
    }
    strided_layout(shape, &strides, 0, out)
}

/// Periods up to which a repeating input is tiled (`Opd::Tile`) instead of gathered.
const MAX_PERIOD: usize = 1 << 14;

/// The period of a layout that repeats one contiguous run along the flat index (a bias
/// of the last dims broadcast over the leading ones), if it is one.
fn periodic(l: &Layout) -> Option<usize> {
    (l.offset == 0 && l.dims.len() == 2 && l.strides == [0, 1] && l.dims[1] <= MAX_PERIOD)
        .then(|| l.dims[1])
}

/// A slice `spec` of a row-major input of shape `input`, read as the right-aligned `out`.
fn slice_layout(input: &[usize], spec: &[SliceAxis], out: &[usize]) -> Layout {
    let (mut dims, mut strides, mut offset) = (
        Vec::with_capacity(input.len()),
        Vec::with_capacity(input.len()),
        0,
    );
    let mut acc = 1;
    for d in (0..input.len()).rev() {
        let (start, _, step, len) = match spec.get(d) {
            Some(a) => resolve_slice(a, input[d]),
            None => (0, 0, 1, input[d]),
        };
        dims.push(len);
        strides.push(acc * step as usize);
        offset += start as usize * acc;
        acc *= input[d];
    }
    dims.reverse();
    strides.reverse();
    strided_layout(&dims, &strides, offset, out)
}

/// The shape of a slice `spec` of an input of shape `input`.
fn slice_shape(input: &[usize], spec: &[SliceAxis]) -> Vec<usize> {
    input
        .iter()
        .enumerate()
        .map(|(d, &n)| spec.get(d).map_or(n, |a| resolve_slice(a, n).3))
        .collect()
}

/// Strided `shape` read as the right-aligned `out` shape (see `gather_layout`).
fn strided_layout(shape: &[usize], strides: &[usize], offset: usize, out: &[usize]) -> Layout {
    let lead = out.len() - shape.len();
    let mut st = vec![0usize; out.len()];
    for d in 0..shape.len() {
        st[lead + d] = if shape[d] == 1 { 0 } else { strides[d] };
    }
    let (mut dims, mut strides): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (&d, &s) in out.iter().zip(&st) {
        if d == 1 {
            continue;
        }
        if let (Some(pd), Some(ps)) = (dims.last_mut(), strides.last_mut()) {
            if *ps == s * d {
                *pd *= d;
                *ps = s;
                continue;
            }
        }
        dims.push(d);
        strides.push(s);
    }
    if dims.is_empty() {
        dims.push(1);
        strides.push(0);
    }
    Layout {
        dims,
        strides,
        offset,
    }
}

fn scalar_of(v: &Value) -> f32 {
    match v {
        Value::F32(a) => a.iter().next().copied().unwrap_or(0.0),
        Value::Bool(a) => a.iter().next().map_or(0.0, |&b| b as u8 as f32),
        other => unreachable!(
            "fusion groups read f32 and bool values, got {}",
            other.dtype()
        ),
    }
}

#[inline(always)]
fn unary_scalar(op: UnaryOp, x: f32) -> f32 {
    let mut out = [MaybeUninit::new(0.0f32)];
    op.map(&[x], &mut out);
    // SAFETY: map wrote out[0].
    unsafe { out[0].assume_init() }
}

#[inline(always)]
fn binary_scalar(op: BinaryOp, a: f32, b: f32) -> f32 {
    let mut out = [MaybeUninit::new(0.0f32)];
    op.zip(Splat(a), Splat(b), &mut out);
    // SAFETY: zip wrote out[0].
    unsafe { out[0].assume_init() }
}

/// One instruction on single values (members whose inputs are all scalars).
fn eval_scalar(ins: Ins, scal: &[f32]) -> f32 {
    let v = |o: Opd| match o {
        Opd::Scal(k) => scal[k as usize],
        Opd::Reg(_) | Opd::Ext(_) | Opd::Out(_) | Opd::Tile(_) => {
            unreachable!("scalar operands only")
        }
    };
    match ins {
        Ins::Unary(op, a, _) => unary_scalar(op, v(a)),
        Ins::Not(a, _) => (v(a) == 0.0) as u8 as f32,
        Ins::ToBool(a, _) => (v(a) != 0.0) as u8 as f32,
        Ins::Binary(op, a, b, _) => binary_scalar(op, v(a), v(b)),
        Ins::Select(c, a, b, _) => {
            if v(c) != 0.0 {
                v(a)
            } else {
                v(b)
            }
        }
        Ins::Load(..) => unreachable!("loads have no scalar form"),
    }
}

/// The program of `g` for the inputs now in `slots`: cached, or compiled and cached.
fn program(plan: &Plan, g: &Group, slots: &[Option<Value>]) -> Result<Arc<Program>> {
    let fits = |p: &Program| {
        g.ext.iter().zip(&p.ext).all(|(&j, (dt, sh))| {
            let v = slots[j].as_ref().expect("computed");
            v.dtype() == *dt && v.shape() == sh.as_slice()
        }) && p
            .target_slots
            .iter()
            .zip(&p.targets)
            .all(|(&s, t)| slots[s].as_ref().expect("computed").to_i64_vec() == *t)
    };
    let mut cache = g.programs.0.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = cache.iter().find(|p| fits(p)) {
        return Ok(p.clone());
    }
    let ext = g
        .ext
        .iter()
        .map(|&j| slots[j].as_ref().expect("computed"))
        .map(|v| (v.dtype(), v.shape().to_vec()))
        .collect();
    let target_slots: Vec<usize> = g
        .members
        .iter()
        .filter(|&&m| {
            matches!(
                plan.nodes[m].op().gpu_kind(),
                GpuKind::Fused(FusedOp::BroadcastTo)
            )
        })
        .map(|&m| plan.inputs[m][1])
        .collect();
    let targets = target_slots
        .iter()
        .map(|&s| slots[s].as_ref().expect("computed").to_i64_vec())
        .collect();
    let p = Arc::new(Program {
        ext,
        target_slots,
        targets,
        body: compile(plan, g, slots)?,
    });
    if cache.len() == MAX_PROGRAMS {
        cache.remove(0);
    }
    cache.push(p.clone());
    Ok(p)
}

/// Builds the register program of `g` for the shapes and dtypes of the inputs in `slots`.
fn compile(plan: &Plan, g: &Group, slots: &[Option<Value>]) -> Result<Option<Body>> {
    let shapes = member_shapes(plan, g, slots)?;
    let pos = |m: usize| g.members.iter().position(|&x| x == m).expect("member");
    let shape = shapes[pos(g.written().next().expect("a group writes a member"))].clone();
    if g.written().any(|o| shapes[pos(o)] != shape) {
        return Ok(None);
    }
    let n: usize = shape.iter().product();
    // Inputs: read in place (same-size f32), as one value, or gathered into a register.
    let mut inputs: Vec<Opd> = Vec::with_capacity(g.ext.len());
    let (mut scalars, mut same) = (0u16, 0u16);
    let mut loads: Vec<Layout> = Vec::new();
    // Per load, the external input it reads (an index into `g.ext`).
    let mut load_src: Vec<usize> = Vec::new();
    let mut tiles: Vec<(usize, usize)> = Vec::new();
    let slice_of = |m: usize| match plan.nodes[m].op() {
        Op::Slice(spec) => Some(spec),
        _ => None,
    };
    // Inputs read only through slices are not read directly.
    let direct = |j: usize| {
        g.members
            .iter()
            .any(|&m| slice_of(m).is_none() && plan.inputs[m].contains(&j))
    };
    for (e, &j) in g.ext.iter().enumerate() {
        let v = slots[j].as_ref().expect("computed");
        let len = v.len();
        if !direct(j) {
            // A register id no instruction reads: the slices load their own views.
            inputs.push(Opd::Reg(LOAD_BASE));
            continue;
        }
        let opd = match v.dtype() {
            DType::F32 | DType::Bool if len == 1 => {
                scalars += 1;
                Opd::Scal(scalars - 1)
            }
            DType::F32 if len == n => {
                same += 1;
                Opd::Ext(same - 1)
            }
            DType::F32 | DType::Bool => {
                let l = gather_layout(v.shape(), &shape);
                match periodic(&l) {
                    Some(period) if v.dtype() == DType::F32 => {
                        tiles.push((e, period));
                        Opd::Tile(tiles.len() as u16 - 1)
                    }
                    _ if l.dims.len() > 16 => return Ok(None),
                    _ => {
                        loads.push(l);
                        load_src.push(e);
                        Opd::Reg(LOAD_BASE + loads.len() as u16 - 1)
                    }
                }
            }
            other => {
                return Err(Error::Runtime(format!(
                    "internal: fused input of dtype {other}"
                )))
            }
        };
        inputs.push(opd);
    }
    // The program, in virtual registers (loads from LOAD_BASE until allocated).
    let mut prog: Vec<Ins> = Vec::new();
    let mut prelude: Vec<Ins> = Vec::new();
    let mut vregs = 0u16;
    let mut mem_opd: Vec<Opd> = Vec::with_capacity(g.members.len());
    for &m in &g.members {
        let ins = &plan.inputs[m];
        if let Some(spec) = slice_of(m) {
            let e = g
                .ext
                .iter()
                .position(|&x| x == ins[0])
                .expect("a slice's input is external");
            let l = slice_layout(
                slots[ins[0]].as_ref().expect("computed").shape(),
                spec,
                &shape,
            );
            if l.dims.len() > 16 {
                return Ok(None);
            }
            loads.push(l);
            load_src.push(e);
            mem_opd.push(Opd::Reg(LOAD_BASE + loads.len() as u16 - 1));
            continue;
        }
        let arg = |p: usize| -> Opd {
            let j = ins[p];
            match g.members.iter().position(|&x| x == j) {
                Some(q) => mem_opd[q],
                None => inputs[g.ext.iter().position(|&x| x == j).expect("external input")],
            }
        };
        let make = |dst: u16| match fused_op(plan, m) {
            FusedOp::Unary(UnaryOp::Not) => Some(Ins::Not(arg(0), dst)),
            FusedOp::Unary(u) => Some(Ins::Unary(u, arg(0), dst)),
            FusedOp::Binary(b) => Some(Ins::Binary(b, arg(0), arg(1), dst)),
            FusedOp::Select => Some(Ins::Select(arg(0), arg(1), arg(2), dst)),
            FusedOp::Cast(DType::Bool) if plan.nodes[ins[0]].dtype() == DType::F32 => {
                Some(Ins::ToBool(arg(0), dst))
            }
            FusedOp::Cast(_) | FusedOp::BroadcastTo => None,
        };
        let Some(ins) = make(vregs) else {
            mem_opd.push(arg(0));
            continue;
        };
        if operands(ins).all(|o| matches!(o, Opd::Scal(_))) {
            let k = scalars + prelude.len() as u16;
            prelude.push(make(k).expect("an instruction"));
            mem_opd.push(Opd::Scal(k));
        } else {
            prog.push(ins);
            mem_opd.push(Opd::Reg(vregs));
            vregs += 1;
        }
    }
    let mut outs: Vec<Out> = Vec::with_capacity(g.outputs.len() + g.hidden.len());
    for o in g.written() {
        let opd = mem_opd[pos(o)];
        outs.push(match (opd, plan.nodes[o].dtype()) {
            (Opd::Ext(x), _) => Out::Passed(
                inputs
                    .iter()
                    .position(|p| matches!(p, Opd::Ext(y) if *y == x))
                    .expect("in-place input"),
            ),
            (_, DType::F32) => Out::F32(opd),
            (_, DType::Bool) => Out::Bool(opd),
            (_, other) => {
                return Err(Error::Runtime(format!(
                    "internal: fused output of dtype {other}"
                )))
            }
        });
    }
    // Same-size f32 inputs that die here may become the first f32 outputs' buffers: such
    // an output is written after the whole chunk's program has read them.
    let mut spare = Vec::new();
    if outs.iter().any(|o| matches!(o, Out::F32(_))) {
        for (e, &j) in g.ext.iter().enumerate() {
            let passed = outs.iter().any(|o| matches!(o, Out::Passed(p) if *p == e));
            if matches!(inputs[e], Opd::Ext(_)) && !passed && g.frees.contains(&j) {
                spare.push(e);
            }
        }
    }
    let special = if g.folds.is_empty() && outs.iter().all(|o| matches!(o, Out::F32(_))) {
        let leaf = |j: usize| -> Option<Leaf> {
            let opd = match g.members.iter().position(|&x| x == j) {
                Some(q) => mem_opd[q],
                None => inputs[g.ext.iter().position(|&x| x == j)?],
            };
            match opd {
                Opd::Ext(x) => Some(Leaf::Vec(x)),
                Opd::Scal(k) => Some(Leaf::Scal(k)),
                Opd::Reg(v) if v < LOAD_BASE => Some(Leaf::Member),
                Opd::Reg(_) | Opd::Out(_) | Opd::Tile(_) => None,
            }
        };
        fused_rules::detect(plan, g, &leaf)
    } else {
        None
    };
    direct_writes(&mut prog, &mut outs, &spare, &inputs);
    // Register allocation: a register is free after its last reader; outputs live to the end.
    let out_opds: Vec<Opd> = outs
        .iter()
        .filter_map(|o| match *o {
            Out::F32(p) | Out::Bool(p) => Some(p),
            Out::Passed(_) => None,
        })
        .collect();
    let (prog, mut out_opds, nregs) = allocate(prog, &out_opds, loads.len(), vregs);
    out_opds.reverse();
    for o in &mut outs {
        match o {
            Out::F32(p) | Out::Bool(p) => *p = out_opds.pop().expect("one per output"),
            Out::Passed(_) => {}
        }
    }
    Ok(Some(Body {
        shape,
        n,
        inputs,
        prelude,
        scalars: scalars as usize,
        prog,
        nregs,
        loads,
        load_src,
        tiles,
        outs,
        spare,
        special,
    }))
}

/// Makes the instruction that computes an f32 output write it into the output's buffer
/// (later readers read it there), saving a copy from a register. Not for an output that
/// may take a dead input's buffer when an instruction at or after it reads such an input.
fn direct_writes(prog: &mut [Ins], outs: &mut [Out], spare: &[usize], inputs: &[Opd]) {
    let mut slot = 0u16;
    let mut f32_outs = 0;
    let mut to: Vec<Option<u16>> = vec![None; prog.len()];
    for o in outs.iter_mut() {
        let (is_f32, opd) = match *o {
            Out::F32(p) => (true, p),
            Out::Bool(p) => (false, p),
            Out::Passed(_) => continue,
        };
        let s = slot;
        slot += 1;
        let takes_spare = is_f32 && f32_outs < spare.len();
        f32_outs += is_f32 as usize;
        let Opd::Reg(v) = opd else { continue };
        if !is_f32 || v >= LOAD_BASE || to[v as usize].is_some() {
            continue;
        }
        // The instruction writing virtual register v is prog[v].
        let reads_spare = |ins: &Ins| {
            operands(*ins).any(|a| {
                spare
                    .iter()
                    .any(|&e| matches!((a, inputs[e]), (Opd::Ext(x), Opd::Ext(y)) if x == y))
            })
        };
        if !(takes_spare && prog[v as usize..].iter().any(reads_spare)) {
            to[v as usize] = Some(s);
        }
    }
    let redirect = |a: Opd| match a {
        Opd::Reg(v) if v < LOAD_BASE => to[v as usize].map_or(a, Opd::Out),
        Opd::Reg(_) | Opd::Ext(_) | Opd::Scal(_) | Opd::Out(_) | Opd::Tile(_) => a,
    };
    for ins in prog.iter_mut() {
        let d = |d: u16| to[d as usize].map_or(d, |s| OUT_BASE + s);
        *ins = match *ins {
            Ins::Load(..) => unreachable!("loads are added by allocate"),
            Ins::Unary(u, a, v) => Ins::Unary(u, redirect(a), d(v)),
            Ins::Not(a, v) => Ins::Not(redirect(a), d(v)),
            Ins::ToBool(a, v) => Ins::ToBool(redirect(a), d(v)),
            Ins::Binary(b, x, y, v) => Ins::Binary(b, redirect(x), redirect(y), d(v)),
            Ins::Select(c, x, y, v) => Ins::Select(redirect(c), redirect(x), redirect(y), d(v)),
        };
    }
    for o in outs.iter_mut() {
        if let Out::F32(opd) | Out::Bool(opd) = o {
            *opd = redirect(*opd);
        }
    }
}

/// The data of a standard-layout copy of `v` (kept in `held` when a copy was needed).
fn data_of(v: &Value, held: &mut Vec<Value>) -> Data {
    let standard = match v {
        Value::F32(a) => a.is_standard_layout(),
        Value::Bool(a) => a.is_standard_layout(),
        other => unreachable!(
            "fusion groups read f32 and bool values, got {}",
            other.dtype()
        ),
    };
    let v = if standard {
        v
    } else {
        held.push(v.clone().standard());
        held.last().expect("pushed")
    };
    match v {
        Value::F32(a) => Data::F32(a.as_ptr()),
        Value::Bool(a) => Data::Bool(a.as_ptr()),
        other => unreachable!(
            "fusion groups read f32 and bool values, got {}",
            other.dtype()
        ),
    }
}

/// A buffer for output slot `o` of `g` taken from a dead input that nothing else holds
/// (`spare`, not yet `donated`): the variable `o` is the new value of first, when `lend`
/// lets the run overwrite it, then the others in order.
fn donor(
    g: &Group,
    spare: &[usize],
    donated: &mut [bool],
    o: usize,
    slots: &mut [Option<Value>],
    lend: Option<&Lend>,
) -> Option<ndarray::Array<f32, IxDyn>> {
    let own = lend.and_then(|l| l.donor[o]);
    let first = spare.iter().position(|&e| Some(g.ext[e]) == own);
    for s in first
        .into_iter()
        .chain((0..spare.len()).filter(|&s| Some(s) != first))
    {
        let j = g.ext[spare[s]];
        if donated[s] || !matches!(&slots[j], Some(Value::F32(a)) if a.is_standard_layout()) {
            continue;
        }
        let buf = match lend.and_then(|l| l.cells[j].as_ref()) {
            Some(cell) => cell.lend(&mut slots[j]),
            None => {
                let Some(Value::F32(a)) = slots[j].take() else {
                    unreachable!("checked f32")
                };
                a.try_into_owned_nocopy()
                    .map_err(|a| slots[j] = Some(Value::F32(a)))
                    .ok()
            }
        };
        if buf.is_some() {
            donated[s] = true;
            return buf;
        }
    }
    None
}

/// Runs group `g` reading its inputs from `slots` (dead inputs may be taken out of them,
/// and variables `lend` names overwritten). Returns the output values in `g.outputs`
/// order, or `None` when the outputs' runtime shapes differ (the caller then runs the
/// members one by one).
pub fn run(
    plan: &Plan,
    g: &Group,
    slots: &mut [Option<Value>],
    lend: Option<&Lend>,
) -> Result<Option<Vec<Value>>> {
    match g.first {
        Some(f) => run_after(plan, g, f, slots, lend),
        None => run_driven(plan, g, slots, lend, &|kern, shape| {
            split_exec(kern, shape.iter().product(), g.cost)
        }),
    }
}

/// Node `f`'s result shape, image count and kernel, when it has an image-by-image f32
/// kernel for these inputs.
fn first_kernel<'a>(
    plan: &'a Plan,
    f: usize,
    ins: &'a [Value],
) -> Result<Option<(Vec<usize>, usize, ImageKernel<'a>)>> {
    match plan.nodes[f].op() {
        Op::Conv(spec) => {
            let (Value::F32(x), Value::F32(w)) = (&ins[0], &ins[1]) else {
                return Ok(None);
            };
            let geo = crate::ops::conv::forward_geom(spec, x.shape(), w.shape())?;
            let (shape, n) = (geo.y_shape.clone(), geo.n);
            let (x, w) = (x.as_standard_layout(), w.as_standard_layout());
            let k: ImageKernel<'a> = Box::new(move |y, after| {
                let (x, w) = (
                    x.as_slice().expect("standard"),
                    w.as_slice().expect("standard"),
                );
                crate::ops::conv::cpu::forward_f32_then(&geo, x, w, y, after)
            });
            Ok(Some((shape, n, k)))
        }
        Op::Pool(spec) => crate::ops::pool::f32_then(spec, &ins[0], None),
        Op::PoolGrad(spec) => crate::ops::pool::f32_then(spec, &ins[0], Some(&ins[1])),
        _ => Ok(None),
    }
}

/// Runs node `f` and then `g` on each image of its result as soon as the image is
/// written (see `fuse::Group::first`). The result's buffer is put in slot `f` before it
/// is computed, so the group's program, inputs and buffer donation see it as any input
/// (the group may write its output in place there).
fn run_after(
    plan: &Plan,
    g: &Group,
    f: usize,
    slots: &mut [Option<Value>],
    lend: Option<&Lend>,
) -> Result<Option<Vec<Value>>> {
    let ins: Vec<Value> = plan.inputs[f]
        .iter()
        .map(|&j| slots[j].clone().expect("computed"))
        .collect();
    let plain = |slots: &mut [Option<Value>]| -> Result<()> {
        let refs: Vec<&Value> = ins.iter().collect();
        slots[f] = Some(plan.nodes[f].op().cpu(&refs)?);
        Ok(())
    };
    let Some((shape, images, kernel)) = first_kernel(plan, f, &ins)? else {
        plain(slots)?;
        return run_driven(plan, g, slots, lend, &|kern, shape| {
            split_exec(kern, shape.iter().product(), g.cost)
        });
    };
    let len: usize = shape.iter().product();
    let mut y: Vec<f32> = uninit(len);
    let dst = crate::ops::matmul::SharedDst(y.as_mut_ptr());
    slots[f] = Some(Value::F32(
        Arr::from_shape_vec(IxDyn(&shape), y).expect("length of the shape"),
    ));
    let ran = std::cell::Cell::new(false);
    let drive = |kern: &Kernel<'_>, gshape: &[usize]| {
        let d = dst;
        // SAFETY: the buffer of slot f (or of the output it was donated to) holds `len`
        // elements, and nothing reads it before the kernel writes it: the group reads
        // image i only in `after(i)`.
        let y = unsafe { std::slice::from_raw_parts_mut(d.0, len) };
        if gshape == shape.as_slice()
            && images > 0
            && kern.folds.is_none_or(|f| (len / images) % f.q == 0)
        {
            let img = len / images;
            kernel(y, &|i| exec(kern, i * img, (i + 1) * img));
        } else {
            kernel(y, &|_| {});
            split_exec(kern, gshape.iter().product(), g.cost);
        }
        ran.set(true);
    };
    let out = run_driven(plan, g, slots, lend, &drive)?;
    if !ran.get() {
        // The group did not run (outputs of different shapes, or nothing to compute): the
        // members read a computed result.
        plain(slots)?;
    }
    Ok(out)
}

/// Runs the kernel over its `n` elements: in parallel chunks, in halves with the loop's
/// helper thread, or here.
fn split_exec(kern: &Kernel<'_>, n: usize, cost: usize) {
    // On a rayon worker (a loop body, see `cpu::on_worker`) the groups are small and the
    // other workers mostly asleep, each split waking one: split only 8x more work there
    // (Keras LSTM step faster in 5 of 6 interleaved runs, ~7%; at the top level the MLP's
    // groups lose when split less).
    let scale = if rayon::current_thread_index().is_some() {
        8
    } else {
        1
    };
    // Folded rows or columns do not straddle tasks (`fold_exec`).
    let q = kern.folds.map_or(1, |f| f.q);
    let step = (grain(cost) * scale).div_ceil(CH) * CH;
    let step = step.div_ceil(q) * q;
    if n < 2 * step {
        // In a loop the other thread of the team (if any) takes the second half.
        let half = (n / 2).div_ceil(CH) * CH;
        let half = half.div_ceil(q) * q;
        if n.saturating_mul(cost) >= TEAM_WORK && half < n && team::available() {
            team::split2(&|part| {
                if part == 0 {
                    exec(kern, 0, half)
                } else {
                    exec(kern, half, n)
                }
            });
        } else {
            exec(kern, 0, n);
        }
    } else {
        (0..n.div_ceil(step))
            .into_par_iter()
            .for_each(|t| exec(kern, t * step, ((t + 1) * step).min(n)));
    }
}

/// Runs group `g` with `drive(kernel, shape)` running the kernel over its elements.
fn run_driven(
    plan: &Plan,
    g: &Group,
    slots: &mut [Option<Value>],
    lend: Option<&Lend>,
    drive: &dyn Fn(&Kernel<'_>, &[usize]),
) -> Result<Option<Vec<Value>>> {
    let p = program(plan, g, slots)?;
    let Some(b) = &p.body else { return Ok(None) };
    if b.n == 0 {
        let mut vals: Vec<Value> = g
            .outputs
            .iter()
            .map(|&o| Value::full(plan.nodes[o].dtype(), &b.shape, 0.0))
            .collect();
        for f in &g.folds {
            vals.push(fold_plain(
                plan,
                f,
                &Value::full(DType::F32, &b.shape, 0.0),
                slots,
            )?);
        }
        return Ok(Some(vals));
    }
    let written: Vec<usize> = g.written().collect();
    let folds = if g.folds.is_empty() || b.special.is_some() {
        None
    } else {
        fold_run(plan, g, b, &written, slots)
    };
    let n = b.n;
    // Per call: the inputs' data pointers and single values, then the scalar members.
    let mut scal: Vec<f32> = Vec::with_capacity(b.scalars + b.prelude.len());
    let mut ext: Vec<*const f32> = Vec::with_capacity(g.ext.len());
    let mut data: Vec<Data> = Vec::with_capacity(b.loads.len());
    let mut held: Vec<Value> = Vec::new();
    for (&j, &opd) in g.ext.iter().zip(&b.inputs) {
        let v = slots[j].as_ref().expect("computed");
        match opd {
            Opd::Scal(_) => scal.push(scalar_of(v)),
            Opd::Ext(_) => match data_of(v, &mut held) {
                Data::F32(p) => ext.push(p),
                Data::Bool(_) => unreachable!("same-size inputs are f32"),
            },
            Opd::Reg(_) => {}
            Opd::Tile(_) => {}
            Opd::Out(_) => unreachable!("inputs are not outputs"),
        }
    }
    for &e in &b.load_src {
        data.push(data_of(
            slots[g.ext[e]].as_ref().expect("computed"),
            &mut held,
        ));
    }
    let tiled: Vec<Vec<f32>> = b
        .tiles
        .iter()
        .map(|&(e, period)| {
            let Data::F32(p) = data_of(slots[g.ext[e]].as_ref().expect("computed"), &mut held)
            else {
                unreachable!("tiled inputs are f32")
            };
            // SAFETY: the input holds at least one period (its layout repeats it).
            let one = unsafe { std::slice::from_raw_parts(p, period) };
            // A chunk reads at most min(CH, n) elements from a phase below the period.
            one.iter()
                .copied()
                .cycle()
                .take(period + CH.min(n))
                .collect()
        })
        .collect();
    let tiles: Vec<(*const f32, usize)> = tiled
        .iter()
        .zip(&b.tiles)
        .map(|(t, &(_, period))| (t.as_ptr(), period))
        .collect();
    for &ins in &b.prelude {
        scal.push(eval_scalar(ins, &scal));
    }
    let mut donated = vec![false; b.spare.len()];
    let mut f32_outs = 0;
    let mut results: Vec<Option<Value>> = vec![None; b.outs.len()];
    let mut outs: Vec<(Opd, OutBuf)> = Vec::with_capacity(b.outs.len());
    let mut bufs_f32: Vec<(usize, ndarray::Array<f32, IxDyn>)> = Vec::new();
    let mut bufs_bool: Vec<(usize, Vec<bool>)> = Vec::new();
    for (k, &o) in b.outs.iter().enumerate() {
        match o {
            Out::Passed(e) => {
                results[k] = Some(
                    slots[g.ext[e]]
                        .as_ref()
                        .expect("computed")
                        .reshape(&b.shape)?,
                )
            }
            // A hidden member folded in tiles: `fold_exec` points it at a tile buffer.
            Out::F32(opd) if k >= g.outputs.len() && folds.is_some() => {
                outs.push((opd, OutBuf::F32(std::ptr::null_mut())))
            }
            Out::F32(opd) => {
                let donor = if f32_outs < b.spare.len() {
                    donor(g, &b.spare, &mut donated, written[k], slots, lend)
                } else {
                    None
                };
                f32_outs += 1;
                // The kernel writes every element before the buffer is read.
                let mut buf = donor.unwrap_or_else(|| {
                    ndarray::Array::from_shape_vec(IxDyn(&[n]), uninit(n)).expect("n elements")
                });
                outs.push((opd, OutBuf::F32(buf.as_mut_ptr())));
                bufs_f32.push((k, buf));
            }
            Out::Bool(opd) => {
                let mut v: Vec<bool> = Vec::with_capacity(n);
                outs.push((opd, OutBuf::Bool(v.as_mut_ptr())));
                bufs_bool.push((k, v));
            }
        }
    }
    let out_ptrs: Vec<*mut f32> = match &b.special {
        Some(_) => outs
            .iter()
            .map(|(_, o)| match o {
                OutBuf::F32(p) => *p,
                OutBuf::Bool(_) => unreachable!("update rules write f32"),
            })
            .collect(),
        None => Vec::new(),
    };
    let special = b.special.as_ref().map(|sp| (sp, out_ptrs.as_slice()));
    let kern = Kernel {
        prog: &b.prog,
        nregs: b.nregs,
        ext: &ext,
        loads: &b.loads,
        data: &data,
        tiles: &tiles,
        scal: &scal,
        outs: &outs,
        special,
        folds: folds.as_ref(),
    };
    drive(&kern, &b.shape);
    drop(held);
    for (k, buf) in bufs_f32 {
        let buf = buf
            .into_shape_with_order(IxDyn(&b.shape))
            .map_err(|e| Error::Runtime(format!("fusion: {e}")))?;
        results[k] = Some(Value::F32(buf.into_shared()));
    }
    for (k, mut v) in bufs_bool {
        // SAFETY: the kernel wrote all n elements.
        unsafe { v.set_len(n) };
        results[k] = Some(Value::Bool(
            Arr::from_shape_vec(IxDyn(&b.shape), v).expect("n elements"),
        ));
    }
    let mut vals: Vec<Value> = results[..g.outputs.len()]
        .iter()
        .map(|r| r.clone().expect("every output written"))
        .collect();
    match folds {
        Some(f) => vals.extend(f.finish()),
        None => {
            for f in &g.folds {
                let k = written
                    .iter()
                    .position(|&w| w == f.member)
                    .expect("folded members are written");
                vals.push(fold_plain(
                    plan,
                    f,
                    results[k].as_ref().expect("written in full"),
                    slots,
                )?);
            }
        }
    }
    Ok(Some(vals))
}

/// Fold `f` run as its own node on the whole member value `v`.
fn fold_plain(plan: &Plan, f: &Fold, v: &Value, slots: &[Option<Value>]) -> Result<Value> {
    let mut ins: Vec<&Value> = vec![v];
    ins.extend(
        plan.inputs[f.node][1..]
            .iter()
            .map(|&j| slots[j].as_ref().expect("computed before the group")),
    );
    plan.nodes[f.node].op().cpu(&ins)
}

/// Elements per fold tile (rounded up to whole rows or column blocks).
const FOLD_TILE: usize = 8 << 10;
/// Largest row or column block a fold keeps whole in a tile.
const MAX_FOLD_BLOCK: usize = 1 << 16;

/// How one fold adds up its member: `rows` of `red` elements each to one value (axes at
/// the end reduced), or `red` rows of `inner` columns to `inner` values (axes at the start).
struct FoldSpec {
    /// The member's buffer among the kernel's outputs, and whether it is hidden (a tile).
    out: usize,
    hidden: bool,
    rows: bool,
    red: usize,
    inner: usize,
    mean: bool,
    shape: Vec<usize>,
}

/// The folds of one group run, and the partial sums its tasks leave.
struct FoldRun {
    specs: Vec<FoldSpec>,
    /// Task boundaries fall on multiples of `q` elements; tiles are `tile` elements.
    q: usize,
    tile: usize,
    hidden: usize,
    /// Per task: its first element and, per fold, its sums (f64; for `rows`, one per row
    /// of the task, else one per column).
    parts: Mutex<Vec<(usize, Vec<Vec<f64>>)>>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The fused plan of `g`'s folds for this run's shapes, or `None` to run them on the
/// written-out members (a reduction pattern other than leading or trailing axes, a member
/// passed through from an input, blocks too long for a tile).
fn fold_run(
    plan: &Plan,
    g: &Group,
    b: &Body,
    written: &[usize],
    slots: &[Option<Value>],
) -> Option<FoldRun> {
    let s = &b.shape;
    let mut specs = Vec::with_capacity(g.folds.len());
    let mut q = 1usize;
    for f in &g.folds {
        let k = written.iter().position(|&w| w == f.member)?;
        if !matches!(b.outs[k], Out::F32(_)) {
            return None;
        }
        let out = b.outs[..k]
            .iter()
            .filter(|o| !matches!(o, Out::Passed(_)))
            .count();
        let (reduced, mean, shape): (Vec<bool>, bool, Vec<usize>) = match plan.nodes[f.node].op() {
            Op::Reduce { op, axes, keepdims } => {
                let reduced: Vec<bool> = (0..s.len()).map(|d| axes.contains(&d)).collect();
                let shape = (0..s.len())
                    .filter_map(|d| {
                        if !reduced[d] {
                            Some(s[d])
                        } else if *keepdims {
                            Some(1)
                        } else {
                            None
                        }
                    })
                    .collect();
                (reduced, matches!(op, crate::ops::ReduceOp::Mean), shape)
            }
            Op::SumTo => {
                let target = slots[plan.inputs[f.node][1]].as_ref()?.to_i64_vec();
                let lead = s.len().checked_sub(target.len())?;
                let mut reduced = vec![true; lead];
                for (i, &t) in target.iter().enumerate() {
                    let d = s[lead + i];
                    match t {
                        1 => reduced.push(d != 1),
                        t if t >= 0 && t as usize == d => reduced.push(false),
                        // Not a reduction of this shape: the op reports it.
                        _ => return None,
                    }
                }
                (reduced, false, target.iter().map(|&t| t as usize).collect())
            }
            _ => return None,
        };
        // Dims of size 1 go either way; the others must be reduced ones then kept ones
        // (columns) or kept ones then reduced ones (rows).
        let kinds: Vec<bool> = (0..s.len())
            .filter(|&d| s[d] != 1)
            .map(|d| reduced[d])
            .collect();
        let prod = |keep: bool| {
            (0..s.len())
                .filter(|&d| reduced[d] != keep)
                .map(|d| s[d])
                .product::<usize>()
        };
        let (red, inner) = (prod(false), prod(true));
        let (rows, block) = if kinds.windows(2).all(|w| w[0] || !w[1]) {
            (false, inner)
        } else if kinds.windows(2).all(|w| !w[0] || w[1]) {
            (true, red)
        } else {
            return None;
        };
        if block > MAX_FOLD_BLOCK {
            return None;
        }
        q = q / gcd(q, block) * block;
        if q > MAX_FOLD_BLOCK {
            return None;
        }
        specs.push(FoldSpec {
            out,
            hidden: k >= g.outputs.len(),
            rows,
            red,
            inner,
            mean,
            shape,
        });
    }
    let tile = FOLD_TILE.div_ceil(q) * q;
    let hidden = specs.iter().filter(|f| f.hidden).count();
    Some(FoldRun {
        specs,
        q,
        tile,
        hidden,
        parts: Mutex::new(Vec::new()),
    })
}

thread_local! {
    /// Tiles of hidden members (`fold_exec`).
    static FOLD_TILES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs elements `[start, end)` (whole rows and column blocks of every fold) tile by
/// tile, adding each folded member's tile into this task's sums while it is in cache.
fn fold_exec(k: &Kernel<'_>, f: &FoldRun, start: usize, end: usize) {
    let mut parts: Vec<Vec<f64>> = f
        .specs
        .iter()
        .map(|s| {
            vec![
                0.0;
                if s.rows {
                    (end - start).div_ceil(s.red)
                } else {
                    s.inner
                }
            ]
        })
        .collect();
    let mut cols: Vec<f32> = Vec::new();
    FOLD_TILES.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() < f.hidden * f.tile {
            t.resize(f.hidden * f.tile, 0.0);
        }
        let base = t.as_mut_ptr();
        let mut outs: Vec<(Opd, OutBuf)> = k.outs.to_vec();
        let mut ts = start;
        while ts < end {
            let te = end.min(ts + f.tile);
            let mut h = 0;
            for s in &f.specs {
                if s.hidden {
                    // Offset back so that element `ts` lands at the tile's start.
                    outs[s.out].1 = OutBuf::F32(base.wrapping_add(h * f.tile).wrapping_sub(ts));
                    h += 1;
                }
            }
            exec(
                &Kernel {
                    outs: &outs,
                    folds: None,
                    ..*k
                },
                ts,
                te,
            );
            for (s, part) in f.specs.iter().zip(&mut parts) {
                let OutBuf::F32(p) = outs[s.out].1 else {
                    unreachable!("folded members are f32")
                };
                // SAFETY: the kernel has just written elements [ts, te) of this buffer.
                let x = unsafe { std::slice::from_raw_parts(p.wrapping_add(ts), te - ts) };
                if s.rows {
                    for (r, row) in x.chunks(s.red).enumerate() {
                        part[(ts - start) / s.red + r] += crate::ops::reduce::sum_f32(row) as f64;
                    }
                } else if s.inner == 1 {
                    part[0] += crate::ops::reduce::sum_f32(x) as f64;
                } else {
                    cols.clear();
                    cols.resize(s.inner, 0.0);
                    crate::ops::reduce::fold_sum_f32(&mut cols, x, x.len() / s.inner, s.inner);
                    part.iter_mut()
                        .zip(&cols)
                        .for_each(|(a, &c)| *a += c as f64);
                }
            }
            ts = te;
        }
    });
    f.parts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((start, parts));
}

impl FoldRun {
    /// The folds' results, from the tasks' sums in element order.
    fn finish(self) -> Vec<Value> {
        let mut parts = self.parts.into_inner().unwrap_or_else(|e| e.into_inner());
        parts.sort_unstable_by_key(|p| p.0);
        self.specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let sums: Vec<f64> = if s.rows {
                    parts.iter().flat_map(|p| p.1[i].iter().copied()).collect()
                } else {
                    let mut acc = vec![0.0f64; s.inner];
                    for p in &parts {
                        acc.iter_mut().zip(&p.1[i]).for_each(|(a, &v)| *a += v);
                    }
                    acc
                };
                let div = if s.mean { s.red as f64 } else { 1.0 };
                let v: Vec<f32> = sums.iter().map(|&a| (a / div) as f32).collect();
                Value::from_vec(&s.shape, v).expect("the fold's shape holds its sums")
            })
            .collect()
    }
}

/// The update rules recognised in the programs compiled so far for group `g`.
#[cfg(test)]
pub fn rules_of(g: &Group) -> Vec<fused_rules::Rule> {
    let cache = g.programs.0.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .iter()
        .filter_map(|p| p.body.as_ref()?.special.as_ref().map(|s| s.rule))
        .collect()
}

fn operands(ins: Ins) -> impl Iterator<Item = Opd> {
    let (a, b, c) = match ins {
        Ins::Load(..) => (None, None, None),
        Ins::Unary(_, a, _) | Ins::Not(a, _) | Ins::ToBool(a, _) => (Some(a), None, None),
        Ins::Binary(_, a, b, _) => (Some(a), Some(b), None),
        Ins::Select(c, a, b, _) => (Some(c), Some(a), Some(b)),
    };
    a.into_iter().chain(b).chain(c)
}

/// Maps virtual registers (instruction results `0..vregs`, gathered inputs from
/// `LOAD_BASE`) to physical ones, so a chunk needs as many registers as values are live.
fn allocate(
    prog: Vec<Ins>,
    outs: &[Opd],
    nloads: usize,
    vregs: u16,
) -> (Vec<Ins>, Vec<Opd>, usize) {
    let mut seq: Vec<Ins> = (0..nloads)
        .map(|k| Ins::Load(k as u16, LOAD_BASE + k as u16))
        .collect();
    seq.extend(prog);
    let key = |r: u16| -> usize {
        if r >= LOAD_BASE {
            vregs as usize + (r - LOAD_BASE) as usize
        } else {
            r as usize
        }
    };
    let total = vregs as usize + nloads;
    let mut last: Vec<Option<usize>> = vec![None; total];
    for (t, ins) in seq.iter().enumerate() {
        for o in operands(*ins) {
            if let Opd::Reg(r) = o {
                last[key(r)] = Some(t);
            }
        }
    }
    for o in outs {
        if let Opd::Reg(r) = o {
            last[key(*r)] = Some(usize::MAX);
        }
    }
    let mut phys: Vec<u16> = vec![u16::MAX; total];
    let mut free: Vec<u16> = Vec::new();
    let mut nregs = 0u16;
    let remap = |o: Opd, phys: &[u16]| match o {
        Opd::Reg(r) => Opd::Reg(phys[key(r)]),
        Opd::Ext(_) | Opd::Scal(_) | Opd::Out(_) | Opd::Tile(_) => o,
    };
    let mut out_seq = Vec::with_capacity(seq.len());
    for (t, ins) in seq.into_iter().enumerate() {
        let d = match ins {
            Ins::Load(_, d)
            | Ins::Unary(_, _, d)
            | Ins::Not(_, d)
            | Ins::ToBool(_, d)
            | Ins::Binary(_, _, _, d)
            | Ins::Select(_, _, _, d) => d,
        };
        let to_out = (OUT_BASE..LOAD_BASE).contains(&d);
        let p = if to_out {
            d
        } else {
            let p = free.pop().unwrap_or_else(|| {
                nregs += 1;
                nregs - 1
            });
            phys[key(d)] = p;
            p
        };
        let r = |o: Opd| remap(o, &phys);
        out_seq.push(match ins {
            Ins::Load(k, _) => Ins::Load(k, p),
            Ins::Unary(u, a, _) => Ins::Unary(u, r(a), p),
            Ins::Not(a, _) => Ins::Not(r(a), p),
            Ins::ToBool(a, _) => Ins::ToBool(r(a), p),
            Ins::Binary(b, x, y, _) => Ins::Binary(b, r(x), r(y), p),
            Ins::Select(c, x, y, _) => Ins::Select(r(c), r(x), r(y), p),
        });
        // Operands read for the last time are freed after the destination was chosen, so
        // an instruction never writes a register it reads.
        let mut dead: Vec<u16> = operands(ins)
            .filter_map(|o| match o {
                Opd::Reg(v) if last[key(v)] == Some(t) => Some(phys[key(v)]),
                Opd::Reg(_) | Opd::Ext(_) | Opd::Scal(_) | Opd::Out(_) | Opd::Tile(_) => None,
            })
            .collect();
        dead.sort_unstable();
        dead.dedup();
        free.extend(dead);
        if !to_out && last[key(d)].is_none() {
            free.push(p);
        }
    }
    let outs = outs.iter().map(|&o| remap(o, &phys)).collect();
    (out_seq, outs, nregs as usize)
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs elements `[start, end)` with this thread's scratch registers.
fn exec(k: &Kernel<'_>, start: usize, end: usize) {
    if let Some(f) = k.folds {
        return fold_exec(k, f, start, end);
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < k.nregs * CH {
            s.resize(k.nregs * CH, 0.0);
        }
        exec_chunks(k, s.as_mut_ptr(), start, end)
    })
}

// The chunk loop itself is the instruction-set-dispatched function: a closure (such as
// the one `with` takes) would be compiled without the wider instruction sets.
#[inline(always)]
fn exec_chunks_body(k: &Kernel<'_>, regs: *mut f32, start: usize, end: usize) {
    if let Some((sp, outs)) = k.special {
        // SAFETY: the inputs and outputs hold n >= end elements each.
        unsafe { fused_rules::run(sp, k.ext, k.scal, outs, start, end - start) };
        return;
    }
    let mut off = start;
    while off < end {
        let len = CH.min(end - off);
        // SAFETY: `regs` has nregs * CH elements; `off + len <= n` for every input and output.
        unsafe { chunk(k, regs, off, len) };
        off += len;
    }
}
crate::multiversion!(fn exec_chunks(k: &Kernel<'_>, regs: *mut f32, start: usize, end: usize) => exec_chunks_body);

enum Src<'a> {
    S(&'a [f32]),
    C(f32),
}

/// # Safety
/// As `chunk`; the slice must not overlap a live `reg_mut` of the same register.
#[inline(always)]
unsafe fn source<'a>(k: &Kernel<'_>, regs: *mut f32, o: Opd, off: usize, len: usize) -> Src<'a> {
    match o {
        Opd::Reg(r) => Src::S(std::slice::from_raw_parts(regs.add(r as usize * CH), len)),
        Opd::Ext(e) => Src::S(std::slice::from_raw_parts(k.ext[e as usize].add(off), len)),
        Opd::Scal(v) => Src::C(k.scal[v as usize]),
        Opd::Tile(t) => {
            let (p, period) = k.tiles[t as usize];
            Src::S(std::slice::from_raw_parts(p.add(off % period), len))
        }
        // Output pointers may be offset back from a tile's buffer (`fold_exec`): wrapping
        // arithmetic, since only the element reached is within the allocation.
        Opd::Out(s) => match k.outs[s as usize].1 {
            OutBuf::F32(p) => Src::S(std::slice::from_raw_parts(p.wrapping_add(off), len)),
            OutBuf::Bool(_) => unreachable!("direct writes are f32"),
        },
    }
}

/// # Safety
/// As `chunk`; register `r` must not be read while the slice lives.
#[inline(always)]
unsafe fn reg_mut<'a>(regs: *mut f32, r: u16, len: usize) -> &'a mut [MaybeUninit<f32>] {
    std::slice::from_raw_parts_mut(regs.add(r as usize * CH).cast(), len)
}

/// # Safety
/// `regs` holds `k.nregs * CH` floats; `[off, off + len)` is within every buffer.
#[inline(always)]
unsafe fn chunk(k: &Kernel<'_>, regs: *mut f32, off: usize, len: usize) {
    let src = |o: Opd| source(k, regs, o, off, len);
    // The destination is never one of the instruction's operands (`allocate`, `direct_writes`).
    let dst = |r: u16| match r {
        OUT_BASE..LOAD_BASE => match k.outs[(r - OUT_BASE) as usize].1 {
            OutBuf::F32(p) => std::slice::from_raw_parts_mut(p.wrapping_add(off).cast(), len),
            OutBuf::Bool(_) => unreachable!("direct writes are f32"),
        },
        _ => reg_mut(regs, r, len),
    };
    for &ins in k.prog {
        match ins {
            Ins::Load(l, d) => gather(&k.loads[l as usize], k.data[l as usize], off, dst(d)),
            Ins::Unary(op, a, d) => match src(a) {
                Src::S(x) => op.map(x, dst(d)),
                Src::C(x) => fill(dst(d), unary_scalar(op, x)),
            },
            Ins::Not(a, d) => match src(a) {
                Src::S(x) => map(x, dst(d), |v| (v == 0.0) as u8 as f32),
                Src::C(x) => fill(dst(d), (x == 0.0) as u8 as f32),
            },
            Ins::ToBool(a, d) => match src(a) {
                Src::S(x) => map(x, dst(d), |v| (v != 0.0) as u8 as f32),
                Src::C(x) => fill(dst(d), (x != 0.0) as u8 as f32),
            },
            Ins::Binary(op, a, b, d) => match (src(a), src(b)) {
                (Src::S(x), Src::S(y)) => op.zip(x, y, dst(d)),
                (Src::S(x), Src::C(y)) => op.zip(x, Splat(y), dst(d)),
                (Src::C(x), Src::S(y)) => op.zip(Splat(x), y, dst(d)),
                (Src::C(x), Src::C(y)) => op.zip(Splat(x), Splat(y), dst(d)),
            },
            Ins::Select(c, a, b, d) => match src(c) {
                Src::C(c) => match src(if c != 0.0 { a } else { b }) {
                    Src::S(x) => map(x, dst(d), |v| v),
                    Src::C(x) => fill(dst(d), x),
                },
                Src::S(c) => match (src(a), src(b)) {
                    (Src::S(x), Src::S(y)) => select(c, x, y, dst(d)),
                    (Src::S(x), Src::C(y)) => select(c, x, Splat(y), dst(d)),
                    (Src::C(x), Src::S(y)) => select(c, Splat(x), y, dst(d)),
                    (Src::C(x), Src::C(y)) => select(c, Splat(x), Splat(y), dst(d)),
                },
            },
        }
    }
    for (s, (o, buf)) in k.outs.iter().enumerate() {
        if matches!(o, Opd::Out(w) if *w as usize == s) {
            continue;
        }
        match buf {
            OutBuf::F32(p) => {
                let out: &mut [MaybeUninit<f32>] =
                    std::slice::from_raw_parts_mut(p.wrapping_add(off).cast(), len);
                match src(*o) {
                    Src::S(x) => map(x, out, |v| v),
                    Src::C(x) => fill(out, x),
                }
            }
            OutBuf::Bool(p) => {
                let out: &mut [MaybeUninit<bool>] =
                    std::slice::from_raw_parts_mut(p.add(off).cast(), len);
                match src(*o) {
                    Src::S(x) => {
                        for (o, &v) in out.iter_mut().zip(x) {
                            o.write(v != 0.0);
                        }
                    }
                    Src::C(x) => out.iter_mut().for_each(|o| {
                        o.write(x != 0.0);
                    }),
                }
            }
        }
    }
}

#[inline(always)]
fn map(x: &[f32], out: &mut [MaybeUninit<f32>], f: impl Fn(f32) -> f32) {
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(f(v));
    }
}

#[inline(always)]
fn fill(out: &mut [MaybeUninit<f32>], v: f32) {
    out.iter_mut().for_each(|o| {
        o.write(v);
    });
}

#[inline(always)]
fn select<A: Lane<f32>, B: Lane<f32>>(c: &[f32], a: A, b: B, out: &mut [MaybeUninit<f32>]) {
    let n = out.len();
    let (c, a, b) = (&c[..n], a.fit(n), b.fit(n));
    // A bit mask rather than `if`: with the branch the compiler picks an address and loads
    // once per element, which does not vectorise.
    for (i, o) in out.iter_mut().enumerate() {
        let m = 0u32.wrapping_sub((c[i] != 0.0) as u32);
        // SAFETY: i < n, the length both operands were fitted to.
        let (x, y) = unsafe { (a.at(i), b.at(i)) };
        o.write(f32::from_bits((x.to_bits() & m) | (y.to_bits() & !m)));
    }
}

/// Reads elements `[off, off + out.len())` of the broadcast input into `out`.
#[inline(always)]
unsafe fn gather(g: &Layout, data: Data, off: usize, out: &mut [MaybeUninit<f32>]) {
    let r = g.dims.len();
    // Multi-index of `off` and the input offset it maps to.
    let mut idx = [0usize; 16];
    let mut rem = off;
    let mut base = g.offset;
    for d in (0..r).rev() {
        idx[d] = rem % g.dims[d];
        rem /= g.dims[d];
        base += idx[d] * g.strides[d];
    }
    let (inner, ist) = (g.dims[r - 1], g.strides[r - 1]);
    let mut done = 0;
    while done < out.len() {
        let run = (inner - idx[r - 1]).min(out.len() - done);
        let o = &mut out[done..done + run];
        match (data, ist) {
            (Data::F32(p), 0) => fill(o, *p.add(base)),
            (Data::F32(p), 1) => map(std::slice::from_raw_parts(p.add(base), run), o, |v| v),
            (Data::F32(p), s) => o.iter_mut().enumerate().for_each(|(i, o)| {
                o.write(*p.add(base + i * s));
            }),
            (Data::Bool(p), s) => o.iter_mut().enumerate().for_each(|(i, o)| {
                o.write(*p.add(base + i * s) as u8 as f32);
            }),
        }
        done += run;
        // Advance the multi-index by `run` (the inner dim wraps at most once per run).
        idx[r - 1] += run;
        base += run * ist;
        let mut d = r - 1;
        while d > 0 && idx[d] == g.dims[d] {
            base -= idx[d] * g.strides[d];
            idx[d] = 0;
            idx[d - 1] += 1;
            base += g.strides[d - 1];
            d -= 1;
        }
    }
}
