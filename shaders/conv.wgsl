// The three convolution primitives (src/ops/conv), channels-last, spatial dims
// canonicalised to three (leading dims of size 1), one group per workgroup z slice.
// Each is an implicit GEMM: the im2col matrix is never written, its tile is gathered
// into workgroup memory straight from the image (zero where a window reads padding).
//
//   conv_fwd   y[m, g*og + n]  = sum_k A[m, k] W[k, n]     m = (image, output pixel),
//              A = im2col(x), k = (kernel offset, channel in group), W the kernel.
//   conv_dx    dx[m, g*cg + n] = sum_k G[m, k] W'[k, n]    m = (image, input pixel),
//              k = (kernel offset, output channel in group); G reads the output
//              gradient at the output pixel whose window puts that kernel offset on m
//              (zero where it is out of range). One dispatch per stride phase: the input
//              pixels of one residue modulo the stride, and only the kernel offsets that
//              reach them from the stride grid, so no k is wasted on stride holes.
//   conv_dw    dw[r, g*og + n] = sum_m A[m, r] gy[m, n]    r = (kernel offset, channel),
//              a GEMM over the batch * spatial axis, split in `splits` chunks (workgroup
//              z = g * splits + chunk) whose partial sums the executor adds up.
//
// Tiles as in matmul.wgsl: 64x64 outputs per 16x16 workgroup, 16-deep k slices staged in
// workgroup memory, a 4x4 register block per thread. The *_direct kernels compute one
// output per thread; the executor uses them where a GEMM dimension is a handful of
// channels (depthwise convolutions), which would leave most of a 64-wide tile idle.
//
// Bindings: 0 params (a Conv block of src/runtime/gpu/params.rs), 1 out, 2 a (x, or gy
// for conv_dx), 3 b (w, or gy for conv_dw).

// cg, og: channels per group in and out. row_base offsets the GEMM rows of one dispatch
// (the executor splits tall GEMMs into dispatches of at most 65535 row tiles); splits and
// chunk split conv_dw's reduction. first .. kcount, read by conv_dx only, give its stride
// phase: per dim the first input position, their count, and the first kernel offset, step
// and count of kernel offsets that reach them.
struct Conv {
    w: Window,
    cin: u32,
    cout: u32,
    groups: u32,
    cg: u32,
    og: u32,
    row_base: u32,
    splits: u32,
    chunk: u32,
    first: array<u32, 3>,
    count: array<u32, 3>,
    kstart: array<u32, 3>,
    kstep: array<u32, 3>,
    kcount: array<u32, 3>,
}

@group(0) @binding(0) var<storage, read> p: Conv;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;

var<workgroup> As: array<T, 1024>;  // [16 k][64 rows]
var<workgroup> Bs: array<T, 1024>;  // [16 k][64 cols]

fn ld_a(i: u32) -> T { return bitcast<T>(a[i]); }
fn ld_b(i: u32) -> T { return bitcast<T>(b[i]); }
fn st(i: u32, v: T) { out[i] = bitcast<u32>(t_norm(v)); }

fn v3(a: array<u32, 3>) -> vec3<u32> { return vec3<u32>(a[0], a[1], a[2]); }
fn xdim() -> vec3<i32> { return vec3<i32>(v3(p.w.x)); }
fn kdim() -> vec3<u32> { return v3(p.w.k); }
fn odim() -> vec3<u32> { return v3(p.w.o); }
fn sdim() -> vec3<u32> { return v3(p.w.s); }
fn ddim() -> vec3<u32> { return v3(p.w.d); }
fn pdim() -> vec3<i32> { return vec3<i32>(v3(p.w.pad)); }
fn xpix() -> u32 { return p.w.x[0] * p.w.x[1] * p.w.x[2]; }
fn kk() -> u32 { return p.w.k[0] * p.w.k[1] * p.w.k[2]; }
fn opix() -> u32 { return p.w.o[0] * p.w.o[1] * p.w.o[2]; }

/// Row-major coordinates of flat index `i` in a box of `dims`.
fn unflat(i: u32, dims: vec3<u32>) -> vec3<u32> {
    return vec3<u32>(i / (dims.y * dims.z), (i / dims.z) % dims.y, i % dims.z);
}

/// Flat input pixel at coordinates `q`, or -1 when `q` is in the padding.
fn in_pix(q: vec3<i32>) -> i32 {
    let x = xdim();
    if (any(q < vec3<i32>(0)) || any(q >= x)) { return -1; }
    return (q.x * x.y + q.y) * x.z + q.z;
}

/// The window origin (coordinates of kernel offset 0) of output pixel `op`.
fn origin(op: u32) -> vec3<i32> {
    return vec3<i32>(unflat(op, odim()) * sdim()) - pdim();
}

/// The output pixel whose window reads input coordinates `i` at kernel offset `kp`, or -1.
fn out_pix(i: vec3<i32>, kp: u32) -> i32 {
    let t = i + pdim() - vec3<i32>(unflat(kp, kdim()) * ddim());
    let s = vec3<i32>(sdim());
    let o = vec3<i32>(odim());
    if (any(t < vec3<i32>(0)) || any(t % s != vec3<i32>(0))) { return -1; }
    let q = t / s;
    if (any(q >= o)) { return -1; }
    return (q.x * o.y + q.y) * o.z + q.z;
}

/// acc += As^T Bs over one 16-deep slice, for this thread's 4x4 block.
fn mac(l: vec3<u32>, acc: ptr<function, array<vec4<T>, 4>>) {
    for (var kq = 0u; kq < 16u; kq++) {
        let ab = kq * 64u + l.y * 4u;
        let bb = kq * 64u + l.x * 4u;
        let bv = vec4<T>(Bs[bb], Bs[bb + 1u], Bs[bb + 2u], Bs[bb + 3u]);
        (*acc)[0] += vec4<T>(As[ab]) * bv;
        (*acc)[1] += vec4<T>(As[ab + 1u]) * bv;
        (*acc)[2] += vec4<T>(As[ab + 2u]) * bv;
        (*acc)[3] += vec4<T>(As[ab + 3u]) * bv;
    }
}

@compute @workgroup_size(16, 16)
fn conv_fwd_$T(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    let op_n = opix();
    let M = p.w.n * op_n;
    let cin = p.cin;
    let cout = p.cout;
    let cg = p.cg;
    let og = p.og;
    let K = kk() * cg;
    let g = w.z;
    let row0 = p.row_base + w.y * 64u;
    let col0 = w.x * 64u;
    let tid = l.y * 16u + l.x;
    // This thread gathers column tid % 16 of the A slice for rows tid / 16 + 16 t.
    let ka = tid % 16u;
    var base: array<i32, 4>;
    var org: array<vec3<i32>, 4>;
    for (var t = 0u; t < 4u; t++) {
        let m = row0 + tid / 16u + 16u * t;
        base[t] = select(-1, i32((m / max(op_n, 1u)) * xpix()), m < M);
        org[t] = origin(m % max(op_n, 1u));
    }
    var acc: array<vec4<T>, 4>;
    for (var i = 0u; i < 4u; i++) { acc[i] = vec4<T>(T(0)); }
    for (var k0 = 0u; k0 < K; k0 += 16u) {
        let k = k0 + ka;
        let ci = k % max(cg, 1u);
        let off = vec3<i32>(unflat(k / max(cg, 1u), kdim()) * ddim());
        for (var t = 0u; t < 4u; t++) {
            var v = T(0);
            if (base[t] >= 0 && k < K) {
                let ip = in_pix(org[t] + off);
                if (ip >= 0) { v = ld_a(u32(base[t] + ip) * cin + g * cg + ci); }
            }
            As[ka * 64u + tid / 16u + 16u * t] = v;
        }
        for (var t = 0u; t < 4u; t++) {
            let e = tid + t * 256u;
            let nn = e % 64u;
            let kb = e / 64u;
            var v = T(0);
            if (k0 + kb < K && col0 + nn < og) { v = ld_b((k0 + kb) * cout + g * og + col0 + nn); }
            Bs[kb * 64u + nn] = v;
        }
        workgroupBarrier();
        mac(l, &acc);
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + l.y * 4u + i;
        if (r >= M) { break; }
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + l.x * 4u + j;
            if (c < og) { st(r * cout + g * og + c, acc[i][j]); }
        }
    }
}

@compute @workgroup_size(16, 16)
fn conv_dx_$T(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    // One stride phase: input pixels ip = first + a * s (a < count) along each dim, and the
    // kernel offsets that put some output pixel on them, kp = kstart + j * kstep (j < kcount).
    let first = v3(p.first);
    let count = v3(p.count);
    let kstart = v3(p.kstart);
    let kstep = v3(p.kstep);
    let kcount = v3(p.kcount);
    let rows_n = count.x * count.y * count.z;
    let M = p.w.n * rows_n;
    let cin = p.cin;
    let cout = p.cout;
    let cg = p.cg;
    let og = p.og;
    let K = kcount.x * kcount.y * kcount.z * og;
    let kd = kdim();
    let g = w.z;
    let row0 = p.row_base + w.y * 64u;
    let col0 = w.x * 64u;
    let tid = l.y * 16u + l.x;
    let ka = tid % 16u;
    var base: array<i32, 4>;
    var pix: array<vec3<i32>, 4>;
    for (var t = 0u; t < 4u; t++) {
        let m = row0 + tid / 16u + 16u * t;
        base[t] = select(-1, i32((m / max(rows_n, 1u)) * opix()), m < M);
        pix[t] = vec3<i32>(first + unflat(m % max(rows_n, 1u), count) * sdim());
    }
    var acc: array<vec4<T>, 4>;
    for (var i = 0u; i < 4u; i++) { acc[i] = vec4<T>(T(0)); }
    for (var k0 = 0u; k0 < K; k0 += 16u) {
        let k = k0 + ka;
        let co = k % max(og, 1u);
        let kv = kstart + unflat(k / max(og, 1u), kcount) * kstep;
        let kp = (kv.x * kd.y + kv.y) * kd.z + kv.z;
        for (var t = 0u; t < 4u; t++) {
            var v = T(0);
            if (base[t] >= 0 && k < K) {
                let op = out_pix(pix[t], kp);
                if (op >= 0) { v = ld_a(u32(base[t] + op) * cout + g * og + co); }
            }
            As[ka * 64u + tid / 16u + 16u * t] = v;
        }
        // W'[k = (kp, co), n = ci] = w[kp, ci, g * og + co]: consecutive threads read
        // consecutive co, which are adjacent in w.
        for (var t = 0u; t < 4u; t++) {
            let e = tid + t * 256u;
            let kb = e % 16u;
            let nn = e / 16u;
            let kg = k0 + kb;
            var v = T(0);
            if (kg < K && col0 + nn < cg) {
                let kvb = kstart + unflat(kg / og, kcount) * kstep;
                let kpb = (kvb.x * kd.y + kvb.y) * kd.z + kvb.z;
                v = ld_b((kpb * cg + col0 + nn) * cout + g * og + kg % og);
            }
            Bs[kb * 64u + nn] = v;
        }
        workgroupBarrier();
        mac(l, &acc);
        workgroupBarrier();
    }
    let x = v3(p.w.x);
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + l.y * 4u + i;
        if (r >= M) { break; }
        let q = first + unflat(r % rows_n, count) * sdim();
        let px = (r / rows_n) * xpix() + (q.x * x.y + q.y) * x.z + q.z;
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + l.x * 4u + j;
            if (c < cg) { st(px * cin + g * cg + c, acc[i][j]); }
        }
    }
}

@compute @workgroup_size(16, 16)
fn conv_dw_$T(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    let op_n = opix();
    let M = p.w.n * op_n;
    let cin = p.cin;
    let cout = p.cout;
    let cg = p.cg;
    let og = p.og;
    let R = kk() * cg;
    let splits = p.splits;
    let chunk = p.chunk;
    let g = w.z / splits;
    let part = w.z % splits;
    let m_lo = part * chunk;
    let m_hi = min(M, m_lo + chunk);
    let row0 = p.row_base + w.y * 64u;
    let col0 = w.x * 64u;
    let tid = l.y * 16u + l.x;
    // This thread gathers row tid % 64 of the A^T slice (one kernel offset and channel,
    // fixed for the whole reduction) at batch*spatial positions tid / 64 + 4 t.
    let rr = row0 + tid % 64u;
    let ci = rr % max(cg, 1u);
    let off = vec3<i32>(unflat(rr / max(cg, 1u), kdim()) * ddim());
    var acc: array<vec4<T>, 4>;
    for (var i = 0u; i < 4u; i++) { acc[i] = vec4<T>(T(0)); }
    for (var k0 = m_lo; k0 < m_hi; k0 += 16u) {
        for (var t = 0u; t < 4u; t++) {
            let mk = tid / 64u + 4u * t;
            let m = k0 + mk;
            var v = T(0);
            if (m < m_hi && rr < R) {
                let ip = in_pix(origin(m % op_n) + off);
                if (ip >= 0) { v = ld_a(((m / op_n) * xpix() + u32(ip)) * cin + g * cg + ci); }
            }
            As[mk * 64u + tid % 64u] = v;
        }
        for (var t = 0u; t < 4u; t++) {
            let e = tid + t * 256u;
            let nn = e % 64u;
            let kb = e / 64u;
            var v = T(0);
            if (k0 + kb < m_hi && col0 + nn < og) { v = ld_b((k0 + kb) * cout + g * og + col0 + nn); }
            Bs[kb * 64u + nn] = v;
        }
        workgroupBarrier();
        mac(l, &acc);
        workgroupBarrier();
    }
    let obase = part * R * cout;
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + l.y * 4u + i;
        if (r >= R) { break; }
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + l.x * 4u + j;
            if (c < og) { st(obase + r * cout + g * og + c, acc[i][j]); }
        }
    }
}

// One thread per output element (image, pixel, channel): fwd for y, dx for dx.
@compute @workgroup_size(256)
fn conv_fwd_direct_$T(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(gid, nw);
    let cin = p.cin;
    let cout = p.cout;
    let cg = p.cg;
    let og = p.og;
    let op_n = opix();
    if (i >= p.w.n * op_n * cout) { return; }
    let co = i % cout;
    let m = i / cout;
    let g = co / og;
    let org = origin(m % op_n);
    let xb = (m / op_n) * xpix();
    var acc = T(0);
    for (var kp = 0u; kp < kk(); kp++) {
        let ip = in_pix(org + vec3<i32>(unflat(kp, kdim()) * ddim()));
        if (ip < 0) { continue; }
        let xo = (xb + u32(ip)) * cin + g * cg;
        for (var ci = 0u; ci < cg; ci++) {
            acc += ld_a(xo + ci) * ld_b((kp * cg + ci) * cout + co);
        }
    }
    st(i, acc);
}

@compute @workgroup_size(256)
fn conv_dx_direct_$T(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(gid, nw);
    let cin = p.cin;
    let cout = p.cout;
    let cg = p.cg;
    let og = p.og;
    let xp_n = xpix();
    if (i >= p.w.n * xp_n * cin) { return; }
    let c = i % cin;
    let m = i / cin;
    let g = c / cg;
    let ci = c % cg;
    let pix = vec3<i32>(unflat(m % xp_n, v3(p.w.x)));
    let gb = (m / xp_n) * opix();
    var acc = T(0);
    for (var kp = 0u; kp < kk(); kp++) {
        let op = out_pix(pix, kp);
        if (op < 0) { continue; }
        let go = (gb + u32(op)) * cout + g * og;
        let wo = (kp * cg + ci) * cout + g * og;
        for (var co = 0u; co < og; co++) {
            acc += ld_a(go + co) * ld_b(wo + co);
        }
    }
    st(i, acc);
}

// One thread per kernel element (kernel offset, channel in group, output channel) and
// chunk (gid.z) of the batch * spatial axis.
@compute @workgroup_size(256)
fn conv_dw_direct_$T(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(gid, nw);
    let cin = p.cin;
    let cout = p.cout;
    let cg = p.cg;
    let og = p.og;
    let R = kk() * cg;
    if (i >= R * cout) { return; }
    let co = i % cout;
    let r = i / cout;
    let g = co / og;
    let ci = r % cg;
    let off = vec3<i32>(unflat(r / cg, kdim()) * ddim());
    let op_n = opix();
    let M = p.w.n * op_n;
    let chunk = p.chunk;
    let m_lo = gid.z * chunk;
    let m_hi = min(M, m_lo + chunk);
    var acc = T(0);
    for (var m = m_lo; m < m_hi; m++) {
        let ip = in_pix(origin(m % op_n) + off);
        if (ip < 0) { continue; }
        acc += ld_a(((m / op_n) * xpix() + u32(ip)) * cin + g * cg + ci) * ld_b(m * cout + co);
    }
    st(gid.z * R * cout + i, acc);
}
