// scatter_add (the gradient of gather): out[o, b[k], j] += a[o, k, j], with a
// compare-exchange loop so float adds are atomic too. `out` is zero-filled first.
//
// Bindings: 0 params, 1 out (atomic words), 2 a (updates), 3 b (indices), 4 status.

@group(0) @binding(0) var<storage, read> P: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;

// P = [n_updates, n_idx, axis_len, inner, tag]
@compute @workgroup_size(256)
fn scatter_add_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
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
        atomicMax(&status[0], P[4]);
        atomicStore(&status[1], bitcast<u32>(ix));
        return;
    }
    let dst = (o * n + u32(ix)) * inner + j;
    let v = bitcast<T>(a[i]);
    var old = atomicLoad(&out[dst]);
    loop {
        let r = atomicCompareExchangeWeak(&out[dst], old, bitcast<u32>(bitcast<T>(old) + v));
        if (r.exchanged) { break; }
        old = r.old_value;
    }
}
