"""Connectionist temporal classification: ``ctc_batch_cost``, ``ctc_decode`` and
``ctc_label_dense_to_sparse``, as in Keras's TensorFlow backend (blank = last class)."""

import numpy as np

from .. import _core
from ..config import epsilon
from ..tensor import wrap
from .common import _int, _t
from .layout import arange
from .math import log
from .nn import softmax
from .pyfunc import py_function
from .variables import cast, shape


class SparseTensor:
    """A sparse int tensor as TensorFlow's: ``indices`` (N, 2), ``values`` (N,) and
    ``dense_shape`` (2,); ``K.to_dense`` returns the dense form (zeros elsewhere)."""

    _is_sparse = True

    def __init__(self, indices, values, dense_shape, dense):
        self.indices, self.values, self.dense_shape, self._dense = (
            indices,
            values,
            dense_shape,
            dense,
        )

    def __repr__(self):
        return f"<ferrokeras.SparseTensor dense_shape={tuple(self._dense.shape)}>"


def _lengths(x, what):
    x = _t(x)
    if x.ndim == 2:
        if x.shape[1] not in (1, None):
            raise ValueError(
                f"{what} must have shape (samples,) or (samples, 1), got {tuple(x.shape)}"
            )
        x = wrap(_core.squeeze(x._core, [1]))
    elif x.ndim != 1:
        raise ValueError(f"{what} must have shape (samples,) or (samples, 1), got {tuple(x.shape)}")
    return cast(x, "int32")


def _sparse_parts(labels, lengths):
    labels, lengths = np.asarray(labels), np.asarray(lengths)
    mask = np.arange(labels.shape[1])[None, :] < lengths.reshape(-1, 1)
    return [np.argwhere(mask).astype(np.int64), labels[mask].astype(np.int32)]


def ctc_label_dense_to_sparse(labels, label_lengths):
    """Converts CTC labels from dense to sparse.

    Arguments:
        labels: dense CTC labels, shape ``(samples, max_label_length)``.
        label_lengths: length of the labels, shape ``(samples,)``.

    Returns:
        A sparse tensor (``indices``, ``values``, ``dense_shape``) of the labels; ``K.to_dense``
        gives the labels back with zeros past each length.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> st = K.ctc_label_dense_to_sparse(K.constant([[1, 2, 0], [3, 0, 0]], dtype='int32'), K.constant([2, 1], dtype='int32'))
        >>> K.eval(st.values)
        array([1, 2, 3], dtype=int32)
    """

    labels = cast(_t(labels), "int32")
    lengths = _lengths(label_lengths, "label_lengths")
    if labels.ndim != 2:
        raise ValueError(
            f"ctc_label_dense_to_sparse: labels must have shape (samples, max_label_length), got {tuple(labels.shape)}"
        )
    indices, values = py_function(
        _sparse_parts, [labels, lengths], ["int64", "int32"], name="ctc_label_dense_to_sparse"
    )
    if labels.shape[1] is not None:
        steps = wrap(_core.constant(np.arange(labels.shape[1], dtype=np.int32)))
    else:
        steps = arange(shape(labels)[1])
    keep = wrap(
        _core.binary(
            "less", _core.expand_dims(steps._core, [0]), _core.expand_dims(lengths._core, [1])
        )
    )
    dense = wrap(_core.select(keep._core, labels._core, _core.constant(np.zeros((), np.int32))))
    return SparseTensor(indices, values, cast(shape(labels), "int64"), dense)


def ctc_batch_cost(y_true, y_pred, input_length, label_length):
    """Runs the CTC loss algorithm on each batch element.

    Arguments:
        y_true: tensor ``(samples, max_string_length)`` containing the truth labels. As in
            TensorFlow, a label at or past the blank class (``num_categories - 1``) ends a
            sample's label early (a label that is just the blank is the empty label); a
            real label after it is an error.
        y_pred: tensor ``(samples, time_steps, num_categories)`` containing the prediction,
            or output of the softmax; the last category is the blank.
        input_length: tensor ``(samples, 1)`` containing the sequence length for each
            batch item in ``y_pred``.
        label_length: tensor ``(samples, 1)`` containing the sequence length for each
            batch item in ``y_true``.

    Returns:
        Tensor with shape ``(samples, 1)`` containing the CTC loss of each element. A
        label that fits its input only without the blanks its repeats need (``[1, 1, 1]``
        in 3 steps) has no path: its loss is ``inf`` and its gradient 0, as in TensorFlow.

    Raises:
        ValueError: (when run) if a label is longer than its input, negative, or follows
            the end of the label.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> y_pred = K.constant(np.full((1, 2, 2), 0.5))
        >>> loss = K.ctc_batch_cost(K.constant([[0]]), y_pred, K.constant([[2]]), K.constant([[1]]))
        >>> np.round(K.eval(loss), 4)   # -log(3 paths * 0.25)
        array([[0.2877]], dtype=float32)
    """

    y_pred = _t(y_pred)
    if y_pred.ndim != 3:
        raise ValueError(
            f"ctc_batch_cost: y_pred must have shape (samples, time_steps, num_categories), got {tuple(y_pred.shape)}"
        )
    labels = cast(_t(y_true), "int32")
    if labels.ndim != 2:
        raise ValueError(
            f"ctc_batch_cost: y_true must have shape (samples, max_string_length), got {tuple(labels.shape)}"
        )
    il = _lengths(input_length, "input_length")
    ll = _lengths(label_length, "label_length")
    logits = log(y_pred + epsilon())
    loss = wrap(_core.ctc_loss(logits._core, labels._core, il._core, ll._core))
    return wrap(_core.expand_dims(loss._core, [1]))


def ctc_decode(y_pred, input_length, greedy=True, beam_width=100, top_paths=1):
    """Decodes the output of a softmax, by best path (greedy) or constrained beam search.

    Arguments:
        y_pred: tensor ``(samples, time_steps, num_categories)`` containing the prediction,
            or output of the softmax.
        input_length: tensor ``(samples,)`` containing the sequence length for each batch
            item in ``y_pred``.
        greedy: perform much faster best-path search if ``True``.
        beam_width: if ``greedy`` is ``False``: the width of the beam search.
        top_paths: if ``greedy`` is ``False``: how many of the most probable paths are returned.

    Returns:
        Tuple ``(decoded, log_prob)``: ``decoded`` is a list of ``top_paths`` int64 tensors
        ``(samples, max_decoded_length)`` padded with -1; ``log_prob`` is ``(samples,
        top_paths)``: for greedy decoding the negative sum of the best log-probabilities per
        step (as TensorFlow), for beam search the score TensorFlow's beam search decoder
        gives each path (its probability summed over the alignments its beam kept; the
        search follows TF's step by step, so paths and scores are TF's). As in
        TensorFlow, whose beam search decoder merges repeated labels by default, a beam
        path's repeated labels are merged (``[2, 1, 1]`` is returned as ``[2, 1]``, with the
        score of ``[2, 1, 1]``). The decoded
        width is Keras 2.3.1's (the longest decoded sequence); TensorFlow 2's
        ``tf.keras.backend.ctc_decode`` pads to ``time_steps`` columns instead.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> p = np.array([[[0.1, 0.8, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.8, 0.1, 0.1]]])
        >>> decoded, _ = K.ctc_decode(K.constant(p), K.constant([4]))
        >>> K.eval(decoded[0])
        array([[1, 0]])
    """

    y_pred = _t(y_pred)
    if y_pred.ndim != 3:
        raise ValueError(
            f"ctc_decode: y_pred must have shape (samples, time_steps, num_categories), got {tuple(y_pred.shape)}"
        )
    il = _lengths(input_length, "input_length")
    beam_width, top_paths = _int(beam_width, "beam_width"), _int(top_paths, "top_paths")
    if beam_width < 1 or top_paths < 1 or (not greedy and top_paths > beam_width):
        raise ValueError(
            f"ctc_decode: need 1 <= top_paths <= beam_width, got top_paths={top_paths}, beam_width={beam_width}"
        )
    scores = log(y_pred + epsilon())
    if not greedy:
        scores = log(softmax(scores, axis=-1))
    res = [
        wrap(r)
        for r in _core.ctc_decode(scores._core, il._core, bool(greedy), beam_width, top_paths)
    ]
    return res[:-1], res[-1]


__all__ = ["ctc_label_dense_to_sparse", "ctc_batch_cost", "ctc_decode", "SparseTensor"]
