//! GPU lowerings of the pooling primitives (`ops::pool`) over `shaders/pool.wgsl`.

use super::super::exec::{grid, Exec, Slot};
use super::super::params::{self as blk, Params};
use super::super::pipelines::{self};
use super::super::DTensor;
use super::conv::window;
use super::{tag, LOOP_BUDGET};
use crate::base::error::Result;
use crate::ops::conv::cpu::Geom;
use crate::ops::pool::{PoolKind, PoolSpec};
use crate::value_err;

fn pool_mode(kind: PoolKind) -> u32 {
    match kind {
        PoolKind::Max => 0,
        PoolKind::Avg => 1,
    }
}

/// One `pool.wgsl` kernel, one thread per element of `out`.
fn pool_dispatch(
    ex: &mut Exec,
    kernel: &str,
    g: &Geom,
    mode: u32,
    out: &DTensor,
    a: &DTensor,
    b: &DTensor,
) -> Result<()> {
    let p = blk::Pool {
        w: window(g),
        channels: g.cin as u32,
        mode,
    };
    let pipe = pipelines::family(ex.ctx, "pool", kernel, tag(out.dtype)?)?;
    ex.dispatch(
        pipe,
        &[(1, out), (2, a), (3, b)],
        Params::of(&p),
        grid(out.numel()),
    )?;
    Ok(())
}

pub(super) fn pool(ex: &mut Exec, i: usize, spec: &PoolSpec) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let x = ex.dev(ins[0])?;
    let g = spec.geom(&x.shape)?;
    // A thread walks its whole window (twice for the gradient).
    if 2 * g.kk() > LOOP_BUDGET {
        return ex.on_host(i);
    }
    let out = ex.alloc(&g.y_shape, x.dtype, i)?;
    pool_dispatch(ex, "pool_fwd", &g, pool_mode(spec.kind), &out, &x, &x)?;
    Ok(Slot::dev(out))
}

pub(super) fn pool_grad(ex: &mut Exec, i: usize, spec: &PoolSpec) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let (x, gy) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
    let g = spec.geom(&x.shape)?;
    // A thread walks its whole window (twice for the gradient).
    if 2 * g.kk() > LOOP_BUDGET {
        return ex.on_host(i);
    }
    if gy.shape != g.y_shape {
        return Err(value_err!(
            "pool_grad: gradient shape {:?} does not match the pooled shape {:?}",
            gy.shape,
            g.y_shape
        ));
    }
    let out = ex.alloc(&x.shape, x.dtype, i)?;
    pool_dispatch(ex, "pool_grad", &g, pool_mode(spec.kind), &out, &x, &gy)?;
    Ok(Slot::dev(out))
}

pub(super) fn pool_select(ex: &mut Exec, i: usize, spec: &PoolSpec) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let (x, h) = (ex.dev(ins[0])?, ex.dev(ins[1])?);
    let g = spec.geom(&x.shape)?;
    // A thread walks its whole window (twice for the gradient).
    if 2 * g.kk() > LOOP_BUDGET {
        return ex.on_host(i);
    }
    if h.shape != x.shape {
        return Err(value_err!(
            "pool_select: shapes {:?} and {:?} differ",
            h.shape,
            x.shape
        ));
    }
    let out = ex.alloc(&g.y_shape, x.dtype, i)?;
    match spec.kind {
        // h at each window's first maximum of x.
        PoolKind::Max => pool_dispatch(ex, "pool_fwd", &g, 2, &out, &x, &h)?,
        // The average pool of h.
        PoolKind::Avg => pool_dispatch(ex, "pool_fwd", &g, 1, &out, &h, &h)?,
    }
    Ok(Slot::dev(out))
}
