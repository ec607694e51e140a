"""NumPy reference implementations (oracles) shared by the test files.

Each oracle is written from the documented NumPy / TensorFlow / Keras semantics, never from
ferrokeras, and computes in whatever precision its inputs have (the tests pass float64).
Oracles used by a single test file live in that file.
"""

import numpy as np

EPS = 1e-7  # K.epsilon()


# ---- activations and crossentropies (tf.keras.backend, TF 2.x) -------------------------------


def np_relu(x, alpha=0.0, max_value=None, threshold=0.0):
    """TensorFlow's relu: x above `threshold`, clipped to `max_value`, leaky below."""
    # x for x > threshold, clipped to [0, max_value] when there is a max_value, minus
    # alpha * (threshold - x) below the threshold.
    y = np.where(x > threshold, x, 0.0)
    if max_value is not None:
        y = np.clip(y, 0.0, max_value)
    return y - alpha * np.maximum(threshold - x, 0.0)


def np_sigmoid(x):
    """Logistic sigmoid, computed from exp(-|x|) so that no exp overflows."""
    return np.where(
        x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x)))
    )


def np_softmax(x, axis=-1):
    """Softmax along `axis`, shifted by the maximum."""
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    """Log-softmax along `axis`, shifted by the maximum."""
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def np_logsumexp(x, axis=None, keepdims=False):
    """log(sum(exp(x))) over `axis`, shifted by a finite maximum (-inf over an empty axis)."""
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    s = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return s if keepdims else np.squeeze(s, axis=axis)


def np_cce(t, p, axis=-1):
    """TF 2 categorical crossentropy of probabilities: -sum(t * log(clip(p / sum(p))))."""
    p = p / p.sum(axis=axis, keepdims=True)
    return -(t * np.log(np.clip(p, EPS, 1 - EPS))).sum(axis=axis)


def np_cce_logits(t, z, axis=-1):
    """Categorical crossentropy of logits: -sum(t * log_softmax(z))."""
    return -(t * np_log_softmax(z, axis)).sum(axis=axis)


def np_scce(t, p, axis=-1, from_logits=False):
    """TF 2 sparse categorical crossentropy: -log_softmax(log(clip(p)) or logits)[t]."""
    # log(clip(p)) (or the logits) go through sparse_softmax_cross_entropy_with_logits,
    # i.e. -log_softmax(.)[t] along the class axis.
    logits = p if from_logits else np.log(np.clip(p, EPS, 1 - EPS))
    lp = np_log_softmax(np.moveaxis(logits, axis, -1), -1)
    t = np.asarray(t).astype(int)
    if t.ndim == lp.ndim:
        t = t[..., 0]
    return -np.take_along_axis(lp, t[..., None], -1)[..., 0]


def np_bce(t, p):
    """TF 2 binary crossentropy: -(t log(p + eps) + (1 - t) log(1 - p + eps)), p clipped."""
    p = np.clip(p, EPS, 1 - EPS)
    return -(t * np.log(p + EPS) + (1 - t) * np.log(1 - p + EPS))


def np_bce_logits(t, z):
    """tf.nn.sigmoid_cross_entropy_with_logits: max(z, 0) - z t + log(1 + exp(-|z|))."""
    return np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))


def np_arg(x, axis, op="argmax"):
    """tf.math.argmax (argmin): the first index whose value is strictly greater (less) than
    every earlier one, counted from index 0 holding the dtype's most negative (positive)
    finite value; NaN never wins, and a slice of NaN (or of -inf for argmax) gives 0."""
    x = np.moveaxis(np.asarray(x), axis, -1)
    if x.dtype.kind == "b":
        x = x.astype(np.int64)
    info = np.finfo(x.dtype) if x.dtype.kind == "f" else np.iinfo(x.dtype)
    lo = -info.max if x.dtype.kind == "f" else info.min
    sign = 1 if op == "argmax" else -1
    big = info.max
    out = np.zeros(x.shape[:-1], np.int64)
    flat_x = x.reshape(-1, x.shape[-1])
    flat_out = out.reshape(-1)
    for i, row in enumerate(flat_x):
        best, bv = 0, (lo if sign > 0 else big)
        for r, v in enumerate(row):
            if (v > bv) if sign > 0 else (v < bv):
                best, bv = r, v
        flat_out[i] = best
    return out


def np_in_top_k(pred, targets, k):
    """tf.math.in_top_k: fewer than k classes strictly above the target's finite score."""
    # Ties with the target all count as in the top k; bad targets give False.
    out = []
    for row, t in zip(pred, targets):
        if not 0 <= t < row.size or not np.isfinite(row[t]):
            out.append(False)
            continue
        out.append(int(np.sum(row > row[t])) < k)
    return np.array(out)


# ---- normalisation --------------------------------------------------------------------------


def np_l2_normalize(x, axis=None):
    """x / sqrt(max(sum(x * x), 1e-12)) over `axis`."""
    return x / np.sqrt(np.maximum((x * x).sum(axis=axis, keepdims=True), 1e-12))


def np_bn(x, mean, var, beta, gamma, eps):
    """tf.nn.batch_normalization: (x - mean) * rsqrt(var + eps) * gamma + beta."""
    y = (x - mean) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    return y + beta if beta is not None else y


def np_nbt(x, g, b, axes, eps):
    """K.normalize_batch_in_training: (normalised x, batch mean, batch variance) over `axes`."""
    axes = tuple(axes)
    m = x.mean(axis=axes, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
    gg = None if g is None else g.reshape(shape)
    bb = None if b is None else b.reshape(shape)
    return np_bn(x, m, v, bb, gg, eps), m.squeeze(axes), v.squeeze(axes)


def np_nbt_grad(x, g, axes, eps, dy):
    """The gradients of K.normalize_batch_in_training's output (scale `g`, a 1-D array along
    the kept axis) with respect to x, gamma and beta, given the output's gradient `dy`."""
    axes = tuple(axes)
    n = np.prod([x.shape[a] for a in axes])
    m = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((x - m) ** 2).mean(axis=axes, keepdims=True) + eps)
    xhat = (x - m) * inv
    dxhat = dy * g.reshape([1 if i in axes else d for i, d in enumerate(x.shape)])
    dx = (
        inv
        / n
        * (
            n * dxhat
            - dxhat.sum(axis=axes, keepdims=True)
            - xhat * (dxhat * xhat).sum(axis=axes, keepdims=True)
        )
    )
    return dx, (dy * xhat).sum(axis=axes), dy.sum(axis=axes)


# ---- layout --------------------------------------------------------------------------------


def np_linear_resize(x, axis, f):
    """TF 2 ``tf.image.resize(..., 'bilinear')`` along one axis by an integer factor."""
    # Output i samples input coordinate (i + 0.5) / f - 0.5, neighbours clamped to the edge
    # (tensorflow/core/kernels/image/resize_bilinear_op.cc, HalfPixelScaler).
    n = x.shape[axis]
    src = (np.arange(n * f) + 0.5) / f - 0.5
    lo = np.floor(src)
    w = src - lo
    a = np.take(x, np.clip(lo, 0, n - 1).astype(int), axis=axis)
    b = np.take(x, np.clip(lo + 1, 0, n - 1).astype(int), axis=axis)
    shape = [1] * x.ndim
    shape[axis] = n * f
    w = w.reshape(shape)
    return a * (1 - w) + b * w


def np_resize(x, axes, factors, interpolation):
    """Resize `axes` by integer `factors`, "nearest" (repeat) or "bilinear"."""
    for axis, f in zip(axes, factors):
        x = (
            np.repeat(x, f, axis=axis)
            if interpolation == "nearest"
            else np_linear_resize(x, axis, f)
        )
    return x


def np_pad(x, pairs, channels_first):
    """Zero-pad the spatial axes of a batch by (before, after) `pairs`."""
    pads = (
        [(0, 0)] + list(pairs) + [(0, 0)] if not channels_first else [(0, 0), (0, 0)] + list(pairs)
    )
    return np.pad(x, pads)


# ---- linear algebra ---------------------------------------------------------------------------


def np_batch_dot(x, y, axes):
    """K.batch_dot with explicit axes (a pair of ints, batch axis 0)."""
    # Per sample, contract x's axis axes[0] with y's axis axes[1]; the result keeps x's
    # remaining axes then y's (keras_backends.md, `batch_dot`, "Shape inference"). A rank-1
    # result is reshaped to (batch, 1).
    out = np.stack(
        [np.tensordot(x[b], y[b], axes=(axes[0] - 1, axes[1] - 1)) for b in range(x.shape[0])]
    )
    if out.ndim == 1:
        out = out[:, None]
    return out


def default_axes(x_ndim, y_ndim):
    """The axes K.batch_dot contracts for axes=None (TF's rule)."""
    # Last axis of x with the last axis of y when y is 2-D, else with y's second-to-last
    # axis (matrix-product-like).
    return (x_ndim - 1, y_ndim - 1) if y_ndim == 2 else (x_ndim - 1, y_ndim - 2)


# ---- convolution and pooling (channels-last) ------------------------------------------------
# Loops over kernel offsets with plain matmuls, written from the definitions: cross-correlation;
# TensorFlow's `same` split puts the odd padding element at the end; `causal` pads the left only;
# `avg` pooling with `same` divides by the number of in-bounds elements.


def same_pads(sizes, ks, strides, dil):
    """TensorFlow's `same` padding, (before, after) per spatial axis."""
    pads = []
    for n, k, s, d in zip(sizes, ks, strides, dil):
        out = -(-n // s)
        total = max((out - 1) * s + d * (k - 1) + 1 - n, 0)
        pads.append((total // 2, total - total // 2))
    return pads


def pads_for(mode, sizes, ks, strides, dil):
    """(before, after) padding per spatial axis for `valid`, `same` or `causal`."""
    if mode == "same":
        return same_pads(sizes, ks, strides, dil)
    if mode == "causal":
        return [(d * (k - 1), 0) for k, d in zip(ks, dil)]
    return [(0, 0)] * len(sizes)


def windows(out_sp, kidx, strides, dil):
    """Index of the padded input that kernel offset `kidx` reads for every output position."""
    return tuple(
        slice(kidx[i] * dil[i], kidx[i] * dil[i] + (out_sp[i] - 1) * strides[i] + 1, strides[i])
        if out_sp[i] > 0
        else slice(0, 0)
        for i in range(len(out_sp))
    )


def ref_conv(x, k, strides, dil, mode, groups=1):
    """y[n, o, :] = sum_k xpad[n, o*s + k*d, group] @ k[k, :, group]; empty where k > input."""
    nsp = x.ndim - 2
    ks = k.shape[:nsp]
    pads = pads_for(mode, x.shape[1:-1], ks, strides, dil)
    xp = np.pad(x, [(0, 0)] + pads + [(0, 0)])
    out = [
        max((xp.shape[1 + i] - d * (kk - 1) - 1) // s + 1, 0)
        for i, (kk, s, d) in enumerate(zip(ks, strides, dil))
    ]
    cg, og = k.shape[-2], k.shape[-1] // groups
    y = np.zeros((x.shape[0], *out, k.shape[-1]))
    for kidx in np.ndindex(*ks):
        patch = xp[(slice(None),) + windows(out, kidx, strides, dil)]
        for g in range(groups):
            y[..., g * og : (g + 1) * og] += (
                patch[..., g * cg : (g + 1) * cg] @ k[kidx][:, g * og : (g + 1) * og]
            )
    return y


def ref_pool(x, window, strides, mode, pool_mode):
    """Max or average pooling; `avg` divides by the number of in-bounds elements."""
    nsp = x.ndim - 2
    pads = pads_for(mode, x.shape[1:-1], window, strides, [1] * nsp)
    fill = -np.inf if pool_mode == "max" else 0.0
    xp = np.pad(x, [(0, 0)] + pads + [(0, 0)], constant_values=fill)
    valid = np.pad(np.ones_like(x), [(0, 0)] + pads + [(0, 0)])
    out = [(xp.shape[1 + i] - window[i]) // strides[i] + 1 for i in range(nsp)]
    acc = np.full((x.shape[0], *out, x.shape[-1]), fill)
    cnt = np.zeros_like(acc)
    for kidx in np.ndindex(*window):
        sl = (slice(None),) + windows(out, kidx, strides, [1] * nsp)
        acc = np.maximum(acc, xp[sl]) if pool_mode == "max" else acc + xp[sl]
        cnt += valid[sl]
    return acc if pool_mode == "max" else acc / cnt


# ---- recurrences ---------------------------------------------------------------------------


def np_rnn(x, h0, W, U, b, mask=None, go_backwards=False):
    """h_t = tanh(x_t W + h_{t-1} U + b) over axis 1 of `x`; masked steps keep h and the
    previous output. Returns (last output, stacked outputs, last state), as `K.rnn`."""
    T = x.shape[1]
    order = range(T - 1, -1, -1) if go_backwards else range(T)
    h, outs, prev = h0, [], np.zeros_like(h0)
    for t in order:
        hn = np.tanh(x[:, t] @ W + h @ U + b)
        if mask is not None:
            m = mask[:, t][:, None].astype(bool)
            hn = np.where(m, hn, h)
            out = np.where(m, hn, prev)
        else:
            out = hn
        h, prev = hn, out
        outs.append(out)
    return outs[-1], np.stack(outs, axis=1), h
