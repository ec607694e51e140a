"""Matrix products and layout: dot, batch_dot, transpose, reshape, concatenate."""

import builtins as _b

import numpy as np

from .. import _core
from ..tensor import Tensor, convert, wrap
from .common import _int, _t
from .math import sum
from .shapes import _dims, _prod, _shape_tensor
from .variables import cast


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
        raise ValueError(
            f"dot: shapes {tuple(xs)} and {tuple(ys)} are incompatible: {xs[-1]} != {ys[-2]}"
        )
    if x.ndim == 2 and y.ndim == 2:
        return wrap(_core.matmul(x._core, y._core, False, False))
    xd, yd = _dims(x), _dims(y)
    xt = _reshape(x, [_prod(xd[:-1]), xd[-1]])
    perm = [y.ndim - 2] + [i for i in range(y.ndim) if i != y.ndim - 2]
    yt = _reshape(permute_dimensions(y, perm), [yd[-2], _prod(yd[:-2] + yd[-1:])])
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
        raise ValueError(
            f"batch_dot: inputs must have rank >= 2, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
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
        raise ValueError(
            f"batch_dot: axes {axes} out of range for shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
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
        x = _reshape(x, [xd[0], _prod(xd[1:-1]), xd[-1]])
    if y_ndim > 3:
        y = _reshape(y, [yd[0], yd[1], _prod(yd[2:])])
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
    """Permutes axes in a tensor.

    Arguments:
        x: Tensor or variable.
        pattern: A tuple of dimension indices, e.g. ``(0, 2, 1)``: a permutation of the
            axes of ``x`` (negative indices count from the end).

    Returns:
        A tensor.

    Raises:
        ValueError: if ``pattern`` is not a permutation of ``x``'s axes.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.permute_dimensions(K.placeholder(shape=(2, 3, 4)), (0, 2, 1)))
        (2, 4, 3)
    """
    x = _t(x)
    if not isinstance(pattern, (list, tuple, np.ndarray)):
        raise TypeError(
            f"permute_dimensions: pattern must be a tuple of ints, got {type(pattern).__name__}"
        )
    return wrap(
        _core.transpose(x._core, [_int(p, "permute_dimensions: pattern entry") for p in pattern])
    )


def expand_dims(x, axis=-1):
    """Adds a 1-sized dimension at index ``axis``.

    Arguments:
        x: A tensor or variable.
        axis: Position where to add a new axis (``-(ndim + 1) <= axis <= ndim``; -1 adds
            it last).

    Returns:
        A tensor with expanded dimensions.

    Raises:
        ValueError: if ``axis`` is out of range.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.expand_dims(K.placeholder(shape=(2, 3)), 1))
        (2, 1, 3)
    """
    x = _t(x)
    axis = _int(axis, "axis")
    r = x.ndim + 1
    if not -r <= axis < r:
        raise ValueError(f"expand_dims: axis {axis} is out of range for a result of rank {r}")
    return wrap(_core.expand_dims(x._core, [axis % r]))


def reshape(x, shape):
    """Reshapes a tensor to the specified shape.

    Arguments:
        x: Tensor or variable.
        shape: Target shape tuple: ints, one of which may be -1 (inferred from the
            size), or scalar int tensors such as ``K.shape(x)[0]``; or a 1-D int tensor.

    Returns:
        A tensor.

    Raises:
        ValueError: if the sizes do not match (at build time when both shapes are static,
            else when the graph runs) or more than one entry is -1. TypeError: for
            non-integer entries.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.reshape(K.placeholder(shape=(None, 2, 3)), (-1, 6)))
        (None, 6)
    """
    x = _t(x)
    if isinstance(shape, Tensor):
        return wrap(
            _core.reshape(
                x._core, cast(shape, "int32")._core if shape.dtype != "int32" else shape._core
            )
        )
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    if not isinstance(shape, (list, tuple, np.ndarray)):
        raise TypeError(f"reshape: shape must be a tuple of ints, got {type(shape).__name__}")
    parts = []
    for d in shape:
        if isinstance(d, Tensor):
            if d.ndim != 0 or d.dtype not in ("int8", "int16", "int32", "int64", "uint8"):
                raise TypeError(
                    f"reshape: shape entries must be ints or scalar int tensors, got {d!r}"
                )
            parts.append(d)
        else:
            parts.append(_int(d, "reshape: shape entry"))
    return _reshape(x, parts)


def concatenate(tensors, axis=-1):
    """Concatenates a list of tensors alongside the specified axis.

    Arguments:
        tensors: list of tensors to concatenate (same rank and dtype; equal dimensions
            except along ``axis``). When all of them are sparse, so is the result.
        axis: concatenation axis.

    Returns:
        A tensor.

    Raises:
        ValueError: for an empty list, an axis out of range or mismatched shapes.
        TypeError: for mixed dtypes.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.concatenate([K.constant([[1, 2]]), K.constant([[3]])], axis=-1))
        array([[1., 2., 3.]], dtype=float32)
    """
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(
            f"concatenate: tensors must be a list of tensors, got {type(tensors).__name__}"
        )
    like = next((t for t in tensors if isinstance(t, Tensor)), None)
    ts = [_t(t, like=like) for t in tensors]
    out = wrap(_core.concat([t._core for t in ts], _int(axis, "concatenate: axis")))
    if ts and _b.all(getattr(t, "_is_sparse", False) for t in ts):
        out._is_sparse = True  # TF's sparse concat: sparse inputs give a sparse result
    return out


def _tensor_matmul(self, other):
    return _matmul(self, convert(other, like=self))


def _tensor_rmatmul(self, other):
    return _matmul(convert(other, like=self), self)


Tensor.__matmul__ = _tensor_matmul
Tensor.__rmatmul__ = _tensor_rmatmul

__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
