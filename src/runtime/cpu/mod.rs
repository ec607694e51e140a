//! The CPU executor: walks a plan in order, calling each primitive's CPU kernel, and
//! releases every intermediate value right after its last reader.

use crate::compile::{Plan, Step};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::runtime::value::Value;
use std::collections::HashMap;

pub fn run(plan: &Plan, mut feeds: Vec<Value>) -> Result<Vec<Value>> {
    let mut slots: Vec<Option<Value>> = vec![None; plan.nodes.len()];
    // Results of multi-result nodes (loops), read by their TupleGet users.
    let mut multi: HashMap<usize, Vec<Value>> = HashMap::new();
    for (i, step) in plan.steps.iter().enumerate() {
        let node = &plan.nodes[i];
        let v = match step {
            Step::Fed(f) => std::mem::replace(&mut feeds[*f], Value::scalar_f64(node.dtype(), 0.0)),
            Step::Folded(v) => v.clone(),
            Step::Compute => {
                let args: Vec<&Value> = plan.inputs[i]
                    .iter()
                    .map(|&j| slots[j].as_ref().expect("inputs are computed before their users"))
                    .collect();
                run_node(plan, i, &args, &mut multi)?
            }
        };
        slots[i] = Some(v);
        for &j in &plan.frees[i] {
            slots[j] = None;
            multi.remove(&j);
        }
    }
    Ok(plan.outputs.iter().map(|&o| slots[o].clone().expect("outputs are kept")).collect())
}

/// Runs compute node `i` of `plan` on host values. Multi-result nodes (loops, host
/// callbacks, CTC decoding) keep their results in `multi`, where their `TupleGet` users find them; the
/// GPU executor uses this too for the nodes it runs on the CPU.
pub fn run_node(plan: &Plan, i: usize, args: &[&Value], multi: &mut HashMap<usize, Vec<Value>>) -> Result<Value> {
    let node = &plan.nodes[i];
    match node.op() {
        Op::Loop(body) => {
            multi.insert(i, crate::ops::control::run(body, args, &run)?);
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
