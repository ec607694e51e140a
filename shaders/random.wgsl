// Counter-based random numbers: Philox-4x32-10, the same stream as the CPU kernel in
// src/ops/random.rs (element i of call n is a function of (seed, i, n)). Uniform draws
// are bit-identical to the CPU; normal draws agree to float rounding of log/cos/sqrt.
//
// Bindings: 0 params, 1 out.

// dist 0 uniform, 1 normal, 2 truncated normal.
struct Random {
    n: u32,
    key0: u32,
    key1: u32,
    call_lo: u32,
    call_hi: u32,
    dist: u32,
}

@group(0) @binding(0) var<storage, read> p: Random;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

// (high, low) words of the 64-bit product a * b.
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(hi, a * b);
}

fn philox(c0: vec4<u32>, k0: vec2<u32>) -> vec4<u32> {
    var c = c0;
    var k = k0;
    for (var r = 0; r < 10; r++) {
        let p0 = mulhilo(0xD2511F53u, c.x);
        let p1 = mulhilo(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
        k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

fn unit(w: u32) -> f32 { return (f32(w >> 8u) + 0.5) * (1.0 / 16777216.0); }
fn box_muller(a: u32, b: u32) -> f32 {
    return sqrt(-2.0 * log(unit(a))) * cos(6.2831853071795864 * unit(b));
}

@compute @workgroup_size(256)
fn random_$T(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = fk_index(g, nw);
    if (i >= p.n) { return; }
    let key = vec2<u32>(p.key0, p.key1);
    let dist = p.dist;
    var v = 0.0;
    if (dist == 0u) {
        // One Philox block gives four uniforms: element i takes word i % 4 of block i / 4.
        let w = philox(vec4<u32>(i / 4u, 0u, p.call_lo, p.call_hi), key);
        v = f32(w[i % 4u] >> 8u) * (1.0 / 16777216.0);
    } else if (dist == 1u) {
        let w = philox(vec4<u32>(i, 0u, p.call_lo, p.call_hi), key);
        v = box_muller(w.x, w.y);
    } else {
        for (var k = 0u; k < 64u; k++) {
            let w = philox(vec4<u32>(i, 0u, p.call_lo, p.call_hi ^ (k << 16u)), key);
            let z0 = box_muller(w.x, w.y);
            if (abs(z0) <= 2.0) { v = z0; break; }
            let z1 = box_muller(w.z, w.w);
            if (abs(z1) <= 2.0) { v = z1; break; }
        }
    }
    out[i] = bitcast<u32>(t_norm(T(v)));
}
