// Data movement on 32-bit words (every device dtype is one word per element, so one
// instantiation, `_u32`, serves them all). Strided copies cover transpose, slice,
// reverse, pad, concat and slice_grad; gather reads rows by index.
//
// Bindings: 0 params (a block of src/runtime/gpu/params.rs), 1 out, 2 a (source),
// 3 b (indices), 4 status (error flags).

// Element i of the iterated shape `dims` lives at word base + sum(coord[d] * strides[d])
// of the strided side. tail = [dims[rank], strides[rank] (i32 bits)].
struct Strided {
    n: u32,
    rank: u32,
    base: i32,
    tail: array<u32>,
}

struct Fill {
    n: u32,
    word: u32,
}

// out[o, k, j] = a[o, b[k], j] over (outer, axis_len, inner) rows.
struct Indexed {
    n: u32,
    n_idx: u32,
    axis_len: u32,
    inner: u32,
    tag: u32,
}

@group(0) @binding(0) var<storage, read> ps: Strided;
@group(0) @binding(0) var<storage, read> pf: Fill;
@group(0) @binding(0) var<storage, read> pg: Indexed;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;

fn strided_offset(i: u32) -> u32 {
    let r = ps.rank;
    var rem = i;
    var off = ps.base;
    for (var k = 0u; k < r; k++) {
        let d = r - 1u - k;
        let dim = ps.tail[d];
        off += i32(rem % dim) * bitcast<i32>(ps.tail[r + d]);
        rem = rem / dim;
    }
    return u32(off);
}

// out[i] = a[strided(i)]: transpose, slice, reverse.
@compute @workgroup_size(256)
fn gather_strided_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= ps.n) { return; }
    out[i] = a[strided_offset(i)];
}

// out[strided(i)] = a[i]: the interior of pad, one input of concat, slice_grad.
@compute @workgroup_size(256)
fn scatter_strided_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= ps.n) { return; }
    out[strided_offset(i)] = a[i];
}

@compute @workgroup_size(256)
fn fill_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= pf.n) { return; }
    out[i] = pf.word;
}

// An index out of range writes 0 and records `tag` in status[0] (and the index in
// status[1]), which the executor turns into an error.
@compute @workgroup_size(256)
fn gather_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= pg.n) { return; }
    let inner = pg.inner;
    let nidx = pg.n_idx;
    let n = pg.axis_len;
    let j = i % inner;
    let t = i / inner;
    let k = t % nidx;
    let o = t / nidx;
    let ix = bitcast<i32>(b[k]);
    if (ix < 0 || u32(ix) >= n) {
        out[i] = 0u;
        atomicMax(&status[0], pg.tag);
        atomicStore(&status[1], bitcast<u32>(ix));
        return;
    }
    out[i] = a[(o * n + u32(ix)) * inner + j];
}
