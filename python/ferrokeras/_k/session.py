"""Backend name, learning phase and session state."""


import numpy as np

from .. import _core
from ..config import floatx, reset_uids
from ..tensor import Tensor


def backend():
    """Returns the name of the current backend: ``'ferrokeras'``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.backend()
        'ferrokeras'
    """
    return "ferrokeras"


def cast_to_floatx(x):
    """Casts a NumPy array (or number) to the default Keras float type.

    Arguments:
        x: NumPy array or Python number.

    Returns:
        The same array, cast to ``floatx()``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.cast_to_floatx([1, 2]).dtype
        dtype('float32')
    """
    return np.asarray(x, dtype=floatx())


_LEARNING_PHASE = None  # the placeholder, created on first use
_LEARNING_PHASE_VALUE = None  # fixed by set_learning_phase


def learning_phase():
    """Returns the learning phase flag: 0 = test, 1 = train.

    Unless fixed with ``set_learning_phase``, this is a scalar bool placeholder that
    ``function`` callers may feed and that reads 0 when not fed.

    Example:
        >>> from ferrokeras import backend as K
        >>> f = K.function([K.learning_phase()], [K.cast(K.learning_phase(), 'int32')])
        >>> f([1])[0]
        array(1, dtype=int32)
    """
    global _LEARNING_PHASE
    if _LEARNING_PHASE_VALUE is not None:
        return _LEARNING_PHASE_VALUE
    if _LEARNING_PHASE is None:
        core = _core.placeholder("keras_learning_phase", [], "bool", np.array(False))
        _LEARNING_PHASE = Tensor(core, name="keras_learning_phase")
        _LEARNING_PHASE._is_placeholder = True
    return _LEARNING_PHASE


def set_learning_phase(value):
    """Sets the learning phase to a fixed value.

    Arguments:
        value: 0 (test) or 1 (train).

    Raises:
        ValueError: if ``value`` is neither 0 nor 1.
    """
    global _LEARNING_PHASE_VALUE
    if value not in (0, 1):
        raise ValueError(f"set_learning_phase: expected 0 or 1, got {value!r}")
    _LEARNING_PHASE_VALUE = int(value)


def clear_session():
    """Resets uid counters, the learning phase and compiled-plan caches.

    Variables and tensors the caller still holds stay valid.
    """
    global _LEARNING_PHASE, _LEARNING_PHASE_VALUE
    reset_uids()
    _LEARNING_PHASE = None
    _LEARNING_PHASE_VALUE = None


__all__ = [n for n, v in list(globals().items()) if not n.startswith("_") and getattr(v, "__module__", None) == __name__]
