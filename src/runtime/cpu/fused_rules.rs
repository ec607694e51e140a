//! Optimizer update rules recognised in fusion groups, run with every value in registers.
//!
//! The fusion kernel runs a group one instruction at a time over chunks, storing each
//! result; for the long chains of an optimizer update (Keras' RMSprop: 10 instructions per
//! element, Adam: 13) those stores are most of the time (measured 0.97 ns per element of
//! an RMSprop group on one core, ~3 cycles). TensorFlow has kernels for such updates
//! (`ApplyRMSProp`, `ApplyAdam`); here the same arithmetic is recognised in the group's
//! graph, whatever built it:
//!
//! - RMSprop: `a' = s1*a + s2*square(g)`, `p' = p - (lr*g) / (sqrt(max(a', z)) + eps)`;
//! - Adam: `m' = b1*m + c1*g`, `v' = b2*v + c2*square(g)`,
//!   `p' = p - (lr*m') / (sqrt(max(v', z)) + eps)`;
//!
//! with `s1, s2, lr, z, eps, b1, c1, b2, c2` single values (any values; `sqrt(max(x, z))`
//! is `K.sqrt`, which clips at 0).
//! Products and sums may come in either operand order (they commute exactly in IEEE
//! arithmetic); every other operation is evaluated as the graph has it, one rounding per
//! operation, so the results are bitwise those of the instruction-by-instruction kernel.

use crate::compile::fuse::Group;
use crate::compile::Plan;
use crate::ops::{BinaryOp, FusedOp, GpuKind, UnaryOp};

/// Lanes evaluated together (kept in local arrays the compiler holds in vector registers).
const L: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    RmsProp,
    Adam,
}

/// A group recognised as an update rule.
#[derive(Debug)]
pub struct Special {
    pub rule: Rule,
    /// Same-size f32 inputs (indices among the group's in-place inputs): RMSprop `[p, g, a]`,
    /// Adam `[p, g, m, v]`.
    pub vecs: Vec<u16>,
    /// Single values (indices into the call's scalars): RMSprop `[s1, s2, lr, eps]`,
    /// Adam `[b1, c1, b2, c2, lr, eps]`.
    pub scals: Vec<u16>,
    /// The value `sqrt`'s input is clipped at (`max(x, z)`, NaN in `x` kept).
    pub zero: u16,
    /// For each result of the rule (RMSprop `[a', p']`, Adam `[m', v', p']`), the index of
    /// the group output it is.
    pub outs: Vec<usize>,
}

/// What a group member or input is, for matching.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Leaf {
    /// A same-size f32 input read in place (its index among those inputs).
    Vec(u16),
    /// A single value (index into the call's scalars).
    Scal(u16),
    /// A member computed per element.
    Member,
}

struct Matcher<'a> {
    plan: &'a Plan,
    g: &'a Group,
    /// Leaf kind of each plan slot the group reads or computes.
    leaf: &'a dyn Fn(usize) -> Option<Leaf>,
    /// Members matched so far.
    used: Vec<usize>,
}

impl<'a> Matcher<'a> {
    fn is_member(&self, j: usize) -> bool {
        self.g.members.contains(&j)
    }

    /// `(op, inputs)` of member `j`, if it is a per-element member.
    fn op(&self, j: usize) -> Option<(FusedOp, &'a [usize])> {
        if !self.is_member(j) || (self.leaf)(j) != Some(Leaf::Member) {
            return None;
        }
        match self.plan.nodes[j].op().gpu_kind() {
            GpuKind::Fused(f) => Some((f, &self.plan.inputs[j])),
            _ => None,
        }
    }

    fn bin(&mut self, j: usize, b: BinaryOp) -> Option<(usize, usize)> {
        match self.op(j)? {
            (FusedOp::Binary(x), [l, r]) if x == b => {
                self.used.push(j);
                Some((*l, *r))
            }
            _ => None,
        }
    }

    fn un(&mut self, j: usize, u: UnaryOp) -> Option<usize> {
        match self.op(j)? {
            (FusedOp::Unary(x), [a]) if x == u => {
                self.used.push(j);
                Some(*a)
            }
            _ => None,
        }
    }

    fn vec(&self, j: usize) -> Option<u16> {
        match (self.leaf)(j)? {
            Leaf::Vec(e) => Some(e),
            _ => None,
        }
    }

    fn scal(&self, j: usize) -> Option<u16> {
        match (self.leaf)(j)? {
            Leaf::Scal(k) => Some(k),
            _ => None,
        }
    }

    /// `s * x` in either order: `(s, x)`.
    fn scaled(&mut self, j: usize) -> Option<(u16, usize)> {
        let (l, r) = self.bin(j, BinaryOp::Mul)?;
        match (self.scal(l), self.scal(r)) {
            (Some(s), None) => Some((s, r)),
            (None, Some(s)) => Some((s, l)),
            _ => {
                self.used.pop();
                None
            }
        }
    }

    /// `s1*x + s2*y` in any order of sum and products, `x` a vector input: `(s1, x, s2, y)`
    /// with `x` as its index among the vector inputs.
    fn lincomb(&mut self, j: usize) -> Option<(u16, u16, u16, usize)> {
        let (l, r) = self.bin(j, BinaryOp::Add)?;
        for (a, b) in [(l, r), (r, l)] {
            let mark = self.used.len();
            if let (Some((s1, x)), Some((s2, y))) = (self.scaled(a), self.scaled(b)) {
                if let Some(x) = self.vec(x) {
                    return Some((s1, x, s2, y));
                }
            }
            self.used.truncate(mark);
        }
        self.used.pop();
        None
    }

    /// `p - (lr*n) / (sqrt(max(d, z)) + eps)`: `(p, lr, n, d, eps, z)`.
    #[allow(clippy::type_complexity)]
    fn step(&mut self, j: usize) -> Option<(u16, u16, usize, usize, u16, u16)> {
        let (p, q) = self.bin(j, BinaryOp::Sub)?;
        let p = self.vec(p)?;
        let (num, den) = self.bin(q, BinaryOp::Div)?;
        let (lr, n) = self.scaled(num)?;
        let (l, r) = self.bin(den, BinaryOp::Add)?;
        let (root, eps) = match (self.scal(l), self.scal(r)) {
            (None, Some(e)) => (l, e),
            (Some(e), None) => (r, e),
            _ => return None,
        };
        let inner = self.un(root, UnaryOp::Sqrt)?;
        let (d, z) = self.bin(inner, BinaryOp::Maximum)?;
        Some((p, lr, n, d, eps, self.scal(z)?))
    }
}

/// Recognises an update rule in group `g`; `leaf` classifies the slots it reads.
pub fn detect(plan: &Plan, g: &Group, leaf: &dyn Fn(usize) -> Option<Leaf>) -> Option<Special> {
    let mut m = Matcher {
        plan,
        g,
        leaf,
        used: Vec::new(),
    };
    let pos = |o: usize| g.outputs.iter().position(|&x| x == o);
    let done = |m: &Matcher<'_>| {
        let mut u = m.used.clone();
        u.sort_unstable();
        u.dedup();
        u.len() == g.members.len()
    };
    match g.outputs.len() {
        2 => {
            // RMSprop: the step's denominator reads a'.
            for &po in &g.outputs {
                m.used.clear();
                let Some((p, lr, n, ao, eps, z)) = m.step(po) else {
                    continue;
                };
                if pos(ao).is_none() {
                    continue;
                }
                let Some((s1, a, s2, sq)) = m.lincomb(ao) else {
                    continue;
                };
                let Some(gs) = m.un(sq, UnaryOp::Square) else {
                    continue;
                };
                let Some(gv) = m.vec(gs) else { continue };
                if m.vec(n) != Some(gv) || !done(&m) {
                    continue;
                }
                return Some(Special {
                    rule: Rule::RmsProp,
                    vecs: vec![p, gv, a],
                    scals: vec![s1, s2, lr, eps],
                    zero: z,
                    outs: vec![pos(ao)?, pos(po)?],
                });
            }
            None
        }
        3 => {
            // Adam: the step's numerator reads m', its denominator v'.
            for &po in &g.outputs {
                m.used.clear();
                let Some((p, lr, mo, vo, eps, z)) = m.step(po) else {
                    continue;
                };
                if pos(mo).is_none() || pos(vo).is_none() || mo == vo {
                    continue;
                }
                let Some((b1, mv, c1, g1)) = m.lincomb(mo) else {
                    continue;
                };
                let Some((b2, vv, c2, sq)) = m.lincomb(vo) else {
                    continue;
                };
                let Some(g2) = m.un(sq, UnaryOp::Square) else {
                    continue;
                };
                let Some(gv) = m.vec(g1) else { continue };
                if m.vec(g2) != Some(gv) || !done(&m) {
                    continue;
                }
                return Some(Special {
                    rule: Rule::Adam,
                    vecs: vec![p, gv, mv, vv],
                    scals: vec![b1, c1, b2, c2, lr, eps],
                    zero: z,
                    outs: vec![pos(mo)?, pos(vo)?, pos(po)?],
                });
            }
            None
        }
        _ => None,
    }
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
pub unsafe fn run(
    sp: &Special,
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
