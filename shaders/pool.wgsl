// Window pooling (src/ops/pool.rs), channels-last, spatial dims canonicalised to three,
// with the CPU kernel's semantics: a window never reads padding; max takes the first
// maximum in window order (a later element wins only if greater, so a NaN stays only
// where it comes first, as on the CPU); avg divides by the number of in-bounds elements.
// An all-padding window (possible only with explicit padding) gives -inf (max) or NaN
// (avg, 0 / 0), as the CPU does.
//
// Bindings: 0 params (a Pool block of src/runtime/gpu/params.rs), 1 out, 2 a (x), 3 b
// (the gradient or the selected tensor).

// mode: see pool_fwd_$T and pool_grad_$T.
struct Pool {
    w: Window,
    channels: u32,
    mode: u32,
}

@group(0) @binding(0) var<storage, read> p: Pool;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;

fn ld_a(i: u32) -> T { return bitcast<T>(a[i]); }
fn ld_b(i: u32) -> T { return bitcast<T>(b[i]); }
fn st(i: u32, v: T) { out[i] = bitcast<u32>(t_norm(v)); }

fn v3(a: array<u32, 3>) -> vec3<u32> { return vec3<u32>(a[0], a[1], a[2]); }
fn xdim() -> vec3<i32> { return vec3<i32>(v3(p.w.x)); }
fn kdim() -> vec3<u32> { return v3(p.w.k); }
fn odim() -> vec3<u32> { return v3(p.w.o); }
fn sdim() -> vec3<u32> { return v3(p.w.s); }
fn pdim() -> vec3<i32> { return vec3<i32>(v3(p.w.pad)); }
fn xpix() -> u32 { return p.w.x[0] * p.w.x[1] * p.w.x[2]; }
fn kk() -> u32 { return p.w.k[0] * p.w.k[1] * p.w.k[2]; }
fn opix() -> u32 { return p.w.o[0] * p.w.o[1] * p.w.o[2]; }

fn unflat(i: u32, dims: vec3<u32>) -> vec3<u32> {
    return vec3<u32>(i / (dims.y * dims.z), (i / dims.z) % dims.y, i % dims.z);
}

/// Flat input pixel of window `op` at kernel offset `kp`, or -1 in the padding.
fn src_pix(op: u32, kp: u32) -> i32 {
    let q = vec3<i32>(unflat(op, odim()) * sdim()) - pdim() + vec3<i32>(unflat(kp, kdim()));
    let x = xdim();
    if (any(q < vec3<i32>(0)) || any(q >= x)) { return -1; }
    return (q.x * x.y + q.y) * x.z + q.z;
}

/// Input pixel of the first maximum of channel `c` in window `op` of the image at pixel
/// offset `xb`, or -1 for an all-padding window.
fn argmax(xb: u32, op: u32, c: u32) -> i32 {
    let ch = p.channels;
    var best = T(0);
    var at = -1;
    for (var kp = 0u; kp < kk(); kp++) {
        let ip = src_pix(op, kp);
        if (ip < 0) { continue; }
        let v = ld_a((xb + u32(ip)) * ch + c);
        if (at < 0 || v > best) {
            best = v;
            at = ip;
        }
    }
    return at;
}

fn count(op: u32) -> T {
    var n = 0u;
    for (var kp = 0u; kp < kk(); kp++) {
        if (src_pix(op, kp) >= 0) { n++; }
    }
    return T(n);
}

// One thread per output element. mode 0: max pool of a; 1: average pool of a;
// 2: b at the maximum of a's window (the max PoolSelect), zero for an all-padding window.
@compute @workgroup_size(256)
fn pool_fwd_$T(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(gid, nw);
    let ch = p.channels;
    let mode = p.mode;
    let op_n = opix();
    if (i >= p.w.n * op_n * ch) { return; }
    let c = i % ch;
    let op = (i / ch) % op_n;
    let xb = (i / ch / op_n) * xpix();
    if (mode == 1u) {
        var acc = T(0);
        for (var kp = 0u; kp < kk(); kp++) {
            let ip = src_pix(op, kp);
            if (ip >= 0) { acc += ld_a((xb + u32(ip)) * ch + c); }
        }
        let n = count(op);
        st(i, select(acc / n, bitcast<T>(0x7fc00000u), n == T(0)));
        return;
    }
    let at = argmax(xb, op, c);
    if (mode == 0u) {
        st(i, select(ld_a((xb + u32(max(at, 0))) * ch + c), -fk_inf(), at < 0));
    } else {
        st(i, select(ld_b((xb + u32(max(at, 0))) * ch + c), T(0), at < 0));
    }
}

// The VJP of pool_fwd, gathered: one thread per input element sums the output gradient b
// of every window that covers it, windows in ascending order (the CPU's accumulation
// order, so the sums match it bit for bit). mode 0: max (only windows whose first
// maximum is this element); 1: average (b / window count).
@compute @workgroup_size(256)
fn pool_grad_$T(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(gid, nw);
    let ch = p.channels;
    let mode = p.mode;
    let xp_n = xpix();
    if (i >= p.w.n * xp_n * ch) { return; }
    let c = i % ch;
    let ip = (i / ch) % xp_n;
    let img = i / ch / xp_n;
    let xb = img * xp_n;
    let gb = img * opix();
    let q = vec3<i32>(unflat(ip, v3(p.w.x))) + pdim();
    let k = vec3<i32>(kdim());
    let s = vec3<i32>(sdim());
    let o = vec3<i32>(odim());
    // Windows o with o*s <= q < o*s + k along each dim.
    let lo = max((q - k + s) / s, vec3<i32>(0));
    let hi = min(q / s, o - vec3<i32>(1));
    var acc = T(0);
    for (var a0 = lo.x; a0 <= hi.x; a0++) {
        for (var a1 = lo.y; a1 <= hi.y; a1++) {
            for (var a2 = lo.z; a2 <= hi.z; a2++) {
                let op = u32((a0 * o.y + a1) * o.z + a2);
                let v = ld_b((gb + op) * ch + c);
                if (mode == 1u) {
                    acc += v / count(op);
                } else if (argmax(xb, op, c) == i32(ip)) {
                    acc += v;
                }
            }
        }
    }
    st(i, acc);
}
