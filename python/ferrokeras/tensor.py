"""Symbolic tensors as Python sees them: a thin wrapper over ``_core.Tensor`` that carries
what Keras reads and writes on tensors (``name``, ``_keras_shape``, ``_keras_history``, ...)
and the Python operators. Nothing here computes; every operator builds a graph node.
"""

import itertools
import weakref

import numpy as np

from . import _core, config


def non_numeric(arr):
    """The non-numeric types an array holds ('NoneType', 'str', ...), or None when every
    element is a number. NumPy would turn None into NaN and parse strings; TF refuses both."""
    if arr.dtype.kind == "O":
        kinds = sorted(
            {type(x).__name__ for x in arr.flat if not isinstance(x, (int, float, np.number))}
        )
        return "/".join(kinds) or None
    return {"S": "bytes", "U": "str", "V": "void"}.get(arr.dtype.kind)


def check_numeric(where, value, dtype):
    """A TypeError naming ``where`` when ``value`` (to become an array of ``dtype``) holds
    None, strings or other non-numbers."""
    if not (isinstance(value, np.ndarray) and value.dtype.kind not in "OSUV"):
        bad = non_numeric(np.asarray(value))
        if bad:
            raise TypeError(
                f"{where}: cannot convert values of type {bad} to {np.dtype(dtype).name}"
            )


# Names of the enclosing `K.name_scope` blocks; variables created inside get them as prefix.
_NAME_SCOPE = []


class _Eager:
    """Depth of nested ``py_function`` bodies: inside one, tensors are concrete, so Python
    control flow (``if x < m:``) may read their values."""

    depth = 0


EAGER = _Eager()


class TensorShape(tuple):
    """The static shape of a tensor: a tuple of ints, with ``None`` for unknown dims."""

    def as_list(self):
        return list(self)

    @property
    def ndims(self):
        return len(self)

    rank = ndims

    @property
    def dims(self):
        return list(self)


class Tensor:
    """A symbolic tensor: a lazy node of the ferrokeras graph.

    Evaluate it with ``K.eval(t)``, ``np.asarray(t)`` or through ``K.function``.

    The operators that need a ``K`` function (``@``; ``Variable.assign`` and friends) are
    attached by the module that defines it (``_k/linalg.py``, ``_k/variables.py``), since
    this module sits below the ``K`` families.
    """

    # NumPy defers `array <op> tensor` to our reflected operators.
    __array_ufunc__ = None
    __array_priority__ = 100

    def __init__(self, core, name=None):
        self._core = core
        self.name = (
            name
            if name is not None
            else f"{_node_prefix(core)}_{config.get_uid(_node_prefix(core))}"
        )
        # No `_uses_learning_phase` here: as in TensorFlow, only placeholders, variables
        # and outputs that depend on the learning phase carry it (Keras tests `hasattr`).

    # ------------------------------------------------------------ introspection
    @property
    def shape(self):
        return TensorShape(self._core.shape)

    def get_shape(self):
        return self.shape

    @property
    def dtype(self):
        return self._core.dtype

    @property
    def ndim(self):
        return len(self._core.shape)

    @property
    def op(self):
        return self._core.op

    def __repr__(self):
        return f"<ferrokeras.Tensor '{self.name}' shape={tuple(self.shape)} dtype={self.dtype}>"

    # Tensors are dict keys and list members in Keras: identity, not elementwise, equality.
    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __hash__(self):
        return id(self)

    def __bool__(self):
        if EAGER.depth:
            return bool(self.__array__())
        raise TypeError(
            "using a symbolic ferrokeras tensor as a Python bool is not allowed; "
            "use K.switch for graph conditionals or evaluate it with K.eval first"
        )

    def __float__(self):
        return float(self.__array__())

    def __int__(self):
        return int(self.__array__())

    def __index__(self):
        if EAGER.depth and self.dtype in ("int8", "int16", "int32", "int64", "uint8"):
            return int(self.__array__())
        raise TypeError(
            f"tensor '{self.name}' cannot be used as a Python index outside py_function"
        )

    def __len__(self):
        d = self._core.shape[0] if self._core.shape else None
        if d is None:
            raise TypeError(
                f"len() of tensor '{self.name}' with shape {tuple(self.shape)} is not known statically"
            )
        return d

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __array__(self, dtype=None, copy=None):
        v = np.asarray(_core.evaluate([self._core])[0])
        return v.astype(dtype) if dtype is not None else v

    def eval(self):
        """Evaluates the tensor and returns a NumPy array."""
        return self.__array__()

    def numpy(self):
        return self.__array__()

    # ------------------------------------------------------------ operators
    def __add__(self, o):
        return _binary("add", self, o)

    def __radd__(self, o):
        return _binary("add", o, self)

    def __sub__(self, o):
        return _binary("subtract", self, o)

    def __rsub__(self, o):
        return _binary("subtract", o, self)

    def __mul__(self, o):
        return _binary("multiply", self, o)

    def __rmul__(self, o):
        return _binary("multiply", o, self)

    def __truediv__(self, o):
        return _truediv(self, o)

    def __rtruediv__(self, o):
        return _truediv(o, self)

    def __floordiv__(self, o):
        return _binary("floor_divide", self, o)

    def __rfloordiv__(self, o):
        return _binary("floor_divide", o, self)

    def __mod__(self, o):
        return _binary("mod", self, o)

    def __rmod__(self, o):
        return _binary("mod", o, self)

    def __pow__(self, o):
        return _binary("pow", self, o)

    def __rpow__(self, o):
        return _binary("pow", o, self)

    def __neg__(self):
        return wrap(_core.unary("neg", self._core))

    def __pos__(self):
        return self

    def __abs__(self):
        return wrap(_core.unary("abs", self._core))

    def __invert__(self):
        return wrap(_core.unary("logical_not", self._core))

    def __and__(self, o):
        return _binary("logical_and", self, o)

    def __or__(self, o):
        return _binary("logical_or", self, o)

    def __lt__(self, o):
        return _binary("less", self, o)

    def __le__(self, o):
        return _binary("less_equal", self, o)

    def __gt__(self, o):
        return _binary("greater", self, o)

    def __ge__(self, o):
        return _binary("greater_equal", self, o)

    def __getitem__(self, key):
        return getitem(self, key)


# Every live variable, keyed by creation order (ferrokeras.distributed broadcasts them all).
LIVE_VARIABLES = weakref.WeakValueDictionary()
_VARIABLE_ORDER = itertools.count()


class Variable(Tensor):
    """A mutable tensor that owns its value; graphs read its current value when they run."""

    def __init__(self, value, name, constraint=None):
        if _NAME_SCOPE:
            name = "/".join(_NAME_SCOPE + [name])
        self._var = _core.Variable(value, name)
        super().__init__(self._var.tensor, name=name)
        self.constraint = constraint
        self._keras_shape = tuple(self.shape)
        self._uses_learning_phase = False
        # `tf.Variable.trainable`: Keras's `Layer.__setattr__` tracks a variable assigned
        # as a layer attribute as trainable when this is True.
        self.trainable = True
        LIVE_VARIABLES[next(_VARIABLE_ORDER)] = self

    def get_value(self):
        return self._var.get()

    def set_value(self, value):
        check_numeric(f"set_value of '{self.name}'", value, self.dtype)
        self._var.set(np.asarray(value, dtype=self.dtype))

    def __array__(self, dtype=None, copy=None):
        v = self._var.get()
        return v.astype(dtype) if dtype is not None else v

    def value(self):
        return self

    def __repr__(self):
        return f"<ferrokeras.Variable '{self.name}' shape={tuple(self.shape)} dtype={self.dtype}>"


def _node_prefix(core):
    op = core.op.split(" ")[0]
    return op.replace("'", "") or "tensor"


def wrap(core, name=None):
    return Tensor(core, name=name)


def is_tensor(x):
    return isinstance(x, Tensor)


def convert(x, like=None, dtype=None):
    """Turns ``x`` into a tensor. Python numbers and arrays become constants; with ``like``,
    they take that tensor's dtype (so ``x * 2`` keeps ``x``'s float type). A list or tuple
    that holds tensors is stacked along a new first axis (as TensorFlow packs it): Keras
    writes ``K.prod([K.shape(x)[0], K.shape(x)[1]])``."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)) and _holds_tensor(x):
        return _pack(x, like, dtype)
    if dtype is None and like is not None:
        dtype = like.dtype
        arr = np.asarray(x)
        if (
            arr.dtype.kind == "f"
            and np.dtype(dtype).kind in "iub"
            and not np.all(np.mod(arr, 1) == 0)
        ):
            raise TypeError(
                f"cannot combine the non-integer value {x!r} with a {dtype} tensor; cast the tensor first"
            )
    if hasattr(x, "toarray"):  # scipy.sparse
        x = x.toarray()
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError(f"cannot convert {type(x).__name__} to a tensor")
    if dtype is None:
        # Python numbers, and lists and tuples of them, become floatx and int32 tensors as
        # in TensorFlow (NumPy would make them float64 and int64); NumPy arrays and
        # scalars keep their dtype.
        python = _python_numbers(x)
        if arr.dtype.kind == "f" and arr.dtype != np.float16:
            dtype = config.floatx() if python else str(arr.dtype)
        elif arr.dtype == np.float16:
            dtype = "float16"
        elif arr.dtype.kind in "iu":
            fits = arr.size == 0 or -(2**31) <= arr.min() and arr.max() < 2**31
            dtype = "int32" if python and fits else str(arr.dtype)
            if dtype in ("uint16", "uint32", "uint64"):
                dtype = "int64"
        elif arr.dtype.kind == "b":
            dtype = "bool"
        else:
            raise TypeError(f"cannot convert a value of dtype {arr.dtype} to a tensor")
    arr = np.array(arr, dtype=np.dtype(dtype), order="C")
    return wrap(_core.constant(arr))


def _python_numbers(x):
    """Whether ``x`` is a Python int or float, or a (nested) list or tuple of them."""
    if isinstance(x, (list, tuple)):
        return all(_python_numbers(e) for e in x)
    return type(x) in (int, float, bool)


def _holds_tensor(xs):
    return any(
        isinstance(e, Tensor) or (isinstance(e, (list, tuple)) and _holds_tensor(e)) for e in xs
    )


def _pack(xs, like, dtype):
    first = next(
        e for e in xs if isinstance(e, Tensor) or isinstance(e, (list, tuple)) and _holds_tensor(e)
    )
    first = convert(first, like=like, dtype=dtype)
    parts = [convert(e, like=first) for e in xs]
    for p in parts:
        if p.dtype != first.dtype:
            raise TypeError(
                f"cannot pack tensors of dtypes {first.dtype} and {p.dtype} into one tensor"
            )
    return wrap(_core.concat([_core.expand_dims(p._core, [0]) for p in parts], 0))


def _binary(name, a, b):
    if not isinstance(a, Tensor):
        a = convert(a, like=b)
    elif not isinstance(b, Tensor):
        b = convert(b, like=a)
    return wrap(_core.binary(name, a._core, b._core))


def _truediv(a, b):
    a = convert(a, like=b if isinstance(b, Tensor) else None)
    b = convert(b, like=a)
    if a.dtype in ("int8", "int16", "int32", "uint8", "int64") and a.dtype == b.dtype:
        # Python's `/` on integers is true division, as in TensorFlow.
        ft = "float64" if a.dtype in ("int32", "int64") else "float32"
        a, b = wrap(_core.cast(a._core, ft)), wrap(_core.cast(b._core, ft))
    return wrap(_core.binary("divide", a._core, b._core))


def getitem(x, key):
    """NumPy basic indexing: ints, slices (with steps), ``None`` and ``...``. As in
    TensorFlow, an index or a slice bound (start, stop or step) may also be a scalar
    integer tensor: those axes are read with a gather of the indices computed at run time
    (an index out of range raises then, a slice is clipped to the axis as in NumPy)."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    rank = x.ndim
    if n_real > rank:
        raise IndexError(f"too many indices for tensor of rank {rank}: {key!r}")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (rank - n_real))
        else:
            expanded.append(k)
    expanded.extend([slice(None)] * (rank - sum(1 for k in expanded if k is not None)))
    spec, squeeze_axes, new_axes, dynamic = [], [], [], []
    out_axis = 0
    for k in expanded:
        if k is None:
            new_axes.append(out_axis)
            out_axis += 1
            continue
        if isinstance(k, slice):
            bounds = (k.start, k.stop, k.step)
            if any(isinstance(b, Tensor) for b in bounds):
                bounds = tuple(None if b is None else _index_tensor(b) for b in bounds)
                dynamic.append((len(spec), bounds))
                spec.append((None, None, 1))
                out_axis += 1
                continue
            step = 1 if k.step is None else _int_index(k.step)
            if step == 0:
                raise ValueError("slice step cannot be zero")
            spec.append(
                (
                    None if k.start is None else _int_index(k.start),
                    None if k.stop is None else _int_index(k.stop),
                    step,
                )
            )
            out_axis += 1
            continue
        if isinstance(k, Tensor):
            dynamic.append((len(spec), _index_tensor(k)))
            spec.append((None, None, 1))
            squeeze_axes.append(len(spec) - 1)
            continue
        i = _int_index(k)
        dim = x.shape[len(spec)]
        if dim is not None and not -dim <= i < dim:
            raise IndexError(f"index {i} is out of bounds for axis {len(spec)} with size {dim}")
        spec.append((i, i + 1 if i != -1 else None, 1))
        squeeze_axes.append(len(spec) - 1)
    t = _core.slice(x._core, spec)
    for axis, index in dynamic:
        t = _core.gather(t, _dynamic_indices(t, axis, index)._core, axis)
    if squeeze_axes:
        t = _core.squeeze(t, squeeze_axes)
    if new_axes:
        t = _core.expand_dims(t, new_axes)
    return wrap(t)


def _int_index(k):
    if isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
        k = k[()]
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        return int(k)
    raise TypeError(f"tensor indices must be integers, slices, None or ..., got {type(k).__name__}")


def _index_tensor(k):
    """An index or slice bound given as a tensor (or Python int): a 0-d int32 tensor."""
    if isinstance(k, Tensor):
        if k.ndim != 0 or k.dtype not in ("int8", "int16", "int32", "int64", "uint8"):
            raise TypeError(
                f"a tensor index must be a scalar integer tensor, got a {k.dtype} tensor of "
                f"shape {tuple(k.shape)}; use K.gather to pick several entries"
            )
        return k if k.dtype == "int32" else wrap(_core.cast(k._core, "int32"))
    return convert(np.int32(_int_index(k)))


def _dynamic_indices(t, axis, index):
    """The int32 indices along ``axis`` of ``t`` that an index or a slice (a tuple of
    start, stop, step, each None or a 0-d int32 tensor) reads, computed at run time with
    NumPy's rules: negative values count from the end, slices are clipped to the axis."""

    def const(v):
        return convert(np.int32(v))

    def select(c, a, b):
        return wrap(_core.select(c._core, a._core, b._core))

    def clip(v, lo, hi):
        return wrap(_core.binary("minimum", _core.binary("maximum", v._core, lo._core), hi._core))

    n = wrap(_core.slice(_core.shape_of(t), [(axis, axis + 1, 1)]))
    n = wrap(_core.squeeze(n._core, [0]))
    zero, one, minus_one = const(0), const(1), const(-1)
    if not isinstance(index, tuple):
        return wrap(_core.expand_dims(select(index < 0, index + n, index)._core, [0]))
    start, stop, step = index
    if step is None:
        step = one
    else:
        step = _nonzero_step(step)
    # Python's slice rules for either sign of the step (the step's sign may be known only
    # at run time): bounds below 0 count from the end, then are clipped to [0, n] for a
    # positive step and to [-1, n - 1] for a negative one.
    forward = step > 0
    lo, hi = select(forward, zero, minus_one), select(forward, n, n - 1)
    start = select(forward, zero, n - 1) if start is None else start
    stop = select(forward, n, minus_one) if stop is None else stop
    if index[0] is not None:
        start = clip(select(start < 0, start + n, start), lo, hi)
    if index[1] is not None:
        stop = clip(select(stop < 0, stop + n, stop), lo, hi)
    span = select(forward, stop - start, start - stop)
    magnitude = wrap(_core.unary("abs", step._core))
    count = wrap(_core.binary("maximum", ((span + magnitude - 1) // magnitude)._core, zero._core))
    shape = _core.reshape(count._core, convert(np.array([1], dtype=np.int32))._core)
    iota = _core.scan("cumsum", _core.broadcast_to(one._core, shape), 0, True, False)
    return start + wrap(iota) * step


class _StepCheck:
    """Host callback that passes a slice step through, raising for a zero step."""

    def call(self, arrays):
        if int(arrays[0]) == 0:
            raise ValueError("slice step cannot be zero")
        return [np.array(arrays[0], dtype=np.int32)]

    def vjp(self, arrays, grads):
        return [None]


def _nonzero_step(step):
    if step._core.is_constant():
        if int(np.asarray(_core.evaluate([step._core])[0])) == 0:
            raise ValueError("slice step cannot be zero")
        return step
    return wrap(_core.host_call("slice_step", _StepCheck(), [step._core], [([], "int32")])[0])
