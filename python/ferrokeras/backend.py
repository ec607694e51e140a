"""The Keras backend API (``K``) on the ferrokeras graph engine.

Every function here either builds graph nodes from the primitives in ``ferrokeras._core``
or composes other ``K`` functions; nothing runs until a value is asked for (``eval``,
``get_value``, ``np.asarray`` or a ``function`` call). Signatures follow the Keras backend
documentation; where it is silent, behaviour follows ``tf.keras.backend`` and Keras 2.3.1.
"""

import builtins as _b

import numpy as np

from . import _core
from .config import (
    epsilon,
    floatx,
    get_uid,
    image_data_format,
    manual_variable_initialization,
    normalize_data_format,
    reset_uids,
    set_epsilon,
    set_floatx,
    set_image_data_format,
)
from .tensor import Tensor, TensorShape, Variable, convert, is_tensor, wrap

__all__ = []  # filled at the end of the module

_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


def _dtype(dtype, default=None):
    """Normalises a dtype argument (string, NumPy dtype or type) to one of ``_DTYPES``."""
    if dtype is None:
        dtype = default if default is not None else floatx()
    name = getattr(dtype, "name", None) if not isinstance(dtype, str) else dtype
    if name is None:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise TypeError(f"unknown dtype {dtype!r}; expected one of {_DTYPES}") from None
    if name not in _DTYPES:
        raise TypeError(f"unknown dtype {dtype!r}; expected one of {_DTYPES}")
    return name


def _t(x, like=None):
    return convert(x, like=like)


def _axes(x, axis):
    """``axis`` (None, int or list) as a list of ints for the core."""
    if axis is None:
        return list(range(ndim(x)))
    if isinstance(axis, (list, tuple)):
        return [_int(a, "axis") for a in axis]
    return [_int(axis, "axis")]


def _int(v, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {v!r}")
    return int(v)


# =============================================================== config and session


def backend():
    """Returns the name of the current backend: ``'ferrokeras'``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.backend()
        'ferrokeras'
    """
    return "ferrokeras"


def cast_to_floatx(x):
    """Casts a NumPy array (or number) to the default Keras float type.

    Arguments:
        x: NumPy array or Python number.

    Returns:
        The same array, cast to ``floatx()``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.cast_to_floatx([1, 2]).dtype
        dtype('float32')
    """
    return np.asarray(x, dtype=floatx())


_LEARNING_PHASE = None  # the placeholder, created on first use
_LEARNING_PHASE_VALUE = None  # fixed by set_learning_phase


def learning_phase():
    """Returns the learning phase flag: 0 = test, 1 = train.

    Unless fixed with ``set_learning_phase``, this is a scalar bool placeholder that
    ``function`` callers may feed and that reads 0 when not fed.

    Example:
        >>> from ferrokeras import backend as K
        >>> f = K.function([K.learning_phase()], [K.cast(K.learning_phase(), 'int32')])
        >>> f([1])[0]
        array(1, dtype=int32)
    """
    global _LEARNING_PHASE
    if _LEARNING_PHASE_VALUE is not None:
        return _LEARNING_PHASE_VALUE
    if _LEARNING_PHASE is None:
        core = _core.placeholder("keras_learning_phase", [], "bool", np.array(False))
        _LEARNING_PHASE = Tensor(core, name="keras_learning_phase")
        _LEARNING_PHASE._is_placeholder = True
    return _LEARNING_PHASE


def set_learning_phase(value):
    """Sets the learning phase to a fixed value.

    Arguments:
        value: 0 (test) or 1 (train).

    Raises:
        ValueError: if ``value`` is neither 0 nor 1.
    """
    global _LEARNING_PHASE_VALUE
    if value not in (0, 1):
        raise ValueError(f"set_learning_phase: expected 0 or 1, got {value!r}")
    _LEARNING_PHASE_VALUE = int(value)


def clear_session():
    """Resets uid counters, the learning phase and compiled-plan caches.

    Variables and tensors the caller still holds stay valid.
    """
    global _LEARNING_PHASE, _LEARNING_PHASE_VALUE
    reset_uids()
    _LEARNING_PHASE = None
    _LEARNING_PHASE_VALUE = None


# =============================================================== creation


def variable(value, dtype=None, name=None, constraint=None):
    """Instantiates a variable and returns it.

    Arguments:
        value: NumPy array (or nested list, number, scipy.sparse matrix), initial value.
        dtype: Tensor type; defaults to ``floatx()``.
        name: Optional name string for the variable.
        constraint: Optional projection function applied after an optimizer update.

    Returns:
        A variable instance.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> kvar = K.variable(value=np.array([[1, 2], [3, 4]]), dtype='float64', name='example_var')
        >>> K.dtype(kvar)
        'float64'
        >>> K.eval(kvar)
        array([[1., 2.],
               [3., 4.]])
    """
    dtype = _dtype(dtype)
    if isinstance(value, Tensor):
        value = eval(value)
    if hasattr(value, "toarray"):
        value = value.toarray()
    arr = np.array(value, dtype=dtype, copy=True, order="C")
    if name is None:
        name = f"variable_{get_uid('variable')}"
    return Variable(arr, name, constraint=constraint)


def constant(value, dtype=None, shape=None, name=None):
    """Creates a constant tensor.

    Arguments:
        value: A constant value (or list).
        dtype: The type of the elements of the resulting tensor; defaults to ``floatx()``.
        shape: Optional dimensions of resulting tensor; a scalar ``value`` is filled in.
        name: Optional name for the tensor.

    Returns:
        A constant tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.constant(2.0, shape=(2,)))
        array([2., 2.], dtype=float32)
    """
    dtype = _dtype(dtype)
    if isinstance(value, Tensor):
        value = eval(value)
    arr = np.asarray(value, dtype=dtype)
    if shape is not None:
        shape = tuple(shape)
        if arr.size == 1:
            arr = np.full(shape, arr.reshape(()), dtype=dtype)
        else:
            arr = arr.reshape(shape)
    return wrap(_core.constant(np.ascontiguousarray(arr)), name=name)


def placeholder(shape=None, ndim=None, dtype=None, sparse=False, name=None):
    """Instantiates a placeholder tensor and returns it.

    Arguments:
        shape: Shape of the placeholder (tuple of ints, may include ``None`` entries).
        ndim: Number of axes of the tensor, used when ``shape`` is not given.
        dtype: Placeholder type; defaults to ``floatx()``.
        sparse: Boolean, whether the placeholder should have a sparse type.
        name: Optional name string for the placeholder.

    Returns:
        Tensor instance (with Keras metadata included).

    Example:
        >>> from ferrokeras import backend as K
        >>> input_ph = K.placeholder(shape=(2, 4, 5))
        >>> input_ph.shape
        (2, 4, 5)
    """
    dtype = _dtype(dtype)
    if shape is None:
        if ndim is None:
            raise ValueError("placeholder: specify `shape` or `ndim`")
        shape = (None,) * _int(ndim, "ndim")
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(None if d is None else _int(d, "shape entry") for d in shape)
    if _b.any(d is not None and d < 0 for d in shape):
        raise ValueError(f"placeholder: negative dimension in shape {shape}")
    if name is None:
        name = f"placeholder_{get_uid('placeholder')}"
    t = Tensor(_core.placeholder(name, list(shape), dtype, None), name=name)
    t._is_placeholder = True
    t._keras_shape = shape
    t._uses_learning_phase = False
    t._is_sparse = bool(sparse)
    return t


def is_placeholder(x):
    """Returns whether ``x`` is a placeholder.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.is_placeholder(K.placeholder(shape=(2,)))
        True
    """
    return bool(getattr(x, "_is_placeholder", False))


def is_sparse(tensor):
    """Returns whether a tensor is a sparse tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.is_sparse(K.placeholder((2, 2), sparse=True))
        True
    """
    return bool(getattr(tensor, "_is_sparse", False))


def is_keras_tensor(x):
    """Returns whether ``x`` is a Keras tensor (the output of a Keras layer or ``Input``).

    Raises:
        ValueError: if ``x`` is not a symbolic tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> K.is_keras_tensor(K.placeholder(shape=(2,)))
        False
    """
    if not is_tensor(x):
        raise ValueError(
            f"Unexpectedly found an instance of type `{type(x)}`. Expected a symbolic tensor instance."
        )
    return hasattr(x, "_keras_history")


def _filled_variable(shape, fill, dtype, name):
    dtype = _dtype(dtype)
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    return variable(np.full(tuple(shape), fill, dtype=dtype), dtype=dtype, name=name)


def zeros(shape, dtype=None, name=None):
    """Instantiates an all-zeros variable and returns it.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.zeros((2, 3)))
        array([[0., 0., 0.],
               [0., 0., 0.]], dtype=float32)
    """
    return _filled_variable(shape, 0, dtype, name)


def ones(shape, dtype=None, name=None):
    """Instantiates an all-ones variable and returns it.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.ones((2, 2)))
        array([[1., 1.],
               [1., 1.]], dtype=float32)
    """
    return _filled_variable(shape, 1, dtype, name)


def eye(size, dtype=None, name=None):
    """Instantiate an identity matrix variable; ``size`` is an int or a ``(rows, cols)`` tuple.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.eye(2))
        array([[1., 0.],
               [0., 1.]], dtype=float32)
    """
    dtype = _dtype(dtype)
    n, m = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    return variable(np.eye(n, m, dtype=dtype), dtype=dtype, name=name)


def zeros_like(x, dtype=None, name=None):
    """Instantiates an all-zeros tensor of the same shape as ``x`` (dtype defaults to ``x``'s).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.zeros_like(K.ones((2, 3))))
        array([[0., 0., 0.],
               [0., 0., 0.]], dtype=float32)
    """
    x = _t(x)
    dtype = _dtype(dtype, x.dtype)
    return wrap(_core.broadcast_to(_t(np.zeros((), dtype=dtype))._core, _core.shape_of(x._core)), name=name)


def ones_like(x, dtype=None, name=None):
    """Instantiates an all-ones tensor of the same shape as ``x`` (dtype defaults to ``x``'s).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.ones_like(K.zeros((2,))))
        array([1., 1.], dtype=float32)
    """
    x = _t(x)
    dtype = _dtype(dtype, x.dtype)
    return wrap(_core.broadcast_to(_t(np.ones((), dtype=dtype))._core, _core.shape_of(x._core)), name=name)


def identity(x, name=None):
    """Returns a tensor with the same content as the input tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.identity(K.ones((1,))))
        array([1.], dtype=float32)
    """
    x = _t(x)
    return Tensor(x._core, name=name)


def random_uniform_variable(shape, low, high, dtype=None, name=None, seed=None):
    """Instantiates a variable with values drawn from a uniform distribution.

    Arguments:
        shape: Tuple of integers, shape of returned variable.
        low: Float, lower boundary of the output interval.
        high: Float, upper boundary of the output interval.
        dtype: String, dtype of returned variable.
        name: String, name of returned variable.
        seed: Integer, random seed.

    Example:
        >>> from ferrokeras import backend as K
        >>> kvar = K.random_uniform_variable((2, 3), 0, 1, seed=1)
        >>> K.int_shape(kvar)
        (2, 3)
    """
    rng = np.random.default_rng(seed)
    return variable(rng.uniform(low, high, size=tuple(shape)), dtype=dtype, name=name)


def random_normal_variable(shape, mean, scale, dtype=None, name=None, seed=None):
    """Instantiates a variable with values drawn from a normal distribution.

    Arguments:
        shape: Tuple of integers, shape of returned variable.
        mean: Float, mean of the normal distribution.
        scale: Float, standard deviation of the normal distribution.
        dtype: String, dtype of returned variable.
        name: String, name of returned variable.
        seed: Integer, random seed.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.random_normal_variable((2, 3), 0, 1, seed=1))
        (2, 3)
    """
    rng = np.random.default_rng(seed)
    return variable(rng.normal(mean, scale, size=tuple(shape)), dtype=dtype, name=name)


# =============================================================== introspection


def is_variable(x):
    """Returns whether ``x`` is a ferrokeras variable."""
    return isinstance(x, Variable)


def count_params(x):
    """Returns the static number of elements in a variable or tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.count_params(K.zeros((2, 3)))
        6
    """
    shape = int_shape(x)
    if shape is None or _b.any(d is None for d in shape):
        raise ValueError(f"count_params: the shape {shape} of {getattr(x, 'name', x)!r} is not fully known")
    return int(np.prod(shape, dtype=np.int64))


def int_shape(x):
    """Returns the shape of a tensor or array as a tuple of ints or ``None`` entries.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.placeholder(shape=(2, 4, 5)))
        (2, 4, 5)
    """
    if isinstance(x, Tensor):
        return tuple(x.shape)
    if hasattr(x, "shape"):
        return tuple(x.shape)
    return None


def shape(x):
    """Returns the symbolic shape of a tensor: a 1-D int32 tensor evaluated at run time.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.shape(K.zeros((2, 3))))
        array([2, 3], dtype=int32)
    """
    return wrap(_core.shape_of(_t(x)._core))


def ndim(x):
    """Returns the number of axes in a tensor, as an integer.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.ndim(K.placeholder(shape=(2, 4, 5)))
        3
    """
    if isinstance(x, Tensor):
        return x.ndim
    return np.ndim(x)


def dtype(x):
    """Returns the dtype of a Keras tensor or variable, as a string.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.dtype(K.placeholder(shape=(2, 4, 5), dtype='float64'))
        'float64'
    """
    if isinstance(x, Tensor):
        return x.dtype
    return np.asarray(x).dtype.name


def cast(x, dtype):
    """Casts a tensor to a different dtype and returns it.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.dtype(K.cast(K.placeholder((2, 3)), 'float16'))
        'float16'
    """
    x = _t(x)
    return wrap(_core.cast(x._core, _dtype(dtype)))


# =============================================================== evaluation and variables


def eval(x):
    """Evaluates the value of a tensor or variable and returns a NumPy array.

    Raises:
        ValueError: if the value depends on a placeholder (which cannot be fed here).

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> K.eval(K.variable(np.array([[1, 2], [3, 4]]), dtype='float32'))
        array([[1., 2.],
               [3., 4.]], dtype=float32)
    """
    if isinstance(x, Variable):
        return x.get_value()
    if isinstance(x, _Update):
        _core.Function([], [], [(x._target._core, x._core)])([])
        return x._target.get_value()
    return np.asarray(_core.evaluate([_t(x)._core])[0])


def get_value(x):
    """Returns the value of a variable (or tensor) as a NumPy array.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.get_value(K.ones((2,)))
        array([1., 1.], dtype=float32)
    """
    if isinstance(x, Variable):
        return x.get_value()
    return eval(x)


def batch_get_value(ops):
    """Returns the values of several tensors or variables, as a list of NumPy arrays."""
    ops = list(ops)
    out = [None] * len(ops)
    rest = []
    for i, o in enumerate(ops):
        if isinstance(o, Variable):
            out[i] = o.get_value()
        else:
            rest.append(i)
    if rest:
        vals = _core.evaluate([_t(ops[i])._core for i in rest])
        for i, v in zip(rest, vals):
            out[i] = v
    return out


def set_value(x, value):
    """Sets the value of a variable from a NumPy array.

    Raises:
        ValueError: if the shapes differ; TypeError if ``x`` is not a variable.

    Example:
        >>> from ferrokeras import backend as K
        >>> v = K.zeros((2,)); K.set_value(v, [1, 2]); K.get_value(v)
        array([1., 2.], dtype=float32)
    """
    if not isinstance(x, Variable):
        raise TypeError(f"set_value: expected a variable, got {type(x).__name__}")
    x.set_value(value)


def batch_set_value(tuples):
    """Sets the values of many variables at once, from ``(variable, value)`` pairs."""
    for x, value in tuples:
        set_value(x, value)


class _Update(Tensor):
    """The result of ``update``: the new value, remembered as an assignment to ``_target``."""

    def __init__(self, target, value):
        super().__init__(value._core, name=f"{target.name}/update")
        self._target = target


def _update_target(x, fn):
    if not isinstance(x, Variable):
        raise TypeError(f"{fn}: expected a variable to update, got {type(x).__name__}")
    return x


def update(x, new_x):
    """Update the value of ``x`` to ``new_x`` when the returned op runs (in ``function``
    updates, or through ``eval``).

    Returns:
        The variable ``x`` updated (as an update op).

    Example:
        >>> from ferrokeras import backend as K
        >>> v = K.zeros((2,))
        >>> f = K.function([], [], updates=[K.update(v, v + 1)])
        >>> _ = f([]); K.get_value(v)
        array([1., 1.], dtype=float32)
    """
    x = _update_target(x, "update")
    new_x = _t(new_x, like=x)
    if new_x.dtype != x.dtype:
        new_x = cast(new_x, x.dtype)
    return _Update(x, new_x)


def update_add(x, increment):
    """Update the value of ``x`` by adding ``increment``."""
    x = _update_target(x, "update_add")
    return update(x, x + _t(increment, like=x))


def update_sub(x, decrement):
    """Update the value of ``x`` by subtracting ``decrement``."""
    x = _update_target(x, "update_sub")
    return update(x, x - _t(decrement, like=x))


def moving_average_update(x, value, momentum):
    """Compute the moving average of a variable: ``x = x * momentum + value * (1 - momentum)``."""
    x = _update_target(x, "moving_average_update")
    value = _t(value, like=x)
    return update(x, x * momentum + value * (1.0 - momentum))


# =============================================================== function and gradients


def _flatten(items):
    for it in items:
        if isinstance(it, (list, tuple)) and not (len(it) == 2 and isinstance(it[0], Variable)):
            yield from _flatten(it)
        else:
            yield it


class Function:
    """A compiled computation: feeds ``inputs``, returns ``outputs`` as NumPy arrays, and
    applies ``updates`` after computing everything from the pre-call values."""

    def __init__(self, inputs, outputs, updates=None, name=None):
        self.inputs = list(inputs)
        self._single = not isinstance(outputs, (list, tuple))
        self.outputs = [outputs] if self._single else list(outputs)
        for t in self.inputs:
            if not isinstance(t, Tensor):
                raise TypeError(f"function: inputs must be tensors (placeholders), got {type(t).__name__}")
        outs = [_t(o) for o in self.outputs]
        pairs = []
        for u in _flatten(updates or []):
            if isinstance(u, _Update):
                pairs.append((u._target._core, u._core))
            elif isinstance(u, (list, tuple)) and len(u) == 2:
                target = _update_target(u[0], "function")
                val = update(target, u[1])
                pairs.append((target._core, val._core))
            else:
                raise TypeError(f"function: an update must be an (variable, new_value) pair or K.update(...), got {u!r}")
        self.name = name
        self._dtypes = [np.dtype(t.dtype) for t in self.inputs]
        self._f = _core.Function([t._core for t in self.inputs], [o._core for o in outs], pairs)

    def __call__(self, inputs=()):
        if isinstance(inputs, dict):
            inputs = [inputs[t] for t in self.inputs]
        if not isinstance(inputs, (list, tuple)):
            raise TypeError(f"function: call with a list of input values, got {type(inputs).__name__}")
        if len(inputs) != len(self.inputs):
            raise ValueError(f"function expects {len(self.inputs)} input values, got {len(inputs)}")
        arrs = []
        for t, v, dt in zip(self.inputs, inputs, self._dtypes):
            if hasattr(v, "toarray"):
                v = v.toarray()
            arr = np.asarray(v)
            if arr.dtype != dt:
                if arr.dtype.kind == "f" and dt.kind in "iub" and arr.size and not np.all(np.mod(arr, 1) == 0):
                    raise TypeError(f"cannot feed non-integer values to '{t.name}', which has dtype {dt.name}")
                arr = arr.astype(dt)
            arrs.append(arr)
        out = self._f(arrs)
        return out[0] if self._single else out

    @property
    def dispatches(self):
        """Kernel launches one call performs (folded constants excluded)."""
        return self._f.dispatches


def function(inputs, outputs, updates=None, name=None, **kwargs):
    """Instantiates a Keras function.

    Arguments:
        inputs: List of placeholder tensors.
        outputs: List of output tensors.
        updates: List of update ops (``K.update(...)``) or ``(variable, new_value)`` pairs.
        name: String, name of the function.
        **kwargs: Not supported; any keyword raises ``ValueError``.

    Returns:
        A callable: given a list of NumPy arrays, one per input, it returns the list of
        output values as NumPy arrays. Outputs and update values are all computed from the
        values before the call; the updates are then assigned together.

    Raises:
        ValueError: if invalid kwargs are passed in.
        TypeError: if ``inputs`` is not a list or tuple.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> x = K.placeholder(shape=(None, 2))
        >>> f = K.function([x], [x * 2])
        >>> f([np.ones((1, 2))])[0]
        array([[2., 2.]], dtype=float32)
    """
    if kwargs:
        raise ValueError(f"Invalid argument(s) {sorted(kwargs)} passed to K.function: it takes inputs, outputs, updates and name")
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"K.function: `inputs` must be a list or tuple of placeholders, got {type(inputs).__name__}")
    return Function(inputs, outputs, updates=updates, name=name)


def gradients(loss, variables):
    """Returns the gradients of ``loss`` with respect to ``variables``.

    Arguments:
        loss: Scalar tensor to minimize (a non-scalar loss is summed).
        variables: List of variables (or tensors).

    Returns:
        A list of gradient tensors, ``None`` where ``loss`` does not depend on a variable.
        The gradients are graph tensors, so they can be differentiated again.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.variable(3.0)
        >>> K.eval(K.gradients(x * x, [x])[0])
        array(6., dtype=float32)
    """
    single = not isinstance(variables, (list, tuple))
    vs = [variables] if single else list(variables)
    loss = _t(loss)
    gs = _core.gradients(loss._core, [_t(v)._core for v in vs])
    out = [None if g is None else wrap(g) for g in gs]
    return out[0] if single else out


def stop_gradient(variables):
    """Returns ``variables`` with gradients stopped: a tensor or a list of tensors whose
    gradient with respect to everything is zero."""
    if isinstance(variables, (list, tuple)):
        return [stop_gradient(v) for v in variables]
    return wrap(_core.stop_gradient(_t(variables)._core))


# =============================================================== elementwise math


def _unary(name, x):
    return wrap(_core.unary(name, _t(x)._core))


def _bin(name, x, y):
    if not isinstance(x, Tensor):
        x = _t(x, like=y if isinstance(y, Tensor) else None)
    y = _t(y, like=x)
    return wrap(_core.binary(name, x._core, y._core))


def abs(x):
    """Element-wise absolute value."""
    return _unary("abs", x)


def square(x):
    """Element-wise square."""
    return _unary("square", x)


def sqrt(x):
    """Element-wise square root; negative inputs are clipped to 0 first (as Keras 2.3.1)."""
    x = _t(x)
    return _unary("sqrt", _bin("maximum", x, 0.0))


def exp(x):
    """Element-wise exponential."""
    return _unary("exp", x)


def log(x):
    """Element-wise natural log."""
    return _unary("log", x)


def sign(x):
    """Element-wise sign: -1, 0 or 1."""
    return _unary("sign", x)


def round(x):
    """Element-wise rounding to the closest integer; ties round half to even."""
    return _unary("round", x)


def sin(x):
    """Computes sin of x element-wise."""
    return _unary("sin", x)


def cos(x):
    """Computes cos of x element-wise."""
    return _unary("cos", x)


def tanh(x):
    """Element-wise tanh."""
    return _unary("tanh", x)


def sigmoid(x):
    """Element-wise sigmoid, stable for inputs of any magnitude."""
    return _unary("sigmoid", x)


def pow(x, a):
    """Element-wise exponentiation ``x ** a``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.pow(K.constant([2.0, 3.0]), 2))
        array([4., 9.], dtype=float32)
    """
    return _bin("pow", x, a)


def clip(x, min_value, max_value):
    """Element-wise value clipping to ``[min_value, max_value]``.

    ``max_value`` below ``min_value`` is raised to it, and ``None`` bounds mean unbounded.
    """
    x = _t(x)
    if min_value is None:
        min_value = -np.inf
    if max_value is None:
        max_value = np.inf
    if not is_tensor(min_value) and not is_tensor(max_value) and max_value < min_value:
        max_value = min_value
    return _bin("minimum", _bin("maximum", x, min_value), max_value)


def maximum(x, y):
    """Element-wise maximum of two tensors."""
    return _bin("maximum", x, y)


def minimum(x, y):
    """Element-wise minimum of two tensors."""
    return _bin("minimum", x, y)


def equal(x, y):
    """Element-wise equality between two tensors; returns a bool tensor."""
    return _bin("equal", x, y)


def not_equal(x, y):
    """Element-wise inequality between two tensors; returns a bool tensor."""
    return _bin("not_equal", x, y)


def greater(x, y):
    """Element-wise truth value of (x > y); returns a bool tensor."""
    return _bin("greater", x, y)


def greater_equal(x, y):
    """Element-wise truth value of (x >= y); returns a bool tensor."""
    return _bin("greater_equal", x, y)


def less(x, y):
    """Element-wise truth value of (x < y); returns a bool tensor."""
    return _bin("less", x, y)


def less_equal(x, y):
    """Element-wise truth value of (x <= y); returns a bool tensor."""
    return _bin("less_equal", x, y)


# =============================================================== reductions


def _reduce(name, x, axis, keepdims):
    x = _t(x)
    return wrap(_core.reduce(name, x._core, _axes(x, axis), bool(keepdims)))


def sum(x, axis=None, keepdims=False):
    """Sum of the values in a tensor, alongside the specified axis (None: all axes).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.sum(K.ones((2, 3)), axis=1))
        array([3., 3.], dtype=float32)
    """
    return _reduce("sum", x, axis, keepdims)


def prod(x, axis=None, keepdims=False):
    """Multiplies the values in a tensor, alongside the specified axis."""
    return _reduce("prod", x, axis, keepdims)


def max(x, axis=None, keepdims=False):
    """Maximum value in a tensor, alongside the specified axis."""
    return _reduce("max", x, axis, keepdims)


def min(x, axis=None, keepdims=False):
    """Minimum value in a tensor, alongside the specified axis."""
    return _reduce("min", x, axis, keepdims)


def mean(x, axis=None, keepdims=False):
    """Mean of a tensor, alongside the specified axis (bool inputs are cast to floatx)."""
    x = _t(x)
    if x.dtype == "bool":
        x = cast(x, floatx())
    return _reduce("mean", x, axis, keepdims)


def var(x, axis=None, keepdims=False):
    """Variance of a tensor, alongside the specified axis."""
    x = _t(x)
    if x.dtype == "bool":
        x = cast(x, floatx())
    m = mean(x, axis, keepdims=True)
    return mean(square(x - m), axis, keepdims)


def std(x, axis=None, keepdims=False):
    """Standard deviation of a tensor, alongside the specified axis."""
    return _unary("sqrt", var(x, axis, keepdims))


def any(x, axis=None, keepdims=False):
    """Bitwise reduction (logical OR); returns a bool tensor."""
    x = _t(x)
    if x.dtype != "bool":
        x = not_equal(x, 0)
    return _reduce("max", x, axis, keepdims)


def all(x, axis=None, keepdims=False):
    """Bitwise reduction (logical AND); returns a bool tensor."""
    x = _t(x)
    if x.dtype != "bool":
        x = not_equal(x, 0)
    return _reduce("min", x, axis, keepdims)


def argmax(x, axis=-1):
    """Returns the index of the maximum value along an axis (int64)."""
    return wrap(_core.arg("argmax", _t(x)._core, _int(axis, "axis")))


def argmin(x, axis=-1):
    """Returns the index of the minimum value along an axis (int64)."""
    return wrap(_core.arg("argmin", _t(x)._core, _int(axis, "axis")))


def logsumexp(x, axis=None, keepdims=False):
    """Computes ``log(sum(exp(x)))`` along the axis, stable for inputs of any magnitude.

    Example:
        >>> from ferrokeras import backend as K
        >>> float(K.eval(K.logsumexp(K.constant([1e4, 1e4]))))
        10000.693...
    """
    x = _t(x)
    m = stop_gradient(max(x, axis, keepdims=True))
    m = wrap(_core.select(_bin("less", abs(m), np.inf)._core, m._core, zeros_like(m)._core))
    s = log(sum(exp(x - m), axis, keepdims=True)) + m
    if not keepdims:
        s = wrap(_core.squeeze(s._core, _axes(x, axis)))
    return s


def cumsum(x, axis=0):
    """Cumulative sum of the values in a tensor, alongside the specified axis."""
    return wrap(_core.scan("cumsum", _t(x)._core, _int(axis, "axis"), False, False))


def cumprod(x, axis=0):
    """Cumulative product of the values in a tensor, alongside the specified axis."""
    return wrap(_core.scan("cumprod", _t(x)._core, _int(axis, "axis"), False, False))


# =============================================================== linear algebra and layout


def _shape_tensor(parts):
    """A 1-D int32 shape tensor from a list of ints and scalar int tensors."""
    pieces = []
    consts = []
    for p in parts:
        if isinstance(p, Tensor):
            if consts:
                pieces.append(_core.constant(np.asarray(consts, dtype=np.int32)))
                consts = []
            q = p if p.dtype == "int32" else cast(p, "int32")
            pieces.append(_core.reshape(q._core, _core.constant(np.asarray([1], dtype=np.int32))))
        else:
            consts.append(int(p))
    if consts or not pieces:
        pieces.append(_core.constant(np.asarray(consts, dtype=np.int32)))
    return pieces[0] if len(pieces) == 1 else _core.concat(pieces, 0)


def _dims(x):
    """``x``'s shape as a list: ints where static, scalar tensors where only known at run time."""
    st = x.shape
    if _b.all(d is not None for d in st):
        return list(st)
    dyn = shape(x)
    return [d if d is not None else dyn[i] for i, d in enumerate(st)]


def _reshape(x, parts):
    return wrap(_core.reshape(x._core, _shape_tensor(parts)))


def _matmul(x, y):
    if x.ndim == 1 or y.ndim == 1:
        return dot(x, y)
    return wrap(_core.matmul(x._core, y._core, False, False))


def dot(x, y):
    """Multiplies 2 tensors (and/or variables) and returns a tensor.

    For N-d inputs, contracts the last axis of ``x`` with the second-to-last of ``y``
    (the Theano / Keras rule): ``(2, 3) . (4, 3, 5) -> (2, 4, 5)``.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.placeholder(shape=(32, 28, 3)); y = K.placeholder(shape=(3, 4))
        >>> K.int_shape(K.dot(x, y))
        (32, 28, 4)
    """
    x, y = _t(x), _t(y)
    if x.dtype != y.dtype:
        raise TypeError(f"dot: operands have different dtypes {x.dtype} and {y.dtype}")
    if x.ndim == 0 or y.ndim == 0:
        return x * y
    if x.ndim == 1 and y.ndim == 1:
        return sum(x * y)
    if x.ndim == 1:
        return wrap(_core.squeeze(dot(expand_dims(x, 0), y)._core, [0]))
    if y.ndim == 1:
        return wrap(_core.squeeze(dot(x, expand_dims(y, 1))._core, [-1]))
    xs, ys = x.shape, y.shape
    if xs[-1] is not None and ys[-2] is not None and xs[-1] != ys[-2]:
        raise ValueError(f"dot: shapes {tuple(xs)} and {tuple(ys)} are incompatible: {xs[-1]} != {ys[-2]}")
    if x.ndim == 2 and y.ndim == 2:
        return wrap(_core.matmul(x._core, y._core, False, False))
    xd, yd = _dims(x), _dims(y)
    xt = _reshape(x, [-1, xd[-1]])
    perm = [y.ndim - 2] + [i for i in range(y.ndim) if i != y.ndim - 2]
    yt = _reshape(permute_dimensions(y, perm), [yd[-2], -1])
    out = wrap(_core.matmul(xt._core, yt._core, False, False))
    return _reshape(out, xd[:-1] + yd[:-2] + yd[-1:])


def batch_dot(x, y, axes=None):
    """Batchwise dot product (the Keras 2.3.1 rule).

    ``batch_dot`` computes the dot product of ``x`` and ``y`` for each sample of the batch;
    ``axes`` names the dimensions to contract (an int means the same axis for both).

    Example:
        >>> from ferrokeras import backend as K
        >>> x_batch = K.ones(shape=(32, 20, 1)); y_batch = K.ones(shape=(32, 30, 20))
        >>> K.int_shape(K.batch_dot(x_batch, y_batch, axes=(1, 2)))
        (32, 1, 30)
    """
    x, y = _t(x), _t(y)
    x_ndim, y_ndim = x.ndim, y.ndim
    if x_ndim < 2 or y_ndim < 2:
        raise ValueError(f"batch_dot: inputs must have rank >= 2, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    xb, yb = x.shape[0], y.shape[0]
    if xb is not None and yb is not None and xb != yb:
        raise ValueError(f"batch_dot: batch sizes differ: {tuple(x.shape)} and {tuple(y.shape)}")
    if isinstance(axes, (int, np.integer)):
        axes = [int(axes), int(axes)]
    if axes is None:
        axes = [x_ndim - 1, y_ndim - 1] if y_ndim == 2 else [x_ndim - 1, y_ndim - 2]
    axes = list(axes)
    if len(axes) != 2 or _b.any(isinstance(a, (list, tuple)) for a in axes):
        raise ValueError(f"batch_dot: axes must be an int or a pair of ints, got {axes!r}")
    a0, a1 = _int(axes[0], "axes"), _int(axes[1], "axes")
    a0 = a0 + x_ndim if a0 < 0 else a0
    a1 = a1 + y_ndim if a1 < 0 else a1
    if not (0 <= a0 < x_ndim and 0 <= a1 < y_ndim):
        raise ValueError(f"batch_dot: axes {axes} out of range for shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if a0 == 0 or a1 == 0:
        raise ValueError("batch_dot: cannot contract over axis 0, the batch axis")
    d1, d2 = x.shape[a0], y.shape[a1]
    if d1 is not None and d2 is not None and d1 != d2:
        raise ValueError(
            f"batch_dot: cannot contract axis {a0} of shape {tuple(x.shape)} with axis {a1} of shape {tuple(y.shape)} ({d1} != {d2})"
        )
    orig_x_ndim, orig_y_ndim = x_ndim, y_ndim
    if x_ndim == 2:
        x, a0, x_ndim = expand_dims(x, 1), a0 + 1, 3
    if y_ndim == 2:
        y, y_ndim = expand_dims(y, 2), 3
    # x's contracted axis goes last, y's to axis 1; then both are squashed to rank 3.
    if a0 != x_ndim - 1:
        x = permute_dimensions(x, [i for i in range(x_ndim) if i != a0] + [a0])
    if a1 != 1:
        y = permute_dimensions(y, [0, a1] + [i for i in range(1, y_ndim) if i != a1])
    xd, yd = _dims(x), _dims(y)
    if x_ndim > 3:
        x = _reshape(x, [xd[0], -1, xd[-1]])
    if y_ndim > 3:
        y = _reshape(y, [yd[0], yd[1], -1])
    out = wrap(_core.matmul(x._core, y._core, False, False))
    if x_ndim > 3 or y_ndim > 3:
        od = _dims(out)
        mid = xd[1:-1] if x_ndim > 3 else [od[1]]
        tail = yd[2:] if y_ndim > 3 else [od[2]]
        out = _reshape(out, [od[0]] + mid + tail)
    if orig_x_ndim == 2:
        out = wrap(_core.squeeze(out._core, [1]))
    elif orig_y_ndim == 2:
        out = wrap(_core.squeeze(out._core, [-1]))
    return out


def transpose(x):
    """Transposes a tensor (reverses its axes) and returns it.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.transpose(K.placeholder((2, 3))))
        (3, 2)
    """
    x = _t(x)
    return permute_dimensions(x, list(range(x.ndim))[::-1])


def permute_dimensions(x, pattern):
    """Permutes axes in a tensor; ``pattern`` is a tuple of dimension indices, e.g. ``(0, 2, 1)``."""
    x = _t(x)
    return wrap(_core.transpose(x._core, [_int(p, "pattern entry") for p in pattern]))


def expand_dims(x, axis=-1):
    """Adds a 1-sized dimension at index ``axis``."""
    x = _t(x)
    axis = _int(axis, "axis")
    r = x.ndim + 1
    if not -r <= axis < r:
        raise ValueError(f"expand_dims: axis {axis} is out of range for a result of rank {r}")
    return wrap(_core.expand_dims(x._core, [axis % r]))


def reshape(x, shape):
    """Reshapes a tensor to the specified shape (one entry may be -1; entries may be
    scalar int tensors such as ``K.shape(x)[0]``)."""
    x = _t(x)
    if isinstance(shape, Tensor):
        return wrap(_core.reshape(x._core, cast(shape, "int32")._core if shape.dtype != "int32" else shape._core))
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    return _reshape(x, list(shape))


def concatenate(tensors, axis=-1):
    """Concatenates a list of tensors alongside the specified axis."""
    ts = [_t(t) for t in tensors]
    return wrap(_core.concat([t._core for t in ts], _int(axis, "axis")))


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("np",)]
