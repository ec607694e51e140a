//! Fused elementwise kernels: the GPU lowering of the schedule's groups
//! (`compile::fuse::Group`, built for the GPU's target). A group becomes one generated
//! WGSL kernel over the elements of its outputs' shape: each external input is loaded
//! once per element (directly, as a scalar, as an inlined folded constant, or through
//! broadcast strides), then each member is one `let` built from the op -> WGSL expression
//! tables of `ops::elementwise`, rounded to its dtype, and each output is written to a
//! buffer of its own. So `relu(x @ w + b) * 2` is the matmul plus one dispatch. A group
//! the kernel cannot run as a whole (a member placed on the host, outputs whose shapes
//! differ at run time) runs member by member.
//!
//! int64 values are `vec2<u32>` (low word, high word) in the kernel and two words per
//! element in buffers, computed with the helpers of `shaders/int64.wgsl` by the ops
//! `Op::exact_int64` lists, with the CPU kernels' results bit for bit (`int64_unary`,
//! `int64_binary`, `cast_expr`).

use super::exec::{grid, Exec, Place, Slot};
use super::params::{self, Params, FUSED_WGSL};
use super::pipelines::{self, dtag, is_float, norm_fn};
use super::transfer::{self, words_per};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::broadcast_runtime;
use crate::compile::fuse::Group;
use crate::compile::Step;
use crate::ops::elementwise::{BinaryClass, BinaryOp, UnaryOp};
use crate::ops::{Class, FusedOp};
use std::collections::HashMap;
use std::fmt::Write;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Same element count as the output: index i.
    Same,
    /// One element: index 0.
    Scalar,
    /// Broadcast: index through strides in the parameter tail.
    Bcast,
    /// A folded scalar constant, passed in the parameter tail as its words (the second
    /// for int64 only). (Not a WGSL literal: drivers fold and reassociate literals,
    /// turning `(1 - p) + eps` into `(1 + eps) - p`.)
    Param([u32; 2]),
}

/// The int64 helpers of the generated kernels.
const INT64_WGSL: &str = include_str!("../../../shaders/int64.wgsl");

fn fused_op(op: &crate::ops::Op) -> Result<FusedOp> {
    match op.class() {
        Class::Elementwise(f) => Ok(f),
        Class::Source | Class::Meta | Class::View(_) | Class::Kernel | Class::Host => Err(
            Error::Runtime(format!("internal: {} is not an elementwise op", op.name())),
        ),
    }
}

/// The WGSL type a dtype computes in.
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

/// Records group `g` as one kernel, or member by member where it cannot run as a whole.
pub(crate) fn record(ex: &mut Exec, g: &Group, feeds: &mut [Option<Slot>]) -> Result<()> {
    if g.first.is_some() || !g.folds.is_empty() || !g.hidden.is_empty() {
        return Err(Error::Runtime(
            "internal: a GPU group with an epilogue or folds".into(),
        ));
    }
    let whole = g.members.iter().all(|&m| ex.lay.place[m] == Place::Gpu) && {
        let shapes = member_shapes(ex, &g.members)?;
        let last = g.members.last().expect("a group has members");
        g.outputs.iter().all(|o| shapes[o] == shapes[last])
    };
    if whole {
        return record_members(ex, &g.members, &g.outputs);
    }
    for &m in &g.members {
        ex.step(m, feeds)?;
    }
    for &m in &g.members {
        if !g.outputs.contains(&m) {
            ex.slots[m] = None;
        }
    }
    Ok(())
}

/// Runtime shapes of `members` (in plan order), from their inputs' slots.
fn member_shapes(ex: &Exec, members: &[usize]) -> Result<HashMap<usize, Vec<usize>>> {
    let plan = ex.plan;
    let mut shapes: HashMap<usize, Vec<usize>> = HashMap::new();
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
                let target: Vec<usize> =
                    t.to_i64_vec().iter().map(|&d| d.max(0) as usize).collect();
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
        shapes.insert(m, shape);
    }
    Ok(shapes)
}

/// Records one generated kernel computing `members` (in plan order) per element of the
/// last member's shape and writing `outputs`, which have that shape; puts the outputs
/// in their slots.
pub(crate) fn record_members(ex: &mut Exec, members: &[usize], outputs: &[usize]) -> Result<()> {
    let plan = ex.plan;
    let is_member = |j: usize| members.contains(&j);
    let shapes = member_shapes(ex, members)?;
    let s = *members.last().expect("a kernel has members");
    let out_shape = shapes[&s].clone();
    let n: usize = out_shape.iter().product();
    // External inputs, in first-use order.
    let mut ext: Vec<(usize, Mode)> = Vec::new();
    for &m in members {
        let h = plan.nodes[m].op().shape_operands();
        for (p, &j) in plan.inputs[m].iter().enumerate() {
            if h.contains(&p) || is_member(j) || ext.iter().any(|e| e.0 == j) {
                continue;
            }
            let mode = match &plan.steps[j] {
                Step::Folded(v) if v.len() == 1 && transfer::to_words(v).is_some() => {
                    let w = transfer::to_words(v).expect("a device dtype");
                    Mode::Param([w[0], w.get(1).copied().unwrap_or(0)])
                }
                _ => {
                    let c: usize = ex.slot(j).shape.iter().product();
                    if c == n {
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
    let key: Vec<u32> = ext
        .iter()
        .flat_map(|(_, m)| match m {
            Mode::Same => [0, 0],
            Mode::Scalar => [1, 0],
            Mode::Bcast => [2, 0],
            Mode::Param(_) => [3, 0],
        })
        .collect();
    let cached = ex
        .lay
        .fused
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(members.to_vec(), key.clone()))
        .cloned();
    let tag = match plan.nodes[s].dtype() {
        DType::I64 => "i64",
        d => dtag(d).expect("gpu dtype"),
    };
    let entry = format!("fused_{tag}");
    let pipe = match cached {
        Some(p) => p,
        None => {
            let src = generate(ex, members, outputs, &ext, &entry)?;
            let p = pipelines::generated(ex.ctx, &src, &entry)?;
            ex.lay
                .fused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert((members.to_vec(), key), p.clone());
            p
        }
    };
    // Tail: out_shape, the strides of each broadcast input, the scalar constants.
    let rank = out_shape.len();
    let mut tail: Vec<u32> = out_shape.iter().map(|&d| d as u32).collect();
    let mut bound = Vec::new();
    let first_in = 1 + outputs.len() as u32;
    for (k, (j, mode)) in ext.iter().enumerate() {
        if *mode == Mode::Bcast {
            tail.extend(bcast_strides(&ex.slot(*j).shape, &out_shape));
        }
        if !matches!(mode, Mode::Param(_)) {
            bound.push((first_in + k as u32, ex.dev(*j)?));
        }
    }
    for (j, m) in &ext {
        if let Mode::Param(w) = m {
            tail.extend(&w[..words_per(plan.nodes[*j].dtype())]);
        }
    }
    let outs = outputs
        .iter()
        .map(|&o| ex.alloc(&out_shape, plan.nodes[o].dtype(), o))
        .collect::<Result<Vec<_>>>()?;
    let mut bufs: Vec<(u32, &super::DTensor)> = outs
        .iter()
        .enumerate()
        .map(|(k, t)| (1 + k as u32, t))
        .collect();
    bufs.extend(bound.iter().map(|(b, t)| (*b, t)));
    let block = params::Fused {
        n: n as u32,
        rank: rank as u32,
    };
    ex.dispatch(pipe, &bufs, Params::with_tail(&block, &tail), grid(n));
    for (&o, t) in outputs.iter().zip(outs) {
        ex.slots[o] = Some(Slot::dev(t));
    }
    Ok(())
}

fn generate(
    ex: &Exec,
    members: &[usize],
    outputs: &[usize],
    ext: &[(usize, Mode)],
    entry: &str,
) -> Result<String> {
    let plan = ex.plan;
    let has_f16 = ex.ctx.has_f16;
    let mut src = pipelines::common(has_f16);
    src.push_str(FUSED_WGSL);
    let int64 = members
        .iter()
        .chain(ext.iter().map(|(j, _)| j))
        .any(|&j| plan.nodes[j].dtype() == DType::I64);
    if int64 {
        src.push_str(INT64_WGSL);
    }
    for k in 0..outputs.len() {
        let _ = writeln!(
            src,
            "@group(0) @binding({}) var<storage, read_write> out{k}: array<u32>;",
            1 + k
        );
    }
    for (k, (_, m)) in ext.iter().enumerate() {
        if !matches!(m, Mode::Param(_)) {
            let _ = writeln!(
                src,
                "@group(0) @binding({}) var<storage, read> in{k}: array<u32>;",
                1 + outputs.len() + k
            );
        }
    }
    if ext.iter().any(|e| e.1 == Mode::Bcast) {
        src.push_str(
            "fn bidx(i: u32, base: u32) -> u32 {\n    let r = p.rank;\n    var rem = i;\n    var off = 0u;\n    \
             for (var k = 0u; k < r; k++) {\n        let d = r - 1u - k;\n        let dim = p.tail[d];\n        \
             off += (rem % dim) * p.tail[base + d];\n        rem = rem / dim;\n    }\n    return off;\n}\n",
        );
    }
    let mut helpers: Vec<String> = Vec::new();
    let mut body = String::new();
    let mut bcast_k = 0usize;
    let n_bcast = ext.iter().filter(|e| e.1 == Mode::Bcast).count();
    let mut param_k = 0usize;
    let mut name: HashMap<usize, String> = HashMap::new();
    for (k, (j, mode)) in ext.iter().enumerate() {
        let d = plan.nodes[*j].dtype();
        // Word `w` of the element (int64: 0 low, 1 high).
        let word = |w: usize| match mode {
            Mode::Same if d == DType::I64 => format!("in{k}[2u * i + {w}u]"),
            Mode::Same => format!("in{k}[i]"),
            Mode::Scalar => format!("in{k}[{w}u]"),
            Mode::Bcast if d == DType::I64 => {
                format!("in{k}[2u * bidx(i, p.rank + {bcast_k}u * p.rank) + {w}u]")
            }
            Mode::Bcast => format!("in{k}[bidx(i, p.rank + {bcast_k}u * p.rank)]"),
            Mode::Param(_) => format!("p.tail[p.rank * {}u + {}u]", 1 + n_bcast, param_k + w),
        };
        let load = if d == DType::I64 {
            format!("vec2<u32>({}, {})", word(0), word(1))
        } else {
            format!("bitcast<{}>({})", wty(d), word(0))
        };
        match mode {
            Mode::Bcast => bcast_k += 1,
            Mode::Param(_) => param_k += words_per(d),
            Mode::Same | Mode::Scalar => {}
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
    for h in helpers {
        src.push_str(&h);
    }
    for (k, &o) in outputs.iter().enumerate() {
        if plan.nodes[o].dtype() == DType::I64 {
            let _ = writeln!(
                body,
                "    out{k}[2u * i] = v{o}.x;\n    out{k}[2u * i + 1u] = v{o}.y;"
            );
        } else {
            let _ = writeln!(body, "    out{k}[i] = bitcast<u32>(v{o});");
        }
    }
    let _ = write!(
        src,
        "@compute @workgroup_size(256)\nfn {entry}(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{\n    \
         let i = fk_index(g, nw);\n    if (i >= p.n) {{ return; }}\n{body}}}\n"
    );
    Ok(src)
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
