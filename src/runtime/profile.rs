//! The kernel-level profiler behind `ferrokeras.profile`: while a session is open, every
//! compiled call records spans (the call, each schedule item, loop steps, host callbacks,
//! GPU recording and submits) with their thread, start and duration; closing the last
//! session hands them out as Chrome trace-event JSON, which Perfetto and chrome://tracing
//! open.
//!
//! Off, a hook costs one relaxed atomic load (`begin` returns `None`) and nothing else: no
//! clock read, no allocation. The spans' names and arguments are built only when on.

use crate::base::value::Value;
use crate::compile::fuse::Item;
use crate::compile::{Plan, Step};
use crate::ops::Op;
use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);

/// One finished span: a Chrome trace "complete" event (`ph: X`).
struct Span {
    name: String,
    cat: &'static str,
    /// Start and duration, in nanoseconds since `epoch()`.
    start: u64,
    dur: u64,
    tid: u64,
    /// The `args` object's members, already JSON (`"key": value, ...`).
    args: String,
}

struct State {
    /// Open sessions (nested `profile()` blocks share the recording).
    open: usize,
    spans: Vec<Span>,
    /// Names of the threads that recorded spans, by trace tid.
    threads: Vec<(u64, String)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    open: 0,
    spans: Vec::new(),
    threads: Vec::new(),
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now() -> u64 {
    epoch().elapsed().as_nanos().min(u64::MAX as u128) as u64
}

/// Whether a session is open.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The start of a span when recording (one relaxed load when not).
#[inline]
pub fn begin() -> Option<u64> {
    if on() {
        Some(now())
    } else {
        None
    }
}

/// Opens a session; returns its start (nanoseconds on the trace clock), which `stop`
/// takes back.
pub fn start() -> u64 {
    let mut s = state();
    if s.open == 0 {
        s.spans.clear();
    }
    s.open += 1;
    let t = now();
    ON.store(true, Ordering::Relaxed);
    t
}

/// Closes the session opened at `since`: returns the spans that started in it as a Chrome
/// trace JSON document. Recording stops when the last open session closes.
pub fn stop(since: u64) -> String {
    let mut s = state();
    s.open = s.open.saturating_sub(1);
    if s.open == 0 {
        ON.store(false, Ordering::Relaxed);
    }
    let json = to_json(&s, since);
    if s.open == 0 {
        s.spans = Vec::new();
    }
    json
}

thread_local! {
    static TID: Cell<u64> = const { Cell::new(0) };
    /// Loop bodies this thread is running (0: a call's own plan).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The GPU time of the pass of the submit in progress (`note_gpu_time`).
    static GPU_NS: Cell<Option<u64>> = const { Cell::new(None) };
}

/// This thread's trace id (its OS thread id on Linux), naming it in the trace on first use.
fn tid() -> u64 {
    let t = TID.with(Cell::get);
    if t != 0 {
        return t;
    }
    let t = os_tid();
    TID.with(|c| c.set(t));
    let name = match (rayon::current_thread_index(), std::thread::current().name()) {
        (Some(i), _) => format!("rayon worker {i}"),
        (None, Some(n)) => n.to_string(),
        (None, None) if t == u64::from(std::process::id()) => "main".to_string(),
        (None, None) => format!("thread {t}"),
    };
    state().threads.push((t, name));
    t
}

#[cfg(target_os = "linux")]
fn os_tid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

#[cfg(not(target_os = "linux"))]
fn os_tid() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn push(start: u64, name: String, cat: &'static str, args: String) {
    let span = Span {
        name,
        cat,
        start,
        dur: now().saturating_sub(start),
        tid: tid(),
        args,
    };
    state().spans.push(span);
}

/// A JSON string literal.
fn quote(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn list<T>(xs: impl IntoIterator<Item = T>, f: impl Fn(T) -> String) -> String {
    let items: Vec<String> = xs.into_iter().map(f).collect();
    format!("[{}]", items.join(", "))
}

fn dims(s: &[usize]) -> String {
    list(s, |d| d.to_string())
}

/// What the trace calls node `i` of `plan`: its op, or a host callback's function.
pub fn node_name(plan: &Plan, i: usize) -> String {
    match plan.nodes[i].op() {
        Op::HostCall(h) => format!("py_function:{}", h.f.name()),
        op => op.name(),
    }
}

/// When recording: the start of CPU schedule item `item` and the shapes of the values it
/// reads (read before it runs, since a fused group may take its dead inputs).
#[inline]
pub fn cpu_item_start(
    plan: &Plan,
    item: &Item,
    slots: &[Option<Value>],
) -> Option<(u64, Vec<Vec<usize>>)> {
    if !on() {
        return None;
    }
    let shapes = input_shapes(plan, &item_inputs(plan, item), slots);
    Some((now(), shapes))
}

/// The shapes of the values `slots` holds for `ins` (the node's static shape, unknown
/// dimensions 0, where a slot is empty).
fn input_shapes(plan: &Plan, ins: &[usize], slots: &[Option<Value>]) -> Vec<Vec<usize>> {
    ins.iter()
        .map(|&j| match &slots[j] {
            Some(v) => v.shape().to_vec(),
            None => plan.nodes[j]
                .shape()
                .dims()
                .iter()
                .map(|d| d.unwrap_or(0))
                .collect(),
        })
        .collect()
}

/// The slots item `item` reads from outside it.
fn item_inputs(plan: &Plan, item: &Item) -> Vec<usize> {
    match item {
        Item::Node(i) => plan.inputs[*i].clone(),
        Item::MatAcc { mm, acc, .. } => {
            let mut v = plan.inputs[*mm].clone();
            v.push(*acc);
            v
        }
        Item::Group(_) | Item::Update(_) => match item.group() {
            // A group run image by image after a convolution or pooling reads that op's
            // inputs (its result has no value yet when the span starts).
            Some(g) => match g.first {
                Some(f) => plan.inputs[f]
                    .iter()
                    .chain(g.ext.iter().filter(|&&j| j != f))
                    .copied()
                    .collect(),
                None => g.ext.clone(),
            },
            None => Vec::new(),
        },
    }
}

/// Records CPU schedule item `t` of `plan` (`of` items), started at `start`, that read
/// values of `shapes`, with the shape of its result (a group's first output) now in `slots`.
pub fn cpu_item(start: u64, plan: &Plan, t: usize, shapes: &[Vec<usize>], slots: &[Option<Value>]) {
    let sched = plan.schedule(&crate::compile::fuse::Target::cpu_configured());
    let item = &sched.items[t];
    let (name, cat, members, out) = match item {
        Item::Node(i) => {
            let cat = match (&plan.steps[*i], plan.nodes[*i].op()) {
                (Step::Fed(_), _) => "feed",
                (Step::Folded(_), _) => "constant",
                (Step::Compute, _) if plan.nodes[*i].inputs().is_empty() => "source",
                (Step::Compute, Op::Loop(_)) => "loop",
                (Step::Compute, Op::HostCall(_)) => "callback",
                (Step::Compute, _) => "op",
            };
            (node_name(plan, *i), cat, Vec::new(), *i)
        }
        Item::MatAcc { mm, add, .. } => (
            "matmul_acc".to_string(),
            "op",
            vec![node_name(plan, *mm), node_name(plan, *add)],
            *add,
        ),
        Item::Group(_) | Item::Update(_) => {
            let g = item.group().expect("a group item");
            let members: Vec<String> = g.computed().map(|m| node_name(plan, m)).collect();
            let name = if item.update().is_some() {
                "fused update"
            } else {
                "fused"
            };
            // A group run after a convolution or pooling reports that op's result.
            let out = g
                .first
                .filter(|&f| slots[f].is_some())
                .or(g.outputs.first().copied())
                .or(g.members.last().copied())
                .unwrap_or(0);
            (name.to_string(), "fused", members, out)
        }
    };
    let mut args = format!(
        "\"item\": {t}, \"items\": {}, \"depth\": {}, \"device\": \"cpu\", \"dtype\": {}, \"inputs\": {}",
        sched.items.len(),
        DEPTH.with(Cell::get),
        quote(plan.nodes[out].dtype().name()),
        list(shapes, |s| dims(s)),
    );
    if let Some(v) = &slots[out] {
        let _ = write!(args, ", \"output\": {}", dims(v.shape()));
    }
    if !members.is_empty() {
        let _ = write!(args, ", \"members\": {}", list(&members, |m| quote(m)));
    }
    push(start, name, cat, args);
}

/// Records the step of a GPU plan that ran node `i`: `place` is how it ran (`gpu`: its
/// kernels recorded, `host`: its CPU kernel, `source`, `view`, `meta`), `members` the
/// nodes fused into its kernel, `dispatches` the kernels it recorded; `shape(j)` is the
/// shape of slot `j`'s value, if it has one.
pub fn gpu_node(
    start: u64,
    plan: &Plan,
    i: usize,
    place: &'static str,
    members: &[usize],
    dispatches: usize,
    shape: &dyn Fn(usize) -> Option<Vec<usize>>,
) {
    let cat = match (&plan.steps[i], plan.nodes[i].op(), place) {
        (Step::Fed(_), _, _) => "feed",
        (Step::Folded(_), _, _) => "constant",
        (_, Op::HostCall(_), _) => "callback",
        (_, Op::Loop(_), _) => "loop",
        (_, _, "gpu") => "gpu.record",
        (_, _, other) => other,
    };
    let fused = members.len() > 1;
    let mut ins: Vec<usize> = Vec::new();
    for &m in members.iter().chain(if fused { None } else { Some(&i) }) {
        for &j in &plan.inputs[m] {
            if !members.contains(&j) && !ins.contains(&j) {
                ins.push(j);
            }
        }
    }
    let shapes: Vec<Vec<usize>> = ins.iter().filter_map(|&j| shape(j)).collect();
    let name = if fused {
        "fused".to_string()
    } else {
        node_name(plan, i)
    };
    let mut args = format!(
        "\"node\": {i}, \"depth\": {}, \"device\": \"{}\", \"dtype\": {}, \"inputs\": {}, \"dispatches\": {dispatches}",
        DEPTH.with(Cell::get),
        if place == "host" { "cpu" } else { "gpu" },
        quote(plan.nodes[i].dtype().name()),
        list(&shapes, |s| dims(s)),
    );
    if fused {
        let _ = write!(
            args,
            ", \"members\": {}",
            list(members, |&m| quote(&node_name(plan, m)))
        );
    }
    push(start, name, cat, args);
}

/// Notes the GPU's own time for the compute pass of the submit this thread is making
/// (`gpu::timestamps`), for its span.
pub fn note_gpu_time(ns: u64) {
    GPU_NS.with(|g| g.set(Some(ns)));
}

/// Records one GPU queue submission (and the wait for its results): `dispatches` kernels,
/// `reads` buffers brought back, and the GPU's time for its kernels when the device has
/// timestamp queries (`note_gpu_time`).
pub fn gpu_submit(start: u64, dispatches: usize, reads: usize) {
    let mut args = format!("\"device\": \"gpu\", \"dispatches\": {dispatches}, \"reads\": {reads}");
    if let Some(ns) = GPU_NS.with(|g| g.take()) {
        let _ = write!(args, ", \"gpu_us\": {:.3}", ns as f64 / 1e3);
    }
    push(start, "submit".to_string(), "gpu.submit", args);
}

/// Marks this thread as running a loop body for the guard's life.
pub struct InLoop(bool);

impl Drop for InLoop {
    fn drop(&mut self) {
        if self.0 {
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
}

/// Opens a loop run: its steps' items are recorded one level deeper.
pub fn enter_loop() -> InLoop {
    if !on() {
        return InLoop(false);
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    InLoop(true)
}

/// Records step `t` (`step` of `steps` in run order) of a loop run.
pub fn loop_step(start: u64, step: usize, t: usize, steps: usize) {
    push(
        start,
        "step".to_string(),
        "loop.step",
        format!(
            "\"step\": {step}, \"t\": {t}, \"steps\": {steps}, \"depth\": {}",
            DEPTH.with(Cell::get)
        ),
    );
}

/// Records a whole loop run of `steps` steps on this thread.
pub fn loop_run(start: u64, steps: usize) {
    push(
        start,
        "loop run".to_string(),
        "loop.run",
        format!("\"steps\": {steps}, \"depth\": {}", DEPTH.with(Cell::get)),
    );
}

/// Records a `K.function` call: `name` (empty when unnamed), the device it ran on and its
/// kernel launches and submits.
pub fn call(start: u64, name: &str, device: &str, dispatches: usize, submits: usize, ok: bool) {
    let label = if name.is_empty() {
        "K.function".to_string()
    } else {
        format!("K.function {name}")
    };
    push(
        start,
        label,
        "call",
        format!(
            "\"function\": {}, \"device\": {}, \"dispatches\": {dispatches}, \"submits\": {submits}, \"ok\": {ok}",
            quote(name),
            quote(device)
        ),
    );
}

fn to_json(s: &State, since: u64) -> String {
    let pid = std::process::id();
    let mut o = String::from("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    let _ = write!(
        o,
        "{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {pid}, \"args\": {{\"name\": \"ferrokeras\"}}}}"
    );
    for (tid, name) in &s.threads {
        let _ = write!(
            o,
            ",\n{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {pid}, \"tid\": {tid}, \"args\": {{\"name\": {}}}}}",
            quote(name)
        );
    }
    let mut spans: Vec<&Span> = s.spans.iter().filter(|sp| sp.start >= since).collect();
    spans.sort_by_key(|sp| (sp.start, std::cmp::Reverse(sp.dur)));
    for sp in spans {
        let _ = write!(
            o,
            ",\n{{\"ph\": \"X\", \"name\": {}, \"cat\": \"{}\", \"pid\": {pid}, \"tid\": {}, \"ts\": {:.3}, \"dur\": {:.3}, \"args\": {{{}}}}}",
            quote(&sp.name),
            sp.cat,
            sp.tid,
            sp.start as f64 / 1e3,
            sp.dur as f64 / 1e3,
            sp.args
        );
    }
    o.push_str("\n]}\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_escapes() {
        assert_eq!(quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
