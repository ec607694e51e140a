//! Fused CPU runs against unfused ones: bitwise equal (both use the op tables' per-element
//! code), over broadcast patterns, several outputs, bool values, special values, empty and
//! rank-0 tensors, and the parallel path.

use crate::base::dtype::DType;
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::compile::fuse::Target;
use crate::compile::update_rule::Rule;
use crate::ops::build::*;
use crate::ops::graph::Tensor;
use crate::ops::source::{constant, placeholder};
use crate::ops::{BinaryOp, UnaryOp};
use crate::runtime::Function;

fn ph(name: &str, dims: &[Option<usize>]) -> Tensor {
    placeholder(name, Shape(dims.to_vec()), DType::F32, None).unwrap()
}

fn data(shape: &[usize], seed: u32) -> Value {
    let n: usize = shape.iter().product();
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -1e-40,
        90.0,
        -110.0,
        3e38,
    ];
    let v: Vec<f32> = (0..n as u32)
        .map(|i| {
            let h = i
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(97));
            if h % 37 == 0 {
                specials[(h / 37) as usize % specials.len()]
            } else {
                ((h % 2000) as f32 / 250.0) - 4.0
            }
        })
        .collect();
    Value::from_vec(shape, v).unwrap()
}

/// Runs the graph fused and unfused; asserts bitwise equal results; returns the launch
/// counts (fused, unfused).
fn same(feeds: &[Tensor], outs: &[Tensor], vs: &[Value]) -> (usize, usize) {
    let mut res = Vec::new();
    let mut counts = Vec::new();
    for fuse in [true, false] {
        let f = Function::new(feeds.to_vec(), outs.to_vec(), vec![]).unwrap();
        counts.push(f.plan.schedule(&Target::cpu(fuse)).dispatches);
        res.push(crate::runtime::cpu::run(&f.plan, &f.cpu, vs.to_vec(), None).unwrap());
    }
    for (k, (a, b)) in res[0].iter().zip(&res[1]).enumerate() {
        assert_eq!(a.dtype(), b.dtype(), "output {k}");
        assert_eq!(a.shape(), b.shape(), "output {k}");
        let bits = |v: &Value| -> Vec<u64> {
            v.to_f64_vec()
                .iter()
                .map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
                .collect()
        };
        assert_eq!(bits(a), bits(b), "output {k}");
    }
    (counts[0], counts[1])
}

fn c(v: f32) -> Tensor {
    constant(Value::scalar_f64(DType::F32, v as f64))
}

#[test]
fn chains_with_every_broadcast_pattern_fuse_to_one_pass() {
    let x = ph("x", &[None, Some(5), Some(6)]);
    let bias = ph("bias", &[Some(6)]);
    let col = ph("col", &[None, Some(1), Some(6)]);
    let s = ph("s", &[]);
    let h = add(&mul(&x, &bias).unwrap(), &col).unwrap();
    let t = unary(UnaryOp::Tanh, &h).unwrap();
    let g = unary(UnaryOp::Sigmoid, &sub(&t, &s).unwrap()).unwrap();
    let m = binary(BinaryOp::Greater, &h, &c(0.0)).unwrap();
    let sel = select(&m, &g, &c(0.0)).unwrap();
    let y = binary(
        BinaryOp::Maximum,
        &unary(UnaryOp::Exp, &sel).unwrap(),
        &unary(UnaryOp::Log, &x).unwrap(),
    )
    .unwrap();
    let feeds = [x, bias, col, s];
    let vs = [
        data(&[4, 5, 6], 1),
        data(&[6], 2),
        data(&[4, 1, 6], 3),
        Value::scalar_f64(DType::F32, 0.25),
    ];
    let (fused, unfused) = same(&feeds, std::slice::from_ref(&y), &vs);
    assert_eq!(fused, 1, "one pass");
    assert!(unfused >= 10);
    // Intermediates read outside become extra outputs; bool outputs too.
    let (fused, _) = same(&feeds, &[y, t, m], &vs);
    assert_eq!(fused, 1);
}

#[test]
fn bool_logic_casts_and_scalars() {
    let a = ph("a", &[Some(7), Some(3)]);
    let b = ph("b", &[Some(3)]);
    let p = binary(BinaryOp::Less, &a, &b).unwrap();
    let q = unary(UnaryOp::Not, &binary(BinaryOp::Equal, &a, &c(1.0)).unwrap()).unwrap();
    let r = binary(BinaryOp::And, &p, &q).unwrap();
    let f = cast(&r, DType::F32).unwrap();
    let back = cast(&mul(&a, &f).unwrap(), DType::Bool).unwrap();
    let o = binary(BinaryOp::Or, &back, &p).unwrap();
    let (fused, _) = same(
        &[a.clone(), b.clone()],
        &[o, f],
        &[data(&[7, 3], 5), data(&[3], 6)],
    );
    assert_eq!(fused, 1);
    // Rank 0: everything a single value.
    let s = ph("s", &[]);
    let y = unary(
        UnaryOp::Softplus,
        &add(&mul(&s, &c(3.0)).unwrap(), &c(-1.0)).unwrap(),
    )
    .unwrap();
    for v in [0.5f32, f32::NAN, f32::INFINITY, -1e30] {
        same(
            std::slice::from_ref(&s),
            std::slice::from_ref(&y),
            &[Value::scalar_f64(DType::F32, v as f64)],
        );
    }
}

#[test]
fn empty_tensors_and_the_parallel_path() {
    let x = ph("x", &[None, Some(3)]);
    let b = ph("b", &[Some(3)]);
    let y = unary(UnaryOp::Tanh, &add(&x, &b).unwrap()).unwrap();
    let z = binary(BinaryOp::Greater, &y, &c(0.1)).unwrap();
    same(
        &[x.clone(), b.clone()],
        &[y.clone(), z.clone()],
        &[data(&[0, 3], 1), data(&[3], 2)],
    );
    same(&[x, b], &[y, z], &[data(&[100_003, 3], 1), data(&[3], 2)]);
}

#[test]
fn outputs_of_different_runtime_shapes_fall_back() {
    let p = ph("p", &[None]);
    let q = ph("q", &[None]);
    let q2 = neg(&q).unwrap();
    let a = add(&p, &q2).unwrap();
    let out = mul(&a, &c(2.0)).unwrap();
    same(
        &[p.clone(), q.clone()],
        &[out.clone(), q2.clone()],
        &[data(&[5], 1), data(&[1], 2)],
    );
    same(&[p, q], &[out, q2], &[data(&[5], 1), data(&[5], 2)]);
}

#[test]
fn dead_inputs_are_overwritten_only_after_every_read() {
    // z dies in the group and is read by several members and passed through as an
    // output: results must not see partially overwritten chunks.
    let a = ph("a", &[Some(300), Some(40)]);
    let w = ph("w", &[Some(40), Some(50)]);
    let z = matmul(&a, &w, false, false).unwrap();
    let y = add(
        &mul(&z, &c(2.0)).unwrap(),
        &unary(UnaryOp::Exp, &neg(&z).unwrap()).unwrap(),
    )
    .unwrap();
    let y2 = sub(&y, &z).unwrap();
    let vs = [data(&[300, 40], 1), data(&[40, 50], 2)];
    same(&[a.clone(), w.clone()], &[y.clone(), y2.clone()], &vs);
    let zshape = shape_of(&z).unwrap();
    let pass = broadcast_to(&z, &zshape).unwrap();
    same(&[a, w], &[y2, pass], &vs);
}

fn ax(start: Option<i64>, stop: Option<i64>, step: i64) -> crate::ops::SliceAxis {
    crate::ops::SliceAxis { start, stop, step }
}

#[test]
fn slices_are_read_in_place_by_the_groups_that_read_them() {
    // The Keras LSTM's gates: four column blocks of z, each read by one elementwise chain.
    let z = ph("z", &[None, Some(16)]);
    let gate = |k: i64| {
        slice(
            &z,
            &[ax(None, None, 1), ax(Some(4 * k), Some(4 * k + 4), 1)],
        )
        .unwrap()
    };
    let (i, f, g, o) = (gate(0), gate(1), gate(2), gate(3));
    let sig = |t: &Tensor| unary(UnaryOp::Sigmoid, t).unwrap();
    let cell = add(
        &mul(&sig(&f), &c(0.5)).unwrap(),
        &mul(&sig(&i), &unary(UnaryOp::Tanh, &g).unwrap()).unwrap(),
    )
    .unwrap();
    let h = mul(&sig(&o), &unary(UnaryOp::Tanh, &cell).unwrap()).unwrap();
    let (fused, unfused) = same(
        std::slice::from_ref(&z),
        &[h.clone(), cell.clone()],
        &[data(&[5, 16], 1)],
    );
    // One pass: the slices are not copied on their own.
    assert_eq!(fused, 1, "{fused} vs {unfused}");
    same(
        std::slice::from_ref(&z),
        std::slice::from_ref(&h),
        &[data(&[0, 16], 2)],
    );
    same(std::slice::from_ref(&z), &[h], &[data(&[70_001, 16], 3)]);
    // A slice also returned, a slice read twice, and z itself read by the group too.
    let zi = sub(&i, &mul(&i, &i).unwrap()).unwrap();
    same(
        std::slice::from_ref(&z),
        &[zi.clone(), i.clone()],
        &[data(&[7, 16], 4)],
    );
    let zz = add(
        &slice(&z, &[ax(None, None, 1), ax(Some(0), Some(16), 1)]).unwrap(),
        &z,
    )
    .unwrap();
    same(std::slice::from_ref(&z), &[zz], &[data(&[7, 16], 5)]);
    // A slice nothing fuses with stays a plain node.
    let (fused, _) = same(
        std::slice::from_ref(&z),
        std::slice::from_ref(&g),
        &[data(&[3, 16], 6)],
    );
    assert_eq!(fused, 1);
}

#[test]
fn strided_and_clamped_slices_of_higher_rank() {
    let x = ph("x", &[None, Some(6), Some(9)]);
    let specs: Vec<Vec<crate::ops::SliceAxis>> = vec![
        vec![
            ax(Some(1), Some(3), 1),
            ax(None, None, 1),
            ax(None, None, 1),
        ],
        vec![
            ax(None, None, 2),
            ax(Some(-4), None, 1),
            ax(Some(1), Some(8), 3),
        ],
        vec![
            ax(None, None, 1),
            ax(Some(5), Some(100), 1),
            ax(Some(8), None, 1),
        ],
        vec![
            ax(None, None, 1),
            ax(Some(4), Some(2), 1),
            ax(None, None, 1),
        ],
    ];
    for (k, spec) in specs.iter().enumerate() {
        let s = slice(&x, spec).unwrap();
        let y = unary(UnaryOp::Exp, &mul(&s, &c(0.25)).unwrap()).unwrap();
        // Broadcast against a row of the slice's width, read as a second input.
        let row = reduce(crate::ops::ReduceOp::Sum, &s, &[0, 1], true).unwrap();
        let y2 = add(&y, &row).unwrap();
        same(
            std::slice::from_ref(&x),
            &[y, y2],
            &[data(&[4, 6, 9], k as u32)],
        );
    }
}

#[test]
fn repeating_inputs_across_chunks_and_threads() {
    // Periods that do not divide the 1024-element chunk, over many chunks (and the
    // parallel path), and a repeating input returned through broadcast_to.
    for (rows, row) in [
        (1000usize, vec![7usize]),
        (700, vec![3, 37]),
        (50_000, vec![5]),
        (3, vec![1024]),
        (9, vec![1500]),
    ] {
        let mut dims = vec![None];
        dims.extend(row.iter().map(|&d| Some(d)));
        let x = ph("x", &dims);
        let b = ph("b", &row.iter().map(|&d| Some(d)).collect::<Vec<_>>());
        let y = unary(UnaryOp::Relu, &add(&x, &b).unwrap()).unwrap();
        let z = mul(&sub(&b, &x).unwrap(), &b).unwrap();
        let shape_x = shape_of(&x).unwrap();
        let wide = broadcast_to(&b, &shape_x).unwrap();
        let mut xs = vec![rows];
        xs.extend(&row);
        let vs = [data(&xs, 1), data(&row, 2)];
        same(&[x.clone(), b.clone()], &[y, z, wide], &vs);
    }
}

fn conv_spec(
    padding: crate::ops::conv::Padding,
    groups: usize,
    stride: usize,
) -> std::sync::Arc<crate::ops::conv::ConvSpec> {
    std::sync::Arc::new(crate::ops::conv::ConvSpec {
        strides: vec![stride; 2],
        dilation: vec![1; 2],
        padding,
        groups,
    })
}

#[test]
fn a_convolution_runs_with_its_bias_and_activation_image_by_image() {
    use crate::ops::conv::Padding;
    // Winograd (3x3, 16+ channels), im2col (5 channels), depthwise (groups = cin), strided;
    // batch 1 (a parallel gemm inside one image) and 7 images.
    let cases: Vec<(usize, usize, usize, usize, Padding, usize)> = vec![
        // (batch, cin, cout, k, padding, groups)
        (7, 16, 32, 3, Padding::Explicit(vec![(0, 0); 2]), 1),
        (1, 16, 32, 3, Padding::Same, 1),
        (7, 5, 6, 3, Padding::Same, 1),
        (3, 6, 12, 3, Padding::Explicit(vec![(0, 0); 2]), 6),
        (5, 4, 8, 2, Padding::Explicit(vec![(0, 0); 2]), 1),
    ];
    for (k, (n, cin, cout, ks, pad, groups)) in cases.into_iter().enumerate() {
        let stride = if k == 4 { 2 } else { 1 };
        let x = ph("x", &[None, Some(9), Some(11), Some(cin)]);
        let w = ph("w", &[Some(ks), Some(ks), Some(cin / groups), Some(cout)]);
        let b = ph("b", &[Some(cout)]);
        let y = conv(&x, &w, &conv_spec(pad, groups, stride)).unwrap();
        let act = unary(UnaryOp::Relu, &add(&y, &b).unwrap()).unwrap();
        let vs = [
            data(&[n, 9, 11, cin], 1),
            data(&[ks, ks, cin / groups, cout], 2),
            data(&[cout], 3),
        ];
        let (fused, unfused) = same(
            &[x.clone(), w.clone(), b.clone()],
            std::slice::from_ref(&act),
            &vs,
        );
        assert!(fused < unfused, "case {k}: {fused} vs {unfused}");
        // Two outputs (one in the convolution's buffer), and a tanh of the sum too.
        let t = unary(UnaryOp::Tanh, &act).unwrap();
        let pre = add(&y, &b).unwrap();
        same(&[x.clone(), w.clone(), b.clone()], &[t, pre], &vs);
        // The convolution also returned: it keeps its own value.
        same(
            &[x.clone(), w.clone(), b.clone()],
            &[act.clone(), y.clone()],
            &vs,
        );
        // Its shape read after the group (a gradient's `sum_to` target, the batch unknown).
        let back = sum_to(&mul(&act, &c(2.0)).unwrap(), &shape_of(&y).unwrap()).unwrap();
        same(&[x.clone(), w.clone(), b.clone()], &[back], &vs);
    }
    // An empty batch.
    let x = ph("x", &[None, Some(6), Some(6), Some(16)]);
    let w = ph("w", &[Some(3), Some(3), Some(16), Some(16)]);
    let y = conv(&x, &w, &conv_spec(Padding::Same, 1, 1)).unwrap();
    let act = unary(UnaryOp::Sigmoid, &y).unwrap();
    same(
        &[x, w],
        &[act],
        &[data(&[0, 6, 6, 16], 1), data(&[3, 3, 16, 16], 2)],
    );
}

/// A 2-D pooling with square windows and strides.
fn pool_spec(
    kind: crate::ops::pool::PoolKind,
    win: usize,
    stride: usize,
    padding: crate::ops::conv::Padding,
) -> std::sync::Arc<crate::ops::pool::PoolSpec> {
    std::sync::Arc::new(crate::ops::pool::PoolSpec {
        kind,
        window: vec![win; 2],
        strides: vec![stride; 2],
        padding,
    })
}

/// Whether the CPU schedule of `outs` hands a pooling or reduction to a group run after
/// a convolution (`Group::pooled`).
fn stage_taken(feeds: &[Tensor], outs: &[Tensor]) -> bool {
    let f = Function::new(feeds.to_vec(), outs.to_vec(), vec![]).unwrap();
    let sched = f.plan.schedule(&Target::cpu(true));
    sched.items.iter().any(|i| {
        i.group()
            .is_some_and(|g| g.first.is_some() && g.pooled.is_some())
    })
}

/// `out`, a pooling or reduction of the convolution epilogue `act`, runs on each image
/// after the epilogue (bitwise as unfused, two launches fewer); with `act` also returned
/// it stays a node of its own.
fn per_image_stage(feeds: &[Tensor], out: &Tensor, act: &Tensor, vs: &[Value], label: &str) {
    let (fused, unfused) = same(feeds, std::slice::from_ref(out), vs);
    assert!(fused + 2 <= unfused, "{label}: {fused} vs {unfused}");
    assert!(stage_taken(feeds, std::slice::from_ref(out)), "{label}");
    let both = [out.clone(), act.clone()];
    assert!(
        !stage_taken(feeds, &both),
        "{label}: the epilogue is also returned"
    );
    same(feeds, &both, vs);
}

#[test]
fn a_pooling_of_a_convolution_epilogue_runs_on_each_image_after_it() {
    use crate::ops::conv::Padding;
    use crate::ops::pool::PoolKind;
    // conv -> bias -> relu -> pool, the pool the relu's only reader: one item computing
    // the four, bitwise equal to the unfused run. Max (disjoint and overlapping windows,
    // padded), average; 16, 32 and 5 output channels; 7 images, 1, none.
    let pools = [
        (PoolKind::Max, 2, 2, Padding::Explicit(vec![(0, 0); 2])),
        (PoolKind::Max, 3, 2, Padding::Same),
        (PoolKind::Avg, 2, 2, Padding::Explicit(vec![(0, 0); 2])),
    ];
    for (k, (kind, win, stride, padding)) in pools.into_iter().enumerate() {
        let spec = pool_spec(kind, win, stride, padding);
        for (cout, n) in [(16, 7), (32, 1), (5, 7), (16, 0)] {
            let x = ph("x", &[None, Some(9), Some(11), Some(4)]);
            let w = ph("w", &[Some(3), Some(3), Some(4), Some(cout)]);
            let b = ph("b", &[Some(cout)]);
            let y = conv(&x, &w, &conv_spec(Padding::Same, 1, 1)).unwrap();
            let act = unary(UnaryOp::Relu, &add(&y, &b).unwrap()).unwrap();
            let p = pool(&act, &spec).unwrap();
            let out = mul(&p, &c(2.0)).unwrap();
            let vs = [
                data(&[n, 9, 11, 4], k as u32),
                data(&[3, 3, 4, cout], 2),
                data(&[cout], 3),
            ];
            let feeds = [x.clone(), w.clone(), b.clone()];
            per_image_stage(&feeds, &out, &act, &vs, &format!("{k} {cout} {n}"));
        }
    }
}

#[test]
fn a_global_max_of_a_convolution_epilogue_runs_on_each_image_after_it() {
    use crate::ops::conv::Padding;
    use crate::ops::ReduceOp;
    // conv -> bias -> relu -> max over the spatial axes (a global max pooling), the max
    // the relu's only reader: one item, bitwise equal to the unfused run. 1-D (stride 1
    // and 2) and 2-D convolutions, keepdims, a minimum; 7 images, 1, none.
    let one_d = |stride: usize| {
        std::sync::Arc::new(crate::ops::conv::ConvSpec {
            strides: vec![stride],
            dilation: vec![1],
            padding: Padding::Explicit(vec![(0, 0)]),
            groups: 1,
        })
    };
    // (spec, image dims, kernel dims, axes, keepdims, op)
    let cases = [
        (one_d(1), vec![20], vec![5], vec![1], false, ReduceOp::Max),
        (one_d(2), vec![21], vec![3], vec![1], true, ReduceOp::Min),
        (
            conv_spec(Padding::Same, 1, 1),
            vec![9, 11],
            vec![3, 3],
            vec![1, 2],
            false,
            ReduceOp::Max,
        ),
        (
            conv_spec(Padding::Same, 1, 1),
            vec![9, 11],
            vec![3, 3],
            vec![2],
            false,
            ReduceOp::Max,
        ),
    ];
    for (k, (spec, img, win, axes, keepdims, op)) in cases.into_iter().enumerate() {
        for (cout, n) in [(32, 7), (16, 1), (5, 7), (32, 0)] {
            let cin = 4;
            let mut xd: Vec<Option<usize>> = vec![None];
            xd.extend(img.iter().map(|&d| Some(d)));
            xd.push(Some(cin));
            let mut wd: Vec<Option<usize>> = win.iter().map(|&d| Some(d)).collect();
            wd.extend([Some(cin), Some(cout)]);
            let x = ph("x", &xd);
            let w = ph("w", &wd);
            let b = ph("b", &[Some(cout)]);
            let y = conv(&x, &w, &spec).unwrap();
            let act = unary(UnaryOp::Relu, &add(&y, &b).unwrap()).unwrap();
            let m = reduce(op, &act, &axes, keepdims).unwrap();
            let out = mul(&m, &c(2.0)).unwrap();
            let mut xs = vec![n];
            xs.extend(&img);
            xs.push(cin);
            let mut ws = win.clone();
            ws.extend([cin, cout]);
            let vs = [data(&xs, k as u32), data(&ws, 2), data(&[cout], 3)];
            let feeds = [x.clone(), w.clone(), b.clone()];
            per_image_stage(&feeds, &out, &act, &vs, &format!("{k} {cout} {n}"));
        }
    }
    // An empty time axis ('same' padding keeps it empty): the identity, one channel and
    // several, as the unfused reduction gives it.
    for cout in [1, 8] {
        let x = ph("x", &[None, Some(0), Some(4)]);
        let w = ph("w", &[Some(3), Some(4), Some(cout)]);
        let spec = std::sync::Arc::new(crate::ops::conv::ConvSpec {
            strides: vec![1],
            dilation: vec![1],
            padding: Padding::Same,
            groups: 1,
        });
        let act = unary(UnaryOp::Relu, &conv(&x, &w, &spec).unwrap()).unwrap();
        let out = reduce(ReduceOp::Max, &act, &[1], false).unwrap();
        same(
            &[x, w],
            &[out],
            &[data(&[3, 0, 4], 1), data(&[3, 4, cout], 2)],
        );
    }
    // A reduction over the batch axis, or a sum, is not taken per image.
    let x = ph("x", &[None, Some(9), Some(11), Some(4)]);
    let w = ph("w", &[Some(3), Some(3), Some(4), Some(16)]);
    let act = unary(
        UnaryOp::Relu,
        &conv(&x, &w, &conv_spec(Padding::Same, 1, 1)).unwrap(),
    )
    .unwrap();
    for (op, axes) in [(ReduceOp::Max, vec![0, 1]), (ReduceOp::Prod, vec![1, 2])] {
        let out = reduce(op, &act, &axes, false).unwrap();
        assert!(!stage_taken(
            &[x.clone(), w.clone()],
            std::slice::from_ref(&out)
        ));
        same(
            &[x.clone(), w.clone()],
            &[out],
            &[data(&[3, 9, 11, 4], 5), data(&[3, 3, 4, 16], 6)],
        );
    }
}

#[test]
fn a_pooling_and_its_gradient_run_with_the_group_that_reads_them() {
    use crate::ops::conv::Padding;
    use crate::ops::pool::PoolKind;
    // Max (disjoint windows, overlapping windows, padded), average; a dropout-like mask after
    // the pooling and an activation's gradient after the pooling gradient.
    let specs = [
        (PoolKind::Max, 2, 2, Padding::Explicit(vec![(0, 0); 2])),
        (PoolKind::Max, 3, 2, Padding::Explicit(vec![(0, 0); 2])),
        (PoolKind::Max, 3, 1, Padding::Same),
        (PoolKind::Avg, 2, 2, Padding::Same),
    ];
    for (k, (kind, win, stride, padding)) in specs.into_iter().enumerate() {
        let spec = pool_spec(kind, win, stride, padding);
        let x = ph("x", &[None, Some(9), Some(8), Some(5)]);
        let m = ph("m", &[None, None, None, Some(5)]);
        let p = pool(&x, &spec).unwrap();
        let dropped = mul(&mul(&p, &m).unwrap(), &c(1.25)).unwrap();
        let gy = ph("gy", &[None, None, None, Some(5)]);
        let dx = pool_grad(&x, &gy, &spec).unwrap();
        let relu_grad = select(
            &binary(BinaryOp::Greater, &x, &c(0.0)).unwrap(),
            &dx,
            &c(0.0),
        )
        .unwrap();
        let geo = spec.geom(&[6, 9, 8, 5]).unwrap();
        let ys = geo.y_shape.clone();
        let vs = [data(&[6, 9, 8, 5], k as u32), data(&ys, 7), data(&ys, 9)];
        same(
            &[x.clone(), m.clone(), gy.clone()],
            &[dropped.clone(), relu_grad.clone()],
            &vs,
        );
        // The pooled value also read elsewhere later (its shape only), and an empty batch.
        let back = sum_to(&dropped, &shape_of(&p).unwrap()).unwrap();
        same(
            &[x.clone(), m.clone(), gy.clone()],
            &[back, relu_grad.clone()],
            &vs,
        );
        let geo0 = spec.geom(&[0, 9, 8, 5]).unwrap();
        let y0 = geo0.y_shape.clone();
        same(
            &[x, m, gy],
            &[dropped, relu_grad],
            &[data(&[0, 9, 8, 5], 1), data(&y0, 2), data(&y0, 3)],
        );
    }
}

#[test]
fn gradients_are_unchanged_by_fusion() {
    let x = ph("x", &[None, Some(8)]);
    let w = ph("w", &[Some(8), Some(4)]);
    let h = unary(UnaryOp::Relu, &matmul(&x, &w, false, false).unwrap()).unwrap();
    let y = unary(
        UnaryOp::Tanh,
        &mul(&h, &unary(UnaryOp::Sigmoid, &h).unwrap()).unwrap(),
    )
    .unwrap();
    let loss = reduce(crate::ops::ReduceOp::Sum, &y, &[0, 1], false).unwrap();
    let gs: Vec<Tensor> = crate::autodiff::gradients(&loss, &[x.clone(), w.clone()], None)
        .unwrap()
        .into_iter()
        .map(|g| g.unwrap())
        .collect();
    let (fused, unfused) = same(&[x, w], &gs, &[data(&[16, 8], 3), data(&[8, 4], 4)]);
    assert!(fused < unfused, "{fused} vs {unfused}");
}

#[test]
fn programs_are_reused_across_calls_and_rebuilt_for_new_layouts() {
    // One compiled function called with changing scalars, shapes and broadcast patterns:
    // each call must match an unfused run of the same inputs (a cached program keeps only
    // what the input layout fixes).
    let x = ph("x", &[None, None]);
    let b = ph("b", &[None]);
    let s = ph("s", &[]);
    let k = add(&mul(&s, &c(2.0)).unwrap(), &c(1.0)).unwrap();
    let y = unary(UnaryOp::Sigmoid, &add(&mul(&x, &k).unwrap(), &b).unwrap()).unwrap();
    let z = binary(BinaryOp::Maximum, &sub(&y, &s).unwrap(), &b).unwrap();
    let (feeds, outs) = (vec![x, b, s], vec![y, z]);
    let fused = Function::new(feeds.clone(), outs.clone(), vec![]).unwrap();
    fused.plan.schedule(&Target::cpu(true));
    let unfused = Function::new(feeds, outs, vec![]).unwrap();
    unfused.plan.schedule(&Target::cpu(false));
    let cases = [
        (vec![4, 6], vec![6], 0.5f32),
        (vec![4, 6], vec![6], -3.0),
        (vec![4, 6], vec![1], 0.5),
        (vec![3, 5], vec![5], 0.25),
        (vec![4, 6], vec![6], 7.0),
        (vec![1, 6], vec![6], 1.5),
        (vec![0, 6], vec![6], 1.5),
    ];
    let bits = |v: &Value| -> Vec<u64> {
        v.to_f64_vec()
            .iter()
            .map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
            .collect()
    };
    for (r, (xs, bs, sv)) in cases.iter().enumerate() {
        let vs = vec![
            data(xs, r as u32),
            data(bs, 10 + r as u32),
            Value::scalar_f64(DType::F32, *sv as f64),
        ];
        let got = crate::runtime::cpu::run(&fused.plan, &fused.cpu, vs.clone(), None).unwrap();
        let want = crate::runtime::cpu::run(&unfused.plan, &unfused.cpu, vs, None).unwrap();
        for (a, w) in got.iter().zip(&want) {
            assert_eq!(a.shape(), w.shape(), "case {r}");
            assert_eq!(bits(a), bits(w), "case {r}");
        }
    }
}

/// `same`, then the update rules the compiler recognised (`Item::Update`) and the fused
/// run lowered onto its programs (the two must agree).
fn rules(feeds: &[Tensor], outs: &[Tensor], vs: &[Value]) -> Vec<Rule> {
    let (recognised, lowered) = rules_recognised_and_run(feeds, outs, vs);
    assert_eq!(recognised, lowered);
    lowered
}

/// `same`, then the rules of the schedule's `Item::Update`s and those the run lowered.
fn rules_recognised_and_run(
    feeds: &[Tensor],
    outs: &[Tensor],
    vs: &[Value],
) -> (Vec<Rule>, Vec<Rule>) {
    use crate::compile::fuse::Item;
    use crate::runtime::cpu::fused::rules_of;
    same(feeds, outs, vs);
    let f = Function::new(feeds.to_vec(), outs.to_vec(), vec![]).unwrap();
    let items = &f.plan.schedule(&Target::cpu(true)).items;
    let recognised: Vec<Rule> = items
        .iter()
        .filter_map(|it| Some(it.update()?.rule))
        .collect();
    crate::runtime::cpu::run(&f.plan, &f.cpu, vs.to_vec(), None).unwrap();
    let lowered = items
        .iter()
        .zip(f.cpu.programs(&f.plan))
        .flat_map(|(it, programs)| match it {
            Item::Update(_) | Item::Group(_) => rules_of(programs),
            Item::Node(_) | Item::MatAcc { .. } => vec![],
        })
        .collect();
    (recognised, lowered)
}

/// `sqrt` as `K.sqrt` builds it: clipped at 0 first.
fn k_sqrt(x: &Tensor) -> Tensor {
    unary(
        UnaryOp::Sqrt,
        &binary(BinaryOp::Maximum, x, &c(0.0)).unwrap(),
    )
    .unwrap()
}

#[test]
fn optimizer_updates_run_as_rules_bitwise_equal() {
    // Odd sizes (a tail after the 16-lane blocks), one large enough to run in parallel;
    // special values (NaN, infinities, negatives under the clipped sqrt) in every input.
    for shape in [[3usize, 5], [37, 29], [300, 301]] {
        let dims: Vec<Option<usize>> = shape.iter().map(|&d| Some(d)).collect();
        let (p, g, a, m) = (
            ph("p", &dims),
            ph("g", &dims),
            ph("a", &dims),
            ph("m", &dims),
        );
        let vs = |k: usize| -> Vec<Value> { (0..k as u32).map(|s| data(&shape, s + 1)).collect() };
        // RMSprop as Keras 2.3.1 writes it, then with every product and sum the other way round.
        let a2 = add(
            &mul(&c(0.9), &a).unwrap(),
            &mul(&c(0.1), &unary(UnaryOp::Square, &g).unwrap()).unwrap(),
        )
        .unwrap();
        let p2 = sub(
            &p,
            &div(
                &mul(&c(1e-3), &g).unwrap(),
                &add(&k_sqrt(&a2), &c(1e-7)).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            rules(
                &[p.clone(), g.clone(), a.clone()],
                &[a2.clone(), p2.clone()],
                &vs(3)
            ),
            [Rule::RmsProp]
        );
        let a3 = add(
            &mul(&unary(UnaryOp::Square, &g).unwrap(), &c(0.1)).unwrap(),
            &mul(&a, &c(0.9)).unwrap(),
        )
        .unwrap();
        let p3 = sub(
            &p,
            &div(
                &mul(&g, &c(1e-3)).unwrap(),
                &add(&c(1e-7), &k_sqrt(&a3)).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            rules(
                &[p.clone(), g.clone(), a.clone()],
                &[p3.clone(), a3.clone()],
                &vs(3)
            ),
            [Rule::RmsProp]
        );
        // Adam (m, v = a).
        let m2 = add(&mul(&c(0.9), &m).unwrap(), &mul(&c(0.1), &g).unwrap()).unwrap();
        let v2 = add(
            &mul(&c(0.999), &a).unwrap(),
            &mul(&c(1e-3), &unary(UnaryOp::Square, &g).unwrap()).unwrap(),
        )
        .unwrap();
        let p4 = sub(
            &p,
            &div(
                &mul(&c(3e-4), &m2).unwrap(),
                &add(&k_sqrt(&v2), &c(1e-7)).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        let feeds = [p.clone(), g.clone(), m.clone(), a.clone()];
        assert_eq!(
            rules(&feeds, &[m2.clone(), v2.clone(), p4.clone()], &vs(4)),
            [Rule::Adam]
        );
        assert_eq!(
            rules(&feeds, &[p4.clone(), v2.clone(), m2.clone()], &vs(4)),
            [Rule::Adam]
        );
        // Near misses run instruction by instruction: `+` for `-`, another gradient in the
        // step, the clip the other way round (NaN handling differs), an extra output.
        let p5 = add(
            &p,
            &div(
                &mul(&c(1e-3), &g).unwrap(),
                &add(&k_sqrt(&a2), &c(1e-7)).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            rules(
                &[p.clone(), g.clone(), a.clone()],
                &[a2.clone(), p5],
                &vs(3)
            ),
            []
        );
        let p6 = sub(
            &p,
            &div(
                &mul(&c(1e-3), &m).unwrap(),
                &add(&k_sqrt(&a2), &c(1e-7)).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            rules(
                &[p.clone(), g.clone(), a.clone(), m.clone()],
                &[a2.clone(), p6],
                &vs(4)
            ),
            []
        );
        let root = unary(
            UnaryOp::Sqrt,
            &binary(BinaryOp::Maximum, &c(0.0), &a2).unwrap(),
        )
        .unwrap();
        let p7 = sub(
            &p,
            &div(&mul(&c(1e-3), &g).unwrap(), &add(&root, &c(1e-7)).unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(
            rules(
                &[p.clone(), g.clone(), a.clone()],
                &[a2.clone(), p7],
                &vs(3)
            ),
            []
        );
        let sq = unary(UnaryOp::Square, &g).unwrap();
        let a8 = add(&mul(&c(0.9), &a).unwrap(), &mul(&c(0.1), &sq).unwrap()).unwrap();
        let p8 = sub(
            &p,
            &div(
                &mul(&c(1e-3), &g).unwrap(),
                &add(&k_sqrt(&a8), &c(1e-7)).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            rules(&[p.clone(), g.clone(), a.clone()], &[a8, p8, sq], &vs(3)),
            []
        );
    }
}

/// An update rule is recognised from the static shapes; a run whose inputs the rule's
/// kernel cannot read in place (a parameter broadcast over the rows) runs the group's
/// ordinary program instead, with the unfused results.
#[test]
fn update_rules_fall_back_to_the_program_when_the_run_does_not_fit() {
    let (p, g, a) = (
        ph("p", &[Some(1), Some(29)]),
        ph("g", &[Some(37), Some(29)]),
        ph("a", &[Some(37), Some(29)]),
    );
    let a2 = add(
        &mul(&c(0.9), &a).unwrap(),
        &mul(&c(0.1), &unary(UnaryOp::Square, &g).unwrap()).unwrap(),
    )
    .unwrap();
    let p2 = sub(
        &p,
        &div(
            &mul(&c(1e-3), &g).unwrap(),
            &add(&k_sqrt(&a2), &c(1e-7)).unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    let vs = vec![data(&[1, 29], 1), data(&[37, 29], 2), data(&[37, 29], 3)];
    let (recognised, lowered) = rules_recognised_and_run(&[p, g, a], &[a2, p2], &vs);
    assert_eq!(recognised, [Rule::RmsProp]);
    assert_eq!(lowered, []);
}

/// `same`, then how many of the run's groups ran as per-channel affine chains.
fn affine_groups(feeds: &[Tensor], outs: &[Tensor], vs: &[Value]) -> usize {
    use crate::runtime::cpu::fused::affine_chains;
    same(feeds, outs, vs);
    let f = Function::new(feeds.to_vec(), outs.to_vec(), vec![]).unwrap();
    crate::runtime::cpu::run(&f.plan, &f.cpu, vs.to_vec(), None).unwrap();
    f.cpu.programs(&f.plan).iter().map(affine_chains).sum()
}

/// Asserts that each output set of `sets` runs as one of batch norm's loops
/// (`affine_groups`), bitwise as the ordinary program.
fn one_loop_each(feeds: &[Tensor], vs: &[Value], shape: [usize; 3], sets: &[Vec<Tensor>]) {
    for outs in sets {
        assert_eq!(affine_groups(feeds, outs, vs), 1, "{shape:?}");
    }
}

/// A relu gradient as batch norm's backward pass forms it: `gm = pos ? g : 0` and its
/// product with the centred input `cx`.
fn masked_grad(pos: &Tensor, g: &Tensor, cx: &Tensor) -> (Tensor, Tensor) {
    let gm = select(pos, g, &c(0.0)).unwrap();
    let prod = mul(&gm, cx).unwrap();
    (gm, prod)
}

/// Batch norm's centred input `x - a` and output `(x - a) * s + b`.
fn bn_output(x: &Tensor, a: &Tensor, s: &Tensor, b: &Tensor) -> (Tensor, Tensor) {
    let cx = sub(x, a).unwrap();
    let y = add(&mul(&cx, s).unwrap(), b).unwrap();
    (cx, y)
}

/// Asserts that a relu gradient `(pos, grad, cx)` (`masked_grad`) runs as one of batch
/// norm's loops: its mask and product written, and the product's sums alone.
fn masked_grad_one_loop(
    feeds: &[Tensor],
    vs: &[Value],
    shape: [usize; 3],
    (pos, grad, cx): (&Tensor, &Tensor, &Tensor),
) {
    let (gm, prod) = masked_grad(pos, grad, cx);
    one_loop_each(
        feeds,
        vs,
        shape,
        &[vec![gm, prod.clone()], vec![channel_sums(&prod)]],
    );
}

/// Batch-norm activations `[batch, rows, channels]`: below one chunk, periods that do not
/// divide a chunk over many chunks, and enough elements for the parallel path (tasks
/// starting mid-period).
const BN_SHAPES: [[usize; 3]; 3] = [[2, 3, 7], [40, 50, 7], [8, 4096, 24]];

/// Placeholders `[x, y, a, s, b]` (two activations of `shape` with an unknown batch, three
/// per-channel values) and values for them, special values in each.
fn bn_feeds(shape: [usize; 3]) -> ([Tensor; 5], [Value; 5]) {
    let c_dims = [Some(shape[2])];
    let dims = [None, Some(shape[1]), Some(shape[2])];
    let feeds = [
        ph("x", &dims),
        ph("y", &dims),
        ph("a", &c_dims),
        ph("s", &c_dims),
        ph("b", &c_dims),
    ];
    let vs = [
        data(&shape, 1),
        data(&shape, 2),
        data(&shape[2..], 3),
        data(&shape[2..], 4),
        data(&shape[2..], 5),
    ];
    (feeds, vs)
}

/// `feeds` and `vs` (`bn_feeds`) with placeholders `names` of shape `shape` appended (the
/// first dim unknown where `shape` is an activation's `[batch, rows, channels]`), their
/// values seeded from `seed` on; and the new placeholders.
fn more_feeds(
    (feeds, vs): ([Tensor; 5], [Value; 5]),
    names: &[&str],
    shape: &[usize],
    seed: u32,
) -> (Vec<Tensor>, Vec<Value>, Vec<Tensor>) {
    let mut dims: Vec<Option<usize>> = shape.iter().map(|&d| Some(d)).collect();
    if shape.len() == 3 {
        dims[0] = None;
    }
    let new: Vec<Tensor> = names.iter().map(|n| ph(n, &dims)).collect();
    let (mut feeds, mut vs) = (feeds.to_vec(), vs.to_vec());
    feeds.extend(new.iter().cloned());
    vs.extend((0..names.len() as u32).map(|k| data(shape, seed + k)));
    (feeds, vs, new)
}

/// The per-channel sums of a `[batch, rows, channels]` member.
fn channel_sums(t: &Tensor) -> Tensor {
    reduce(crate::ops::ReduceOp::Sum, t, &[0, 1], false).unwrap()
}

#[test]
fn batch_norm_outputs_run_as_affine_chains_bitwise_equal() {
    // `act((x - a) * s + b [+ r])` per channel, act nothing, relu or relu6.
    for shape in BN_SHAPES {
        let (feeds, vs) = bn_feeds(shape);
        let [x, r, a, s, b] = feeds.clone();
        let y = add(&mul(&sub(&x, &a).unwrap(), &s).unwrap(), &b).unwrap();
        let relu = |t: &Tensor| unary(UnaryOp::Relu, t).unwrap();
        let relu6 = |t: &Tensor| binary(BinaryOp::Minimum, &relu(t), &c(6.0)).unwrap();
        let with_r = add(&y, &r).unwrap();
        for out in [
            y.clone(),
            relu(&y),
            relu6(&y),
            with_r.clone(),
            relu(&with_r),
            relu6(&with_r),
        ] {
            assert_eq!(affine_groups(&feeds, &[out], &vs), 1, "{shape:?}");
        }
        // Operands the other way round, or a different op, keep the ordinary program.
        let swapped = add(&b, &mul(&s, &sub(&x, &a).unwrap()).unwrap()).unwrap();
        let other = add(&mul(&add(&x, &a).unwrap(), &s).unwrap(), &b).unwrap();
        for out in [swapped, relu(&other)] {
            assert_eq!(affine_groups(&feeds, &[out], &vs), 0, "{shape:?}");
        }
    }
}

#[test]
fn relu_gradients_after_batch_norm_run_as_one_loop_bitwise_equal() {
    // gm = y > 0 ? (relu(y) <= 6 ? g : 0) : 0 (relu6; relu: y > 0 ? g : 0) and gm * (x - a),
    // y = (x - a) * s + b: as outputs, and with their per-channel sums folded (the second
    // then only in tiles).
    for shape in BN_SHAPES {
        let (feeds, vs) = bn_feeds(shape);
        let [x, g, a, s, b] = feeds.clone();
        let (cx, y) = bn_output(&x, &a, &s, &b);
        let ry = unary(UnaryOp::Relu, &y).unwrap();
        let pos = binary(BinaryOp::Greater, &y, &c(0.0)).unwrap();
        let low = binary(BinaryOp::LessEqual, &ry, &c(6.0)).unwrap();
        let kept = select(&low, &g, &c(0.0)).unwrap();
        let (gm, prod) = masked_grad(&pos, &kept, &cx);
        one_loop_each(
            &feeds,
            &vs,
            shape,
            &[
                vec![gm.clone(), prod.clone()],
                vec![gm.clone(), channel_sums(&prod), channel_sums(&gm)],
            ],
        );
        // A relu's gradient: its mask and product written, both summed, the product's sums
        // alone.
        let (gm, prod) = masked_grad(&pos, &g, &cx);
        one_loop_each(
            &feeds,
            &vs,
            shape,
            &[
                vec![gm.clone(), prod.clone()],
                vec![channel_sums(&prod), channel_sums(&gm)],
                vec![channel_sums(&prod)],
            ],
        );
    }
}

#[test]
fn relu_gradients_of_residual_sums_run_as_one_loop_bitwise_equal() {
    // A residual block's relu gradient: of `y + r`, with the gradient `g + g2` of an
    // output read twice, or both.
    for shape in BN_SHAPES {
        let base = bn_feeds(shape);
        let [x, g, a, s, b] = base.0.clone();
        let (feeds, vs, new) = more_feeds(base, &["r", "g2"], &shape, 8);
        let [r, g2] = [&new[0], &new[1]];
        let (cx, y) = bn_output(&x, &a, &s, &b);
        let with_r = add(&y, r).unwrap();
        let g_sum = add(&g, g2).unwrap();
        for (pre, grad) in [(&with_r, &g), (&y, &g_sum), (&with_r, &g_sum)] {
            let pos = binary(BinaryOp::Greater, pre, &c(0.0)).unwrap();
            masked_grad_one_loop(&feeds, &vs, shape, (&pos, grad, &cx));
        }
    }
}

#[test]
fn batch_norm_variance_terms_run_as_one_loop_bitwise_equal() {
    // `(x - a)²` per channel, its mean over the rows folded; `x - a` written too, or not.
    for shape in BN_SHAPES {
        let (feeds, vs) = bn_feeds(shape);
        let [x, _, a, _, _] = feeds.clone();
        let dev = sub(&x, &a).unwrap();
        let sq = unary(UnaryOp::Square, &dev).unwrap();
        let mean = reduce(crate::ops::ReduceOp::Mean, &sq, &[0, 1], false).unwrap();
        one_loop_each(
            &feeds,
            &vs,
            shape,
            &[vec![sq.clone()], vec![dev, sq], vec![mean]],
        );
    }
}

#[test]
fn two_batch_norm_outputs_added_before_a_relu_run_as_one_loop_bitwise_equal() {
    // `relu(y1 + y2)`, `yi = (xi - ai) * si + bi`: the sum written too, or the relu alone.
    for shape in BN_SHAPES {
        let base = bn_feeds(shape);
        let [x, x2, a, s, b] = base.0.clone();
        let (feeds, vs, new) = more_feeds(base, &["a2", "s2", "b2"], &shape[2..], 6);
        let [a2, s2, b2] = [&new[0], &new[1], &new[2]];
        let y1 = add(&mul(&sub(&x, &a).unwrap(), &s).unwrap(), &b).unwrap();
        let y2 = add(&mul(&sub(&x2, a2).unwrap(), s2).unwrap(), b2).unwrap();
        let sum = add(&y1, &y2).unwrap();
        let relu = unary(UnaryOp::Relu, &sum).unwrap();
        one_loop_each(&feeds, &vs, shape, &[vec![sum, relu.clone()], vec![relu]]);
    }
}

#[test]
fn relu_gradients_of_a_stored_relu_input_run_as_one_loop_bitwise_equal() {
    // The relu's input `y` stored by the forward (two batch norms added up): the mask
    // `y > 0` picks `g` or `g + g2`.
    for shape in BN_SHAPES {
        let base = bn_feeds(shape);
        let [x, y, a, _, _] = base.0.clone();
        let (feeds, vs, new) = more_feeds(base, &["g", "g2"], &shape, 8);
        let [g, g2] = [&new[0], &new[1]];
        let cx = sub(&x, &a).unwrap();
        let pos = binary(BinaryOp::Greater, &y, &c(0.0)).unwrap();
        for grad in [g.clone(), add(g, g2).unwrap()] {
            masked_grad_one_loop(&feeds, &vs, shape, (&pos, &grad, &cx));
        }
    }
}

#[test]
fn batch_norm_input_gradients_run_as_one_loop_bitwise_equal() {
    // `p * ((x - a) * k) + g * q + r`: batch norm's input gradient with the mean's and
    // variance's terms per channel.
    for shape in BN_SHAPES {
        let base = bn_feeds(shape);
        let [x, g, a, p, q] = base.0.clone();
        let (feeds, vs, new) = more_feeds(base, &["r"], &shape[2..], 6);
        let r = &new[0];
        let dx = add(
            &add(
                &mul(&p, &mul(&sub(&x, &a).unwrap(), &c(0.125)).unwrap()).unwrap(),
                &mul(&g, &q).unwrap(),
            )
            .unwrap(),
            r,
        )
        .unwrap();
        assert_eq!(affine_groups(&feeds, &[dx], &vs), 1, "{shape:?}");
        // The products' operands the other way round keep the ordinary program.
        let swapped = add(
            &add(
                &mul(&mul(&sub(&x, &a).unwrap(), &c(0.125)).unwrap(), &p).unwrap(),
                &mul(&g, &q).unwrap(),
            )
            .unwrap(),
            r,
        )
        .unwrap();
        assert_eq!(affine_groups(&feeds, &[swapped], &vs), 0, "{shape:?}");
    }
}

/// The kernels read every per-channel value at one index within one period: where a
/// group's tiles repeat with different periods (a `[channels]` value next to a
/// `[rows, channels]` one) the ordinary program runs, with the unfused results.
#[test]
fn batch_norm_kernels_with_tiles_of_different_periods_keep_the_program() {
    let shape = [6, 5, 7];
    let base = bn_feeds(shape);
    let [x, g, a, _, b] = base.0.clone();
    let (feeds, vs, new) = more_feeds(base, &["s"], &shape[1..], 7);
    let s = &new[0];
    let y = add(&mul(&sub(&x, &a).unwrap(), s).unwrap(), &b).unwrap();
    let relu = unary(UnaryOp::Relu, &y).unwrap();
    let pos = binary(BinaryOp::Greater, &y, &c(0.0)).unwrap();
    let (gm, prod) = masked_grad(&pos, &g, &sub(&x, &a).unwrap());
    let dx = add(
        &add(
            &mul(s, &mul(&sub(&x, &a).unwrap(), &c(0.125)).unwrap()).unwrap(),
            &mul(&g, &b).unwrap(),
        )
        .unwrap(),
        &a,
    )
    .unwrap();
    for outs in [vec![relu], vec![gm, prod], vec![dx]] {
        assert_eq!(affine_groups(&feeds, &outs, &vs), 0);
    }
}

#[test]
fn relu_gradients_masked_by_the_relu_output_run_as_one_loop_bitwise_equal() {
    // As `autodiff` forms a relu's gradient, the mask compares the relu's output with 0:
    // gm = relu(y) > 0 ? g : 0 (relu6: then relu(y) <= 6 too), of y = (x - a) * s + b or
    // of y + r, of g or g + g2, with gm * (x - a): one loop.
    for shape in BN_SHAPES {
        let base = bn_feeds(shape);
        let [x, r, a, s, b] = base.0.clone();
        let (feeds, vs, new) = more_feeds(base, &["g", "g2"], &shape, 8);
        let [g, g2] = [&new[0], &new[1]];
        let (cx, y) = bn_output(&x, &a, &s, &b);
        let relu = |t: &Tensor| unary(UnaryOp::Relu, t).unwrap();
        let pos = |t: &Tensor| binary(BinaryOp::Greater, &relu(t), &c(0.0)).unwrap();
        for (pre, grad) in [
            (y.clone(), g.clone()),
            (add(&y, &r).unwrap(), g.clone()),
            (y.clone(), add(g, g2).unwrap()),
            (add(&y, &r).unwrap(), add(g, g2).unwrap()),
        ] {
            masked_grad_one_loop(&feeds, &vs, shape, (&pos(&pre), &grad, &cx));
        }
        let low = binary(BinaryOp::LessEqual, &relu(&y), &c(6.0)).unwrap();
        let kept = select(&low, g, &c(0.0)).unwrap();
        masked_grad_one_loop(&feeds, &vs, shape, (&pos(&y), &kept, &cx));
    }
}

#[test]
fn relu6_with_the_cap_first_runs_as_one_loop_bitwise_equal() {
    // `minimum(6, relu(y))`, as `K.relu(x, max_value=6)` builds relu6 (its gradient 0 at
    // 6, as TF's), and that gradient as autodiff forms it: gm = relu(y) > 0 ?
    // (6 <= relu(y) ? 0 : g) : 0, with gm * (x - a): one loop each.
    for shape in BN_SHAPES {
        let (feeds, vs) = bn_feeds(shape);
        let [x, g, a, s, b] = feeds.clone();
        let (cx, y) = bn_output(&x, &a, &s, &b);
        let ry = unary(UnaryOp::Relu, &y).unwrap();
        let out = binary(BinaryOp::Minimum, &c(6.0), &ry).unwrap();
        assert_eq!(affine_groups(&feeds, &[out], &vs), 1, "{shape:?}");
        let pos = binary(BinaryOp::Greater, &ry, &c(0.0)).unwrap();
        let high = binary(BinaryOp::LessEqual, &c(6.0), &ry).unwrap();
        let kept = select(&high, &c(0.0), &g).unwrap();
        masked_grad_one_loop(&feeds, &vs, shape, (&pos, &kept, &cx));
    }
}
