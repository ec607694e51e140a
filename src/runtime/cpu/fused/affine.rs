//! Batch norm's kernels: groups whose programs are batch norm's output, the gradient of
//! a relu or relu6 after it, or its input gradient, run as one loop with every value in
//! registers instead of one stored instruction result at a time. The output is `act((x - a) * s + b [+ r])` with
//! `a`, `s`, `b` repeating with one period (per-channel values) and `act` nothing, `relu`
//! or `relu` then `minimum(·, c)` or `minimum(c, ·)` (relu6); the relu6 gradient recomputes that output `y`
//! and writes `gm = y > z ? (relu(y) <= c ? g : z1) : z2` and `gm * (x - a)` (whose sums
//! its folds take), the relu gradient `gm = y > z ? g : z1` and the same product, either
//! mask also as autodiff forms it, from the relu's output (`relu(y) > z`); the
//! relu gradient of a residual block may read `y + r` and a gradient `g + g2`, or the
//! stored relu input or output instead of `y` (`MaskGrad`); two outputs added up before a relu
//! (`AffineSum`) and the variance's `(x - a)²` (`SquaredDev`) are one loop too; the input
//! gradient is
//! `p * ((x - a) * k) + g * q + r` (`g` the gradient after the
//! activation, `k` a single value, the rest per-channel values). The
//! per-element code is the op tables' (`BinaryOp::zip`, `UnaryOp::map` on constant ops),
//! so the results are bitwise those of the group's ordinary program. A chunk program of
//! the output's five instructions costs ~0.3-0.4 ns an element on one Zen 4 thread with
//! its data in cache, one loop ~0.1.

use super::exec::{binary_scalar, unary_scalar};
use super::{Ins, Opd, Out, OutBuf};
use crate::ops::{BinaryOp, UnaryOp};

/// A group's program recognised as one of batch norm's kernels, for one input layout.
#[derive(Debug)]
pub(super) enum BnKernel {
    /// `act((x - a) * s + b [+ r])`, the group's only output.
    Affine {
        head: Head,
        /// A same-size input added after the shift (a residual), if any.
        residual: Option<u16>,
        relu: bool,
        /// The single value the relu's result is capped at, if any, and whether the cap is
        /// `minimum`'s first operand (`minimum(c, relu)`, as `K.relu` builds relu6).
        cap: Option<(u16, bool)>,
    },
    /// The gradient of a relu or relu6 after it: `g` a same-size input, the single values
    /// `z`, `z1` and, for relu6, `(c, z2)`; the output slots of `gm` (where the group writes
    /// it) and of `gm * (x - a)`. A relu's may read `y + r` (`residual`, a same-size input:
    /// a residual block's sum) and a gradient that is the sum `g + g2` of two (`g2`: the
    /// block's output read twice).
    ReluGrad {
        head: Head,
        residual: Option<u16>,
        g: u16,
        g2: Option<u16>,
        z: u16,
        z1: u16,
        cap: Option<(u16, u16)>,
        mask: MaskForm,
        gm_out: Option<usize>,
        prod_out: usize,
    },
    /// Batch norm's variance term `(x - a)²` (its mean folded by the group): `x` a
    /// same-size input, `a` a per-channel value (a tile index); the slots of the square and,
    /// where the group writes it, of `x - a`.
    SquaredDev {
        x: u16,
        a: u16,
        dev_out: Option<usize>,
        sq_out: usize,
    },
    /// Two batch norms' outputs added up and a relu, `relu(y1 + y2)` with
    /// `yi = (xi - ai) * si + bi` (a residual block whose shortcut has a batch norm of its
    /// own): the relu's output slot and the sum's, where the group writes it.
    AffineSum {
        heads: [Head; 2],
        sum_out: Option<usize>,
        relu_out: usize,
    },
    /// A relu gradient whose mask reads the stored relu input or output `y` (`y > z`)
    /// rather than computing it: `gm = y > z ? g [+ g2] : z1` and `gm * (x - a)`, `x`, `y`, `g`, `g2`
    /// same-size inputs, `a` a per-channel value (a tile index); outputs as `ReluGrad`'s.
    /// A residual block whose output two batch norms add up takes this gradient.
    MaskGrad {
        x: u16,
        a: u16,
        y: u16,
        z: u16,
        g: u16,
        g2: Option<u16>,
        z1: u16,
        gm_out: Option<usize>,
        prod_out: usize,
    },
    /// Batch norm's input gradient, `p * ((x - a) * k) + g * q + r`: `x` and `g`
    /// same-size inputs, `k` a single value, `tiles` = `[a, p, q, r]` per-channel values,
    /// the group's only output.
    InputGrad {
        x: u16,
        g: u16,
        k: u16,
        tiles: [u16; 4],
    },
}

/// `y = (x - a) * s + b`, which the output and the relu gradients start with: `x` a same-size input (an
/// `Opd::Ext` index), `a`, `s`, `b` per-channel values (`Opd::Tile` indices).
#[derive(Debug)]
pub(super) struct Head {
    x: u16,
    tiles: [u16; 3],
}

/// How a relu gradient's program forms its masks: `of_relu`, the mask compares `relu(y)`
/// with `z` rather than `y` (autodiff's relu gradient reads the relu's output);
/// `cap_first`, relu6's keeps `g` where `c <= relu(y)` is false (the gradient of
/// `minimum(c, relu(y))`) rather than where `relu(y) <= c` is true.
#[derive(Clone, Copy, Debug)]
pub(super) struct MaskForm {
    of_relu: bool,
    cap_first: bool,
}

impl MaskForm {
    /// The mask compares `y` (and relu6's cap reads `relu(y) <= c`).
    const OF_Y: MaskForm = MaskForm {
        of_relu: false,
        cap_first: false,
    };
    /// The masks compare the relu's result.
    const OF_RELU: MaskForm = MaskForm {
        of_relu: true,
        cap_first: false,
    };
    /// The masks compare the relu's result, relu6's cap as `minimum`'s first operand.
    const CAP_FIRST: MaskForm = MaskForm {
        of_relu: true,
        cap_first: true,
    };
}

/// `prog` (in virtual registers, before outputs are written directly: instruction `k`
/// writes register `k`, and reads the one before as its first operand) as one of batch
/// norm's kernels, with `outs` the group's outputs. Operand order is kept as the program
/// has it, so even a NaN's payload is the program's.
/// `periods` gives each `Opd::Tile` operand's period: the kernels read every per-channel
/// value at one index within one period, so a program whose tiles repeat with different
/// periods (a `[channels]` value next to a `[rows, channels]` one) keeps its chunk program.
pub(super) fn recognise(prog: &[Ins], outs: &[Out], periods: &[usize]) -> Option<BnKernel> {
    let k = recognise_program(prog, outs)?;
    let tiles = k.tiles();
    let p = periods[tiles[0] as usize];
    tiles.iter().all(|&t| periods[t as usize] == p).then_some(k)
}

impl BnKernel {
    /// The `Opd::Tile` operands the kernel reads.
    fn tiles(&self) -> Vec<u16> {
        match self {
            BnKernel::Affine { head, .. } | BnKernel::ReluGrad { head, .. } => head.tiles.to_vec(),
            BnKernel::AffineSum { heads, .. } => heads.iter().flat_map(|h| h.tiles).collect(),
            BnKernel::MaskGrad { a, .. } | BnKernel::SquaredDev { a, .. } => vec![*a],
            BnKernel::InputGrad { tiles, .. } => tiles.to_vec(),
        }
    }
}

fn recognise_program(prog: &[Ins], outs: &[Out]) -> Option<BnKernel> {
    use BinaryOp::{Add, Greater, LessEqual, Minimum, Mul, Sub};
    use Ins::{Binary as Bin, Select as Sel, Unary as Un};
    use Opd::{Ext, Reg, Scal, Tile};
    use UnaryOp::Relu;
    // (rustfmt puts a slice pattern on one line, however long.)
    if let Some(k) = input_grad_kernel(prog, outs)
        .or_else(|| mask_grad_kernel(prog, outs))
        .or_else(|| affine_sum_kernel(prog, outs))
        .or_else(|| squared_dev_kernel(prog, outs))
    {
        return Some(k);
    }
    #[rustfmt::skip]
    let [
        Bin(Sub, Ext(x), Tile(a), 0),
        Bin(Mul, Reg(0), Tile(s), 1),
        Bin(Add, Reg(1), Tile(b), 2),
        ref tail @ ..,
    ] = *prog else {
        return None;
    };
    let head = Head {
        x,
        tiles: [a, s, b],
    };
    // `(residual, g, g2, z, z1, cap, mask)`.
    #[rustfmt::skip]
    let grad = match *tail {
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
        ] => Some((None, g, None, z, z1, Some((c, z2)), MaskForm::OF_Y)),
        // relu6 with both comparisons reading the relu's result, in either order.
        [
            Un(Relu, Reg(2), 3),
            Bin(Greater, Reg(3), Scal(z), 4),
            Bin(LessEqual, Reg(3), Scal(c), 5),
            Sel(Reg(5), Ext(g), Scal(z1), 6),
            Sel(Reg(4), Reg(6), Scal(z2), 7),
            Bin(Mul, Reg(7), Reg(0), 8),
        ]
        | [
            Un(Relu, Reg(2), 3),
            Bin(LessEqual, Reg(3), Scal(c), 4),
            Bin(Greater, Reg(3), Scal(z), 5),
            Sel(Reg(4), Ext(g), Scal(z1), 6),
            Sel(Reg(5), Reg(6), Scal(z2), 7),
            Bin(Mul, Reg(7), Reg(0), 8),
        ] => Some((None, g, None, z, z1, Some((c, z2)), MaskForm::OF_RELU)),
        // relu6 as `minimum(c, relu(y))`: its gradient keeps `g` where `c <= relu(y)` is
        // false.
        [
            Un(Relu, Reg(2), 3),
            Bin(Greater, Reg(3), Scal(z), 4),
            Bin(LessEqual, Scal(c), Reg(3), 5),
            Sel(Reg(5), Scal(z1), Ext(g), 6),
            Sel(Reg(4), Reg(6), Scal(z2), 7),
            Bin(Mul, Reg(7), Reg(0), 8),
        ]
        | [
            Un(Relu, Reg(2), 3),
            Bin(LessEqual, Scal(c), Reg(3), 4),
            Bin(Greater, Reg(3), Scal(z), 5),
            Sel(Reg(4), Scal(z1), Ext(g), 6),
            Sel(Reg(5), Reg(6), Scal(z2), 7),
            Bin(Mul, Reg(7), Reg(0), 8),
        ] => Some((None, g, None, z, z1, Some((c, z2)), MaskForm::CAP_FIRST)),
        // relu.
        [
            Bin(Greater, Reg(2), Scal(z), 3),
            Sel(Reg(3), Ext(g), Scal(z1), 4),
            Bin(Mul, Reg(4), Reg(0), 5),
        ] => Some((None, g, None, z, z1, None, MaskForm::OF_Y)),
        [
            Un(Relu, Reg(2), 3),
            Bin(Greater, Reg(3), Scal(z), 4),
            Sel(Reg(4), Ext(g), Scal(z1), 5),
            Bin(Mul, Reg(5), Reg(0), 6),
        ] => Some((None, g, None, z, z1, None, MaskForm::OF_RELU)),
        // relu of `y + r`, of a gradient `g + g2`, or both.
        [
            Bin(Add, Reg(2), Ext(r), 3),
            Bin(Greater, Reg(3), Scal(z), 4),
            Sel(Reg(4), Ext(g), Scal(z1), 5),
            Bin(Mul, Reg(5), Reg(0), 6),
        ] => Some((Some(r), g, None, z, z1, None, MaskForm::OF_Y)),
        [
            Bin(Add, Reg(2), Ext(r), 3),
            Un(Relu, Reg(3), 4),
            Bin(Greater, Reg(4), Scal(z), 5),
            Sel(Reg(5), Ext(g), Scal(z1), 6),
            Bin(Mul, Reg(6), Reg(0), 7),
        ] => Some((Some(r), g, None, z, z1, None, MaskForm::OF_RELU)),
        [
            Bin(Greater, Reg(2), Scal(z), 3),
            Bin(Add, Ext(g), Ext(g2), 4),
            Sel(Reg(3), Reg(4), Scal(z1), 5),
            Bin(Mul, Reg(5), Reg(0), 6),
        ] => Some((None, g, Some(g2), z, z1, None, MaskForm::OF_Y)),
        [
            Un(Relu, Reg(2), 3),
            Bin(Greater, Reg(3), Scal(z), 4),
            Bin(Add, Ext(g), Ext(g2), 5),
            Sel(Reg(4), Reg(5), Scal(z1), 6),
            Bin(Mul, Reg(6), Reg(0), 7),
        ] => Some((None, g, Some(g2), z, z1, None, MaskForm::OF_RELU)),
        [
            Bin(Add, Reg(2), Ext(r), 3),
            Bin(Greater, Reg(3), Scal(z), 4),
            Bin(Add, Ext(g), Ext(g2), 5),
            Sel(Reg(4), Reg(5), Scal(z1), 6),
            Bin(Mul, Reg(6), Reg(0), 7),
        ] => Some((Some(r), g, Some(g2), z, z1, None, MaskForm::OF_Y)),
        [
            Bin(Add, Reg(2), Ext(r), 3),
            Un(Relu, Reg(3), 4),
            Bin(Greater, Reg(4), Scal(z), 5),
            Bin(Add, Ext(g), Ext(g2), 6),
            Sel(Reg(5), Reg(6), Scal(z1), 7),
            Bin(Mul, Reg(7), Reg(0), 8),
        ] => Some((Some(r), g, Some(g2), z, z1, None, MaskForm::OF_RELU)),
        _ => None,
    };
    if let Some((residual, g, g2, z, z1, cap, mask)) = grad {
        // `gm` is the second instruction from the end, the product the last.
        let (gm_out, prod_out) = out_slots(outs, prog.len() - 2, prog.len() - 1)?;
        return Some(BnKernel::ReluGrad {
            head,
            residual,
            g,
            g2,
            z,
            z1,
            cap,
            mask,
            gm_out,
            prod_out,
        });
    }
    // The output: then optionally `Add(·, r)`, `Relu`, `Minimum(·, c)` (or `(c, ·)`), each reading the
    // instruction before; the last is the group's only output.
    let mut rest = tail
        .iter()
        .copied()
        .enumerate()
        .map(|(k, ins)| (k as u16 + 3, ins))
        .peekable();
    let mut residual = None;
    if let Some((3, Bin(Add, Reg(2), Ext(r), 3))) = rest.peek().copied() {
        residual = Some(r);
        rest.next();
    }
    let (mut relu, mut cap) = (false, None);
    if let Some((k, Un(Relu, Reg(p), d))) = rest.peek().copied() {
        if p + 1 != k || d != k {
            return None;
        }
        relu = true;
        rest.next();
        match rest.next() {
            Some((k, Bin(Minimum, Reg(p), Scal(c), d))) if p + 1 == k && d == k => {
                cap = Some((c, false));
            }
            Some((k, Bin(Minimum, Scal(c), Reg(p), d))) if p + 1 == k && d == k => {
                cap = Some((c, true));
            }
            None => {}
            Some(_) => return None,
        }
    }
    let [Out::F32(Reg(out))] = *outs else {
        return None;
    };
    (rest.next().is_none() && out as usize + 1 == prog.len()).then_some(BnKernel::Affine {
        head,
        residual,
        relu,
        cap,
    })
}

/// `prog` as batch norm's input gradient, `p * ((x - a) * k) + g * q + r`, if it is one.
fn input_grad_kernel(prog: &[Ins], outs: &[Out]) -> Option<BnKernel> {
    use BinaryOp::{Add, Mul, Sub};
    use Ins::Binary as Bin;
    use Opd::{Ext, Reg, Scal, Tile};
    #[rustfmt::skip]
    let [
        Bin(Sub, Ext(x), Tile(a), 0),
        Bin(Mul, Reg(0), Scal(k), 1),
        Bin(Mul, Tile(p), Reg(1), 2),
        Bin(Mul, Ext(g), Tile(q), 3),
        Bin(Add, Reg(2), Reg(3), 4),
        Bin(Add, Reg(4), Tile(r), 5),
    ] = *prog else {
        return None;
    };
    matches!(*outs, [Out::F32(Reg(5))]).then_some(BnKernel::InputGrad {
        x,
        g,
        k,
        tiles: [a, p, q, r],
    })
}

/// Where instruction `main`'s result is written and, if the group writes it, instruction
/// `extra`'s: their slots among the written outputs, the group writing nothing else.
fn out_slots(outs: &[Out], extra: usize, main: usize) -> Option<(Option<usize>, usize)> {
    let written: Vec<&Out> = outs
        .iter()
        .filter(|o| !matches!(o, Out::Passed(_)))
        .collect();
    let slot = |v: usize| {
        written
            .iter()
            .position(|o| matches!(o, Out::F32(Opd::Reg(r)) if *r as usize == v))
    };
    let (extra, main) = (slot(extra), slot(main)?);
    (written.len() == 1 + extra.is_some() as usize).then_some((extra, main))
}

/// `prog` as batch norm's variance term (`BnKernel::SquaredDev`), if it is one.
fn squared_dev_kernel(prog: &[Ins], outs: &[Out]) -> Option<BnKernel> {
    use Opd::{Ext, Reg, Tile};
    let [Ins::Binary(BinaryOp::Sub, Ext(x), Tile(a), 0), Ins::Unary(UnaryOp::Square, Reg(0), 1)] =
        *prog
    else {
        return None;
    };
    let (dev_out, sq_out) = out_slots(outs, 0, 1)?;
    Some(BnKernel::SquaredDev {
        x,
        a,
        dev_out,
        sq_out,
    })
}

/// `prog` as two batch norms' outputs added up and a relu (`BnKernel::AffineSum`), if it
/// is one.
fn affine_sum_kernel(prog: &[Ins], outs: &[Out]) -> Option<BnKernel> {
    use BinaryOp::{Add, Mul, Sub};
    use Ins::{Binary as Bin, Unary as Un};
    use Opd::{Ext, Reg, Tile};
    #[rustfmt::skip]
    let [
        Bin(Sub, Ext(x1), Tile(a1), 0),
        Bin(Mul, Reg(0), Tile(s1), 1),
        Bin(Add, Reg(1), Tile(b1), 2),
        Bin(Sub, Ext(x2), Tile(a2), 3),
        Bin(Mul, Reg(3), Tile(s2), 4),
        Bin(Add, Reg(4), Tile(b2), 5),
        Bin(Add, Reg(2), Reg(5), 6),
        Un(UnaryOp::Relu, Reg(6), 7),
    ] = *prog else {
        return None;
    };
    let (sum_out, relu_out) = out_slots(outs, 6, 7)?;
    Some(BnKernel::AffineSum {
        heads: [
            Head {
                x: x1,
                tiles: [a1, s1, b1],
            },
            Head {
                x: x2,
                tiles: [a2, s2, b2],
            },
        ],
        sum_out,
        relu_out,
    })
}

/// `prog` as a relu gradient with a stored mask input (`BnKernel::MaskGrad`), if it is one.
fn mask_grad_kernel(prog: &[Ins], outs: &[Out]) -> Option<BnKernel> {
    use BinaryOp::{Add, Greater, Mul, Sub};
    use Ins::{Binary as Bin, Select as Sel};
    use Opd::{Ext, Reg, Scal, Tile};
    #[rustfmt::skip]
    let (x, a, y, z, g, g2, z1) = match *prog {
        [
            Bin(Sub, Ext(x), Tile(a), 0),
            Bin(Greater, Ext(y), Scal(z), 1),
            Sel(Reg(1), Ext(g), Scal(z1), 2),
            Bin(Mul, Reg(2), Reg(0), 3),
        ] => (x, a, y, z, g, None, z1),
        [
            Bin(Sub, Ext(x), Tile(a), 0),
            Bin(Greater, Ext(y), Scal(z), 1),
            Bin(Add, Ext(g), Ext(g2), 2),
            Sel(Reg(1), Reg(2), Scal(z1), 3),
            Bin(Mul, Reg(3), Reg(0), 4),
        ] => (x, a, y, z, g, Some(g2), z1),
        // The centred input computed after the mask.
        [
            Bin(Greater, Ext(y), Scal(z), 0),
            Sel(Reg(0), Ext(g), Scal(z1), 1),
            Bin(Sub, Ext(x), Tile(a), 2),
            Bin(Mul, Reg(1), Reg(2), 3),
        ] => (x, a, y, z, g, None, z1),
        [
            Bin(Greater, Ext(y), Scal(z), 0),
            Bin(Add, Ext(g), Ext(g2), 1),
            Sel(Reg(0), Reg(1), Scal(z1), 2),
            Bin(Sub, Ext(x), Tile(a), 3),
            Bin(Mul, Reg(2), Reg(3), 4),
        ] => (x, a, y, z, g, Some(g2), z1),
        _ => return None,
    };
    // `gm` is the select, the product the last instruction.
    let sel = prog.iter().position(|i| matches!(i, Sel(..)))?;
    let (gm_out, prod_out) = out_slots(outs, sel, prog.len() - 1)?;
    Some(BnKernel::MaskGrad {
        x,
        a,
        y,
        z,
        g,
        g2,
        z1,
        gm_out,
        prod_out,
    })
}

/// Runs `k` over elements `[start, end)`, reading `ext`, `tiles` and `scal` and writing
/// its outputs among `outs`; false (nothing done) where an output is not an f32 buffer.
/// An output may be an input's buffer (each element is read before it is written), and a
/// folded one may point before its tile (`fold_exec`), hence wrapping offsets.
///
/// # Safety
/// `ext` and the outputs address elements `[start, end)`; each tile holds one period from
/// its start.
#[inline(always)]
pub(super) unsafe fn run(
    k: &BnKernel,
    ext: &[*const f32],
    tiles: &[(*const f32, usize)],
    scal: &[f32],
    outs: &[(Opd, OutBuf)],
    start: usize,
    end: usize,
) -> bool {
    let f32_out = |s: usize| match outs.get(s) {
        Some((_, OutBuf::F32(p))) => Some(*p),
        Some((_, OutBuf::Bool(_))) | None => None,
    };
    // The buffers of an optional output (null where the group does not write it) and a
    // required one.
    let pair = |extra: Option<usize>, main: usize| {
        let extra = extra.map_or(Some(std::ptr::null_mut()), f32_out)?;
        Some([extra, f32_out(main)?])
    };
    // Every tile of a kernel has one period (`recognise`).
    let at = |h: &Head| Operands {
        x: ext[h.x as usize],
        t: h.tiles.map(|t| tiles[t as usize].0),
        period: tiles[h.tiles[0] as usize].1,
        start,
        end,
    };
    match *k {
        BnKernel::Affine {
            ref head,
            residual,
            relu,
            cap,
        } => {
            let Some(out) = f32_out(0) else {
                return false;
            };
            let o = at(head);
            let r = residual.map_or(o.x, |e| ext[e as usize]);
            let (c, first) = cap.map_or((0.0, false), |(c, first)| (scal[c as usize], first));
            match (residual.is_some(), relu, cap.is_some()) {
                (false, false, _) => rows::<false, false, false>(&o, r, (c, first), out),
                (false, true, false) => rows::<false, true, false>(&o, r, (c, first), out),
                (false, true, true) => rows::<false, true, true>(&o, r, (c, first), out),
                (true, false, _) => rows::<true, false, false>(&o, r, (c, first), out),
                (true, true, false) => rows::<true, true, false>(&o, r, (c, first), out),
                (true, true, true) => rows::<true, true, true>(&o, r, (c, first), out),
            }
        }
        BnKernel::ReluGrad {
            ref head,
            residual,
            g,
            g2,
            z,
            z1,
            cap,
            mask,
            gm_out,
            prod_out,
        } => {
            let Some(bufs) = pair(gm_out, prod_out) else {
                return false;
            };
            let (c, z2) = cap.map_or((0.0, 0.0), |(c, z2)| (scal[c as usize], scal[z2 as usize]));
            let consts = [scal[z as usize], scal[z1 as usize], c, z2];
            let o = at(head);
            let g = [g, g2.unwrap_or(g)].map(|e| ext[e as usize]);
            let r = residual.map_or(o.x, |e| ext[e as usize]);
            // (relu6's gradient reads neither a residual nor a sum of gradients.)
            match (
                cap.is_some(),
                gm_out.is_some(),
                residual.is_some(),
                g2.is_some(),
            ) {
                (true, true, ..) => {
                    relu_grad::<true, true, false, false>(&o, r, g, consts, mask, bufs)
                }
                (true, false, ..) => {
                    relu_grad::<true, false, false, false>(&o, r, g, consts, mask, bufs)
                }
                (false, true, false, false) => {
                    relu_grad::<false, true, false, false>(&o, r, g, consts, mask, bufs)
                }
                (false, false, false, false) => {
                    relu_grad::<false, false, false, false>(&o, r, g, consts, mask, bufs)
                }
                (false, true, true, false) => {
                    relu_grad::<false, true, true, false>(&o, r, g, consts, mask, bufs)
                }
                (false, false, true, false) => {
                    relu_grad::<false, false, true, false>(&o, r, g, consts, mask, bufs)
                }
                (false, true, false, true) => {
                    relu_grad::<false, true, false, true>(&o, r, g, consts, mask, bufs)
                }
                (false, false, false, true) => {
                    relu_grad::<false, false, false, true>(&o, r, g, consts, mask, bufs)
                }
                (false, true, true, true) => {
                    relu_grad::<false, true, true, true>(&o, r, g, consts, mask, bufs)
                }
                (false, false, true, true) => {
                    relu_grad::<false, false, true, true>(&o, r, g, consts, mask, bufs)
                }
            }
        }
        BnKernel::SquaredDev {
            x,
            a,
            dev_out,
            sq_out,
        } => {
            let Some(bufs) = pair(dev_out, sq_out) else {
                return false;
            };
            let (at, period) = tiles[a as usize];
            let run = (at, period, start, end);
            if dev_out.is_some() {
                squared_dev::<true>(ext[x as usize], run, bufs);
            } else {
                squared_dev::<false>(ext[x as usize], run, bufs);
            }
        }
        BnKernel::AffineSum {
            ref heads,
            sum_out,
            relu_out,
        } => {
            let Some(bufs) = pair(sum_out, relu_out) else {
                return false;
            };
            let o = at(&heads[0]);
            let second = (
                ext[heads[1].x as usize],
                heads[1].tiles.map(|t| tiles[t as usize].0),
            );
            if sum_out.is_some() {
                affine_sum::<true>(&o, second, bufs);
            } else {
                affine_sum::<false>(&o, second, bufs);
            }
        }
        BnKernel::MaskGrad {
            x,
            a,
            y,
            z,
            g,
            g2,
            z1,
            gm_out,
            prod_out,
        } => {
            let Some(bufs) = pair(gm_out, prod_out) else {
                return false;
            };
            let (at, period) = tiles[a as usize];
            let ins = [x, y, g, g2.unwrap_or(g)].map(|e| ext[e as usize]);
            let k = [scal[z as usize], scal[z1 as usize]];
            let run = (at, period, start, end);
            match (gm_out.is_some(), g2.is_some()) {
                (true, true) => mask_grad::<true, true>(ins, run, k, bufs),
                (true, false) => mask_grad::<true, false>(ins, run, k, bufs),
                (false, true) => mask_grad::<false, true>(ins, run, k, bufs),
                (false, false) => mask_grad::<false, false>(ins, run, k, bufs),
            }
        }
        BnKernel::InputGrad { x, g, k, tiles: ts } => {
            let Some(out) = f32_out(0) else {
                return false;
            };
            let period = tiles[ts[0] as usize].1;
            let t = ts.map(|t| tiles[t as usize].0);
            let (x, g) = (ext[x as usize], ext[g as usize]);
            input_grad(x, g, scal[k as usize], t, period, start, end, out);
        }
    }
    true
}

/// `Head`'s operands for one run over `[start, end)`: `x`, the tiles of `a`, `s`, `b`
/// and their period.
struct Operands {
    x: *const f32,
    t: [*const f32; 3],
    period: usize,
    start: usize,
    end: usize,
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

/// The output over the run's elements into `out`: `r` is the residual (read only with
/// `RES`), `cap` the cap and whether it is `minimum`'s first operand (used only with `CAP`).
#[inline(always)]
unsafe fn rows<const RES: bool, const RELU: bool, const CAP: bool>(
    o: &Operands,
    r: *const f32,
    cap: (f32, bool),
    out: *mut f32,
) {
    let (x, [a, s, b]) = (o.x, o.t);
    let one =
        |x: f32, a: f32, s: f32, b: f32, r: f32| affine_one::<RES, RELU, CAP>(x, a, s, b, r, cap);
    by_runs!(o.period, o.start, o.end, |e, p, n| {
        if n == L {
            let (xv, av, sv, bv) = (
                load(x.add(e)),
                load(a.add(p)),
                load(s.add(p)),
                load(b.add(p)),
            );
            let rv = if RES { load(r.add(e)) } else { [0.0; L] };
            let mut y = [0f32; L];
            for l in 0..L {
                y[l] = one(xv[l], av[l], sv[l], bv[l], rv[l]);
            }
            store(out.wrapping_add(e), y);
        } else {
            let rv = if RES { *r.add(e) } else { 0.0 };
            *out.wrapping_add(e) = one(*x.add(e), *a.add(p), *s.add(p), *b.add(p), rv);
        }
    })
}

/// The relu (or, with `CAP`, relu6) gradient over the run's elements into `out`: `gm`'s
/// buffer (written only with `GM`) and the product's; `k` = `[z, z1, c, z2]`; `r` the
/// residual (read only with `RES`), `g` the gradient and the one added to it (read only
/// with `SUM`).
#[inline(always)]
unsafe fn relu_grad<const CAP: bool, const GM: bool, const RES: bool, const SUM: bool>(
    o: &Operands,
    r: *const f32,
    g: [*const f32; 2],
    k: [f32; 4],
    mask: MaskForm,
    out: [*mut f32; 2],
) {
    let (x, [a, s, b]) = (o.x, o.t);
    let one = |x: f32, r: f32, g: f32, a: f32, s: f32, b: f32| {
        relu_grad_one::<CAP, RES>(x, r, g, [a, s, b], k, mask)
    };
    let [o0, o1] = out;
    let [g, g2] = g;
    by_runs!(o.period, o.start, o.end, |e, p, n| {
        if n == L {
            let (xv, mut gv) = (load(x.add(e)), load(g.add(e)));
            if SUM {
                let g2v = load(g2.add(e));
                for l in 0..L {
                    gv[l] = binary_scalar(BinaryOp::Add, gv[l], g2v[l]);
                }
            }
            let rv = if RES { load(r.add(e)) } else { [0.0; L] };
            let (av, sv, bv) = (load(a.add(p)), load(s.add(p)), load(b.add(p)));
            let (mut gm, mut prod) = ([0f32; L], [0f32; L]);
            for l in 0..L {
                (gm[l], prod[l]) = one(xv[l], rv[l], gv[l], av[l], sv[l], bv[l]);
            }
            if GM {
                store(o0.wrapping_add(e), gm);
            }
            store(o1.wrapping_add(e), prod);
        } else {
            let mut gv = *g.add(e);
            if SUM {
                gv = binary_scalar(BinaryOp::Add, gv, *g2.add(e));
            }
            let rv = if RES { *r.add(e) } else { 0.0 };
            let (gm, prod) = one(*x.add(e), rv, gv, *a.add(p), *s.add(p), *b.add(p));
            if GM {
                *o0.wrapping_add(e) = gm;
            }
            *o1.wrapping_add(e) = prod;
        }
    })
}

/// `BnKernel::SquaredDev` over the run's elements: `run` = (the tile of `a`, its period,
/// start, end), `out` = the buffer of `x - a` (written only with `DEV`) and the square's.
#[inline(always)]
unsafe fn squared_dev<const DEV: bool>(
    x: *const f32,
    run: (*const f32, usize, usize, usize),
    out: [*mut f32; 2],
) {
    let (a, period, start, end) = run;
    let [o0, o1] = out;
    by_runs!(period, start, end, |e, p, n| {
        if n == L {
            let (xv, av) = (load(x.add(e)), load(a.add(p)));
            let (mut dev, mut sq) = ([0f32; L], [0f32; L]);
            for l in 0..L {
                (dev[l], sq[l]) = squared_dev_one(xv[l], av[l]);
            }
            if DEV {
                store(o0.wrapping_add(e), dev);
            }
            store(o1.wrapping_add(e), sq);
        } else {
            let (dev, sq) = squared_dev_one(*x.add(e), *a.add(p));
            if DEV {
                *o0.wrapping_add(e) = dev;
            }
            *o1.wrapping_add(e) = sq;
        }
    })
}

/// `BnKernel::AffineSum` over the run's elements: `o` the first head's operands, `second`
/// the second's input and tiles (of `o`'s period), `out` = the sum's buffer (written only
/// with `SUM`) and the relu's.
#[inline(always)]
unsafe fn affine_sum<const SUM: bool>(
    o: &Operands,
    second: (*const f32, [*const f32; 3]),
    out: [*mut f32; 2],
) {
    let (x, [a, s, b]) = (o.x, o.t);
    let (x2, [a2, s2, b2]) = second;
    let [o0, o1] = out;
    by_runs!(o.period, o.start, o.end, |e, p, n| {
        if n == L {
            let (xv, av, sv, bv) = (
                load(x.add(e)),
                load(a.add(p)),
                load(s.add(p)),
                load(b.add(p)),
            );
            let (x2v, a2v, s2v, b2v) = (
                load(x2.add(e)),
                load(a2.add(p)),
                load(s2.add(p)),
                load(b2.add(p)),
            );
            let (mut sum, mut relu) = ([0f32; L], [0f32; L]);
            for l in 0..L {
                (sum[l], relu[l]) = affine_sum_one(
                    [xv[l], av[l], sv[l], bv[l]],
                    [x2v[l], a2v[l], s2v[l], b2v[l]],
                );
            }
            if SUM {
                store(o0.wrapping_add(e), sum);
            }
            store(o1.wrapping_add(e), relu);
        } else {
            let (sum, relu) = affine_sum_one(
                [*x.add(e), *a.add(p), *s.add(p), *b.add(p)],
                [*x2.add(e), *a2.add(p), *s2.add(p), *b2.add(p)],
            );
            if SUM {
                *o0.wrapping_add(e) = sum;
            }
            *o1.wrapping_add(e) = relu;
        }
    })
}

/// `BnKernel::MaskGrad` over the run's elements: `ins` = `[x, y, g, g2]` (`g2` read only
/// with `SUM`), `run` = (the tile of `a`, its period, start, end), `k` = `[z, z1]`, `out`
/// = `gm`'s buffer (written only with `GM`) and the product's.
#[inline(always)]
unsafe fn mask_grad<const GM: bool, const SUM: bool>(
    ins: [*const f32; 4],
    run: (*const f32, usize, usize, usize),
    k: [f32; 2],
    out: [*mut f32; 2],
) {
    let [x, y, g, g2] = ins;
    let (a, period, start, end) = run;
    let [o0, o1] = out;
    by_runs!(period, start, end, |e, p, n| {
        if n == L {
            let (xv, yv, mut gv, av) = (
                load(x.add(e)),
                load(y.add(e)),
                load(g.add(e)),
                load(a.add(p)),
            );
            if SUM {
                let g2v = load(g2.add(e));
                for l in 0..L {
                    gv[l] = binary_scalar(BinaryOp::Add, gv[l], g2v[l]);
                }
            }
            let (mut gm, mut prod) = ([0f32; L], [0f32; L]);
            for l in 0..L {
                (gm[l], prod[l]) = mask_grad_one(xv[l], yv[l], gv[l], av[l], k);
            }
            if GM {
                store(o0.wrapping_add(e), gm);
            }
            store(o1.wrapping_add(e), prod);
        } else {
            let mut gv = *g.add(e);
            if SUM {
                gv = binary_scalar(BinaryOp::Add, gv, *g2.add(e));
            }
            let (gm, prod) = mask_grad_one(*x.add(e), *y.add(e), gv, *a.add(p), k);
            if GM {
                *o0.wrapping_add(e) = gm;
            }
            *o1.wrapping_add(e) = prod;
        }
    })
}

/// Batch norm's input gradient over `[start, end)` into `out`: `t` = the tiles of
/// `[a, p, q, r]`, one period each.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn input_grad(
    x: *const f32,
    g: *const f32,
    k: f32,
    t: [*const f32; 4],
    period: usize,
    start: usize,
    end: usize,
    out: *mut f32,
) {
    let [a, p, q, r] = t;
    by_runs!(period, start, end, |e, c, n| {
        if n == L {
            let (xv, gv) = (load(x.add(e)), load(g.add(e)));
            let (av, pv, qv, rv) = (
                load(a.add(c)),
                load(p.add(c)),
                load(q.add(c)),
                load(r.add(c)),
            );
            let mut d = [0f32; L];
            for l in 0..L {
                d[l] = input_grad_one(xv[l], gv[l], k, [av[l], pv[l], qv[l], rv[l]]);
            }
            store(out.wrapping_add(e), d);
        } else {
            let tv = [*a.add(c), *p.add(c), *q.add(c), *r.add(c)];
            *out.wrapping_add(e) = input_grad_one(*x.add(e), *g.add(e), k, tv);
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
    (c, first): (f32, bool),
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
        y = if first {
            binary_scalar(BinaryOp::Minimum, c, y)
        } else {
            binary_scalar(BinaryOp::Minimum, y, c)
        };
    }
    y
}

/// `(gm, gm * (x - a))` of one element of the relu (or, with `CAP`, relu6) gradient, of
/// `y + r` with `RES`; `k` = `[z, z1, c, z2]`; the masks as `mask` says.
#[inline(always)]
fn relu_grad_one<const CAP: bool, const RES: bool>(
    x: f32,
    r: f32,
    g: f32,
    [a, s, b]: [f32; 3],
    k: [f32; 4],
    mask: MaskForm,
) -> (f32, f32) {
    let [z, z1, c, z2] = k;
    let cx = binary_scalar(BinaryOp::Sub, x, a);
    let y = binary_scalar(BinaryOp::Mul, cx, s);
    let mut y = binary_scalar(BinaryOp::Add, y, b);
    if RES {
        y = binary_scalar(BinaryOp::Add, y, r);
    }
    let ry = unary_scalar(UnaryOp::Relu, y);
    let pos = binary_scalar(BinaryOp::Greater, if mask.of_relu { ry } else { y }, z);
    let gm = if CAP {
        let kept = if mask.cap_first {
            let high = binary_scalar(BinaryOp::LessEqual, c, ry);
            if high != 0.0 {
                z1
            } else {
                g
            }
        } else {
            let low = binary_scalar(BinaryOp::LessEqual, ry, c);
            if low != 0.0 {
                g
            } else {
                z1
            }
        };
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

/// One element of batch norm's input gradient, `p * ((x - a) * k) + g * q + r`, in the
/// program's order; `t` = `[a, p, q, r]`.
#[inline(always)]
fn input_grad_one(x: f32, g: f32, k: f32, t: [f32; 4]) -> f32 {
    let [a, p, q, r] = t;
    let cx = binary_scalar(BinaryOp::Sub, x, a);
    let v = binary_scalar(BinaryOp::Mul, cx, k);
    let v = binary_scalar(BinaryOp::Mul, p, v);
    let w = binary_scalar(BinaryOp::Mul, g, q);
    let v = binary_scalar(BinaryOp::Add, v, w);
    binary_scalar(BinaryOp::Add, v, r)
}

/// `(gm, gm * (x - a))` of one element of `BnKernel::MaskGrad`; `k` = `[z, z1]`.
#[inline(always)]
fn mask_grad_one(x: f32, y: f32, g: f32, a: f32, k: [f32; 2]) -> (f32, f32) {
    let cx = binary_scalar(BinaryOp::Sub, x, a);
    let pos = binary_scalar(BinaryOp::Greater, y, k[0]);
    let gm = if pos != 0.0 { g } else { k[1] };
    (gm, binary_scalar(BinaryOp::Mul, gm, cx))
}

/// `(y1 + y2, relu(y1 + y2))` of one element of `BnKernel::AffineSum`, each head given as
/// `[x, a, s, b]`.
#[inline(always)]
fn affine_sum_one(h1: [f32; 4], h2: [f32; 4]) -> (f32, f32) {
    let y = |[x, a, s, b]: [f32; 4]| {
        let v = binary_scalar(BinaryOp::Sub, x, a);
        let v = binary_scalar(BinaryOp::Mul, v, s);
        binary_scalar(BinaryOp::Add, v, b)
    };
    let sum = binary_scalar(BinaryOp::Add, y(h1), y(h2));
    (sum, unary_scalar(UnaryOp::Relu, sum))
}

/// `(x - a, (x - a)²)` of one element of `BnKernel::SquaredDev`.
#[inline(always)]
fn squared_dev_one(x: f32, a: f32) -> (f32, f32) {
    let d = binary_scalar(BinaryOp::Sub, x, a);
    (d, unary_scalar(UnaryOp::Square, d))
}
