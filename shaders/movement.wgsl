// Data movement on 32-bit words (every device dtype is one word per element, so one
// instantiation, `_u32`, serves them all). Strided copies cover transpose, slice,
// reverse, pad, concat and slice_grad; gather reads rows by index.
//
// Bindings: 0 params, 1 out, 2 a (source), 3 b (indices), 4 status (error flags).

@group(0) @binding(0) var<storage, read> P: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;

// P = [n, rank, base, dims[rank], strides[rank]]: element i of the iterated shape `dims`
// lives at word base + sum(coord[d] * strides[d]) of the strided side.
fn strided_offset(i: u32) -> u32 {
    let r = P[1];
    var rem = i;
    var off = bitcast<i32>(P[2]);
    for (var k = 0u; k < r; k++) {
        let d = r - 1u - k;
        let dim = P[3u + d];
        off += i32(rem % dim) * bitcast<i32>(P[3u + r + d]);
        rem = rem / dim;
    }
    return u32(off);
}

// out[i] = a[strided(i)]: transpose, slice, reverse.
@compute @workgroup_size(256)
fn gather_strided_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= P[0]) { return; }
    out[i] = a[strided_offset(i)];
}

// out[strided(i)] = a[i]: the interior of pad, one input of concat, slice_grad.
@compute @workgroup_size(256)
fn scatter_strided_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= P[0]) { return; }
    out[strided_offset(i)] = a[i];
}

// P = [n, word]
@compute @workgroup_size(256)
fn fill_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= P[0]) { return; }
    out[i] = P[1];
}

// P = [n_out, n_idx, axis_len, inner, tag]: out[o, k, j] = a[o, b[k], j]. An index out of
// range writes 0 and records `tag` in status[0] (and the index in status[1]), which the
// executor turns into an error.
@compute @workgroup_size(256)
fn gather_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= P[0]) { return; }
    let inner = P[3];
    let nidx = P[1];
    let n = P[2];
    let j = i % inner;
    let t = i / inner;
    let k = t % nidx;
    let o = t / nidx;
    let ix = bitcast<i32>(b[k]);
    if (ix < 0 || u32(ix) >= n) {
        out[i] = 0u;
        atomicMax(&status[0], P[4]);
        atomicStore(&status[1], bitcast<u32>(ix));
        return;
    }
    out[i] = a[(o * n + u32(ix)) * inner + j];
}
