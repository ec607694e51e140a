//! Counter-based random numbers (Philox-4x32-10). Element `i` of the `n`-th execution of a
//! node is a pure function of (seed, i, n), so a seeded graph gives the same numbers on
//! every run and on every device, while each call of a compiled function draws fresh ones.

use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::ops::graph::Tensor;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

// ---- random ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RandomDist {
    /// Uniform on [0, 1).
    Uniform,
    /// Standard normal.
    Normal,
    /// Standard normal, redrawn outside [-2, 2] (as TensorFlow's truncated_normal).
    TruncatedNormal,
}

#[derive(Debug)]
pub struct RandomState {
    pub dist: RandomDist,
    pub seed: u64,
    pub dtype: DType,
    /// Executions so far; the counter's high words.
    pub calls: AtomicU64,
}

impl RandomDist {
    pub fn name(self) -> &'static str {
        match self {
            RandomDist::Uniform => "random_uniform",
            RandomDist::Normal => "random_normal",
            RandomDist::TruncatedNormal => "truncated_normal",
        }
    }
}

static UNSEEDED: AtomicU64 = AtomicU64::new(0x5EED_F00D_0000_0001);

/// A seed for an op built without one: distinct per op, fixed for the op's lifetime.
pub fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    UNSEEDED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ t
}

pub fn random(dist: RandomDist, shape: &Tensor, dtype: DType, seed: Option<u64>) -> Result<Tensor> {
    let st = RandomState {
        dist,
        seed: seed.unwrap_or_else(fresh_seed),
        dtype,
        calls: AtomicU64::new(0),
    };
    Tensor::new(Op::Random(Arc::new(st)), vec![shape.clone()])
}

pub fn infer(st: &RandomState, shape: &Tensor) -> Result<(Shape, DType)> {
    if !st.dtype.is_float() {
        return Err(Error::Type(format!(
            "{}: dtype must be a float type, got {}",
            st.dist.name(),
            st.dtype
        )));
    }
    let dims = super::movement::partial_value(shape).ok_or_else(|| {
        Error::Type(format!(
            "{}: shape must be a 1-D int tensor",
            st.dist.name()
        ))
    })?;
    if dims.iter().any(|d| matches!(d, Some(v) if *v < 0)) {
        return Err(Error::Value(format!(
            "{}: negative dimension in shape {dims:?}",
            st.dist.name()
        )));
    }
    Ok((
        Shape(dims.iter().map(|d| d.map(|d| d as usize)).collect()),
        st.dtype,
    ))
}

/// The key and call number for this execution (advances the node's call counter).
pub fn next_call(st: &RandomState) -> ([u32; 2], u64) {
    (
        [st.seed as u32, (st.seed >> 32) as u32],
        st.calls.fetch_add(1, Ordering::Relaxed),
    )
}

pub fn cpu(st: &RandomState, shape: &Value) -> Result<Value> {
    let dims: Vec<usize> = shape
        .to_i64_vec()
        .iter()
        .map(|&d| {
            if d < 0 {
                Err(Error::Value(format!(
                    "{}: negative dimension {d}",
                    st.dist.name()
                )))
            } else {
                Ok(d as usize)
            }
        })
        .collect::<Result<_>>()?;
    let n: usize = dims.iter().product();
    let (key, call) = next_call(st);
    use rayon::prelude::*;
    let data: Vec<f32> = if st.dist == RandomDist::Uniform {
        let mut v: Vec<f32> = Vec::with_capacity(n);
        let out = &mut v.spare_capacity_mut()[..n];
        if n < 2 * UNIFORM_TASK {
            uniform_blocks(key, call, 0, out);
        } else {
            out.par_chunks_mut(UNIFORM_TASK)
                .enumerate()
                .for_each(|(t, o)| uniform_blocks(key, call, (t * UNIFORM_TASK / 4) as u64, o));
        }
        // SAFETY: uniform_blocks wrote all n slots.
        unsafe { v.set_len(n) };
        v
    } else {
        (0..n)
            .into_par_iter()
            .with_min_len(4096)
            .map(|i| sample(st.dist, key, call, i as u64))
            .collect()
    };
    Ok(Value::from_vec(&dims, data)?.cast(st.dtype))
}

// ---- helpers: Philox-4x32-10 ----

const M0: u32 = 0xD251_1F53;

const M1: u32 = 0xCD9E_8D57;

const W0: u32 = 0x9E37_79B9;

const W1: u32 = 0xBB67_AE85;

/// Philox-4x32 with 10 rounds (Salmon et al., 2011).
pub fn philox(mut c: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut k0, mut k1) = (key[0], key[1]);
    for _ in 0..10 {
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        c = [
            ((p1 >> 32) as u32) ^ c[1] ^ k0,
            p1 as u32,
            ((p0 >> 32) as u32) ^ c[3] ^ k1,
            p0 as u32,
        ];
        k0 = k0.wrapping_add(W0);
        k1 = k1.wrapping_add(W1);
    }
    c
}

/// A uniform float in (0, 1): 24 random bits, offset by half a step so log() is finite.
#[inline]
pub fn unit(w: u32) -> f32 {
    ((w >> 8) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

/// Element `i` of call `n`; f32 arithmetic, matching the WGSL kernel.
pub fn sample(dist: RandomDist, key: [u32; 2], n: u64, i: u64) -> f32 {
    let ctr = |k: u32| {
        [
            i as u32,
            (i >> 32) as u32,
            n as u32,
            ((n >> 32) as u32) ^ (k << 16),
        ]
    };
    match dist {
        RandomDist::Uniform => {
            // One Philox block gives four uniforms: element i takes word i % 4 of block i / 4.
            let blk = i / 4;
            let c = [blk as u32, (blk >> 32) as u32, n as u32, (n >> 32) as u32];
            ((philox(c, key)[(i % 4) as usize] >> 8) as f32) * (1.0 / 16_777_216.0)
        }
        RandomDist::Normal => {
            let w = philox(ctr(0), key);
            box_muller(w[0], w[1])
        }
        RandomDist::TruncatedNormal => {
            for k in 0..64u32 {
                let w = philox(ctr(k), key);
                for (a, b) in [(w[0], w[1]), (w[2], w[3])] {
                    let z = box_muller(a, b);
                    if z.abs() <= 2.0 {
                        return z;
                    }
                }
            }
            0.0
        }
    }
}

#[inline]
fn box_muller(a: u32, b: u32) -> f32 {
    (-2.0 * unit(a).ln()).sqrt() * (std::f32::consts::TAU * unit(b)).cos()
}

/// Philox blocks computed side by side (one AVX-512 register of counters).
const LANES: usize = 16;

/// Elements per rayon task of a uniform draw (a multiple of `4 * LANES`).
const UNIFORM_TASK: usize = 1 << 15;

/// `philox` on `LANES` counters at once, one array per counter word; written per lane so
/// that it compiles to SIMD multiplies (`vpmuludq`) inside the instruction-set variants.
#[inline(always)]
fn philox_lanes(c: &mut [[u32; LANES]; 4], key: [u32; 2]) {
    let (mut k0, mut k1) = (key[0], key[1]);
    for _ in 0..10 {
        for l in 0..LANES {
            let p0 = (M0 as u64) * (c[0][l] as u64);
            let p1 = (M1 as u64) * (c[2][l] as u64);
            let (c1, c3) = (c[1][l], c[3][l]);
            c[0][l] = ((p1 >> 32) as u32) ^ c1 ^ k0;
            c[1][l] = p1 as u32;
            c[2][l] = ((p0 >> 32) as u32) ^ c3 ^ k1;
            c[3][l] = p0 as u32;
        }
        k0 = k0.wrapping_add(W0);
        k1 = k1.wrapping_add(W1);
    }
}

#[inline(always)]
fn uniform_word(w: u32) -> f32 {
    ((w >> 8) as f32) * (1.0 / 16_777_216.0)
}

/// Uniform elements `4 * first_block ..` of call `call` into `out` (any length): element
/// `i` is word `i % 4` of Philox block `i / 4`, as `sample` computes it.
#[inline(always)]
fn uniform_blocks_body(key: [u32; 2], call: u64, first_block: u64, out: &mut [MaybeUninit<f32>]) {
    let ctr = |b: u64| [b as u32, (b >> 32) as u32, call as u32, (call >> 32) as u32];
    let mut groups = out.chunks_exact_mut(4 * LANES);
    let mut b = first_block;
    for o in &mut groups {
        let mut c = [[0u32; LANES]; 4];
        for l in 0..LANES {
            let w = ctr(b + l as u64);
            for k in 0..4 {
                c[k][l] = w[k];
            }
        }
        philox_lanes(&mut c, key);
        for l in 0..LANES {
            for k in 0..4 {
                o[4 * l + k].write(uniform_word(c[k][l]));
            }
        }
        b += LANES as u64;
    }
    for o in groups.into_remainder().chunks_mut(4) {
        let w = philox(ctr(b), key);
        for (o, &wi) in o.iter_mut().zip(&w) {
            o.write(uniform_word(wi));
        }
        b += 1;
    }
}

crate::multiversion!(fn uniform_blocks(key: [u32; 2], call: u64, first_block: u64, out: &mut [MaybeUninit<f32>]) => uniform_blocks_body);

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer test from the Random123 distribution (kat_vectors, philox4x32_10).
    #[test]
    fn philox_known_answers() {
        assert_eq!(
            philox([0, 0, 0, 0], [0, 0]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox([0xffffffff; 4], [0xffffffff, 0xffffffff]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
    }

    #[test]
    fn uniform_and_normal_moments() {
        let key = [7, 0];
        let n = 200_000u64;
        let u: Vec<f32> = (0..n)
            .map(|i| sample(RandomDist::Uniform, key, 0, i))
            .collect();
        let mean = u.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "uniform mean {mean}");
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let z: Vec<f32> = (0..n)
            .map(|i| sample(RandomDist::Normal, key, 0, i))
            .collect();
        let m = z.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        let v = z.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n as f64;
        assert!(
            m.abs() < 0.01 && (v - 1.0).abs() < 0.02,
            "normal mean {m} var {v}"
        );
        let t: Vec<f32> = (0..n)
            .map(|i| sample(RandomDist::TruncatedNormal, key, 0, i))
            .collect();
        assert!(t.iter().all(|x| x.abs() <= 2.0));
    }

    #[test]
    fn block_kernel_matches_sample() {
        let st = RandomState {
            dist: RandomDist::Uniform,
            seed: 99,
            dtype: DType::F32,
            calls: AtomicU64::new(0),
        };
        let shape = Value::from_vec(&[1], vec![10i32]).unwrap();
        let got = cpu(&st, &shape).unwrap().to_f64_vec();
        let key = [99, 0];
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g as f32, sample(RandomDist::Uniform, key, 0, i as u64));
        }
    }

    #[test]
    fn vector_blocks_match_scalar_philox() {
        // Odd lengths and offsets, partial blocks, and counters whose low word wraps.
        let key = [0x1234_5678, 0x9abc_def0];
        for call in [0u64, 3, 1 << 33] {
            for first in [0u64, 1, 5, (1 << 32) - 7] {
                for len in [0usize, 1, 3, 4, 63, 64, 65, 130, 1001] {
                    let mut out = vec![MaybeUninit::new(f32::NAN); len];
                    uniform_blocks(key, call, first, &mut out);
                    for (i, o) in out.iter().enumerate() {
                        // SAFETY: uniform_blocks wrote every element.
                        let got = unsafe { o.assume_init() };
                        let want = sample(RandomDist::Uniform, key, call, 4 * first + i as u64);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "call {call} first {first} len {len} i {i}"
                        );
                    }
                }
            }
        }
        // The parallel path: a draw of several tasks, with a partial block at the end.
        let st = RandomState {
            dist: RandomDist::Uniform,
            seed: 0xdead_beef_0042,
            dtype: DType::F32,
            calls: AtomicU64::new(0),
        };
        let n = 3 * UNIFORM_TASK + 7;
        let shape = Value::from_vec(&[1], vec![n as i32]).unwrap();
        for call in 0..2 {
            let got = cpu(&st, &shape).unwrap().to_f64_vec();
            for (i, g) in got.iter().enumerate() {
                assert_eq!(
                    *g as f32,
                    sample(RandomDist::Uniform, [0xbeef_0042, 0xdead], call, i as u64),
                    "call {call} i {i}"
                );
            }
        }
    }

    #[test]
    fn calls_differ_and_seeds_reproduce() {
        let a = sample(RandomDist::Uniform, [1, 2], 0, 5);
        assert_eq!(a, sample(RandomDist::Uniform, [1, 2], 0, 5));
        assert_ne!(a, sample(RandomDist::Uniform, [1, 2], 1, 5));
        assert_ne!(a, sample(RandomDist::Uniform, [3, 2], 0, 5));
    }
}
