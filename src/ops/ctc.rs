//! Connectionist temporal classification: the loss by log-space forward-backward (Graves et
//! al., 2006), its gradient w.r.t. the logits, and greedy / prefix-beam-search decoding.
//! Blank is the last class, as in TensorFlow. Samples run in parallel.

use super::control::tuple_get;
use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::ops::graph::Tensor;
use crate::value_err;
use rayon::prelude::*;
use std::collections::HashMap;

// ---- ctc loss ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtcOp {
    /// (logits (B,T,C), labels (B,L), input_len (B,), label_len (B,)) -> loss (B,)
    Loss,
    /// Same inputs -> d loss / d logits (B,T,C).
    Grad,
}

pub fn ctc(
    op: CtcOp,
    logits: &Tensor,
    labels: &Tensor,
    in_len: &Tensor,
    lab_len: &Tensor,
) -> Result<Tensor> {
    Tensor::new(
        Op::Ctc(op),
        vec![
            logits.clone(),
            labels.clone(),
            in_len.clone(),
            lab_len.clone(),
        ],
    )
}

pub fn infer(op: CtcOp, ins: &[Tensor]) -> Result<(Shape, DType)> {
    let x = &ins[0];
    if !x.dtype().is_float() || x.rank() != 3 {
        return Err(Error::Type(format!(
            "ctc: y_pred must be a float tensor (samples, time, classes), got {} {}",
            x.dtype(),
            x.shape()
        )));
    }
    for (t, what) in ins[1..]
        .iter()
        .zip(["labels", "input_length", "label_length"])
    {
        if !t.dtype().is_int() {
            return Err(Error::Type(format!(
                "ctc: {what} must be integers, got {}",
                t.dtype()
            )));
        }
    }
    Ok(match op {
        CtcOp::Loss => (Shape(vec![x.shape().dims()[0]]), x.dtype()),
        CtcOp::Grad => (x.shape().clone(), x.dtype()),
    })
}

pub fn vjp(op: CtcOp, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    use super::build::*;
    match op {
        CtcOp::Loss => {
            let i = node.inputs();
            let grad = ctc(CtcOp::Grad, &i[0], &i[1], &i[2], &i[3])?;
            Ok(vec![
                Some(mul(&grad, &expand_dims(g, &[1, 2])?)?),
                None,
                None,
                None,
            ])
        }
        CtcOp::Grad => Err(Error::Unsupported(
            "ctc: the gradient of the CTC loss is not differentiable again".into(),
        )),
    }
}

pub fn cpu(op: CtcOp, args: &[&Value]) -> Result<Value> {
    let bt = batch(args)?;
    let dtype = args[0].dtype();
    match op {
        CtcOp::Loss => {
            let loss: Vec<f64> = (0..bt.b)
                .into_par_iter()
                .map(|i| -bt.sample(i).forward_backward().2)
                .collect();
            Ok(Value::from_vec(&[bt.b], loss)?.cast(dtype))
        }
        CtcOp::Grad => {
            let (t_all, c) = (bt.t, bt.c);
            let mut grad = vec![0.0f64; bt.b * t_all * c];
            grad.par_chunks_mut(t_all * c)
                .enumerate()
                .for_each(|(i, gi)| {
                    let smp = bt.sample(i);
                    let (alpha, beta, logp) = smp.forward_backward();
                    if !logp.is_finite() {
                        return;
                    }
                    let s_len = 2 * smp.labels.len() + 1;
                    for t in 0..smp.t {
                        let row = &mut gi[t * c..(t + 1) * c];
                        let mut occ: HashMap<usize, f64> = HashMap::new();
                        for s in 0..s_len {
                            let v = alpha[t * s_len + s] + beta[t * s_len + s];
                            let e = occ.entry(smp.ext(s)).or_insert(f64::NEG_INFINITY);
                            *e = lse(*e, v);
                        }
                        for k in 0..c {
                            let p = smp.lp[t * c + k].exp();
                            let gamma = occ.get(&k).map_or(0.0, |&v| (v - logp).exp());
                            row[k] = p - gamma;
                        }
                    }
                });
            Ok(Value::from_vec(&[bt.b, t_all, c], grad)?.cast(dtype))
        }
    }
}

// ---- ctc decode ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decode {
    pub greedy: bool,
    pub beam_width: usize,
    pub top_paths: usize,
}

/// Decoding node over (log-probs (B,T,C), input_len (B,)); results, via `TupleGet`: one
/// decoded (B, max_len) int64 matrix padded with -1 per path, then log-probs (B, top_paths).
pub fn decode(d: Decode, x: &Tensor, in_len: &Tensor) -> Result<Vec<Tensor>> {
    if d.top_paths == 0 || d.beam_width == 0 || (!d.greedy && d.top_paths > d.beam_width) {
        return Err(value_err!(
            "ctc_decode: need 1 <= top_paths <= beam_width, got top_paths={} beam_width={}",
            d.top_paths,
            d.beam_width
        ));
    }
    let node = Tensor::new(Op::CtcDecode(d), vec![x.clone(), in_len.clone()])?;
    let n = if d.greedy { 2 } else { d.top_paths + 1 };
    (0..n).map(|k| tuple_get(&node, k)).collect()
}

pub fn decode_result_spec(d: Decode, node: &Tensor, k: usize) -> Result<(Shape, DType)> {
    let paths = if d.greedy { 1 } else { d.top_paths };
    let b = node.inputs()[0].shape().dims()[0];
    if k < paths {
        Ok((Shape(vec![b, None]), DType::I64))
    } else if k == paths {
        Ok((Shape(vec![b, Some(paths)]), node.inputs()[0].dtype()))
    } else {
        Err(value_err!("ctc_decode: result {k} out of range"))
    }
}

pub fn run_decode(d: Decode, args: &[&Value]) -> Result<Vec<Value>> {
    let x = args[0];
    let s = x.shape();
    if s.len() != 3 {
        return Err(value_err!(
            "ctc_decode: y_pred must have shape (samples, time, classes), got {s:?}"
        ));
    }
    let (b, t_all, c) = (s[0], s[1], s[2]);
    if c < 1 {
        return Err(value_err!(
            "ctc_decode: y_pred needs at least one class (the blank)"
        ));
    }
    let lens = args[1].to_i64_vec();
    if lens.len() != b || lens.iter().any(|&n| n < 0 || n as usize > t_all) {
        return Err(value_err!(
            "ctc_decode: input_length must hold {b} lengths in [0, {t_all}], got {lens:?}"
        ));
    }
    let all = x.to_f64_vec();
    let paths = if d.greedy { 1 } else { d.top_paths };
    let per: Vec<Vec<(Vec<i64>, f64)>> = (0..b)
        .into_par_iter()
        .map(|i| {
            let t = lens[i] as usize;
            let lp = &all[i * t_all * c..i * t_all * c + t * c];
            if d.greedy {
                vec![greedy(lp, t, c)]
            } else {
                let mut paths = beam(lp, t, c, d.beam_width, d.top_paths);
                for (p, _) in &mut paths {
                    p.dedup();
                }
                paths
            }
        })
        .collect();
    let mut out = Vec::with_capacity(paths + 1);
    for p in 0..paths {
        let width = per.iter().map(|r| r[p].0.len()).max().unwrap_or(0);
        let mut m = vec![-1i64; b * width];
        for (i, r) in per.iter().enumerate() {
            m[i * width..i * width + r[p].0.len()].copy_from_slice(&r[p].0);
        }
        out.push(Value::from_vec(&[b, width], m)?);
    }
    let scores: Vec<f64> = per.iter().flat_map(|r| r.iter().map(|(_, s)| *s)).collect();
    out.push(Value::from_vec(&[b, paths], scores)?.cast(x.dtype()));
    Ok(out)
}

fn greedy(lp: &[f64], t: usize, c: usize) -> (Vec<i64>, f64) {
    let mut out = Vec::new();
    let mut score = 0.0;
    let mut prev = usize::MAX;
    for k in 0..t {
        let row = &lp[k * c..(k + 1) * c];
        let (best, &v) =
            row.iter().enumerate().fold(
                (0, &f64::NEG_INFINITY),
                |a, b| if *b.1 > *a.1 { b } else { a },
            );
        score += v;
        if best != c - 1 && best != prev {
            out.push(best as i64);
        }
        prev = best;
    }
    // TensorFlow's greedy decoder reports the negative sum of the best logits.
    (out, -score)
}

/// Log-probabilities of a beam entry: of its labelling ending in a blank, in its last
/// label, and in either.
#[derive(Clone, Copy)]
struct BeamProb {
    blank: f64,
    label: f64,
    total: f64,
}

impl BeamProb {
    const ZERO: BeamProb = BeamProb {
        blank: f64::NEG_INFINITY,
        label: f64::NEG_INFINITY,
        total: f64::NEG_INFINITY,
    };
}

/// A node of the beam's prefix tree: the labelling of the path from the root (`parent`
/// is `None` at the root, whose `label` is -1).
struct BeamEntry {
    parent: Option<usize>,
    label: i64,
    children: HashMap<i64, usize>,
    oldp: BeamProb,
    newp: BeamProb,
}

impl BeamEntry {
    fn active(&self) -> bool {
        self.newp.total != f64::NEG_INFINITY
    }

    /// Log-probability, at the step before, of this entry's labelling in a state `label`
    /// may follow: a repeat of its last label needs a blank between.
    fn before(&self, label: i64) -> f64 {
        if label == self.label {
            self.oldp.blank
        } else {
            self.oldp.total
        }
    }
}

/// TensorFlow's CTC beam search (`CTCBeamSearchDecoder` with its default scorer, which
/// Keras's `ctc_decode(greedy=False)` calls): the `top` best labellings and their
/// log-probabilities, followed step by step as TF does, so that the same paths and scores
/// come out. Its beam is a prefix tree whose entries keep their probabilities only while
/// they stay in the beam: an entry that falls out and is grown again later starts afresh,
/// and a labelling is only extended from entries whose previous probability could enter
/// the beam. Fewer entries than `top` are padded with empty labellings of
/// log-probability `-inf`. `run_decode` then merges repeated labels in each labelling,
/// as TF's `merge_repeated=True` (which Keras's backends leave) does: `[2, 1, 1]` is
/// returned as `[2, 1]`, with its score.
fn beam(lp: &[f64], t: usize, c: usize, width: usize, top: usize) -> Vec<(Vec<i64>, f64)> {
    let ninf = f64::NEG_INFINITY;
    let blank = c - 1;
    let root = BeamEntry {
        parent: None,
        label: -1,
        children: HashMap::new(),
        oldp: BeamProb::ZERO,
        newp: BeamProb {
            blank: 0.0,
            label: ninf,
            total: 0.0,
        },
    };
    let mut tree = vec![root];
    let mut leaves: Vec<usize> = vec![0];
    // Best first, as TF's `TopN::Extract`; equal totals keep the earlier entry first.
    let sorted = |leaves: &[usize], tree: &[BeamEntry]| {
        let mut v = leaves.to_vec();
        v.sort_by(|&a, &b| tree[b].newp.total.total_cmp(&tree[a].newp.total));
        v
    };
    // Where the beam is full, the position in `leaves` of its worst entry.
    let bottom = |leaves: &[usize], tree: &[BeamEntry]| {
        (leaves.len() == width).then(|| {
            (0..leaves.len())
                .min_by(|&i, &j| {
                    tree[leaves[i]]
                        .newp
                        .total
                        .total_cmp(&tree[leaves[j]].newp.total)
                })
                .expect("a full beam")
        })
    };
    // Whether an entry of log-probability `total` enters the beam (and which entry it
    // replaces), as TF's `is_candidate`.
    let enters = |total: f64, leaves: &[usize], tree: &[BeamEntry]| {
        let out = bottom(leaves, tree);
        let fits = total > ninf && out.is_none_or(|o| total > tree[leaves[o]].newp.total);
        fits.then_some(out)
    };
    for k in 0..t {
        let row = &lp[k * c..(k + 1) * c];
        let branches = sorted(&leaves, &tree);
        leaves.clear();
        for &b in &branches {
            tree[b].oldp = tree[b].newp;
        }
        // Existing entries: stay on their last label, or come from their parent.
        for &b in &branches {
            let (parent, label) = (tree[b].parent, tree[b].label);
            if let Some(p) = parent {
                if tree[p].active() {
                    tree[b].newp.label = lse(tree[b].newp.label, tree[p].before(label));
                }
                tree[b].newp.label += row[label as usize];
            }
            let e = &mut tree[b];
            e.newp.blank = e.oldp.total + row[blank];
            e.newp.total = lse(e.newp.blank, e.newp.label);
            leaves.push(b);
        }
        // New entries: each branch that could enter the beam, extended by each label.
        for &b in &branches {
            if enters(tree[b].oldp.total, &leaves, &tree).is_none() {
                continue;
            }
            for label in (0..c as i64).filter(|&l| l != blank as i64) {
                let child = match tree[b].children.get(&label) {
                    Some(&i) => i,
                    None => {
                        tree.push(BeamEntry {
                            parent: Some(b),
                            label,
                            children: HashMap::new(),
                            oldp: BeamProb::ZERO,
                            newp: BeamProb::ZERO,
                        });
                        let i = tree.len() - 1;
                        tree[b].children.insert(label, i);
                        i
                    }
                };
                if tree[child].active() {
                    continue;
                }
                let score = row[label as usize] + tree[b].before(label);
                tree[child].newp = BeamProb {
                    blank: ninf,
                    label: score,
                    total: score,
                };
                match enters(score, &leaves, &tree) {
                    Some(replaced) => {
                        if let Some(o) = replaced {
                            let out = leaves.swap_remove(o);
                            tree[out].newp = BeamProb::ZERO;
                        }
                        leaves.push(child);
                    }
                    None => {
                        tree[child].oldp = BeamProb::ZERO;
                        tree[child].newp = BeamProb::ZERO;
                    }
                }
            }
        }
    }
    let mut out: Vec<(Vec<i64>, f64)> = sorted(&leaves, &tree)
        .into_iter()
        .take(top)
        .map(|e| {
            let score = tree[e].newp.total;
            let mut labels = Vec::new();
            let mut at = e;
            while let Some(p) = tree[at].parent {
                labels.push(tree[at].label);
                at = p;
            }
            labels.reverse();
            (labels, score)
        })
        .collect();
    while out.len() < top {
        out.push((vec![], ninf));
    }
    out
}

// ---- helpers ----

fn lse(a: f64, b: f64) -> f64 {
    if a == f64::NEG_INFINITY {
        return b;
    }
    if b == f64::NEG_INFINITY {
        return a;
    }
    let m = a.max(b);
    m + ((a - m).exp() + (b - m).exp()).ln()
}

fn log_softmax_row(row: &[f64], out: &mut [f64]) {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = row.iter().map(|&v| (v - m).exp()).sum();
    let l = m + s.ln();
    out.iter_mut().zip(row).for_each(|(o, &v)| *o = v - l);
}

struct Sample<'a> {
    lp: Vec<f64>, // (T, C) log-probabilities
    t: usize,
    c: usize,
    labels: &'a [i64],
}

impl Sample<'_> {
    fn ext(&self, s: usize) -> usize {
        if s.is_multiple_of(2) {
            self.c - 1
        } else {
            self.labels[s / 2] as usize
        }
    }
    fn can_skip(&self, s: usize) -> bool {
        s >= 2 && s % 2 == 1 && self.ext(s) != self.ext(s - 2)
    }
    /// Returns (alpha, beta, log p) with alpha including the emission at t, beta excluding it.
    fn forward_backward(&self) -> (Vec<f64>, Vec<f64>, f64) {
        let (t_len, c) = (self.t, self.c);
        let s_len = 2 * self.labels.len() + 1;
        let ninf = f64::NEG_INFINITY;
        let mut alpha = vec![ninf; t_len * s_len];
        let mut beta = vec![ninf; t_len * s_len];
        if t_len == 0 {
            let lp = if self.labels.is_empty() { 0.0 } else { ninf };
            return (alpha, beta, lp);
        }
        alpha[0] = self.lp[self.ext(0)];
        if s_len > 1 {
            alpha[1] = self.lp[self.ext(1)];
        }
        for t in 1..t_len {
            for s in 0..s_len {
                let mut a = alpha[(t - 1) * s_len + s];
                if s >= 1 {
                    a = lse(a, alpha[(t - 1) * s_len + s - 1]);
                }
                if self.can_skip(s) {
                    a = lse(a, alpha[(t - 1) * s_len + s - 2]);
                }
                alpha[t * s_len + s] = a + self.lp[t * c + self.ext(s)];
            }
        }
        let last = (t_len - 1) * s_len;
        beta[last + s_len - 1] = 0.0;
        if s_len > 1 {
            beta[last + s_len - 2] = 0.0;
        }
        for t in (0..t_len - 1).rev() {
            for s in 0..s_len {
                let nxt =
                    |s2: usize| beta[(t + 1) * s_len + s2] + self.lp[(t + 1) * c + self.ext(s2)];
                let mut b = nxt(s);
                if s + 1 < s_len {
                    b = lse(b, nxt(s + 1));
                }
                if s + 2 < s_len && self.can_skip(s + 2) {
                    b = lse(b, nxt(s + 2));
                }
                beta[t * s_len + s] = b;
            }
        }
        let mut logp = alpha[last + s_len - 1];
        if s_len > 1 {
            logp = lse(logp, alpha[last + s_len - 2]);
        }
        (alpha, beta, logp)
    }
}

struct Batch {
    b: usize,
    t: usize,
    c: usize,
    logits: Vec<f64>,
    labels: Vec<i64>,
    l_max: usize,
    in_len: Vec<usize>,
    lab_len: Vec<usize>,
}

fn batch(args: &[&Value]) -> Result<Batch> {
    let (x, lab, il, ll) = (args[0], args[1], args[2], args[3]);
    let s = x.shape();
    if s.len() != 3 {
        return Err(value_err!(
            "ctc: y_pred must have shape (samples, time, classes), got {s:?}"
        ));
    }
    let (b, t, c) = (s[0], s[1], s[2]);
    if lab.shape().len() != 2 || lab.shape()[0] != b {
        return Err(value_err!(
            "ctc: labels must have shape ({b}, max_label_length), got {:?}",
            lab.shape()
        ));
    }
    let lens = |v: &Value, what: &str, max: usize| -> Result<Vec<usize>> {
        if v.len() != b {
            return Err(value_err!(
                "ctc: {what} must have one entry per sample ({b}), got shape {:?}",
                v.shape()
            ));
        }
        v.to_i64_vec()
            .into_iter()
            .map(|n| {
                if n < 0 || n as usize > max {
                    Err(value_err!("ctc: {what} {n} is out of range [0, {max}]"))
                } else {
                    Ok(n as usize)
                }
            })
            .collect()
    };
    let l_max = lab.shape()[1];
    let in_len = lens(il, "input_length", t)?;
    let mut lab_len = lens(ll, "label_length", l_max)?;
    let labels = lab.to_i64_vec();
    if c == 0 {
        return Err(value_err!(
            "ctc: y_pred needs at least one class (the blank), got shape {s:?}"
        ));
    }
    let blank = (c - 1) as i64;
    for i in 0..b {
        let row = &labels[i * l_max..i * l_max + lab_len[i]];
        if let Some(&bad) = row.iter().find(|&&v| v < 0) {
            return Err(value_err!(
                "ctc: label {bad} of sample {i} is negative; labels are classes in [0, {blank}) (class {blank} is the blank)"
            ));
        }
        // As in TensorFlow, a label at or past the blank ends the sample's label
        // sequence (padding); a real label after it is an error.
        let end = row.iter().position(|&v| v >= blank).unwrap_or(row.len());
        if let Some(&bad) = row[end..].iter().find(|&&v| v < blank) {
            return Err(value_err!(
                "ctc: label {bad} of sample {i} follows the end-of-label value {} (a label >= {blank}, the blank class); labels: {row:?}",
                row[end]
            ));
        }
        lab_len[i] = end;
        // As TF: a label longer than the input is an error; one that fits only without the
        // blanks its repeats need (`[1, 1, 1]` in 3 steps) has no path, a loss of +inf and a
        // gradient of 0.
        if end > in_len[i] {
            return Err(value_err!(
                "ctc: sample {i} has a label of length {end} but only {} input steps; labels cannot be longer than the input",
                in_len[i]
            ));
        }
    }
    Ok(Batch {
        b,
        t,
        c,
        logits: x.to_f64_vec(),
        labels,
        l_max,
        in_len,
        lab_len,
    })
}

impl Batch {
    fn sample(&self, i: usize) -> Sample<'_> {
        let (t, c) = (self.in_len[i], self.c);
        let mut lp = vec![0.0; t * c];
        for k in 0..t {
            let off = (i * self.t + k) * c;
            log_softmax_row(&self.logits[off..off + c], &mut lp[k * c..(k + 1) * c]);
        }
        Sample {
            lp,
            t,
            c,
            labels: &self.labels[i * self.l_max..i * self.l_max + self.lab_len[i]],
        }
    }
}
