"""Graph conditionals and the learning phase (switch, in_train_phase, in_test_phase), and
the ``symbolic``/``eager`` decorators of Keras 2.3.1 (``name_scope`` and
``control_dependencies`` live in ``scope``).

Both branches of a conditional are graph nodes and both are computed; ``select`` picks
elementwise, and its gradient sends nothing to the branch not taken (so a NaN or inf in
that branch does not leak into the gradient).
"""

import numpy as np

from .. import _core
from ..tensor import Tensor, wrap
from .common import _t
from .session import learning_phase
from .variables import cast


def _branch(e):
    return e() if callable(e) else e


def switch(condition, then_expression, else_expression):
    """Switches between two operations depending on a condition.

    A scalar ``condition`` picks one expression whole; a condition of higher rank picks
    elementwise, aligned with the leading axes of the expressions (a 1-D condition picks
    rows), then broadcast, as in Keras 2.3.1's Theano and TensorFlow backends.

    Arguments:
        condition: tensor (``int`` or ``bool``); non-zero means "then".
        then_expression: either a tensor, or a callable that returns a tensor.
        else_expression: either a tensor, or a callable that returns a tensor.

    Returns:
        The selected tensor.

    Raises:
        ValueError: If rank of ``condition`` is greater than rank of expressions.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.constant([1.0, 2.0]); y = K.constant([-1.0, -2.0])
        >>> K.eval(K.switch(K.constant([True, False], dtype='bool'), x, y))
        array([ 1., -2.], dtype=float32)
    """
    then_e, else_e = _branch(then_expression), _branch(else_expression)
    if not isinstance(then_e, Tensor) and isinstance(else_e, Tensor):
        then_e = _t(then_e, like=else_e)
    then_e = _t(then_e)
    else_e = _t(else_e, like=then_e)
    cond = condition if isinstance(condition, Tensor) else _t(np.asarray(condition))
    if cond.dtype != "bool":
        cond = cast(cond, "bool")
    expr_ndim = max(then_e.ndim, else_e.ndim)
    if cond.ndim > expr_ndim:
        raise ValueError(
            "switch: rank of `condition` should be less than or equal to rank of `then_expression` and "
            f"`else_expression`; ndim(condition)={cond.ndim}, ndim(then_expression)={then_e.ndim}, "
            f"ndim(else_expression)={else_e.ndim}"
        )
    if 0 < cond.ndim < expr_ndim:
        cond = wrap(_core.expand_dims(cond._core, list(range(cond.ndim, expr_ndim))))
    if then_e.dtype != else_e.dtype:
        raise TypeError(
            f"switch: then_expression and else_expression have different dtypes {then_e.dtype} and {else_e.dtype}"
        )
    out = wrap(_core.select(cond._core, then_e._core, else_e._core))
    if any(getattr(t, "_uses_learning_phase", False) for t in (cond, then_e, else_e)):
        out._uses_learning_phase = True
    return out


def _fixed_phase(training):
    """0 or 1 when ``training`` is a Python/NumPy value, None when it is a tensor."""
    if isinstance(training, Tensor):
        return None
    if isinstance(training, (bool, int, float, np.bool_, np.integer, np.floating)):
        return 1 if training else 0
    raise TypeError(
        f"in_train_phase: training must be None, a Python bool/int or a scalar tensor, got {training!r}"
    )


def in_train_phase(x, alt, training=None):
    """Selects ``x`` in train phase, and ``alt`` otherwise.

    Note that ``alt`` should have the *same shape* as ``x``.

    Arguments:
        x: What to return in train phase (tensor or callable that returns a tensor).
        alt: What to return otherwise (tensor or callable that returns a tensor).
        training: Optional scalar tensor (or Python boolean, or Python integer) specifying
            the learning phase; defaults to ``K.learning_phase()``.

    Returns:
        Either ``x`` or ``alt`` based on the ``training`` flag. With a Python flag (or a
        learning phase fixed by ``set_learning_phase``) the chosen expression itself is
        returned; otherwise a ``switch`` on the flag, marked ``_uses_learning_phase``
        when it reads the learning phase.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> x = K.placeholder(shape=(2,))
        >>> y = K.in_train_phase(x * 2, x)
        >>> f = K.function([x, K.learning_phase()], [y])
        >>> f([np.ones(2), 1])[0], f([np.ones(2), 0])[0]
        (array([2., 2.], dtype=float32), array([1., 1.], dtype=float32))
    """
    uses_learning_phase = training is None
    if training is None:
        training = learning_phase()
    phase = _fixed_phase(training)
    if phase == 1:
        return _branch(x)
    if phase == 0:
        return _branch(alt)
    if training.ndim != 0:
        raise ValueError(
            f"in_train_phase: training must be a scalar tensor, got shape {tuple(training.shape)}"
        )
    out = switch(training, x, alt)
    if uses_learning_phase:
        out._uses_learning_phase = True
    return out


def in_test_phase(x, alt, training=None):
    """Selects ``x`` in test phase, and ``alt`` otherwise.

    Note that ``alt`` should have the *same shape* as ``x``.

    Arguments:
        x: What to return in test phase (tensor or callable that returns a tensor).
        alt: What to return otherwise (tensor or callable that returns a tensor).
        training: Optional scalar tensor (or Python boolean, or Python integer) specifying
            the learning phase; defaults to ``K.learning_phase()``.

    Returns:
        Either ``x`` or ``alt`` based on ``K.learning_phase``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.in_test_phase(K.constant(1.0), K.constant(2.0), training=0))
        array(1., dtype=float32)
    """
    return in_train_phase(alt, x, training=training)


# ---------------------------------------------------------------- graph-context helpers


def symbolic(func):
    """Decorator used in Keras 2.3.1 to build ``func``'s ops in the graph; graphs are the
    only mode here, so it returns ``func`` unchanged.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.symbolic(len) is len
        True
    """
    return func


def eager(func):
    """Decorator used in Keras 2.3.1 to run ``func`` eagerly; returns ``func`` unchanged
    (ferrokeras evaluates values on request through ``eval``).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eager(len) is len
        True
    """
    return func


__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
