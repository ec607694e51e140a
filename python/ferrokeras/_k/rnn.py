"""Sequences and loops: ``rnn``, ``map_fn``, ``foldl`` and ``foldr``.

All of them run on one loop primitive: the step function is traced once on placeholders
into a body subgraph, which the runtime executes once per step. Graph size and compile
time do not depend on the number of steps, and the gradient is a reverse loop.
"""

import numpy as np

from .. import _core
from ..tensor import wrap
from .common import _t
from .shapes import _dims, _shape_tensor
from .variables import cast


def _body_placeholder(like, what, i, drop_first=True):
    dims = list(like.shape)[1:] if drop_first else list(like.shape)
    t = wrap(_core.placeholder(f"{what}_{i}", dims, like.dtype, None), name=f"{what}_{i}")
    t._uses_learning_phase = False
    return t


def _as_list(x):
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def _time_major(x):
    perm = [1, 0] + list(range(2, x.ndim))
    return wrap(_core.transpose(x._core, perm))


def _check_step_result(result, n_states):
    if not isinstance(result, (list, tuple)) or len(result) != 2:
        raise ValueError("rnn: step_function must return a pair (output, new_states)")
    output, new_states = result
    new_states = _as_list(new_states)
    if len(new_states) != n_states:
        raise ValueError(
            f"rnn: step_function returned {len(new_states)} states, expected {n_states}"
        )
    return _t(output), [_t(s) for s in new_states]


def rnn(
    step_function,
    inputs,
    initial_states,
    go_backwards=False,
    mask=None,
    constants=None,
    unroll=False,
    input_length=None,
):
    """Iterates over the time dimension of a tensor.

    Arguments:
        step_function: ``(inputs_t, states + constants) -> (output_t, new_states)``, where
            ``inputs_t`` has shape ``(samples, ...)`` and ``new_states`` is a list of
            tensors with the shapes of ``states``.
        inputs: Tensor of temporal data of shape ``(samples, time, ...)`` (at least 3D).
        initial_states: List of tensors of shape ``(samples, ...)``.
        go_backwards: If True, iterate over the time dimension in reverse order and return
            the reversed sequence.
        mask: Binary tensor of shape ``(samples, time)`` (or ``(samples, time, 1)``), with
            a zero for every masked step: a masked step keeps the previous states and output.
        constants: List of tensors passed to the step function at every step.
        unroll: Whether to unroll the loop in the graph (needs a static number of steps).
        input_length: Static number of timesteps (unused; the length is read from ``inputs``).

    Returns:
        A tuple ``(last_output, outputs, new_states)``: the latest output of the rnn of
        shape ``(samples, ...)``, all outputs of shape ``(samples, time, ...)``, and the
        latest states, each of shape ``(samples, ...)``. ``new_states`` is a list, as
        documented, whatever sequence ``initial_states`` is (TensorFlow returns it in the
        structure of ``initial_states``, a tuple for a tuple).

    Raises:
        ValueError: if ``inputs`` has rank < 3, if the mask has the wrong shape, or if the
            step function changes the shape of a state.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> x = K.constant(np.ones((2, 5, 3)))
        >>> def step(x_t, states):
        ...     s = states[0] + K.sum(x_t, axis=-1, keepdims=True)
        ...     return s, [s]
        >>> last, outs, states = K.rnn(step, x, [K.zeros((2, 1))])
        >>> K.eval(last)
        array([[15.],
               [15.]], dtype=float32)
    """
    del input_length
    inputs = _t(inputs)
    if inputs.ndim < 3:
        raise ValueError(
            f"rnn: inputs must be at least 3D (samples, time, ...), got shape {tuple(inputs.shape)}"
        )
    if inputs.shape[1] == 0:
        # As in TensorFlow: with no step there is no last output to return.
        raise ValueError(
            f"rnn: inputs of shape {tuple(inputs.shape)} have no timesteps (axis 1 is 0); rnn needs at least one"
        )
    states = [_t(s) for s in _as_list(initial_states)]
    constants = [_t(c) for c in _as_list(constants)]
    x = _time_major(inputs)
    if mask is not None:
        mask = _t(mask)
        if mask.dtype != "bool":
            mask = wrap(_core.cast(mask._core, "bool"))
        if mask.ndim == 2:
            mask = wrap(_core.expand_dims(mask._core, [2]))
        if mask.ndim != 3 or (mask.shape[2] not in (1, None)):
            raise ValueError(
                f"rnn: mask must have shape (samples, time) or (samples, time, 1), got {tuple(mask.shape)}"
            )
        for a, b in zip(mask.shape[:2], inputs.shape[:2]):
            if a is not None and b is not None and a != b:
                raise ValueError(
                    f"rnn: mask of shape {tuple(mask.shape)} does not match inputs of shape {tuple(inputs.shape)}"
                )
        mask = _time_major(mask)
    if go_backwards:
        x = wrap(_core.reverse(x._core, [0]))
        if mask is not None:
            mask = wrap(_core.reverse(mask._core, [0]))
    if unroll:
        return _rnn_unrolled(step_function, x, states, mask, constants)

    x_ph = _body_placeholder(x, "rnn_input", 0)
    state_phs = [
        _body_placeholder(s, "rnn_state", i, drop_first=False) for i, s in enumerate(states)
    ]
    output, new_states = _check_step_result(
        step_function(x_ph, list(state_phs) + constants), len(states)
    )
    seqs, seq_phs = [x], [x_ph]
    init, phs, nexts = list(states), list(state_phs), list(new_states)
    if mask is not None:
        m_ph = _body_placeholder(mask, "rnn_mask", 0)
        seqs.append(mask)
        seq_phs.append(m_ph)
        # The previous output is carried as one more state, so masked steps can repeat it.
        prev_ph = _body_placeholder(output, "rnn_prev_output", 0, drop_first=False)
        out_init = _zeros_for(output, inputs)
        nexts = [_masked(m_ph, n, s) for n, s in zip(new_states, state_phs)]
        output = _masked(m_ph, output, prev_ph)
        init.append(out_init)
        phs.append(prev_ph)
        nexts.append(output)
    res = _core.loop_(
        [s._core for s in seqs],
        [s._core for s in init],
        [p._core for p in seq_phs],
        [p._core for p in phs],
        [output._core],
        [n._core for n in nexts],
        False,
    )
    outputs = wrap(res[0])
    final = [wrap(r) for r in res[1 : 1 + len(states)]]
    last = outputs[-1]
    outputs = _time_major(outputs)
    _set_learning_phase_flag(output, [last, outputs] + final)
    return last, outputs, final


def _set_learning_phase_flag(traced, results):
    if getattr(traced, "_uses_learning_phase", False):
        for r in results:
            r._uses_learning_phase = True


def _masked(mask_t, new, old):
    """Where the mask is False keep ``old``; ``mask_t`` is (samples, 1) and broadcasts."""
    m = mask_t
    extra = new.ndim - m.ndim
    if extra > 0:
        m = wrap(_core.expand_dims(m._core, list(range(m.ndim, m.ndim + extra))))
    return wrap(_core.select(m._core, new._core, old._core))


def _zeros_for(output, inputs):
    """Zeros shaped like one step's output, with the batch size read from ``inputs``."""

    dims = [_dims(inputs)[0]] + list(output.shape)[1:]
    if any(d is None for d in dims[1:]):
        raise ValueError(
            f"rnn: masked outputs need a static output shape, got {tuple(output.shape)}"
        )
    zero = _core.constant(np.zeros((), dtype=output.dtype))
    return wrap(_core.broadcast_to(zero, _shape_tensor(dims)))


def _rnn_unrolled(step_function, x, states, mask, constants):
    steps = x.shape[0]
    if steps is None:
        raise ValueError("rnn: unroll=True needs a static number of timesteps")
    outputs = []
    prev = None
    for t in range(steps):
        output, new_states = _check_step_result(
            step_function(x[t], list(states) + constants), len(states)
        )
        if mask is not None:
            m = mask[t]
            if prev is None:
                prev = output * 0
            new_states = [_masked(m, n, s) for n, s in zip(new_states, states)]
            output = _masked(m, output, prev)
            prev = output
        states = new_states
        outputs.append(output)
    stacked = wrap(_core.concat([_core.expand_dims(o._core, [1]) for o in outputs], 1))
    return outputs[-1], stacked, states


def map_fn(fn, elems, name=None, dtype=None):
    """Map the function ``fn`` over the elements ``elems`` (along axis 0) and return the
    stacked outputs.

    Arguments:
        fn: Callable applied to each element of ``elems``.
        elems: Tensor.
        name: A string name for the map node in the graph.
        dtype: Output data type (the output is cast to it when given).

    Returns:
        Tensor with dtype ``dtype`` (or ``fn``'s), stacking ``fn(elems[i])``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.map_fn(lambda x: x * x, K.constant([1., 2., 3.])))
        array([1., 4., 9.], dtype=float32)
    """
    del name
    elems = _t(elems)
    if elems.ndim < 1:
        raise ValueError("map_fn: elems must have at least one axis to map over")
    ph = _body_placeholder(elems, "map_elem", 0)
    out = _t(fn(ph))
    if dtype is not None:
        out = cast(out, dtype)
    res = _core.loop_([elems._core], [], [ph._core], [], [out._core], [], False)
    return wrap(res[0])


def _fold(fn, elems, initializer, reverse):
    elems = _t(elems)
    if elems.ndim < 1:
        raise ValueError("fold: elems must have at least one axis to fold over")
    if reverse:
        elems = wrap(_core.reverse(elems._core, [0]))
    if initializer is None:
        init, elems = elems[0], elems[1:]
    else:
        init = _t(initializer)
    x_ph = _body_placeholder(elems, "fold_elem", 0)
    acc_ph = _body_placeholder(init, "fold_acc", 0, drop_first=False)
    new = _t(fn(acc_ph, x_ph))
    if new.dtype != init.dtype:
        raise TypeError(
            f"fold: fn returns dtype {new.dtype}, but the accumulator has dtype {init.dtype}"
        )
    res = _core.loop_(
        [elems._core], [init._core], [x_ph._core], [acc_ph._core], [], [new._core], False
    )
    return wrap(res[0])


def foldl(fn, elems, initializer=None, name=None):
    """Reduce ``elems`` using ``fn`` to combine them from left to right.

    Arguments:
        fn: Callable ``fn(acc, x)`` returning the new accumulator.
        elems: Tensor, folded along axis 0.
        initializer: The first value used (``elems[0]`` in case of None).
        name: A string name for the foldl node in the graph.

    Returns:
        Tensor with the same type and shape as ``initializer``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.foldl(lambda acc, x: acc + x, K.constant([1., 2., 3.])))
        array(6., dtype=float32)
    """
    del name
    return _fold(fn, elems, initializer, reverse=False)


def foldr(fn, elems, initializer=None, name=None):
    """Reduce ``elems`` using ``fn`` to combine them from right to left.

    Arguments:
        fn: Callable ``fn(acc, x)`` returning the new accumulator.
        elems: Tensor, folded along axis 0 from the last element.
        initializer: The first value used (``elems[-1]`` in case of None).
        name: A string name for the foldr node in the graph.

    Returns:
        Tensor with the same type and shape as ``initializer``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.foldr(lambda acc, x: acc - x, K.constant([1., 2., 10.])))
        array(7., dtype=float32)
    """
    del name
    return _fold(fn, elems, initializer, reverse=True)


__all__ = ["rnn", "map_fn", "foldl", "foldr"]
