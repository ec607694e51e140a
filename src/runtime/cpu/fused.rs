//! The CPU fusion kernel: runs a `compile::fuse::Group` as one pass over chunks of
//! `CH` elements. Per call, the members become a small register program (bool values are
//! 1.0/0.0 in f32 registers); members whose inputs are all single values are computed once,
//! as scalars. Each external input is read with its own broadcast pattern: directly (same
//! size), as one value, or gathered through strides into a register. Outputs are written
//! once per chunk, into a dead input's buffer when the plan holds its only reference.
//! The per-element code is the op tables' (`UnaryOp::map`, `BinaryOp::zip`), so fused and
//! unfused results are bitwise equal.

use crate::compile::fuse::Group;
use crate::compile::Plan;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::elementwise::{grain, Lane, Splat};
use crate::ops::{BinaryOp, FusedOp, GpuKind, UnaryOp};
use crate::runtime::value::{Arr, Value};
use crate::shape::broadcast_runtime;
use ndarray::IxDyn;
use rayon::prelude::*;
use std::cell::RefCell;
use std::mem::MaybeUninit;

/// Elements per chunk: a register is 4 KiB, so a program's registers stay in L1/L2.
const CH: usize = 1024;
/// Virtual register ids of gathered inputs start here (instruction results are below).
const LOAD_BASE: u16 = 1 << 15;

#[derive(Clone, Copy, Debug)]
enum Opd {
    Reg(u16),
    /// A same-size f32 input, read in place.
    Ext(u16),
    Splat(f32),
}

#[derive(Clone, Copy, Debug)]
enum Ins {
    /// Gathers external input `.0` (the index into `Kernel::loads`) into a register.
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

/// A strided read of an input, with broadcast dims at stride 0 and dims merged where possible.
struct Gather {
    data: Data,
    dims: Vec<usize>,
    strides: Vec<usize>,
}

enum OutBuf {
    F32(*mut f32),
    Bool(*mut bool),
}

struct Kernel {
    prog: Vec<Ins>,
    nregs: usize,
    ext: Vec<*const f32>,
    loads: Vec<Gather>,
    outs: Vec<(Opd, OutBuf)>,
}

// SAFETY: the pointers are into buffers that outlive the parallel loop; tasks write
// disjoint ranges of the outputs and only read the inputs.
unsafe impl Sync for Kernel {}
unsafe impl Send for Kernel {}

/// The runtime shape of member or input `j` of a group.
fn shape_of<'a>(g: &Group, shapes: &'a [Vec<usize>], slots: &'a [Option<Value>], j: usize) -> &'a [usize] {
    match g.members.iter().position(|&m| m == j) {
        Some(p) => &shapes[p],
        None => slots[j].as_ref().expect("inputs are computed before their users").shape(),
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
        let s = match fused_op(plan, m) {
            FusedOp::Unary(_) | FusedOp::Cast(_) => sh(0).to_vec(),
            FusedOp::Binary(b) => broadcast_runtime(b.name(), sh(0), sh(1))?,
            FusedOp::Select => broadcast_runtime("select", &broadcast_runtime("select", sh(0), sh(1))?, sh(2))?,
            FusedOp::BroadcastTo => {
                let t = slots[ins[1]].as_ref().expect("computed");
                let target: Vec<usize> = t.to_i64_vec().iter().map(|&d| d.max(0) as usize).collect();
                let x = sh(0);
                if x != target.as_slice() && broadcast_runtime("broadcast_to", x, &target)? != target {
                    return Err(Error::Value(format!("broadcast_to: cannot broadcast shape {x:?} to {target:?}")));
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
fn gather_layout(shape: &[usize], out: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let lead = out.len() - shape.len();
    let mut st = vec![0usize; out.len()];
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        st[lead + d] = if shape[d] == 1 { 0 } else { acc };
        acc *= shape[d];
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
    (dims, strides)
}

fn scalar_of(v: &Value) -> f32 {
    match v {
        Value::F32(a) => a.iter().next().copied().unwrap_or(0.0),
        Value::Bool(a) => a.iter().next().map_or(0.0, |&b| b as u8 as f32),
        other => unreachable!("fusion groups read f32 and bool values, got {}", other.dtype()),
    }
}

/// One instruction on single values (members whose inputs are all scalars).
fn eval_scalar(ins: Ins) -> f32 {
    let v = |o: Opd| match o {
        Opd::Splat(x) => x,
        Opd::Reg(_) | Opd::Ext(_) => unreachable!("scalar operands only"),
    };
    let mut out = [MaybeUninit::new(0.0f32)];
    match ins {
        Ins::Unary(op, a, _) => op.map(&[v(a)], &mut out),
        Ins::Not(a, _) => out[0] = MaybeUninit::new((v(a) == 0.0) as u8 as f32),
        Ins::ToBool(a, _) => out[0] = MaybeUninit::new((v(a) != 0.0) as u8 as f32),
        Ins::Binary(op, a, b, _) => op.zip(Splat(v(a)), Splat(v(b)), &mut out),
        Ins::Select(c, a, b, _) => out[0] = MaybeUninit::new(if v(c) != 0.0 { v(a) } else { v(b) }),
        Ins::Load(..) => unreachable!("loads have no scalar form"),
    }
    // SAFETY: every arm wrote out[0].
    unsafe { out[0].assume_init() }
}

/// Runs group `g` reading its inputs from `slots` (dead inputs may be taken out of them).
/// Returns the output values in `g.outputs` order, or `None` when the outputs' runtime
/// shapes differ (the caller then runs the members one by one).
pub fn run(plan: &Plan, g: &Group, slots: &mut [Option<Value>]) -> Result<Option<Vec<Value>>> {
    let shapes = member_shapes(plan, g, slots)?;
    let pos = |m: usize| g.members.iter().position(|&x| x == m).expect("member");
    let out_shape = shapes[pos(g.outputs[0])].clone();
    if g.outputs.iter().any(|&o| shapes[pos(o)] != out_shape) {
        return Ok(None);
    }
    let n: usize = out_shape.iter().product();
    if n == 0 {
        return Ok(Some(g.outputs.iter().map(|&o| Value::full(plan.nodes[o].dtype(), &out_shape, 0.0)).collect()));
    }
    // Inputs: read in place (same-size f32), as one value, or gathered into a register.
    let mut held: Vec<Value> = Vec::with_capacity(g.ext.len());
    let mut ext_opd: Vec<Opd> = Vec::with_capacity(g.ext.len());
    let mut ext_ptr: Vec<*const f32> = Vec::new();
    let mut loads: Vec<Gather> = Vec::new();
    for &j in &g.ext {
        let v = slots[j].as_ref().expect("computed").clone().standard();
        let len = v.len();
        let opd = match &v {
            _ if len == 1 => Opd::Splat(scalar_of(&v)),
            Value::F32(a) if len == n => {
                ext_ptr.push(a.as_ptr());
                Opd::Ext(ext_ptr.len() as u16 - 1)
            }
            Value::F32(_) | Value::Bool(_) => {
                let (dims, strides) = gather_layout(v.shape(), &out_shape);
                if dims.len() > 16 {
                    return Ok(None);
                }
                let data = match &v {
                    Value::F32(a) => Data::F32(a.as_ptr()),
                    Value::Bool(a) => Data::Bool(a.as_ptr()),
                    _ => unreachable!("matched above"),
                };
                loads.push(Gather { data, dims, strides });
                Opd::Reg(LOAD_BASE + loads.len() as u16 - 1)
            }
            other => return Err(Error::Runtime(format!("internal: fused input of dtype {}", other.dtype()))),
        };
        ext_opd.push(opd);
        held.push(v);
    }
    // The program, in virtual registers (loads are u16::MAX - k until allocated).
    let mut prog: Vec<Ins> = Vec::new();
    let mut vregs = 0u16;
    let mut mem_opd: Vec<Opd> = Vec::with_capacity(g.members.len());
    for &m in &g.members {
        let ins = &plan.inputs[m];
        let arg = |p: usize| -> Opd {
            let j = ins[p];
            match g.members.iter().position(|&x| x == j) {
                Some(q) => mem_opd[q],
                None => ext_opd[g.ext.iter().position(|&x| x == j).expect("external input")],
            }
        };
        let dst = vregs;
        let ins = match fused_op(plan, m) {
            FusedOp::Unary(UnaryOp::Not) => Ins::Not(arg(0), dst),
            FusedOp::Unary(u) => Ins::Unary(u, arg(0), dst),
            FusedOp::Binary(b) => Ins::Binary(b, arg(0), arg(1), dst),
            FusedOp::Select => Ins::Select(arg(0), arg(1), arg(2), dst),
            FusedOp::Cast(DType::Bool) if plan.nodes[ins[0]].dtype() == DType::F32 => Ins::ToBool(arg(0), dst),
            FusedOp::Cast(_) | FusedOp::BroadcastTo => {
                mem_opd.push(arg(0));
                continue;
            }
        };
        let opds = operands(ins);
        if opds.iter().all(|o| matches!(o, Opd::Splat(_))) {
            mem_opd.push(Opd::Splat(eval_scalar(ins)));
        } else {
            prog.push(ins);
            mem_opd.push(Opd::Reg(dst));
            vregs += 1;
        }
    }
    // Outputs. A same-size f32 input passed through is returned as is; one same-size f32
    // input that dies here and has no other reference becomes an output buffer (written
    // last in each chunk, after everything has read it).
    let mut results: Vec<Option<Value>> = vec![None; g.outputs.len()];
    let mut outs: Vec<(Opd, OutBuf)> = Vec::new();
    let mut bufs_f32: Vec<(usize, ndarray::Array<f32, IxDyn>)> = Vec::new();
    let mut bufs_bool: Vec<(usize, Vec<bool>)> = Vec::new();
    let out_opds: Vec<Opd> = g.outputs.iter().map(|&o| mem_opd[pos(o)]).collect();
    let mut spare: Option<ndarray::Array<f32, IxDyn>> = None;
    for (e, &j) in g.ext.iter().enumerate() {
        let Opd::Ext(x) = ext_opd[e] else { continue };
        let passed = out_opds.iter().any(|o| matches!(o, Opd::Ext(y) if *y == x));
        let unshared = matches!(&slots[j], Some(Value::F32(a)) if a.is_standard_layout());
        if spare.is_some() || passed || !unshared || !g.frees.contains(&j) {
            continue;
        }
        held[e] = Value::scalar_f64(DType::F32, 0.0);
        let Some(Value::F32(a)) = slots[j].take() else { unreachable!("checked f32") };
        match a.try_into_owned_nocopy() {
            Ok(own) => {
                ext_ptr[x as usize] = own.as_ptr();
                spare = Some(own);
            }
            Err(a) => held[e] = Value::F32(a),
        }
    }
    let mut last_out: Option<(Opd, OutBuf)> = None;
    for (k, &o) in g.outputs.iter().enumerate() {
        let opd = out_opds[k];
        if let Opd::Ext(x) = opd {
            let e = ext_opd.iter().position(|p| matches!(p, Opd::Ext(y) if *y == x)).expect("in-place input");
            results[k] = Some(held[e].reshape(&out_shape)?);
            continue;
        }
        match plan.nodes[o].dtype() {
            DType::F32 => {
                let reused = spare.is_some();
                let mut buf = match spare.take() {
                    Some(b) => b,
                    None => {
                        let mut v: Vec<f32> = Vec::with_capacity(n);
                        // SAFETY: f32 has no invalid bit patterns, and the kernel writes
                        // every element before the buffer is read.
                        unsafe { v.set_len(n) };
                        ndarray::Array::from_shape_vec(IxDyn(&[n]), v).expect("n elements")
                    }
                };
                let ob = (opd, OutBuf::F32(buf.as_mut_ptr()));
                if reused {
                    last_out = Some(ob);
                } else {
                    outs.push(ob);
                }
                bufs_f32.push((k, buf));
            }
            DType::Bool => {
                let mut v: Vec<bool> = Vec::with_capacity(n);
                outs.push((opd, OutBuf::Bool(v.as_mut_ptr())));
                bufs_bool.push((k, v));
            }
            other => return Err(Error::Runtime(format!("internal: fused output of dtype {other}"))),
        }
    }
    outs.extend(last_out);
    // Register allocation: a register is free after its last reader; outputs live to the end.
    let (prog, outs, nregs) = allocate(prog, outs, loads.len(), vregs);
    let kern = Kernel { prog, nregs, ext: ext_ptr, loads, outs };
    let step = grain(g.cost).div_ceil(CH) * CH;
    if n < 2 * step {
        exec(&kern, 0, n);
    } else {
        (0..n.div_ceil(step)).into_par_iter().for_each(|t| exec(&kern, t * step, ((t + 1) * step).min(n)));
    }
    drop(kern);
    drop(held);
    for (k, b) in bufs_f32 {
        let b = b.into_shape_with_order(IxDyn(&out_shape)).map_err(|e| Error::Runtime(format!("fusion: {e}")))?;
        results[k] = Some(Value::F32(b.into_shared()));
    }
    for (k, mut v) in bufs_bool {
        // SAFETY: the kernel wrote all n elements.
        unsafe { v.set_len(n) };
        results[k] = Some(Value::Bool(Arr::from_shape_vec(IxDyn(&out_shape), v).expect("n elements")));
    }
    Ok(Some(results.into_iter().map(|r| r.expect("every output written")).collect()))
}

fn operands(ins: Ins) -> Vec<Opd> {
    match ins {
        Ins::Load(..) => vec![],
        Ins::Unary(_, a, _) | Ins::Not(a, _) | Ins::ToBool(a, _) => vec![a],
        Ins::Binary(_, a, b, _) => vec![a, b],
        Ins::Select(c, a, b, _) => vec![c, a, b],
    }
}

/// Maps virtual registers (instruction results `0..vregs`, gathered inputs from
/// `LOAD_BASE`) to physical ones, so a chunk needs as many registers as values are live.
fn allocate(prog: Vec<Ins>, outs: Vec<(Opd, OutBuf)>, nloads: usize, vregs: u16) -> (Vec<Ins>, Vec<(Opd, OutBuf)>, usize) {
    let mut seq: Vec<Ins> = (0..nloads).map(|k| Ins::Load(k as u16, LOAD_BASE + k as u16)).collect();
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
    for (o, _) in &outs {
        if let Opd::Reg(r) = o {
            last[key(*r)] = Some(usize::MAX);
        }
    }
    let mut phys: Vec<u16> = vec![u16::MAX; total];
    let mut free: Vec<u16> = Vec::new();
    let mut nregs = 0u16;
    let remap = |o: Opd, phys: &[u16]| match o {
        Opd::Reg(r) => Opd::Reg(phys[key(r)]),
        Opd::Ext(_) | Opd::Splat(_) => o,
    };
    let mut out_seq = Vec::with_capacity(seq.len());
    for (t, ins) in seq.into_iter().enumerate() {
        let d = match ins {
            Ins::Load(_, d) | Ins::Unary(_, _, d) | Ins::Not(_, d) | Ins::ToBool(_, d) | Ins::Binary(_, _, _, d) | Ins::Select(_, _, _, d) => d,
        };
        let p = free.pop().unwrap_or_else(|| {
            nregs += 1;
            nregs - 1
        });
        phys[key(d)] = p;
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
            .into_iter()
            .filter_map(|o| match o {
                Opd::Reg(v) if last[key(v)] == Some(t) => Some(phys[key(v)]),
                Opd::Reg(_) | Opd::Ext(_) | Opd::Splat(_) => None,
            })
            .collect();
        dead.dedup();
        free.extend(dead);
        if last[key(d)].is_none() {
            free.push(p);
        }
    }
    let outs = outs.into_iter().map(|(o, b)| (remap(o, &phys), b)).collect();
    (out_seq, outs, nregs as usize)
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs elements `[start, end)` with this thread's scratch registers.
fn exec(k: &Kernel, start: usize, end: usize) {
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
fn exec_chunks_body(k: &Kernel, regs: *mut f32, start: usize, end: usize) {
    let mut off = start;
    while off < end {
        let len = CH.min(end - off);
        // SAFETY: `regs` has nregs * CH elements; `off + len <= n` for every input and output.
        unsafe { chunk(k, regs, off, len) };
        off += len;
    }
}
crate::multiversion!(fn exec_chunks(k: &Kernel, regs: *mut f32, start: usize, end: usize) => exec_chunks_body);

enum Src<'a> {
    S(&'a [f32]),
    C(f32),
}

/// # Safety
/// As `chunk`; the slice must not overlap a live `reg_mut` of the same register.
#[inline(always)]
unsafe fn source<'a>(k: &Kernel, regs: *mut f32, o: Opd, off: usize, len: usize) -> Src<'a> {
    match o {
        Opd::Reg(r) => Src::S(std::slice::from_raw_parts(regs.add(r as usize * CH), len)),
        Opd::Ext(e) => Src::S(std::slice::from_raw_parts(k.ext[e as usize].add(off), len)),
        Opd::Splat(v) => Src::C(v),
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
unsafe fn chunk(k: &Kernel, regs: *mut f32, off: usize, len: usize) {
    let src = |o: Opd| source(k, regs, o, off, len);
    // The destination register is never one of the instruction's operands (`allocate`).
    let dst = |r: u16| reg_mut(regs, r, len);
    for &ins in &k.prog {
        match ins {
            Ins::Load(l, d) => gather(&k.loads[l as usize], off, dst(d)),
            Ins::Unary(op, a, d) => match src(a) {
                Src::S(x) => op.map(x, dst(d)),
                Src::C(x) => fill(dst(d), eval_scalar(Ins::Unary(op, Opd::Splat(x), 0))),
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
    for (o, buf) in &k.outs {
        match buf {
            OutBuf::F32(p) => {
                let out: &mut [MaybeUninit<f32>] = std::slice::from_raw_parts_mut(p.add(off).cast(), len);
                match src(*o) {
                    Src::S(x) => map(x, out, |v| v),
                    Src::C(x) => fill(out, x),
                }
            }
            OutBuf::Bool(p) => {
                let out: &mut [MaybeUninit<bool>] = std::slice::from_raw_parts_mut(p.add(off).cast(), len);
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
    for (i, o) in out.iter_mut().enumerate() {
        o.write(if c[i] != 0.0 { a.at(i) } else { b.at(i) });
    }
}

/// Reads elements `[off, off + out.len())` of the broadcast input into `out`.
#[inline(always)]
unsafe fn gather(g: &Gather, off: usize, out: &mut [MaybeUninit<f32>]) {
    let r = g.dims.len();
    // Multi-index of `off` and the input offset it maps to.
    let mut idx = [0usize; 16];
    let mut rem = off;
    let mut base = 0usize;
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
        match (g.data, ist) {
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
