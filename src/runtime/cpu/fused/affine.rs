//! Batch norm's kernels: groups whose programs are batch norm's output or the gradient of
//! a relu or relu6 after it, run as one loop with every value in registers instead of one
//! stored instruction result at a time. The output is `act((x - a) * s + b [+ r])` with
//! `a`, `s`, `b` repeating with one period (per-channel values) and `act` nothing, `relu`
//! or `relu` then `minimum(·, c)` (relu6); the relu6 gradient recomputes that output `y`
//! and writes `gm = y > z ? (relu(y) <= c ? g : z1) : z2` and `gm * (x - a)` (whose sums
//! its folds take), the relu gradient `gm = y > z ? g : z1` and the same product. The
//! per-element code is the op tables' (`BinaryOp::zip`, `UnaryOp::map` on constant ops),
//! so the results are bitwise those of the group's ordinary program. A chunk program of
//! the output's five instructions costs ~0.3-0.4 ns an element on one Zen 4 thread with
//! its data in cache, one loop ~0.1.

use super::exec::{binary_scalar, unary_scalar};
use super::{Ins, Opd, Out, OUT_BASE};
use crate::ops::{BinaryOp, UnaryOp};

/// A group's program recognised as one of batch norm's kernels, for one input layout.
#[derive(Debug)]
pub(super) enum BnKernel {
    Affine(AffineKernel),
    ReluGrad(ReluGrad),
}

/// The gradient of a relu or relu6 after batch norm (see the module comment), its operands
/// as the program reads them: `x` and `g` same-size inputs, `a`, `s`, `b` per-channel tiles,
/// the single values `z`, `z1` and, for relu6, `(c, z2)`; the output slots of `gm` (where
/// the group writes it) and of `gm * (x - a)`.
#[derive(Debug)]
pub(super) struct ReluGrad {
    x: u16,
    g: u16,
    tiles: [u16; 3],
    z: u16,
    z1: u16,
    cap: Option<(u16, u16)>,
    pub(super) gm_out: Option<usize>,
    pub(super) prod_out: usize,
}

/// `prog` (in virtual registers, before outputs are written directly: instruction `k`
/// writes register `k`) as a relu or relu6 gradient, with `outs` its written outputs.
pub(super) fn recognise_relu_grad(prog: &[Ins], outs: &[Out]) -> Option<ReluGrad> {
    use BinaryOp::{Add, Greater, LessEqual, Mul, Sub};
    use Ins::{Binary as Bin, Select as Sel, Unary as Un};
    use Opd::{Ext, Reg, Scal, Tile};
    use UnaryOp::Relu;
    // y = (x - a) * s + b, then the mask and the product.
    // (rustfmt puts a slice pattern on one line, however long.)
    #[rustfmt::skip]
    let [
        Bin(Sub, Ext(x), Tile(a), 0),
        Bin(Mul, Reg(0), Tile(s), 1),
        Bin(Add, Reg(1), Tile(b), 2),
        ref tail @ ..,
    ] = *prog else {
        return None;
    };
    #[rustfmt::skip]
    let (z, g, z1, cap, gm, prod) = match *tail {
        // relu6: the relu and the comparison with `z` read `y` each, in either order.
        [
            Un(Relu, Reg(2), 3),
            Bin(Greater, Reg(2), Scal(z), 4),
            Bin(LessEqual, Reg(3), Scal(c), 5),
            Sel(Reg(5), Ext(g), Scal(z1), 6),
            Sel(Reg(4), Reg(6), Scal(z2), 7),
            Bin(Mul, Reg(7), Reg(0), 8),
        ]
        | [
            Bin(Greater, Reg(2), Scal(z), 3),
            Un(Relu, Reg(2), 4),
            Bin(LessEqual, Reg(4), Scal(c), 5),
            Sel(Reg(5), Ext(g), Scal(z1), 6),
            Sel(Reg(3), Reg(6), Scal(z2), 7),
            Bin(Mul, Reg(7), Reg(0), 8),
        ] => {
            (z, g, z1, Some((c, z2)), 7, 8)
        }
        // relu.
        [
            Bin(Greater, Reg(2), Scal(z), 3),
            Sel(Reg(3), Ext(g), Scal(z1), 4),
            Bin(Mul, Reg(4), Reg(0), 5),
        ] => {
            (z, g, z1, None, 4, 5)
        }
        _ => return None,
    };
    let written: Vec<&Out> = outs
        .iter()
        .filter(|o| !matches!(o, Out::Passed(_)))
        .collect();
    let slot = |v: u16| {
        written
            .iter()
            .position(|o| matches!(o, Out::F32(Reg(r)) if *r == v))
    };
    let (gm_out, prod_out) = (slot(gm), slot(prod)?);
    // Nothing else written: the mask is `gm`'s, or no output at all.
    (written.len() == 1 + gm_out.is_some() as usize).then_some(())?;
    Some(ReluGrad {
        x,
        g,
        tiles: [a, s, b],
        z,
        z1,
        cap,
        gm_out,
        prod_out,
    })
}

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

/// Lanes computed together: read and written as arrays, which the compiler keeps in one
/// vector register (an output may be an input's buffer, so no slices of both are made).
const L: usize = 16;

#[inline(always)]
unsafe fn load(p: *const f32) -> [f32; L] {
    std::ptr::read_unaligned(p as *const [f32; L])
}

#[inline(always)]
unsafe fn store(p: *mut f32, v: [f32; L]) {
    std::ptr::write_unaligned(p as *mut [f32; L], v)
}

/// Runs `body` with `e` (element), `p` (its channel) and `n` (lanes: `L`, or 1 at the end
/// of a run) over `[start, end)` in runs of the period (a run's per-channel values are
/// contiguous, so no index modulo). A macro, not a function taking a closure: the body is
/// expanded in place, in the caller's instruction set (a closure the compiler does not
/// inline is compiled without the AVX-512 of `exec_chunks`' dispatch).
macro_rules! by_runs {
    ($period:expr, $start:expr, $end:expr, |$e:ident, $p:ident, $n:ident| $body:block) => {{
        let (period, end) = ($period, $end);
        let mut i = $start;
        let mut j = i % period;
        while i < end {
            let run = (period - j).min(end - i);
            let mut q = 0;
            while q + L <= run {
                // Opaque to the loop vectoriser, which otherwise vectorises across blocks
                // with gathers (4x slower, measured) instead of each block's 16 lanes.
                let ($e, $p, $n) = (std::hint::black_box(i + q), j + q, L);
                $body
                q += L;
            }
            while q < run {
                let ($e, $p, $n) = (i + q, j + q, 1usize);
                $body
                q += 1;
            }
            i += run;
            j = 0;
        }
    }};
}

/// The chain over `[start, end)`.
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
    let one =
        |x: f32, a: f32, s: f32, b: f32, r: f32| affine_one::<RES, RELU, CAP>(x, a, s, b, r, c);
    by_runs!(period, start, end, |e, p, n| {
        if n == L {
            let (xv, av, sv, bv) = (
                load(x.add(e)),
                load(t[0].add(p)),
                load(t[1].add(p)),
                load(t[2].add(p)),
            );
            let rv = if RES { load(r.add(e)) } else { [0.0; L] };
            let mut y = [0f32; L];
            for l in 0..L {
                y[l] = one(xv[l], av[l], sv[l], bv[l], rv[l]);
            }
            store(out.add(e), y);
        } else {
            let rv = if RES { *r.add(e) } else { 0.0 };
            *out.add(e) = one(*x.add(e), *t[0].add(p), *t[1].add(p), *t[2].add(p), rv);
        }
    })
}

/// Elements `[start, end)` of the relu or relu6 gradient into the output buffers `out`
/// (`gm`'s, unused where the group does not write it, and the product's; a folded one may
/// point before its tile, hence wrapping offsets). Each element's inputs are read before
/// its outputs are written.
///
/// # Safety
/// `ext` and the outputs address elements `[start, end)`; each tile holds one period.
#[inline(always)]
pub(super) unsafe fn run_relu_grad(
    k: &ReluGrad,
    ext: &[*const f32],
    tiles: &[(*const f32, usize)],
    scal: &[f32],
    out: [*mut f32; 2],
    start: usize,
    end: usize,
) {
    let (c, z2) = k
        .cap
        .map_or((0.0, 0.0), |(c, z2)| (scal[c as usize], scal[z2 as usize]));
    let o = GradOperands {
        x: ext[k.x as usize],
        g: ext[k.g as usize],
        t: k.tiles.map(|t| tiles[t as usize].0),
        period: tiles[k.tiles[0] as usize].1,
        consts: [scal[k.z as usize], scal[k.z1 as usize], c, z2],
    };
    match (k.cap.is_some(), k.gm_out.is_some()) {
        (true, true) => relu_grad::<true, true>(&o, out, start, end),
        (true, false) => relu_grad::<true, false>(&o, out, start, end),
        (false, true) => relu_grad::<false, true>(&o, out, start, end),
        (false, false) => relu_grad::<false, false>(&o, out, start, end),
    }
}

/// The relu gradient's operands for one run: same-size `x` and `g`, the tiles `a`, `s`,
/// `b` and their period, the single values `[z, z1, c, z2]`.
struct GradOperands {
    x: *const f32,
    g: *const f32,
    t: [*const f32; 3],
    period: usize,
    consts: [f32; 4],
}

#[inline(always)]
unsafe fn relu_grad<const CAP: bool, const GM: bool>(
    o: &GradOperands,
    out: [*mut f32; 2],
    start: usize,
    end: usize,
) {
    let (x, g, [a, s, b], period) = (o.x, o.g, o.t, o.period);
    let [z, z1, c, z2] = o.consts;
    let one = |x: f32, g: f32, a: f32, s: f32, b: f32| {
        relu_grad_one::<CAP>(x, g, a, s, b, [z, z1, c, z2])
    };
    let [o0, o1] = out;
    by_runs!(period, start, end, |e, p, n| {
        if n == L {
            let (xv, gv) = (load(x.add(e)), load(g.add(e)));
            let (av, sv, bv) = (load(a.add(p)), load(s.add(p)), load(b.add(p)));
            let (mut gm, mut prod) = ([0f32; L], [0f32; L]);
            for l in 0..L {
                (gm[l], prod[l]) = one(xv[l], gv[l], av[l], sv[l], bv[l]);
            }
            if GM {
                store(o0.wrapping_add(e), gm);
            }
            store(o1.wrapping_add(e), prod);
        } else {
            let (gm, prod) = one(*x.add(e), *g.add(e), *a.add(p), *s.add(p), *b.add(p));
            if GM {
                *o0.wrapping_add(e) = gm;
            }
            *o1.wrapping_add(e) = prod;
        }
    })
}

// The per-element functions are items, not closures, and always inlined: a closure the
// compiler leaves out of line is compiled without the AVX-512 of `exec_chunks`' dispatch
// and runs scalar (4x slower than the chunk program it replaces, measured).

/// One element of the affine chain.
#[inline(always)]
fn affine_one<const RES: bool, const RELU: bool, const CAP: bool>(
    x: f32,
    a: f32,
    s: f32,
    b: f32,
    r: f32,
    c: f32,
) -> f32 {
    let mut y = binary_scalar(BinaryOp::Sub, x, a);
    y = binary_scalar(BinaryOp::Mul, y, s);
    y = binary_scalar(BinaryOp::Add, y, b);
    if RES {
        y = binary_scalar(BinaryOp::Add, y, r);
    }
    if RELU {
        y = unary_scalar(UnaryOp::Relu, y);
    }
    if CAP {
        y = binary_scalar(BinaryOp::Minimum, y, c);
    }
    y
}

/// `(gm, gm * (x - a))` of one element of the relu (or, with `CAP`, relu6) gradient;
/// `k` = `[z, z1, c, z2]`.
#[inline(always)]
fn relu_grad_one<const CAP: bool>(
    x: f32,
    g: f32,
    a: f32,
    s: f32,
    b: f32,
    k: [f32; 4],
) -> (f32, f32) {
    let [z, z1, c, z2] = k;
    let cx = binary_scalar(BinaryOp::Sub, x, a);
    let y = binary_scalar(BinaryOp::Mul, cx, s);
    let y = binary_scalar(BinaryOp::Add, y, b);
    let pos = binary_scalar(BinaryOp::Greater, y, z);
    let gm = if CAP {
        let ry = unary_scalar(UnaryOp::Relu, y);
        let low = binary_scalar(BinaryOp::LessEqual, ry, c);
        let kept = if low != 0.0 { g } else { z1 };
        if pos != 0.0 {
            kept
        } else {
            z2
        }
    } else if pos != 0.0 {
        g
    } else {
        z1
    };
    (gm, binary_scalar(BinaryOp::Mul, gm, cx))
}
