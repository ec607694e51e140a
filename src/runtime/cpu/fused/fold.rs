//! Folded reductions: a sum or mean of a group member computed tile by tile while the
//! group runs, so the member is never written out in full. Folds of one member over the
//! same axes share their sums.

use super::exec::{exec, Kernel};
use super::program::Body;
use super::{Opd, Out, OutBuf};
use crate::base::error::Result;
use crate::base::value::Value;
use crate::compile::fuse::{Fold, Group};
use crate::compile::Plan;
use std::cell::RefCell;
use std::sync::Mutex;

/// Fold `f` run as its own node on the whole member value `v`.
pub(super) fn fold_plain(
    plan: &Plan,
    f: &Fold,
    v: &Value,
    slots: &[Option<Value>],
) -> Result<Value> {
    let mut ins: Vec<&Value> = vec![v];
    ins.extend(
        plan.inputs[f.node][1..]
            .iter()
            .map(|&j| slots[j].as_ref().expect("computed before the group")),
    );
    plan.nodes[f.node].op().cpu(&ins)
}

/// Elements per fold tile (rounded up to whole rows or column blocks).
const FOLD_TILE: usize = 8 << 10;
/// Largest row or column block a fold keeps whole in a tile.
const MAX_FOLD_BLOCK: usize = 1 << 16;

/// How one fold adds up its member: `rows` of `red` elements each to one value (axes at
/// the end reduced), or column sums: `red` rows of `inner` columns to `inner` values per
/// block of `red * inner` elements (axes at the start reduced: one block; a run of axes
/// between kept ones, as a global pooling's: a block per index of the axes before them).
pub(super) struct FoldSpec {
    /// The member's buffer among the kernel's outputs, and whether it is hidden (a tile).
    pub(super) out: usize,
    pub(super) hidden: bool,
    pub(super) rows: bool,
    pub(super) red: usize,
    pub(super) inner: usize,
    pub(super) mean: bool,
    pub(super) shape: Vec<usize>,
    /// An earlier fold of the same member over the same axes (a `sum_to` and a `sum` of
    /// one gradient, say), whose sums this one takes instead of adding them up again.
    pub(super) same_as: Option<usize>,
}

/// The folds of one group run, and the partial sums its tasks leave.
pub(super) struct FoldRun {
    pub(super) specs: Vec<FoldSpec>,
    /// Task boundaries fall on multiples of `q` elements; tiles are `tile` elements.
    pub(super) q: usize,
    pub(super) tile: usize,
    pub(super) hidden: usize,
    /// Per task: its first element and, per fold, its sums (f64; for `rows`, one per row
    /// of the task, else one per column).
    pub(super) parts: Mutex<Vec<(usize, Vec<Vec<f64>>)>>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The fused plan of `g`'s folds for this run's shapes, or `None` to run them on the
/// written-out members (a reduction pattern other than leading or trailing axes, a member
/// passed through from an input, blocks too long for a tile).
pub(super) fn fold_run(
    plan: &Plan,
    g: &Group,
    b: &Body,
    written: &[usize],
    slots: &[Option<Value>],
) -> Option<FoldRun> {
    let s = &b.shape;
    let mut specs = Vec::with_capacity(g.folds.len());
    let mut q = 1usize;
    for f in &g.folds {
        let k = written.iter().position(|&w| w == f.member)?;
        if !matches!(b.outs[k], Out::F32(_)) {
            return None;
        }
        let out = b.outs[..k]
            .iter()
            .filter(|o| !matches!(o, Out::Passed(_)))
            .count();
        let target = plan.inputs[f.node].get(1).and_then(|&j| slots[j].as_ref());
        let a = f.axes(plan, s, target)?;
        let (red, mean, shape) = (a.red, a.mean, a.out);
        // The reduced axes lead the kept ones (column sums: one block, also where nothing
        // is reduced), trail them (row sums), or run between them (column sums of each
        // block of `red * inner` elements).
        let (rows, block, inner) = if a.leading {
            (false, a.kept, a.kept)
        } else if a.trailing {
            (true, red, a.kept)
        } else if a.run {
            (false, a.inner, a.inner)
        } else {
            return None;
        };
        if block > MAX_FOLD_BLOCK {
            return None;
        }
        q = q / gcd(q, block) * block;
        if q > MAX_FOLD_BLOCK {
            return None;
        }
        let same_as = specs
            .iter()
            .position(|f: &FoldSpec| (f.out, f.rows, f.red, f.inner) == (out, rows, red, inner));
        specs.push(FoldSpec {
            out,
            hidden: k >= g.outputs.len(),
            rows,
            red,
            inner,
            mean,
            shape,
            same_as,
        });
    }
    let tile = FOLD_TILE.div_ceil(q) * q;
    let hidden = specs.iter().filter(|f| f.hidden).count();
    Some(FoldRun {
        specs,
        q,
        tile,
        hidden,
        parts: Mutex::new(Vec::new()),
    })
}

thread_local! {
    /// Tiles of hidden members (`fold_exec`).
    static FOLD_TILES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs elements `[start, end)` (whole rows and column blocks of every fold) tile by
/// tile, adding each folded member's tile into this task's sums while it is in cache.
pub(super) fn fold_exec(k: &Kernel<'_>, f: &FoldRun, start: usize, end: usize) {
    let mut parts: Vec<Vec<f64>> = f
        .specs
        .iter()
        .map(|s| match (s.same_as, s.rows) {
            (Some(_), _) => Vec::new(),
            (None, true) => vec![0.0; (end - start).div_ceil(s.red)],
            (None, false) => vec![0.0; s.blocks(start, end) * s.inner],
        })
        .collect();
    let mut cols: Vec<f32> = Vec::new();
    FOLD_TILES.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() < f.hidden * f.tile {
            t.resize(f.hidden * f.tile, 0.0);
        }
        let base = t.as_mut_ptr();
        let mut outs: Vec<(Opd, OutBuf)> = k.outs.to_vec();
        let mut ts = start;
        while ts < end {
            let te = end.min(ts + f.tile);
            let mut h = 0;
            for s in &f.specs {
                if s.hidden {
                    // Offset back so that element `ts` lands at the tile's start.
                    outs[s.out].1 = OutBuf::F32(base.wrapping_add(h * f.tile).wrapping_sub(ts));
                    h += 1;
                }
            }
            exec(
                &Kernel {
                    outs: &outs,
                    folds: None,
                    ..*k
                },
                ts,
                te,
            );
            for (s, part) in f.specs.iter().zip(&mut parts) {
                if s.same_as.is_some() {
                    continue;
                }
                let OutBuf::F32(p) = outs[s.out].1 else {
                    unreachable!("folded members are f32")
                };
                // SAFETY: the kernel has just written elements [ts, te) of this buffer.
                let x = unsafe { std::slice::from_raw_parts(p.wrapping_add(ts), te - ts) };
                if s.rows {
                    for (r, row) in x.chunks(s.red).enumerate() {
                        part[(ts - start) / s.red + r] += crate::ops::reduce::sum_f32(row) as f64;
                    }
                } else {
                    // The tile's runs within one block each (a tile may end one block and
                    // start the next).
                    let blk = s.block_len();
                    let mut a = ts;
                    while a < te {
                        let b = te.min((a / blk + 1) * blk);
                        let x = &x[a - ts..b - ts];
                        let at = (a / blk - start / blk) * s.inner;
                        let part = &mut part[at..at + s.inner];
                        if s.inner == 1 {
                            part[0] += crate::ops::reduce::sum_f32(x) as f64;
                        } else {
                            cols.clear();
                            cols.resize(s.inner, 0.0);
                            crate::ops::reduce::fold_sum_f32(
                                &mut cols,
                                x,
                                x.len() / s.inner,
                                s.inner,
                            );
                            part.iter_mut()
                                .zip(&cols)
                                .for_each(|(a, &c)| *a += c as f64);
                        }
                        a = b;
                    }
                }
            }
            ts = te;
        }
    });
    f.parts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((start, parts));
}

impl FoldSpec {
    /// Elements of one block of column sums, `red * inner` (at least 1).
    fn block_len(&self) -> usize {
        (self.red * self.inner).max(1)
    }
    /// Blocks of `red * inner` elements that elements `[start, end)` touch (column sums).
    fn blocks(&self, start: usize, end: usize) -> usize {
        let blk = self.block_len();
        if end > start {
            (end - 1) / blk - start / blk + 1
        } else {
            0
        }
    }
}

impl FoldRun {
    /// The folds' results, from the tasks' sums in element order.
    pub(super) fn finish(self) -> Vec<Value> {
        let mut parts = self.parts.into_inner().unwrap_or_else(|e| e.into_inner());
        parts.sort_unstable_by_key(|p| p.0);
        self.specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let i = s.same_as.unwrap_or(i);
                let sums: Vec<f64> = if s.rows {
                    parts.iter().flat_map(|p| p.1[i].iter().copied()).collect()
                } else {
                    let mut acc = vec![0.0f64; s.shape.iter().product()];
                    for p in &parts {
                        let at = p.0 / s.block_len() * s.inner;
                        acc[at..at + p.1[i].len()]
                            .iter_mut()
                            .zip(&p.1[i])
                            .for_each(|(a, &v)| *a += v);
                    }
                    acc
                };
                let div = if s.mean { s.red as f64 } else { 1.0 };
                let v: Vec<f32> = sums.iter().map(|&a| (a / div) as f32).collect();
                Value::from_vec(&s.shape, v).expect("the fold's shape holds its sums")
            })
            .collect()
    }
}
