//! Optimizer update rules recognised in fusion groups at compile time (`Item::Update`).
//!
//! The CPU fusion kernel runs a group one instruction at a time over chunks, storing each
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
//!
//! A single value is an f32 input whose static shape holds one element; a per-element
//! value is any other f32 input. The CPU runtime lowers an `Update` onto the program it
//! compiles for the run's shapes and runs the rule's kernel only when the per-element
//! inputs are read in place (same size as the outputs) and the single values are single;
//! otherwise the group's ordinary program runs, with the same results.

use super::fuse::{Group, Item};
use super::Plan;
use crate::base::dtype::DType;
use crate::ops::{BinaryOp, Class, FusedOp, UnaryOp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    RmsProp,
    Adam,
}

/// A fused group recognised as an optimizer update rule.
#[derive(Debug)]
pub struct Update {
    pub group: Group,
    pub rule: Rule,
    /// Per-element inputs (plan slots, all in `group.ext`): RMSprop `[p, g, a]`,
    /// Adam `[p, g, m, v]`.
    pub vecs: Vec<usize>,
    /// Single-value inputs (plan slots, all in `group.ext`): RMSprop `[s1, s2, lr, eps]`,
    /// Adam `[b1, c1, b2, c2, lr, eps]`.
    pub scals: Vec<usize>,
    /// The single value `sqrt`'s input is clipped at (`max(x, z)`, NaN in `x` kept).
    pub zero: usize,
    /// For each result of the rule (RMSprop `[a', p']`, Adam `[m', v', p']`), its index in
    /// `group.outputs`.
    pub outs: Vec<usize>,
}

/// What a slot a group reads or computes is, for matching.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Leaf {
    /// A per-element f32 input.
    Vec,
    /// A single f32 value.
    Scal,
    /// A member of the group.
    Member,
    /// Anything else (an input of another dtype).
    Other,
}

struct Matcher<'a> {
    plan: &'a Plan,
    g: &'a Group,
    /// Members matched so far.
    used: Vec<usize>,
}

impl<'a> Matcher<'a> {
    fn leaf(&self, j: usize) -> Leaf {
        let node = &self.plan.nodes[j];
        if self.g.members.contains(&j) {
            Leaf::Member
        } else if node.dtype() != DType::F32 {
            Leaf::Other
        } else if node
            .shape()
            .to_known()
            .is_some_and(|s| s.iter().product::<usize>() == 1)
        {
            Leaf::Scal
        } else {
            Leaf::Vec
        }
    }

    /// `(op, inputs)` of member `j`, if it is a member.
    fn op(&self, j: usize) -> Option<(FusedOp, &'a [usize])> {
        if self.leaf(j) != Leaf::Member {
            return None;
        }
        match self.plan.nodes[j].op().class() {
            Class::Elementwise(f) => Some((f, &self.plan.inputs[j])),
            Class::Source | Class::Meta | Class::View(_) | Class::Kernel | Class::Host => None,
        }
    }

    fn bin(&mut self, j: usize, b: BinaryOp) -> Option<(usize, usize)> {
        let (FusedOp::Binary(x), &[l, r]) = self.op(j)? else {
            return None;
        };
        (x == b).then(|| {
            self.used.push(j);
            (l, r)
        })
    }

    fn un(&mut self, j: usize, u: UnaryOp) -> Option<usize> {
        let (FusedOp::Unary(x), &[a]) = self.op(j)? else {
            return None;
        };
        (x == u).then(|| {
            self.used.push(j);
            a
        })
    }

    fn vec(&self, j: usize) -> Option<usize> {
        (self.leaf(j) == Leaf::Vec).then_some(j)
    }

    fn scal(&self, j: usize) -> Option<usize> {
        (self.leaf(j) == Leaf::Scal).then_some(j)
    }

    /// `s * x` in either order: `(s, x)`.
    fn scaled(&mut self, j: usize) -> Option<(usize, usize)> {
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

    /// `s1*x + s2*y` in any order of sum and products, `x` a per-element input:
    /// `(s1, x, s2, y)`.
    fn lincomb(&mut self, j: usize) -> Option<(usize, usize, usize, usize)> {
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
    fn step(&mut self, j: usize) -> Option<(usize, usize, usize, usize, usize, usize)> {
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

    /// Whether every member has been matched.
    fn done(&self) -> bool {
        let mut u = self.used.clone();
        u.sort_unstable();
        u.dedup();
        u.len() == self.g.members.len()
    }
}

/// The rule group `g` computes, if it is one: `(rule, vecs, scals, zero, outs)` as in
/// `Update`. Groups with folds are not rules.
#[allow(clippy::type_complexity)]
fn detect(plan: &Plan, g: &Group) -> Option<(Rule, Vec<usize>, Vec<usize>, usize, Vec<usize>)> {
    if !g.folds.is_empty() || !g.hidden.is_empty() {
        return None;
    }
    let mut m = Matcher {
        plan,
        g,
        used: Vec::new(),
    };
    let pos = |o: usize| g.outputs.iter().position(|&x| x == o);
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
                if m.vec(n) != Some(gv) || !m.done() {
                    continue;
                }
                let outs = vec![pos(ao)?, pos(po)?];
                return Some((
                    Rule::RmsProp,
                    vec![p, gv, a],
                    vec![s1, s2, lr, eps],
                    z,
                    outs,
                ));
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
                if m.vec(g2) != Some(gv) || !m.done() {
                    continue;
                }
                let outs = vec![pos(mo)?, pos(vo)?, pos(po)?];
                let scals = vec![b1, c1, b2, c2, lr, eps];
                return Some((Rule::Adam, vec![p, gv, mv, vv], scals, z, outs));
            }
            None
        }
        _ => None,
    }
}

/// Group `g` as an `Item::Update` when it computes an update rule, else as an `Item::Group`.
pub fn recognise(plan: &Plan, g: Group) -> Item {
    match detect(plan, &g) {
        Some((rule, vecs, scals, zero, outs)) => Item::Update(Box::new(Update {
            group: g,
            rule,
            vecs,
            scals,
            zero,
            outs,
        })),
        None => Item::Group(g),
    }
}
