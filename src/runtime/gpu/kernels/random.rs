//! The GPU lowering of the random draws (`ops::random`): Philox over `shaders/random.wgsl`.

use super::super::exec::{grid, Exec, Slot};
use super::super::params::{self as blk, Params};
use super::super::pipelines::{self};
use super::{shape_value, tag};
use crate::base::error::Result;
use crate::ops::random::{self, RandomState};
use crate::value_err;

pub(super) fn random(ex: &mut Exec, i: usize, st: &RandomState) -> Result<Slot> {
    let plan = ex.plan;
    let ins = &plan.inputs[i];
    let node = &plan.nodes[i];
    let name = ex.plan.nodes[i].op().name();
    let dims: Vec<usize> = shape_value(ex, ins[0], &name)?
        .iter()
        .map(|&d| {
            if d < 0 {
                Err(value_err!("{name}: negative dimension {d}"))
            } else {
                Ok(d as usize)
            }
        })
        .collect::<Result<_>>()?;
    let n: usize = dims.iter().product();
    let (key, call) = random::next_call(st);
    let dist = match st.dist {
        random::RandomDist::Uniform => 0,
        random::RandomDist::Normal => 1,
        random::RandomDist::TruncatedNormal => 2,
    };
    let out = ex.alloc(&dims, node.dtype(), i)?;
    let pipe = pipelines::family(ex.ctx, "random", "random", tag(node.dtype())?)?;
    let params = blk::Random {
        n: n as u32,
        key0: key[0],
        key1: key[1],
        call_lo: call as u32,
        call_hi: (call >> 32) as u32,
        dist,
    };
    ex.dispatch(pipe, &[(1, &out)], Params::of(&params), grid(n))?;
    Ok(Slot::dev(out))
}
