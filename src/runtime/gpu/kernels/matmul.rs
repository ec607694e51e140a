//! The GPU lowering of the batched matrix product (`ops::matmul`) over `shaders/matmul.wgsl`.

use super::super::exec::{Exec, Slot};
use super::super::params::{self as blk, Params};
use super::super::pipelines::{self};
use super::super::{fusion, DTensor};
use super::{consumed, max_groups, split_grid, tag};
use crate::base::error::Result;
use crate::compile::fuse::Group;

/// Records the product node `i`, with group `then` as its epilogue where it can
/// (`kernels::record_then`): the product's slot, holding only its shape when the epilogue
/// ran.
pub(super) fn matmul(
    ex: &mut Exec,
    i: usize,
    ta: bool,
    tb: bool,
    then: Option<&Group>,
) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let a = ex.dev(ins[0])?;
    let b = ex.dev(ins[1])?;
    let (sa, sb) = (a.shape.clone(), b.shape.clone());
    let (ra, rb) = (sa.len(), sb.len());
    let (m, ka, n, bshape) = crate::ops::matmul::runtime_dims(ta, tb, &sa, &sb)?;
    let batches: usize = bshape.iter().product();
    let mut shape = bshape.clone();
    shape.extend([m, n]);
    // An epilogue needs the whole sum in one dispatch (one slice of K).
    let epi = match then {
        Some(g) if ka <= MATMUL_K_STEP => fusion::epilogue(ex, g, i, &shape, 4)?,
        Some(_) | None => None,
    };
    let out = match epi {
        Some(_) => None,
        None => Some(ex.alloc(&shape, a.dtype, i)?),
    };
    let bstrides = |own: &[usize], mat: usize| -> Vec<u32> {
        let lead = bshape.len() - own.len();
        let mut st = vec![0u32; bshape.len()];
        let mut acc = mat;
        for d in (0..own.len()).rev() {
            st[lead + d] = if own[d] == 1 { 0 } else { acc as u32 };
            acc *= own[d];
        }
        st
    };
    let (a_cols, b_cols) = (sa[ra - 1], sb[rb - 1]);
    let (a_rs, a_cs) = if ta { (1, a_cols) } else { (a_cols, 1) };
    let (b_rs, b_cs) = if tb { (1, b_cols) } else { (b_cols, 1) };
    // vec4 loads along each operand's contiguous dimension when it is a multiple of 4
    // (then every vec4 and every batch offset is 16-byte aligned).
    let a_v4 = if ta { m % 4 == 0 } else { ka % 4 == 0 };
    let b_v4 = if tb { ka % 4 == 0 } else { n % 4 == 0 };
    let block = blk::Matmul {
        m: m as u32,
        n: n as u32,
        k: ka as u32,
        batch_rank: bshape.len() as u32,
        a_rs: a_rs as u32,
        a_cs: a_cs as u32,
        b_rs: b_rs as u32,
        b_cs: b_cs as u32,
        vec4: a_v4 as u32 | (b_v4 as u32) << 1,
        ta: ta as u32,
        tb: tb as u32,
        ..blk::Matmul::default()
    };
    let mut tail: Vec<u32> = bshape.iter().map(|&d| d as u32).collect();
    tail.extend(bstrides(&sa[..ra - 2], sa[ra - 2] * sa[ra - 1]));
    tail.extend(bstrides(&sb[..rb - 2], sb[rb - 2] * sb[rb - 1]));
    let pipe = match &epi {
        Some(e) => {
            let t = tag(a.dtype)?;
            let module = || pipelines::family_source("matmul", t, ex.ctx.has_f16);
            e.pipeline(ex, module, &format!("matmul_{t}"))?
        }
        None => pipelines::family(ex.ctx, "matmul", "matmul", tag(a.dtype)?)?,
    };
    let (a4, b4) = (a.as_vec4(), b.as_vec4());
    let mut bufs: Vec<(u32, &DTensor)> = vec![(2, &a), (3, &b), (5, &a4), (6, &b4)];
    match (&out, &epi) {
        (Some(out), _) => bufs.push((1, out)),
        (None, Some(e)) => bufs.extend(e.bufs.iter().map(|(b, t)| (*b, t))),
        (None, None) => unreachable!("a product has a result or an epilogue"),
    }
    let tiles = [n.div_ceil(64), m.div_ceil(64), batches];
    for (first, groups) in split_grid(tiles, max_groups(ex)) {
        // The first slice of K writes the output, the others add to it; K = 0 writes zeros.
        for k0 in (0..ka.max(1)).step_by(MATMUL_K_STEP) {
            let block = blk::Matmul {
                col_tile0: first[0] as u32,
                row_tile0: first[1] as u32,
                batch0: first[2] as u32,
                k_lo: k0 as u32,
                k_hi: (k0 + MATMUL_K_STEP) as u32,
                add: (k0 > 0) as u32,
                ..block
            };
            let p = Params::with_tail(&block, &tail);
            let rw = epi.as_ref().map_or(&[][..], |e| &e.rw[..]);
            ex.dispatch_rw(pipe.clone(), &bufs, p, groups, rw)?;
        }
    }
    drop(bufs);
    match (out, epi) {
        (Some(out), _) => Ok(Slot::dev(out)),
        (None, Some(e)) => {
            e.finish(ex);
            Ok(consumed(shape, a.dtype))
        }
        (None, None) => unreachable!("a product has a result or an epilogue"),
    }
}

/// The slice of the contracted dim one matmul dispatch sums (a multiple of its 16-deep
/// tiles): 2048 tiles of at most 25 loop iterations each stay under the 65535 loop
/// iterations after which llvmpipe ends a shader.
pub(super) const MATMUL_K_STEP: usize = 32768;
