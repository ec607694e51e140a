"""Gradient compression for the wire, with Horovod's names: ``hvd.Compression.none`` (the
default: exact) and ``hvd.Compression.fp16`` (floating values cross the wire as float16).

A compressor has two static methods: ``compress(value) -> (compressed, ctx)`` and
``decompress(value, ctx) -> value``; both take ferrokeras tensors (graph casts) and NumPy
arrays. The collectives reduce the compressed values and decompress the result.
"""

import numpy as np

from .. import backend as K
from ..tensor import Tensor


class Compressor:
    """The interface of a compressor (Horovod's ``hvd.Compressor``)."""

    @staticmethod
    def compress(value):
        """Returns ``(compressed value, context)``; the context is what ``decompress``
        needs to restore the value (this rank's own, never sent)."""
        raise NotImplementedError

    @staticmethod
    def decompress(value, ctx):
        """Returns the value that ``compress`` compressed, from its (reduced) compressed
        form and the context."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: values cross the wire as they are (exact)."""

    @staticmethod
    def compress(value):
        return value, None

    @staticmethod
    def decompress(value, ctx):
        return value


def _dtype(value):
    return np.dtype(value.dtype if isinstance(value, Tensor) else np.asarray(value).dtype)


def _cast(value, dtype):
    if isinstance(value, Tensor):
        return K.cast(value, dtype.name)
    return np.asarray(value).astype(dtype)


class FP16Compressor(Compressor):
    """float32 and float64 values cross the wire as float16 (half the bytes of float32),
    and come back in their own dtype. Values beyond float16's range (65504) become
    infinite; the rest keep 11 significant bits."""

    @staticmethod
    def compress(value):
        dtype = _dtype(value)
        if dtype.kind == "f" and dtype.itemsize > 2:
            return _cast(value, np.dtype(np.float16)), dtype
        return value, None

    @staticmethod
    def decompress(value, ctx):
        if ctx is None:
            return value
        return _cast(value, ctx)


class Compression:
    """The compressors: ``Compression.none`` (default) and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor


def check(compression, fn):
    """``compression`` (None means ``Compression.none``) if it is a compressor, else a
    TypeError naming ``fn``."""
    if compression is None:
        return NoneCompressor
    ok = all(callable(getattr(compression, m, None)) for m in ("compress", "decompress"))
    if not ok:
        raise TypeError(
            f"{fn}: compression must be hvd.Compression.none, hvd.Compression.fp16 or a "
            f"compressor with compress() and decompress(), got {compression!r}"
        )
    return compression
