//! The primitive table. Every primitive is one variant of `Op`; its shape/dtype rule, VJP
//! rule and CPU kernel live side by side in the family file named on its line. Matches over
//! `Op` have no catch-all arm, so adding a variant makes the compiler list every place that
//! must handle it. Every other property of a primitive is stated here once, one exhaustive
//! match each: `purity` (may it be merged and folded), `shape_operands` (inputs read as
//! target shapes), `class` (how devices run it), `cost` (fusion grain) and `gpu_supports`
//! (the dtypes of its GPU lowering). Everything else in the `K` API is a composite of
//! these, in Python.

pub mod control;
pub mod conv;
pub mod ctc;
pub mod elementwise;
pub mod graph;
pub mod host;
pub mod loop_opt;
pub mod matmul;
pub mod movement;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod small_gemm;
pub mod source;
pub mod vmath;

use crate::base::dtype::DType;
use crate::base::error::Result;
use crate::base::shape::Shape;
use crate::base::value::Value;
use graph::Tensor;
use std::sync::Arc;

pub use elementwise::{BinaryOp, UnaryOp};
pub use reduce::{ArgOp, ReduceOp, ScanOp};
pub use source::{PlaceholderInfo, VarCell};

/// A kernel that writes a whole f32 result and calls `after(i)` once image `i` of it is
/// written, on the thread that wrote it (`conv::cpu::forward_f32_then`, `pool::f32_then`),
/// so a fused epilogue can run on each image while it is in cache.
pub type ImageKernel<'a> = Box<dyn Fn(&mut [f32], &(dyn Fn(usize) + Sync)) + Sync + 'a>;

/// A per-image f32 stage that reads one image of a fused group's output while it is in
/// cache (`compile::fuse::Group::pooled`): a pooling (`pool::ImagePool`) or a maximum or
/// minimum over axes other than the batch axis (`reduce::ImageReduce`). Its result per
/// image equals that image of the whole op's result.
pub trait ImageStage: Sync {
    /// The whole result's shape.
    fn shape(&self) -> &[usize];
    /// Images of the input (and the result).
    fn images(&self) -> usize;
    /// Writes the stage's result for input image `x` into `y`.
    fn run(&self, x: &[f32], y: &mut [f32]);
}

/// One strided range along one axis, as NumPy's `start:stop:step` after normalisation
/// against the runtime dim (see `movement::resolve_slice`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SliceAxis {
    pub start: Option<i64>,
    pub stop: Option<i64>,
    pub step: i64,
}

#[derive(Clone, Debug)]
pub enum Op {
    //                                        inputs                 family
    Placeholder(Arc<PlaceholderInfo>), // ()                     source
    Constant(Arc<Value>),              // ()                     source
    Variable(Arc<VarCell>),            // ()                     source
    Unary(UnaryOp),                    // (x)                    elementwise
    Binary(BinaryOp),                  // (a, b) broadcasting    elementwise
    Select,                            // (cond, a, b)           elementwise
    Cast(DType),                       // (x)                    elementwise
    StopGradient,                      // (x) identity, no VJP   elementwise
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdims: bool,
    }, // (x) reduce
    Arg {
        op: ArgOp,
        axis: usize,
    }, // (x) -> int64           reduce
    Scan {
        op: ScanOp,
        axis: usize,
        exclusive: bool,
        reverse: bool,
    }, // (x) reduce
    Reshape,                           // (x, shape: int 1-D)    movement
    BroadcastTo,                       // (x, shape: int 1-D)    movement
    SumTo,                             // (x, shape: int 1-D)    movement
    ShapeOf,                           // (x) -> int32 1-D       movement
    ExpandDims(Vec<usize>),            // (x) axes of the result movement
    Squeeze(Vec<usize>),               // (x)                    movement
    Transpose(Vec<usize>),             // (x)                    movement
    Slice(Vec<SliceAxis>),             // (x)                    movement
    SliceGrad(Vec<SliceAxis>),         // (g, like)              movement
    Concat(usize),                     // (x0, x1, ...)          movement
    ConcatGrad {
        axis: usize,
        index: usize,
    }, // (g, x0, x1, ...)    movement
    Pad {
        pads: Vec<(usize, usize)>,
        value: f64,
    }, // (x)            movement
    Reverse(Vec<usize>),               // (x)                    movement
    Gather(usize),                     // (params, indices)      movement
    ScatterAdd(usize),                 // (updates, indices, like) movement
    MatMul {
        ta: bool,
        tb: bool,
    }, // (a, b) batched         matmul
    Random(Arc<random::RandomState>),  // (shape: int 1-D)       random
    Conv(Arc<conv::ConvSpec>),         // (x, w)                 conv
    ConvInputGrad(Arc<conv::ConvSpec>), // (gy, w, x_shape)       conv
    ConvKernelGrad(Arc<conv::ConvSpec>), // (x, gy, w_shape)       conv
    Pool(Arc<pool::PoolSpec>),         // (x)                    pool
    PoolGrad(Arc<pool::PoolSpec>),     // (x, gy)                pool
    PoolSelect(Arc<pool::PoolSpec>),   // (x, h)                 pool
    Loop(Arc<control::LoopBody>),      // (seqs.., states.., captured..) control
    TupleGet(usize),                   // (multi-result node)    control
    HostCall(Arc<host::HostCall>),     // (inputs..) callback    host
    Ctc(ctc::CtcOp),                   // (logits, labels, in_len, lab_len) ctc
    CtcDecode(ctc::Decode),            // (log-probs, in_len) multi-result ctc
}

impl Op {
    /// The name used in error messages and plan dumps.
    pub fn name(&self) -> String {
        match self {
            Op::Placeholder(p) => format!("placeholder '{}'", p.name),
            Op::Constant(_) => "constant".into(),
            Op::Variable(v) => format!("variable '{}'", v.name),
            Op::Unary(u) => u.name().into(),
            Op::Binary(b) => b.name().into(),
            Op::Select => "select".into(),
            Op::Cast(d) => format!("cast to {d}"),
            Op::StopGradient => "stop_gradient".into(),
            Op::Reduce { op, .. } => op.name().into(),
            Op::Arg { op, .. } => op.name().into(),
            Op::Scan { op, .. } => op.name().into(),
            Op::Reshape => "reshape".into(),
            Op::BroadcastTo => "broadcast_to".into(),
            Op::SumTo => "sum_to".into(),
            Op::ShapeOf => "shape".into(),
            Op::ExpandDims(_) => "expand_dims".into(),
            Op::Squeeze(_) => "squeeze".into(),
            Op::ConcatGrad { .. } => "concatenate_grad".into(),
            Op::Transpose(_) => "transpose".into(),
            Op::Slice(_) => "slice".into(),
            Op::SliceGrad(_) => "slice_grad".into(),
            Op::Concat(_) => "concatenate".into(),
            Op::Pad { .. } => "pad".into(),
            Op::Reverse(_) => "reverse".into(),
            Op::Gather(_) => "gather".into(),
            Op::ScatterAdd(_) => "scatter_add".into(),
            Op::MatMul { .. } => "matmul".into(),
            Op::Random(r) => r.dist.name().into(),
            Op::Conv(_) => "conv".into(),
            Op::ConvInputGrad(_) => "conv_transpose".into(),
            Op::ConvKernelGrad(_) => "conv_kernel_grad".into(),
            Op::Pool(p) => format!("{:?}_pool", p.kind).to_lowercase(),
            Op::PoolGrad(p) => format!("{:?}_pool_grad", p.kind).to_lowercase(),
            Op::PoolSelect(p) => format!("{:?}_pool_select", p.kind).to_lowercase(),
            Op::Loop(_) => "loop".into(),
            Op::TupleGet(k) => format!("result {k}"),
            Op::HostCall(h) => format!("py_function '{}'", h.f.name()),
            Op::Ctc(_) => "ctc_loss".into(),
            Op::CtcDecode(_) => "ctc_decode".into(),
        }
    }

    /// Shape and dtype of the node this op makes from `inputs`; rejects bad arguments.
    pub fn infer(&self, inputs: &[Tensor]) -> Result<(Shape, DType)> {
        match self {
            Op::Placeholder(_) | Op::Constant(_) | Op::Variable(_) => source::infer(self),
            Op::Unary(u) => elementwise::infer_unary(*u, &inputs[0]),
            Op::Binary(b) => elementwise::infer_binary(*b, &inputs[0], &inputs[1]),
            Op::Select => elementwise::infer_select(inputs),
            Op::Cast(d) => Ok((inputs[0].shape().clone(), *d)),
            Op::StopGradient => Ok((inputs[0].shape().clone(), inputs[0].dtype())),
            Op::Reduce { op, axes, keepdims } => {
                reduce::infer_reduce(*op, axes, *keepdims, &inputs[0])
            }
            Op::Arg { axis, .. } => reduce::infer_arg(*axis, &inputs[0]),
            Op::Scan { op, axis, .. } => reduce::infer_scan(*op, *axis, &inputs[0]),
            Op::Reshape => movement::infer_reshape(&inputs[0], &inputs[1]),
            Op::BroadcastTo => movement::infer_broadcast_to(&inputs[0], &inputs[1]),
            Op::SumTo => movement::infer_sum_to(&inputs[0], &inputs[1]),
            Op::ShapeOf => Ok((Shape::known(&[inputs[0].rank()]), DType::I32)),
            Op::ExpandDims(axes) => movement::infer_expand_dims(axes, &inputs[0]),
            Op::Squeeze(axes) => movement::infer_squeeze(axes, &inputs[0]),
            Op::ConcatGrad { axis, index } => movement::infer_concat_grad(*axis, *index, inputs),
            Op::Transpose(perm) => movement::infer_transpose(perm, &inputs[0]),
            Op::Slice(spec) => movement::infer_slice(spec, &inputs[0]),
            Op::SliceGrad(spec) => movement::infer_slice_grad(spec, &inputs[0], &inputs[1]),
            Op::Concat(axis) => movement::infer_concat(*axis, inputs),
            Op::Pad { pads, .. } => movement::infer_pad(pads, &inputs[0]),
            Op::Reverse(axes) => movement::infer_reverse(axes, &inputs[0]),
            Op::Gather(axis) => movement::infer_gather(*axis, &inputs[0], &inputs[1]),
            Op::ScatterAdd(axis) => movement::infer_scatter_add(*axis, inputs),
            Op::MatMul { ta, tb } => matmul::infer(*ta, *tb, &inputs[0], &inputs[1]),
            Op::Random(r) => random::infer(r, &inputs[0]),
            Op::Conv(s) => conv::infer_conv(s, &inputs[0], &inputs[1]),
            Op::ConvInputGrad(s) => conv::infer_input_grad(s, &inputs[0], &inputs[1], &inputs[2]),
            Op::ConvKernelGrad(s) => conv::infer_kernel_grad(s, &inputs[0], &inputs[1], &inputs[2]),
            Op::Pool(s) => pool::infer_pool(s, &inputs[0]),
            Op::PoolGrad(_) => pool::infer_pool_grad(&inputs[0], &inputs[1]),
            Op::PoolSelect(s) => pool::infer_pool_select(s, &inputs[0], &inputs[1]),
            Op::Loop(body) => control::infer_loop(body, inputs),
            Op::TupleGet(k) => control::infer_tuple_get(*k, &inputs[0]),
            Op::HostCall(_) | Op::CtcDecode(_) => Ok((Shape::scalar(), DType::Bool)),
            Op::Ctc(c) => ctc::infer(*c, inputs),
        }
    }

    /// The vector-Jacobian product: one gradient (or `None`) per input of `node`, given the
    /// gradient `g` flowing into its output. Written in graph ops, so it runs on every device
    /// and can itself be differentiated.
    pub fn vjp(&self, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        match self {
            Op::Placeholder(_) | Op::Constant(_) | Op::Variable(_) => Ok(vec![]),
            Op::Unary(u) => elementwise::vjp_unary(*u, node, g),
            Op::Binary(b) => elementwise::vjp_binary(*b, node, g),
            Op::Select => elementwise::vjp_select(node, g),
            Op::Cast(_) => elementwise::vjp_cast(node, g),
            Op::StopGradient => Ok(vec![None]),
            Op::Reduce { op, axes, keepdims } => reduce::vjp_reduce(*op, axes, *keepdims, node, g),
            Op::Arg { .. } => Ok(vec![None]),
            Op::Scan {
                op,
                axis,
                exclusive,
                reverse,
            } => reduce::vjp_scan(*op, *axis, *exclusive, *reverse, node, g),
            Op::Reshape => movement::vjp_reshape(node, g),
            Op::BroadcastTo => movement::vjp_broadcast_to(node, g),
            Op::SumTo => movement::vjp_sum_to(node, g),
            Op::ShapeOf => Ok(vec![None]),
            Op::ExpandDims(axes) => movement::vjp_expand_dims(axes, g),
            Op::Squeeze(axes) => movement::vjp_squeeze(axes, g),
            Op::ConcatGrad { axis, .. } => movement::vjp_concat_grad(*axis, node, g),
            Op::Transpose(perm) => movement::vjp_transpose(perm, g),
            Op::Slice(spec) => movement::vjp_slice(spec, node, g),
            Op::SliceGrad(spec) => movement::vjp_slice_grad(spec, g),
            Op::Concat(axis) => movement::vjp_concat(*axis, node, g),
            Op::Pad { pads, .. } => movement::vjp_pad(pads, node, g),
            Op::Reverse(axes) => movement::vjp_reverse(axes, g),
            Op::Gather(axis) => movement::vjp_gather(*axis, node, g),
            Op::ScatterAdd(axis) => movement::vjp_scatter_add(*axis, node, g),
            Op::MatMul { ta, tb } => matmul::vjp(*ta, *tb, node, g),
            Op::Random(_) => Ok(vec![None]),
            Op::Conv(s) => conv::vjp_conv(s, node, g),
            Op::ConvInputGrad(s) => conv::vjp_input_grad(s, node, g),
            Op::ConvKernelGrad(s) => conv::vjp_kernel_grad(s, node, g),
            Op::Pool(s) => pool::vjp_pool(s, node, g),
            Op::PoolGrad(s) => pool::vjp_pool_grad(s, node, g),
            Op::PoolSelect(s) => pool::vjp_pool_select(s, node, g),
            Op::Loop(_) | Op::TupleGet(_) | Op::HostCall(_) => {
                Err(crate::base::error::Error::Runtime(
                    "multi-result nodes are differentiated by autodiff::gradients".into(),
                ))
            }
            Op::Ctc(c) => ctc::vjp(*c, node, g),
            Op::CtcDecode(_) => Ok(vec![None, None]),
        }
    }

    /// Runs the op on host values. Sources are resolved by the executor, not here.
    pub fn cpu(&self, inputs: &[&Value]) -> Result<Value> {
        match self {
            Op::Placeholder(_) | Op::Constant(_) | Op::Variable(_) => source::cpu(self),
            Op::Unary(u) => elementwise::cpu_unary(*u, inputs[0]),
            Op::Binary(b) => elementwise::cpu_binary(*b, inputs[0], inputs[1]),
            Op::Select => elementwise::cpu_select(inputs[0], inputs[1], inputs[2]),
            Op::Cast(d) => Ok(inputs[0].cast(*d)),
            Op::StopGradient => Ok(inputs[0].clone()),
            Op::Reduce { op, axes, keepdims } => {
                reduce::cpu_reduce(*op, axes, *keepdims, inputs[0])
            }
            Op::Arg { op, axis } => reduce::cpu_arg(*op, *axis, inputs[0]),
            Op::Scan {
                op,
                axis,
                exclusive,
                reverse,
            } => reduce::cpu_scan(*op, *axis, *exclusive, *reverse, inputs[0]),
            Op::Reshape => movement::cpu_reshape(inputs[0], inputs[1]),
            Op::BroadcastTo => movement::cpu_broadcast_to(inputs[0], inputs[1]),
            Op::SumTo => movement::cpu_sum_to(inputs[0], inputs[1]),
            Op::ShapeOf => movement::cpu_shape_of(inputs[0]),
            Op::ExpandDims(axes) => movement::cpu_expand_dims(axes, inputs[0]),
            Op::Squeeze(axes) => movement::cpu_squeeze(axes, inputs[0]),
            Op::ConcatGrad { axis, index } => movement::cpu_concat_grad(*axis, *index, inputs),
            Op::Transpose(perm) => movement::cpu_transpose(perm, inputs[0]),
            Op::Slice(spec) => movement::cpu_slice(spec, inputs[0]),
            Op::SliceGrad(spec) => movement::cpu_slice_grad(spec, inputs[0], inputs[1]),
            Op::Concat(axis) => movement::cpu_concat(*axis, inputs),
            Op::Pad { pads, value } => movement::cpu_pad(pads, *value, inputs[0]),
            Op::Reverse(axes) => movement::cpu_reverse(axes, inputs[0]),
            Op::Gather(axis) => movement::cpu_gather(*axis, inputs[0], inputs[1]),
            Op::ScatterAdd(axis) => {
                movement::cpu_scatter_add(*axis, inputs[0], inputs[1], inputs[2])
            }
            Op::MatMul { ta, tb } => matmul::cpu(*ta, *tb, inputs[0], inputs[1]),
            Op::Random(r) => random::cpu(r, inputs[0]),
            Op::Conv(s) => conv::cpu_conv(s, inputs[0], inputs[1]),
            Op::ConvInputGrad(s) => conv::cpu_input_grad(s, inputs[0], inputs[1], inputs[2]),
            Op::ConvKernelGrad(s) => conv::cpu_kernel_grad(s, inputs[0], inputs[1], inputs[2]),
            Op::Pool(s) => pool::cpu_pool(s, inputs[0]),
            Op::PoolGrad(s) => pool::cpu_pool_grad(s, inputs[0], inputs[1]),
            Op::PoolSelect(s) => pool::cpu_pool_select(s, inputs[0], inputs[1]),
            Op::Loop(_) | Op::TupleGet(_) | Op::HostCall(_) | Op::CtcDecode(_) => {
                Err(crate::base::error::Error::Runtime(
                    "multi-result nodes are run by the executor".into(),
                ))
            }
            Op::Ctc(c) => ctc::cpu(*c, inputs),
        }
    }

    /// Whether the op's value follows from its input values alone. `Pure` ops are merged
    /// when they repeat with the same inputs (common subexpressions) and computed at
    /// compile time when their inputs are constants (`compile`); `Impure` ones never are.
    /// Every op states it: nothing is pure by default.
    pub fn purity(&self) -> Purity {
        match self {
            // Fed by the caller of each run.
            Op::Placeholder(_) => Purity::Impure,
            // A fixed value (folded as itself, never merged: see `compile::cse_key`).
            Op::Constant(_) => Purity::Pure,
            // Mutable state: assignments change it between runs.
            Op::Variable(_) => Purity::Impure,
            // Fresh numbers on every execution (the counter advances).
            Op::Random(_) => Purity::Impure,
            // Calls arbitrary Python code, which may have effects or draw its own numbers.
            Op::HostCall(_) => Purity::Impure,
            // A multi-result node of data-dependent shape, run by the executor
            // (`Op::cpu` cannot evaluate it).
            Op::CtcDecode(_) => Purity::Impure,
            // Runs a body plan through the executor (`Op::cpu` cannot evaluate it); the
            // body may draw random numbers or call back.
            Op::Loop(_) => Purity::Impure,
            // Result `k` of its input node: never folded, since no multi-result node is.
            Op::TupleGet(_) => Purity::Pure,
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast(_)
            | Op::StopGradient
            | Op::Reduce { .. }
            | Op::Arg { .. }
            | Op::Scan { .. }
            | Op::Reshape
            | Op::BroadcastTo
            | Op::SumTo
            | Op::ShapeOf
            | Op::ExpandDims(_)
            | Op::Squeeze(_)
            | Op::Transpose(_)
            | Op::Slice(_)
            | Op::SliceGrad(_)
            | Op::Concat(_)
            | Op::ConcatGrad { .. }
            | Op::Pad { .. }
            | Op::Reverse(_)
            | Op::Gather(_)
            | Op::ScatterAdd(_)
            | Op::MatMul { .. }
            | Op::Conv(_)
            | Op::ConvInputGrad(_)
            | Op::ConvKernelGrad(_)
            | Op::Pool(_)
            | Op::PoolGrad(_)
            | Op::PoolSelect(_)
            | Op::Ctc(_) => Purity::Pure,
        }
    }

    /// Inputs whose *values* the op reads as a target shape (int 1-D), not as data: the
    /// GPU keeps them on the host, the CPU fusion pass does not count them as data, and
    /// `compile::Plan::shapes_follow_feeds` checks where they come from.
    pub fn shape_operands(&self) -> &'static [usize] {
        match self {
            Op::Reshape | Op::BroadcastTo | Op::SumTo => &[1],
            Op::ConvInputGrad(_) | Op::ConvKernelGrad(_) => &[2],
            Op::Random(_) => &[0],
            Op::Placeholder(_)
            | Op::Constant(_)
            | Op::Variable(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast(_)
            | Op::StopGradient
            | Op::Reduce { .. }
            | Op::Arg { .. }
            | Op::Scan { .. }
            | Op::ShapeOf
            | Op::ExpandDims(_)
            | Op::Squeeze(_)
            | Op::Transpose(_)
            | Op::Slice(_)
            | Op::SliceGrad(_)
            | Op::Concat(_)
            | Op::ConcatGrad { .. }
            | Op::Pad { .. }
            | Op::Reverse(_)
            | Op::Gather(_)
            | Op::ScatterAdd(_)
            | Op::MatMul { .. }
            | Op::Loop(_)
            | Op::TupleGet(_)
            | Op::HostCall(_)
            | Op::Ctc(_)
            | Op::CtcDecode(_)
            | Op::Conv(_)
            | Op::Pool(_)
            | Op::PoolGrad(_)
            | Op::PoolSelect(_) => &[],
        }
    }

    /// How devices run the op, for every device: which ops fuse into elementwise kernels
    /// (the CPU fusion pass and the GPU's generated WGSL), which only relabel a buffer,
    /// which have a kernel of their own and which run only as their CPU kernel. `Host` is
    /// where a primitive starts: the GPU runs its CPU kernel inside its plans, so the op
    /// is correct on every device from its first commit.
    pub fn class(&self) -> Class<'_> {
        match self {
            Op::Placeholder(_) | Op::Constant(_) | Op::Variable(_) => Class::Source,
            Op::Unary(u) => Class::Elementwise(FusedOp::Unary(*u)),
            Op::Binary(b) => Class::Elementwise(FusedOp::Binary(*b)),
            Op::Select => Class::Elementwise(FusedOp::Select),
            Op::Cast(d) => Class::Elementwise(FusedOp::Cast(*d)),
            Op::BroadcastTo => Class::Elementwise(FusedOp::BroadcastTo),
            Op::StopGradient => Class::View(ViewOp::Identity),
            Op::Reshape => Class::View(ViewOp::Reshape),
            Op::ExpandDims(axes) => Class::View(ViewOp::ExpandDims(axes)),
            Op::Squeeze(axes) => Class::View(ViewOp::Squeeze(axes)),
            Op::ShapeOf => Class::Meta,
            Op::Reduce { .. }
            | Op::Arg { .. }
            | Op::Scan { .. }
            | Op::SumTo
            | Op::Transpose(_)
            | Op::Slice(_)
            | Op::SliceGrad(_)
            | Op::Concat(_)
            | Op::ConcatGrad { .. }
            | Op::Pad { .. }
            | Op::Reverse(_)
            | Op::Gather(_)
            | Op::ScatterAdd(_)
            | Op::MatMul { .. }
            | Op::Random(_)
            | Op::Conv(_)
            | Op::ConvInputGrad(_)
            | Op::ConvKernelGrad(_)
            | Op::Pool(_)
            | Op::PoolGrad(_)
            | Op::PoolSelect(_) => Class::Kernel,
            // Host to the fusion schedule; the GPU executor records a loop whose body runs
            // on the device step by step (`runtime::gpu::loops`), else runs it on the CPU.
            Op::Loop(_) | Op::TupleGet(_) => Class::Host,
            // A Python callback: its inputs come to the host, its result goes back.
            Op::HostCall(_) => Class::Host,
            // CTC loss and decoding: dynamic programming over label sequences, CPU kernels.
            Op::Ctc(_) | Op::CtcDecode(_) => Class::Host,
        }
    }

    /// What the op makes of operands that are zero everywhere: `compile`'s specialisation
    /// for a fixed `select` condition follows the zero gradients of untaken branches
    /// through it, so that none of that work is computed.
    pub fn zeros(&self) -> Zeros {
        match self {
            Op::Binary(b) => b.zeros(),
            Op::Unary(UnaryOp::Neg) => Zeros::First,
            Op::Unary(_) => Zeros::Unknown,
            Op::Select => Zeros::Select,
            Op::MatMul { .. } => Zeros::Any,
            Op::Cast(_)
            | Op::SumTo
            | Op::BroadcastTo
            | Op::Reshape
            | Op::ExpandDims(_)
            | Op::Squeeze(_)
            | Op::Transpose(_)
            | Op::Reduce {
                op: ReduceOp::Sum | ReduceOp::Mean,
                ..
            } => Zeros::First,
            Op::Reduce {
                op: ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min,
                ..
            }
            | Op::Placeholder(_)
            | Op::Constant(_)
            | Op::Variable(_)
            | Op::StopGradient
            | Op::Arg { .. }
            | Op::Scan { .. }
            | Op::ShapeOf
            | Op::Slice(_)
            | Op::SliceGrad(_)
            | Op::Concat(_)
            | Op::ConcatGrad { .. }
            | Op::Pad { .. }
            | Op::Reverse(_)
            | Op::Gather(_)
            | Op::ScatterAdd(_)
            | Op::Random(_)
            | Op::Conv(_)
            | Op::ConvInputGrad(_)
            | Op::ConvKernelGrad(_)
            | Op::Pool(_)
            | Op::PoolGrad(_)
            | Op::PoolSelect(_)
            | Op::Loop(_)
            | Op::TupleGet(_)
            | Op::HostCall(_)
            | Op::Ctc(_)
            | Op::CtcDecode(_) => Zeros::Unknown,
        }
    }

    /// The rough cost of one element of the op's result in adds, which the CPU fusion
    /// pass sums over a group to set its parallel grain; 1 for everything that is not an
    /// elementwise math op.
    pub fn cost(&self) -> usize {
        match self {
            Op::Unary(u) => u.cost(),
            Op::Binary(b) => b.cost(),
            Op::Select
            | Op::Cast(_)
            | Op::BroadcastTo
            | Op::Placeholder(_)
            | Op::Constant(_)
            | Op::Variable(_)
            | Op::StopGradient
            | Op::Reduce { .. }
            | Op::Arg { .. }
            | Op::Scan { .. }
            | Op::Reshape
            | Op::SumTo
            | Op::ShapeOf
            | Op::ExpandDims(_)
            | Op::Squeeze(_)
            | Op::Transpose(_)
            | Op::Slice(_)
            | Op::SliceGrad(_)
            | Op::Concat(_)
            | Op::ConcatGrad { .. }
            | Op::Pad { .. }
            | Op::Reverse(_)
            | Op::Gather(_)
            | Op::ScatterAdd(_)
            | Op::MatMul { .. }
            | Op::Random(_)
            | Op::Conv(_)
            | Op::ConvInputGrad(_)
            | Op::ConvKernelGrad(_)
            | Op::Pool(_)
            | Op::PoolGrad(_)
            | Op::PoolSelect(_)
            | Op::Loop(_)
            | Op::TupleGet(_)
            | Op::HostCall(_)
            | Op::Ctc(_)
            | Op::CtcDecode(_) => 1,
        }
    }

    /// Whether the GPU lowering (`Class::Elementwise` or `Class::Kernel`) handles a result
    /// of dtype `d`; where it does not, the node runs its CPU kernel inside the GPU plan.
    /// Ops that never reach a GPU kernel (sources, views, metadata, `Class::Host`) say
    /// `false`. f64 (no WGSL type) is refused before this is asked, and int64 data is
    /// asked of `exact_int64` too.
    pub fn gpu_supports(&self, d: DType) -> bool {
        match self {
            // Integer means divide an i32 sum, which could wrap where the CPU's i64 does not.
            Op::Reduce {
                op: ReduceOp::Mean, ..
            } => d.is_float(),
            // Atomic adds accumulate in the storage type: exact only for f32 and i32.
            Op::ScatterAdd(_) => matches!(d, DType::F32 | DType::I32),
            Op::Random(_) => matches!(d, DType::F32 | DType::F16),
            // Float only, as their shape rules require; f64 never gets here (no WGSL type).
            Op::Conv(_)
            | Op::ConvInputGrad(_)
            | Op::ConvKernelGrad(_)
            | Op::Pool(_)
            | Op::PoolGrad(_)
            | Op::PoolSelect(_) => d.is_float(),
            Op::Reduce { .. }
            | Op::Arg { .. }
            | Op::Scan { .. }
            | Op::SumTo
            | Op::Transpose(_)
            | Op::Slice(_)
            | Op::SliceGrad(_)
            | Op::Concat(_)
            | Op::ConcatGrad { .. }
            | Op::Pad { .. }
            | Op::Reverse(_)
            | Op::Gather(_)
            | Op::MatMul { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast(_)
            | Op::BroadcastTo => true,
            Op::Placeholder(_)
            | Op::Constant(_)
            | Op::Variable(_)
            | Op::StopGradient
            | Op::Reshape
            | Op::ShapeOf
            | Op::ExpandDims(_)
            | Op::Squeeze(_)
            | Op::Loop(_)
            | Op::TupleGet(_)
            | Op::HostCall(_)
            | Op::Ctc(_)
            | Op::CtcDecode(_) => false,
        }
    }

    /// Whether the GPU's generated kernels compute this op exactly where it reads or
    /// writes int64 (two 32-bit words per element): the wrapping arithmetic (add,
    /// subtract, multiply, negate, abs, square), comparisons, min/max, the logical ops,
    /// select, broadcasts and every cast but to f64. Division, modulo and powers of int64
    /// run their CPU kernels, as do the non-elementwise ops (arg-reductions aside, whose
    /// int64 indices their kernel writes).
    pub fn exact_int64(&self) -> bool {
        match self {
            Op::Unary(u) => u.takes_int(),
            Op::Binary(b) => !matches!(
                b,
                BinaryOp::Div | BinaryOp::FloorDiv | BinaryOp::Mod | BinaryOp::Pow
            ),
            Op::Cast(d) => *d != DType::F64,
            Op::Select | Op::BroadcastTo | Op::Arg { .. } => true,
            Op::Placeholder(_)
            | Op::Constant(_)
            | Op::Variable(_)
            | Op::StopGradient
            | Op::Reshape
            | Op::ShapeOf
            | Op::ExpandDims(_)
            | Op::Squeeze(_)
            | Op::Transpose(_)
            | Op::Slice(_)
            | Op::SliceGrad(_)
            | Op::Concat(_)
            | Op::ConcatGrad { .. }
            | Op::Pad { .. }
            | Op::Reverse(_)
            | Op::Gather(_)
            | Op::ScatterAdd(_)
            | Op::Reduce { .. }
            | Op::SumTo
            | Op::Scan { .. }
            | Op::MatMul { .. }
            | Op::Conv(_)
            | Op::ConvInputGrad(_)
            | Op::ConvKernelGrad(_)
            | Op::Pool(_)
            | Op::PoolGrad(_)
            | Op::PoolSelect(_)
            | Op::Random(_)
            | Op::Loop(_)
            | Op::TupleGet(_)
            | Op::HostCall(_)
            | Op::Ctc(_)
            | Op::CtcDecode(_) => false,
        }
    }
}

/// How an op treats operands that are zero everywhere (`Op::zeros`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zeros {
    /// Zero when any operand is (products).
    Any,
    /// Zero when operand 0 is (division, negation, casts, sums, reshapes, transposes).
    First,
    /// A sum of its operands (`subtract` negates the second): a zero operand drops out.
    Additive,
    /// A `select`: zero when both branches are; a fixed condition picks one branch.
    Select,
    /// Nothing is assumed.
    Unknown,
}

/// Whether an op's value follows from its inputs alone; see `Op::purity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purity {
    /// Same inputs, same value: may be merged and folded.
    Pure,
    /// Depends on something besides its inputs (feeds, state, draws, callbacks) or is
    /// run by the executor rather than `Op::cpu`: computed once per execution.
    Impure,
}

/// How devices run an op; see `Op::class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class<'a> {
    /// Placeholder, constant, variable: supplied by the executor; no inputs.
    Source,
    /// Elementwise with NumPy broadcasting: fused by the CPU fusion pass
    /// (`compile::fuse`) and into generated WGSL kernels, from the op -> expression
    /// tables in `elementwise.rs`.
    Elementwise(FusedOp),
    /// A new view of the same buffer (reshape, expand/squeeze, stop_gradient): no GPU
    /// dispatch.
    View(ViewOp<'a>),
    /// Computed from static metadata (the runtime shape): no GPU dispatch.
    Meta,
    /// A kernel of its own on every device: its CPU kernel in the family file, a
    /// hand-written one in `shaders/<family>.wgsl` on the GPU (see `runtime/gpu/kernels`).
    Kernel,
    /// Only its CPU kernel (or the CPU executor): the GPU runs it inside its plan,
    /// inputs downloaded and the result uploaded when a GPU node reads it.
    Host,
}

/// The elementwise ops devices fuse (`Class::Elementwise`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast(DType),
    /// Identity whose input is read with broadcasting.
    BroadcastTo,
}

/// The ops that only relabel a buffer's shape (`Class::View`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewOp<'a> {
    Identity,
    Reshape,
    ExpandDims(&'a [usize]),
    Squeeze(&'a [usize]),
}

/// Shorthands used by the VJP rules, so rules read like the math.
pub mod build {
    pub use super::conv::{conv, conv_input_grad, conv_kernel_grad};
    pub use super::elementwise::{
        add, binary, cast, constant_like, div, mul, neg, scalar_like, select, sub, unary,
        zeros_like,
    };
    pub use super::matmul::matmul;
    pub use super::movement::{
        broadcast_like, broadcast_to, concat, expand_dims, full_spec, gather, int_vector, pad,
        reshape_like, reshape_to, reverse, scatter_add, shape_of, slice, slice_grad, squeeze,
        sum_like, sum_to, transpose,
    };
    pub use super::pool::{pool, pool_grad, pool_select};
    pub use super::reduce::{arg, reduce, scan};
}
