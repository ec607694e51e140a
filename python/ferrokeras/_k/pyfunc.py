"""Host callbacks: ``py_function`` and ``print_tensor``.

A ``py_function`` node calls a Python function with the concrete values of its inputs
while the graph runs. Inside the function, inputs are constant tensors, so Python control
flow on their values works and K ops build small graphs that are evaluated at once. Its
gradient re-runs the function and differentiates the K ops it ran (once-differentiable,
as ``tf.py_function``).
"""

import sys

import numpy as np

from .. import _core
from ..tensor import EAGER, Tensor, wrap
from .common import _dtype, _t
from .function import gradients, stop_gradient
from .math import sum as k_sum
from .variables import cast, constant
from .variables import eval as k_eval


class _Eager:
    def __enter__(self):
        EAGER.depth += 1

    def __exit__(self, *exc):
        EAGER.depth -= 1


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _evaluate(x):
    return np.asarray(k_eval(x)) if isinstance(x, Tensor) else np.asarray(x)


class _Runner:
    """What the core calls: ``call`` computes the results, ``vjp`` their gradients."""

    def __init__(self, func, touts):
        self.func = func
        self.touts = touts

    def _run(self, arrays):
        xs = [constant(a, dtype=a.dtype.name) for a in arrays]
        return xs, _as_list(self.func(*xs))

    def call(self, arrays):
        with _Eager():
            _, outs = self._run(arrays)
            if len(outs) != len(self.touts):
                raise TypeError(
                    f"py_function: {self.func!r} returned {len(outs)} values, but Tout declares {len(self.touts)}"
                )
            return [np.array(_evaluate(o), dtype=t, order="C") for o, t in zip(outs, self.touts)]

    def vjp(self, arrays, grads):
        with _Eager():
            xs, outs = self._run(arrays)
            terms = []
            for o, g in zip(outs, grads):
                if isinstance(o, Tensor) and o.dtype.startswith("float"):
                    terms.append(k_sum(cast(o, g.dtype.name) * constant(g, dtype=g.dtype.name)))
            if not terms:
                return [None] * len(xs)
            loss = terms[0]
            for t in terms[1:]:
                loss = loss + cast(t, loss.dtype)
            floats = [i for i, x in enumerate(xs) if x.dtype.startswith("float")]
            gs = gradients(loss, [xs[i] for i in floats]) if floats else []
            out = [None] * len(xs)
            for i, g in zip(floats, gs):
                out[i] = None if g is None else np.array(_evaluate(g), order="C")
            return out


def _result_shapes(func, inp, touts):
    """Static shapes of the results: a trial call on zeros of the inputs' static shapes
    gives the ranks; every dim stays unknown (results may depend on the values)."""
    try:
        with _Eager():
            xs = [
                constant(
                    np.zeros([1 if d is None else d for d in x.shape], dtype=x.dtype), dtype=x.dtype
                )
                for x in inp
            ]
            outs = _as_list(func(*xs))
        shapes = [tuple(np.shape(_evaluate(o))) for o in outs]
        if len(shapes) == len(touts):
            return [[None] * len(s) for s in shapes]
    except Exception:
        pass
    # The trial failed: assume each result has the rank of the first input.
    rank = len(inp[0].shape) if inp else 0
    return [[None] * rank for _ in touts]


def py_function(func, inp, Tout, name=None):
    """Wraps a Python function into a graph op that runs it eagerly when the graph executes.

    Arguments:
        func: A Python function taking one argument per element of ``inp`` (constant
            tensors, usable with K ops and Python control flow on their values) and
            returning tensors or arrays matching ``Tout``.
        inp: List of input tensors.
        Tout: A dtype, or a list of dtypes, of the results.
        name: A name for the operation (optional).

    Returns:
        A tensor (or a list of tensors when ``Tout`` is a list). The op is differentiable
        once: its gradient differentiates the K ops ``func`` ran. An exception raised in
        ``func`` reaches the caller of the compiled function with its original type.

    Example:
        >>> from ferrokeras import backend as K
        >>> def log_huber(x, m):
        ...     if K.abs(x) <= m:
        ...         return x ** 2
        ...     return m ** 2 * (1 - 2 * K.log(m) + K.log(x ** 2))
        >>> x = K.placeholder(shape=()); m = K.placeholder(shape=())
        >>> y = K.py_function(func=log_huber, inp=[x, m], Tout='float32')
        >>> dy_dx = K.gradients(y, [x])[0]
        >>> K.function([x, m], [y, dy_dx])([1.0, 2.0])
        [np.float32(1.0), np.float32(2.0)]
    """
    if not callable(func):
        raise TypeError(f"py_function: func must be callable, got {type(func).__name__}")
    if not isinstance(inp, (list, tuple)):
        raise TypeError(f"py_function: inp must be a list of tensors, got {type(inp).__name__}")
    single = not isinstance(Tout, (list, tuple))
    touts = [_dtype(t) for t in _as_list(Tout)]
    inp = [_t(x) for x in inp]
    shapes = _result_shapes(func, inp, touts)
    label = name or getattr(func, "__name__", "py_function")
    res = _core.host_call(
        label, _Runner(func, touts), [x._core for x in inp], list(zip(shapes, touts))
    )
    out = [wrap(r) for r in res]
    return out[0] if single else out


def print_tensor(x, message=""):
    """Prints ``message`` and the tensor value when evaluated, and returns ``x`` unchanged.

    Arguments:
        x: Tensor to print.
        message: Message to print jointly with the tensor; it is followed by a space and
            the value, as in TensorFlow.

    Returns:
        The same tensor ``x``, unchanged (its gradient passes through).

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.print_tensor(K.constant([1., 2.]), message='x is:')
        >>> _ = K.eval(x)
        x is: [1. 2.]
    """

    x = _t(x)

    def show(v):
        # `message`, a space, the value: what TensorFlow's `tf.print(message, x)` and
        # Theano's `Print` write.
        print(f"{message} {np.asarray(v)}", file=sys.stdout, flush=True)
        return v

    res = _core.host_call(
        "print_tensor", _Runner(show, [x.dtype]), [x._core], [(list(x.shape), x.dtype)]
    )
    printed = stop_gradient(wrap(res[0]))
    # `x` itself, made to depend on the printing node through an always-true condition
    # (x == x or x != x also holds for NaN); not `x + (printed - x)`, which is NaN for an
    # infinite x and undefined for bool.
    always = _core.binary(
        "logical_or",
        _core.binary("equal", printed._core, printed._core),
        _core.binary("not_equal", printed._core, printed._core),
    )
    return wrap(_core.select(always, x._core, printed._core))


__all__ = ["py_function", "print_tensor"]
