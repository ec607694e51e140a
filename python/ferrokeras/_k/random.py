"""Random tensors and dropout, on the counter-based ``random`` primitive.

A seeded op gives the same numbers on every device and in every process (its n-th
execution depends only on the seed and n). An unseeded op draws its seed from NumPy's
global generator when it is built, as Keras's Theano and CNTK backends do, so
``np.random.seed(n)`` (or ``ferrokeras.set_random_seed(n)``) before building a model makes
its initial weights and dropout masks the same run after run. Each execution of a compiled
function draws new numbers, so a dropout mask changes at every training step.
"""

import numpy as np

from .. import _core
from ..tensor import Tensor, wrap
from .common import _INTS, _dtype, _int, _t
from .math import _bin, _unary
from .shapes import _dims, _shape_arg
from .variables import cast

_FLOATS = ("float16", "float32", "float64")


def _seed(seed, fn):
    if seed is None:
        return _global_seed()
    return _int(seed, f"{fn}: seed") & 0xFFFF_FFFF_FFFF_FFFF


def _global_seed():
    """A seed for an unseeded op, drawn from NumPy's global generator (``np.random.seed``
    makes it reproducible)."""
    return int(np.random.randint(0, 2**31 - 1, dtype=np.int64))


def _draw(dist, shape, dtype, seed, fn):
    return wrap(_core.random(dist, _shape_arg(shape, fn), dtype, _seed(seed, fn)))


def _float_dtype(dtype, fn):
    dtype = _dtype(dtype)
    if dtype not in _FLOATS:
        raise TypeError(f"{fn}: dtype must be a float type, got {dtype!r}")
    return dtype


def _affine(z, scale, shift):
    """``z * scale + shift``, skipping the identity parts for Python numbers."""
    if isinstance(scale, Tensor) or scale != 1:
        z = _bin("multiply", z, scale)
    if isinstance(shift, Tensor) or shift != 0:
        z = _bin("add", z, shift)
    return z


def random_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """Returns a tensor with normal distribution of values.

    Arguments:
        shape: A tuple of integers (or a 1-D int tensor such as ``K.shape(x)``), the
            shape of tensor to create.
        mean: A float (or scalar tensor), mean of the normal distribution to draw samples.
        stddev: A float (or scalar tensor), standard deviation of the normal distribution
            to draw samples.
        dtype: String, dtype of returned tensor (a float type; default ``floatx()``).
        seed: Integer, random seed (default: one drawn from NumPy's global generator when
            the op is built).

    Returns:
        A tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.random_normal((2, 3), mean=1.0, stddev=0.5, seed=1)).shape
        (2, 3)
    """
    dtype = _float_dtype(dtype, "random_normal")
    return _affine(_draw("normal", shape, dtype, seed, "random_normal"), stddev, mean)


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """Returns a tensor with truncated random normal distribution of values.

    The generated values follow a normal distribution with specified mean and standard
    deviation, except that values whose magnitude is more than two standard deviations
    from the mean are dropped and re-picked.

    Arguments:
        shape: A tuple of integers (or a 1-D int tensor), the shape of tensor to create.
        mean: Mean of the values.
        stddev: Standard deviation of the values.
        dtype: String, dtype of returned tensor (a float type; default ``floatx()``).
        seed: Integer, random seed (default: one drawn from NumPy's global generator when
            the op is built).

    Returns:
        A tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> bool(np.all(np.abs(K.eval(K.truncated_normal((1000,), seed=3))) <= 2))
        True
    """
    dtype = _float_dtype(dtype, "truncated_normal")
    return _affine(_draw("truncated_normal", shape, dtype, seed, "truncated_normal"), stddev, mean)


def random_uniform(shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
    """Returns a tensor with uniform distribution of values in ``[minval, maxval)``.

    Arguments:
        shape: A tuple of integers (or a 1-D int tensor), the shape of tensor to create.
        minval: A float, lower boundary of the uniform distribution to draw samples.
        maxval: A float, upper boundary of the uniform distribution to draw samples.
        dtype: String, dtype of returned tensor (default ``floatx()``). For an integer
            dtype the values are integers in ``[minval, maxval)``, a range of at most
            ``2 ** 24``.
        seed: Integer, random seed (default: one drawn from NumPy's global generator when
            the op is built).

    Returns:
        A tensor.

    Raises:
        ValueError: for an integer dtype with ``maxval <= minval`` or a range above
            ``2 ** 24``.

    Example:
        >>> from ferrokeras import backend as K
        >>> v = K.eval(K.random_uniform((100,), minval=-1.0, maxval=1.0, seed=7))
        >>> bool(v.min() >= -1.0 and v.max() < 1.0)
        True
    """
    fn = "random_uniform"
    dtype = _dtype(dtype)
    if dtype in _FLOATS:
        u = _draw("uniform", shape, dtype, seed, fn)
        if isinstance(minval, Tensor) or isinstance(maxval, Tensor):
            return _bin("add", _bin("multiply", u, _bin("subtract", maxval, minval)), minval)
        return _affine(u, float(maxval) - float(minval), float(minval))
    if dtype not in _INTS:
        raise TypeError(f"{fn}: dtype must be a float or integer type, got {dtype!r}")
    if isinstance(minval, Tensor) or isinstance(maxval, Tensor):
        raise TypeError(f"{fn}: for an integer dtype, minval and maxval must be Python numbers")
    lo, hi = int(minval), int(maxval)
    if hi <= lo or hi - lo > 2**24:
        raise ValueError(
            f"{fn}: for an integer dtype, need minval < maxval within 2**24, got minval={minval}, maxval={maxval}"
        )
    u = _draw("uniform", shape, "float64", seed, fn)
    return cast(_unary("floor", u * float(hi - lo)) + float(lo), dtype)


def random_binomial(shape, p=0.0, dtype=None, seed=None):
    """Returns a tensor of independent Bernoulli draws: 1 with probability ``p``, else 0.

    Arguments:
        shape: A tuple of integers (or a 1-D int tensor), the shape of tensor to create.
        p: A float, ``0. <= p <= 1``, probability of binomial distribution (or a tensor).
        dtype: String, dtype of returned tensor (default ``floatx()``; integer and bool
            dtypes work too).
        seed: Integer, random seed (default: one drawn from NumPy's global generator when
            the op is built).

    Returns:
        A tensor.

    Raises:
        ValueError: if ``p`` is a number outside ``[0, 1]``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.random_binomial((4,), p=1.0, seed=2))
        array([1., 1., 1., 1.], dtype=float32)
    """
    fn = "random_binomial"
    dtype = _dtype(dtype)
    if not isinstance(p, Tensor):
        if isinstance(p, (bool, np.bool_)) or not isinstance(
            p, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"{fn}: p must be a number in [0, 1] or a tensor, got {p!r}")
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"{fn}: p must be in [0, 1], got {p}")
        p = float(p)
    u = _draw("uniform", shape, "float32", seed, fn)
    hit = _bin("less", u, p if not isinstance(p, Tensor) else cast(p, "float32"))
    return hit if dtype == "bool" else cast(hit, dtype)


def dropout(x, level, noise_shape=None, seed=None):
    """Sets entries in ``x`` to zero at random, while scaling the entire tensor.

    Each entry is kept with probability ``1 - level`` and scaled by ``1 / (1 - level)``,
    so the expected value is unchanged. Every run of a compiled function draws a new
    mask.

    Arguments:
        x: tensor
        level: fraction of the entries in the tensor that will be set to 0, in
            ``[0, 1)`` (or a scalar tensor).
        noise_shape: shape for randomly generated keep/drop flags, must be broadcastable
            to the shape of ``x``; ``None`` entries take ``x``'s dimension.
        seed: random seed to ensure determinism (default: one drawn from NumPy's global
            generator when the op is built).

    Returns:
        A tensor.

    Raises:
        ValueError: if ``level`` is outside ``[0, 1)`` or ``noise_shape`` does not
            broadcast to ``x``.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> v = K.eval(K.dropout(K.ones((1000,)), 0.5, seed=1))
        >>> sorted(set(v.tolist()))
        [0.0, 2.0]
    """
    fn = "dropout"
    x = _t(x)
    if x.dtype not in _FLOATS:
        raise TypeError(f"{fn}: x must be a float tensor, got dtype {x.dtype}")
    if not isinstance(level, Tensor):
        if isinstance(level, (bool, np.bool_)) or not isinstance(
            level, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"{fn}: level must be a number in [0, 1), got {level!r}")
        if not 0.0 <= float(level) < 1.0:
            raise ValueError(f"{fn}: level must be in the interval [0, 1), got {level}")
        level = float(level)
        if level == 0.0:
            return x
    elif level.ndim != 0:
        raise ValueError(
            f"{fn}: level must be a scalar, got a tensor of shape {tuple(level.shape)}"
        )
    else:
        level = level if level.dtype == x.dtype else cast(level, x.dtype)
    d = _dims(x)
    if noise_shape is None:
        ns = d
    else:
        if isinstance(noise_shape, Tensor):
            noise_shape = [noise_shape[i] for i in range(noise_shape.shape[0] or 0)]
        ns = list(noise_shape)
        if len(ns) != x.ndim:
            raise ValueError(
                f"{fn}: noise_shape {tuple(noise_shape)} must have one entry per axis of x {tuple(x.shape)}"
            )
        for i, e in enumerate(ns):
            if e is None:
                ns[i] = d[i]
            elif not isinstance(e, Tensor):
                e = _int(e, f"{fn}: noise_shape entry")
                if e != 1 and x.shape[i] is not None and e != x.shape[i]:
                    raise ValueError(
                        f"{fn}: noise_shape {tuple(noise_shape)} does not broadcast to the shape of x {tuple(x.shape)}"
                    )
    u = _draw("uniform", ns, x.dtype, seed, fn)
    keep = cast(_bin("greater_equal", u, level), x.dtype)
    scale = (
        1.0 / (1.0 - level)
        if not isinstance(level, Tensor)
        else _bin("divide", 1.0, _bin("subtract", 1.0, level))
    )
    return _bin("multiply", x, scale) * keep


__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
