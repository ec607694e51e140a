//! Running a group: collects the inputs' data pointers and single values, allocates or
//! takes over the output buffers, and drives the chunk executor over the elements (in
//! parallel tasks, in halves with the helper thread, or on this thread).

use super::epilogue::run_after;
use super::exec::{eval_scalar, exec, Kernel};
use super::fold::{fold_plain, fold_run};
use super::program::{program, Programs};
use super::reuse::reusable_buffer;
use super::{Data, Opd, Out, OutBuf, CH, TEAM_WORK};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::team;
use crate::base::value::{uninit, Arr, Value};
use crate::compile::fuse::Group;
use crate::compile::update_rule::Update;
use crate::compile::Plan;
use crate::ops::elementwise::grain;
use crate::runtime::cpu::InPlace;
use ndarray::IxDyn;
use rayon::prelude::*;

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

/// Runs group `g` reading its inputs from `slots` (dead inputs may be taken out of them,
/// and variables `in_place` names overwritten), with the programs compiled for it so far
/// (`programs`, kept with the plan in its `cpu::PlanState`). Returns the output values in
/// `g.outputs` order, or `None` when the outputs' runtime shapes differ (the caller then
/// runs the members one by one). `update` is the rule the group computes (`Item::Update`): its
/// kernel runs where the run's shapes suit it, else the group's program.
pub fn run(
    plan: &Plan,
    g: &Group,
    programs: &Programs,
    update: Option<&Update>,
    slots: &mut [Option<Value>],
    in_place: Option<&InPlace>,
) -> Result<Option<Vec<Value>>> {
    match g.first {
        Some(f) => run_after(plan, g, programs, update, f, slots, in_place),
        None => run_driven(
            plan,
            g,
            programs,
            update,
            slots,
            in_place,
            &|kern, shape| split_exec(kern, shape.iter().product(), g.cost),
        ),
    }
}

/// Runs the kernel over its `n` elements: in parallel chunks, in halves with the loop's
/// helper thread, or here.
pub(super) fn split_exec(kern: &Kernel<'_>, n: usize, cost: usize) {
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
pub(super) fn run_driven(
    plan: &Plan,
    g: &Group,
    programs: &Programs,
    update: Option<&Update>,
    slots: &mut [Option<Value>],
    in_place: Option<&InPlace>,
    drive: &dyn Fn(&Kernel<'_>, &[usize]),
) -> Result<Option<Vec<Value>>> {
    let p = program(plan, g, programs, update, slots)?;
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
    let folds = if g.folds.is_empty() || b.update.is_some() {
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
    let mut tiled: Vec<Vec<f32>> = b
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
    let mut tiles: Vec<(*const f32, usize)> = tiled
        .iter()
        .zip(&b.tiles)
        .map(|(t, &(_, period))| (t.as_ptr(), period))
        .collect();
    for &ins in &b.prelude {
        scal.push(eval_scalar(ins, &scal));
    }
    for &(ins, period) in &b.derived {
        // One period tiled as the inputs' tiles are, from the tiles computed so far.
        let len = period + CH.min(n);
        let mut t: Vec<f32> = uninit(len);
        let out = [(Opd::Out(0), OutBuf::F32(t.as_mut_ptr()))];
        let kern = Kernel {
            prog: &[ins],
            nregs: 0,
            ext: &[],
            loads: &[],
            data: &[],
            tiles: &tiles,
            scal: &scal,
            outs: &out,
            update: None,
            bn: None,
            folds: None,
        };
        exec(&kern, 0, len);
        tiles.push((t.as_ptr(), period));
        tiled.push(t);
    }
    let mut reused = vec![false; b.reusable.len()];
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
                let reused_buf = if f32_outs < b.reusable.len() {
                    reusable_buffer(g, &b.reusable, &mut reused, written[k], slots, in_place)
                } else {
                    None
                };
                f32_outs += 1;
                // The kernel writes every element before the buffer is read.
                let mut buf = reused_buf.unwrap_or_else(|| {
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
    let out_ptrs: Vec<*mut f32> = match &b.update {
        Some(_) => outs
            .iter()
            .map(|(_, o)| match o {
                OutBuf::F32(p) => *p,
                OutBuf::Bool(_) => unreachable!("update rules write f32"),
            })
            .collect(),
        None => Vec::new(),
    };
    let update = b.update.as_ref().map(|sp| (sp, out_ptrs.as_slice()));
    let kern = Kernel {
        prog: &b.prog,
        nregs: b.nregs,
        ext: &ext,
        loads: &b.loads,
        data: &data,
        tiles: &tiles,
        scal: &scal,
        outs: &outs,
        update,
        bn: b.bn.as_ref(),
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
