//! Host values <-> device words. Every device dtype is 32-bit words, so buffers are
//! always 4-byte aligned: f32 as is, f16 widened to f32, i32 as is, the narrow integers
//! and bool widened to i32 (bool as 0/1), one word per element; int64 as two words per
//! element, low then high (the host's little-endian bytes, so both directions are plain
//! copies), which the generated kernels compute on exactly (`fusion`). f64 is never
//! uploaded (WGSL has no f64; its nodes run their CPU kernels).

use crate::base::dtype::DType;
use crate::base::value::Value;
use half::f16;

/// 32-bit words per element of dtype `d` on the device: two for int64, else one.
pub fn words_per(d: DType) -> usize {
    match d {
        DType::I64 => 2,
        DType::F32
        | DType::F16
        | DType::F64
        | DType::I32
        | DType::I16
        | DType::I8
        | DType::U8
        | DType::Bool => 1,
    }
}

/// The words of a host value, or `None` for f64, which the device does not store.
pub fn to_words(v: &Value) -> Option<Vec<u32>> {
    fn go<T: Copy>(a: &ndarray::ArcArray<T, ndarray::IxDyn>, f: impl Fn(T) -> u32) -> Vec<u32> {
        match a.as_slice() {
            Some(s) => s.iter().map(|&x| f(x)).collect(),
            None => a.iter().map(|&x| f(x)).collect(),
        }
    }
    Some(match v {
        Value::F32(a) => match a.as_slice() {
            Some(s) => bytemuck::cast_slice::<f32, u32>(s).to_vec(),
            None => go(a, f32::to_bits),
        },
        Value::F16(a) => go(a, |x: f16| x.to_f32().to_bits()),
        Value::I32(a) => go(a, |x: i32| x as u32),
        Value::I16(a) => go(a, |x: i16| x as i32 as u32),
        Value::I8(a) => go(a, |x: i8| x as i32 as u32),
        Value::U8(a) => go(a, |x: u8| x as u32),
        Value::Bool(a) => go(a, |x: bool| x as u32),
        Value::I64(a) => a
            .iter()
            .flat_map(|&x| [x as u32, (x >> 32) as u32])
            .collect(),
        Value::F64(_) => return None,
    })
}

/// A host value of `dtype` and `shape` from device words.
pub fn from_words(dtype: DType, shape: &[usize], w: &[u32]) -> Value {
    let n: usize = shape.iter().product();
    let w = &w[..n * words_per(dtype)];
    fn mk<T: crate::base::value::Elem>(shape: &[usize], v: Vec<T>) -> Value {
        Value::from_vec(shape, v).expect("word count matches the shape")
    }
    match dtype {
        DType::F32 => mk(shape, bytemuck::cast_slice::<u32, f32>(w).to_vec()),
        DType::F16 => mk(
            shape,
            w.iter()
                .map(|&x| f16::from_f32(f32::from_bits(x)))
                .collect::<Vec<_>>(),
        ),
        DType::I32 => mk(shape, w.iter().map(|&x| x as i32).collect::<Vec<_>>()),
        DType::I16 => mk(
            shape,
            w.iter().map(|&x| x as i32 as i16).collect::<Vec<_>>(),
        ),
        DType::I8 => mk(shape, w.iter().map(|&x| x as i32 as i8).collect::<Vec<_>>()),
        DType::U8 => mk(shape, w.iter().map(|&x| x as u8).collect::<Vec<_>>()),
        DType::Bool => mk(shape, w.iter().map(|&x| x != 0).collect::<Vec<_>>()),
        DType::I64 => mk(
            shape,
            w.chunks_exact(2)
                .map(|p| (p[0] as u64 | (p[1] as u64) << 32) as i64)
                .collect::<Vec<_>>(),
        ),
        DType::F64 => mk(
            shape,
            bytemuck::cast_slice::<u32, f32>(w)
                .iter()
                .map(|&x| x as f64)
                .collect::<Vec<_>>(),
        ),
    }
}

/// The word a scalar `v` (e.g. a pad value) has as dtype `d` on the device.
pub fn scalar_word(d: DType, v: f64) -> u32 {
    let one = Value::scalar_f64(d, v);
    to_words(&one).map(|w| w[0]).unwrap_or(0)
}
