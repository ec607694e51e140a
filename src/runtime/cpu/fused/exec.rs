//! The chunk executor: runs a compiled program over element ranges, chunk by chunk, on
//! raw pointers into the inputs, outputs and this thread's scratch registers. All of the
//! fusion kernel's `unsafe` code is here.

use super::affine::{self, BnKernel};
use super::fold::{fold_exec, FoldRun};
use super::layout::Layout;
use super::update::{self, UpdateKernel};
use super::{Data, Ins, Opd, OutBuf, CH, LOAD_BASE, OUT_BASE};
use crate::ops::elementwise::{Lane, Splat};
use crate::ops::{BinaryOp, UnaryOp};
use std::cell::RefCell;
use std::mem::MaybeUninit;

pub(super) struct Kernel<'a> {
    pub(super) prog: &'a [Ins],
    pub(super) nregs: usize,
    pub(super) ext: &'a [*const f32],
    pub(super) loads: &'a [Layout],
    pub(super) data: &'a [Data],
    /// Per `Opd::Tile`: (one period tiled to `period + min(CH, n)` elements, period).
    pub(super) tiles: &'a [(*const f32, usize)],
    pub(super) scal: &'a [f32],
    pub(super) outs: &'a [(Opd, OutBuf)],
    /// A recognised update rule and the outputs' buffers in group output order.
    pub(super) update: Option<(&'a UpdateKernel, &'a [*mut f32])>,
    /// A recognised batch-norm kernel (writing `outs`).
    pub(super) bn: Option<&'a BnKernel>,
    /// The group's folds, when they run fused: `exec` then runs tile by tile.
    pub(super) folds: Option<&'a FoldRun>,
}

// SAFETY: the pointers are into buffers that outlive the parallel loop; tasks write
// disjoint ranges of the outputs and only read the inputs.
unsafe impl Sync for Kernel<'_> {}
unsafe impl Send for Kernel<'_> {}

#[inline(always)]
pub(super) fn unary_scalar(op: UnaryOp, x: f32) -> f32 {
    let mut out = [MaybeUninit::new(0.0f32)];
    op.map(&[x], &mut out);
    // SAFETY: map wrote out[0].
    unsafe { out[0].assume_init() }
}

#[inline(always)]
pub(super) fn binary_scalar(op: BinaryOp, a: f32, b: f32) -> f32 {
    let mut out = [MaybeUninit::new(0.0f32)];
    op.zip(Splat(a), Splat(b), &mut out);
    // SAFETY: zip wrote out[0].
    unsafe { out[0].assume_init() }
}

/// One instruction on single values (members whose inputs are all scalars).
pub(super) fn eval_scalar(ins: Ins, scal: &[f32]) -> f32 {
    let v = |o: Opd| match o {
        Opd::Scal(k) => scal[k as usize],
        Opd::Reg(_) | Opd::Ext(_) | Opd::Out(_) | Opd::Tile(_) => {
            unreachable!("scalar operands only")
        }
    };
    match ins {
        Ins::Unary(op, a, _) => unary_scalar(op, v(a)),
        Ins::Not(a, _) => (v(a) == 0.0) as u8 as f32,
        Ins::ToBool(a, _) => (v(a) != 0.0) as u8 as f32,
        Ins::Binary(op, a, b, _) => binary_scalar(op, v(a), v(b)),
        Ins::Select(c, a, b, _) => {
            if v(c) != 0.0 {
                v(a)
            } else {
                v(b)
            }
        }
        Ins::Load(..) => unreachable!("loads have no scalar form"),
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs elements `[start, end)` with this thread's scratch registers.
pub(super) fn exec(k: &Kernel<'_>, start: usize, end: usize) {
    if let Some(f) = k.folds {
        return fold_exec(k, f, start, end);
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < k.nregs * CH {
            s.resize(k.nregs * CH, 0.0);
        }
        exec_chunks(k, s.as_mut_ptr(), start, end)
    })
}

// The chunk loop itself is the instruction-set-dispatched function: a closure (such as
// the one `with` takes) would be compiled without the wider instruction sets.
#[inline(always)]
fn exec_chunks_body(k: &Kernel<'_>, regs: *mut f32, start: usize, end: usize) {
    if let Some((sp, outs)) = k.update {
        // SAFETY: the inputs and outputs hold n >= end elements each.
        unsafe { update::run(sp, k.ext, k.scal, outs, start, end - start) };
        return;
    }
    if let Some(bn) = k.bn {
        // SAFETY: the inputs and outputs hold n >= end elements each, a tile one period.
        if unsafe { affine::run(bn, k.ext, k.tiles, k.scal, k.outs, start, end) } {
            return;
        }
    }
    let mut off = start;
    while off < end {
        let len = CH.min(end - off);
        // SAFETY: `regs` has nregs * CH elements; `off + len <= n` for every input and output.
        unsafe { chunk(k, regs, off, len) };
        off += len;
    }
}
crate::multiversion!(fn exec_chunks(k: &Kernel<'_>, regs: *mut f32, start: usize, end: usize) => exec_chunks_body);

enum Src<'a> {
    S(&'a [f32]),
    C(f32),
}

/// # Safety
/// As `chunk`; the slice must not overlap a live `reg_mut` of the same register.
#[inline(always)]
unsafe fn source<'a>(k: &Kernel<'_>, regs: *mut f32, o: Opd, off: usize, len: usize) -> Src<'a> {
    match o {
        Opd::Reg(r) => Src::S(std::slice::from_raw_parts(regs.add(r as usize * CH), len)),
        Opd::Ext(e) => Src::S(std::slice::from_raw_parts(k.ext[e as usize].add(off), len)),
        Opd::Scal(v) => Src::C(k.scal[v as usize]),
        Opd::Tile(t) => {
            let (p, period) = k.tiles[t as usize];
            Src::S(std::slice::from_raw_parts(p.add(off % period), len))
        }
        // Output pointers may be offset back from a tile's buffer (`fold_exec`): wrapping
        // arithmetic, since only the element reached is within the allocation.
        Opd::Out(s) => match k.outs[s as usize].1 {
            OutBuf::F32(p) => Src::S(std::slice::from_raw_parts(p.wrapping_add(off), len)),
            OutBuf::Bool(_) => unreachable!("direct writes are f32"),
        },
    }
}

/// # Safety
/// As `chunk`; register `r` must not be read while the slice lives.
#[inline(always)]
unsafe fn reg_mut<'a>(regs: *mut f32, r: u16, len: usize) -> &'a mut [MaybeUninit<f32>] {
    std::slice::from_raw_parts_mut(regs.add(r as usize * CH).cast(), len)
}

/// # Safety
/// `regs` holds `k.nregs * CH` floats; `[off, off + len)` is within every buffer.
#[inline(always)]
unsafe fn chunk(k: &Kernel<'_>, regs: *mut f32, off: usize, len: usize) {
    let src = |o: Opd| source(k, regs, o, off, len);
    // The destination is never one of the instruction's operands (`allocate`, `direct_writes`).
    let dst = |r: u16| match r {
        OUT_BASE..LOAD_BASE => match k.outs[(r - OUT_BASE) as usize].1 {
            OutBuf::F32(p) => std::slice::from_raw_parts_mut(p.wrapping_add(off).cast(), len),
            OutBuf::Bool(_) => unreachable!("direct writes are f32"),
        },
        _ => reg_mut(regs, r, len),
    };
    for &ins in k.prog {
        match ins {
            Ins::Load(l, d) => gather(&k.loads[l as usize], k.data[l as usize], off, dst(d)),
            Ins::Unary(op, a, d) => match src(a) {
                Src::S(x) => op.map(x, dst(d)),
                Src::C(x) => fill(dst(d), unary_scalar(op, x)),
            },
            Ins::Not(a, d) => match src(a) {
                Src::S(x) => map(x, dst(d), |v| (v == 0.0) as u8 as f32),
                Src::C(x) => fill(dst(d), (x == 0.0) as u8 as f32),
            },
            Ins::ToBool(a, d) => match src(a) {
                Src::S(x) => map(x, dst(d), |v| (v != 0.0) as u8 as f32),
                Src::C(x) => fill(dst(d), (x != 0.0) as u8 as f32),
            },
            Ins::Binary(op, a, b, d) => match (src(a), src(b)) {
                (Src::S(x), Src::S(y)) => op.zip(x, y, dst(d)),
                (Src::S(x), Src::C(y)) => op.zip(x, Splat(y), dst(d)),
                (Src::C(x), Src::S(y)) => op.zip(Splat(x), y, dst(d)),
                (Src::C(x), Src::C(y)) => op.zip(Splat(x), Splat(y), dst(d)),
            },
            Ins::Select(c, a, b, d) => match src(c) {
                Src::C(c) => match src(if c != 0.0 { a } else { b }) {
                    Src::S(x) => map(x, dst(d), |v| v),
                    Src::C(x) => fill(dst(d), x),
                },
                Src::S(c) => match (src(a), src(b)) {
                    (Src::S(x), Src::S(y)) => select(c, x, y, dst(d)),
                    (Src::S(x), Src::C(y)) => select(c, x, Splat(y), dst(d)),
                    (Src::C(x), Src::S(y)) => select(c, Splat(x), y, dst(d)),
                    (Src::C(x), Src::C(y)) => select(c, Splat(x), Splat(y), dst(d)),
                },
            },
        }
    }
    for (s, (o, buf)) in k.outs.iter().enumerate() {
        if matches!(o, Opd::Out(w) if *w as usize == s) {
            continue;
        }
        match buf {
            OutBuf::F32(p) => {
                let out: &mut [MaybeUninit<f32>] =
                    std::slice::from_raw_parts_mut(p.wrapping_add(off).cast(), len);
                match src(*o) {
                    Src::S(x) => map(x, out, |v| v),
                    Src::C(x) => fill(out, x),
                }
            }
            OutBuf::Bool(p) => {
                let out: &mut [MaybeUninit<bool>] =
                    std::slice::from_raw_parts_mut(p.add(off).cast(), len);
                match src(*o) {
                    Src::S(x) => {
                        for (o, &v) in out.iter_mut().zip(x) {
                            o.write(v != 0.0);
                        }
                    }
                    Src::C(x) => out.iter_mut().for_each(|o| {
                        o.write(x != 0.0);
                    }),
                }
            }
        }
    }
}

#[inline(always)]
fn map(x: &[f32], out: &mut [MaybeUninit<f32>], f: impl Fn(f32) -> f32) {
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(f(v));
    }
}

#[inline(always)]
fn fill(out: &mut [MaybeUninit<f32>], v: f32) {
    out.iter_mut().for_each(|o| {
        o.write(v);
    });
}

#[inline(always)]
fn select<A: Lane<f32>, B: Lane<f32>>(c: &[f32], a: A, b: B, out: &mut [MaybeUninit<f32>]) {
    let n = out.len();
    let (c, a, b) = (&c[..n], a.fit(n), b.fit(n));
    // A bit mask rather than `if`: with the branch the compiler picks an address and loads
    // once per element, which does not vectorise.
    for (i, o) in out.iter_mut().enumerate() {
        let m = 0u32.wrapping_sub((c[i] != 0.0) as u32);
        // SAFETY: i < n, the length both operands were fitted to.
        let (x, y) = unsafe { (a.at(i), b.at(i)) };
        o.write(f32::from_bits((x.to_bits() & m) | (y.to_bits() & !m)));
    }
}

/// Reads elements `[off, off + out.len())` of the broadcast input into `out`.
#[inline(always)]
unsafe fn gather(g: &Layout, data: Data, off: usize, out: &mut [MaybeUninit<f32>]) {
    let r = g.dims.len();
    // Multi-index of `off` and the input offset it maps to.
    let mut idx = [0usize; 16];
    let mut rem = off;
    let mut base = g.offset;
    for d in (0..r).rev() {
        idx[d] = rem % g.dims[d];
        rem /= g.dims[d];
        base += idx[d] * g.strides[d];
    }
    let (inner, ist) = (g.dims[r - 1], g.strides[r - 1]);
    let mut done = 0;
    while done < out.len() {
        let run = (inner - idx[r - 1]).min(out.len() - done);
        let o = &mut out[done..done + run];
        match (data, ist) {
            (Data::F32(p), 0) => fill(o, *p.add(base)),
            (Data::F32(p), 1) => map(std::slice::from_raw_parts(p.add(base), run), o, |v| v),
            (Data::F32(p), s) => o.iter_mut().enumerate().for_each(|(i, o)| {
                o.write(*p.add(base + i * s));
            }),
            (Data::Bool(p), s) => o.iter_mut().enumerate().for_each(|(i, o)| {
                o.write(*p.add(base + i * s) as u8 as f32);
            }),
        }
        done += run;
        // Advance the multi-index by `run` (the inner dim wraps at most once per run).
        idx[r - 1] += run;
        base += run * ist;
        let mut d = r - 1;
        while d > 0 && idx[d] == g.dims[d] {
            base -= idx[d] * g.strides[d];
            idx[d] = 0;
            idx[d - 1] += 1;
            base += g.strides[d - 1];
            d -= 1;
        }
    }
}
