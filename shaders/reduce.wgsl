// Reductions, arg-reductions and cumulative scans over a tensor seen as
// (outer, red, inner) blocks; the executor first transposes other axis sets into one
// contiguous block. Templated over the element type T (f32 or i32 storage) with
// t_norm / t_lowest / t_highest / t_isnan / t_min_finite / t_max_finite from the dtype
// prelude.
//
// Bindings: 0 params, 1 out, 2 a.

// op: see r_init (reductions), arg and scan.
struct Reduce {
    outer: u32,
    red: u32,
    inner: u32,
    op: u32,
    r0: u32,
    r1: u32,
}

struct Scan {
    outer: u32,
    red: u32,
    inner: u32,
    op: u32,
    exclusive: u32,
    reverse: u32,
    k0: u32,
    klen: u32,
}

@group(0) @binding(0) var<storage, read> p: Reduce;
@group(0) @binding(0) var<storage, read> pscan: Scan;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;

fn ld(i: u32) -> T { return bitcast<T>(a[i]); }
fn st(i: u32, v: T) { out[i] = bitcast<u32>(t_norm(v)); }

// op: 0 sum, 1 prod, 2 max, 3 min, 4 mean. NaN wins max/min, as on the CPU.
fn r_init(op: u32) -> T {
    switch op {
        case 1u: { return T(1); }
        case 2u: { return t_lowest(); }
        case 3u: { return t_highest(); }
        default: { return T(0); }
    }
}
fn r_comb(op: u32, x: T, y: T) -> T {
    switch op {
        case 1u: { return x * y; }
        case 2u: { return select(x, y, y > x || t_isnan(y)); }
        case 3u: { return select(x, y, y < x || t_isnan(y)); }
        default: { return x + y; }
    }
}
fn r_final(op: u32, x: T, red: u32) -> T {
    if (op == 4u) { return x / T(red); }
    return x;
}

// A long reduced axis is split over dispatches, each covering steps [r0, r1) of it: a
// software rasteriser (llvmpipe) ends a shader loop after 65535 iterations. A dispatch
// other than the first goes on from the partial result the one before left in `out`
// (stored unrounded); the last one finishes it.
fn r_start(op: u32, o: u32, r0: u32) -> T {
    if (r0 > 0u) { return bitcast<T>(out[o]); }
    return r_init(op);
}
fn r_store(op: u32, o: u32, acc: T, r1: u32, red: u32) {
    if (r1 == red) { st(o, r_final(op, acc, red)); } else { out[o] = bitcast<u32>(acc); }
}

// One thread per output, for short reduced axes; steps [r0, r1) of the axis.
@compute @workgroup_size(256)
fn reduce_serial_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    let inner = p.inner;
    if (i >= p.outer * inner) { return; }
    let red = p.red;
    let op = p.op;
    let base = (i / inner) * red * inner + i % inner;
    var acc = r_start(op, i, p.r0);
    for (var r = p.r0; r < p.r1; r++) {
        acc = r_comb(op, acc, ld(base + r * inner));
    }
    r_store(op, i, acc, p.r1, red);
}

var<workgroup> sh: array<T, 256>;

// One workgroup per output: strided partial results, then a
// tree in workgroup memory; steps [r0, r1) of the axis.
@compute @workgroup_size(256)
fn reduce_tree_$T(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>,
                  @builtin(num_workgroups) nw: vec3<u32>) {
    let inner = p.inner;
    let red = p.red;
    let op = p.op;
    let o = w.x + w.y * nw.x;
    if (o >= p.outer * inner) { return; }
    let base = (o / inner) * red * inner + o % inner;
    var acc = r_init(op);
    for (var r = p.r0 + l.x; r < p.r1; r += 256u) {
        acc = r_comb(op, acc, ld(base + r * inner));
    }
    sh[l.x] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (l.x < s) { sh[l.x] = r_comb(op, sh[l.x], sh[l.x + s]); }
        workgroupBarrier();
    }
    // The partial result of the dispatches before joins after the tree (a float sum of
    // this dispatch's steps then loses nothing to a large running total).
    if (l.x == 0u) { r_store(op, o, r_comb(op, r_start(op, o, p.r0), sh[0]), p.r1, red); }
}

// op 0 argmax, 1 argmin, as TF's ArgMax/ArgMin: from index 0 holding the dtype's most
// negative (argmax) or most positive (argmin) finite value, an element replaces the best
// only where it is strictly greater (less); the first index wins ties and NaN never wins.
// Writes int64 indices (two words: the index, then a zero high word). Covers steps
// [r0, r1) of the axis, going on from the index the dispatch before left in `out` when
// r0 > 0 (see r_start).
fn arg_better(op: u32, v: T, best: T) -> bool {
    // (NaN compares false; the test spells it out for drivers that assume no NaN.)
    return !t_isnan(v) && select(v > best, v < best, op == 1u);
}

@compute @workgroup_size(256)
fn arg_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    let inner = p.inner;
    if (i >= p.outer * inner) { return; }
    let red = p.red;
    let op = p.op;
    let base = (i / inner) * red * inner + i % inner;
    var best = 0u;
    var bv = select(t_min_finite(), t_max_finite(), op == 1u);
    if (p.r0 > 0u) {
        // The index the dispatch before left holds the best value, unless no element
        // replaced the start there (index 0, whose value then does not beat the start).
        best = out[2u * i];
        let v = ld(base + best * inner);
        if (arg_better(op, v, bv)) { bv = v; }
    }
    for (var r = p.r0; r < p.r1; r++) {
        let v = ld(base + r * inner);
        if (arg_better(op, v, bv)) { best = r; bv = v; }
    }
    out[2u * i] = best;
    out[2u * i + 1u] = 0u;
}

// op 0 cumsum, 1 cumprod. One thread per (outer, inner) column, over steps
// [k0, k0 + klen) of the scan: the executor splits a long axis over several dispatches
// (a software rasteriser such as llvmpipe stops any shader loop after 65535 iterations),
// each going on from the value its predecessor wrote before step k0.
@compute @workgroup_size(256)
fn scan_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    let inner = pscan.inner;
    if (i >= pscan.outer * inner) { return; }
    let red = pscan.red;
    let op = pscan.op;
    let excl = pscan.exclusive != 0u;
    let rev = pscan.reverse != 0u;
    let k0 = pscan.k0;
    let k1 = k0 + pscan.klen;
    let base = (i / inner) * red * inner + i % inner;
    var acc = select(T(0), T(1), op == 1u);
    if (k0 > 0u) {
        let r = select(k0 - 1u, red - k0, rev);
        let at = base + r * inner;
        acc = bitcast<T>(out[at]);
        if (excl) {
            if (op == 1u) { acc = acc * ld(at); } else { acc = acc + ld(at); }
        }
    }
    for (var k = k0; k < k1; k++) {
        let r = select(k, red - 1u - k, rev);
        let at = base + r * inner;
        let v = ld(at);
        if (excl) { st(at, acc); }
        if (op == 1u) { acc = acc * v; } else { acc = acc + v; }
        if (!excl) { st(at, acc); }
    }
}
