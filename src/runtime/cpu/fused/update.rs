//! The update-rule kernel: runs a group the compiler recognised as an optimizer update
//! (`compile::update_rule`) with every value in registers, 16 lanes at a time, instead of
//! one stored instruction result at a time. Same arithmetic, same rounding, so the results
//! are bitwise those of the group's ordinary program.

use super::Opd;
use crate::compile::fuse::Group;
use crate::compile::update_rule::{Rule, Update};

/// Lanes evaluated together (kept in local arrays the compiler holds in vector registers).
const L: usize = 16;

/// An `Update` lowered onto a group's program for one input layout.
#[derive(Debug)]
pub(super) struct UpdateKernel {
    pub(super) rule: Rule,
    /// Same-size f32 inputs (indices among the group's in-place inputs, `Opd::Ext`).
    pub(super) vecs: Vec<u16>,
    /// Single values (indices into the call's scalars, `Opd::Scal`).
    pub(super) scals: Vec<u16>,
    /// The value `sqrt`'s input is clipped at.
    pub(super) zero: u16,
    /// For each result of the rule, the index of the group output it is.
    pub(super) outs: Vec<usize>,
}

/// `u` lowered onto the operands `inputs` the program reads its external inputs through
/// (per `Group::ext`), or `None` when the run's shapes do not suit the rule's kernel: a
/// per-element input that is not read in place, or a single value that is not single.
pub(super) fn lower(u: &Update, g: &Group, inputs: &[Opd]) -> Option<UpdateKernel> {
    let opd = |j: usize| g.ext.iter().position(|&x| x == j).map(|e| inputs[e]);
    let vec = |j: usize| match opd(j)? {
        Opd::Ext(x) => Some(x),
        Opd::Reg(_) | Opd::Scal(_) | Opd::Out(_) | Opd::Tile(_) => None,
    };
    let scal = |j: usize| match opd(j)? {
        Opd::Scal(k) => Some(k),
        Opd::Reg(_) | Opd::Ext(_) | Opd::Out(_) | Opd::Tile(_) => None,
    };
    Some(UpdateKernel {
        rule: u.rule,
        vecs: u.vecs.iter().map(|&j| vec(j)).collect::<Option<_>>()?,
        scals: u.scals.iter().map(|&j| scal(j)).collect::<Option<_>>()?,
        zero: scal(u.zero)?,
        outs: u.outs.clone(),
    })
}

#[inline(always)]
fn maximum(a: f32, b: f32) -> f32 {
    // As `BinaryOp::Maximum`: NaN in `a` propagates.
    if a >= b || a.is_nan() {
        a
    } else {
        b
    }
}

#[inline(always)]
unsafe fn load(p: *const f32, i: usize) -> [f32; L] {
    std::ptr::read_unaligned(p.add(i) as *const [f32; L])
}

#[inline(always)]
unsafe fn store(p: *mut f32, i: usize, v: [f32; L]) {
    std::ptr::write_unaligned(p.add(i) as *mut [f32; L], v)
}

/// Elements `[off, off + len)` of the rule: reads `vecs`, writes `outs` (which may be the
/// buffers of inputs: each block is read before it is written).
///
/// # Safety
/// Every pointer addresses at least `off + len` f32s.
#[inline(always)]
pub(super) unsafe fn run(
    sp: &UpdateKernel,
    vecs: &[*const f32],
    scal: &[f32],
    outs: &[*mut f32],
    off: usize,
    len: usize,
) {
    let s = |k: usize| scal[sp.scals[k] as usize];
    let z = scal[sp.zero as usize];
    let root = |d: f32| maximum(d, z).sqrt();
    let v = |k: usize| vecs[sp.vecs[k] as usize].add(off);
    let o = |k: usize| outs[sp.outs[k]].add(off);
    let full = len / L * L;
    match sp.rule {
        Rule::RmsProp => {
            let (s1, s2, lr, eps) = (s(0), s(1), s(2), s(3));
            let (p, g, a, ao, po) = (v(0), v(1), v(2), o(0), o(1));
            let one = |p: f32, g: f32, a: f32| {
                let an = s1 * a + s2 * (g * g);
                (an, p - (lr * g) / (root(an) + eps))
            };
            let mut i = 0;
            while i < full {
                let (pa, ga, aa) = (load(p, i), load(g, i), load(a, i));
                let (mut an, mut pn) = ([0f32; L], [0f32; L]);
                for l in 0..L {
                    (an[l], pn[l]) = one(pa[l], ga[l], aa[l]);
                }
                store(ao, i, an);
                store(po, i, pn);
                i += L;
            }
            for i in full..len {
                let (an, pn) = one(*p.add(i), *g.add(i), *a.add(i));
                (*ao.add(i), *po.add(i)) = (an, pn);
            }
        }
        Rule::Adam => {
            let (b1, c1, b2, c2, lr, eps) = (s(0), s(1), s(2), s(3), s(4), s(5));
            let (p, g, m, vv, mo, vo, po) = (v(0), v(1), v(2), v(3), o(0), o(1), o(2));
            let one = |p: f32, g: f32, m: f32, v: f32| {
                let mn = b1 * m + c1 * g;
                let vn = b2 * v + c2 * (g * g);
                (mn, vn, p - (lr * mn) / (root(vn) + eps))
            };
            let mut i = 0;
            while i < full {
                let (pa, ga, ma, va) = (load(p, i), load(g, i), load(m, i), load(vv, i));
                let (mut mn, mut vn, mut pn) = ([0f32; L], [0f32; L], [0f32; L]);
                for l in 0..L {
                    (mn[l], vn[l], pn[l]) = one(pa[l], ga[l], ma[l], va[l]);
                }
                store(mo, i, mn);
                store(vo, i, vn);
                store(po, i, pn);
                i += L;
            }
            for i in full..len {
                let (mn, vn, pn) = one(*p.add(i), *g.add(i), *m.add(i), *vv.add(i));
                (*mo.add(i), *vo.add(i), *po.add(i)) = (mn, vn, pn);
            }
        }
    }
}
