//! Elementwise primitives: unary math, broadcasting binary math and comparisons, select and
//! cast. Each op is one line of a table giving its name, its kernel expression per element
//! class, and (below) its VJP. f16 computes in f32, integers in i64, both stored back.

use super::build::*;
use super::vmath;
use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::{broadcast_runtime, broadcast_static, Shape};
use crate::base::value::{Arr, Elem, Value};
use crate::ops::graph::Tensor;
use crate::ops::source;
use half::f16;
use ndarray::{IxDyn, Zip};
use num_traits::Float;
use rayon::prelude::*;
use std::mem::MaybeUninit;

// ---- tables and helpers ----

/// Elements per rayon task; below twice this, kernels run on the calling thread.
pub const GRAIN: usize = 1 << 15;

macro_rules! int_or_zero {
    () => {
        |_: i64| 0i64
    };
    ($f:expr) => {
        $f
    };
}

macro_rules! unary_table {
    ($( $V:ident $name:literal float |$x:ident| $f:expr $(, int |$ix:ident| $ie:expr)? ; wgsl $wf:literal $(, $wi:literal)? ; )*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum UnaryOp { $($V),* }

        impl UnaryOp {
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$V),*];
            pub fn name(self) -> &'static str { match self { $(UnaryOp::$V => $name),* } }
            pub fn from_name(s: &str) -> Option<UnaryOp> { match s { $($name => Some(UnaryOp::$V),)* _ => None } }
            /// Whether the op has an integer kernel.
            pub fn takes_int(self) -> bool { match self { $(UnaryOp::$V => false $(|| { let _ = stringify!($ix); true })?),* } }
            /// The WGSL expression of the op in `x` (an `f32` when `float`, else an `i32`),
            /// from which fused GPU kernels are generated; helpers are in `shaders/elementwise.wgsl`.
            pub fn wgsl(self, float: bool) -> Option<&'static str> {
                match self { $(UnaryOp::$V => if float { Some($wf) } else { None $(.or(Some($wi)))? }),* }
            }
            /// `out[i] = op(a[i])`; `#[inline(always)]` so that it is compiled inside the
            /// instruction-set variants of its callers (`unary_f32`, the CPU fusion kernel).
            #[inline(always)]
            pub fn map<F: KMath>(self, a: &[F], out: &mut [MaybeUninit<F>]) {
                match self { $(UnaryOp::$V => { for (o, &$x) in out.iter_mut().zip(a) { o.write($f); } })* }
            }
            /// Ops without an integer kernel are rejected by `infer_unary`; they write zeros.
            fn int_kernel(self, a: &[i64], out: &mut [MaybeUninit<i64>]) {
                match self {
                    $(UnaryOp::$V => { par_map(a, out, int_or_zero!($(|$ix: i64| $ie)?)); })*
                }
            }
        }
    };
}

fn half<F: Float>() -> F {
    F::from(0.5).unwrap()
}

unary_table! {
    Neg     "neg"        float |x| -x,                       int |x| x.wrapping_neg(); wgsl "-x", "-x";
    Abs     "abs"        float |x| x.abs(),                  int |x| x.wrapping_abs(); wgsl "abs(x)", "abs(x)";
    Sign    "sign"       float |x| if x > F::zero() { F::one() } else if x < F::zero() { -F::one() } else { x }, int |x| x.signum(); wgsl "select(select(x, -1.0, x < 0.0), 1.0, x > 0.0)", "sign(x)";
    Square  "square"     float |x| x * x,                    int |x| x.wrapping_mul(x); wgsl "x * x", "x * x";
    Sqrt    "sqrt"       float |x| x.sqrt(); wgsl "sqrt(x)";
    Rsqrt   "rsqrt"      float |x| x.sqrt().recip(); wgsl "1.0 / sqrt(x)";
    Exp     "exp"        float |x| x.k_exp(); wgsl "exp(x)";
    Expm1   "expm1"      float |x| x.k_expm1(); wgsl "fk_expm1(x)";
    Log     "log"        float |x| x.k_ln(); wgsl "log(x)";
    Log1p   "log1p"      float |x| x.k_ln_1p(); wgsl "fk_log1p(x)";
    Sin     "sin"        float |x| x.sin(); wgsl "sin(x)";
    Cos     "cos"        float |x| x.cos(); wgsl "cos(x)";
    Tan     "tan"        float |x| x.tan(); wgsl "tan(x)";
    Tanh    "tanh"       float |x| x.k_tanh(); wgsl "fk_tanh(x)";
    Sigmoid "sigmoid"    float |x| x.k_sigmoid(); wgsl "fk_sigmoid(x)";
    Relu    "relu"       float |x| if x < F::zero() { F::zero() } else { x }, int |x| x.max(0); wgsl "select(x, 0.0, x < 0.0)", "max(x, 0)";
    Round   "round"      float |x| { let r = x.round(); if (x - x.trunc()).abs() == half() { (x * half()).round() * (F::one() + F::one()) } else { r } }, int |x| x; wgsl "round(x)", "x";
    Floor   "floor"      float |x| x.floor(),                int |x| x; wgsl "floor(x)", "x";
    Ceil    "ceil"       float |x| x.ceil(),                 int |x| x; wgsl "ceil(x)", "x";
    Recip   "reciprocal" float |x| x.recip(); wgsl "1.0 / x";
    Softplus "softplus"  float |x| x.k_softplus(); wgsl "max(x, 0.0) + fk_log1p(exp(-abs(x)))";
    Elu     "elu"        float |x| if x >= F::zero() { x } else { x.k_expm1() }; wgsl "select(fk_expm1(x), x, x >= 0.0 || fk_isnan(x))";
    Not     "logical_not" float |x| x,                       int |x| (x == 0) as i64; wgsl "x", "select(0, 1, x == 0)";
}

macro_rules! binary_table {
    ($( $V:ident $name:literal $class:ident float |$a:ident, $b:ident| $f:expr, int |$ia:ident, $ib:ident| $ie:expr ; wgsl $wf:literal, $wi:literal ; )*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum BinaryOp { $($V),* }

        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum BinaryClass { Arith, Compare, Logical }

        impl BinaryOp {
            pub const ALL: &'static [BinaryOp] = &[$(BinaryOp::$V),*];
            pub fn name(self) -> &'static str { match self { $(BinaryOp::$V => $name),* } }
            pub fn from_name(s: &str) -> Option<BinaryOp> { match s { $($name => Some(BinaryOp::$V),)* _ => None } }
            pub fn class(self) -> BinaryClass { match self { $(BinaryOp::$V => BinaryClass::$class),* } }
            /// The WGSL expression in `a`, `b` (`f32` when `float`, else `i32`); predicates
            /// give an `i32` 0/1. Fused GPU kernels are generated from these.
            pub fn wgsl(self, float: bool) -> &'static str { match self { $(BinaryOp::$V => if float { $wf } else { $wi }),* } }
            /// `out[i] = op(a[i], b[i])` over slices or splatted scalars; predicates give 1 or 0.
            /// `#[inline(always)]` for the same reason as `UnaryOp::map`.
            #[inline(always)]
            pub fn zip<F: KMath, A: Lane<F>, B: Lane<F>>(self, a: A, b: B, out: &mut [MaybeUninit<F>])
            where
                bool: Ret<F>,
            {
                let n = out.len();
                let (a, b) = (a.fit(n), b.fit(n));
                match self { $(BinaryOp::$V => {
                    let f = |$a: F, $b: F| $f;
                    for (i, o) in out.iter_mut().enumerate() {
                        // SAFETY: i < n, the length both operands were fitted to.
                        o.write(f(unsafe { a.at(i) }, unsafe { b.at(i) }).ret());
                    }
                })* }
            }
            fn float_kernel<F>(self, a: &Arr<F>, b: &Arr<F>) -> Result<Value> where F: KMath + Send + Sync + Elem + PredOrSame<F> {
                match self { $(BinaryOp::$V => {
                    let f = |$a: F, $b: F| $f;
                    float_out::<F, _>(self, a, b, f)
                })* }
            }
            fn int_kernel(self, a: &Arr<i64>, b: &Arr<i64>) -> Result<Value> {
                match self { $(BinaryOp::$V => {
                    let f = |$ia: i64, $ib: i64| $ie;
                    int_out(self, a, b, f)
                })* }
            }
        }
    };
}

binary_table! {
    Add      "add"           Arith   float |a, b| a + b,                     int |a, b| a.wrapping_add(b); wgsl "a + b", "a + b";
    Sub      "subtract"      Arith   float |a, b| a - b,                     int |a, b| a.wrapping_sub(b); wgsl "a - b", "a - b";
    Mul      "multiply"      Arith   float |a, b| a * b,                     int |a, b| a.wrapping_mul(b); wgsl "a * b", "a * b";
    Div      "divide"        Arith   float |a, b| a / b,                     int |a, b| floor_div(a, b); wgsl "a / b", "fk_floor_div(a, b)";
    FloorDiv "floor_divide"  Arith   float |a, b| (a / b).floor(),           int |a, b| floor_div(a, b); wgsl "floor(a / b)", "fk_floor_div(a, b)";
    Mod      "mod"           Arith   float |a, b| { let r = a % b; if r != F::zero() && ((r < F::zero()) != (b < F::zero())) { r + b } else { r } }, int |a, b| floor_mod(a, b); wgsl "fk_fmod(a, b)", "fk_floor_mod(a, b)";
    Pow      "pow"           Arith   float |a, b| a.powf(b),                 int |a, b| int_pow(a, b); wgsl "fk_pow(a, b)", "fk_ipow(a, b)";
    Maximum  "maximum"       Arith   float |a, b| if a >= b || a.is_nan() { a } else { b }, int |a, b| a.max(b); wgsl "select(b, a, a >= b || fk_isnan(a))", "max(a, b)";
    Minimum  "minimum"       Arith   float |a, b| if a <= b || a.is_nan() { a } else { b }, int |a, b| a.min(b); wgsl "select(b, a, a <= b || fk_isnan(a))", "min(a, b)";
    Equal    "equal"         Compare float |a, b| a == b,                    int |a, b| a == b; wgsl "i32(a == b)", "i32(a == b)";
    NotEqual "not_equal"     Compare float |a, b| a != b,                    int |a, b| a != b; wgsl "i32(!(a == b))", "i32(a != b)";
    Less     "less"          Compare float |a, b| a < b,                     int |a, b| a < b; wgsl "i32(a < b)", "i32(a < b)";
    LessEqual "less_equal"   Compare float |a, b| a <= b,                    int |a, b| a <= b; wgsl "i32(a <= b)", "i32(a <= b)";
    Greater  "greater"       Compare float |a, b| a > b,                     int |a, b| a > b; wgsl "i32(a > b)", "i32(a > b)";
    GreaterEqual "greater_equal" Compare float |a, b| a >= b,                int |a, b| a >= b; wgsl "i32(a >= b)", "i32(a >= b)";
    And      "logical_and"   Logical float |a, b| a != F::zero() && b != F::zero(), int |a, b| a != 0 && b != 0; wgsl "i32(!(a == 0.0) && !(b == 0.0))", "i32(a != 0 && b != 0)";
    Or       "logical_or"    Logical float |a, b| a != F::zero() || b != F::zero(), int |a, b| a != 0 || b != 0; wgsl "i32(!(a == 0.0) || !(b == 0.0))", "i32(a != 0 || b != 0)";
}

impl BinaryOp {
    /// What the op makes of a zero operand (`Op::zeros`).
    pub fn zeros(self) -> super::Zeros {
        use super::Zeros;
        match self {
            BinaryOp::Add | BinaryOp::Sub => Zeros::Additive,
            BinaryOp::Mul => Zeros::Any,
            BinaryOp::Div => Zeros::First,
            BinaryOp::FloorDiv
            | BinaryOp::Mod
            | BinaryOp::Pow
            | BinaryOp::Maximum
            | BinaryOp::Minimum
            | BinaryOp::Equal
            | BinaryOp::NotEqual
            | BinaryOp::Less
            | BinaryOp::LessEqual
            | BinaryOp::Greater
            | BinaryOp::GreaterEqual
            | BinaryOp::And
            | BinaryOp::Or => Zeros::Unknown,
        }
    }
}

impl UnaryOp {
    /// Rough cost of one f32 element, in adds (sets the parallel grain).
    pub fn cost(self) -> usize {
        match self {
            UnaryOp::Exp | UnaryOp::Expm1 | UnaryOp::Elu | UnaryOp::Log | UnaryOp::Log1p => 8,
            UnaryOp::Tanh | UnaryOp::Sigmoid => 12,
            UnaryOp::Softplus => 20,
            UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Tan => 32,
            UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => 3,
            UnaryOp::Round => 2,
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sign
            | UnaryOp::Square
            | UnaryOp::Relu
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Not => 1,
        }
    }
}

impl BinaryOp {
    /// Rough cost of one f32 element, in adds (sets the parallel grain).
    pub fn cost(self) -> usize {
        match self {
            BinaryOp::Pow => 40,
            BinaryOp::Div | BinaryOp::FloorDiv | BinaryOp::Mod => 3,
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Maximum
            | BinaryOp::Minimum
            | BinaryOp::Equal
            | BinaryOp::NotEqual
            | BinaryOp::Less
            | BinaryOp::LessEqual
            | BinaryOp::Greater
            | BinaryOp::GreaterEqual
            | BinaryOp::And
            | BinaryOp::Or => 1,
        }
    }
}

fn floor_div(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if a.wrapping_rem(b) != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

fn floor_mod(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let r = a.wrapping_rem(b);
    if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    }
}

fn int_pow(a: i64, b: i64) -> i64 {
    if b < 0 {
        return match a {
            1 => 1,
            -1 => {
                if b % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    a.wrapping_pow(b.min(u32::MAX as i64) as u32)
}

/// A `Vec` of `n` elements written by `fill`, without zeroing it first (the zeroing was a
/// tenth of an MLP training step). `fill` must write every element.
fn build_vec<U>(n: usize, fill: impl FnOnce(&mut [MaybeUninit<U>])) -> Vec<U> {
    let mut v = Vec::with_capacity(n);
    fill(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: every caller's `fill` writes each of the `n` slots exactly once.
    unsafe { v.set_len(n) };
    v
}

/// Float math with a vectorisable f32 form (`vmath`); f64 uses libm.
pub trait KMath: Float + Send + Sync + 'static + Ret<Self> {
    fn k_exp(self) -> Self;
    fn k_expm1(self) -> Self;
    fn k_ln(self) -> Self;
    fn k_ln_1p(self) -> Self;
    fn k_tanh(self) -> Self;
    fn k_sigmoid(self) -> Self;
    fn k_softplus(self) -> Self;
    /// Runs `op` over `a` into `out` (the f32 form with the best instruction set).
    fn unary_slice(op: UnaryOp, a: &[Self], out: &mut [MaybeUninit<Self>]);
}

impl KMath for f32 {
    #[inline(always)]
    fn k_exp(self) -> f32 {
        vmath::exp(self)
    }
    #[inline(always)]
    fn k_expm1(self) -> f32 {
        vmath::expm1(self)
    }
    #[inline(always)]
    fn k_ln(self) -> f32 {
        vmath::log(self)
    }
    #[inline(always)]
    fn k_ln_1p(self) -> f32 {
        vmath::log1p(self)
    }
    #[inline(always)]
    fn k_tanh(self) -> f32 {
        vmath::tanh(self)
    }
    #[inline(always)]
    fn k_sigmoid(self) -> f32 {
        vmath::sigmoid(self)
    }
    #[inline(always)]
    fn k_softplus(self) -> f32 {
        vmath::softplus(self)
    }
    fn unary_slice(op: UnaryOp, a: &[f32], out: &mut [MaybeUninit<f32>]) {
        unary_f32(op, a, out)
    }
}

impl KMath for f64 {
    fn k_exp(self) -> f64 {
        self.exp()
    }
    fn k_expm1(self) -> f64 {
        self.exp_m1()
    }
    fn k_ln(self) -> f64 {
        self.ln()
    }
    fn k_ln_1p(self) -> f64 {
        self.ln_1p()
    }
    fn k_tanh(self) -> f64 {
        self.tanh()
    }
    fn k_sigmoid(self) -> f64 {
        if self >= 0.0 {
            1.0 / (1.0 + (-self).exp())
        } else {
            let e = self.exp();
            e / (1.0 + e)
        }
    }
    fn k_softplus(self) -> f64 {
        self.max(0.0) + (-self.abs()).exp().ln_1p()
    }
    fn unary_slice(op: UnaryOp, a: &[f64], out: &mut [MaybeUninit<f64>]) {
        op.map(a, out)
    }
}

#[inline(always)]
fn unary_f32_body(op: UnaryOp, a: &[f32], out: &mut [MaybeUninit<f32>]) {
    op.map(a, out)
}

crate::multiversion!(fn unary_f32(op: UnaryOp, a: &[f32], out: &mut [MaybeUninit<f32>]) => unary_f32_body);

/// An operand of `BinaryOp::zip`: a slice, or one value standing for every element.
pub trait Lane<F>: Copy {
    /// Restricts a slice to its first `n` elements (panics when it is shorter).
    fn fit(self, n: usize) -> Self;
    /// Element `i`, unchecked: inside the big instruction-set variants of the fusion kernel
    /// the compiler did not always prove a checked index in range, and a loop with a check
    /// left in stays scalar (a multiply by a scalar ran 16x slower).
    ///
    /// # Safety
    /// `i` is below the `n` of the `fit` that returned `self`.
    unsafe fn at(&self, i: usize) -> F;
}

impl<F: Copy> Lane<F> for &[F] {
    #[inline(always)]
    fn fit(self, n: usize) -> Self {
        &self[..n]
    }
    #[inline(always)]
    unsafe fn at(&self, i: usize) -> F {
        // SAFETY: `i < n` and `fit(n)` checked that the slice holds `n` elements.
        unsafe { *self.get_unchecked(i) }
    }
}

/// A scalar operand.
#[derive(Clone, Copy)]
pub struct Splat<F>(pub F);

impl<F: Copy> Lane<F> for Splat<F> {
    #[inline(always)]
    fn fit(self, _: usize) -> Self {
        self
    }
    #[inline(always)]
    unsafe fn at(&self, _: usize) -> F {
        self.0
    }
}

/// A kernel result as the compute type: predicates become 1 or 0.
pub trait Ret<F> {
    fn ret(self) -> F;
}

impl Ret<f32> for f32 {
    #[inline(always)]
    fn ret(self) -> f32 {
        self
    }
}

impl Ret<f64> for f64 {
    #[inline(always)]
    fn ret(self) -> f64 {
        self
    }
}

impl Ret<f32> for bool {
    #[inline(always)]
    fn ret(self) -> f32 {
        self as u8 as f32
    }
}

impl Ret<f64> for bool {
    #[inline(always)]
    fn ret(self) -> f64 {
        self as u8 as f64
    }
}

/// Work (in adds) below which handing a task to another thread costs more than it saves:
/// waking a sleeping rayon worker takes 10-20 us on a 2-vCPU VM, so tasks are ~20 us of
/// work (at 1 << 16 a lone 64x512 `sqrt` was split in two and ran in 42 us instead of
/// 16). Kernels in a loop or a short run split smaller work with the polling helper
/// instead (`base::team`).
pub const PAR_WORK: usize = 1 << 18;

/// Elements per parallel task for a kernel costing `cost` adds per element.
pub fn grain(cost: usize) -> usize {
    (PAR_WORK / cost.max(1)).max(1024)
}

fn par_map<T: Copy + Send + Sync, U: Send>(
    a: &[T],
    out: &mut [MaybeUninit<U>],
    f: impl Fn(T) -> U + Sync + Send,
) {
    if a.len() < 2 * GRAIN {
        for (o, &v) in out.iter_mut().zip(a) {
            o.write(f(v));
        }
    } else {
        out.par_chunks_mut(GRAIN)
            .zip(a.par_chunks(GRAIN))
            .for_each(|(o, a)| {
                for (o, &v) in o.iter_mut().zip(a) {
                    o.write(f(v));
                }
            });
    }
}

/// Applies `f` with NumPy broadcasting. Fast paths: equal shapes, a scalar side, and one
/// shape being a suffix of the other (bias adds); the general case uses ndarray's Zip.
pub fn broadcast_zip<T, U>(
    name: &str,
    a: &Arr<T>,
    b: &Arr<T>,
    f: impl Fn(T, T) -> U + Sync + Send,
) -> Result<Arr<U>>
where
    T: Copy + Send + Sync,
    U: Copy + Send + Sync + Default,
{
    let (sa, sb) = (a.shape(), b.shape());
    let shape = broadcast_runtime(name, sa, sb)?;
    let n: usize = shape.iter().product();
    let (da, db) = (
        a.as_slice().expect("standard layout"),
        b.as_slice().expect("standard layout"),
    );
    let general = !(sa == sb
        || db.len() == 1
        || da.len() == 1
        || (n > 0 && sa.len() >= sb.len() && sa.ends_with(sb) && da.len() == n)
        || (n > 0 && sb.len() >= sa.len() && sb.ends_with(sa) && db.len() == n));
    if general {
        let av = a.broadcast(IxDyn(&shape)).expect("checked broadcast");
        let bv = b.broadcast(IxDyn(&shape)).expect("checked broadcast");
        return Ok(Zip::from(&av)
            .and(&bv)
            .map_collect(|&x, &y| f(x, y))
            .into_shared());
    }
    let chunk = |o: &mut [MaybeUninit<U>], a: &[T], b: &[T]| {
        for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
            o.write(f(x, y));
        }
    };
    let out = build_vec(n, |out| {
        if sa == sb {
            if n < 2 * GRAIN {
                chunk(out, da, db);
            } else {
                out.par_chunks_mut(GRAIN)
                    .zip(da.par_chunks(GRAIN).zip(db.par_chunks(GRAIN)))
                    .for_each(|(o, (a, b))| chunk(o, a, b));
            }
        } else if db.len() == 1 {
            let y = db[0];
            par_map(da, out, |x| f(x, y));
        } else if da.len() == 1 {
            let x = da[0];
            par_map(db, out, |y| f(x, y));
        } else if n > 0 && sa.len() >= sb.len() && sa.ends_with(sb) && da.len() == n {
            let m = db.len();
            let rows = (GRAIN / m).max(1) * m;
            out.par_chunks_mut(rows)
                .zip(da.par_chunks(rows))
                .for_each(|(o, a)| {
                    for (o, a) in o.chunks_mut(m).zip(a.chunks(m)) {
                        chunk(o, a, db);
                    }
                });
        } else {
            let m = da.len();
            let rows = (GRAIN / m).max(1) * m;
            out.par_chunks_mut(rows)
                .zip(db.par_chunks(rows))
                .for_each(|(o, b)| {
                    for (o, b) in o.chunks_mut(m).zip(b.chunks(m)) {
                        chunk(o, da, b);
                    }
                });
        }
    });
    Ok(Arr::from_shape_vec(IxDyn(&shape), out).expect("shape matches"))
}

fn float_out<F: Float + Elem + Send + Sync, G>(
    op: BinaryOp,
    a: &Arr<F>,
    b: &Arr<F>,
    f: impl Fn(F, F) -> G + Sync + Send,
) -> Result<Value>
where
    G: PredOrSame<F>,
{
    G::finish(broadcast_zip(op.name(), a, b, f)?)
}

fn int_out<G: PredOrSame<i64>>(
    op: BinaryOp,
    a: &Arr<i64>,
    b: &Arr<i64>,
    f: impl Fn(i64, i64) -> G + Sync + Send,
) -> Result<Value> {
    G::finish(broadcast_zip(op.name(), a, b, f)?)
}

/// A binary kernel returns either the element type (arithmetic) or `bool` (predicates).
pub trait PredOrSame<T>: Copy + Send + Sync + Default + 'static {
    fn finish(a: Arr<Self>) -> Result<Value>;
}

impl PredOrSame<f32> for f32 {
    fn finish(a: Arr<f32>) -> Result<Value> {
        Ok(Value::F32(a))
    }
}

impl PredOrSame<f64> for f64 {
    fn finish(a: Arr<f64>) -> Result<Value> {
        Ok(Value::F64(a))
    }
}

impl PredOrSame<i64> for i64 {
    fn finish(a: Arr<i64>) -> Result<Value> {
        Ok(Value::I64(a))
    }
}

impl<T> PredOrSame<T> for bool {
    fn finish(a: Arr<bool>) -> Result<Value> {
        Ok(Value::Bool(a))
    }
}

fn unary_float<F: KMath + Elem + Default>(op: UnaryOp, a: &Arr<F>) -> Arr<F> {
    let x = a.as_slice().expect("standard layout");
    let g = grain(op.cost());
    let out = build_vec(a.len(), |out| {
        if x.len() < 2 * g {
            F::unary_slice(op, x, out)
        } else {
            out.par_chunks_mut(g)
                .zip(x.par_chunks(g))
                .for_each(|(o, x)| F::unary_slice(op, x, o))
        }
    });
    Arr::from_shape_vec(IxDyn(a.shape()), out).expect("shape matches")
}

/// Widened compute copies: f16 -> f32 and every integer or bool type -> i64.
fn widen_f32(a: &Arr<f16>) -> Arr<f32> {
    crate::base::value::f32_from_f16(a)
}

fn widen_i64(v: &Value) -> Arr<i64> {
    match v.cast(DType::I64) {
        Value::I64(a) => a,
        _ => unreachable!("cast to int64 yields int64"),
    }
}

// ---- unary ----

pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    Tensor::new(Op::Unary(op), vec![x.clone()])
}

pub fn neg(a: &Tensor) -> Result<Tensor> {
    unary(UnaryOp::Neg, a)
}

pub fn infer_unary(op: UnaryOp, x: &Tensor) -> Result<(Shape, DType)> {
    let d = x.dtype();
    let ok = match op {
        UnaryOp::Not => d == DType::Bool,
        _ if d == DType::Bool => false,
        _ => d.is_float() || op.takes_int(),
    };
    if !ok {
        return Err(Error::Type(format!("{}: unsupported dtype {d}", op.name())));
    }
    Ok((x.shape().clone(), d))
}

pub fn vjp_unary(op: UnaryOp, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let x = node.input(0);
    let y = node;
    let c = |v: f64| scalar_like(x, v);
    let gx = match op {
        UnaryOp::Neg => neg(g)?,
        UnaryOp::Abs => mul(g, &unary(UnaryOp::Sign, x)?)?,
        UnaryOp::Sign => zeros_like(x)?,
        UnaryOp::Square => mul(g, &mul(x, &c(2.0))?)?,
        UnaryOp::Sqrt => div(g, &mul(y, &c(2.0))?)?,
        UnaryOp::Rsqrt => mul(g, &mul(&mul(y, &mul(y, y)?)?, &c(-0.5))?)?,
        UnaryOp::Exp => mul(g, y)?,
        UnaryOp::Expm1 => mul(g, &add(y, &c(1.0))?)?,
        UnaryOp::Log => div(g, x)?,
        UnaryOp::Log1p => div(g, &add(x, &c(1.0))?)?,
        UnaryOp::Sin => mul(g, &unary(UnaryOp::Cos, x)?)?,
        UnaryOp::Cos => neg(&mul(g, &unary(UnaryOp::Sin, x)?)?)?,
        UnaryOp::Tan => mul(g, &add(&c(1.0), &mul(y, y)?)?)?,
        UnaryOp::Tanh => mul(g, &sub(&c(1.0), &mul(y, y)?)?)?,
        UnaryOp::Sigmoid => mul(g, &mul(y, &sub(&c(1.0), y)?)?)?,
        // From the output, as TF's ReluGrad: `y > 0` exactly where `x > 0`, and the input
        // need not outlive the forward (a bias add before the relu writes no buffer).
        UnaryOp::Relu => select(&binary(BinaryOp::Greater, y, &c(0.0))?, g, &c(0.0))?,
        UnaryOp::Recip => neg(&mul(g, &mul(y, y)?)?)?,
        UnaryOp::Softplus => mul(g, &unary(UnaryOp::Sigmoid, x)?)?,
        // From the output, as TF's EluGrad: `exp(x) == y + 1` where `y < 0`, `g` elsewhere
        // (NaN included), so the input need not outlive the forward.
        UnaryOp::Elu => select(
            &binary(BinaryOp::Less, y, &c(0.0))?,
            &mul(g, &add(y, &c(1.0))?)?,
            g,
        )?,
        UnaryOp::Round | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Not => return Ok(vec![None]),
    };
    Ok(vec![Some(gx)])
}

pub fn cpu_unary(op: UnaryOp, x: &Value) -> Result<Value> {
    Ok(match x {
        Value::F32(a) => Value::F32(unary_float(op, a)),
        Value::F64(a) => Value::F64(unary_float(op, a)),
        Value::F16(a) => Value::F32(unary_float(op, &widen_f32(a))).cast(DType::F16),
        _ => {
            let a = widen_i64(x);
            let out = build_vec(a.len(), |out| {
                op.int_kernel(a.as_slice().expect("standard layout"), out)
            });
            Value::I64(Arr::from_shape_vec(IxDyn(a.shape()), out).expect("shape matches"))
                .cast(x.dtype())
        }
    })
}

// ---- binary ----

pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Tensor::new(Op::Binary(op), vec![a.clone(), b.clone()])
}

pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(BinaryOp::Add, a, b)
}

pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(BinaryOp::Sub, a, b)
}

pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(BinaryOp::Mul, a, b)
}

pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(BinaryOp::Div, a, b)
}

pub fn infer_binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<(Shape, DType)> {
    if a.dtype() != b.dtype() {
        return Err(Error::Type(format!(
            "{}: operands have different dtypes {} and {} (cast one of them first)",
            op.name(),
            a.dtype(),
            b.dtype()
        )));
    }
    let shape = broadcast_static(op.name(), a.shape(), b.shape())?;
    let d = a.dtype();
    let dtype = match op.class() {
        BinaryClass::Arith if d == DType::Bool => {
            return Err(Error::Type(format!(
                "{}: arithmetic on bool tensors is not supported",
                op.name()
            )))
        }
        BinaryClass::Arith => d,
        BinaryClass::Compare => DType::Bool,
        BinaryClass::Logical if d != DType::Bool => {
            return Err(Error::Type(format!(
                "{}: operands must be bool, got {d}",
                op.name()
            )))
        }
        BinaryClass::Logical => DType::Bool,
    };
    Ok((shape, dtype))
}

pub fn vjp_binary(op: BinaryOp, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let (a, b) = (node.input(0), node.input(1));
    let (ga, gb) = match op {
        BinaryOp::Add => (g.clone(), g.clone()),
        BinaryOp::Sub => (g.clone(), neg(g)?),
        BinaryOp::Mul => (mul(g, b)?, mul(g, a)?),
        BinaryOp::Div => (div(g, b)?, neg(&div(&mul(g, node)?, b)?)?),
        BinaryOp::Pow => {
            let one = scalar_like(a, 1.0);
            let ga = mul(g, &mul(b, &binary(BinaryOp::Pow, a, &sub(b, &one)?)?)?)?;
            // a^0 is constant: its gradient is 0, also at a = 0 (where b * a^(b-1) is 0 * inf).
            let nonzero =
                matches!(b.op(), Op::Constant(v) if v.to_f64_vec().iter().all(|&e| e != 0.0));
            let ga = if nonzero {
                ga
            } else {
                let b_zero = binary(BinaryOp::Equal, b, &scalar_like(b, 0.0))?;
                select(&b_zero, &scalar_like(&ga, 0.0), &ga)?
            };
            let pos = binary(BinaryOp::Greater, a, &scalar_like(a, 0.0))?;
            let safe = select(&pos, a, &one)?;
            let loga = select(&pos, &unary(UnaryOp::Log, &safe)?, &scalar_like(&safe, 0.0))?;
            (ga, mul(g, &mul(node, &loga)?)?)
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let cmp = if op == BinaryOp::Maximum {
                BinaryOp::GreaterEqual
            } else {
                BinaryOp::LessEqual
            };
            let mask = binary(cmp, a, b)?;
            // `select` broadcasts, so a scalar zero stands in for a zero tensor.
            let z = scalar_like(node, 0.0);
            let gfull = broadcast_like(g, node)?;
            (select(&mask, &gfull, &z)?, select(&mask, &z, &gfull)?)
        }
        BinaryOp::Mod => (
            g.clone(),
            neg(&mul(g, &binary(BinaryOp::FloorDiv, a, b)?)?)?,
        ),
        BinaryOp::FloorDiv
        | BinaryOp::Equal
        | BinaryOp::NotEqual
        | BinaryOp::Less
        | BinaryOp::LessEqual
        | BinaryOp::Greater
        | BinaryOp::GreaterEqual
        | BinaryOp::And
        | BinaryOp::Or => return Ok(vec![None, None]),
    };
    Ok(vec![Some(sum_like(&ga, a)?), Some(sum_like(&gb, b)?)])
}

pub fn cpu_binary(op: BinaryOp, a: &Value, b: &Value) -> Result<Value> {
    let out = match (a, b) {
        (Value::F32(x), Value::F32(y)) => op.float_kernel(x, y)?,
        (Value::F64(x), Value::F64(y)) => op.float_kernel(x, y)?,
        (Value::F16(x), Value::F16(y)) => op.float_kernel(&widen_f32(x), &widen_f32(y))?,
        _ if a.dtype() == b.dtype() => op.int_kernel(&widen_i64(a), &widen_i64(b))?,
        _ => {
            return Err(Error::Type(format!(
                "{}: operands have dtypes {} and {}",
                op.name(),
                a.dtype(),
                b.dtype()
            )))
        }
    };
    Ok(match op.class() {
        BinaryClass::Arith => out.cast(a.dtype()),
        BinaryClass::Compare | BinaryClass::Logical => out,
    })
}

// ---- select ----

pub fn select(c: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Tensor::new(Op::Select, vec![c.clone(), a.clone(), b.clone()])
}

pub fn infer_select(inputs: &[Tensor]) -> Result<(Shape, DType)> {
    let (c, a, b) = (&inputs[0], &inputs[1], &inputs[2]);
    if c.dtype() != DType::Bool {
        return Err(Error::Type(format!(
            "switch/select: condition must be bool, got {}",
            c.dtype()
        )));
    }
    if a.dtype() != b.dtype() {
        return Err(Error::Type(format!(
            "switch/select: branches have different dtypes {} and {}",
            a.dtype(),
            b.dtype()
        )));
    }
    let s = broadcast_static(
        "select",
        &broadcast_static("select", c.shape(), a.shape())?,
        b.shape(),
    )?;
    Ok((s, a.dtype()))
}

pub fn vjp_select(node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let (c, a, b) = (node.input(0), node.input(1), node.input(2));
    let z = scalar_like(node, 0.0);
    let gfull = broadcast_like(g, node)?;
    Ok(vec![
        None,
        Some(sum_like(&select(c, &gfull, &z)?, a)?),
        Some(sum_like(&select(c, &z, &gfull)?, b)?),
    ])
}

pub fn cpu_select(c: &Value, a: &Value, b: &Value) -> Result<Value> {
    let Value::Bool(c) = c else {
        return Err(Error::Type(format!(
            "select: condition must be bool, got {}",
            c.dtype()
        )));
    };
    fn go<T: Elem>(c: &Arr<bool>, a: &Arr<T>, b: &Arr<T>) -> Result<Value> {
        let shape = broadcast_runtime(
            "select",
            &broadcast_runtime("select", c.shape(), a.shape())?,
            b.shape(),
        )?;
        let n: usize = shape.iter().product();
        // Fast path: each operand is either full-size or a single element (relu and
        // maximum gradients select between a tensor and a scalar zero).
        let flat = |x: usize| x == n || x == 1;
        if flat(c.len()) && flat(a.len()) && flat(b.len()) {
            let (cs, xs, ys) = (
                c.as_slice().expect("standard"),
                a.as_slice().expect("standard"),
                b.as_slice().expect("standard"),
            );
            let (sc, sx, sy) = (
                (c.len() == n) as usize,
                (a.len() == n) as usize,
                (b.len() == n) as usize,
            );
            let run = |k: usize, o: &mut [MaybeUninit<T>]| {
                let base = k * GRAIN;
                for (j, o) in o.iter_mut().enumerate() {
                    let i = base + j;
                    o.write(if cs[i * sc] { xs[i * sx] } else { ys[i * sy] });
                }
            };
            let out = build_vec(n, |out| {
                if n < 2 * GRAIN {
                    run(0, out)
                } else {
                    out.par_chunks_mut(GRAIN)
                        .enumerate()
                        .for_each(|(k, o)| run(k, o))
                }
            });
            return Ok(T::wrap(
                Arr::from_shape_vec(IxDyn(&shape), out).expect("shape matches"),
            ));
        }
        let (cv, av, bv) = (
            c.broadcast(IxDyn(&shape)).expect("checked"),
            a.broadcast(IxDyn(&shape)).expect("checked"),
            b.broadcast(IxDyn(&shape)).expect("checked"),
        );
        let out = Zip::from(&cv)
            .and(&av)
            .and(&bv)
            .map_collect(|&c, &x, &y| if c { x } else { y });
        Ok(T::wrap(out.into_shared()))
    }
    crate::with_value!(a, x => {
        let y = <_ as Elem>::unwrap(b).ok_or_else(|| Error::Type(format!("select: branches have dtypes {} and {}", a.dtype(), b.dtype())))?;
        go(c, x, y)
    })
}

// ---- cast ----

pub fn cast(x: &Tensor, d: DType) -> Result<Tensor> {
    if x.dtype() == d {
        return Ok(x.clone());
    }
    Tensor::new(Op::Cast(d), vec![x.clone()])
}

pub fn vjp_cast(node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let x = node.input(0);
    if x.dtype().is_float() && node.dtype().is_float() {
        Ok(vec![Some(cast(g, x.dtype())?)])
    } else {
        Ok(vec![None])
    }
}

// ---- helpers: constants shaped like a tensor ----

/// A rank-0 constant of `x`'s dtype.
pub fn scalar_like(x: &Tensor, v: f64) -> Tensor {
    source::constant(Value::scalar_f64(x.dtype(), v))
}

/// `v` broadcast to `x`'s runtime shape.
pub fn constant_like(x: &Tensor, v: f64) -> Result<Tensor> {
    broadcast_like(&scalar_like(x, v), x)
}

pub fn zeros_like(x: &Tensor) -> Result<Tensor> {
    constant_like(x, 0.0)
}

#[cfg(test)]
mod wgsl_table_tests {
    use super::*;

    /// Every op has a float WGSL expression, and an integer one exactly when it has an
    /// integer CPU kernel, so fused GPU kernels exist for every dtype the CPU accepts.
    #[test]
    fn wgsl_expressions_cover_the_cpu_kernels() {
        for &u in UnaryOp::ALL {
            assert!(u.wgsl(true).is_some(), "{}", u.name());
            assert_eq!(u.wgsl(false).is_some(), u.takes_int(), "{}", u.name());
        }
        for &b in BinaryOp::ALL {
            assert!(
                !b.wgsl(true).is_empty() && !b.wgsl(false).is_empty(),
                "{}",
                b.name()
            );
        }
    }
}
