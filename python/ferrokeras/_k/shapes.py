"""Shape arguments: shapes given as ints, scalar int tensors or 1-D int tensors, turned
into the int32 shape tensors the primitives take. Used by every family that takes a shape."""

import builtins as _b

import numpy as np

from .. import _core
from ..tensor import Tensor, wrap
from .common import _INTS, _int


def _int32(t):
    """An int tensor as int32 (the dtype of shape tensors)."""
    return t if t.dtype == "int32" else wrap(_core.cast(t._core, "int32"))


def _shape_tensor(parts):
    """A 1-D int32 shape tensor from a list of ints and scalar int tensors."""
    pieces = []
    consts = []
    for p in parts:
        if isinstance(p, Tensor):
            if consts:
                pieces.append(_core.constant(np.asarray(consts, dtype=np.int32)))
                consts = []
            q = _int32(p)
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
    dyn = wrap(_core.shape_of(x._core))
    return [d if d is not None else dyn[i] for i, d in enumerate(st)]


def _prod(parts):
    """The product of dims from ``_dims`` (ints and scalar tensors): an int when all are
    static. Used instead of a ``-1`` entry, which is ambiguous for a zero-size tensor."""
    static, dyn = 1, None
    for p in parts:
        if isinstance(p, Tensor):
            q = _int32(p)
            dyn = q if dyn is None else dyn * q
        else:
            static *= int(p)
    if dyn is None:
        return static
    return dyn if static == 1 else dyn * static


def _count(n, what):
    """A non-negative count: a Python int, or a scalar int tensor (checked at run time)."""
    if isinstance(n, Tensor):
        if n.ndim != 0 or n.dtype not in _INTS:
            raise TypeError(
                f"{what} must be a non-negative int or a scalar int tensor, got a {n.dtype} tensor of shape {tuple(n.shape)}"
            )
        return _int32(n)
    v = _int(n, what)
    if v < 0:
        raise ValueError(f"{what} must be non-negative, got {v}")
    return v


def _shape_arg(shape, fn):
    """A 1-D int32 shape tensor from a tuple of ints (or scalar int tensors) or a 1-D int tensor."""
    if isinstance(shape, Tensor):
        if shape.ndim != 1 or shape.shape[0] is None or shape.dtype not in _INTS:
            raise ValueError(
                f"{fn}: shape must be a tuple of ints or a 1-D int tensor of known length, got {shape!r}"
            )
        return _int32(shape)._core
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list, np.ndarray)):
        raise TypeError(f"{fn}: shape must be a tuple of ints, got {type(shape).__name__}")
    return _shape_tensor([_count(d, f"{fn}: shape entry") for d in shape])
