//! Core tests in pure Rust: shape rules, plans and gradients checked against finite
//! differences through the CPU executor (the Python suite covers the K API on top).

use crate::base::dtype::DType;
use crate::base::shape::{broadcast_static, Shape};
use crate::base::value::Value;
use crate::ops::build::*;
use crate::ops::graph::Tensor;
use crate::ops::source::{constant, placeholder};
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::runtime::Function;

fn ph(name: &str, dims: &[Option<usize>]) -> Tensor {
    placeholder(name, Shape(dims.to_vec()), DType::F64, None).unwrap()
}

fn vals(shape: &[usize], seed: u64) -> Value {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f64 / 500.0) - 1.0)
        .collect();
    Value::from_vec(shape, data).unwrap()
}

fn run(feeds: &[Tensor], outs: &[Tensor], vs: &[Value]) -> Vec<Value> {
    Function::new(feeds.to_vec(), outs.to_vec(), vec![])
        .unwrap()
        .call(vs.to_vec())
        .unwrap()
}

/// Checks d sum(f) / d inputs against central differences.
fn check_grad(inputs: &[Tensor], out: &Tensor, vs: &[Value]) {
    let axes: Vec<usize> = (0..out.rank()).collect();
    let loss = reduce(ReduceOp::Sum, out, &axes, false).unwrap();
    let grads = crate::autodiff::gradients(&loss, inputs, None).unwrap();
    let grads: Vec<Tensor> = grads.into_iter().map(|g| g.expect("connected")).collect();
    let analytic = run(inputs, &grads, vs);
    let eps = 1e-6;
    for (k, a) in analytic.iter().enumerate() {
        let base = vs[k].to_f64_vec();
        for (i, &ai) in a.to_f64_vec().iter().enumerate() {
            let bump = |d: f64| {
                let mut v = base.clone();
                v[i] += d;
                let mut fed = vs.to_vec();
                fed[k] = Value::from_vec(vs[k].shape(), v).unwrap();
                run(inputs, std::slice::from_ref(&loss), &fed)[0].to_f64_vec()[0]
            };
            let num = (bump(eps) - bump(-eps)) / (2.0 * eps);
            assert!(
                (num - ai).abs() <= 1e-6 * (1.0 + num.abs()),
                "input {k} element {i}: analytic {ai}, numeric {num}"
            );
        }
    }
}

#[test]
fn broadcasting_rules() {
    let s = |d: &[Option<usize>]| Shape(d.to_vec());
    assert_eq!(
        broadcast_static("t", &s(&[None, Some(1)]), &s(&[Some(4)])).unwrap(),
        s(&[None, Some(4)])
    );
    assert_eq!(
        broadcast_static("t", &s(&[Some(3), Some(1)]), &s(&[Some(1), Some(4)])).unwrap(),
        s(&[Some(3), Some(4)])
    );
    assert!(broadcast_static("t", &s(&[Some(3)]), &s(&[Some(4)])).is_err());
}

#[test]
fn reshape_infers_minus_one_and_rejects_bad_sizes() {
    let x = ph("x", &[Some(2), Some(6)]);
    let r = reshape_to(&x, &int_vector(&[3, -1])).unwrap();
    assert_eq!(r.shape(), &Shape::known(&[3, 4]));
    assert!(reshape_to(&x, &int_vector(&[5, -1])).is_err());
    // An unknown batch dim stays unknown, a shape read at run time gives static dims.
    let y = ph("y", &[None, Some(6)]);
    let r = reshape_to(&y, &int_vector(&[-1, 3, 2])).unwrap();
    assert_eq!(r.shape(), &Shape(vec![None, Some(3), Some(2)]));
    let like = reshape_to(&y, &shape_of(&y).unwrap()).unwrap();
    assert_eq!(like.shape(), y.shape());
}

#[test]
fn constant_subgraphs_fold_and_dead_values_are_freed() {
    let x = ph("x", &[Some(3)]);
    let c = add(&constant(vals(&[3], 1)), &constant(vals(&[3], 2))).unwrap();
    let y = unary(UnaryOp::Exp, &add(&x, &c).unwrap()).unwrap();
    let f = Function::new(vec![x], vec![y], vec![]).unwrap();
    // add(x, c) and exp: the constant sum is folded at compile time.
    assert_eq!(f.plan.dispatches(), 2);
    assert!(f.plan.frees.iter().flatten().count() >= 1);
}

#[test]
fn unfed_placeholder_is_named_in_the_error() {
    let x = ph("my_input", &[Some(2)]);
    let y = mul(&x, &x).unwrap();
    let err = Function::new(vec![], vec![y], vec![])
        .unwrap()
        .call(vec![])
        .unwrap_err();
    assert!(err.to_string().contains("my_input"), "{err}");
}

#[test]
fn gradients_of_broadcasting_elementwise_ops() {
    let a = ph("a", &[Some(3), Some(4)]);
    let b = ph("b", &[Some(4)]);
    let t = binary(
        BinaryOp::Maximum,
        &mul(&a, &b).unwrap(),
        &unary(UnaryOp::Tanh, &b).unwrap(),
    )
    .unwrap();
    let out = div(
        &unary(UnaryOp::Sigmoid, &t).unwrap(),
        &add(&unary(UnaryOp::Square, &b).unwrap(), &scalar_like(&b, 1.0)).unwrap(),
    )
    .unwrap();
    check_grad(&[a, b], &out, &[vals(&[3, 4], 3), vals(&[4], 5)]);
}

#[test]
fn gradients_of_matmul_reductions_and_movement() {
    let a = ph("a", &[Some(2), Some(3), Some(4)]);
    let w = ph("w", &[Some(4), Some(5)]);
    let m = matmul(&a, &w, false, false).unwrap();
    let t = transpose(&m, &[0, 2, 1]).unwrap();
    let r = reduce(ReduceOp::Max, &t, &[2], true).unwrap();
    let s = slice(
        &t,
        &[
            crate::ops::SliceAxis {
                start: None,
                stop: None,
                step: 1,
            },
            crate::ops::SliceAxis {
                start: Some(1),
                stop: None,
                step: 2,
            },
            crate::ops::SliceAxis {
                start: None,
                stop: None,
                step: -1,
            },
        ],
    )
    .unwrap();
    let out = add(
        &concat(&[mul(&s, &s).unwrap(), s.clone()], 1).unwrap(),
        &reduce(ReduceOp::Mean, &r, &[1], true).unwrap(),
    )
    .unwrap();
    check_grad(&[a, w], &out, &[vals(&[2, 3, 4], 7), vals(&[4, 5], 11)]);
}

#[test]
fn second_order_gradient() {
    let x = ph("x", &[Some(3)]);
    let y = mul(&unary(UnaryOp::Sin, &x).unwrap(), &x).unwrap();
    let axes = [0];
    let g = crate::autodiff::gradients(
        &reduce(ReduceOp::Sum, &y, &axes, false).unwrap(),
        std::slice::from_ref(&x),
        None,
    )
    .unwrap()[0]
        .clone()
        .unwrap();
    // d/dx (cos x * x + sin x) = 2 cos x - x sin x
    let gg = crate::autodiff::gradients(
        &reduce(ReduceOp::Sum, &g, &axes, false).unwrap(),
        std::slice::from_ref(&x),
        None,
    )
    .unwrap()[0]
        .clone()
        .unwrap();
    let xv = vals(&[3], 13);
    let got = run(&[x], &[gg], std::slice::from_ref(&xv))[0].to_f64_vec();
    for (g, x) in got.iter().zip(xv.to_f64_vec()) {
        assert!((g - (2.0 * x.cos() - x * x.sin())).abs() < 1e-12);
    }
}

/// A loop's VJP reads a captured matrix `W` of a product `x·W` in the body transposed once
/// outside the loop (the backward loop captures `Wᵀ`, and its products read no operand
/// transposed), and its gradients still match finite differences.
#[test]
fn loop_vjp_reads_captured_matrices_transposed_once() {
    let (x, h0, w) = (
        ph("x", &[Some(4), Some(2), Some(3)]),
        ph("h0", &[Some(2), Some(3)]),
        ph("w", &[Some(3), Some(3)]),
    );
    let xt = ph("xt", &[Some(2), Some(3)]);
    let ht = ph("ht", &[Some(2), Some(3)]);
    // h' = tanh(x_t·W + h·W): two products read W.
    let pre = add(
        &matmul(&xt, &w, false, false).unwrap(),
        &matmul(&ht, &w, false, false).unwrap(),
    )
    .unwrap();
    let h1 = unary(UnaryOp::Tanh, &pre).unwrap();
    let node = crate::ops::control::build_loop(
        std::slice::from_ref(&x),
        std::slice::from_ref(&h0),
        vec![xt],
        vec![ht],
        vec![h1.clone()],
        vec![h1],
        false,
    )
    .unwrap();
    let out = crate::ops::control::tuple_get(&node, 0).unwrap();
    let loss = reduce(ReduceOp::Sum, &out, &[0, 1, 2], false).unwrap();
    let grads =
        crate::autodiff::gradients(&loss, &[x.clone(), h0.clone(), w.clone()], None).unwrap();
    let order = crate::ops::graph::topo_order(
        &grads.iter().flatten().cloned().collect::<Vec<_>>(),
        &|_| false,
    );
    let backward: Vec<_> = order
        .iter()
        .filter_map(|t| match t.op() {
            crate::ops::Op::Loop(b) if b.reverse => Some(b.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(backward.len(), 1);
    let body = &backward[0];
    let wt: Vec<&Tensor> = body
        .captured
        .iter()
        .filter(|c| matches!(c.op(), crate::ops::Op::Transpose(_)) && c.input(0).id() == w.id())
        .collect();
    assert_eq!(wt.len(), 1, "the backward loop captures Wᵀ once");
    let targets: Vec<Tensor> = body
        .outputs
        .iter()
        .chain(&body.new_states)
        .cloned()
        .collect();
    let leaves: std::collections::HashSet<u64> = body
        .seq_phs
        .iter()
        .chain(&body.state_phs)
        .chain(&body.captured)
        .map(|t| t.id())
        .collect();
    let in_body = crate::ops::graph::topo_order(&targets, &|t| leaves.contains(&t.id()));
    let transposed_reads = in_body
        .iter()
        .filter(|t| matches!(t.op(), crate::ops::Op::MatMul { tb: true, .. }))
        .count();
    assert_eq!(
        transposed_reads, 0,
        "no product in the backward body reads W transposed"
    );
    check_grad(
        &[x, h0, w],
        &out,
        &[vals(&[4, 2, 3], 3), vals(&[2, 3], 5), vals(&[3, 3], 9)],
    );
}

/// The CPU GEMM's routes (transposed copy of B shared across a broadcast batch, skinny
/// column-major result, whole small matrices per task, threaded) against a plain triple
/// loop in f64.
#[test]
fn matmul_kernel_paths_match_a_plain_loop() {
    // (batch dims of a, batch dims of b, m, k, n)
    type Case<'a> = (&'a [usize], &'a [usize], usize, usize, usize);
    let cases: &[Case] = &[
        (&[], &[], 33, 17, 10),
        (&[3], &[], 20, 8, 12),
        (&[2, 1], &[1, 3], 5, 6, 7),
        (&[64], &[64], 16, 32, 32),
        (&[], &[], 160, 130, 110),
        (&[], &[], 7, 0, 3),
    ];
    for &(ba, bb, m, k, n) in cases {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let sa: Vec<usize> = ba
                .iter()
                .copied()
                .chain(if ta { [k, m] } else { [m, k] })
                .collect();
            let sb: Vec<usize> = bb
                .iter()
                .copied()
                .chain(if tb { [n, k] } else { [k, n] })
                .collect();
            let (a, b) = (vals(&sa, 3), vals(&sb, 5));
            let out = crate::ops::matmul::cpu(ta, tb, &a, &b).unwrap();
            let (av, bv, ov) = (a.to_f64_vec(), b.to_f64_vec(), out.to_f64_vec());
            let batch = broadcast_static(
                "t",
                &Shape(ba.iter().map(|&d| Some(d)).collect()),
                &Shape(bb.iter().map(|&d| Some(d)).collect()),
            )
            .unwrap()
            .0;
            let nb: usize = batch.iter().map(|d| d.unwrap()).product();
            assert_eq!(ov.len(), nb * m * n);
            // Batch index -> flat index into each operand's batch (size-1 dims broadcast).
            let flat = |own: &[usize], mut i: usize| -> usize {
                let dims: Vec<usize> = batch.iter().map(|d| d.unwrap()).collect();
                let (mut off, mut stride) = (0, 1);
                for (t, &d) in dims.iter().enumerate().rev() {
                    let idx = i % d;
                    i /= d;
                    let lead = dims.len() - own.len();
                    if t >= lead && own[t - lead] != 1 {
                        off += idx * stride;
                    }
                    if t >= lead {
                        stride *= own[t - lead];
                    }
                }
                off
            };
            for bi in 0..nb {
                let (ao, bo) = (flat(ba, bi) * m * k, flat(bb, bi) * k * n);
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|l| {
                                let x = av[ao + if ta { l * m + i } else { i * k + l }];
                                let y = bv[bo + if tb { j * k + l } else { l * n + j }];
                                x * y
                            })
                            .sum();
                        let got = ov[(bi * m + i) * n + j];
                        assert!(
                            (got - want).abs() < 1e-10 * (1.0 + want.abs()),
                            "{ba:?} {bb:?} {m}x{k}x{n} ta={ta} tb={tb}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
