//! The private `ferrokeras._core` module. Each binding is a thin wrapper that converts
//! arguments, calls the Rust core and maps its `Error` through `err()`; the K semantics
//! (argument normalisation, composites) live in `python/ferrokeras/backend.py`.

use crate::base::dtype::DType;
use crate::base::error::Error;
use crate::base::shape::{norm_axes, norm_axis, Shape};
use crate::base::value::foreign::Borrowed;
use crate::base::value::Value;
use crate::ops::conv::{ConvSpec, Padding};
use crate::ops::graph::Tensor;
use crate::ops::pool::{PoolKind, PoolSpec};
use crate::ops::{
    self, build, source, ArgOp, BinaryOp, ReduceOp, ScanOp, SliceAxis, UnaryOp, VarCell,
};
use crate::runtime::{check_feed, Function};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::sync::Arc;

pyo3::create_exception!(
    _core,
    DeviceError,
    PyRuntimeError,
    "A device fault: no such adapter, out of GPU memory, device lost, a shader compile failure, a buffer over the adapter's limits."
);

fn err(e: Error) -> PyErr {
    match e {
        Error::Callback(payload, m) => match payload.downcast_ref::<PyErr>() {
            Some(pe) => Python::attach(|py| pe.clone_ref(py)),
            None => PyRuntimeError::new_err(m),
        },
        Error::Value(m) | Error::Unfed(m) => PyValueError::new_err(m),
        Error::Type(m) => PyTypeError::new_err(m),
        Error::Unsupported(m) | Error::Runtime(m) => PyRuntimeError::new_err(m),
        e @ Error::UpdatingInPlace(_) => PyRuntimeError::new_err(format!("internal: {e}")),
        Error::Device(m) => DeviceError::new_err(m),
    }
}

type R<T> = PyResult<T>;

/// Runs `f`, turning a Rust panic into a Python `RuntimeError` instead of unwinding into Python.
fn guarded<T>(what: &str, f: impl FnOnce() -> crate::Result<T>) -> R<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(err),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(PyRuntimeError::new_err(format!(
                "internal error in {what}: {}",
                msg.unwrap_or_default()
            )))
        }
    }
}

// ---------------------------------------------------------------- NumPy <-> Value

fn to_value(obj: &Bound<'_, PyAny>) -> R<Value> {
    value_of(obj, None)
}

/// Feeds of at least this many bytes are read in place when their layout allows
/// (`foreign::Borrowed`); smaller ones cost less to copy than to borrow.
const LEASE_MIN_BYTES: usize = 4096;

/// A `K.function` feed: read in place from a C-contiguous, aligned NumPy array for the
/// length of the call (`borrowed`), else copied as `to_value` does.
fn feed_value(obj: &Bound<'_, PyAny>, borrowed: &mut Borrowed) -> R<Value> {
    value_of(obj, Some(borrowed))
}

/// A NumPy array as a `Value`: copied, or with `borrowed` read in place where it is
/// C-contiguous, aligned, at least `LEASE_MIN_BYTES` and not bool (NumPy's bools are bytes
/// that Rust's `bool` must only see as 0 or 1, so they are copied).
fn value_of(obj: &Bound<'_, PyAny>, mut borrowed: Option<&mut Borrowed>) -> R<Value> {
    macro_rules! try_as {
        ($t:ty, $var:ident, $borrowable:expr) => {
            if let Ok(a) = obj.cast::<PyArrayDyn<$t>>() {
                let ro = a
                    .try_readonly()
                    .map_err(|e| PyValueError::new_err(format!("array is not readable: {e}")))?;
                let view = ro.as_array();
                if let Some(borrowed) = borrowed.as_deref_mut().filter(|_| $borrowable) {
                    let aligned = view.as_ptr() as usize % std::mem::align_of::<$t>() == 0;
                    if view.is_standard_layout()
                        && aligned
                        && view.len() * std::mem::size_of::<$t>() >= LEASE_MIN_BYTES
                    {
                        let shape = view.shape().to_vec();
                        // SAFETY: a C-contiguous, aligned array of `shape`; the caller's
                        // list and the owner (a reference to the array) keep it alive until
                        // the borrow ends in `__call__`, after the outputs are converted. The
                        // engine never writes a borrowed buffer (see `foreign`).
                        return Ok(unsafe {
                            borrowed.borrow(view.as_ptr(), &shape, Box::new(obj.clone().unbind()))
                        });
                    }
                }
                return Ok(Value::$var(
                    view.as_standard_layout().into_owned().into_shared(),
                ));
            }
        };
    }
    try_as!(f32, F32, true);
    try_as!(f64, F64, true);
    try_as!(i32, I32, true);
    try_as!(i64, I64, true);
    try_as!(bool, Bool, false);
    try_as!(half::f16, F16, true);
    try_as!(i8, I8, true);
    try_as!(i16, I16, true);
    try_as!(u8, U8, true);
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return Err(PyTypeError::new_err(format!(
            "unsupported array dtype {}",
            a.dtype()
        )));
    }
    Err(PyTypeError::new_err(format!(
        "expected a numpy array, got {}",
        obj.get_type().name()?
    )))
}

fn to_py(py: Python<'_>, v: Value) -> Py<PyAny> {
    crate::with_value!(v, a => PyArrayDyn::from_owned_array(py, a.into_owned()).into_any().unbind())
}

fn dtype(s: &str) -> R<DType> {
    DType::parse(s).map_err(err)
}

// ---------------------------------------------------------------- Tensor

#[pyclass(name = "Tensor", module = "ferrokeras._core", frozen, from_py_object)]
#[derive(Clone)]
pub struct PyTensor(pub Tensor);

#[pymethods]
impl PyTensor {
    #[getter]
    fn shape(&self) -> Vec<Option<usize>> {
        self.0.shape().0.clone()
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.0.dtype().name()
    }
    #[getter]
    fn id(&self) -> u64 {
        self.0.id()
    }
    #[getter]
    fn op(&self) -> String {
        self.0.op().name()
    }
    fn is_placeholder(&self) -> bool {
        matches!(self.0.op(), ops::Op::Placeholder(_))
    }
    fn is_variable(&self) -> bool {
        matches!(self.0.op(), ops::Op::Variable(_))
    }
    fn is_constant(&self) -> bool {
        matches!(self.0.op(), ops::Op::Constant(_))
    }
    fn __repr__(&self) -> String {
        format!(
            "<_core.Tensor {} shape={} dtype={}>",
            self.0.op().name(),
            self.0.shape(),
            self.0.dtype()
        )
    }
}

fn t(x: &PyTensor) -> &Tensor {
    &x.0
}
fn wrap(r: crate::Result<Tensor>) -> R<PyTensor> {
    r.map(PyTensor).map_err(err)
}

// ---------------------------------------------------------------- Variable

#[pyclass(name = "Variable", module = "ferrokeras._core", frozen)]
pub struct PyVariable {
    cell: Arc<VarCell>,
    tensor: Tensor,
}

#[pymethods]
impl PyVariable {
    #[new]
    fn new(value: &Bound<'_, PyAny>, name: &str) -> R<Self> {
        let (cell, tensor) = source::variable(name, to_value(value)?);
        Ok(PyVariable { cell, tensor })
    }
    #[getter]
    fn tensor(&self) -> PyTensor {
        PyTensor(self.tensor.clone())
    }
    #[getter]
    fn name(&self) -> String {
        self.cell.name.clone()
    }
    fn get(&self, py: Python<'_>) -> R<Py<PyAny>> {
        let v = py.detach(|| guarded("get_value", || self.cell.get()))?;
        Ok(to_py(py, v))
    }
    /// Whether the value currently has a copy on a GPU (tests of residency).
    fn on_device(&self) -> bool {
        self.cell.snapshot().1.is_some()
    }
    fn set(&self, value: &Bound<'_, PyAny>) -> R<()> {
        self.cell.set(to_value(value)?).map_err(err)
    }
    /// The address of the host value's buffer, if there is one (tests of in-place updates).
    fn host_address(&self) -> Option<usize> {
        self.cell
            .snapshot()
            .0
            .map(|v| crate::with_value!(&v, a => a.as_ptr() as usize))
    }
}

// ---------------------------------------------------------------- sources

#[pyfunction]
#[pyo3(signature = (name, shape, dtype_name, default=None))]
fn placeholder(
    name: &str,
    shape: Vec<Option<usize>>,
    dtype_name: &str,
    default: Option<&Bound<'_, PyAny>>,
) -> R<PyTensor> {
    let d = default.map(to_value).transpose()?;
    wrap(source::placeholder(
        name,
        Shape(shape),
        dtype(dtype_name)?,
        d,
    ))
}

/// (feeds read in place so far, those of them whose buffers were still held when their
/// call ended and were leaked to stay valid: 0 unless a bug let one escape).
#[pyfunction]
fn borrowed_feeds() -> (usize, usize) {
    crate::base::value::foreign::counts()
}

#[pyfunction]
fn constant(value: &Bound<'_, PyAny>) -> R<PyTensor> {
    Ok(PyTensor(source::constant(to_value(value)?)))
}

// ---------------------------------------------------------------- ops (one line each)

#[pyfunction]
fn unary(name: &str, x: &PyTensor) -> R<PyTensor> {
    let op = UnaryOp::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown unary op '{name}'")))?;
    wrap(build::unary(op, t(x)))
}

#[pyfunction]
fn binary(name: &str, a: &PyTensor, b: &PyTensor) -> R<PyTensor> {
    let op = BinaryOp::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown binary op '{name}'")))?;
    wrap(build::binary(op, t(a), t(b)))
}

#[pyfunction]
fn select(c: &PyTensor, a: &PyTensor, b: &PyTensor) -> R<PyTensor> {
    wrap(build::select(t(c), t(a), t(b)))
}

#[pyfunction]
fn cast(x: &PyTensor, dtype_name: &str) -> R<PyTensor> {
    wrap(build::cast(t(x), dtype(dtype_name)?))
}

#[pyfunction]
fn stop_gradient(x: &PyTensor) -> R<PyTensor> {
    wrap(Tensor::new(ops::Op::StopGradient, vec![t(x).clone()]))
}

#[pyfunction]
fn reduce(name: &str, x: &PyTensor, axes: Vec<i64>, keepdims: bool) -> R<PyTensor> {
    let op = ReduceOp::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown reduction '{name}'")))?;
    let axes = norm_axes(name, &axes, t(x).rank()).map_err(err)?;
    wrap(build::reduce(op, t(x), &axes, keepdims))
}

#[pyfunction]
fn arg(name: &str, x: &PyTensor, axis: i64) -> R<PyTensor> {
    let op = match name {
        "argmax" => ArgOp::ArgMax,
        "argmin" => ArgOp::ArgMin,
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown arg-reduction '{name}'"
            )))
        }
    };
    let axis = norm_axis(name, axis, t(x).rank()).map_err(err)?;
    wrap(build::arg(op, t(x), axis))
}

#[pyfunction]
fn scan(name: &str, x: &PyTensor, axis: i64, exclusive: bool, reverse: bool) -> R<PyTensor> {
    let op = match name {
        "cumsum" => ScanOp::Cumsum,
        "cumprod" => ScanOp::Cumprod,
        _ => return Err(PyValueError::new_err(format!("unknown scan '{name}'"))),
    };
    let axis = norm_axis(name, axis, t(x).rank()).map_err(err)?;
    wrap(build::scan(op, t(x), axis, exclusive, reverse))
}

#[pyfunction]
fn reshape(x: &PyTensor, shape: &PyTensor) -> R<PyTensor> {
    wrap(build::reshape_to(t(x), t(shape)))
}

#[pyfunction]
fn broadcast_to(x: &PyTensor, shape: &PyTensor) -> R<PyTensor> {
    wrap(build::broadcast_to(t(x), t(shape)))
}

#[pyfunction]
fn shape_of(x: &PyTensor) -> R<PyTensor> {
    wrap(build::shape_of(t(x)))
}

#[pyfunction]
fn expand_dims(x: &PyTensor, axes: Vec<usize>) -> R<PyTensor> {
    wrap(build::expand_dims(t(x), &axes))
}

#[pyfunction]
fn squeeze(x: &PyTensor, axes: Vec<i64>) -> R<PyTensor> {
    let axes = norm_axes("squeeze", &axes, t(x).rank()).map_err(err)?;
    wrap(build::squeeze(t(x), &axes))
}

#[pyfunction]
fn transpose(x: &PyTensor, perm: Vec<i64>) -> R<PyTensor> {
    if perm.len() != t(x).rank() {
        return Err(PyValueError::new_err(format!(
            "permute_dimensions: pattern {perm:?} has {} entries for a tensor of rank {}",
            perm.len(),
            t(x).rank()
        )));
    }
    let perm: Vec<usize> = perm
        .iter()
        .map(|&p| norm_axis("permute_dimensions", p, t(x).rank()))
        .collect::<crate::Result<_>>()
        .map_err(err)?;
    wrap(build::transpose(t(x), &perm))
}

#[pyfunction]
fn slice(x: &PyTensor, spec: Vec<(Option<i64>, Option<i64>, i64)>) -> R<PyTensor> {
    let spec: Vec<SliceAxis> = spec
        .into_iter()
        .map(|(start, stop, step)| SliceAxis { start, stop, step })
        .collect();
    wrap(build::slice(t(x), &spec))
}

#[pyfunction]
fn concat(xs: Vec<PyTensor>, axis: i64) -> R<PyTensor> {
    let xs: Vec<Tensor> = xs.into_iter().map(|x| x.0).collect();
    let r = xs
        .first()
        .map(|x| x.rank())
        .ok_or_else(|| PyValueError::new_err("concatenate: needs at least one tensor"))?;
    let axis = norm_axis("concatenate", axis, r).map_err(err)?;
    wrap(build::concat(&xs, axis))
}

#[pyfunction]
fn pad(x: &PyTensor, pads: Vec<(usize, usize)>, value: f64) -> R<PyTensor> {
    wrap(build::pad(t(x), &pads, value))
}

#[pyfunction]
fn reverse(x: &PyTensor, axes: Vec<i64>) -> R<PyTensor> {
    let axes = norm_axes("reverse", &axes, t(x).rank()).map_err(err)?;
    wrap(build::reverse(t(x), &axes))
}

#[pyfunction]
fn gather(p: &PyTensor, i: &PyTensor, axis: i64) -> R<PyTensor> {
    let axis = norm_axis("gather", axis, t(p).rank()).map_err(err)?;
    wrap(build::gather(t(p), t(i), axis))
}

#[pyfunction]
fn matmul(a: &PyTensor, b: &PyTensor, ta: bool, tb: bool) -> R<PyTensor> {
    wrap(build::matmul(t(a), t(b), ta, tb))
}

#[pyfunction]
#[pyo3(signature = (dist, shape, dtype_name, seed=None))]
fn random(dist: &str, shape: &PyTensor, dtype_name: &str, seed: Option<u64>) -> R<PyTensor> {
    use crate::ops::random::RandomDist;
    let d = match dist {
        "uniform" => RandomDist::Uniform,
        "normal" => RandomDist::Normal,
        "truncated_normal" => RandomDist::TruncatedNormal,
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown distribution '{dist}'"
            )))
        }
    };
    wrap(crate::ops::random::random(
        d,
        t(shape),
        dtype(dtype_name)?,
        seed,
    ))
}

fn conv_spec(
    strides: Vec<usize>,
    dilation: Vec<usize>,
    padding: &Bound<'_, PyAny>,
    groups: usize,
) -> R<Arc<ConvSpec>> {
    let padding = match padding.extract::<String>() {
        Ok(s) if s == "same" => Padding::Same,
        Ok(s) => {
            return Err(PyValueError::new_err(format!(
                "unknown padding '{s}': expected 'same' or (before, after) pairs"
            )))
        }
        Err(_) => Padding::Explicit(padding.extract()?),
    };
    let spec = ConvSpec {
        strides,
        dilation,
        padding,
        groups,
    };
    spec.validate("conv").map_err(err)?;
    Ok(Arc::new(spec))
}

#[pyfunction]
fn conv(
    x: &PyTensor,
    w: &PyTensor,
    strides: Vec<usize>,
    dilation: Vec<usize>,
    padding: &Bound<'_, PyAny>,
    groups: usize,
) -> R<PyTensor> {
    wrap(build::conv(
        t(x),
        t(w),
        &conv_spec(strides, dilation, padding, groups)?,
    ))
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn conv_transpose(
    g: &PyTensor,
    w: &PyTensor,
    x_shape: &PyTensor,
    strides: Vec<usize>,
    dilation: Vec<usize>,
    padding: &Bound<'_, PyAny>,
    groups: usize,
) -> R<PyTensor> {
    wrap(build::conv_input_grad(
        t(g),
        t(w),
        t(x_shape),
        &conv_spec(strides, dilation, padding, groups)?,
    ))
}

#[pyfunction]
fn pool(
    x: &PyTensor,
    mode: &str,
    window: Vec<usize>,
    strides: Vec<usize>,
    padding: &Bound<'_, PyAny>,
) -> R<PyTensor> {
    let kind = match mode {
        "max" => PoolKind::Max,
        "avg" => PoolKind::Avg,
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown pool_mode '{mode}': expected 'max' or 'avg'"
            )))
        }
    };
    let n = window.len();
    let padding = conv_spec(vec![1; n], vec![1; n], padding, 1)?
        .padding
        .clone();
    wrap(build::pool(
        t(x),
        &Arc::new(PoolSpec {
            kind,
            window,
            strides,
            padding,
        }),
    ))
}

/// A loop over axis 0 of `seqs`, with a body traced on `seq_phs`/`state_phs`. Returns the
/// stacked per-step outputs followed by the final states.
#[pyfunction]
#[pyo3(signature = (seqs, init, seq_phs, state_phs, outputs, new_states, reverse=false))]
fn loop_(
    seqs: Vec<PyTensor>,
    init: Vec<PyTensor>,
    seq_phs: Vec<PyTensor>,
    state_phs: Vec<PyTensor>,
    outputs: Vec<PyTensor>,
    new_states: Vec<PyTensor>,
    reverse: bool,
) -> R<Vec<PyTensor>> {
    let un = |v: Vec<PyTensor>| v.into_iter().map(|x| x.0).collect::<Vec<_>>();
    let (no, ns) = (outputs.len(), new_states.len());
    guarded("loop", || {
        let node = crate::ops::control::build_loop(
            &un(seqs),
            &un(init),
            un(seq_phs),
            un(state_phs),
            un(outputs),
            un(new_states),
            reverse,
        )?;
        (0..no + ns)
            .map(|k| crate::ops::control::tuple_get(&node, k).map(PyTensor))
            .collect()
    })
}

/// A Python object with `call(arrays) -> arrays` and `vjp(arrays, grads) -> arrays|None`,
/// run while a plan executes (the GIL is taken for the call).
#[derive(Debug)]
struct PyHostFn {
    name: String,
    runner: Py<PyAny>,
}

/// The base object of a NumPy array lent to a host callback: it holds the array's buffer
/// for as long as Python holds the array.
#[pyclass(module = "ferrokeras._core", frozen)]
struct LentBuffer {
    _buffer: Value,
}

/// `v` as a writable NumPy array over `v`'s own buffer when nothing else holds it (a copy
/// otherwise), and that buffer, for `lent_place` to find the results that view it. Bool
/// arrays are copied out and in as before (`None`): NumPy may leave bytes in them that are
/// not Rust bools.
fn lend(py: Python<'_>, v: Value) -> R<(Py<PyAny>, Option<Value>)> {
    if matches!(v, Value::Bool(_)) {
        return Ok((to_py(py, v), None));
    }
    let own = crate::with_value!(&v, a => a.is_unique() && a.is_standard_layout());
    let v = if own {
        v
    } else {
        crate::map_value!(v, a => a.as_standard_layout().into_owned().into_shared())
    };
    let base = Bound::new(py, LentBuffer { _buffer: v.clone() })?.into_any();
    // SAFETY: `base` holds a clone of `v`, whose buffer (an `Arc`'d `Vec`, never moved or
    // grown) therefore lives as long as the array does. Nothing in the engine reads the
    // buffer while the callback runs: `v` came to the callback as its own.
    let array = crate::with_value!(&v, a => unsafe {
        PyArrayDyn::borrow_from_array(a, base).into_any().unbind()
    });
    Ok((array, Some(v)))
}

/// Where the callback's result `obj` lies in the buffer `lent`: its element offset and
/// shape, when it is a C-contiguous array of the buffer's dtype inside it.
fn lent_place<T: numpy::Element>(
    obj: &Bound<'_, PyAny>,
    lent: &ndarray::ArcArray<T, ndarray::IxDyn>,
) -> Option<(usize, Vec<usize>)> {
    let a = obj.cast::<PyArrayDyn<T>>().ok()?;
    let size = std::mem::size_of::<T>();
    let shape = a.shape().to_vec();
    let n: usize = shape.iter().product();
    let (start, data) = (lent.as_ptr() as usize, a.data() as usize);
    if n == 0 || !a.is_c_contiguous() || data < start || (data - start) % size != 0 {
        return None;
    }
    let offset = (data - start) / size;
    (offset + n <= lent.len()).then_some((offset, shape))
}

/// Elements `offset..` of the C-contiguous `buffer`, in `shape`, sharing its buffer.
fn lent_view(buffer: &Value, offset: usize, shape: &[usize]) -> Value {
    let n: usize = shape.iter().product();
    crate::map_value!(buffer.clone(), a => {
        let len = a.len();
        a.into_shape_with_order(len)
            .expect("lent buffers are C-contiguous")
            .slice_move(ndarray::s![offset..offset + n])
            .into_shape_with_order(ndarray::IxDyn(shape))
            .expect("a range of a vector is contiguous")
    })
}

fn callback_err(e: PyErr) -> Error {
    let msg = e.to_string();
    Error::Callback(Arc::new(e), msg)
}

impl crate::ops::host::HostFn for PyHostFn {
    fn name(&self) -> &str {
        &self.name
    }
    /// The inputs reach Python as writable arrays over buffers lent to the call (the
    /// input's own when nothing else holds it, else a copy). A result that is a
    /// C-contiguous view of a lent buffer (the input itself, a slice, a reshape) shares
    /// that buffer instead of being copied, unless Python still holds an array over it
    /// once the call's own references are dropped, so nothing can write it afterwards.
    fn call(&self, inputs: Vec<Value>) -> crate::Result<Vec<Value>> {
        Python::attach(|py| {
            let mut args = Vec::with_capacity(inputs.len());
            let mut lent = Vec::with_capacity(inputs.len());
            for v in inputs {
                let (array, buffer) = lend(py, v).map_err(callback_err)?;
                args.push(array);
                lent.push(buffer);
            }
            let res = self
                .runner
                .call_method1(py, "call", (args,))
                .map_err(callback_err)?;
            let out: Vec<Bound<'_, PyAny>> = res.bind(py).extract().map_err(callback_err)?;
            let mut results = Vec::with_capacity(out.len());
            let mut views = Vec::new();
            for (i, o) in out.iter().enumerate() {
                let place = lent.iter().enumerate().find_map(|(k, b)| {
                    let b = b.as_ref()?;
                    crate::with_value!(b, a => lent_place(o, a)).map(|(off, sh)| (k, off, sh))
                });
                match place {
                    Some(place) => {
                        views.push((i, place));
                        results.push(None);
                    }
                    None => results.push(Some(to_value(o).map_err(callback_err)?)),
                }
            }
            drop(out);
            drop(res);
            let alone: Vec<bool> = lent
                .iter()
                .map(|b| {
                    b.as_ref()
                        .is_some_and(|b| crate::with_value!(b, a => a.is_unique()))
                })
                .collect();
            for (i, (k, offset, shape)) in views {
                let buffer = lent[k].as_ref().expect("a place is in a lent buffer");
                let view = lent_view(buffer, offset, &shape);
                results[i] = Some(if alone[k] {
                    view
                } else {
                    crate::map_value!(view, a => a.to_owned().into_shared())
                });
            }
            Ok(results
                .into_iter()
                .map(|r| r.expect("every result is converted"))
                .collect())
        })
    }
    fn vjp(&self, inputs: &[Value], grads: &[Value]) -> crate::Result<Vec<Option<Value>>> {
        Python::attach(|py| {
            let xs: Vec<Py<PyAny>> = inputs.iter().map(|v| to_py(py, v.clone())).collect();
            let gs: Vec<Py<PyAny>> = grads.iter().map(|v| to_py(py, v.clone())).collect();
            let out = self
                .runner
                .call_method1(py, "vjp", (xs, gs))
                .map_err(callback_err)?;
            let out: Vec<Option<Bound<'_, PyAny>>> =
                out.bind(py).extract().map_err(callback_err)?;
            out.iter()
                .map(|o| o.as_ref().map(to_value).transpose().map_err(callback_err))
                .collect()
        })
    }
}

/// A host-callback node; returns one tensor per declared result.
#[pyfunction]
fn host_call(
    name: &str,
    runner: Py<PyAny>,
    inputs: Vec<PyTensor>,
    results: Vec<(Vec<Option<usize>>, String)>,
) -> R<Vec<PyTensor>> {
    let specs: Vec<(Shape, DType)> = results
        .into_iter()
        .map(|(s, d)| Ok((Shape(s), dtype(&d)?)))
        .collect::<R<_>>()?;
    let n = specs.len();
    let f = Arc::new(PyHostFn {
        name: name.to_string(),
        runner,
    });
    let ins: Vec<Tensor> = inputs.into_iter().map(|x| x.0).collect();
    guarded("py_function", || {
        let node = crate::ops::host::host_call(f, &ins, specs)?;
        (0..n)
            .map(|k| crate::ops::control::tuple_get(&node, k).map(PyTensor))
            .collect()
    })
}

#[pyfunction]
fn ctc_loss(
    logits: &PyTensor,
    labels: &PyTensor,
    input_length: &PyTensor,
    label_length: &PyTensor,
) -> R<PyTensor> {
    wrap(crate::ops::ctc::ctc(
        crate::ops::ctc::CtcOp::Loss,
        t(logits),
        t(labels),
        t(input_length),
        t(label_length),
    ))
}

/// Decoded paths (one int64 matrix each, padded with -1) followed by their log-probabilities.
#[pyfunction]
fn ctc_decode(
    log_probs: &PyTensor,
    input_length: &PyTensor,
    greedy: bool,
    beam_width: usize,
    top_paths: usize,
) -> R<Vec<PyTensor>> {
    let d = crate::ops::ctc::Decode {
        greedy,
        beam_width,
        top_paths,
    };
    guarded("ctc_decode", || {
        Ok(crate::ops::ctc::decode(d, t(log_probs), t(input_length))?
            .into_iter()
            .map(PyTensor)
            .collect())
    })
}

// ---------------------------------------------------------------- autodiff and execution

#[pyfunction]
#[pyo3(signature = (y, xs, gy=None))]
fn gradients(
    py: Python<'_>,
    y: &PyTensor,
    xs: Vec<PyTensor>,
    gy: Option<PyTensor>,
) -> R<Vec<Option<PyTensor>>> {
    let xs: Vec<Tensor> = xs.into_iter().map(|x| x.0).collect();
    // Without the GIL, so that the compile progress report (a Python thread) can run.
    let gs = py.detach(|| {
        guarded("gradients", || {
            crate::autodiff::gradients(t(y), &xs, gy.map(|g| g.0))
        })
    })?;
    Ok(gs.into_iter().map(|g| g.map(PyTensor)).collect())
}

#[pyclass(name = "Function", module = "ferrokeras._core", frozen)]
pub struct PyFunction(Function);

#[pymethods]
impl PyFunction {
    /// Plans the function without the GIL, so that the compile progress report (a Python
    /// thread) can run meanwhile.
    #[new]
    #[pyo3(signature = (feeds, outputs, updates, name=None))]
    fn new(
        py: Python<'_>,
        feeds: Vec<PyTensor>,
        outputs: Vec<PyTensor>,
        updates: Vec<(PyTensor, PyTensor)>,
        name: Option<&str>,
    ) -> R<Self> {
        let feeds = feeds.into_iter().map(|x| x.0).collect();
        let outputs = outputs.into_iter().map(|x| x.0).collect();
        let updates = updates.into_iter().map(|(a, b)| (a.0, b.0)).collect();
        py.detach(|| guarded("function", || Function::new(feeds, outputs, updates)))
            .map(|f| PyFunction(f.named(name.unwrap_or(""))))
    }

    fn __call__(&self, py: Python<'_>, values: Vec<Bound<'_, PyAny>>) -> R<Vec<Py<PyAny>>> {
        let f = &self.0;
        if values.len() != f.feeds.len() {
            return Err(PyValueError::new_err(format!(
                "function expects {} input values, got {}",
                f.feeds.len(),
                values.len()
            )));
        }
        // Large contiguous feeds are read in place; the borrow ends after the outputs are
        // converted (an output that is a feed, or a view of one, is copied then).
        let mut borrowed = Borrowed::default();
        let mut feeds = Vec::with_capacity(values.len());
        for (ph, v) in f.feeds.iter().zip(&values) {
            feeds.push(check_feed(ph, feed_value(v, &mut borrowed)?).map_err(err)?);
        }
        let out = py.detach(|| guarded("function call", || f.call(feeds)))?;
        let out = out.into_iter().map(|v| to_py(py, v)).collect();
        drop(borrowed);
        Ok(out)
    }

    /// Kernel launches per call, for tests of fusion and folding: those of the last call
    /// (on a GPU, a fused elementwise chain counts once), or the CPU plan's count before
    /// the first call.
    #[getter]
    fn dispatches(&self) -> usize {
        match *self.0.last.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(s) => s.dispatches,
            None => self.0.plan.dispatches(),
        }
    }

    /// Queue submissions of the last call (0 on the CPU, 1 for a plan that runs wholly
    /// on a GPU).
    #[getter]
    fn submits(&self) -> usize {
        self.0
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(0, |s| s.submits)
    }

    /// Nodes of the last call's GPU plan that ran on the CPU instead (0 on the CPU).
    #[getter]
    fn host_nodes(&self) -> usize {
        self.0
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(0, |s| s.host_nodes)
    }

    /// Shape-arithmetic nodes of the last call's GPU plan: small int vectors that only
    /// feed target shapes, computed on the host from host values, with no transfer (0 on
    /// the CPU).
    #[getter]
    fn shape_nodes(&self) -> usize {
        self.0
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(0, |s| s.shape_nodes)
    }
}

#[pyfunction]
fn evaluate(py: Python<'_>, xs: Vec<PyTensor>) -> R<Vec<Py<PyAny>>> {
    let xs: Vec<Tensor> = xs.into_iter().map(|x| x.0).collect();
    let out = py.detach(|| guarded("eval", || Function::new(vec![], xs, vec![])?.call(vec![])))?;
    Ok(out.into_iter().map(|v| to_py(py, v)).collect())
}

#[pyfunction]
fn device() -> R<String> {
    crate::runtime::device::current()
        .map(|d| d.name())
        .map_err(err)
}

#[pyfunction]
fn set_device(name: &str) -> R<String> {
    crate::runtime::device::set(name).map_err(err)
}

/// The GPU adapters: (index, name, backend, type, software).
#[pyfunction]
fn gpu_adapters() -> Vec<(usize, String, String, String, bool)> {
    crate::runtime::device::list()
        .into_iter()
        .map(|a| (a.index, a.name, a.backend, a.kind, a.software))
        .collect()
}

/// Counters of the current GPU device: (buffer allocations, bytes allocated, pipelines
/// compiled); None on the CPU.
#[pyfunction]
fn device_stats() -> R<Option<(u64, u64, usize)>> {
    Ok(match crate::runtime::device::current().map_err(err)? {
        crate::runtime::device::Device::Cpu => None,
        crate::runtime::device::Device::Gpu(c) => Some(crate::runtime::gpu::stats(&c)),
    })
}

/// The current GPU device, or a `DeviceError` naming `what` on the CPU.
fn current_gpu(what: &str) -> R<Arc<crate::runtime::gpu::Context>> {
    match crate::runtime::device::current().map_err(err)? {
        crate::runtime::device::Device::Cpu => Err(err(Error::Device(format!(
            "{what}: the current device is the CPU"
        )))),
        crate::runtime::device::Device::Gpu(c) => Ok(c),
    }
}

/// Compiles a WGSL compute shader on the current GPU (tests of the shader-error path).
#[pyfunction]
fn compile_wgsl(source: &str, entry: &str) -> R<()> {
    let c = current_gpu("compile_wgsl")?;
    guarded("compile_wgsl", || {
        crate::runtime::gpu::compile_wgsl(&c, source, entry)
    })
}

/// Buffer-pool counters of the current GPU (pooled/live/allocated bytes, buffers created,
/// reused and released, the idle bounds); None on the CPU.
#[pyfunction]
fn gpu_pool_stats(py: Python<'_>) -> R<Option<Py<pyo3::types::PyDict>>> {
    let c = match crate::runtime::device::current().map_err(err)? {
        crate::runtime::device::Device::Cpu => return Ok(None),
        crate::runtime::device::Device::Gpu(c) => c,
    };
    let d = pyo3::types::PyDict::new(py);
    for (k, v) in crate::runtime::gpu::pool_stats(&c) {
        d.set_item(k, v)?;
    }
    d.set_item("device", format!("gpu:{}", c.index()))?;
    Ok(Some(d.unbind()))
}

/// Sets the current GPU's bounds on idle pooled memory and trims to them.
#[pyfunction]
#[pyo3(signature = (max_idle_bytes=None, max_idle_submits=None))]
fn gpu_pool_limits(max_idle_bytes: Option<u64>, max_idle_submits: Option<u64>) -> R<()> {
    let c = current_gpu("gpu_pool_limits")?;
    crate::runtime::gpu::pool_limits(&c, max_idle_bytes, max_idle_submits);
    Ok(())
}

/// Releases the free pooled buffers of every opened GPU (`K.clear_session`).
#[pyfunction]
fn gpu_pool_clear() {
    crate::runtime::gpu::pool_clear()
}

/// Opens a profiling session (`ferrokeras.profile`): every compiled call records its spans
/// until the session closes. Returns the session's start, which `profile_stop` takes.
#[pyfunction]
fn profile_start() -> u64 {
    crate::runtime::profile::start()
}

/// Closes the session that started at `since`: the spans recorded since, as Chrome
/// trace-event JSON.
#[pyfunction]
fn profile_stop(py: Python<'_>, since: u64) -> String {
    py.detach(|| crate::runtime::profile::stop(since))
}

/// What the engine is compiling now (`base::progress`), as the progress report words it;
/// `None` when nothing.
#[pyfunction]
fn compile_phase() -> Option<&'static str> {
    crate::base::progress::current().map(|p| p.describe())
}

/// Test-only: destroys the current GPU device, so that it is lost.
#[pyfunction]
fn _debug_lose_gpu() -> R<()> {
    let c = current_gpu("_debug_lose_gpu")?;
    guarded("_debug_lose_gpu", || {
        crate::runtime::gpu::lose(&c);
        Ok(())
    })
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    crate::runtime::cpu::alloc::tune_malloc();
    m.add_class::<PyTensor>()?;
    m.add_class::<PyVariable>()?;
    m.add_class::<PyFunction>()?;
    m.add_function(wrap_pyfunction!(placeholder, m)?)?;
    m.add_function(wrap_pyfunction!(constant, m)?)?;
    m.add_function(wrap_pyfunction!(borrowed_feeds, m)?)?;
    m.add_function(wrap_pyfunction!(unary, m)?)?;
    m.add_function(wrap_pyfunction!(binary, m)?)?;
    m.add_function(wrap_pyfunction!(select, m)?)?;
    m.add_function(wrap_pyfunction!(cast, m)?)?;
    m.add_function(wrap_pyfunction!(stop_gradient, m)?)?;
    m.add_function(wrap_pyfunction!(reduce, m)?)?;
    m.add_function(wrap_pyfunction!(arg, m)?)?;
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(reshape, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast_to, m)?)?;
    m.add_function(wrap_pyfunction!(shape_of, m)?)?;
    m.add_function(wrap_pyfunction!(expand_dims, m)?)?;
    m.add_function(wrap_pyfunction!(squeeze, m)?)?;
    m.add_function(wrap_pyfunction!(transpose, m)?)?;
    m.add_function(wrap_pyfunction!(slice, m)?)?;
    m.add_function(wrap_pyfunction!(concat, m)?)?;
    m.add_function(wrap_pyfunction!(pad, m)?)?;
    m.add_function(wrap_pyfunction!(reverse, m)?)?;
    m.add_function(wrap_pyfunction!(gather, m)?)?;
    m.add_function(wrap_pyfunction!(matmul, m)?)?;
    m.add_function(wrap_pyfunction!(random, m)?)?;
    m.add_function(wrap_pyfunction!(conv, m)?)?;
    m.add_function(wrap_pyfunction!(conv_transpose, m)?)?;
    m.add_function(wrap_pyfunction!(pool, m)?)?;
    m.add_function(wrap_pyfunction!(loop_, m)?)?;
    m.add_function(wrap_pyfunction!(host_call, m)?)?;
    m.add_function(wrap_pyfunction!(ctc_loss, m)?)?;
    m.add_function(wrap_pyfunction!(ctc_decode, m)?)?;
    m.add_function(wrap_pyfunction!(gradients, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(device, m)?)?;
    m.add_function(wrap_pyfunction!(set_device, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_adapters, m)?)?;
    m.add_function(wrap_pyfunction!(device_stats, m)?)?;
    m.add_function(wrap_pyfunction!(compile_wgsl, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_pool_limits, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_pool_clear, m)?)?;
    m.add_function(wrap_pyfunction!(profile_start, m)?)?;
    m.add_function(wrap_pyfunction!(compile_phase, m)?)?;
    m.add_function(wrap_pyfunction!(profile_stop, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_lose_gpu, m)?)?;
    m.add("DeviceError", m.py().get_type::<DeviceError>())?;
    m.add(
        "UNARY_OPS",
        UnaryOp::ALL.iter().map(|o| o.name()).collect::<Vec<_>>(),
    )?;
    m.add(
        "BINARY_OPS",
        BinaryOp::ALL.iter().map(|o| o.name()).collect::<Vec<_>>(),
    )?;
    Ok(())
}
