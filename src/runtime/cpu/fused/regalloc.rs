//! The register allocator: maps a program's virtual registers to as few physical
//! chunk registers as values are live at once.

use super::{Ins, Opd, LOAD_BASE, OUT_BASE};

pub(super) fn operands(ins: Ins) -> impl Iterator<Item = Opd> {
    let (a, b, c) = match ins {
        Ins::Load(..) => (None, None, None),
        Ins::Unary(_, a, _) | Ins::Not(a, _) | Ins::ToBool(a, _) => (Some(a), None, None),
        Ins::Binary(_, a, b, _) => (Some(a), Some(b), None),
        Ins::Select(c, a, b, _) => (Some(c), Some(a), Some(b)),
    };
    a.into_iter().chain(b).chain(c)
}

/// Maps virtual registers (instruction results `0..vregs`, gathered inputs from
/// `LOAD_BASE`) to physical ones, so a chunk needs as many registers as values are live.
pub(super) fn allocate(
    prog: Vec<Ins>,
    outs: &[Opd],
    nloads: usize,
    vregs: u16,
) -> (Vec<Ins>, Vec<Opd>, usize) {
    let mut seq: Vec<Ins> = (0..nloads)
        .map(|k| Ins::Load(k as u16, LOAD_BASE + k as u16))
        .collect();
    seq.extend(prog);
    let key = |r: u16| -> usize {
        if r >= LOAD_BASE {
            vregs as usize + (r - LOAD_BASE) as usize
        } else {
            r as usize
        }
    };
    let total = vregs as usize + nloads;
    let mut last: Vec<Option<usize>> = vec![None; total];
    for (t, ins) in seq.iter().enumerate() {
        for o in operands(*ins) {
            if let Opd::Reg(r) = o {
                last[key(r)] = Some(t);
            }
        }
    }
    for o in outs {
        if let Opd::Reg(r) = o {
            last[key(*r)] = Some(usize::MAX);
        }
    }
    let mut phys: Vec<u16> = vec![u16::MAX; total];
    let mut free: Vec<u16> = Vec::new();
    let mut nregs = 0u16;
    let remap = |o: Opd, phys: &[u16]| match o {
        Opd::Reg(r) => Opd::Reg(phys[key(r)]),
        Opd::Ext(_) | Opd::Scal(_) | Opd::Out(_) | Opd::Tile(_) => o,
    };
    let mut out_seq = Vec::with_capacity(seq.len());
    for (t, ins) in seq.into_iter().enumerate() {
        let d = match ins {
            Ins::Load(_, d)
            | Ins::Unary(_, _, d)
            | Ins::Not(_, d)
            | Ins::ToBool(_, d)
            | Ins::Binary(_, _, _, d)
            | Ins::Select(_, _, _, d) => d,
        };
        let to_out = (OUT_BASE..LOAD_BASE).contains(&d);
        let p = if to_out {
            d
        } else {
            let p = free.pop().unwrap_or_else(|| {
                nregs += 1;
                nregs - 1
            });
            phys[key(d)] = p;
            p
        };
        let r = |o: Opd| remap(o, &phys);
        out_seq.push(match ins {
            Ins::Load(k, _) => Ins::Load(k, p),
            Ins::Unary(u, a, _) => Ins::Unary(u, r(a), p),
            Ins::Not(a, _) => Ins::Not(r(a), p),
            Ins::ToBool(a, _) => Ins::ToBool(r(a), p),
            Ins::Binary(b, x, y, _) => Ins::Binary(b, r(x), r(y), p),
            Ins::Select(c, x, y, _) => Ins::Select(r(c), r(x), r(y), p),
        });
        // Operands read for the last time are freed after the destination was chosen, so
        // an instruction never writes a register it reads.
        let mut dead: Vec<u16> = operands(ins)
            .filter_map(|o| match o {
                Opd::Reg(v) if last[key(v)] == Some(t) => Some(phys[key(v)]),
                Opd::Reg(_) | Opd::Ext(_) | Opd::Scal(_) | Opd::Out(_) | Opd::Tile(_) => None,
            })
            .collect();
        dead.sort_unstable();
        dead.dedup();
        free.extend(dead);
        if !to_out && last[key(d)].is_none() {
            free.push(p);
        }
    }
    let outs = outs.iter().map(|&o| remap(o, &phys)).collect();
    (out_seq, outs, nregs as usize)
}
