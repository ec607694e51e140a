"""Argument normalisation shared by the K modules."""

import numpy as np

from ..config import floatx, image_data_format
from ..tensor import convert

_INTS = ("int8", "int16", "int32", "int64", "uint8")
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
    """``axis`` (None, an int, or a list, tuple or 1-d integer array of ints) as a list of
    ints for the core. Keras code passes NumPy arrays too (``np.arange(1, ndim)``)."""
    if axis is None:
        return list(range(x.ndim))
    if isinstance(axis, np.ndarray) and axis.ndim == 0:
        axis = axis[()]
    elif isinstance(axis, np.ndarray) and axis.ndim == 1 and axis.dtype.kind in "iu":
        axis = axis.tolist()
    if isinstance(axis, (list, tuple)):
        return [_int(a, "axis") for a in axis]
    return [_int(axis, "axis")]


def _int(v, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {v!r}")
    return int(v)


def _axis(axis, rank, fn, what="axis"):
    """One axis argument checked against ``rank`` and made non-negative."""
    a = _int(axis, f"{fn}: {what}")
    if not -rank <= a < rank:
        raise ValueError(
            f"{fn}: {what} {a} is out of range for a tensor of rank {rank}; expected {-rank} <= {what} < {rank}"
        )
    return a % rank


def _data_format(value, fn, allow_none=True):
    """``data_format`` checked: ``'channels_first'``/``'channels_last'``, or the default for None."""

    if value is None and allow_none:
        return image_data_format()
    if value not in ("channels_first", "channels_last"):
        raise ValueError(
            f"{fn}: unknown data_format {value!r}; expected 'channels_first' or 'channels_last'"
        )
    return value


def _known_shape(x):
    """``x``'s static shape, with dims the graph does not know taken from the shape Keras
    recorded on it (``_keras_shape``), as ``K.int_shape`` reads it."""
    static = tuple(x.shape)
    keras_shape = getattr(x, "_keras_shape", None)
    if keras_shape is None or len(keras_shape) != len(static):
        return static
    return tuple(s if s is not None else k for s, k in zip(static, keras_shape))


def _check_float(x, fn, what="x"):
    if x.dtype not in ("float16", "float32", "float64"):
        raise TypeError(f"{fn}: {what} must be a float tensor, got dtype {x.dtype}")
    return x
