//! GPU lowerings of the convolution primitives (`ops::conv`): implicit GEMMs over
//! `shaders/conv.wgsl`.

use super::super::exec::{grid, Exec, Slot};
use super::super::fusion::{self, Epilogue};
use super::super::params::{self as blk, Params};
use super::super::pipelines::Pipe;
use super::super::pipelines::{self};
use super::super::DTensor;
use super::matmul::MATMUL_K_STEP;
use super::movement::fill;
use super::reduce::reduce;
use super::{consumed, host_value, tag, LOOP_BUDGET};
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::compile::fuse::Group;
use crate::ops::conv::{self, cpu::Geom, ConvSpec};
use std::sync::Arc;

/// Loop iterations per invocation of the convolution kernels for a GEMM contracting `k`
/// values into `cols` output channels per group: the direct kernel (under DIRECT_BELOW
/// channels) loops over them one by one, the tiled one 16 at a time with up to 25 inner
/// iterations each.
fn gemm_loop(k: usize, cols: usize) -> usize {
    if cols < DIRECT_BELOW {
        2 * k
    } else {
        k.div_ceil(16) * 25
    }
}

/// The window geometry shared by `conv.wgsl` and `pool.wgsl`.
pub(super) fn window(g: &Geom) -> blk::Window {
    let w3 = |v: [usize; 3]| v.map(|d| d as u32);
    blk::Window {
        n: g.n as u32,
        x: w3(g.x),
        k: w3(g.k),
        o: w3(g.o),
        s: w3(g.s),
        d: w3(g.d),
        pad: g.p.map(|(before, _)| before as u32),
    }
}

/// The parameter block of every `conv.wgsl` kernel, with `row_base` 0 and no stride phase.
fn conv_block(g: &Geom, splits: usize, chunk: usize) -> blk::Conv {
    blk::Conv {
        w: window(g),
        cin: g.cin as u32,
        cout: g.cout as u32,
        groups: g.groups as u32,
        cg: (g.cin / g.groups) as u32,
        og: (g.cout / g.groups) as u32,
        row_base: 0,
        splits: splits as u32,
        chunk: chunk as u32,
        ..blk::Conv::default()
    }
}

/// Below this many channels on a GEMM's column side, the one-output-per-thread kernels
/// beat the 64-wide tiles (depthwise convolutions: one channel per group).
const DIRECT_BELOW: usize = 16;

/// Records tiled kernel `pipe` over a `rows` x `cols` GEMM per z slice, as dispatches
/// of at most 65535 row tiles each (the grid limit per dimension).
#[allow(clippy::too_many_arguments)] // the GEMM geometry, spelled out at each call
fn conv_tiled(
    ex: &mut Exec,
    pipe: Arc<Pipe>,
    p: blk::Conv,
    bufs: &[(u32, &DTensor)],
    rows: usize,
    cols: usize,
    z: usize,
) -> Result<()> {
    if z > 65535 {
        return Err(Error::Device(format!(
            "conv: {z} groups exceed the GPU grid limit of 65535"
        )));
    }
    let tiles = rows.div_ceil(64);
    let per = 65535usize;
    for t0 in (0..tiles).step_by(per) {
        let p = blk::Conv {
            row_base: (t0 * 64) as u32,
            ..p
        };
        ex.dispatch(
            pipe.clone(),
            bufs,
            Params::of(&p),
            [
                cols.div_ceil(64) as u32,
                per.min(tiles - t0) as u32,
                z as u32,
            ],
        )?;
    }
    Ok(())
}

/// The forward convolution over `bufs` (the result at binding 1, or an epilogue's
/// bindings with `epi`, then x at 2 and the kernel at 3).
fn conv_fwd(
    ex: &mut Exec,
    g: &Geom,
    bufs: &[(u32, &DTensor)],
    dtype: DType,
    epi: Option<&Epilogue>,
) -> Result<()> {
    let og = g.cout / g.groups;
    let p = conv_block(g, 1, 0);
    let direct = og < DIRECT_BELOW;
    let kernel = if direct {
        "conv_fwd_direct"
    } else {
        "conv_fwd"
    };
    let pipe = match epi {
        Some(e) => {
            let t = tag(dtype)?;
            let module = || pipelines::family_source("conv", t, ex.ctx.has_f16);
            e.pipeline(ex, module, &format!("{kernel}_{t}"))?
        }
        None => pipelines::family(ex.ctx, "conv", kernel, tag(dtype)?)?,
    };
    if direct {
        let groups = grid(g.y_shape.iter().product());
        ex.dispatch(pipe, bufs, Params::of(&p), groups)?;
        Ok(())
    } else {
        conv_tiled(ex, pipe, p, bufs, g.n * g.opix(), og, g.groups)
    }
}

/// The transposed convolution, an implicit GEMM over the input gradient's pixels, one
/// dispatch per stride phase (see `stride_phase`).
fn conv_dx(ex: &mut Exec, g: &Geom, out: &DTensor, gy: &DTensor, w: &DTensor) -> Result<()> {
    let cg = g.cin / g.groups;
    if cg < DIRECT_BELOW {
        let pipe = pipelines::family(ex.ctx, "conv", "conv_dx_direct", tag(gy.dtype)?)?;
        ex.dispatch(
            pipe,
            &[(1, out), (2, gy), (3, w)],
            Params::of(&conv_block(g, 1, 0)),
            grid(out.numel()),
        )?;
        return Ok(());
    }
    for r0 in 0..g.s[0] {
        for r1 in 0..g.s[1] {
            for r2 in 0..g.s[2] {
                let ph = [0, 1, 2].map(|t| stride_phase(g, t, [r0, r1, r2][t]));
                let rows = g.n * ph.iter().map(|q| q[1]).product::<usize>();
                let field = |f: usize| ph.map(|q| q[f] as u32);
                let p = blk::Conv {
                    first: field(0),
                    count: field(1),
                    kstart: field(2),
                    kstep: field(3),
                    kcount: field(4),
                    ..conv_block(g, 1, 0)
                };
                let pipe = pipelines::family(ex.ctx, "conv", "conv_dx", tag(gy.dtype)?)?;
                conv_tiled(
                    ex,
                    pipe,
                    p,
                    &[(1, out), (2, gy), (3, w)],
                    rows,
                    cg,
                    g.groups,
                )?;
            }
        }
    }
    Ok(())
}

/// Along dim `t`, the input positions `i` with `(i + pad_before) % stride == r` and the
/// kernel offsets that reach them from an output position: `(kp * dilation) % stride == r`,
/// a residue class modulo `stride / gcd(dilation, stride)`. Returns `[first i, count of i,
/// first kp, kp step, count of kp]`.
fn stride_phase(g: &Geom, t: usize, r: usize) -> [usize; 5] {
    let (s, d, x, k, p) = (g.s[t], g.d[t], g.x[t], g.k[t], g.p[t].0);
    let first = (r + s - p % s) % s;
    let count = if first < x {
        (x - first).div_ceil(s)
    } else {
        0
    };
    let kps: Vec<usize> = (0..k).filter(|&kp| (kp * d) % s == r).collect();
    let step = if kps.len() > 1 { kps[1] - kps[0] } else { 1 };
    debug_assert!(kps.windows(2).all(|q| q[1] - q[0] == step));
    [
        first,
        count,
        kps.first().copied().unwrap_or(0),
        step,
        kps.len(),
    ]
}

/// The kernel gradient, a GEMM whose reduction runs over batch * output pixels. That axis
/// is long and the output small, so it is split into chunks reduced by separate
/// workgroups (about a thousand in all), whose partial kernels are then summed by the
/// reduce kernel.
fn conv_dw(ex: &mut Exec, i: usize, g: &Geom, x: &DTensor, gy: &DTensor) -> Result<DTensor> {
    let (cg, og) = (g.cin / g.groups, g.cout / g.groups);
    let m = g.n * g.opix();
    let wn: usize = g.w_shape.iter().product();
    if m == 0 || wn == 0 {
        let out = ex.alloc(&g.w_shape, x.dtype, i)?;
        fill(ex, &out, 0)?;
        return Ok(out);
    }
    let direct = og < DIRECT_BELOW;
    let rows = g.kk() * cg;
    let groups_z = if direct { 1 } else { g.groups };
    let workgroups = if direct {
        wn.div_ceil(256)
    } else {
        rows.div_ceil(64) * og.div_ceil(64) * g.groups
    };
    let max_parts = ((ex.ctx.max_binding / 4) as usize / wn).clamp(1, 256);
    // At most MATMUL_K_STEP positions per chunk: the chunk is a loop in the shader.
    let want = (1024 / workgroups.max(1))
        .max(m.div_ceil(MATMUL_K_STEP))
        .clamp(1, max_parts)
        .min(m.div_ceil(256))
        .min(65535 / groups_z)
        .max(1);
    let chunk = m.div_ceil(want).next_multiple_of(16);
    let splits = m.div_ceil(chunk);
    if splits == 1 {
        let out = ex.alloc(&g.w_shape, x.dtype, i)?;
        conv_dw_partials(ex, g, direct, x.dtype, &out, x, gy, 1, chunk)?;
        return Ok(out);
    }
    // Partial sums stay f32 (an f16 tensor is f32 words on the device, so the f32 kernel
    // reads it as is) and are rounded once, by the reduce kernel of the node's dtype: the
    // CPU's single rounding of an f32 accumulation.
    let mut part_shape = vec![splits];
    part_shape.extend_from_slice(&g.w_shape);
    let part = ex.alloc(&part_shape, DType::F32, i)?;
    conv_dw_partials(ex, g, direct, DType::F32, &part, x, gy, splits, chunk)?;
    let part = part.reshaped(part.shape.clone(), x.dtype);
    reduce(ex, i, &part, &[0], 0, &g.w_shape)
}

/// The kernel gradient's `splits` partial sums over chunks of `chunk` batch*spatial
/// positions into `out` (`(splits, *w_shape)`, or `w_shape` for one), computed as `dtype`.
#[allow(clippy::too_many_arguments)]
fn conv_dw_partials(
    ex: &mut Exec,
    g: &Geom,
    direct: bool,
    dtype: DType,
    out: &DTensor,
    x: &DTensor,
    gy: &DTensor,
    splits: usize,
    chunk: usize,
) -> Result<()> {
    let p = conv_block(g, splits, chunk);
    if direct {
        let pipe = pipelines::family(ex.ctx, "conv", "conv_dw_direct", tag(dtype)?)?;
        let mut groups = grid(g.w_shape.iter().product());
        groups[2] = splits as u32;
        ex.dispatch(pipe, &[(1, out), (2, x), (3, gy)], Params::of(&p), groups)?;
        Ok(())
    } else {
        let (rows, og) = (g.kk() * g.cin / g.groups, g.cout / g.groups);
        let pipe = pipelines::family(ex.ctx, "conv", "conv_dw", tag(dtype)?)?;
        conv_tiled(
            ex,
            pipe,
            p,
            &[(1, out), (2, x), (3, gy)],
            rows,
            og,
            g.groups * splits,
        )
    }
}

/// Records the convolution node `i`, with group `then` as its epilogue where it can
/// (`kernels::record_then`): the result's slot, holding only its shape when the epilogue
/// ran.
pub(super) fn conv(ex: &mut Exec, i: usize, spec: &ConvSpec, then: Option<&Group>) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let (x, w) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
    let g = conv::conv_geom(spec, &x.shape, &w.shape)?;
    if gemm_loop(g.kk() * g.cin / g.groups, g.cout / g.groups) > LOOP_BUDGET {
        return ex.on_host(i);
    }
    let epi = match then {
        Some(grp) => fusion::epilogue(ex, grp, i, &g.y_shape, 2)?,
        None => None,
    };
    match epi {
        Some(e) => {
            let bufs: Vec<(u32, &DTensor)> = [(2, &x), (3, &w)]
                .into_iter()
                .chain(e.bufs.iter().map(|(b, t)| (*b, t)))
                .collect();
            conv_fwd(ex, &g, &bufs, x.dtype, Some(&e))?;
            e.finish(ex);
            Ok(consumed(g.y_shape.clone(), x.dtype))
        }
        None => {
            let out = ex.alloc(&g.y_shape, x.dtype, i)?;
            conv_fwd(ex, &g, &[(1, &out), (2, &x), (3, &w)], x.dtype, None)?;
            Ok(Slot::dev(out))
        }
    }
}

pub(super) fn conv_input_grad(ex: &mut Exec, i: usize, spec: &ConvSpec) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let name = ex.plan.nodes[i].op().name();
    let (gy, w) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
    let s = host_value(ex, ins[2], &name)?;
    let g = conv::input_grad_geom(spec, &gy.shape, &w.shape, &s)?;
    if gemm_loop(g.kk() * g.cout / g.groups, g.cin / g.groups) > LOOP_BUDGET {
        return ex.on_host(i);
    }
    let out = ex.alloc(&g.x_shape, gy.dtype, i)?;
    conv_dx(ex, &g, &out, &gy, &w)?;
    Ok(Slot::dev(out))
}

pub(super) fn conv_kernel_grad(ex: &mut Exec, i: usize, spec: &ConvSpec) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let name = ex.plan.nodes[i].op().name();
    let (x, gy) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
    let s = host_value(ex, ins[2], &name)?;
    let g = conv::kernel_grad_geom(spec, &x.shape, &gy.shape, &s)?;
    Ok(Slot::dev(conv_dw(ex, i, &g, &x, &gy)?))
}
