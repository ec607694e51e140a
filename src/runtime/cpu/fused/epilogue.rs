//! Conv/pool epilogues: a group run on each image of a conv or pool result as soon as
//! the kernel has written it, while the image is still in cache.

use super::exec::{exec, Kernel};
use super::program::Programs;
use super::run::{run_driven, split_exec};
use super::OutBuf;
use crate::base::error::Result;
use crate::base::value::{uninit, Arr, Value};
use crate::compile::fuse::Group;
use crate::compile::update_rule::Update;
use crate::compile::Plan;
use crate::ops::{ImageKernel, ImageStage, Op};
use crate::runtime::cpu::InPlace;
use ndarray::IxDyn;

/// Node `f`'s result shape, image count and kernel, when it has an image-by-image f32
/// kernel for these inputs.
fn first_kernel<'a>(
    plan: &'a Plan,
    f: usize,
    ins: &'a [Value],
) -> Result<Option<(Vec<usize>, usize, ImageKernel<'a>)>> {
    let op = plan.nodes[f].op();
    if let Op::Pool(spec) = op {
        return crate::ops::pool::f32_then(spec, &ins[0], None);
    }
    if let Op::PoolGrad(spec) = op {
        return crate::ops::pool::f32_then(spec, &ins[0], Some(&ins[1]));
    }
    let Op::Conv(spec) = op else {
        return Ok(None);
    };
    let (Value::F32(x), Value::F32(w)) = (&ins[0], &ins[1]) else {
        return Ok(None);
    };
    let geo = crate::ops::conv::forward_geom(spec, x.shape(), w.shape())?;
    let (shape, n) = (geo.y_shape.clone(), geo.n);
    let (x, w) = (x.as_standard_layout(), w.as_standard_layout());
    let k: ImageKernel<'a> = Box::new(move |y, after| {
        let (x, w) = (
            x.as_slice().expect("standard"),
            w.as_slice().expect("standard"),
        );
        crate::ops::conv::cpu::forward_f32_then(&geo, x, w, y, after)
    });
    Ok(Some((shape, n, k)))
}

/// The group's pooling (`fuse::Group::pooled`) of its output, computed in full after the
/// group where it did not run image by image.
fn pool_whole(plan: &Plan, g: &Group, out: &mut Option<Vec<Value>>) -> Result<()> {
    let (Some(p), Some(vals)) = (g.pooled, out.as_mut()) else {
        return Ok(());
    };
    let pooled = plan.nodes[p].op().cpu(&[&vals[0]])?;
    vals.push(pooled);
    Ok(())
}

/// Runs node `f` and then `g` on each image of its result as soon as the image is
/// written (see `fuse::Group::first`), and the group's pooling or global maximum
/// (`Group::pooled`) on each
/// image of the group's output right after. The result's buffer is put in slot `f`
/// before it is computed, so the group's program, inputs and buffer reuse see it as any
/// input (the group may write its output in place there).
pub(super) fn run_after(
    plan: &Plan,
    g: &Group,
    programs: &Programs,
    update: Option<&Update>,
    f: usize,
    slots: &mut [Option<Value>],
    in_place: Option<&InPlace>,
) -> Result<Option<Vec<Value>>> {
    let ins: Vec<Value> = plan.inputs[f]
        .iter()
        .map(|&j| slots[j].clone().expect("computed"))
        .collect();
    let plain = |slots: &mut [Option<Value>]| -> Result<()> {
        let refs: Vec<&Value> = ins.iter().collect();
        slots[f] = Some(plan.nodes[f].op().cpu(&refs)?);
        Ok(())
    };
    let Some((shape, images, kernel)) = first_kernel(plan, f, &ins)? else {
        plain(slots)?;
        let mut out = run_driven(
            plan,
            g,
            programs,
            update,
            slots,
            in_place,
            &|kern, shape| split_exec(kern, shape.iter().product(), g.cost),
        )?;
        pool_whole(plan, g, &mut out)?;
        return Ok(out);
    };
    // The pooling's result and per-image kernel, reading the group's output (of the
    // producer's shape).
    let pool: Option<Box<dyn ImageStage>> = match g.pooled.map(|p| plan.nodes[p].op()) {
        Some(Op::Pool(spec)) => Some(Box::new(crate::ops::pool::ImagePool::new(spec, &shape)?)),
        Some(Op::Reduce { op, axes, keepdims }) => {
            crate::ops::reduce::ImageReduce::new(*op, axes, *keepdims, &shape)
                .map(|r| Box::new(r) as Box<dyn ImageStage>)
        }
        _ => None,
    };
    let mut pooled: Option<Vec<f32>> = pool.as_ref().map(|ip| uninit(ip.shape().iter().product()));
    let pdst = pooled
        .as_mut()
        .map(|v| crate::ops::matmul::SharedDst(v.as_mut_ptr()));
    let pooled_images = std::cell::Cell::new(false);
    let len: usize = shape.iter().product();
    let mut y: Vec<f32> = uninit(len);
    let dst = crate::ops::matmul::SharedDst(y.as_mut_ptr());
    slots[f] = Some(Value::F32(
        Arr::from_shape_vec(IxDyn(&shape), y).expect("length of the shape"),
    ));
    let ran = std::cell::Cell::new(false);
    let drive = |kern: &Kernel<'_>, gshape: &[usize]| {
        let d = dst;
        // SAFETY: the buffer of slot f (or of the output that reused it) holds `len`
        // elements, and nothing reads it before the kernel writes it: the group reads
        // image i only in `after(i)`.
        let y = unsafe { std::slice::from_raw_parts_mut(d.0, len) };
        if gshape == shape.as_slice()
            && images > 0
            && kern
                .folds
                .is_none_or(|f| (len / images).is_multiple_of(f.q))
        {
            let img = len / images;
            // The group's one output, written by the kernel (not an input passed through).
            let gout = match kern.outs {
                [(_, OutBuf::F32(p))] if !p.is_null() => Some(crate::ops::matmul::SharedDst(*p)),
                _ => None,
            };
            match (&pool, pdst, gout) {
                (Some(ip), Some(pd), Some(go)) if ip.images() == images => {
                    let pimg = ip.shape().iter().product::<usize>() / images;
                    kernel(y, &|i| {
                        exec(kern, i * img, (i + 1) * img);
                        let (go, pd) = (go, pd);
                        // SAFETY: the group's output and the pooling's buffer hold
                        // `images` images of `img` and `pimg` elements; image i of the
                        // output was just written, and only this call writes image i of
                        // the pooling.
                        let (src, dst) = unsafe {
                            (
                                std::slice::from_raw_parts(go.0.add(i * img), img),
                                std::slice::from_raw_parts_mut(pd.0.add(i * pimg), pimg),
                            )
                        };
                        ip.run(src, dst);
                    });
                    pooled_images.set(true);
                }
                _ => kernel(y, &|i| exec(kern, i * img, (i + 1) * img)),
            }
        } else {
            kernel(y, &|_| {});
            split_exec(kern, gshape.iter().product(), g.cost);
        }
        ran.set(true);
    };
    let mut out = run_driven(plan, g, programs, update, slots, in_place, &drive)?;
    if !ran.get() {
        // The group did not run (outputs of different shapes, or nothing to compute): the
        // members read a computed result.
        plain(slots)?;
    }
    match (pooled_images.get(), &pool, pooled, out.as_mut()) {
        (true, Some(ip), Some(buf), Some(vals)) => vals.push(Value::F32(
            Arr::from_shape_vec(IxDyn(ip.shape()), buf).expect("length of the shape"),
        )),
        _ => pool_whole(plan, g, &mut out)?,
    }
    Ok(out)
}
