"""Creating tensors and variables, introspection, evaluation and assignment."""

import builtins as _b

import numpy as np

from .. import _core
from ..config import get_uid
from ..tensor import Tensor, Variable, check_numeric, is_tensor, wrap
from .common import _dtype, _int, _t
from .shapes import _shape_arg


def _as_array(fn, value, dtype, **kw):
    """``np.array(value, dtype)``, with NumPy's OverflowError for a Python number that does
    not fit the dtype raised as a ValueError."""
    try:
        check_numeric(fn, value, dtype)
        return np.array(value, dtype=dtype, **kw)
    except OverflowError as e:
        raise ValueError(f"{fn}: {value!r} does not fit in dtype {dtype}: {e}") from None


def variable(value, dtype=None, name=None, constraint=None):
    """Instantiates a variable and returns it.

    Arguments:
        value: NumPy array (or nested list, number, scipy.sparse matrix), initial value.
            A scipy.sparse value is stored dense and the variable is flagged sparse
            (``is_sparse`` is True).
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
    sparse = hasattr(value, "toarray")
    if sparse:
        value = value.toarray()
    arr = _as_array("variable", value, dtype, copy=True, order="C")
    if name is None:
        name = f"variable_{get_uid('variable')}"
    v = Variable(arr, name, constraint=constraint)
    if sparse:
        v._is_sparse = True  # stored dense, flagged sparse for `is_sparse` (as TF keeps it)
    return v


def constant(value, dtype=None, shape=None, name=None):
    """Creates a constant tensor.

    Arguments:
        value: A constant value (or list).
        dtype: The type of the elements of the resulting tensor; defaults to ``floatx()``.
        shape: Optional dimensions of resulting tensor; a scalar ``value`` is filled in
            (entries may then be scalar int tensors, such as ``K.shape(x)[0]``).
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
    arr = _as_array("constant", value, dtype)
    if shape is not None and _has_tensor(shape):
        if arr.size != 1:
            raise ValueError(
                f"constant: a shape with tensors in it needs a scalar value, got shape {arr.shape}"
            )
        return _filled(shape, arr.reshape(()), dtype, name, "constant")
    if shape is not None:
        shape = tuple(shape)
        if arr.size == 1:
            arr = np.full(shape, arr.reshape(()), dtype=dtype)
        else:
            arr = arr.reshape(shape)
    return wrap(_core.constant(np.array(arr, order="C")), name=name)


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
        ndim = _int(ndim, "ndim")
        if ndim < 0:
            raise ValueError(f"placeholder: ndim must be non-negative, got {ndim}")
        shape = (None,) * ndim
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


def _has_tensor(shape):
    return isinstance(shape, Tensor) or (
        isinstance(shape, (list, tuple)) and _b.any(isinstance(d, Tensor) for d in shape)
    )


def _filled(shape, fill, dtype, name, fn):
    """``fill`` broadcast to ``shape``, which holds scalar int tensors (or is a 1-D or a
    0-d int tensor)."""

    if isinstance(shape, Tensor) and shape.ndim == 0:
        shape = (shape,)
    fill = fill if isinstance(fill, Tensor) else _t(np.full((), fill, dtype=dtype))
    return wrap(_core.broadcast_to(fill._core, _shape_arg(shape, fn)), name=name)


def _tensor_or_variable(t, dtype, name):
    """A tensor built from a shape with tensors in it: a variable of its value where its
    size is static, as TensorFlow makes one, else the tensor."""
    if _b.any(d is None for d in t.shape):
        return t
    return variable(eval(t), dtype=dtype, name=name)


def _static_shape(shape, fn):
    """``shape`` as a tuple of non-negative ints, for a variable (whose shape is static)."""
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    if _has_tensor(shape):
        raise TypeError(
            f"{fn}: shape must be a tuple of ints (a variable's shape is static), got {shape!r}"
        )
    if not isinstance(shape, (list, tuple, np.ndarray)):
        raise TypeError(f"{fn}: shape must be a tuple of ints, got {type(shape).__name__}")
    shape = tuple(_int(d, f"{fn}: shape entry") for d in shape)
    if _b.any(d < 0 for d in shape):
        raise ValueError(f"{fn}: negative dimension in shape {shape}")
    return shape


def _filled_variable(shape, fill, dtype, name, fn):
    dtype = _dtype(dtype)
    if _has_tensor(shape):
        return _tensor_or_variable(_filled(shape, fill, dtype, name, fn), dtype, name)
    return variable(np.full(_static_shape(shape, fn), fill, dtype=dtype), dtype=dtype, name=name)


def zeros(shape, dtype=None, name=None):
    """Instantiates an all-zeros variable and returns it.

    Arguments:
        shape: Tuple of integers, shape of returned variable. Entries may be scalar int
            tensors (``K.shape(x)[0]``), or the shape a 1-D int tensor; when a size is
            then known only at run time the result is a tensor, not a variable (as in
            TensorFlow).
        dtype: String, data type of returned variable (default ``floatx()``).
        name: String, name of returned variable.

    Returns:
        A variable (including Keras metadata), filled with ``0.0``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.zeros((2, 3)))
        array([[0., 0., 0.],
               [0., 0., 0.]], dtype=float32)
    """
    return _filled_variable(shape, 0, dtype, name, "zeros")


def ones(shape, dtype=None, name=None):
    """Instantiates an all-ones variable and returns it.

    Arguments:
        shape: Tuple of integers, shape of returned variable. Entries may be scalar int
            tensors (``K.shape(x)[0]``), or the shape a 1-D int tensor; when a size is
            then known only at run time the result is a tensor, not a variable (as in
            TensorFlow).
        dtype: String, data type of returned variable (default ``floatx()``).
        name: String, name of returned variable.

    Returns:
        A variable (including Keras metadata), filled with ``1.0``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.ones((2, 2)))
        array([[1., 1.],
               [1., 1.]], dtype=float32)
    """
    return _filled_variable(shape, 1, dtype, name, "ones")


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
    return wrap(
        _core.broadcast_to(_t(np.zeros((), dtype=dtype))._core, _core.shape_of(x._core)), name=name
    )


def ones_like(x, dtype=None, name=None):
    """Instantiates an all-ones tensor of the same shape as ``x`` (dtype defaults to ``x``'s).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.ones_like(K.zeros((2,))))
        array([1., 1.], dtype=float32)
    """
    x = _t(x)
    dtype = _dtype(dtype, x.dtype)
    return wrap(
        _core.broadcast_to(_t(np.ones((), dtype=dtype))._core, _core.shape_of(x._core)), name=name
    )


def identity(x, name=None):
    """Returns a tensor with the same content as the input tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.identity(K.ones((1,))))
        array([1.], dtype=float32)
    """
    x = _t(x)
    return Tensor(x._core, name=name)


def _variable_seed(seed):
    """The seed of a random variable: ``seed``, else one drawn from NumPy's global
    generator (so ``np.random.seed`` makes unseeded variables reproducible)."""
    if seed is None:
        return int(np.random.randint(0, 2**31 - 1, dtype=np.int64))
    return _int(seed, "seed")


def random_uniform_variable(shape, low, high, dtype=None, name=None, seed=None):
    """Instantiates a variable with values drawn from a uniform distribution.

    Arguments:
        shape: Tuple of integers, shape of returned variable.
        low: Float, lower boundary of the output interval.
        high: Float, upper boundary of the output interval.
        dtype: String, dtype of returned variable.
        name: String, name of returned variable.
        seed: Integer, random seed (default: one drawn from NumPy's global generator).

    Example:
        >>> from ferrokeras import backend as K
        >>> kvar = K.random_uniform_variable((2, 3), 0, 1, seed=1)
        >>> K.int_shape(kvar)
        (2, 3)
    """
    shape = _static_shape(shape, "random_uniform_variable")
    rng = np.random.default_rng(_variable_seed(seed))
    return variable(rng.uniform(low, high, size=shape), dtype=dtype, name=name)


def random_normal_variable(shape, mean, scale, dtype=None, name=None, seed=None):
    """Instantiates a variable with values drawn from a normal distribution.

    Arguments:
        shape: Tuple of integers, shape of returned variable.
        mean: Float, mean of the normal distribution.
        scale: Float, standard deviation of the normal distribution.
        dtype: String, dtype of returned variable.
        name: String, name of returned variable.
        seed: Integer, random seed (default: one drawn from NumPy's global generator).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.random_normal_variable((2, 3), 0, 1, seed=1))
        (2, 3)
    """
    shape = _static_shape(shape, "random_normal_variable")
    rng = np.random.default_rng(_variable_seed(seed))
    return variable(rng.normal(mean, scale, size=shape), dtype=dtype, name=name)


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
        raise ValueError(
            f"count_params: the shape {shape} of {getattr(x, 'name', x)!r} is not fully known"
        )
    return int(np.prod(shape, dtype=np.int64))


def int_shape(x):
    """Returns the shape of a tensor or array as a tuple of ints or ``None`` entries.

    For a tensor on which Keras has recorded a shape (``_keras_shape``, set by every layer
    from its ``compute_output_shape``), each dimension the graph does not know statically
    is taken from that record, as Keras's TensorFlow and Theano backends read it: a
    ``Reshape((3, -1))`` of a ``(None, 2, 3)`` input is ``(None, 3, 2)``, where the graph
    alone knows ``(None, 3, None)``. Dimensions the graph knows win, so a ``Lambda`` layer
    without ``output_shape`` still reports its true shape.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.placeholder(shape=(2, 4, 5)))
        (2, 4, 5)
    """
    if not hasattr(x, "shape"):
        return None
    static = tuple(x.shape)
    keras_shape = getattr(x, "_keras_shape", None)
    if keras_shape is None or len(keras_shape) != len(static):
        return static
    return tuple(
        s if s is not None else (None if k is None else int(k)) for s, k in zip(static, keras_shape)
    )


def get_variable_shape(x):
    """Returns the shape of a variable, as a tuple of ints (legacy Keras name for
    ``int_shape``).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.get_variable_shape(K.zeros((2, 3)))
        (2, 3)
    """
    return tuple(_t(x).shape)


def shape(x):
    """Returns the symbolic shape of a tensor: a 1-D int32 tensor evaluated at run time.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.shape(K.zeros((2, 3))))
        array([2, 3], dtype=int32)
    """
    return wrap(_core.shape_of(_t(x)._core))


def size(x, name=None):
    """Returns the number of elements of a tensor, as a scalar int32 tensor.

    Arguments:
        x: Tensor or variable.
        name: Optional name for the result.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.size(K.zeros((2, 3))))
        array(6, dtype=int32)
    """
    x = _t(x)
    return wrap(_core.reduce("prod", _core.shape_of(x._core), [0], False), name=name)


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
    """Compute the moving average of a variable: ``x = x * momentum + value * (1 - momentum)``.

    Computed as Keras 2.3.1's TensorFlow backend does, ``x - (x - value) * (1 - momentum)``
    with ``1 - momentum`` taken in Python and rounded to ``x``'s dtype, so that the result
    matches TF's bit for bit (``BatchNormalization``'s moving statistics included).
    """
    x = _update_target(x, "moving_average_update")
    value = _t(value, like=x)
    return update_sub(x, (x - value) * (1.0 - momentum))


# `Variable.assign(value)` is `update(variable, value)`, as on a ``tf.Variable``.
Variable.assign = update
Variable.assign_add = update_add
Variable.assign_sub = update_sub

__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
