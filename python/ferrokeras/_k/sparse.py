"""Sparse inputs.

A sparse placeholder (``placeholder(..., sparse=True)``) is stored dense: it is flagged
sparse for Keras (``is_sparse``), and a ``scipy.sparse`` matrix fed to it, or to any
placeholder, through ``function`` is densified on the way in (``Function.__call__``).
Every K function therefore accepts it; ``to_dense`` only drops the flag.
"""

from ..tensor import Tensor
from .common import _t
from .variables import is_sparse


def to_dense(tensor):
    """Converts a sparse tensor into a dense tensor and returns it.

    Arguments:
        tensor: A tensor instance (potentially sparse), or a ``scipy.sparse`` matrix
            (which becomes a dense constant).

    Returns:
        A dense tensor: a tensor that is not sparse is returned unchanged.

    Example:
        >>> from ferrokeras import backend as K
        >>> b = K.placeholder((2, 2), sparse=True)
        >>> print(K.is_sparse(b))
        True
        >>> c = K.to_dense(b)
        >>> print(K.is_sparse(c))
        False
    """
    if hasattr(tensor, "_dense"):  # a SparseTensor from ctc_label_dense_to_sparse
        return tensor._dense
    if is_sparse(tensor):
        dense = Tensor(tensor._core, name=f"{tensor.name}/to_dense")
        for attr in ("_keras_shape", "_uses_learning_phase"):
            if hasattr(tensor, attr):
                setattr(dense, attr, getattr(tensor, attr))
        return dense
    if isinstance(tensor, Tensor):
        return tensor
    if hasattr(tensor, "toarray"):
        return _t(tensor)
    raise TypeError(
        f"to_dense: expected a tensor or a scipy.sparse matrix, got {type(tensor).__name__}"
    )


__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
