"""Elementwise math, comparisons and reductions."""

import numpy as np

from .. import _core
from ..config import floatx
from ..tensor import Tensor, is_tensor, wrap
from .common import _axes, _check_float, _int, _t
from .function import stop_gradient
from .variables import cast, zeros_like


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
    """Element-wise sigmoid, stable for inputs of any magnitude.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.sigmoid(K.constant([-1e4, 0.0, 1e4])))
        array([0. , 0.5, 1. ], dtype=float32)
    """
    x = _t(x)
    out = _unary("sigmoid", x)
    out._logits_of = ("sigmoid", x)  # lets binary_crossentropy work from the logits (as TF 2)
    return out


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
    if (
        min_value is not None
        and max_value is not None
        and not is_tensor(min_value)
        and not is_tensor(max_value)
        and max_value < min_value
    ):
        max_value = min_value
    if x.dtype in ("int8", "int16", "int32", "int64", "uint8"):
        # bounds beyond the dtype's range (-1 for uint8, +-inf) would wrap when converted
        info = np.iinfo(x.dtype)
        lo_hi = [
            v
            if v is None or is_tensor(v)
            else int(info.min)
            if v < info.min
            else int(info.max)
            if v > info.max
            else v
            for v in (min_value, max_value)
        ]
        min_value, max_value = lo_hi
    # A None bound is skipped rather than made infinite, so integer tensors can be clipped.
    out = x if min_value is None else _bin("maximum", x, min_value)
    out = out if max_value is None else _bin("minimum", out, max_value)
    return out if out is not x else Tensor(x._core)


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
    x = _check_float(_t(x), "logsumexp")
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


__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
