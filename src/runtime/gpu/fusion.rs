//! Fused elementwise kernels: the GPU lowering of the schedule's groups
//! (`compile::fuse::Group`, built for the GPU's target). A group becomes one generated
//! WGSL kernel over the elements of its outputs' shape: each external input is loaded
//! once per element (directly, as a scalar, as an inlined folded constant, or through
//! broadcast strides), then each member is one `let` built from the op -> WGSL expression
//! tables of `ops::elementwise`, rounded to its dtype, and each output is written to a
//! buffer of its own. So `relu(x @ w + b) * 2` is the matmul plus one dispatch. A group
//! the kernel cannot run as a whole (a member placed on the host, outputs whose shapes
//! differ at run time) runs member by member.

use super::exec::{grid, Exec, Place, Slot};
use super::params::{self, Params, FUSED_WGSL};
use super::pipelines::{self, dtag, is_float, norm_fn};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::broadcast_runtime;
use crate::compile::fuse::Group;
use crate::compile::Step;
use crate::ops::elementwise::BinaryClass;
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
    /// A folded scalar constant, passed in the parameter tail. (Not a WGSL literal: drivers fold
    /// and reassociate literals, turning `(1 - p) + eps` into `(1 + eps) - p`.)
    Param(u32),
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
    if is_float(d) {
        "f32"
    } else {
        "i32"
    }
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
                Step::Folded(v) if v.len() == 1 && dtag(v.dtype()).is_some() => {
                    Mode::Param(super::transfer::to_words(v).expect("gpu dtype")[0])
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
    let tag = dtag(plan.nodes[s].dtype()).expect("gpu dtype");
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
    tail.extend(ext.iter().filter_map(|(_, m)| match m {
        Mode::Param(w) => Some(*w),
        Mode::Same | Mode::Scalar | Mode::Bcast => None,
    }));
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
        let load = match mode {
            Mode::Same => format!("in{k}[i]"),
            Mode::Scalar => format!("in{k}[0]"),
            Mode::Bcast => {
                let e = format!("in{k}[bidx(i, p.rank + {bcast_k}u * p.rank)]");
                bcast_k += 1;
                e
            }
            Mode::Param(_) => {
                let e = format!("p.tail[p.rank * {}u + {param_k}u]", 1 + n_bcast);
                param_k += 1;
                e
            }
        };
        let _ = writeln!(body, "    let x{j} = bitcast<{}>({load});", wty(d));
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
                let e = u.wgsl(fl).ok_or_else(|| {
                    Error::Runtime(format!("{}: no integer WGSL lowering", u.name()))
                })?;
                let f = format!("u_{}_{}", u.name(), wty(in_dt(0)));
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
                let f = format!("b_{}_{t}", b.name());
                let h = format!(
                    "fn {f}(a: {t}, b: {t}) -> {r} {{ return {}; }}\n",
                    b.wgsl(is_float(in_dt(0)))
                );
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
    for (k, o) in outputs.iter().enumerate() {
        let _ = writeln!(body, "    out{k}[i] = bitcast<u32>(v{o});");
    }
    let _ = write!(
        src,
        "@compute @workgroup_size(256)\nfn {entry}(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{\n    \
         let i = fk_index(g, nw);\n    if (i >= p.n) {{ return; }}\n{body}}}\n"
    );
    Ok(src)
}
