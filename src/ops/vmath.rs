//! Branch-free f32 transcendentals that the compiler vectorises, and the instruction-set
//! dispatch the CPU elementwise kernels run under.
//!
//! Each function is written per lane with selects instead of branches, so a loop over a
//! slice becomes SIMD code. The polynomials are Cephes' (`expf`, `logf`, `tanhf`), with
//! plain multiply-add (no FMA contraction), so every instruction set gives bit-identical
//! results. Accuracy against an f64 reference, over all finite inputs checked by the tests
//! below: exp, expm1, log, log1p, tanh within 2 ulp; sigmoid and softplus within 3 ulp
//! (or 1e-37 absolute in the denormal range). Special values follow libm: exp overflows to
//! +inf above 88.72 and underflows through the denormals to 0 below -103.97; log(0) = -inf,
//! log(x < 0) = NaN; tanh and sigmoid saturate to exactly ±1 / 0 / 1; NaN propagates.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds a float of magnitude below 2^22 to an integer.
const ROUND_MAGIC: f32 = 12_582_912.0;

#[inline(always)]
fn sel(c: bool, a: f32, b: f32) -> f32 {
    if c {
        a
    } else {
        b
    }
}

/// 2^n for integer n in [-126, 127], built from the exponent bits.
#[inline(always)]
fn pow2i(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// Reduces x = n ln2 + r with |r| <= ln2/2; returns (n, r). x must be within ±104.
#[inline(always)]
fn reduce_ln2(x: f32) -> (i32, f32) {
    let t = x * LOG2E + ROUND_MAGIC;
    let n = t.to_bits() as i32 - ROUND_MAGIC.to_bits() as i32;
    let nf = t - ROUND_MAGIC;
    (n, (x - nf * LN2_HI) - nf * LN2_LO)
}

/// e^r - 1 - r for |r| <= ln2/2 (Cephes expf), so e^r = 1 + r + q.
#[inline(always)]
fn exp_tail(r: f32) -> f32 {
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 5e-1;
    p * (r * r)
}

#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = sel(x > 89.0, 89.0, sel(x < -104.0, -104.0, x));
    let (n, r) = reduce_ln2(sel(!xc.is_nan(), xc, 0.0));
    let p = 1.0 + r + exp_tail(r);
    // Two factors, so results in the denormal range and near the top are scaled exactly.
    let h = n >> 1;
    let y = p * pow2i(h) * pow2i(n - h);
    sel(!x.is_nan(), y, x)
}

#[inline(always)]
pub fn expm1(x: f32) -> f32 {
    let xc = sel(x > 89.0, 89.0, sel(x < -30.0, -30.0, x));
    let (n, r) = reduce_ln2(sel(!xc.is_nan(), xc, 0.0));
    // e^r - 1, accurate for small r.
    let q = r + exp_tail(r);
    // e^x - 1 = 2^n (q + 1) - 1 = 2^n q + (2^n - 1); above 2^100 the -1 is irrelevant.
    let big = n > 100;
    let s = pow2i(if big { n - 64 } else { n });
    let small = s * q + (s - 1.0);
    let large = (q + 1.0) * s * pow2i(64);
    let y = sel(big, large, small);
    // x = ±0 and NaN return x (keeping the sign of zero).
    sel(!x.is_nan() && x != 0.0, y, x)
}

#[inline(always)]
pub fn log(x: f32) -> f32 {
    // Denormals: scale by 2^23 first.
    let tiny = x < f32::MIN_POSITIVE;
    let xs = sel(tiny, x * 8_388_608.0, x);
    let bits = xs.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126 - if tiny { 23 } else { 0 };
    // Mantissa in [0.5, 1).
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let lo = m < std::f32::consts::FRAC_1_SQRT_2;
    e -= lo as i32;
    m = sel(lo, m + m - 1.0, m - 1.0);
    let z = m * m;
    let mut y = ((((((((7.037_683_6e-2 * m - 1.151_461e-1) * m + 1.167_699_9e-1) * m
        - 1.242_014_1e-1)
        * m
        + 1.424_932_3e-1)
        * m
        - 1.666_805_8e-1)
        * m
        + 2.000_071_4e-1)
        * m
        - 2.499_999_4e-1)
        * m
        + 3.333_333e-1)
        * m
        * z;
    let ef = e as f32;
    y += ef * LN2_LO;
    y += -0.5 * z;
    let r = (m + y) + ef * LN2_HI;
    let r = sel(x == f32::INFINITY, x, r);
    let r = sel(x == 0.0, f32::NEG_INFINITY, r);
    sel(x < 0.0 || x.is_nan(), f32::NAN, r)
}

#[inline(always)]
pub fn log1p(x: f32) -> f32 {
    let u = 1.0 + x;
    // log(u) is off by the rounding of 1 + x; correct it to first order.
    let c = (x - (u - 1.0)) / u;
    // u = 0 or inf make c NaN; log(u) is exact there.
    let c = sel(!c.is_nan(), c, 0.0);
    let y = log(u) + c;
    let y = sel(u == f32::INFINITY, u, y);
    // Tiny x: log1p(x) = x (also keeps -0.0).
    sel(u == 1.0, x, y)
}

#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    // |x| < 0.625: odd polynomial (Cephes tanhf).
    let z = x * x;
    let p = ((((-5.704_988_7e-3 * z + 2.063_909e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1)
        * z
        - 3.333_328e-1)
        * z
        * x
        + x;
    // Otherwise 1 - 2 / (e^{2|x|} + 1), which saturates to 1 as e^{2|x|} overflows.
    let e = exp(sel(a > 20.0, 20.0, a) * 2.0);
    let t = 1.0 - 2.0 / (e + 1.0);
    let t = f32::from_bits(t.to_bits() | (x.to_bits() & 0x8000_0000));
    // x = ±0 returns x (the sign of zero); NaN propagates.
    sel(a < 0.625, sel(x == 0.0, x, p), sel(!x.is_nan(), t, x))
}

#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    // e = e^{-|x|} never overflows; 1 / (1 + e) for x >= 0, e / (1 + e) below.
    let e = exp(-x.abs());
    let s = 1.0 / (1.0 + e);
    sel(x >= 0.0, s, sel(!x.is_nan(), e * s, x))
}

#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    let m = sel(x > 0.0, x, 0.0);
    sel(!x.is_nan(), m + log1p(exp(-x.abs())), x)
}

// ---------------------------------------------------------------- instruction sets

/// The widest vector instruction set this CPU runs (checked once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Base,
}

pub fn isa() -> Isa {
    use std::sync::OnceLock;
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("fma")
            {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Base
    })
}

/// Defines `fn $name(args) -> R` that runs the `#[inline(always)]` function `$body` compiled
/// for the best instruction set `isa()` reports. `$body` and everything it calls must be
/// `#[inline(always)]` (or small generic code) so that it is compiled inside each variant.
#[macro_export]
macro_rules! multiversion {
    ($vis:vis fn $name:ident ($($a:ident : $t:ty),*) $(-> $r:ty)? => $body:path) => {
        $vis fn $name ($($a: $t),*) $(-> $r)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
                unsafe fn v512 ($($a: $t),*) $(-> $r)? { $body($($a),*) }
                #[target_feature(enable = "avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
                unsafe fn v256 ($($a: $t),*) $(-> $r)? { $body($($a),*) }
                match $crate::ops::vmath::isa() {
                    // SAFETY: isa() checked the CPU has these features.
                    $crate::ops::vmath::Isa::Avx512 => return unsafe { v512($($a),*) },
                    $crate::ops::vmath::Isa::Avx2 => return unsafe { v256($($a),*) },
                    $crate::ops::vmath::Isa::Base => {}
                }
            }
            $body($($a),*)
        }
    };
}

#[inline(always)]
fn map_body<F: Fn(f32) -> f32>(x: &[f32], out: &mut [f32], f: F) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

macro_rules! slice_fns {
    ($($name:ident),*) => {
        /// Slice forms (`out[i] = f(x[i])`), run with the best instruction set.
        pub mod slice {
            $(
                #[inline(always)]
                fn $name(x: &[f32], out: &mut [f32]) {
                    super::map_body(x, out, super::$name)
                }
            )*
            pub mod run {
                $( $crate::multiversion!(pub fn $name(x: &[f32], out: &mut [f32]) => super::$name); )*
            }
        }
    };
}
slice_fns!(exp, expm1, log, log1p, tanh, sigmoid, softplus);

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        // Distance in units of the last place of the f32 nearest the reference.
        let r = b as f32;
        if a == r || (a.is_nan() && r.is_nan()) {
            return 0.0;
        }
        if !a.is_finite() || !r.is_finite() {
            return f64::INFINITY;
        }
        let ulp = if r == 0.0 {
            f32::from_bits(1) as f64
        } else {
            (f32::from_bits(r.abs().to_bits() + 1) - r.abs()) as f64
        };
        ((a as f64) - b).abs() / ulp
    }

    /// Dense sweep: every 257th f32 bit pattern (both signs), plus the special values.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..u32::MAX / 257)
            .map(|k| f32::from_bits(k * 257))
            .filter(|x| !x.is_nan())
            .collect();
        v.extend([
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            88.72,
            88.73,
            -87.33,
            -103.9,
            -104.0,
            0.625,
            -0.625,
        ]);
        v
    }

    fn check(name: &str, f: fn(f32) -> f32, r: fn(f64) -> f64, tol: f64, abs_floor: f64) {
        let mut worst = (0.0f64, 0.0f32);
        for x in inputs() {
            let (y, want) = (f(x), r(x as f64));
            if want.is_nan() {
                assert!(y.is_nan(), "{name}({x:e}) = {y:e}, want NaN");
                continue;
            }
            if (want as f32).is_infinite() || (want as f32) == 0.0 {
                assert_eq!(y, want as f32, "{name}({x:e})");
                continue;
            }
            if ((y as f64) - want).abs() <= abs_floor {
                continue;
            }
            let u = ulps(y, want);
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(
            worst.0 <= tol,
            "{name}: {} ulp at x = {:e} ({:e} vs {:e})",
            worst.0,
            worst.1,
            f(worst.1),
            r(worst.1 as f64)
        );
    }

    fn sigmoid64(x: f64) -> f64 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            x.exp() / (1.0 + x.exp())
        }
    }
    fn softplus64(x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }

    #[test]
    fn accuracy_against_f64() {
        check("exp", exp, f64::exp, 2.0, 0.0);
        check("expm1", expm1, f64::exp_m1, 2.0, 0.0);
        check("log", log, f64::ln, 2.0, 0.0);
        check("log1p", log1p, f64::ln_1p, 2.0, 0.0);
        check("tanh", tanh, f64::tanh, 2.0, 0.0);
        check("sigmoid", sigmoid, sigmoid64, 3.0, 1e-37);
        check("softplus", softplus, softplus64, 3.0, 1e-37);
    }

    #[test]
    fn special_values() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        assert_eq!(exp(inf), inf);
        assert_eq!(exp(-inf), 0.0);
        assert_eq!(exp(89.0), inf);
        assert_eq!(exp(-200.0), 0.0);
        assert!(
            exp(-100.0) > 0.0 && exp(-100.0) < f32::MIN_POSITIVE,
            "denormal result"
        );
        assert_eq!(expm1(inf), inf);
        assert_eq!(expm1(-inf), -1.0);
        assert_eq!(expm1(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(log(0.0), -inf);
        assert_eq!(log(-0.0), -inf);
        assert!(log(-1.0).is_nan());
        assert_eq!(log(inf), inf);
        assert_eq!(log1p(-1.0), -inf);
        assert_eq!(log1p(inf), inf);
        assert!(log1p(-2.0).is_nan());
        assert_eq!(tanh(inf), 1.0);
        assert_eq!(tanh(-inf), -1.0);
        assert_eq!(tanh(30.0), 1.0);
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(sigmoid(inf), 1.0);
        assert_eq!(sigmoid(-inf), 0.0);
        assert_eq!(sigmoid(50.0), 1.0);
        assert_eq!(softplus(inf), inf);
        assert_eq!(softplus(-inf), 0.0);
        for f in [exp, expm1, log, log1p, tanh, sigmoid, softplus] {
            assert!(f(nan).is_nan());
        }
    }

    #[test]
    fn slice_forms_match_the_lane_forms_on_every_isa() {
        let x: Vec<f32> = (0..4099).map(|k| (k as f32 - 2000.0) * 0.037).collect();
        let mut out = vec![0.0; x.len()];
        slice::run::tanh(&x, &mut out);
        for (&a, &o) in x.iter().zip(&out) {
            assert_eq!(o.to_bits(), tanh(a).to_bits());
        }
        slice::run::exp(&x, &mut out);
        for (&a, &o) in x.iter().zip(&out) {
            assert_eq!(o.to_bits(), exp(a).to_bits());
        }
    }
}
