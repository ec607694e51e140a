// int64 in the generated kernels (`src/runtime/gpu/fusion.rs`): a value is a
// vec2<u32> (low word, high word) in two's complement, the host's bytes, so the words
// upload and download as they are. Arithmetic wraps modulo 2^64 as the CPU kernels do
// (wrapping_add, wrapping_mul, ...); casts give the CPU's exact results (an int64 to a
// float through f64, a float to an int64 truncated and saturated, NaN to 0).

fn q_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn q_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
fn q_neg(a: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(0u - a.x, ~a.y + select(0u, 1u, a.x == 0u));
}
// The full 64-bit product of two u32, from 16-bit halves.
fn q_mul32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
fn q_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p = q_mul32(a.x, b.x);
    return vec2<u32>(p.x, p.y + a.x * b.y + a.y * b.x);
}
fn q_is_neg(a: vec2<u32>) -> bool { return (a.y >> 31u) == 1u; }
fn q_eq(a: vec2<u32>, b: vec2<u32>) -> bool { return a.x == b.x && a.y == b.y; }
// Signed a < b.
fn q_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    let ah = bitcast<i32>(a.y);
    let bh = bitcast<i32>(b.y);
    return ah < bh || (ah == bh && a.x < b.x);
}
// Unsigned a < b.
fn q_ult(a: vec2<u32>, b: vec2<u32>) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
fn q_max(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(a, b, q_lt(a, b)); }
fn q_min(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(a, b, q_lt(b, a)); }
fn q_abs(a: vec2<u32>) -> vec2<u32> { return select(a, q_neg(a), q_is_neg(a)); }
fn q_sign(a: vec2<u32>) -> vec2<u32> {
    if (q_is_neg(a)) { return vec2<u32>(0xffffffffu, 0xffffffffu); }
    return vec2<u32>(select(0u, 1u, a.x != 0u || a.y != 0u), 0u);
}
fn q_relu(a: vec2<u32>) -> vec2<u32> { return select(a, vec2<u32>(0u, 0u), q_is_neg(a)); }
fn q_from_i32(x: i32) -> vec2<u32> { return vec2<u32>(bitcast<u32>(x), select(0u, 0xffffffffu, x < 0)); }
// A float truncated toward zero, saturated to the int64 range, NaN to 0 (Rust's `as`).
fn q_from_f32(x: f32) -> vec2<u32> {
    if (fk_isnan(x)) { return vec2<u32>(0u, 0u); }
    if (x >= 9223372036854775808.0) { return vec2<u32>(0xffffffffu, 0x7fffffffu); }
    if (x <= -9223372036854775808.0) { return vec2<u32>(0u, 0x80000000u); }
    // Exact: t is an integer below 2^63, and scaling by powers of two loses nothing.
    let t = trunc(abs(x));
    let hi = floor(t * (1.0 / 4294967296.0));
    let lo = t - hi * 4294967296.0;
    let m = vec2<u32>(u32(lo), u32(hi));
    return select(m, q_neg(m), x < 0.0);
}
fn q_bitlen(a: vec2<u32>) -> u32 {
    if (a.y != 0u) { return 64u - countLeadingZeros(a.y); }
    return 32u - countLeadingZeros(a.x);
}
// Logical shifts by s < 64.
fn q_shr(a: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return a; }
    if (s >= 32u) { return vec2<u32>(a.y >> (s - 32u), 0u); }
    return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}
fn q_shl(a: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return a; }
    if (s >= 32u) { return vec2<u32>(0u, a.x << (s - 32u)); }
    return vec2<u32>(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}
// Unsigned a (at most 2^63) rounded to `bits` significant bits, ties to even.
fn q_round_bits(a: vec2<u32>, bits: u32) -> vec2<u32> {
    let len = q_bitlen(a);
    if (len <= bits) { return a; }
    let s = len - bits;
    let q = q_shr(a, s);
    let rest = q_sub(a, q_shl(q, s));
    let half = q_shl(vec2<u32>(1u, 0u), s - 1u);
    let up = q_ult(half, rest) || (q_eq(rest, half) && (q.x & 1u) == 1u);
    return q_shl(q_add(q, vec2<u32>(select(0u, 1u, up), 0u)), s);
}
// The float the CPU makes of int64 a: a to f64 (53 significant bits), then to a float of
// `bits` significant bits (24 for f32, 11 for f16), each rounding to nearest even. The
// result has at most `bits` significant bits, so both words convert and add exactly.
fn q_to_float(a: vec2<u32>, bits: u32) -> f32 {
    let neg = q_is_neg(a);
    let m = q_round_bits(q_round_bits(select(a, q_neg(a), neg), 53u), bits);
    let f = f32(m.y) * 4294967296.0 + f32(m.x);
    return select(f, -f, neg);
}
