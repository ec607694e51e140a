"""Graph context managers: variable name scopes and update ordering (``control_dependencies``).

Keras's engine and stateful metrics use both; they are part of the backends of Keras 2.3.1
and of ``tf.keras.backend``.
"""

import contextlib

from .. import tensor as _tensor
from ..tensor import Variable
from .variables import update


@contextlib.contextmanager
def name_scope(name):
    """A context manager that prefixes the names of variables created inside it.

    Keras builds each layer inside ``name_scope(layer.name)``, so a layer's weights are
    named ``'dense_1/kernel'``, as under Keras's Theano and TensorFlow backends (weight
    names must be unique within a layer when a model is saved to HDF5).

    Arguments:
        name: String, the scope name.

    Example:
        >>> from ferrokeras import backend as K
        >>> with K.name_scope('block'):
        ...     v = K.variable(1.0, name='w')
        >>> v.name
        'block/w'
    """
    if not isinstance(name, str):
        raise TypeError(f"name_scope: name must be a string, got {type(name).__name__}")
    _tensor._NAME_SCOPE.append(name)
    try:
        yield name
    finally:
        _tensor._NAME_SCOPE.pop()


def _updates_in(ops):
    if ops is None:
        return
    if isinstance(ops, (list, tuple)):
        if len(ops) == 2 and isinstance(ops[0], Variable) and not isinstance(ops[1], (list, tuple)):
            yield update(ops[0], ops[1])
            return
        for op in ops:
            yield from _updates_in(op)
        return
    if getattr(ops, "_target", None) is not None:
        yield ops


@contextlib.contextmanager
def control_dependencies(control_inputs):
    """A context manager inside which values read from variables see the updates in
    ``control_inputs`` applied, as with ``tf.control_dependencies``.

    Keras's stateful metrics build their result (``total / count``) inside
    ``control_dependencies(update_ops)``: the value a training step reports then includes
    that step's batch. ferrokeras graphs are pure (a ``function`` computes every output and
    update from the values before the call), so here a variable that an update in
    ``control_inputs`` assigns reads, inside the block, as the value assigned; the update
    itself still has to be passed to ``function`` to take effect. Outside the block the
    variable reads as usual. Other entries (tensors, ``None``) impose no ordering on a pure
    graph and are ignored.

    Arguments:
        control_inputs: List of update ops (``K.update(...)``, ``K.update_add(...)``,
            ``(variable, new_value)`` pairs) or tensors; ``None`` is allowed.

    Example:
        >>> from ferrokeras import backend as K
        >>> total = K.variable(1.0)
        >>> op = K.update_add(total, 2.0)
        >>> with K.control_dependencies([op]):
        ...     result = total * 10
        >>> f = K.function([], [result], updates=[op])
        >>> f([])[0], K.get_value(total)
        (np.float32(30.0), array(3., dtype=float32))
    """
    saved = []
    for op in _updates_in(control_inputs):
        var = op._target
        saved.append((var, var._core))
        var._core = op._core
    try:
        yield
    finally:
        for var, core in reversed(saved):
            var._core = core


__all__ = ["name_scope", "control_dependencies"]
