// scatter_add (the gradient of gather): out[o, b[k], j] += a[o, k, j], with a
// compare-exchange loop so float adds are atomic too. `out` is zero-filled first.
//
// Bindings: 0 params, 1 out (atomic words), 2 a (updates), 3 b (indices), 4 status.

// Rows of an (outer, axis_len, inner) tensor picked by n_idx indices; an index out of
// range records `tag` in status[0].
struct Indexed {
    n: u32,
    n_idx: u32,
    axis_len: u32,
    inner: u32,
    tag: u32,
}

@group(0) @binding(0) var<storage, read> p: Indexed;
@group(0) @binding(1) var<storage, read_write> out: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;

@compute @workgroup_size(256)
fn scatter_add_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= p.n) { return; }
    let inner = p.inner;
    let nidx = p.n_idx;
    let n = p.axis_len;
    let j = i % inner;
    let t = i / inner;
    let k = t % nidx;
    let o = t / nidx;
    let ix = bitcast<i32>(b[k]);
    if (ix < 0 || u32(ix) >= n) {
        atomicMax(&status[0], p.tag);
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
