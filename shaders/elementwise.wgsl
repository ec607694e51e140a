// Helpers for the fused elementwise kernels. The kernels themselves are generated in
// src/runtime/gpu/fusion.rs from the op -> WGSL expression tables in
// src/ops/elementwise.rs; this file is prepended to every generated kernel.
// Float values are f32 (f16 tensors are stored widened and rounded after every op),
// integer and bool values are i32 (narrow types wrapped after every op).

fn fk_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn fk_isinf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn fk_nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn fk_inf() -> f32 { return bitcast<f32>(0x7f800000u); }

fn fk_expm1(x: f32) -> f32 {
    if (abs(x) < 1e-5) { return x + 0.5 * x * x; }
    let u = exp(x);
    if (u == 1.0) { return x; }
    let um1 = u - 1.0;
    if (um1 == -1.0) { return -1.0; }
    if (fk_isinf(u)) { return u; }
    return um1 * x / log(u);
}

fn fk_log1p(x: f32) -> f32 {
    let u = 1.0 + x;
    if (u == 1.0) { return x; }
    if (fk_isinf(u) || u <= 0.0) { return log(u); }
    return log(u) * x / (u - 1.0);
}

fn fk_tanh(x: f32) -> f32 {
    if (fk_isnan(x)) { return x; }
    let e = fk_expm1(-2.0 * abs(x));
    let t = -e / (2.0 + e);
    return select(t, -t, x < 0.0);
}

fn fk_sigmoid(x: f32) -> f32 {
    if (x >= 0.0) { return 1.0 / (1.0 + exp(-x)); }
    let e = exp(x);
    return e / (1.0 + e);
}

fn fk_fmod(a: f32, b: f32) -> f32 {
    let r = a - b * trunc(a / b);
    if (r != 0.0 && ((r < 0.0) != (b < 0.0))) { return r + b; }
    return r;
}

fn fk_pow(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) { return 1.0; }
    if (fk_isnan(a) || fk_isnan(b)) { return fk_nan(); }
    // IEEE pow's special cases, which WGSL's pow (exp2(b * log2(a))) leaves undefined for
    // a <= 0. Every float of magnitude 2^24 or more is an even integer.
    let b_int = b == floor(b);
    let b_odd = b_int && abs(b) < 16777216.0 && fract(b * 0.5) != 0.0;
    if (a == 0.0) {
        let m = select(0.0, fk_inf(), b < 0.0);
        return select(m, -m, b_odd && (bitcast<u32>(a) >> 31u) == 1u);
    }
    if (a < 0.0) {
        if (a == -1.0 && abs(b) == fk_inf()) { return 1.0; }
        if (!b_int) {
            if (a == -fk_inf()) { return select(0.0, fk_inf(), b > 0.0); }
            return fk_nan();
        }
        let m = pow(-a, b);
        return select(m, -m, b_odd);
    }
    return pow(a, b);
}

fn fk_floor_div(a: i32, b: i32) -> i32 {
    if (b == 0) { return 0; }
    let q = a / b;
    if ((a % b) != 0 && ((a < 0) != (b < 0))) { return q - 1; }
    return q;
}

fn fk_floor_mod(a: i32, b: i32) -> i32 {
    if (b == 0) { return 0; }
    let r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) { return r + b; }
    return r;
}

fn fk_ipow(a: i32, b: i32) -> i32 {
    if (b < 0) {
        if (a == 1) { return 1; }
        if (a == -1) { return select(-1, 1, (b & 1) == 0); }
        return 0;
    }
    var base = a;
    var e = u32(b);
    var r = 1;
    loop {
        if (e == 0u) { break; }
        if ((e & 1u) == 1u) { r = r * base; }
        base = base * base;
        e = e >> 1u;
    }
    return r;
}

// Rounds an f32 to the nearest f16 (overflow to +-inf, NaN kept), as the CPU's per-op
// f16 store does.
fn fk_q16(x: f32) -> f32 {
    if (fk_isnan(x)) { return x; }
    if (abs(x) >= 65520.0) { return select(fk_inf(), -fk_inf(), x < 0.0); }
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}
fn fk_wrap_i8(x: i32) -> i32 { return (x << 24u) >> 24u; }
fn fk_wrap_i16(x: i32) -> i32 { return (x << 16u) >> 16u; }
fn fk_wrap_u8(x: i32) -> i32 { return x & 255; }

// Float -> integer casts saturate and send NaN to 0 (Rust `as`, which the CPU path uses).
fn fk_f2i(x: f32, lo: f32, hi: f32) -> i32 {
    if (fk_isnan(x)) { return 0; }
    return i32(clamp(trunc(x), lo, hi));
}
fn fk_f2i32(x: f32) -> i32 {
    if (fk_isnan(x)) { return 0; }
    if (x >= 2147483648.0) { return 2147483647; }
    if (x <= -2147483648.0) { return -2147483647 - 1; }
    return i32(x);
}

// Flat invocation index over a 2-D grid of 256-wide workgroups.
fn fk_index(g: vec3<u32>, n: vec3<u32>) -> u32 { return g.x + g.y * n.x * 256u; }
