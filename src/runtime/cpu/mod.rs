//! The CPU executor: walks a plan's CPU schedule in order (single nodes, and fused
//! elementwise groups run by `fused`), releasing every intermediate value right after its
//! last reader.

use crate::compile::fuse::Item;
use crate::compile::{Plan, Step};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::runtime::value::Value;
use std::collections::HashMap;

pub mod alloc;
pub mod fused;
pub mod fused_rules;
pub mod team;

/// Runs whose previous run took this long or longer (and less than `TEAM_MAX_RUN`) have a
/// helper thread polling (`team`); shorter ones would pay its start (a hand-off to the
/// pool, ~15 us) on every call.
const TEAM_MIN_RUN: std::time::Duration = std::time::Duration::from_millis(1);
const TEAM_MAX_RUN: std::time::Duration = std::time::Duration::from_millis(10);

/// Runs `plan` on the CPU.
///
/// A short run (the last run of this plan took 1-10 ms, as a Keras MLP step does)
/// happens on a rayon worker with a second worker polling for work (`team`) for its whole
/// length: its kernels' parallel loops and halves then start without waking a sleeping
/// thread (Keras MLP step 4.2-4.9 -> 3.5-4.4 ms in six interleaved pairs). Longer runs of big kernels, which the pool already splits well,
/// measured slower that way (Keras CNN step 34-36 -> 35-40 ms) and run on the calling
/// thread; so do plans with a Python callback (the calling thread holds the GIL's
/// hand-off) and, with `FERROKERAS_CPU_TEAM=0`, every plan. With `FERROKERAS_CPU_POOL=1`
/// (and no callback) long runs still move to a rayon worker, without the poller: it was
/// measured mixed (benches/PROFILE.md) and is off by default.
pub fn run(plan: &Plan, feeds: Vec<Value>) -> Result<Vec<Value>> {
    use std::sync::atomic::Ordering;
    static POOL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let pool = *POOL.get_or_init(|| std::env::var_os("FERROKERAS_CPU_POOL").is_some_and(|v| v == "1"));
    let sched = plan.cpu_schedule();
    let last = sched.last_run_ns.load(Ordering::Relaxed);
    let short = (TEAM_MIN_RUN.as_nanos() as u64..TEAM_MAX_RUN.as_nanos() as u64).contains(&last);
    let t0 = std::time::Instant::now();
    let r = if team::enabled() && short && !sched.has_host {
        on_worker(plan, || team::with_team(|| run_here(plan, feeds)))
    } else if pool {
        on_worker(plan, || run_here(plan, feeds))
    } else {
        run_here(plan, feeds)
    };
    sched.last_run_ns.store(t0.elapsed().as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    r
}

/// Runs `f` on a rayon worker, where the parallel loops of the kernels it calls are joins
/// rather than a wake-up and a sleep of the calling thread each; on the calling thread
/// when that is already a worker, or when `plan` has a Python callback (the calling
/// thread is the one that can take the GIL).
fn on_worker<R: Send>(plan: &Plan, f: impl FnOnce() -> R + Send) -> R {
    if plan.cpu_schedule().has_host || rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::scope(|_| f())
}

fn run_here(plan: &Plan, feeds: Vec<Value>) -> Result<Vec<Value>> {
    run_recording(plan, feeds, None)
}

/// Shapes of a run's slots by plan index (None for fused groups' inner values).
pub type SlotShapes = Vec<Option<Vec<usize>>>;

/// `run_here`, also noting in `shapes` the shape of every value put in a slot (what
/// `Plan::specialize` needs).
pub fn run_recording(plan: &Plan, mut feeds: Vec<Value>, mut shapes: Option<&mut SlotShapes>) -> Result<Vec<Value>> {
    if let Some(s) = shapes.as_deref_mut() {
        *s = vec![None; plan.nodes.len()];
    }
    let mut slots: Vec<Option<Value>> = vec![None; plan.nodes.len()];
    // Results of multi-result nodes (loops), read by their TupleGet users.
    let mut multi: HashMap<usize, Vec<Value>> = HashMap::new();
    let sched = plan.cpu_schedule();
    for (item, frees) in sched.items.iter().zip(&sched.frees) {
        match item {
            Item::Node(i) => {
                let i = *i;
                let v = step(plan, i, &mut feeds, &slots, &mut multi)?;
                slots[i] = Some(v);
            }
            Item::Group(g) => {
                match fused::run(plan, g, &mut slots)? {
                    Some(vals) => {
                        for (&o, v) in g.outputs.iter().zip(vals) {
                            slots[o] = Some(v);
                        }
                    }
                    // Outputs of different shapes: run the members one by one.
                    None => {
                        for &m in &g.members {
                            let v = step(plan, m, &mut feeds, &slots, &mut multi)?;
                            slots[m] = Some(v);
                        }
                    }
                }
            }
        }
        if let Some(s) = shapes.as_deref_mut() {
            let set: &[usize] = match item {
                Item::Node(i) => std::slice::from_ref(i),
                Item::Group(g) => &g.members,
            };
            for &j in set {
                s[j] = slots[j].as_ref().map(|v| v.shape().to_vec());
            }
        }
        for &j in frees {
            slots[j] = None;
            multi.remove(&j);
        }
    }
    Ok(plan.outputs.iter().map(|&o| slots[o].clone().expect("outputs are kept")).collect())
}

fn step(plan: &Plan, i: usize, feeds: &mut [Value], slots: &[Option<Value>], multi: &mut HashMap<usize, Vec<Value>>) -> Result<Value> {
    let node = &plan.nodes[i];
    Ok(match &plan.steps[i] {
        Step::Fed(f) => std::mem::replace(&mut feeds[*f], Value::scalar_f64(node.dtype(), 0.0)),
        Step::Folded(v) => v.clone(),
        Step::Compute => {
            let args: Vec<&Value> = plan.inputs[i]
                .iter()
                .map(|&j| slots[j].as_ref().expect("inputs are computed before their users"))
                .collect();
            run_node(plan, i, &args, multi)?
        }
    })
}

/// Runs compute node `i` of `plan` on host values. Multi-result nodes (loops, host
/// callbacks, CTC decoding) keep their results in `multi`, where their `TupleGet` users find them; the
/// GPU executor uses this too for the nodes it runs on the CPU.
pub fn run_node(plan: &Plan, i: usize, args: &[&Value], multi: &mut HashMap<usize, Vec<Value>>) -> Result<Value> {
    let node = &plan.nodes[i];
    match node.op() {
        Op::Loop(body) => {
            // A loop runs hundreds of small kernels per call: always worth a worker
            // (Keras LSTM step: 1.26x, benches/PROFILE.md), with a second one polling
            // for halves of them (`team`).
            let read = results_read(plan, i, body.n_results());
            let results = on_worker(&body.plan(), || team::with_team(|| crate::ops::control::run(body, args, &read, &run_recording)))?;
            multi.insert(i, results);
            Ok(Value::scalar_f64(node.dtype(), 0.0))
        }
        Op::HostCall(h) => {
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
                .ok_or_else(|| Error::Runtime(format!("result {k} of a multi-result node was not computed")))
        }
        op => op.cpu(args),
    }
}

/// Which results of multi-result node `i` some `TupleGet` of `plan` reads.
fn results_read(plan: &Plan, i: usize, n: usize) -> Vec<bool> {
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
