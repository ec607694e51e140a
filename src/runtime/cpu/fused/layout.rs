//! Input layouts of a fused group: the runtime shapes of its members, and how each
//! external input is read at the group's output shape (strides with broadcast dims at
//! stride 0 and contiguous dims merged, a slice's start and steps, or a repeating period).

use crate::base::error::{Error, Result};
use crate::base::shape::broadcast_runtime;
use crate::base::value::Value;
use crate::compile::fuse::Group;
use crate::compile::Plan;
use crate::ops::movement::resolve_slice;
use crate::ops::{Class, FusedOp, Op, SliceAxis};

/// How a gathered input is read: broadcast dims at stride 0, dims merged where possible.
pub(super) struct Layout {
    pub(super) dims: Vec<usize>,
    pub(super) strides: Vec<usize>,
    /// Element offset of the first read (a slice's start).
    pub(super) offset: usize,
}

/// The runtime shape of member or input `j` of a group.
fn shape_of<'a>(
    g: &Group,
    shapes: &'a [Vec<usize>],
    slots: &'a [Option<Value>],
    j: usize,
) -> &'a [usize] {
    match g.members.iter().position(|&m| m == j) {
        Some(p) => &shapes[p],
        None => slots[j]
            .as_ref()
            .expect("inputs are computed before their users")
            .shape(),
    }
}

pub(super) fn fused_op(plan: &Plan, m: usize) -> FusedOp {
    match plan.nodes[m].op().class() {
        Class::Elementwise(f) => f,
        Class::Source | Class::Meta | Class::View(_) | Class::Kernel | Class::Host => {
            unreachable!("fusion groups hold elementwise nodes only")
        }
    }
}

/// Runtime shapes of the members; errors as the unfused kernels report them.
pub(super) fn member_shapes(
    plan: &Plan,
    g: &Group,
    slots: &[Option<Value>],
) -> Result<Vec<Vec<usize>>> {
    let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(g.members.len());
    for &m in &g.members {
        let ins = &plan.inputs[m];
        let sh = |p: usize| shape_of(g, &shapes, slots, ins[p]);
        if let Op::Slice(spec) = plan.nodes[m].op() {
            let s = slice_shape(sh(0), spec);
            shapes.push(s);
            continue;
        }
        let s = match fused_op(plan, m) {
            FusedOp::Unary(_) | FusedOp::Cast(_) => sh(0).to_vec(),
            FusedOp::Binary(b) => broadcast_runtime(b.name(), sh(0), sh(1))?,
            FusedOp::Select => {
                broadcast_runtime("select", &broadcast_runtime("select", sh(0), sh(1))?, sh(2))?
            }
            FusedOp::BroadcastTo => {
                let t = slots[ins[1]].as_ref().expect("computed");
                let target = crate::ops::movement::target_dims("broadcast_to", t)?;
                let x = sh(0);
                if x != target.as_slice()
                    && broadcast_runtime("broadcast_to", x, &target)? != target
                {
                    return Err(Error::Value(format!(
                        "broadcast_to: cannot broadcast shape {x:?} to {target:?}"
                    )));
                }
                target
            }
        };
        shapes.push(s);
    }
    Ok(shapes)
}

/// Strides of `shape` read as the right-aligned `out` shape, with size-1 dims dropped
/// and neighbours merged where one stride continues the other.
pub(super) fn gather_layout(shape: &[usize], out: &[usize]) -> Layout {
    strided_layout(shape, &crate::base::shape::row_major_strides(shape), 0, out)
}

/// Periods up to which a repeating input is tiled (`Opd::Tile`) instead of gathered.
const MAX_PERIOD: usize = 1 << 14;

/// The period of a layout that repeats one contiguous run along the flat index (a bias
/// of the last dims broadcast over the leading ones), if it is one.
pub(super) fn periodic(l: &Layout) -> Option<usize> {
    (l.offset == 0 && l.dims.len() == 2 && l.strides == [0, 1] && l.dims[1] <= MAX_PERIOD)
        .then(|| l.dims[1])
}

/// A slice `spec` of a row-major input of shape `input`, read as the right-aligned `out`.
pub(super) fn slice_layout(input: &[usize], spec: &[SliceAxis], out: &[usize]) -> Layout {
    let (mut dims, mut strides, mut offset) = (
        Vec::with_capacity(input.len()),
        Vec::with_capacity(input.len()),
        0,
    );
    let mut acc = 1;
    for d in (0..input.len()).rev() {
        let (start, _, step, len) = match spec.get(d) {
            Some(a) => resolve_slice(a, input[d]),
            None => (0, 0, 1, input[d]),
        };
        dims.push(len);
        strides.push(acc * step as usize);
        offset += start as usize * acc;
        acc *= input[d];
    }
    dims.reverse();
    strides.reverse();
    strided_layout(&dims, &strides, offset, out)
}

/// The shape of a slice `spec` of an input of shape `input`.
fn slice_shape(input: &[usize], spec: &[SliceAxis]) -> Vec<usize> {
    input
        .iter()
        .enumerate()
        .map(|(d, &n)| spec.get(d).map_or(n, |a| resolve_slice(a, n).3))
        .collect()
}

/// Strided `shape` read as the right-aligned `out` shape (see `gather_layout`).
fn strided_layout(shape: &[usize], strides: &[usize], offset: usize, out: &[usize]) -> Layout {
    let lead = out.len() - shape.len();
    let mut st = vec![0usize; out.len()];
    for d in 0..shape.len() {
        st[lead + d] = if shape[d] == 1 { 0 } else { strides[d] };
    }
    let (mut dims, mut strides): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (&d, &s) in out.iter().zip(&st) {
        if d == 1 {
            continue;
        }
        if let (Some(pd), Some(ps)) = (dims.last_mut(), strides.last_mut()) {
            if *ps == s * d {
                *pd *= d;
                *ps = s;
                continue;
            }
        }
        dims.push(d);
        strides.push(s);
    }
    if dims.is_empty() {
        dims.push(1);
        strides.push(0);
    }
    Layout {
        dims,
        strides,
        offset,
    }
}
