//! The order of a convolutional network's backward pass: each kernel gradient runs right
//! after the gradient it reads is made (`fuse::eager`), at the same time as the input
//! gradient that reads it too (`pairs`), with the results of the plain order.

use crate::base::dtype::DType;
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::compile::fuse::{Item, Target};
use crate::compile::{Plan, Step};
use crate::ops::build::*;
use crate::ops::graph::Tensor;
use crate::ops::source::placeholder;
use crate::ops::{Op, ReduceOp, UnaryOp};
use crate::runtime::cpu::{pairs, pays, run, run_recording, PlanState, SlotShapes};

fn ph(name: &str, dims: &[usize]) -> Tensor {
    let dims = dims.iter().map(|&d| Some(d)).collect();
    placeholder(name, Shape(dims), DType::F32, None).unwrap()
}

fn data(shape: &[usize], seed: u32) -> Value {
    let n: usize = shape.iter().product();
    let v = (0..n as u32)
        .map(|i| {
            (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97) % 1000) as f32 / 500.0 - 1.0
        })
        .collect();
    Value::from_vec(shape, v).unwrap()
}

/// Three 3x3 convolutions with relus and the loss `sum(y * y)`; the kernels' gradients
/// asked for first layer first, as Keras' updates read them.
fn network() -> (Vec<Tensor>, Vec<Tensor>, Vec<Value>) {
    let spec = std::sync::Arc::new(crate::ops::conv::ConvSpec {
        strides: vec![1; 2],
        dilation: vec![1; 2],
        padding: crate::ops::conv::Padding::Same,
        groups: 1,
    });
    let x = ph("x", &[4, 12, 12, 8]);
    let ws: Vec<Tensor> = (0..3)
        .map(|k| ph(&format!("w{k}"), &[3, 3, 8, 8]))
        .collect();
    let mut h = x.clone();
    for w in &ws {
        h = unary(UnaryOp::Relu, &conv(&h, w, &spec).unwrap()).unwrap();
    }
    let loss = reduce(ReduceOp::Sum, &mul(&h, &h).unwrap(), &[0, 1, 2, 3], false).unwrap();
    let grads = crate::autodiff::gradients(&loss, &ws, None)
        .unwrap()
        .into_iter()
        .map(|g| g.unwrap())
        .collect();
    let feeds = [vec![x], ws].concat();
    let values = (0..4)
        .map(|k| {
            data(
                if k == 0 {
                    &[4, 12, 12, 8]
                } else {
                    &[3, 3, 8, 8]
                },
                k,
            )
        })
        .collect();
    (feeds, grads, values)
}

fn op_at(plan: &Plan, item: &Item) -> Option<&'static str> {
    let &Item::Node(i) = item else { return None };
    if !matches!(plan.steps[i], Step::Compute) {
        return None;
    }
    match plan.nodes[i].op() {
        Op::ConvKernelGrad(_) => Some("kernel"),
        Op::ConvInputGrad(_) => Some("input"),
        _ => None,
    }
}

#[test]
fn kernel_gradients_run_beside_the_input_gradients_that_share_their_reads() {
    let (feeds, grads, _) = network();
    let plan = Plan::new(&feeds, &grads).unwrap();
    let items = &plan.schedule(&Target::cpu_configured()).items;
    let order: Vec<&str> = items.iter().filter_map(|it| op_at(&plan, it)).collect();
    // Last layer first: each layer's kernel gradient, then its input gradient (the first
    // layer needs none).
    assert_eq!(order, ["kernel", "input", "kernel", "input", "kernel"]);
    let paired: Vec<(&str, &str)> = pairs(&plan)
        .iter()
        .enumerate()
        .filter_map(|(t, u)| {
            u.map(|u| {
                (
                    op_at(&plan, &items[t]).unwrap(),
                    op_at(&plan, &items[u]).unwrap(),
                )
            })
        })
        .collect();
    assert_eq!(paired, [("kernel", "input"); 2]);
}

#[test]
fn paired_runs_match_the_plain_order_bitwise() {
    let (feeds, grads, values) = network();
    let plan = Plan::new(&feeds, &grads).unwrap();
    // Recording shapes runs every item on its own.
    let mut shapes = SlotShapes::new();
    let plain = run_recording(
        &plan,
        &PlanState::default(),
        values.clone(),
        Some(&mut shapes),
    )
    .unwrap();
    for _ in 0..3 {
        let paired = run(&plan, &PlanState::default(), values.clone(), None).unwrap();
        for (a, b) in plain.iter().zip(&paired) {
            assert_eq!(a.shape(), b.shape());
            let bits = |v: &Value| {
                v.to_f64_vec()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(a), bits(b));
        }
    }
}

#[test]
fn large_kernel_gradients_run_on_their_own() {
    let (feeds, grads, _) = network();
    let plan = Plan::new(&feeds, &grads).unwrap();
    let items = &plan.schedule(&Target::cpu_configured()).items;
    let t = pairs(&plan).iter().position(Option::is_some).unwrap();
    let &Item::Node(i) = &items[t] else {
        unreachable!()
    };
    let ins = &plan.inputs[i];
    let with = |gy: &[usize], w: [i64; 4]| {
        let mut slots = vec![None; plan.nodes.len()];
        slots[ins[1]] = Some(Value::from_vec(gy, vec![0f32; gy.iter().product()]).unwrap());
        slots[ins[2]] = Some(Value::from_vec(&[4], w.to_vec()).unwrap());
        pays(&plan, &items[t], &slots)
    };
    // ResNet50's 3x3 kernel gradients at batch 8 (302 M multiply-adds) pair; the Keras
    // CNN's second convolution at batch 64 (679 M) does not.
    assert!(with(&[8, 32, 32, 64], [3, 3, 64, 64]));
    assert!(!with(&[64, 24, 24, 64], [3, 3, 32, 64]));
}
