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

/// A draw of fixed shape is neither folded at compile time nor merged with a twin of the
/// same seed: each execution of each node draws (`Op::purity`).
#[test]
fn random_draws_are_not_folded_or_merged() {
    use crate::ops::random::{random, RandomDist};
    let shape = int_vector(&[64]);
    let a = random(RandomDist::Uniform, &shape, DType::F32, Some(7)).unwrap();
    let b = random(RandomDist::Uniform, &shape, DType::F32, Some(7)).unwrap();
    let f = Function::new(vec![], vec![a, b], vec![]).unwrap();
    assert_eq!(f.plan.dispatches(), 2, "both draws run");
    let first = f.call(vec![]).unwrap();
    let second = f.call(vec![]).unwrap();
    assert_ne!(
        first[0].to_f64_vec(),
        second[0].to_f64_vec(),
        "fresh numbers per call"
    );
    // Same seed, separate nodes: both are at their first execution in the first call.
    assert_eq!(first[0].to_f64_vec(), first[1].to_f64_vec());
}

/// A callback is neither run at compile time on a constant input nor merged with an
/// identical call: it runs once per node per execution.
#[test]
fn host_callbacks_are_not_folded_or_merged() {
    use crate::base::error::Result;
    use crate::ops::control::tuple_get;
    use crate::ops::host::{host_call, HostFn};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    #[derive(Debug, Default)]
    struct Counting(AtomicUsize);
    impl HostFn for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn call(&self, inputs: Vec<Value>) -> Result<Vec<Value>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(vec![inputs[0].clone()])
        }
        fn vjp(&self, _: &[Value], _: &[Value]) -> Result<Vec<Option<Value>>> {
            Ok(vec![None])
        }
    }
    let counter = Arc::new(Counting::default());
    let c = constant(vals(&[3], 1));
    let spec = vec![(c.shape().clone(), c.dtype())];
    let h1 = host_call(counter.clone(), std::slice::from_ref(&c), spec.clone()).unwrap();
    let h2 = host_call(counter.clone(), std::slice::from_ref(&c), spec).unwrap();
    let y = add(&tuple_get(&h1, 0).unwrap(), &tuple_get(&h2, 0).unwrap()).unwrap();
    let f = Function::new(vec![], vec![y], vec![]).unwrap();
    assert_eq!(
        counter.0.load(Ordering::SeqCst),
        0,
        "not run at compile time"
    );
    let out = f.call(vec![]).unwrap();
    assert_eq!(counter.0.load(Ordering::SeqCst), 2, "each node runs once");
    f.call(vec![]).unwrap();
    assert_eq!(
        counter.0.load(Ordering::SeqCst),
        4,
        "and again on every call"
    );
    let want: Vec<f64> = vals(&[3], 1).to_f64_vec().iter().map(|v| 2.0 * v).collect();
    assert_eq!(out[0].to_f64_vec(), want);
}

/// The CPU executor moves into a host callback the inputs that die at it: the callback
/// gets a value that nothing else holds (and may write it in place) where the value is
/// the run's alone, and a shared one where a later node, a variable or a constant also
/// holds it, so that writing its own copy changes nothing else.
#[test]
fn host_callbacks_own_the_inputs_that_die_at_them() {
    use crate::base::error::Result;
    use crate::ops::control::tuple_get;
    use crate::ops::host::{host_call, HostFn};
    use crate::ops::source::variable;
    use std::sync::{Arc, Mutex};
    /// Records which inputs arrived unshared, and adds 1 to each (in place where it may).
    #[derive(Debug, Default)]
    struct AddOne(Mutex<Vec<Vec<bool>>>);
    impl HostFn for AddOne {
        fn name(&self) -> &str {
            "add_one"
        }
        fn call(&self, inputs: Vec<Value>) -> Result<Vec<Value>> {
            let mut unique = Vec::new();
            let out = inputs
                .into_iter()
                .map(|v| {
                    let Value::F64(a) = v else {
                        unreachable!("f64 inputs")
                    };
                    unique.push(a.is_unique());
                    let mut own = a.try_into_owned_nocopy().unwrap_or_else(|a| a.to_owned());
                    own.mapv_inplace(|x| x + 1.0);
                    Value::F64(own.into_shared())
                })
                .collect();
            self.0.lock().unwrap().push(unique);
            Ok(out)
        }
        fn vjp(&self, _: &[Value], _: &[Value]) -> Result<Vec<Option<Value>>> {
            Ok(vec![None, None, None, None])
        }
    }
    let f = Arc::new(AddOne::default());
    let x = ph("x", &[Some(3)]);
    let two = constant(Value::from_vec(&[3], vec![2.0f64; 3]).unwrap());
    let dies = mul(&x, &two).unwrap();
    let lives = add(&x, &two).unwrap();
    let (cell, v) = variable("v", Value::from_vec(&[3], vec![5.0f64, 6.0, 7.0]).unwrap());
    let spec = vec![(Shape(vec![Some(3)]), DType::F64); 4];
    let h = host_call(f.clone(), &[dies, lives.clone(), v, two], spec).unwrap();
    let r: Vec<Tensor> = (0..4).map(|k| tuple_get(&h, k).unwrap()).collect();
    let after = add(&lives, &r[1]).unwrap();
    let outs = vec![r[0].clone(), after, r[2].clone(), r[3].clone()];
    let fun = Function::new(vec![x], outs, vec![]).unwrap();
    let xs = Value::from_vec(&[3], vec![1.0f64, 2.0, 3.0]).unwrap();
    for _ in 0..3 {
        let out = fun.call(vec![xs.clone()]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![3.0, 5.0, 7.0]);
        // `lives` is read after the callback: it kept its value (3, 4, 5).
        assert_eq!(out[1].to_f64_vec(), vec![7.0, 9.0, 11.0]);
        assert_eq!(out[2].to_f64_vec(), vec![6.0, 7.0, 8.0]);
        assert_eq!(out[3].to_f64_vec(), vec![3.0, 3.0, 3.0]);
        assert_eq!(cell.get().unwrap().to_f64_vec(), vec![5.0, 6.0, 7.0]);
        assert_eq!(
            f.0.lock().unwrap().pop().unwrap(),
            vec![true, false, false, false],
            "only the value that dies at the callback is its own"
        );
    }
}

/// One node of every `Op` variant, checked against the property table in `ops/mod.rs`:
/// sources and only sources have no inputs, draws, callbacks and other stateful ops are
/// impure, shape operands are int vectors, only elementwise ops cost more than one add,
/// and the GPU is asked for dtypes only of ops it lowers.
#[test]
fn op_property_table_is_consistent() {
    use crate::ops::conv::{ConvSpec, Padding};
    use crate::ops::ctc::{ctc, decode, CtcOp, Decode};
    use crate::ops::pool::{PoolKind, PoolSpec};
    use crate::ops::random::{random, RandomDist};
    use crate::ops::source::variable;
    use crate::ops::{control, host, ArgOp, Class, Op, Purity, ScanOp, SliceAxis, Zeros};
    use std::sync::Arc;

    /// Each variant's index; its exhaustive match makes a new variant fail to compile here
    /// until it has an example below.
    fn variant(op: &Op) -> usize {
        match op {
            Op::Placeholder(_) => 0,
            Op::Constant(_) => 1,
            Op::Variable(_) => 2,
            Op::Unary(_) => 3,
            Op::Binary(_) => 4,
            Op::Select => 5,
            Op::Cast(_) => 6,
            Op::StopGradient => 7,
            Op::Reduce { .. } => 8,
            Op::Arg { .. } => 9,
            Op::Scan { .. } => 10,
            Op::Reshape => 11,
            Op::BroadcastTo => 12,
            Op::SumTo => 13,
            Op::ShapeOf => 14,
            Op::ExpandDims(_) => 15,
            Op::Squeeze(_) => 16,
            Op::Transpose(_) => 17,
            Op::Slice(_) => 18,
            Op::SliceGrad(_) => 19,
            Op::Concat(_) => 20,
            Op::ConcatGrad { .. } => 21,
            Op::Pad { .. } => 22,
            Op::Reverse(_) => 23,
            Op::Gather(_) => 24,
            Op::ScatterAdd(_) => 25,
            Op::MatMul { .. } => 26,
            Op::Random(_) => 27,
            Op::Conv(_) => 28,
            Op::ConvInputGrad(_) => 29,
            Op::ConvKernelGrad(_) => 30,
            Op::Pool(_) => 31,
            Op::PoolGrad(_) => 32,
            Op::PoolSelect(_) => 33,
            Op::Loop(_) => 34,
            Op::TupleGet(_) => 35,
            Op::HostCall(_) => 36,
            Op::Ctc(_) => 37,
            Op::CtcDecode(_) => 38,
        }
    }
    const VARIANTS: usize = 39;

    #[derive(Debug)]
    struct Id;
    impl host::HostFn for Id {
        fn name(&self) -> &str {
            "id"
        }
        fn call(&self, inputs: Vec<Value>) -> crate::base::error::Result<Vec<Value>> {
            Ok(inputs)
        }
        fn vjp(&self, _: &[Value], _: &[Value]) -> crate::base::error::Result<Vec<Option<Value>>> {
            Ok(vec![None])
        }
    }

    let f32s = |name: &str, dims: &[usize]| {
        let d: Vec<Option<usize>> = dims.iter().map(|&d| Some(d)).collect();
        placeholder(name, Shape(d), DType::F32, None).unwrap()
    };
    let ints = |dims: &[usize]| {
        let d: Vec<Option<usize>> = dims.iter().map(|&d| Some(d)).collect();
        placeholder("i", Shape(d), DType::I32, None).unwrap()
    };
    let x = f32s("x", &[2, 3]);
    let img = f32s("img", &[1, 4, 4, 2]);
    let w = f32s("w", &[3, 3, 2, 2]);
    let conv_spec = Arc::new(ConvSpec {
        strides: vec![1, 1],
        dilation: vec![1, 1],
        padding: Padding::Same,
        groups: 1,
    });
    let pool_spec = Arc::new(PoolSpec {
        kind: PoolKind::Max,
        window: vec![2, 2],
        strides: vec![2, 2],
        padding: Padding::Explicit(vec![(0, 0), (0, 0)]),
    });
    let y = conv(&img, &w, &conv_spec).unwrap();
    let pooled = pool(&img, &pool_spec).unwrap();
    let sl = vec![
        SliceAxis {
            start: Some(0),
            stop: Some(1),
            step: 1,
        },
        SliceAxis {
            start: None,
            stop: None,
            step: 1,
        },
    ];
    let cat = concat(&[x.clone(), x.clone()], 0).unwrap();
    let (_, var) = variable("v", Value::from_vec(&[2], vec![1.0f64, 2.0]).unwrap());
    let (sp, st) = (f32s("sp", &[3]), f32s("st", &[3]));
    let step = add(&sp, &st).unwrap();
    let lp = control::build_loop(
        std::slice::from_ref(&x),
        &[f32s("s0", &[3])],
        vec![sp],
        vec![st],
        vec![step.clone()],
        vec![step],
        false,
    )
    .unwrap();
    let hc = host::host_call(
        Arc::new(Id),
        std::slice::from_ref(&x),
        vec![(x.shape().clone(), x.dtype())],
    )
    .unwrap();
    let logits = f32s("logits", &[1, 4, 3]);
    let lens = ints(&[1]);
    let decoded = decode(
        Decode {
            greedy: true,
            beam_width: 1,
            top_paths: 1,
        },
        &logits,
        &lens,
    )
    .unwrap();

    let nodes: Vec<Tensor> = vec![
        x.clone(),
        constant(vals(&[2], 1)),
        var,
        unary(UnaryOp::Exp, &x).unwrap(),
        binary(BinaryOp::Add, &x, &x).unwrap(),
        select(&cast(&x, DType::Bool).unwrap(), &x, &x).unwrap(),
        cast(&x, DType::F64).unwrap(),
        crate::ops::graph::Tensor::new(Op::StopGradient, vec![x.clone()]).unwrap(),
        reduce(ReduceOp::Sum, &x, &[1], false).unwrap(),
        arg(ArgOp::ArgMax, &x, 1).unwrap(),
        scan(ScanOp::Cumsum, &x, 1, false, false).unwrap(),
        reshape_to(&x, &int_vector(&[3, 2])).unwrap(),
        broadcast_to(&x, &int_vector(&[4, 2, 3])).unwrap(),
        sum_to(&x, &int_vector(&[1, 3])).unwrap(),
        // `shape_of` of a static shape is a constant: the node itself, built directly.
        crate::ops::graph::Tensor::new(Op::ShapeOf, vec![x.clone()]).unwrap(),
        expand_dims(&x, &[0]).unwrap(),
        squeeze(&expand_dims(&x, &[0]).unwrap(), &[0]).unwrap(),
        transpose(&x, &[1, 0]).unwrap(),
        slice(&x, &sl).unwrap(),
        slice_grad(&slice(&x, &sl).unwrap(), &x, &sl).unwrap(),
        cat.clone(),
        crate::ops::graph::Tensor::new(
            Op::ConcatGrad { axis: 0, index: 1 },
            vec![cat, x.clone(), x.clone()],
        )
        .unwrap(),
        pad(&x, &[(1, 0), (0, 1)], 0.0).unwrap(),
        reverse(&x, &[0]).unwrap(),
        gather(&x, &ints(&[4]), 0).unwrap(),
        scatter_add(&x, &ints(&[2]), &x, 0).unwrap(),
        matmul(&x, &transpose(&x, &[1, 0]).unwrap(), false, false).unwrap(),
        random(RandomDist::Normal, &int_vector(&[2]), DType::F32, Some(1)).unwrap(),
        y.clone(),
        conv_input_grad(&y, &w, &shape_of(&img).unwrap(), &conv_spec).unwrap(),
        conv_kernel_grad(&img, &y, &shape_of(&w).unwrap(), &conv_spec).unwrap(),
        pooled.clone(),
        pool_grad(&img, &pooled, &pool_spec).unwrap(),
        pool_select(&img, &img, &pool_spec).unwrap(),
        lp.clone(),
        crate::ops::control::tuple_get(&lp, 0).unwrap(),
        hc,
        ctc(CtcOp::Loss, &logits, &ints(&[1, 2]), &lens, &lens).unwrap(),
        decoded[0].input(0).clone(),
    ];

    let mut seen = [false; VARIANTS];
    for t in &nodes {
        let op = t.op();
        let name = op.name();
        seen[variant(op)] = true;
        let class = op.class();
        assert_eq!(
            class == Class::Source,
            t.inputs().is_empty(),
            "{name}: sources and only sources have no inputs"
        );
        if matches!(
            op,
            Op::Placeholder(_)
                | Op::Variable(_)
                | Op::Random(_)
                | Op::HostCall(_)
                | Op::Loop(_)
                | Op::CtcDecode(_)
        ) {
            assert_eq!(op.purity(), Purity::Impure, "{name} must be impure");
        }
        for &k in op.shape_operands() {
            let s = &t.inputs()[k];
            assert!(
                s.dtype().is_int() && s.rank() == 1,
                "{name}: shape operand {k} is an int vector"
            );
        }
        if !matches!(class, Class::Elementwise(_)) {
            assert_eq!(op.cost(), 1, "{name}: only elementwise ops cost more");
        }
        // A zero operand 0 (any operand, for `Zeros::Any`) gives zeros, by the CPU kernel.
        let zero_operands: &[usize] = match op.zeros() {
            Zeros::First => &[0],
            Zeros::Any => &[0, 1],
            Zeros::Additive | Zeros::Select | Zeros::Unknown => &[],
        };
        for &z in zero_operands {
            let args: Option<Vec<Value>> = t
                .inputs()
                .iter()
                .enumerate()
                .map(|(k, x)| {
                    if op.shape_operands().contains(&k) {
                        let Op::Constant(v) = x.op() else { return None };
                        return Some((**v).clone());
                    }
                    let dims: Vec<usize> = x.shape().dims().iter().map(|d| d.unwrap()).collect();
                    Some(Value::full(
                        x.dtype(),
                        &dims,
                        if k == z { 0.0 } else { 1.5 },
                    ))
                })
                .collect();
            let Some(args) = args else { continue };
            let refs: Vec<&Value> = args.iter().collect();
            let out = op.cpu(&refs).unwrap();
            assert!(
                out.to_f64_vec().iter().all(|&v| v == 0.0),
                "{name}: a zero operand {z} gives zeros"
            );
        }
        let dtypes = [DType::F32, DType::F16, DType::I32, DType::Bool];
        let lowered = dtypes.iter().any(|&d| op.gpu_supports(d));
        match class {
            Class::Source | Class::View(_) | Class::Meta | Class::Host => {
                assert!(!lowered, "{name}: no GPU lowering asks for dtypes")
            }
            Class::Elementwise(_) | Class::Kernel => {
                assert!(lowered, "{name}: a GPU lowering handles some dtype")
            }
        }
    }
    let missing: Vec<usize> = (0..VARIANTS).filter(|&v| !seen[v]).collect();
    assert!(
        missing.is_empty(),
        "variants without an example: {missing:?}"
    );
}
