//! The per-channel affine kernel: runs a group whose program is batch norm's output,
//! `act((x - a) * s + b [+ r])` with `a`, `s`, `b` repeating with one period (per-channel
//! values) and `act` nothing, `relu` or `relu` then `minimum(·, c)` (relu6), as one loop
//! with every value in registers, instead of one stored instruction result at a time. The
//! per-element code is the op tables' (`BinaryOp::zip`, `UnaryOp::map` on constant ops),
//! so the results are bitwise those of the group's ordinary program. A chunk program of
//! these five instructions costs ~0.3-0.4 ns an element on one Zen 4 thread with its data
//! in cache, one loop ~0.1.

use super::exec::{binary_scalar, unary_scalar};
use super::{Ins, Opd, Out, OUT_BASE};
use crate::ops::{BinaryOp, UnaryOp};

/// A group's program recognised as a per-channel affine chain, for one input layout.
#[derive(Debug)]
pub(super) struct AffineKernel {
    /// The same-size input `x` (an `Opd::Ext` index).
    x: u16,
    /// The subtracted, multiplying and added per-channel values (`Opd::Tile` indices).
    tiles: [u16; 3],
    /// A same-size input added after the shift (a residual), if any.
    residual: Option<u16>,
    relu: bool,
    /// The single value the relu's result is capped at (`Opd::Scal` index), if any.
    cap: Option<u16>,
}

/// `prog` (allocated; the group's only output `out`) as an affine chain, if it is one:
/// `Sub(x, a)`, `Mul(·, s)`, `Add(·, b)`, then optionally `Add(·, r)`, `Relu`,
/// `Minimum(·, c)`, each instruction reading the one before, the last writing the output.
pub(super) fn recognise(prog: &[Ins], outs: &[Out]) -> Option<AffineKernel> {
    let [Out::F32(out)] = outs else { return None };
    let mut it = prog.iter().copied().peekable();
    let Some(Ins::Binary(BinaryOp::Sub, Opd::Ext(x), Opd::Tile(a), mut prev)) = it.next() else {
        return None;
    };
    // The other operand of a step whose first operand is the value before (operand order
    // kept, so even a NaN's payload is the program's).
    let other = |p: u16, u: Opd, v: Opd| match (u, v) {
        (Opd::Reg(r), o) if r == p => Some(o),
        _ => None,
    };
    let Some(Ins::Binary(BinaryOp::Mul, u, v, d)) = it.next() else {
        return None;
    };
    let Opd::Tile(s) = other(prev, u, v)? else {
        return None;
    };
    prev = d;
    let Some(Ins::Binary(BinaryOp::Add, u, v, d)) = it.next() else {
        return None;
    };
    let Opd::Tile(b) = other(prev, u, v)? else {
        return None;
    };
    prev = d;
    let mut k = AffineKernel {
        x,
        tiles: [a, s, b],
        residual: None,
        relu: false,
        cap: None,
    };
    if let Some(Ins::Binary(BinaryOp::Add, u, v, d)) = it.peek().copied() {
        let Opd::Ext(r) = other(prev, u, v)? else {
            return None;
        };
        (k.residual, prev) = (Some(r), d);
        it.next();
    }
    if let Some(Ins::Unary(UnaryOp::Relu, Opd::Reg(r), d)) = it.peek().copied() {
        if r != prev {
            return None;
        }
        (k.relu, prev) = (true, d);
        it.next();
        if let Some(Ins::Binary(BinaryOp::Minimum, Opd::Reg(r), Opd::Scal(c), d)) = it.next() {
            if r != prev {
                return None;
            }
            (k.cap, prev) = (Some(c), d);
        }
    }
    // Nothing after the chain, whose last value is the output (written directly or copied
    // from its register).
    let last = match *out {
        Opd::Out(0) => OUT_BASE,
        Opd::Reg(r) => r,
        _ => return None,
    };
    (it.next().is_none() && prev == last).then_some(k)
}

/// Elements `[start, end)` of the chain: reads `ext`, `tiles` and `scal`, writes `out`
/// (which may be `x`'s or the residual's buffer: each element is read before it is
/// written).
///
/// # Safety
/// `ext` and `out` address at least `end` f32s; each tile holds one period from its start.
#[inline(always)]
pub(super) unsafe fn run(
    ak: &AffineKernel,
    ext: &[*const f32],
    tiles: &[(*const f32, usize)],
    scal: &[f32],
    out: *mut f32,
    start: usize,
    end: usize,
) {
    let x = ext[ak.x as usize];
    let [a, s, b] = ak.tiles.map(|t| tiles[t as usize].0);
    let period = tiles[ak.tiles[0] as usize].1;
    let r = ak.residual.map(|e| ext[e as usize]);
    let cap = ak.cap.map(|c| scal[c as usize]);
    match (r, ak.relu, cap) {
        (None, false, _) => {
            rows::<false, false, false>(x, [a, s, b], x, 0.0, out, period, start, end)
        }
        (None, true, None) => {
            rows::<false, true, false>(x, [a, s, b], x, 0.0, out, period, start, end)
        }
        (None, true, Some(c)) => {
            rows::<false, true, true>(x, [a, s, b], x, c, out, period, start, end)
        }
        (Some(r), false, _) => {
            rows::<true, false, false>(x, [a, s, b], r, 0.0, out, period, start, end)
        }
        (Some(r), true, None) => {
            rows::<true, true, false>(x, [a, s, b], r, 0.0, out, period, start, end)
        }
        (Some(r), true, Some(c)) => {
            rows::<true, true, true>(x, [a, s, b], r, c, out, period, start, end)
        }
    }
}

/// The chain over `[start, end)`, one run of the period at a time (a run's per-channel
/// values are contiguous, so the loop vectorises without an index modulo).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn rows<const RES: bool, const RELU: bool, const CAP: bool>(
    x: *const f32,
    t: [*const f32; 3],
    r: *const f32,
    c: f32,
    out: *mut f32,
    period: usize,
    start: usize,
    end: usize,
) {
    let mut i = start;
    let mut j = start % period;
    while i < end {
        let run = (period - j).min(end - i);
        for q in 0..run {
            let (e, p) = (i + q, j + q);
            let mut y = binary_scalar(BinaryOp::Sub, *x.add(e), *t[0].add(p));
            y = binary_scalar(BinaryOp::Mul, y, *t[1].add(p));
            y = binary_scalar(BinaryOp::Add, y, *t[2].add(p));
            if RES {
                y = binary_scalar(BinaryOp::Add, y, *r.add(e));
            }
            if RELU {
                y = unary_scalar(UnaryOp::Relu, y);
            }
            if CAP {
                y = binary_scalar(BinaryOp::Minimum, y, c);
            }
            *out.add(e) = y;
        }
        i += run;
        j = 0;
    }
}
