"""Activations, crossentropies, normalisation and bias: composites of elementwise ops and
reductions, written to stay finite for inputs of any magnitude.

Stability rules used throughout: softmax-like expressions subtract the (gradient-stopped)
maximum first; log-sigmoid terms are written with ``log1p(exp(-|x|))``; the branch of a
``select`` that is not taken gets a clamped input, so it cannot produce inf or NaN that
would leak into the gradient.
"""

import builtins as _b

import numpy as np

from .. import _core
from ..config import epsilon
from ..tensor import Tensor, wrap
from .common import _INTS, _axis, _check_float, _data_format, _int, _t
from .function import stop_gradient
from .layout import _int_tensor, _one_hot_mask, arange
from .linalg import _reshape
from .math import _bin, _unary, clip, exp, log, max, mean, square, sum
from .shapes import _dims, _prod
from .variables import cast, zeros_like


def _nonzero(v):
    """True unless ``v`` is the Python/NumPy number 0 (a tensor counts as non-zero)."""
    return isinstance(v, Tensor) or v != 0


def _number_or_tensor(v, fn, what):
    if isinstance(v, Tensor):
        if v.ndim != 0:
            raise ValueError(
                f"{fn}: {what} must be a scalar, got a tensor of shape {tuple(v.shape)}"
            )
        return v
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v.item()  # Keras passes K.cast_to_floatx(alpha), a 0-d array
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: {what} must be a number or a scalar tensor, got {v!r}")
    return v


# =============================================================== activations


def relu(x, alpha=0.0, max_value=None, threshold=0.0):
    """Rectified linear unit.

    With default values, it returns element-wise ``max(x, 0)``. Otherwise:
    ``f(x) = max_value`` for ``x >= max_value``, ``f(x) = x`` for
    ``threshold < x < max_value``, ``f(x) = alpha * (x - threshold)`` otherwise.

    Two details follow TensorFlow rather than that description: at ``x == threshold``
    the result is ``0`` (TF keeps ``x > threshold``), and with a ``max_value`` the
    kept part is clipped to ``[0, max_value]``, so a negative ``threshold`` gives ``0``,
    not ``x``, for ``threshold < x < 0`` (as Keras's NumPy reference backend does too).
    With ``alpha`` alone (no ``threshold``, no ``max_value``) it is TF's ``leaky_relu``:
    ``x`` where ``x > 0``, else ``alpha * x``, whose gradient is ``alpha`` at ``x <= 0``.

    Arguments:
        x: A tensor or variable.
        alpha: A scalar, slope of negative section (default ``0.``).
        max_value: Saturation threshold (None: no upper bound).
        threshold: A scalar, threshold value for thresholded activation.

    Returns:
        A tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.relu(K.constant([-2.0, 1.0, 8.0]), alpha=0.1, max_value=6.0))
        array([-0.2,  1. ,  6. ], dtype=float32)
        >>> K.eval(K.relu(K.constant([-0.5, 0.25]), alpha=0.1, max_value=5.0, threshold=-2.8))
        array([0.  , 0.25], dtype=float32)
    """
    x = _t(x)
    alpha = _number_or_tensor(alpha, "relu", "alpha")
    threshold = _number_or_tensor(threshold, "relu", "threshold")
    if max_value is not None:
        max_value = _number_or_tensor(max_value, "relu", "max_value")
    if _nonzero(alpha) and max_value is None and not _nonzero(threshold):
        # TF's leaky_relu, which Keras 2.3.1 calls for these arguments: x where x > 0,
        # else alpha * x; its gradient reads x, as TF's LeakyReluGrad does.
        return wrap(
            _core.select(_bin("greater", x, 0)._core, x._core, _bin("multiply", alpha, x)._core)
        )
    if _nonzero(alpha):
        neg = _unary("relu", _bin("subtract", threshold, x) if _nonzero(threshold) else -x)
    if _nonzero(threshold):
        # x for x > threshold (TF), NaN kept; a select, not x * mask, which is NaN at -inf
        keep = _unary("logical_not", _bin("less_equal", x, threshold))
        out = wrap(_core.select(keep._core, x._core, zeros_like(x)._core))
        if max_value is not None and (isinstance(threshold, Tensor) or threshold < 0):
            out = _bin("maximum", out, 0)  # TF's clip_by_value(x, 0, max_value)
    else:
        out = _unary("relu", x)
    if max_value is not None:
        if not _nonzero(threshold) and not isinstance(max_value, Tensor) and max_value == 6:
            # tf.nn.relu6, which Keras calls for this cap without a threshold: its gradient
            # is 0 at x == 6 (at a tie `minimum`'s gradient goes to its first operand).
            out = _bin("minimum", max_value, out)
        else:
            out = _bin("minimum", out, max_value)
    if _nonzero(alpha):
        out = out - _bin("multiply", alpha, neg)
    return out


def elu(x, alpha=1.0):
    """Exponential linear unit: ``x`` for ``x > 0``, ``alpha * (exp(x) - 1)`` otherwise.

    As in Keras's TensorFlow backend: TF's ``elu`` (the primitive ``elu``, whose gradient
    reads its output, as TF's ``EluGrad``: ``g`` at ``x >= 0`` and at NaN), and for
    ``alpha != 1`` that result where it is positive, else ``alpha`` times it.

    Arguments:
        x: A tensor or variable to compute the activation function for.
        alpha: A scalar, slope of negative section.

    Returns:
        A tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.elu(K.constant([-1.0, 2.0]), alpha=2.0))
        array([-1.2642411,  2.       ], dtype=float32)
    """
    x = _check_float(_t(x), "elu")
    alpha = _number_or_tensor(alpha, "elu", "alpha")
    res = _unary("elu", x)
    if not isinstance(alpha, Tensor) and alpha == 1:
        return res
    # TF: where(x > 0, res, alpha * res); `res > 0` is the same mask (NaN included), and
    # the backward then keeps `res` alone.
    return wrap(
        _core.select(_bin("greater", res, 0)._core, res._core, _bin("multiply", alpha, res)._core)
    )


def _log_softmax(x, axis):
    m = stop_gradient(max(x, axis, keepdims=True))
    z = x - m
    return z - log(sum(exp(z), axis, keepdims=True))


def _where_nan(x, v):
    """``x`` with its NaN entries replaced by the number ``v``."""
    v = _t(np.asarray(v, dtype=x.dtype))
    return wrap(_core.select(_bin("not_equal", x, x)._core, v._core, x._core))


def softmax(x, axis=-1):
    """Softmax of a tensor along ``axis``, stable for inputs of any magnitude.

    A slice along ``axis`` holding ``+inf`` or NaN gives NaN at those entries and 0 at the
    others, as TensorFlow does (``[inf, 1, 2]`` -> ``[nan, 0, 0]``); a slice of ``-inf``
    only gives NaN throughout.

    Arguments:
        x: A tensor or variable.
        axis: The dimension softmax is performed on (default ``-1``, the last).

    Returns:
        A tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.softmax(K.constant([[1e4, 1e4, -1e4]])))
        array([[0.5, 0.5, 0. ]], dtype=float32)
    """
    x = _check_float(_t(x), "softmax")
    a = _axis(axis, x.ndim, "softmax")
    # A slice holding NaN has a NaN maximum (NaN wins max); taken as +inf, like a slice
    # holding +inf, every finite entry gets exp(-inf) = 0 and the +inf/NaN ones NaN. The
    # sum of such a slice is NaN and is replaced by 1, which keeps those 0s; any other sum
    # is at least 1 (the maximum's own exp(0)).
    m = max(x, a, keepdims=True)
    m = stop_gradient(_where_nan(m, np.inf))
    e = exp(x - m)
    out = e / _where_nan(sum(e, a, keepdims=True), 1.0)
    out._logits_of = ("softmax", x, a)
    return out


def softplus(x):
    """Softplus of a tensor, ``log(exp(x) + 1)``, stable for inputs of any magnitude.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.softplus(K.constant([-1e4, 0.0, 1e4])))
        array([0.000000e+00, 6.931472e-01, 1.000000e+04], dtype=float32)
    """
    return _unary("softplus", _check_float(_t(x), "softplus"))


def softsign(x):
    """Softsign of a tensor, ``x / (1 + |x|)``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.softsign(K.constant([-3.0, 1.0])))
        array([-0.75,  0.5 ], dtype=float32)
    """
    x = _check_float(_t(x), "softsign")
    # inf / inf would be NaN: the limit at +-inf is +-1 (and the unused branch sees 0, so
    # the gradient stays finite there too)
    finite = _bin("less", _unary("abs", x), np.inf)
    xs = wrap(_core.select(finite._core, x._core, zeros_like(x)._core))
    return wrap(
        _core.select(finite._core, (xs / (_unary("abs", xs) + 1))._core, _unary("sign", x)._core)
    )


def hard_sigmoid(x):
    """Segment-wise linear approximation of sigmoid.

    Returns ``0.`` if ``x < -2.5``, ``1.`` if ``x > 2.5``, and ``0.2 * x + 0.5`` in
    between.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.hard_sigmoid(K.constant([-3.0, 0.5, 3.0])))
        array([0. , 0.6, 1. ], dtype=float32)
    """
    x = _check_float(_t(x), "hard_sigmoid")
    return clip(x * 0.2 + 0.5, 0.0, 1.0)


# =============================================================== crossentropies


def _logits_of(output, kind, axis=None):
    """The pre-activation input of ``output`` when ``output`` is a ``K.softmax`` (along
    ``axis``) or ``K.sigmoid`` result not produced by a Keras layer, as in TF 2: the loss
    is then computed from logits, which never saturates."""
    tag = getattr(output, "_logits_of", None)
    if tag is None or tag[0] != kind or hasattr(output, "_keras_history"):
        return None
    if kind == "softmax" and tag[2] != axis:
        return None
    return tag[1]


def _prepare(target, output, fn, same_shape=True):
    output = _check_float(_t(output), fn, "output")
    if output.ndim == 0:
        raise ValueError(f"{fn}: output must have at least one axis, got a scalar")
    if same_shape:
        target = _t(target, like=output) if not isinstance(target, Tensor) else target
        if target.dtype != output.dtype:
            target = cast(target, output.dtype)
        ts, os_ = tuple(target.shape), tuple(output.shape)
        if len(ts) != len(os_) or _b.any(
            a is not None and b is not None and a != b for a, b in zip(ts, os_)
        ):
            raise ValueError(
                f"{fn}: target and output must have the same shape, got {ts} and {os_}"
            )
    return target, output


def categorical_crossentropy(target, output, from_logits=False, axis=-1):
    """Categorical crossentropy between an output tensor and a target tensor.

    Probabilities are rescaled to sum to 1 along ``axis`` and clipped to
    ``[epsilon, 1 - epsilon]`` before the log (TF 2). From logits (or from a ``K.softmax``
    result not produced by a layer) the loss is ``-sum(target * log_softmax(logits))``,
    stable for logits of any magnitude.

    Arguments:
        target: A tensor of the same shape as ``output``.
        output: A tensor resulting from a softmax (unless ``from_logits`` is True, in
            which case ``output`` is expected to be the logits).
        from_logits: Boolean, whether ``output`` is the result of a softmax, or is a
            tensor of logits.
        axis: The class axis (default ``-1``).

    Returns:
        Output tensor, with ``axis`` reduced.

    Raises:
        ValueError: if the shapes differ or ``axis`` is out of range.

    Example:
        >>> from ferrokeras import backend as K
        >>> t = K.constant([[0.0, 1.0]]); logits = K.constant([[0.0, 1e4]])
        >>> K.eval(K.categorical_crossentropy(t, logits, from_logits=True))
        array([0.], dtype=float32)
    """
    fn = "categorical_crossentropy"
    target, output = _prepare(target, output, fn)
    a = _axis(axis, output.ndim, fn)
    logits = output if from_logits else _logits_of(output, "softmax", a)
    if logits is not None:
        return 0.0 - sum(target * _log_softmax(logits, a), a)  # 0 - s: no -0.0 for a zero loss
    p = output / sum(output, a, keepdims=True)
    p = clip(p, epsilon(), 1.0 - epsilon())
    return 0.0 - sum(target * log(p), a)


def sparse_categorical_crossentropy(target, output, from_logits=False, axis=-1):
    """Categorical crossentropy with integer targets.

    Probabilities are clipped to ``[epsilon, 1 - epsilon]`` and the loss is
    ``-log(p[target] / sum(p))`` (TF 2); from logits it is
    ``-log_softmax(logits)[target]``, stable for logits of any magnitude. A target outside
    ``[0, classes)`` makes the call that computes the loss raise ``ValueError`` naming it
    (TF raises ``InvalidArgumentError``), and that call applies none of its updates.

    Arguments:
        target: An integer tensor (float tensors holding integers are cast, as Keras
            feeds them), of ``output``'s shape without the class axis, or any shape with
            one label per such position (Keras's targets have ``output``'s rank with a
            class axis of size 1): it is then flattened, as in TensorFlow.
        output: A tensor resulting from a softmax (unless ``from_logits`` is True, in
            which case ``output`` is expected to be the logits).
        from_logits: Boolean, whether ``output`` is the result of a softmax, or is a
            tensor of logits.
        axis: The class axis of ``output`` (default ``-1``).

    Returns:
        Output tensor of ``output``'s shape without the class axis.

    Raises:
        ValueError: if ``axis`` is out of range or the shapes do not fit; when run, if a
            target is outside ``[0, classes)``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.sparse_categorical_crossentropy(K.constant([1], dtype='int32'),
        ...                                          K.constant([[0.5, 0.5]])))
        array([0.6931472], dtype=float32)
    """
    fn = "sparse_categorical_crossentropy"
    _, output = _prepare(None, output, fn, same_shape=False)
    target = target if isinstance(target, Tensor) else _t(np.asarray(target))
    if target.dtype in ("float16", "float32", "float64"):
        target = cast(target, "int32")
    elif target.dtype not in _INTS:
        raise TypeError(f"{fn}: target must hold integer class indices, got dtype {target.dtype}")
    a = _axis(axis, output.ndim, fn)
    logits = output if from_logits else _logits_of(output, "softmax", a)
    src = logits if logits is not None else output
    if a != output.ndim - 1:
        perm = [i for i in range(output.ndim) if i != a] + [a]
        src = wrap(_core.transpose(src._core, perm))
    if logits is not None:
        logp = _log_softmax(src, -1)
    else:
        p = clip(src, epsilon(), 1.0 - epsilon())
        logp = log(p) - log(sum(p, -1, keepdims=True))
    d = _dims(logp)
    n_classes = d[-1]
    # A target of another rank than the output without its class axis (Keras feeds one of
    # the output's rank, with a size-1 class axis wherever `axis` is) is flattened to one
    # label per row of the class-last output, as TensorFlow does.
    if target.ndim != logp.ndim - 1:
        nt, nl = target.shape, logp.shape[:-1]
        if _b.all(v is not None for v in (*nt, *nl)) and int(np.prod(nt)) != int(np.prod(nl)):
            raise ValueError(
                f"{fn}: target of shape {tuple(nt)} does not match output of shape {tuple(output.shape)}"
            )
        # Reshaping to the row count (not -1) makes a count known only at run time a
        # ValueError there, instead of a broadcast.
        target = _reshape(target, [_prod(d[:-1])])
        logp = _reshape(logp, [-1, n_classes])
    else:
        ts, ls = tuple(target.shape), tuple(logp.shape[:-1])
        if _b.any(x is not None and y is not None and x != y for x, y in zip(ts, ls)):
            raise ValueError(
                f"{fn}: target of shape {ts} does not match output of shape {tuple(output.shape)} (axis {axis})"
            )
        if None in ts or None in ls:
            target = _reshape(target, d[:-1])
    zero = _t(np.zeros((), dtype=logp.dtype))
    # The one-hot rows of the targets, gathered from an identity: a label out of range
    # makes the call raise (naming it) instead of giving a number.
    classes = arange(n_classes, dtype=target.dtype)
    eye = _core.binary("equal", _core.expand_dims(classes._core, [1]), classes._core)
    mask = _core.gather(eye, target._core, 0)
    picked = sum(wrap(_core.select(mask, logp._core, zero._core)), -1)
    loss = 0.0 - picked
    if loss.ndim != len(d) - 1:
        loss = _reshape(loss, d[:-1])
    return loss


def binary_crossentropy(target, output, from_logits=False):
    """Binary crossentropy between an output tensor and a target tensor (elementwise).

    Probabilities are clipped to ``[epsilon, 1 - epsilon]`` and the loss is
    ``-(t * log(p + epsilon) + (1 - t) * log(1 - p + epsilon))`` (TF 2). From logits (or
    from a ``K.sigmoid`` result not produced by a layer) it is
    ``max(x, 0) - x * t + log(1 + exp(-|x|))``, stable for logits of any magnitude.

    Arguments:
        target: A tensor with the same shape as ``output``.
        output: A tensor.
        from_logits: Whether ``output`` is expected to be a logits tensor. By default,
            we consider that ``output`` encodes a probability distribution.

    Returns:
        A tensor of the shape of ``output``.

    Raises:
        ValueError: if the shapes differ.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.binary_crossentropy(K.constant([1.0, 0.0]), K.constant([1e4, -1e4]),
        ...                              from_logits=True))
        array([0., 0.], dtype=float32)
    """
    fn = "binary_crossentropy"
    output = _check_float(_t(output), fn, "output")
    target = _t(target, like=output) if not isinstance(target, Tensor) else target
    if target.dtype != output.dtype:
        target = cast(target, output.dtype)
    ts, os_ = tuple(target.shape), tuple(output.shape)
    if len(ts) != len(os_) or _b.any(
        a is not None and b is not None and a != b for a, b in zip(ts, os_)
    ):
        raise ValueError(f"{fn}: target and output must have the same shape, got {ts} and {os_}")
    logits = output if from_logits else _logits_of(output, "sigmoid")
    if logits is not None:
        x = logits
        pos = _bin("greater_equal", x, 0)
        ax = wrap(_core.select(pos._core, x._core, (-x)._core))  # |x|, with gradient +1 at 0
        relu_x = wrap(_core.select(pos._core, x._core, _t(0, like=x)._core))
        return relu_x - x * target + _unary("log1p", exp(-ax))
    eps = epsilon()
    p = clip(output, eps, 1.0 - eps)
    return 0.0 - (target * log(p + eps) + (1.0 - target) * log(1.0 - p + eps))


# =============================================================== normalisation


def l2_normalize(x, axis=None):
    """Normalizes a tensor wrt the L2 norm alongside the specified axis:
    ``x / sqrt(max(sum(x ** 2, axis), 1e-12))`` (as ``tf.math.l2_normalize``).

    Arguments:
        x: Tensor or variable.
        axis: axis (int or list of ints) along which to perform normalization; None
            normalizes over all axes.

    Returns:
        A tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.l2_normalize(K.constant([[3.0, 4.0]]), axis=1))
        array([[0.6, 0.8]], dtype=float32)
    """
    x = _check_float(_t(x), "l2_normalize")
    ss = sum(square(x), axis, keepdims=True)
    # 1e-12 rounds to 0 in float16, where a zero vector would then give 0 * inf = NaN
    floor = 1e-12 if x.dtype != "float16" else float(np.finfo(np.float16).smallest_subnormal)
    return x * _unary("rsqrt", _bin("maximum", ss, floor))


def in_top_k(predictions, targets, k):
    """Returns whether the ``targets`` are in the top ``k`` ``predictions``.

    Classes whose prediction ties with the target's are counted as in the top ``k`` (as
    ``tf.math.in_top_k``); a non-finite target prediction or a target out of range gives
    False.

    Arguments:
        predictions: A float tensor of shape ``(batch_size, classes)``.
        targets: A 1D int tensor (or list) of length ``batch_size``.
        k: An ``int``, number of top elements to consider.

    Returns:
        A 1D tensor of length ``batch_size`` and type ``bool``. ``output[i]`` is True if
        ``predictions[i, targets[i]]`` is within top-``k`` values of ``predictions[i]``.

    Raises:
        ValueError: for wrong ranks. TypeError: for non-integer targets or ``k``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.in_top_k(K.constant([[0.1, 0.7, 0.2]]), K.constant([2], dtype='int32'), 2))
        array([ True])
    """
    fn = "in_top_k"
    predictions = _check_float(_t(predictions), fn, "predictions")
    if predictions.ndim != 2:
        raise ValueError(
            f"{fn}: predictions must be 2-D (batch_size, classes), got shape {tuple(predictions.shape)}"
        )
    targets = _int_tensor(targets, f"{fn}: targets")
    if targets.ndim != 1:
        raise ValueError(
            f"{fn}: targets must be 1-D (batch_size,), got shape {tuple(targets.shape)}"
        )
    nb, nt = predictions.shape[0], targets.shape[0]
    if nb is not None and nt is not None and nb != nt:
        raise ValueError(f"{fn}: {nt} targets for a batch of {nb} predictions")
    k = _int(k, f"{fn}: k")
    n_classes = _dims(predictions)[1]
    hit = _one_hot_mask(targets, n_classes)
    neg_inf = _t(np.asarray(-np.inf, dtype=predictions.dtype))
    p_t = max(wrap(_core.select(hit._core, predictions._core, neg_inf._core)), 1, keepdims=True)
    better = sum(cast(_bin("greater", predictions, p_t), "int32"), 1)
    finite = _bin("less", _unary("abs", p_t), np.inf)
    return _bin("logical_and", _bin("less", better, k), wrap(_core.squeeze(finite._core, [1])))


def _param(t, x, axis, fn, what):
    """A batch-norm parameter, broadcast against ``x``: a 1-D tensor is laid along ``axis``."""
    if t is None:
        return None
    t = _t(t, like=x)
    if t.dtype != x.dtype:
        t = cast(t, x.dtype)
    if t.ndim == 1 and x.ndim > 1:
        n, c = t.shape[0], x.shape[axis]
        if n is not None and c is not None and n != c and n != 1:
            raise ValueError(
                f"{fn}: {what} has {n} entries but x has {c} along axis {axis} (shape {tuple(x.shape)})"
            )
        if axis != x.ndim - 1:
            t = wrap(_core.expand_dims(t._core, list(range(1, x.ndim - axis))))
    elif t.ndim > x.ndim:
        raise ValueError(
            f"{fn}: {what} of shape {tuple(t.shape)} has more axes than x of shape {tuple(x.shape)}"
        )
    return t


def batch_normalization(x, mean, var, beta, gamma, epsilon=0.001, axis=-1):
    """Applies batch normalization on x given mean, var, beta and gamma:
    ``output = (x - mean) / sqrt(var + epsilon) * gamma + beta``.

    (The Keras doc writes ``sqrt(var) + epsilon``; every Keras backend adds ``epsilon``
    to the variance, as here.)

    Arguments:
        x: Input tensor or variable.
        mean: Mean of batch.
        var: Variance of batch.
        beta: Tensor with which to center the input (or None).
        gamma: Tensor by which to scale the input (or None).
        epsilon: Fuzz factor.
        axis: The channel axis: 1-D ``mean``/``var``/``beta``/``gamma`` are laid along it
            (TF 2's ``axis`` argument); other parameters broadcast against ``x``.

    Returns:
        A tensor.

    Raises:
        ValueError: if a 1-D parameter does not match the channel dimension.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.constant([[1.0, 2.0], [3.0, 6.0]])
        >>> K.eval(K.batch_normalization(x, K.constant([2.0, 4.0]), K.constant([1.0, 4.0]),
        ...                              None, None, epsilon=0.0))
        array([[-1., -1.],
               [ 1.,  1.]], dtype=float32)
    """
    fn = "batch_normalization"
    x = _check_float(_t(x), fn)
    a = _axis(axis, x.ndim, fn) if x.ndim else 0
    mean, var = _param(mean, x, a, fn, "mean"), _param(var, x, a, fn, "var")
    beta, gamma = _param(beta, x, a, fn, "beta"), _param(gamma, x, a, fn, "gamma")
    inv = _unary("rsqrt", var + float(epsilon))
    if gamma is not None:
        inv = inv * gamma
    out = (x - mean) * inv
    return out + beta if beta is not None else out


def normalize_batch_in_training(x, gamma, beta, reduction_axes, epsilon=0.001):
    """Computes mean and variance over ``reduction_axes``, then applies batch
    normalization on the batch with them.

    Arguments:
        x: Input tensor or variable.
        gamma: Tensor by which to scale the input (or None).
        beta: Tensor with which to center the input (or None).
        reduction_axes: iterable of integers, axes over which to normalize.
        epsilon: Fuzz factor.

    Returns:
        A tuple length of 3, ``(normalized_tensor, mean, variance)``; ``mean`` and
        ``variance`` (the biased, population variance) have the reduced axes removed.
        This is what Keras 2.3.1's TensorFlow backend returns under TF 2, and what
        Keras's ``BatchNormalization`` layer expects (it applies its own Bessel
        correction before updating the moving variance). Under TF 1, and in
        ``tf.keras.backend``, a 4-D ``x`` with ``reduction_axes`` ``[0, 1, 2]`` goes to
        TF's fused batch norm, whose batch variance is already Bessel-corrected; the
        layer then corrects it twice.
        ``gamma`` and ``beta`` are reshaped to ``x``'s rank with 1s on the reduced axes.

    Raises:
        ValueError: for an empty, repeated or out-of-range ``reduction_axes``.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.constant([[1.0, 10.0], [3.0, 30.0]])
        >>> normed, m, v = K.normalize_batch_in_training(x, None, None, [0], epsilon=0.0)
        >>> K.eval(m), K.eval(v)
        (array([ 2., 20.], dtype=float32), array([  1., 100.], dtype=float32))
    """
    fn = "normalize_batch_in_training"
    x = _check_float(_t(x), fn)
    if isinstance(reduction_axes, (int, np.integer)):
        reduction_axes = [reduction_axes]
    if not isinstance(reduction_axes, (list, tuple, range, np.ndarray)) or len(reduction_axes) == 0:
        raise ValueError(
            f"{fn}: reduction_axes must be a non-empty list of axes, got {reduction_axes!r}"
        )
    axes = sorted(_axis(r, x.ndim, fn, "reduction_axes entry") for r in reduction_axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"{fn}: reduction_axes {list(reduction_axes)} repeat an axis")
    m = mean(x, axes, keepdims=True)
    # The output and the variance each centre `x` with a subtraction of their own, so the
    # mean receives two gradients, each a per-channel factor times a full-size tensor,
    # which `sum_like` sums as factor times the sum: the scale times the incoming
    # gradient's sum (beta's gradient), and the variance's gradient times the sum of the
    # centred input, which is zero. The input gradient is then one elementwise pass after
    # the pass that takes the incoming gradient's sums, as in TF's fused batch norm, and
    # derivatives of every order stay exact.
    centred = x - m
    v = mean(square(x - m), axes, keepdims=True)
    d = _dims(x)
    target = [1 if i in axes else d[i] for i in range(x.ndim)]

    def bcast(t, what):
        if t is None:
            return None
        t = _t(t, like=x)
        if t.dtype != x.dtype:
            t = cast(t, x.dtype)
        return t if t.ndim == x.ndim else _reshape(t, target)

    g, b = bcast(gamma, "gamma"), bcast(beta, "beta")
    inv = _unary("rsqrt", v + float(epsilon))
    if g is not None:
        inv = inv * g
    normed = centred * inv
    if b is not None:
        normed = normed + b
    return normed, wrap(_core.squeeze(m._core, axes)), wrap(_core.squeeze(v._core, axes))


def bias_add(x, bias, data_format=None):
    """Adds a bias vector to a tensor.

    A 1-D bias is added along the channel axis (the last for ``channels_last``, axis 1
    for ``channels_first``). A bias of rank ``ndim(x) - 1`` is reshaped to
    ``(1,) + bias.shape`` (``channels_last``) or ``(1, bias.shape[-1]) + bias.shape[:-1]``
    (``channels_first``) and added, as in every Keras backend.

    Arguments:
        x: Tensor or variable.
        bias: Bias tensor to add.
        data_format: string, ``"channels_last"`` or ``"channels_first"`` (default:
            ``image_data_format()``).

    Returns:
        Output tensor.

    Raises:
        ValueError: In one of the two cases below: 1. invalid ``data_format`` argument.
            2. invalid bias shape: the bias should be either a vector or a tensor with
            ``ndim(x) - 1`` dimensions, matching ``x``'s channels.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.zeros((1, 2, 2))
        >>> K.eval(K.bias_add(x, K.constant([1.0, 2.0]), data_format='channels_first'))
        array([[[1., 1.],
                [2., 2.]]], dtype=float32)
    """
    fn = "bias_add"
    df = _data_format(data_format, fn)
    x = _t(x)
    bias = _t(bias, like=x)
    if x.ndim < 2:
        raise ValueError(f"{fn}: x must have at least 2 dimensions, got shape {tuple(x.shape)}")
    bs = tuple(bias.shape)
    if len(bs) != 1 and len(bs) != x.ndim - 1:
        raise ValueError(
            f"{fn}: unexpected bias dimensions {len(bs)} (shape {bs}); expected 1 or {x.ndim - 1} dimensions for x of shape {tuple(x.shape)}"
        )
    if len(bs) == 1:
        c_axis = 1 if df == "channels_first" else x.ndim - 1
        c = x.shape[c_axis]
        if bs[0] is not None and c is not None and bs[0] != c:
            raise ValueError(
                f"{fn}: bias has {bs[0]} entries but x has {c} channels (shape {tuple(x.shape)}, {df})"
            )
        if c_axis != x.ndim - 1:
            bias = wrap(_core.expand_dims(bias._core, list(range(1, x.ndim - c_axis))))
        return x + bias
    bd = _dims(bias)
    shape = [1] + (bd[-1:] + bd[:-1] if df == "channels_first" else bd)
    return x + _reshape(bias, shape)


__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
