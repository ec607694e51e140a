// Batched matmul C[b] = op(A[b]) @ op(B[b]), op = optional transpose (given as strides).
// 64x64 output tiles per 16x16 workgroup, 16-deep k slices staged in workgroup memory,
// and a 4x4 register block per thread accumulated with vec4 multiply-adds. An operand
// whose contiguous dimension is a multiple of 4 is loaded as vec4 words (one per thread
// per tile) through a second, vec4-typed binding of the same buffer.
//
// Bindings: 0 params (the Matmul block of src/runtime/gpu/params.rs), 1 out, 2 a, 3 b,
// 5 a as vec4, 6 b as vec4.

// op(a) is m x k, op(b) k x n, addressed through row and column strides. vec4: bit 0, a
// loads by vec4; bit 1, b. tail = [out_batch[batch_rank], a_batch_stride[batch_rank],
// b_batch_stride[batch_rank]] (0 on broadcast batch dims). (col_tile0, row_tile0, batch0):
// the grid's first tile and batch (a product whose grid exceeds the adapter's limit per
// dimension is split over several dispatches); [k_lo, k_hi): the slice of the contracted
// dim this dispatch sums, added to `out` when `add` is set (a long K is split over
// dispatches: llvmpipe ends a shader loop after 65535 iterations, counting inner loops).
struct Matmul {
    m: u32,
    n: u32,
    k: u32,
    batch_rank: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    vec4: u32,
    ta: u32,
    tb: u32,
    col_tile0: u32,
    row_tile0: u32,
    batch0: u32,
    k_lo: u32,
    k_hi: u32,
    add: u32,
    tail: array<u32>,
}

@group(0) @binding(0) var<storage, read> p: Matmul;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(5) var<storage, read> a4: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> b4: array<vec4<u32>>;

// Stores element o of the product (adding to it when `add` is set). A kernel with an
// epilogue (src/runtime/gpu/fusion.rs) replaces this line with a call of its `epi`.
fn st(o: u32, v: T) { if (p.add != 0u) { out[o] = bitcast<u32>(t_norm(v + bitcast<T>(out[o]))); } else { out[o] = bitcast<u32>(t_norm(v)); } }

var<workgroup> As: array<T, 1024>;  // [16 k][64 rows]
var<workgroup> Bs: array<T, 1024>;  // [16 k][64 cols]

@compute @workgroup_size(16, 16)
fn matmul_$T(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    let M = p.m;
    let N = p.n;
    let K = p.k;
    let nb = p.batch_rank;
    let a_rs = p.a_rs;
    let a_cs = p.a_cs;
    let b_rs = p.b_rs;
    let b_cs = p.b_cs;
    let bz = w.z + p.batch0;
    var rem = bz;
    var aoff = 0u;
    var boff = 0u;
    for (var q = 0u; q < nb; q++) {
        let d = nb - 1u - q;
        let dim = p.tail[d];
        let c = rem % dim;
        rem = rem / dim;
        aoff += c * p.tail[nb + d];
        boff += c * p.tail[2u * nb + d];
    }
    let row0 = (w.y + p.row_tile0) * 64u;
    let col0 = (w.x + p.col_tile0) * 64u;
    let tid = l.y * 16u + l.x;
    var acc: array<vec4<T>, 4>;
    for (var i = 0u; i < 4u; i++) { acc[i] = vec4<T>(T(0)); }
    let v4 = p.vec4;
    let ta = p.ta != 0u;
    let tb = p.tb != 0u;
    let k_hi = min(K, p.k_hi);
    for (var k0 = p.k_lo; k0 < k_hi; k0 += 16u) {
        if ((v4 & 1u) != 0u && !ta) {
            // A row-major [M, K]: 4 consecutive k of one row.
            let mm = tid / 4u;
            let kq = (tid % 4u) * 4u;
            let gr = row0 + mm;
            let gk = k0 + kq;
            var v = vec4<T>(T(0));
            if (gr < M && gk < K) { v = bitcast<vec4<T>>(a4[(aoff + gr * K + gk) / 4u]); }
            As[kq * 64u + mm] = v.x;
            As[(kq + 1u) * 64u + mm] = v.y;
            As[(kq + 2u) * 64u + mm] = v.z;
            As[(kq + 3u) * 64u + mm] = v.w;
        } else if ((v4 & 1u) != 0u) {
            // A stored [K, M] (transposed): 4 consecutive rows of one k.
            let kk = tid / 16u;
            let mq = (tid % 16u) * 4u;
            let gr = row0 + mq;
            let gk = k0 + kk;
            var v = vec4<T>(T(0));
            if (gr < M && gk < K) { v = bitcast<vec4<T>>(a4[(aoff + gk * M + gr) / 4u]); }
            let base = kk * 64u + mq;
            As[base] = v.x;
            As[base + 1u] = v.y;
            As[base + 2u] = v.z;
            As[base + 3u] = v.w;
        } else {
        for (var t = 0u; t < 4u; t++) {
            let e = tid + t * 256u;
            let kk = e % 16u;
            let mm = e / 16u;
            let gr = row0 + mm;
            let gk = k0 + kk;
            var v = T(0);
            if (gr < M && gk < K) { v = bitcast<T>(a[aoff + gr * a_rs + gk * a_cs]); }
            As[kk * 64u + mm] = v;
        }
        }
        if ((v4 & 2u) != 0u && !tb) {
            // B row-major [K, N]: 4 consecutive columns of one k.
            let kk = tid / 16u;
            let nq = (tid % 16u) * 4u;
            let gc = col0 + nq;
            let gk = k0 + kk;
            var v = vec4<T>(T(0));
            if (gk < K && gc < N) { v = bitcast<vec4<T>>(b4[(boff + gk * N + gc) / 4u]); }
            let base = kk * 64u + nq;
            Bs[base] = v.x;
            Bs[base + 1u] = v.y;
            Bs[base + 2u] = v.z;
            Bs[base + 3u] = v.w;
        } else if ((v4 & 2u) != 0u) {
            // B stored [N, K] (transposed): 4 consecutive k of one column.
            let nn = tid / 4u;
            let kq = (tid % 4u) * 4u;
            let gc = col0 + nn;
            let gk = k0 + kq;
            var v = vec4<T>(T(0));
            if (gk < K && gc < N) { v = bitcast<vec4<T>>(b4[(boff + gc * K + gk) / 4u]); }
            Bs[kq * 64u + nn] = v.x;
            Bs[(kq + 1u) * 64u + nn] = v.y;
            Bs[(kq + 2u) * 64u + nn] = v.z;
            Bs[(kq + 3u) * 64u + nn] = v.w;
        } else {
        for (var t = 0u; t < 4u; t++) {
            let e = tid + t * 256u;
            let nn = e % 64u;
            let kk = e / 64u;
            let gk = k0 + kk;
            let gc = col0 + nn;
            var v = T(0);
            if (gk < K && gc < N) { v = bitcast<T>(b[boff + gk * b_rs + gc * b_cs]); }
            Bs[kk * 64u + nn] = v;
        }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
            let ab = kk * 64u + l.y * 4u;
            let bb = kk * 64u + l.x * 4u;
            let bv = vec4<T>(Bs[bb], Bs[bb + 1u], Bs[bb + 2u], Bs[bb + 3u]);
            acc[0] += vec4<T>(As[ab]) * bv;
            acc[1] += vec4<T>(As[ab + 1u]) * bv;
            acc[2] += vec4<T>(As[ab + 2u]) * bv;
            acc[3] += vec4<T>(As[ab + 3u]) * bv;
        }
        workgroupBarrier();
    }
    let ooff = bz * M * N;
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + l.y * 4u + i;
        if (r >= M) { break; }
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + l.x * 4u + j;
            if (c < N) { st(ooff + r * N + c, acc[i][j]); }
        }
    }
}
