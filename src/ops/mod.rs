//! The primitive table. Every primitive is one variant of `Op`; its shape/dtype rule, VJP
//! rule and CPU kernel live side by side in the family file named on its line. Matches over
//! `Op` have no catch-all arm, so adding a variant makes the compiler list every place that
//! must handle it. Everything else in the `K` API is a composite of these, in Python.

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

    /// How the GPU device runs the op (`runtime/gpu`). `Host` means "no WGSL lowering":
    /// the node runs its CPU kernel inside the GPU plan (inputs downloaded, result
    /// uploaded when a GPU node reads it). A new primitive starts as `Host`.
    pub fn gpu_kind(&self) -> GpuKind<'_> {
        match self {
            Op::Placeholder(_) | Op::Constant(_) | Op::Variable(_) => GpuKind::Source,
            Op::Unary(u) => GpuKind::Fused(FusedOp::Unary(*u)),
            Op::Binary(b) => GpuKind::Fused(FusedOp::Binary(*b)),
            Op::Select => GpuKind::Fused(FusedOp::Select),
            Op::Cast(d) => GpuKind::Fused(FusedOp::Cast(*d)),
            Op::BroadcastTo => GpuKind::Fused(FusedOp::BroadcastTo),
            Op::StopGradient => GpuKind::View(ViewOp::Identity),
            Op::Reshape => GpuKind::View(ViewOp::Reshape),
            Op::ExpandDims(axes) => GpuKind::View(ViewOp::ExpandDims(axes)),
            Op::Squeeze(axes) => GpuKind::View(ViewOp::Squeeze(axes)),
            Op::ShapeOf => GpuKind::Meta,
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
            | Op::PoolSelect(_) => GpuKind::Kernel,
            // Loops run their body with the CPU executor, inside the GPU plan.
            Op::Loop(_) | Op::TupleGet(_) => GpuKind::Host,
            // A Python callback: its inputs come to the host, its result goes back.
            Op::HostCall(_) => GpuKind::Host,
            // CTC loss and decoding: dynamic programming over label sequences, CPU kernels.
            Op::Ctc(_) | Op::CtcDecode(_) => GpuKind::Host,
        }
    }

    /// Inputs whose *values* the op needs on the host (target shapes), not on a device.
    pub fn host_args(&self) -> &'static [usize] {
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

    /// Whether the op is elementwise (a fusion candidate).
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast(_)
        )
    }
}

/// GPU execution class of an op; see `Op::gpu_kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuKind<'a> {
    /// Placeholder, constant, variable: supplied by the executor.
    Source,
    /// Elementwise with NumPy broadcasting: fused into generated WGSL kernels from the
    /// op -> expression tables in `elementwise.rs`.
    Fused(FusedOp),
    /// A new view of the same buffer (reshape, expand/squeeze, stop_gradient): no dispatch.
    View(ViewOp<'a>),
    /// Computed from static metadata (the runtime shape): no dispatch.
    Meta,
    /// A hand-written kernel in `shaders/<family>.wgsl` (see `runtime/gpu/kernels`).
    Kernel,
    /// No WGSL lowering: runs the CPU kernel inside the GPU plan.
    Host,
}

/// The elementwise ops the GPU fuses (`GpuKind::Fused`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast(DType),
    /// Identity whose input is read with broadcasting.
    BroadcastTo,
}

/// The ops that only relabel a buffer's shape (`GpuKind::View`).
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
