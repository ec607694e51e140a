//! The register-program compiler: turns a group's members, for one set of input dtypes
//! and shapes, into a `Body` (instructions on chunk registers, the scalar prelude, the
//! loads, the outputs and the inputs whose buffers may be reused), cached per group
//! (`Programs`, which the executor keeps with the plan).

use super::affine::{recognise, BnKernel};
use super::layout::{fused_op, gather_layout, member_shapes, periodic, slice_layout, Layout};
use super::regalloc::{allocate, operands};
use super::update::{lower, UpdateKernel};
use super::{Ins, Opd, Out, LOAD_BASE, OUT_BASE};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::fuse::Group;
use crate::compile::update_rule::Update;
use crate::compile::Plan;
use crate::ops::{Class, FusedOp, Op, UnaryOp};
use std::sync::{Arc, Mutex};

/// Programs compiled for a group, one per input layout: kept per plan and schedule item
/// by the CPU executor (`cpu::PlanState`).
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
    pub(super) ext: Vec<(DType, Vec<usize>)>,
    pub(super) target_slots: Vec<usize>,
    pub(super) targets: Vec<Vec<i64>>,
    /// `None` when the outputs' runtime shapes differ (run unfused).
    pub(super) body: Option<Body>,
}

pub(super) struct Body {
    pub(super) shape: Vec<usize>,
    pub(super) n: usize,
    /// Per external input: `Scal` (one value), `Ext` (same size, in place) or `Reg` (a load).
    pub(super) inputs: Vec<Opd>,
    /// Members whose operands are all single values; result `k` goes to scalar
    /// `scalar_inputs + k`.
    pub(super) prelude: Vec<Ins>,
    pub(super) scalars: usize,
    pub(super) prog: Vec<Ins>,
    pub(super) nregs: usize,
    pub(super) loads: Vec<Layout>,
    /// Per load, the external input it reads (an index into `Group::ext`).
    pub(super) load_src: Vec<usize>,
    /// Per `Opd::Tile` input: (index into `Group::ext`, period).
    pub(super) tiles: Vec<(usize, usize)>,
    /// Members whose operands all repeat with one period (per-channel values and single
    /// values): computed once a call over a tiled period, as `Opd::Tile(tiles.len() + k)`,
    /// each instruction writing output 0 of its own one-instruction kernel, with its period.
    pub(super) derived: Vec<(Ins, usize)>,
    pub(super) outs: Vec<Out>,
    /// Same-size f32 inputs that die here, whose buffers the first `reusable.len()` f32
    /// outputs may reuse, one each.
    pub(super) reusable: Vec<usize>,
    /// The group's update rule, lowered for this layout: run with its values in registers.
    pub(super) update: Option<UpdateKernel>,
    /// The program as one of batch norm's kernels (`affine`), run as one loop.
    pub(super) bn: Option<BnKernel>,
}

/// The program of `g` for the inputs now in `slots`: cached, or compiled and cached.
pub(super) fn program(
    plan: &Plan,
    g: &Group,
    programs: &Programs,
    update: Option<&Update>,
    slots: &[Option<Value>],
) -> Result<Arc<Program>> {
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
    let mut cache = programs.0.lock().unwrap_or_else(|e| e.into_inner());
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
                plan.nodes[m].op().class(),
                Class::Elementwise(FusedOp::BroadcastTo)
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
        body: compile(plan, g, update, slots)?,
    });
    if cache.len() == MAX_PROGRAMS {
        cache.remove(0);
    }
    cache.push(p.clone());
    Ok(p)
}

/// Builds the register program of `g` for the shapes and dtypes of the inputs in `slots`.
fn compile(
    plan: &Plan,
    g: &Group,
    update: Option<&Update>,
    slots: &[Option<Value>],
) -> Result<Option<Body>> {
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
    let slice_of = |m: usize| {
        let Op::Slice(spec) = plan.nodes[m].op() else {
            return None;
        };
        Some(spec)
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
    let mut derived: Vec<(Ins, usize)> = Vec::new();
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
        } else if let Some(period) = one_period(ins, &tiles, &derived) {
            derived.push((make(OUT_BASE).expect("an instruction"), period));
            mem_opd.push(Opd::Tile((tiles.len() + derived.len() - 1) as u16));
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
    let mut reusable = Vec::new();
    if outs.iter().any(|o| matches!(o, Out::F32(_))) {
        for (e, &j) in g.ext.iter().enumerate() {
            let passed = outs.iter().any(|o| matches!(o, Out::Passed(p) if *p == e));
            if matches!(inputs[e], Opd::Ext(_)) && !passed && g.frees.contains(&j) {
                reusable.push(e);
            }
        }
    }
    // The rule's kernel reads every member per element (none computed once as a scalar)
    // and writes f32 outputs only.
    let update = update
        .filter(|_| {
            prelude.is_empty()
                && derived.is_empty()
                && outs.iter().all(|o| matches!(o, Out::F32(_)))
        })
        .and_then(|u| lower(u, g, &inputs));
    let bn = if update.is_none() && loads.is_empty() {
        let periods: Vec<usize> = tiles
            .iter()
            .map(|&(_, p)| p)
            .chain(derived.iter().map(|&(_, p)| p))
            .collect();
        recognise(&prog, &outs, &periods)
    } else {
        None
    };
    direct_writes(&mut prog, &mut outs, &reusable, &inputs);
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
        derived,
        outs,
        reusable,
        update,
        bn,
    }))
}

/// The period shared by the repeating operands of `ins` when every operand repeats with
/// it or is a single value (see `Body::derived`).
fn one_period(ins: Ins, tiles: &[(usize, usize)], derived: &[(Ins, usize)]) -> Option<usize> {
    let period = |t: u16| {
        let t = t as usize;
        tiles
            .get(t)
            .map_or_else(|| derived[t - tiles.len()].1, |&(_, p)| p)
    };
    let mut common = None;
    for o in operands(ins) {
        match o {
            Opd::Scal(_) => {}
            Opd::Tile(t) if common.is_none_or(|c| c == period(t)) => common = Some(period(t)),
            Opd::Tile(_) | Opd::Reg(_) | Opd::Ext(_) | Opd::Out(_) => return None,
        }
    }
    common
}

/// Makes the instruction that computes an f32 output write it into the output's buffer
/// (later readers read it there), saving a copy from a register. Not for an output that
/// may take a dead input's buffer when an instruction at or after it reads such an input.
fn direct_writes(prog: &mut [Ins], outs: &mut [Out], reusable: &[usize], inputs: &[Opd]) {
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
        let takes_reusable = is_f32 && f32_outs < reusable.len();
        f32_outs += is_f32 as usize;
        let Opd::Reg(v) = opd else { continue };
        if !is_f32 || v >= LOAD_BASE || to[v as usize].is_some() {
            continue;
        }
        // The instruction writing virtual register v is prog[v].
        let reads_reusable = |ins: &Ins| {
            operands(*ins).any(|a| {
                reusable
                    .iter()
                    .any(|&e| matches!((a, inputs[e]), (Opd::Ext(x), Opd::Ext(y)) if x == y))
            })
        };
        if !(takes_reusable && prog[v as usize..].iter().any(reads_reusable)) {
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

/// The update rules recognised in the programs compiled so far for a group.
#[cfg(test)]
pub fn rules_of(programs: &Programs) -> Vec<crate::compile::update_rule::Rule> {
    let cache = programs.0.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .iter()
        .filter_map(|p| p.body.as_ref()?.update.as_ref().map(|s| s.rule))
        .collect()
}

/// How many of the programs compiled so far for a group run as one of batch norm's kernels.
#[cfg(test)]
pub fn affine_chains(programs: &Programs) -> usize {
    let cache = programs.0.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .iter()
        .filter(|p| p.body.as_ref().is_some_and(|b| b.bn.is_some()))
        .count()
}
