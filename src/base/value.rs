//! Host values: a dtype-tagged, reference-counted, C-contiguous n-d array.
//! Cloning is cheap (Arc); kernels that own the only reference may write in place.

use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use half::f16;
use ndarray::{ArcArray, IxDyn, ShapeBuilder};

pub type Arr<T> = ArcArray<T, IxDyn>;

#[derive(Clone, Debug)]
pub enum Value {
    F16(Arr<f16>),
    F32(Arr<f32>),
    F64(Arr<f64>),
    I8(Arr<i8>),
    I16(Arr<i16>),
    I32(Arr<i32>),
    I64(Arr<i64>),
    U8(Arr<u8>),
    Bool(Arr<bool>),
}

/// A float buffer of `len` elements left unwritten, for kernels that write every element
/// before any is read (a forward convolution's result, a fused group's output).
#[allow(clippy::uninit_vec)] // the point of the function; see SAFETY below
pub fn uninit<T: num_traits::Float>(len: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: floats have no invalid bit patterns, and every caller writes each element
    // before any is read.
    unsafe { v.set_len(len) };
    v
}

/// Applies a generic expression to whichever array a `Value` holds.
#[macro_export]
macro_rules! with_value {
    ($v:expr, $a:ident => $e:expr) => {
        match $v {
            $crate::base::value::Value::F16($a) => $e,
            $crate::base::value::Value::F32($a) => $e,
            $crate::base::value::Value::F64($a) => $e,
            $crate::base::value::Value::I8($a) => $e,
            $crate::base::value::Value::I16($a) => $e,
            $crate::base::value::Value::I32($a) => $e,
            $crate::base::value::Value::I64($a) => $e,
            $crate::base::value::Value::U8($a) => $e,
            $crate::base::value::Value::Bool($a) => $e,
        }
    };
}

/// Like `with_value!` but rebuilds a `Value` of the same variant from the expression.
#[macro_export]
macro_rules! map_value {
    ($v:expr, $a:ident => $e:expr) => {
        match $v {
            $crate::base::value::Value::F16($a) => $crate::base::value::Value::F16($e),
            $crate::base::value::Value::F32($a) => $crate::base::value::Value::F32($e),
            $crate::base::value::Value::F64($a) => $crate::base::value::Value::F64($e),
            $crate::base::value::Value::I8($a) => $crate::base::value::Value::I8($e),
            $crate::base::value::Value::I16($a) => $crate::base::value::Value::I16($e),
            $crate::base::value::Value::I32($a) => $crate::base::value::Value::I32($e),
            $crate::base::value::Value::I64($a) => $crate::base::value::Value::I64($e),
            $crate::base::value::Value::U8($a) => $crate::base::value::Value::U8($e),
            $crate::base::value::Value::Bool($a) => $crate::base::value::Value::Bool($e),
        }
    };
}

/// Element types a `Value` can hold, with lossless-as-possible casts through f64/i64.
pub trait Elem: Copy + Send + Sync + 'static + std::fmt::Debug + PartialEq + Default {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
    fn wrap(a: Arr<Self>) -> Value;
    fn unwrap(v: &Value) -> Option<&Arr<Self>>;
}

macro_rules! impl_elem {
    ($t:ty, $var:ident, $dt:ident, $tof:expr, $fromf:expr, $toi:expr, $fromi:expr) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$dt;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                ($tof)(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                ($fromf)(v)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                ($toi)(self)
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                ($fromi)(v)
            }
            fn wrap(a: Arr<Self>) -> Value {
                Value::$var(a)
            }
            fn unwrap(v: &Value) -> Option<&Arr<Self>> {
                match v {
                    Value::$var(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}

impl_elem!(
    f16,
    F16,
    F16,
    |x: f16| x.to_f64(),
    f16::from_f64,
    |x: f16| x.to_f64() as i64,
    |v: i64| f16::from_f64(v as f64)
);
impl_elem!(
    f32,
    F32,
    F32,
    |x: f32| x as f64,
    |v: f64| v as f32,
    |x: f32| x as i64,
    |v: i64| v as f32
);
impl_elem!(
    f64,
    F64,
    F64,
    |x: f64| x,
    |v: f64| v,
    |x: f64| x as i64,
    |v: i64| v as f64
);
impl_elem!(
    i8,
    I8,
    I8,
    |x: i8| x as f64,
    |v: f64| v as i8,
    |x: i8| x as i64,
    |v: i64| v as i8
);
impl_elem!(
    i16,
    I16,
    I16,
    |x: i16| x as f64,
    |v: f64| v as i16,
    |x: i16| x as i64,
    |v: i64| v as i16
);
impl_elem!(
    i32,
    I32,
    I32,
    |x: i32| x as f64,
    |v: f64| v as i32,
    |x: i32| x as i64,
    |v: i64| v as i32
);
impl_elem!(
    i64,
    I64,
    I64,
    |x: i64| x as f64,
    |v: f64| v as i64,
    |x: i64| x,
    |v: i64| v
);
impl_elem!(
    u8,
    U8,
    U8,
    |x: u8| x as f64,
    |v: f64| v as u8,
    |x: u8| x as i64,
    |v: i64| v as u8
);
impl_elem!(
    bool,
    Bool,
    Bool,
    |x: bool| x as u8 as f64,
    |v: f64| v != 0.0,
    |x: bool| x as i64,
    |v: i64| v != 0
);

impl Value {
    pub fn dtype(&self) -> DType {
        match self {
            Value::F16(_) => DType::F16,
            Value::F32(_) => DType::F32,
            Value::F64(_) => DType::F64,
            Value::I8(_) => DType::I8,
            Value::I16(_) => DType::I16,
            Value::I32(_) => DType::I32,
            Value::I64(_) => DType::I64,
            Value::U8(_) => DType::U8,
            Value::Bool(_) => DType::Bool,
        }
    }

    pub fn shape(&self) -> &[usize] {
        with_value!(self, a => a.shape())
    }

    pub fn len(&self) -> usize {
        with_value!(self, a => a.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn nbytes(&self) -> usize {
        self.len() * self.dtype().size()
    }

    /// A value of `shape` filled with `v` converted to `dtype`.
    pub fn full(dtype: DType, shape: &[usize], v: f64) -> Value {
        fn mk<T: Elem>(shape: &[usize], v: f64) -> Value {
            T::wrap(Arr::from_elem(IxDyn(shape), T::from_f64(v)))
        }
        dispatch_dtype!(dtype, T => mk::<T>(shape, v))
    }

    pub fn scalar_f64(dtype: DType, v: f64) -> Value {
        Value::full(dtype, &[], v)
    }

    /// Builds a value from a flat vector in C order.
    pub fn from_vec<T: Elem>(shape: &[usize], data: Vec<T>) -> Result<Value> {
        let a = ndarray::Array::from_shape_vec(IxDyn(shape), data)
            .map_err(|e| Error::Value(format!("cannot build an array of shape {shape:?}: {e}")))?;
        Ok(T::wrap(a.into_shared()))
    }

    /// Converts to another dtype (float -> int truncates toward zero, as NumPy's astype).
    pub fn cast(&self, to: DType) -> Value {
        if self.dtype() == to {
            return self.clone();
        }
        match (self, to) {
            (Value::F32(a), DType::F16) => return Value::F16(f16_from_f32(a)),
            (Value::F16(a), DType::F32) => return Value::F32(f32_from_f16(a)),
            _ => {}
        }
        fn conv<S: Elem, T: Elem>(a: &Arr<S>) -> Value {
            let float_src = S::DTYPE.is_float();
            let out = if float_src || T::DTYPE.is_float() {
                a.map(|&x| T::from_f64(x.to_f64()))
            } else {
                a.map(|&x| T::from_i64(x.to_i64()))
            };
            T::wrap(out.into_shared())
        }
        with_value!(self, a => dispatch_dtype!(to, T => conv::<_, T>(a)))
    }

    /// Whether this is a small integer vector, as shape arguments are (rank at most 1, at
    /// most 8 elements): loop bodies are specialised per value of such feeds.
    pub fn is_shape_vector(&self) -> bool {
        self.dtype().is_int() && self.shape().len() <= 1 && self.len() <= 8
    }

    /// The row of a stack of small integer vectors (`[steps, <= 8]`) whose rows are all
    /// equal: a shape a loop body reads as a per-step input that is the same every step.
    pub fn equal_shape_rows(&self) -> Option<Vec<usize>> {
        let sh = self.shape();
        if !self.dtype().is_int() || sh.len() != 2 || sh[1] > 8 || sh[0] == 0 {
            return None;
        }
        let all = self.to_i64_vec();
        let first = &all[..sh[1]];
        all.chunks(sh[1])
            .all(|r| r == first)
            .then(|| first.iter().map(|&x| x as usize).collect())
    }

    /// All elements as f64, C order (tests and folding; not a hot path).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_value!(self, a => a.iter().map(|x| x.to_f64()).collect())
    }

    /// All elements as i64, C order (shape arguments).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        with_value!(self, a => a.iter().map(|x| x.to_i64()).collect())
    }

    /// A contiguous (C-order) copy if this value's layout is not already standard.
    pub fn standard(self) -> Value {
        map_value!(self, a => if a.is_standard_layout() { a } else { a.as_standard_layout().into_owned().into_shared() })
    }

    pub fn reshape(&self, shape: &[usize]) -> Result<Value> {
        let v = self.clone().standard();
        Ok(
            map_value!(v, a => a.into_shape_with_order(IxDyn(shape)).map_err(|e| Error::Value(format!("reshape: {e}")))?),
        )
    }
}

/// Elements per task of the parallel float16 conversions below.
const F16_GRAIN: usize = 1 << 16;

/// `a` converted element by element by `conv`, a whole-slice conversion run in parallel
/// chunks, where `a` is contiguous in some memory order (C, Fortran, any permutation): the
/// result keeps `a`'s layout. Other layouts convert one element at a time with `one`.
fn convert_contiguous<S: Copy + Sync, D: Copy + Send + Default>(
    a: &Arr<S>,
    conv: impl Fn(&[S], &mut [D]) + Sync,
    one: impl Fn(S) -> D,
) -> Arr<D> {
    use rayon::prelude::*;
    let strides: Option<Vec<usize>> = a
        .strides()
        .iter()
        .map(|&s| usize::try_from(s).ok())
        .collect();
    let (Some(src), Some(strides)) = (a.as_slice_memory_order(), strides) else {
        return a.map(|&x| one(x)).into_shared();
    };
    if src.is_empty() {
        return a.map(|&x| one(x)).into_shared();
    }
    let mut out = vec![D::default(); src.len()];
    out.par_chunks_mut(F16_GRAIN)
        .zip(src.par_chunks(F16_GRAIN))
        .for_each(|(o, x)| conv(x, o));
    let built = if a.is_standard_layout() {
        ndarray::Array::from_shape_vec(IxDyn(a.shape()), out)
    } else {
        ndarray::Array::from_shape_vec(IxDyn(a.shape()).strides(IxDyn(&strides)), out)
    };
    match built {
        Ok(arr) => arr.into_shared(),
        // A layout ndarray does not rebuild from its strides (an axis of length 1 may
        // carry any stride): element by element, in C order.
        Err(_) => a.map(|&x| one(x)).into_shared(),
    }
}

/// float32 -> float16, rounding to nearest even: `half`'s slice conversion, which uses the
/// CPU's conversion instructions (F16C on x86-64, FP16 on AArch64) where it has them, on
/// the pool's threads for large arrays.
pub fn f16_from_f32(a: &Arr<f32>) -> Arr<f16> {
    use half::slice::HalfFloatSliceExt;
    convert_contiguous(
        a,
        |x, o: &mut [f16]| o.convert_from_f32_slice(x),
        f16::from_f32,
    )
}

/// float16 -> float32 (exact), as [`f16_from_f32`].
pub fn f32_from_f16(a: &Arr<f16>) -> Arr<f32> {
    use half::slice::HalfFloatSliceExt;
    convert_contiguous(a, |x: &[f16], o| x.convert_to_f32_slice(o), f16::to_f32)
}

/// Binds a type alias `T` to the Rust element type of a `DType` and evaluates the body.
#[macro_export]
macro_rules! dispatch_dtype {
    ($dt:expr, $T:ident => $e:expr) => {
        match $dt {
            $crate::base::dtype::DType::F16 => {
                type $T = half::f16;
                $e
            }
            $crate::base::dtype::DType::F32 => {
                type $T = f32;
                $e
            }
            $crate::base::dtype::DType::F64 => {
                type $T = f64;
                $e
            }
            $crate::base::dtype::DType::I8 => {
                type $T = i8;
                $e
            }
            $crate::base::dtype::DType::I16 => {
                type $T = i16;
                $e
            }
            $crate::base::dtype::DType::I32 => {
                type $T = i32;
                $e
            }
            $crate::base::dtype::DType::I64 => {
                type $T = i64;
                $e
            }
            $crate::base::dtype::DType::U8 => {
                type $T = u8;
                $e
            }
            $crate::base::dtype::DType::Bool => {
                type $T = bool;
                $e
            }
        }
    };
}
pub(crate) use dispatch_dtype;

/// Memory the engine reads but does not own: the NumPy arrays a `K.function` call reads
/// in place instead of copying them in.
///
/// A borrowed value is an ordinary `Value` whose buffer is the caller's. That is sound as
/// long as nothing ever frees, grows or writes that buffer, which the `Borrowed` that made
/// it ensures: it holds a clone of every value it borrowed for the whole call, so no kernel
/// ever finds the buffer unshared (in-place updates, reuse by a fused group's output
/// and `into_owned` all copy a shared array instead), and when it ends it forgets the last
/// clone rather than dropping it. The one way a borrowed buffer could outlive the call is
/// to be assigned to a variable; `VarCell::set` copies any value `aliases` names. Should
/// a clone still be held elsewhere all the same when the borrow ends, the `Borrowed` leaks both
/// the clone and the array's owner (`counts` reports these; tests check there are none): the
/// buffer then stays valid and is never freed twice.
pub mod foreign {
    use super::{Elem, Value};
    use std::any::Any;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Address ranges of the buffers borrowed now, process-wide (one entry per borrow of a
    /// buffer; calls on several threads may borrow the same array).
    static RANGES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    /// Entries in `RANGES`, for a lock-free answer when there are none.
    static LIVE: AtomicUsize = AtomicUsize::new(0);
    /// Borrowed values still shared when their borrow ended (see the module comment).
    static LEAKED: AtomicUsize = AtomicUsize::new(0);
    /// Values borrowed so far (tests check that a feed was read in place).
    static LEASED: AtomicUsize = AtomicUsize::new(0);

    fn ranges() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
        RANGES.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The values one call reads in place, with the owners that keep their buffers alive.
    #[derive(Default)]
    pub struct Borrowed {
        held: Vec<Held>,
    }

    /// One borrowed value: a clone of it, its buffer's address range, its buffer's owner.
    struct Held(Value, (usize, usize), Box<dyn Any + Send>);

    impl Borrowed {
        /// A value of `shape` (C order) reading `data` in place.
        ///
        /// # Safety
        /// `data` must point to `shape.iter().product()` initialised, aligned elements
        /// that stay valid and that nothing writes until this `Borrowed` is dropped (`owner`
        /// keeps them alive; it is dropped with the `Borrowed`, or leaked with the buffer).
        pub unsafe fn borrow<T: Elem>(
            &mut self,
            data: *const T,
            shape: &[usize],
            owner: Box<dyn Any + Send>,
        ) -> Value {
            let len: usize = shape.iter().product();
            // SAFETY: the caller vouches for `len` valid elements at `data`. The `Vec`
            // claims an allocation it does not own, so it must never be dropped, grown or
            // written: the `Borrowed` holds a clone of the array until it ends (so every
            // kernel sees it shared and copies before writing or taking the buffer) and
            // then forgets the array instead of dropping it.
            let v = unsafe { Vec::from_raw_parts(data as *mut T, len, len) };
            let a = ndarray::Array::from_shape_vec(ndarray::IxDyn(shape), v)
                .expect("len is the shape's product");
            let value = T::wrap(a.into_shared());
            let range = (
                data as usize,
                data as usize + len * std::mem::size_of::<T>(),
            );
            ranges().push(range);
            LIVE.fetch_add(1, Ordering::AcqRel);
            LEASED.fetch_add(1, Ordering::Relaxed);
            self.held.push(Held(value.clone(), range, owner));
            value
        }
    }

    impl Drop for Borrowed {
        fn drop(&mut self) {
            let held = std::mem::take(&mut self.held);
            if held.is_empty() {
                return;
            }
            {
                let mut live = ranges();
                for Held(_, r, _) in &held {
                    if let Some(k) = live.iter().position(|x| x == r) {
                        live.swap_remove(k);
                        LIVE.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
            for Held(v, _, owner) in held {
                let alone = crate::with_value!(v, a => match a.try_into_owned_nocopy() {
                    Ok(own) => {
                        std::mem::forget(own);
                        true
                    }
                    Err(shared) => {
                        std::mem::forget(shared);
                        false
                    }
                });
                if alone {
                    drop(owner);
                } else {
                    LEAKED.fetch_add(1, Ordering::Relaxed);
                    std::mem::forget(owner);
                }
            }
        }
    }

    /// Whether `v`'s elements lie in a buffer some `Borrowed` holds now.
    pub fn aliases(v: &Value) -> bool {
        if LIVE.load(Ordering::Acquire) == 0 {
            return false;
        }
        let p = crate::with_value!(v, a => a.as_ptr() as usize);
        ranges().iter().any(|&(lo, hi)| (lo..=hi).contains(&p))
    }

    /// (values borrowed so far, those of them still shared when their borrow ended: 0 unless
    /// a path that keeps values past a call was missed).
    pub fn counts() -> (usize, usize) {
        (
            LEASED.load(Ordering::Relaxed),
            LEAKED.load(Ordering::Relaxed),
        )
    }
}
