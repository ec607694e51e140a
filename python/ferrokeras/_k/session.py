"""Backend name, learning phase and session state."""

import numpy as np

from .. import _core
from ..config import floatx, reset_uids
from ..tensor import Tensor
from .function import function
from .variables import _Update


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
        np.int32(1)
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
    """Resets uid counters, the learning phase and compiled-plan caches, and releases the
    GPU memory pooled for reuse.

    Variables and tensors the caller still holds stay valid.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.clear_session()
    """
    global _LEARNING_PHASE, _LEARNING_PHASE_VALUE
    reset_uids()
    _LEARNING_PHASE = None
    _LEARNING_PHASE_VALUE = None
    _core.gpu_pool_clear()


class Session:
    """What ``get_session`` returns: the device graphs run on, with a TF-style ``run``.

    Code written for the TensorFlow backend that calls ``K.get_session().run(...)`` keeps
    working; ``close`` and the context-manager protocol are accepted and change nothing.
    """

    def __init__(self, device=None):
        self.device = device if device is not None else _core.device()
        self.graph = None

    def run(self, fetches, feed_dict=None):
        """Evaluates ``fetches`` (a tensor or a list of tensors) with ``feed_dict`` values
        for placeholders, and returns NumPy arrays in the same structure. As in TensorFlow,
        fetching an update op (``K.update``, ``K.update_add``, ...) also assigns it; all of
        them are computed from the values before the call."""
        single = not isinstance(fetches, (list, tuple))
        outs = [fetches] if single else list(fetches)
        feed_dict = dict(feed_dict or {})
        updates = [o for o in outs if isinstance(o, _Update)]
        f = function(list(feed_dict.keys()), outs, updates=updates)
        res = f(list(feed_dict.values()))
        return res[0] if single else res

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __repr__(self):
        return f"<ferrokeras.Session device={self.device!r}>"


_SESSION = None


def get_session(op_input_list=()):
    """Returns the session object: the current device and its caches.

    Arguments:
        op_input_list: Accepted for compatibility with the TensorFlow backend; unused.

    Returns:
        A ``Session`` with a ``device`` attribute and a TF-style ``run(fetches, feed_dict)``.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> x = K.placeholder(shape=(2,))
        >>> K.get_session().run(x * 2, feed_dict={x: np.array([1.0, 2.0])})
        array([2., 4.], dtype=float32)
    """
    del op_input_list
    global _SESSION
    if _SESSION is None:
        _SESSION = Session()
    return _SESSION


def set_session(session):
    """Sets the global session returned by ``get_session``.

    Arguments:
        session: A ``Session`` (as returned by ``get_session``).

    Raises:
        TypeError: if ``session`` is not a ``Session``.
    """
    global _SESSION
    if not isinstance(session, Session):
        raise TypeError(
            f"set_session: expected a ferrokeras Session (from K.get_session()), got {type(session).__name__}"
        )
    _SESSION = session


__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
