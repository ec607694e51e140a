//! `Plan::specialize` against the generic plan: the shapes a CPU run records fold the
//! plan's shape nodes and drop the no-op `sum_to`/`broadcast_to`, with the same results.

use crate::base::dtype::DType;
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::compile::{Plan, Step};
use crate::ops::build::*;
use crate::ops::source::placeholder;
use crate::ops::Op;
use crate::runtime::cpu::{run_recording, PlanState, SlotShapes};

fn count(plan: &Plan, pred: impl Fn(&Op) -> bool) -> usize {
    plan.nodes
        .iter()
        .zip(&plan.steps)
        .filter(|(n, s)| matches!(s, Step::Compute) && pred(n.op()))
        .count()
}

/// `y = sum_to(x * w, shape(x)) + sum_to(x * w, shape(w))`, `w` of shape `[1, 3]`:
/// the first `sum_to` is the identity at every batch size, the second only at batch 1.
#[test]
fn specialised_plans_match_the_generic_one() {
    let x = placeholder("x", Shape(vec![None, Some(3)]), DType::F32, None).unwrap();
    let w = placeholder("w", Shape(vec![Some(1), Some(3)]), DType::F32, None).unwrap();
    let p = mul(&x, &w).unwrap();
    let a = sum_to(&p, &shape_of(&x).unwrap()).unwrap();
    let b = sum_to(&p, &shape_of(&w).unwrap()).unwrap();
    let plan = Plan::new(&[x.clone(), w.clone()], &[a, b]).unwrap();
    let wv = Value::from_vec(&[1, 3], vec![0.5f32, -2.0, 3.0]).unwrap();
    for batch in [1usize, 4] {
        let xv = Value::from_vec(
            &[batch, 3],
            (0..3 * batch).map(|i| i as f32 - 2.5).collect::<Vec<f32>>(),
        )
        .unwrap();
        let mut shapes = SlotShapes::new();
        let state = PlanState::default();
        let want = run_recording(
            &plan,
            &state,
            vec![xv.clone(), wv.clone()],
            Some(&mut shapes),
        )
        .unwrap();
        let special = plan.specialize(&shapes, &[]);
        assert_eq!(
            count(&special, |op| matches!(op, Op::ShapeOf)),
            0,
            "shapes are folded"
        );
        let sums = count(&special, |op| matches!(op, Op::SumTo));
        assert_eq!(
            sums,
            if batch == 1 { 0 } else { 1 },
            "only the identity sum_to is dropped (batch {batch})"
        );
        let got =
            run_recording(&special, &PlanState::default(), vec![xv, wv.clone()], None).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape());
            assert_eq!(g.to_f64_vec(), w.to_f64_vec());
        }
    }
}

/// `out = broadcast_to(sum_to(x * x, shape(w)), shape(x * x))`: the generic plan reads the
/// product's shape after the sum, its last other reader; the shape is taken as soon as
/// the product exists and the product released after the sum, with the same result.
#[test]
fn a_value_read_later_only_for_its_shape_is_released_after_its_last_other_reader() {
    let x = placeholder("x", Shape(vec![None, Some(3)]), DType::F32, None).unwrap();
    let w = placeholder("w", Shape(vec![Some(1), Some(3)]), DType::F32, None).unwrap();
    let a = mul(&x, &x).unwrap();
    let r = sum_to(&a, &shape_of(&w).unwrap()).unwrap();
    let out = crate::ops::movement::broadcast_to(&r, &shape_of(&a).unwrap()).unwrap();
    let plan = Plan::new(&[x, w], &[out]).unwrap();
    let early = super::EarlyShapes::new(&plan);
    let released: Vec<&(usize, Vec<usize>)> = early.frees.iter().flatten().collect();
    assert_eq!(released.len(), 1, "the product is released early");
    let (j, readers) = released[0];
    assert!(matches!(
        plan.nodes[*j].op(),
        Op::Binary(crate::ops::BinaryOp::Mul)
    ));
    assert_eq!(readers.len(), 1);
    assert!(matches!(plan.nodes[readers[0]].op(), Op::ShapeOf));
    assert!(early.early[readers[0]]);
    let xv = Value::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let wv = Value::from_vec(&[1, 3], vec![0.0f32; 3]).unwrap();
    for _ in 0..2 {
        let got = run_recording(
            &plan,
            &PlanState::default(),
            vec![xv.clone(), wv.clone()],
            None,
        )
        .unwrap();
        assert_eq!(got[0].shape(), &[2, 3]);
        assert_eq!(
            got[0].to_f64_vec(),
            vec![17.0, 29.0, 45.0, 17.0, 29.0, 45.0]
        );
    }
}
