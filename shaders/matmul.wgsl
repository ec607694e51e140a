// Batched matmul C[b] = op(A[b]) @ op(B[b]), op = optional transpose (given as strides).
// 64x64 output tiles per 16x16 workgroup, 16-deep k slices staged in workgroup memory,
// and a 4x4 register block per thread accumulated with vec4 multiply-adds.
//
// Bindings: 0 params, 1 out, 2 a, 3 b.

@group(0) @binding(0) var<storage, read> P: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;

var<workgroup> As: array<T, 1024>;  // [16 k][64 rows]
var<workgroup> Bs: array<T, 1024>;  // [16 k][64 cols]

// P = [M, N, K, nb, a_rs, a_cs, b_rs, b_cs, out_batch[nb], a_batch_stride[nb], b_batch_stride[nb]]
@compute @workgroup_size(16, 16)
fn matmul_$T(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    let M = P[0];
    let N = P[1];
    let K = P[2];
    let nb = P[3];
    let a_rs = P[4];
    let a_cs = P[5];
    let b_rs = P[6];
    let b_cs = P[7];
    var rem = w.z;
    var aoff = 0u;
    var boff = 0u;
    for (var q = 0u; q < nb; q++) {
        let d = nb - 1u - q;
        let dim = P[8u + d];
        let c = rem % dim;
        rem = rem / dim;
        aoff += c * P[8u + nb + d];
        boff += c * P[8u + 2u * nb + d];
    }
    let row0 = w.y * 64u;
    let col0 = w.x * 64u;
    let tid = l.y * 16u + l.x;
    var acc: array<vec4<T>, 4>;
    for (var i = 0u; i < 4u; i++) { acc[i] = vec4<T>(T(0)); }
    for (var k0 = 0u; k0 < K; k0 += 16u) {
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
    let ooff = w.z * M * N;
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + l.y * 4u + i;
        if (r >= M) { break; }
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + l.x * 4u + j;
            if (c < N) { out[ooff + r * N + c] = bitcast<u32>(t_norm(acc[i][j])); }
        }
    }
}
