// Reductions, arg-reductions and cumulative scans over a tensor seen as
// (outer, red, inner) blocks; the executor first transposes other axis sets into one
// contiguous block. Templated over the element type T (f32 or i32 storage) with
// t_norm / t_lowest / t_highest / t_isnan from the dtype prelude.
//
// Bindings: 0 params, 1 out, 2 a.

// op: see r_init (reductions), arg and scan.
struct Reduce {
    outer: u32,
    red: u32,
    inner: u32,
    op: u32,
}

struct Scan {
    outer: u32,
    red: u32,
    inner: u32,
    op: u32,
    exclusive: u32,
    reverse: u32,
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

// One thread per output, for short reduced axes.
@compute @workgroup_size(256)
fn reduce_serial_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    let inner = p.inner;
    if (i >= p.outer * inner) { return; }
    let red = p.red;
    let op = p.op;
    let base = (i / inner) * red * inner + i % inner;
    var acc = r_init(op);
    for (var r = 0u; r < red; r++) {
        acc = r_comb(op, acc, ld(base + r * inner));
    }
    st(i, r_final(op, acc, red));
}

var<workgroup> sh: array<T, 256>;

// One workgroup per output: strided partial results, then a
// tree in workgroup memory.
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
    for (var r = l.x; r < red; r += 256u) {
        acc = r_comb(op, acc, ld(base + r * inner));
    }
    sh[l.x] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (l.x < s) { sh[l.x] = r_comb(op, sh[l.x], sh[l.x + s]); }
        workgroupBarrier();
    }
    if (l.x == 0u) { st(o, r_final(op, sh[0], red)); }
}

// op 0 argmax, 1 argmin; first index wins ties, NaN wins.
// Writes i32 indices.
@compute @workgroup_size(256)
fn arg_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    let inner = p.inner;
    if (i >= p.outer * inner) { return; }
    let red = p.red;
    let op = p.op;
    let base = (i / inner) * red * inner + i % inner;
    var best = 0u;
    var bv = ld(base);
    for (var r = 1u; r < red; r++) {
        let v = ld(base + r * inner);
        var better = (v > bv) || (t_isnan(v) && !t_isnan(bv));
        if (op == 1u) { better = (v < bv) || (t_isnan(v) && !t_isnan(bv)); }
        if (better) { best = r; bv = v; }
    }
    out[i] = best;
}

// op 0 cumsum, 1 cumprod. One thread per
// (outer, inner) column.
@compute @workgroup_size(256)
fn scan_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    let inner = pscan.inner;
    if (i >= pscan.outer * inner) { return; }
    let red = pscan.red;
    let op = pscan.op;
    let excl = pscan.exclusive != 0u;
    let rev = pscan.reverse != 0u;
    let base = (i / inner) * red * inner + i % inner;
    var acc = select(T(0), T(1), op == 1u);
    for (var k = 0u; k < red; k++) {
        let r = select(k, red - 1u - k, rev);
        let at = base + r * inner;
        let v = ld(at);
        if (excl) { st(at, acc); }
        if (op == 1u) { acc = acc * v; } else { acc = acc + v; }
        if (!excl) { st(at, acc); }
    }
}
