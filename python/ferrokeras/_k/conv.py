"""Convolutions and pooling.

Every convolution here is one ``_core.conv`` primitive (channels-last, Keras kernel layout
``(*kernel_size, in_channels / groups, out_channels)``), or its adjoint
``_core.conv_transpose``; depthwise and separable convolutions are grouped convolutions,
locally connected layers are a depthwise identity convolution (patch extraction) followed
by a batched matmul. ``channels_first`` inputs are transposed to channels-last and back.
Results are cross-correlations, as ``tf.keras.backend``; ``same`` padding puts the odd
element of padding at the end, as TensorFlow.
"""

import numpy as np

from .. import _core
from ..config import normalize_data_format
from ..tensor import Tensor, wrap
from .common import _t
from .linalg import _reshape, permute_dimensions
from .shapes import _dims, _shape_tensor
from .variables import shape

_FORMATS = ("channels_last", "channels_first")


# ---------------------------------------------------------------- argument checks


def _fmt(data_format, what):
    if data_format is not None and str(data_format).lower() not in _FORMATS:
        raise ValueError(f"{what}: unknown data_format {data_format!r}, expected one of {_FORMATS}")
    return normalize_data_format(data_format)


def _ints(v, n, what, arg):
    """``v`` (an int or a sequence of ``n`` ints, each >= 1) as a tuple of ``n`` ints."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = (int(v),) * n
    try:
        v = tuple(v)
    except TypeError:
        raise ValueError(
            f"{what}: {arg} must be an int or a tuple of {n} ints, got {v!r}"
        ) from None
    if len(v) != n or not all(
        isinstance(e, (int, np.integer)) and not isinstance(e, bool) and e >= 1 for e in v
    ):
        raise ValueError(f"{what}: {arg} must be an int or a tuple of {n} positive ints, got {v!r}")
    return tuple(int(e) for e in v)


def _pad_mode(padding, what, allowed=("valid", "same")):
    p = str(padding).lower() if isinstance(padding, str) else padding
    if p not in allowed:
        raise ValueError(f"{what}: unknown padding {padding!r}, expected one of {allowed}")
    return p


def _no_strided_dilation(strides, dilation, what):
    if any(s > 1 for s in strides) and any(d > 1 for d in dilation):
        raise ValueError(
            f"{what}: strides {strides} > 1 are not supported together with dilation_rate {dilation} > 1 "
            "(as in TensorFlow); use strides of 1 or a dilation_rate of 1"
        )


def _to_last(x, fmt, nsp):
    return (
        permute_dimensions(x, [0] + list(range(2, nsp + 2)) + [1]) if fmt == "channels_first" else x
    )


def _from_last(y, fmt, nsp):
    return (
        permute_dimensions(y, [0, nsp + 1] + list(range(1, nsp + 1)))
        if fmt == "channels_first"
        else y
    )


def _input(x, nsp, what, arg="x"):
    x = _t(x)
    if x.ndim != nsp + 2:
        raise ValueError(
            f"{what}: {arg} must have rank {nsp + 2} (batch, {nsp} spatial dims, channels), got shape {tuple(x.shape)}"
        )
    if x.dtype not in ("float16", "float32", "float64"):
        raise TypeError(f"{what}: {arg} must be a float tensor, got {x.dtype}")
    return x


def _kernel(k, x, nsp, what, arg="kernel", layout="(*kernel_size, in_channels, out_channels)"):
    k = _t(k, like=x)
    if k.ndim != nsp + 2:
        raise ValueError(
            f"{what}: {arg} must have rank {nsp + 2} {layout}, got shape {tuple(k.shape)}"
        )
    if k.dtype != x.dtype:
        raise TypeError(f"{what}: {arg} has dtype {k.dtype} but x has dtype {x.dtype}")
    return k


def _check_channels(x, k, groups, what, arg="kernel"):
    c, kin = x.shape[-1], k.shape[-2]
    if c is not None and kin is not None and c != kin * groups:
        raise ValueError(
            f"{what}: x has {c} input channels but {arg} of shape {tuple(k.shape)} expects {kin * groups}"
        )


def _core_padding(mode, k, dilation):
    if mode == "same":
        return "same"
    if mode == "causal":
        return [(d * (n - 1), 0) for n, d in zip(k.shape[:-2], dilation)]
    return [(0, 0)] * (k.ndim - 2)


def _conv(
    x, kernel, nsp, strides, padding, data_format, dilation_rate, what, pads=("valid", "same")
):
    fmt = _fmt(data_format, what)
    strides = _ints(strides, nsp, what, "strides")
    dilation = _ints(dilation_rate, nsp, what, "dilation_rate")
    mode = _pad_mode(padding, what, pads)
    _no_strided_dilation(strides, dilation, what)
    x = _to_last(_input(x, nsp, what), fmt, nsp)
    k = _kernel(kernel, x, nsp, what)
    _check_channels(x, k, 1, what)
    y = wrap(
        _core.conv(
            x._core, k._core, list(strides), list(dilation), _core_padding(mode, k, dilation), 1
        )
    )
    return _from_last(y, fmt, nsp)


def _depthwise(x, dk, nsp, strides, mode, dilation, what):
    """Channels-last depthwise convolution; ``dk`` is ``(*kernel_size, in_channels, multiplier)``."""
    dk = _kernel(
        dk, x, nsp, what, "depthwise_kernel", "(*kernel_size, in_channels, depth_multiplier)"
    )
    c, mult = dk.shape[-2], dk.shape[-1]
    if c is None or mult is None:
        raise ValueError(
            f"{what}: the depthwise_kernel's last two dims must be static, got shape {tuple(dk.shape)}"
        )
    if x.shape[-1] is not None and x.shape[-1] != c:
        raise ValueError(
            f"{what}: x has {x.shape[-1]} channels but depthwise_kernel of shape {tuple(dk.shape)} expects {c}"
        )
    k = _reshape(dk, _dims(dk)[:-2] + [1, c * mult])
    return wrap(
        _core.conv(
            x._core, k._core, list(strides), list(dilation), _core_padding(mode, dk, dilation), c
        )
    )


def _separable(
    x, dk, pk, nsp, strides, padding, data_format, dilation_rate, what, pads=("valid", "same")
):
    fmt = _fmt(data_format, what)
    strides = _ints(strides, nsp, what, "strides")
    dilation = _ints(dilation_rate, nsp, what, "dilation_rate")
    mode = _pad_mode(padding, what, pads)
    _no_strided_dilation(strides, dilation, what)
    x = _to_last(_input(x, nsp, what), fmt, nsp)
    pk = _kernel(
        pk,
        x,
        nsp,
        what,
        "pointwise_kernel",
        "(*ones, in_channels * depth_multiplier, out_channels)",
    )
    if any(d != 1 for d in pk.shape[:-2]):
        raise ValueError(f"{what}: pointwise_kernel must be 1x1, got shape {tuple(pk.shape)}")
    y = _depthwise(x, dk, nsp, strides, mode, dilation, what)
    _check_channels(y, pk, 1, what, "pointwise_kernel")
    y = wrap(_core.conv(y._core, pk._core, [1] * nsp, [1] * nsp, [(0, 0)] * nsp, 1))
    return _from_last(y, fmt, nsp)


# ---------------------------------------------------------------- convolutions


def conv1d(x, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
    """1D convolution.

    Arguments:
        x: Tensor or variable, ``(batch, steps, channels)`` (``channels_last``) or
            ``(batch, channels, steps)`` (``channels_first``).
        kernel: kernel tensor of shape ``(kernel_size, in_channels, filters)``.
        strides: stride integer.
        padding: string, ``"same"``, ``"causal"`` or ``"valid"``. ``causal`` pads
            ``dilation_rate * (kernel_size - 1)`` zeros on the left only.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        dilation_rate: integer dilate rate.

    Returns:
        A tensor, result of 1D convolution.

    Raises:
        ValueError: if ``data_format`` or ``padding`` is unknown, the kernel does not have
            rank 3 or its input channels differ from ``x``'s.

    Example:
        >>> import numpy as np
        >>> from ferrokeras import backend as K
        >>> x = K.constant(np.arange(5.0).reshape(1, 5, 1))
        >>> K.eval(K.conv1d(x, K.constant(np.ones((2, 1, 1))), padding='causal'))[0, :, 0]
        array([0., 1., 3., 5., 7.], dtype=float32)
    """
    return _conv(
        x,
        kernel,
        1,
        strides,
        padding,
        data_format,
        dilation_rate,
        "conv1d",
        ("valid", "same", "causal"),
    )


def conv2d(x, kernel, strides=(1, 1), padding="valid", data_format=None, dilation_rate=(1, 1)):
    """2D convolution.

    Arguments:
        x: Tensor or variable, ``(batch, rows, cols, channels)`` or, with
            ``channels_first``, ``(batch, channels, rows, cols)``.
        kernel: kernel tensor of shape ``(rows, cols, in_channels, filters)``.
        strides: strides tuple (or an int for both dims).
        padding: string, ``"same"`` or ``"valid"``.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        dilation_rate: tuple of 2 integers.

    Returns:
        A tensor, result of 2D convolution.

    Raises:
        ValueError: if ``data_format`` or ``padding`` is unknown, the kernel does not have
            rank 4, its channels differ from ``x``'s, or strides > 1 meet dilation_rate > 1.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.ones((1, 5, 5, 2)); k = K.ones((3, 3, 2, 4))
        >>> K.int_shape(K.conv2d(x, k, strides=(2, 2), padding='same'))
        (1, 3, 3, 4)
        >>> float(K.eval(K.conv2d(x, k))[0, 0, 0, 0])
        18.0
    """
    return _conv(x, kernel, 2, strides, padding, data_format, dilation_rate, "conv2d")


def conv3d(
    x, kernel, strides=(1, 1, 1), padding="valid", data_format=None, dilation_rate=(1, 1, 1)
):
    """3D convolution.

    Arguments:
        x: Tensor or variable, ``(batch, d1, d2, d3, channels)`` or, with
            ``channels_first``, ``(batch, channels, d1, d2, d3)``.
        kernel: kernel tensor of shape ``(k1, k2, k3, in_channels, filters)``.
        strides: strides tuple.
        padding: string, ``"same"`` or ``"valid"``.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        dilation_rate: tuple of 3 integers.

    Returns:
        A tensor, result of 3D convolution.

    Raises:
        ValueError: on an unknown ``data_format``/``padding``, a kernel that is not rank 5
            or whose input channels differ from ``x``'s.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.conv3d(K.ones((2, 4, 5, 6, 3)), K.ones((2, 2, 2, 3, 8))))
        (2, 3, 4, 5, 8)
    """
    return _conv(x, kernel, 3, strides, padding, data_format, dilation_rate, "conv3d")


def depthwise_conv2d(
    x, depthwise_kernel, strides=(1, 1), padding="valid", data_format=None, dilation_rate=(1, 1)
):
    """2D depthwise convolution: each input channel is convolved with its own filters.

    Arguments:
        x: input tensor, ``(batch, rows, cols, channels)`` or ``channels_first``.
        depthwise_kernel: ``(rows, cols, in_channels, depth_multiplier)``; output channel
            ``c * depth_multiplier + m`` is channel ``c`` convolved with filter ``m``.
        strides: strides tuple (length 2).
        padding: string, ``"same"`` or ``"valid"``.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        dilation_rate: tuple of integers, dilation rates for the depthwise convolution.

    Returns:
        Output tensor with ``in_channels * depth_multiplier`` channels.

    Raises:
        ValueError: on an unknown ``data_format``/``padding``, a kernel of the wrong rank
            or channel count.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.depthwise_conv2d(K.ones((1, 6, 6, 3)), K.ones((3, 3, 3, 2))))
        (1, 4, 4, 6)
    """
    what = "depthwise_conv2d"
    fmt = _fmt(data_format, what)
    strides = _ints(strides, 2, what, "strides")
    dilation = _ints(dilation_rate, 2, what, "dilation_rate")
    mode = _pad_mode(padding, what)
    _no_strided_dilation(strides, dilation, what)
    x = _to_last(_input(x, 2, what), fmt, 2)
    return _from_last(_depthwise(x, depthwise_kernel, 2, strides, mode, dilation, what), fmt, 2)


def separable_conv1d(
    x,
    depthwise_kernel,
    pointwise_kernel,
    strides=1,
    padding="valid",
    data_format=None,
    dilation_rate=1,
):
    """1D convolution with separable filters: a depthwise convolution, then a 1x1 one.

    Arguments:
        x: input tensor, ``(batch, steps, channels)`` or ``channels_first``.
        depthwise_kernel: ``(kernel_size, in_channels, depth_multiplier)``.
        pointwise_kernel: ``(1, in_channels * depth_multiplier, filters)``.
        strides: stride integer.
        padding: string, ``"same"``, ``"valid"`` or ``"causal"``.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        dilation_rate: integer dilation rate.

    Returns:
        Output tensor.

    Raises:
        ValueError: on an unknown ``data_format``/``padding`` or kernels of the wrong shape.

    Example:
        >>> from ferrokeras import backend as K
        >>> y = K.separable_conv1d(K.ones((2, 10, 3)), K.ones((3, 3, 2)), K.ones((1, 6, 4)))
        >>> K.int_shape(y), float(K.eval(y)[0, 0, 0])
        ((2, 8, 4), 18.0)
    """
    return _separable(
        x,
        depthwise_kernel,
        pointwise_kernel,
        1,
        strides,
        padding,
        data_format,
        dilation_rate,
        "separable_conv1d",
        ("valid", "same", "causal"),
    )


def separable_conv2d(
    x,
    depthwise_kernel,
    pointwise_kernel,
    strides=(1, 1),
    padding="valid",
    data_format=None,
    dilation_rate=(1, 1),
):
    """2D convolution with separable filters: a depthwise convolution, then a 1x1 one.

    Arguments:
        x: input tensor, ``(batch, rows, cols, channels)`` or ``channels_first``.
        depthwise_kernel: convolution kernel for the depthwise convolution,
            ``(rows, cols, in_channels, depth_multiplier)``.
        pointwise_kernel: kernel for the 1x1 convolution,
            ``(1, 1, in_channels * depth_multiplier, filters)``.
        strides: strides tuple (length 2).
        padding: string, ``"same"`` or ``"valid"``.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        dilation_rate: tuple of integers, dilation rates for the separable convolution.

    Returns:
        Output tensor.

    Raises:
        ValueError: on an unknown ``data_format``/``padding`` or kernels of the wrong shape.

    Example:
        >>> from ferrokeras import backend as K
        >>> y = K.separable_conv2d(K.ones((1, 5, 5, 2)), K.ones((3, 3, 2, 1)), K.ones((1, 1, 2, 3)))
        >>> K.int_shape(y)
        (1, 3, 3, 3)
    """
    return _separable(
        x,
        depthwise_kernel,
        pointwise_kernel,
        2,
        strides,
        padding,
        data_format,
        dilation_rate,
        "separable_conv2d",
    )


# ---------------------------------------------------------------- transposed convolutions


def _out_shape(output_shape, x, nsp, fmt, what):
    """``output_shape`` in channels-last order as a 1-D int32 core tensor (entries may be
    ints, ``None`` for the batch dim, or scalar int tensors; or one 1-D int tensor)."""
    if isinstance(output_shape, Tensor):
        if output_shape.ndim != 1 or output_shape.shape[0] not in (None, nsp + 2):
            raise ValueError(
                f"{what}: output_shape must have {nsp + 2} entries, got shape {tuple(output_shape.shape)}"
            )
        t = (
            output_shape
            if output_shape.dtype == "int32"
            else wrap(_core.cast(output_shape._core, "int32"))
        )
        if fmt == "channels_first":
            order = np.asarray([0] + list(range(2, nsp + 2)) + [1], dtype=np.int32)
            t = wrap(_core.gather(t._core, _core.constant(order), 0))
        return t._core
    parts = list(output_shape)
    if len(parts) != nsp + 2:
        raise ValueError(
            f"{what}: output_shape must have {nsp + 2} entries (batch, spatial..., channels), got {output_shape!r}"
        )
    if fmt == "channels_first":
        parts = [parts[0]] + parts[2:] + [parts[1]]
    if parts[0] is None:
        parts[0] = x.shape[0] if x.shape[0] is not None else shape(x)[0]
    for p in parts[1:]:
        if p is None:
            raise ValueError(
                f"{what}: only the batch entry of output_shape may be None, got {output_shape!r}"
            )
    return _shape_tensor(parts)


def _conv_transpose(
    x, kernel, output_shape, nsp, strides, padding, data_format, dilation_rate, what
):
    fmt = _fmt(data_format, what)
    strides = _ints(strides, nsp, what, "strides")
    dilation = _ints(dilation_rate, nsp, what, "dilation_rate")
    mode = _pad_mode(padding, what)
    _no_strided_dilation(strides, dilation, what)
    x = _to_last(_input(x, nsp, what), fmt, nsp)
    k = _kernel(kernel, x, nsp, what, layout="(*kernel_size, out_channels, in_channels)")
    if x.shape[-1] is not None and k.shape[-1] is not None and x.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{what}: x has {x.shape[-1]} channels but kernel of shape {tuple(k.shape)} expects {k.shape[-1]}"
        )
    out = _out_shape(output_shape, x, nsp, fmt, what)
    pad = _core_padding(mode, k, dilation)
    y = wrap(_core.conv_transpose(x._core, k._core, out, list(strides), list(dilation), pad, 1))
    return _from_last(y, fmt, nsp)


def conv2d_transpose(
    x, kernel, output_shape, strides=(1, 1), padding="valid", data_format=None, dilation_rate=(1, 1)
):
    """2D deconvolution (i.e. transposed convolution), as TensorFlow's ``conv2d_transpose``.

    Arguments:
        x: Tensor or variable.
        kernel: kernel tensor, ``(rows, cols, out_channels, in_channels)``.
        output_shape: 1D int tensor (or tuple) for the output shape, in ``data_format``'s
            order; its batch entry may be ``None``.
        strides: strides tuple.
        padding: string, ``"same"`` or ``"valid"``.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        dilation_rate: tuple of 2 integers.

    Returns:
        A tensor, result of transposed 2D convolution: the gradient of ``conv2d`` with the
        same kernel, strides and padding, with respect to its input.

    Raises:
        ValueError: on an unknown ``data_format``/``padding``, a kernel of the wrong rank,
            or an ``output_shape`` that ``conv2d`` would not map back to ``x``'s shape.

    Example:
        >>> from ferrokeras import backend as K
        >>> y = K.conv2d_transpose(K.ones((1, 3, 3, 4)), K.ones((3, 3, 2, 4)), (1, 6, 6, 2),
        ...                        strides=(2, 2), padding='same')
        >>> K.int_shape(y)
        (1, 6, 6, 2)
    """
    return _conv_transpose(
        x, kernel, output_shape, 2, strides, padding, data_format, dilation_rate, "conv2d_transpose"
    )


def conv3d_transpose(x, kernel, output_shape, strides=(1, 1, 1), padding="valid", data_format=None):
    """3D deconvolution (i.e. transposed convolution).

    Arguments:
        x: input tensor.
        kernel: kernel tensor, ``(k1, k2, k3, out_channels, in_channels)``.
        output_shape: 1D int tensor (or tuple) for the output shape.
        strides: strides tuple.
        padding: string, "same" or "valid".
        data_format: string, ``"channels_last"`` or ``"channels_first"``.

    Returns:
        A tensor, result of transposed 3D convolution.

    Raises:
        ValueError: as ``conv2d_transpose``.

    Example:
        >>> from ferrokeras import backend as K
        >>> y = K.conv3d_transpose(K.ones((1, 2, 2, 2, 3)), K.ones((2, 2, 2, 5, 3)), (1, 3, 3, 3, 5))
        >>> K.int_shape(y)
        (1, 3, 3, 3, 5)
    """
    return _conv_transpose(
        x, kernel, output_shape, 3, strides, padding, data_format, 1, "conv3d_transpose"
    )


# ---------------------------------------------------------------- locally connected


def _local(inputs, kernel, kernel_size, strides, output_shape, data_format, nsp, what):
    fmt = _fmt(data_format, what)
    ks = _ints(kernel_size, nsp, what, "kernel_size")
    st = _ints(strides, nsp, what, "strides")
    x = _to_last(_input(inputs, nsp, what, "inputs"), fmt, nsp)
    kernel = _t(kernel, like=x)
    c = x.shape[-1]
    if kernel.ndim != 3 or None in kernel.shape:
        raise ValueError(
            f"{what}: kernel must be static with shape (output_items, feature_dim, filters), got {tuple(kernel.shape)}"
        )
    items, feat, filters = kernel.shape
    if c is None or feat != c * int(np.prod(ks)):
        raise ValueError(
            f"{what}: kernel feature_dim {feat} must equal prod(kernel_size) * channels = {int(np.prod(ks))} * {c}"
        )
    # Patches by a depthwise identity convolution: channel c * K + k of `p` is input channel
    # c at window offset k, i.e. the (channels, *window) order of channels_first inputs.
    kk = int(np.prod(ks))
    eye = np.zeros(ks + (1, c * kk), dtype=x.dtype)
    for ci in range(c):
        for k in range(kk):
            eye[np.unravel_index(k, ks) + (0, ci * kk + k)] = 1
    p = wrap(_core.conv(x._core, _core.constant(eye), list(st), [1] * nsp, [(0, 0)] * nsp, c))
    out_sp = list(p.shape[1:-1])
    if output_shape is not None and tuple(output_shape) != tuple(out_sp):
        raise ValueError(
            f"{what}: output_shape {tuple(output_shape)} does not match the valid windows {tuple(out_sp)}"
        )
    if int(np.prod(out_sp)) != items:
        raise ValueError(
            f"{what}: kernel has {items} output items but the input gives {int(np.prod(out_sp))} windows"
        )
    n = _dims(p)[0]
    if fmt == "channels_last":  # Keras flattens channels_last patches as (*window, channels)
        p = permute_dimensions(
            _reshape(p, [n] + out_sp + [c, kk]), [0] + list(range(1, nsp + 1)) + [nsp + 2, nsp + 1]
        )
    p = permute_dimensions(_reshape(p, [n, items, feat]), (1, 0, 2))
    y = wrap(_core.matmul(p._core, kernel._core, False, False))  # (items, batch, filters)
    y = _reshape(permute_dimensions(y, (1, 0, 2)), [n] + out_sp + [filters])
    return _from_last(y, fmt, nsp)


def local_conv1d(inputs, kernel, kernel_size, strides, data_format=None):
    """Apply 1D conv with un-shared weights.

    Arguments:
        inputs: 3D tensor with shape ``(batch_size, steps, input_dim)`` (or channels first).
        kernel: the unshared weight for convolution, with shape
            ``(output_length, feature_dim, filters)``.
        kernel_size: a tuple of a single integer, the length of the 1D convolution window.
        strides: a tuple of a single integer, the stride length of the convolution.
        data_format: the data format, channels_first or channels_last.

    Returns:
        The tensor after 1d conv with un-shared weights, with shape
        ``(batch_size, output_length, filters)``.

    Raises:
        ValueError: if ``data_format`` is neither ``channels_last`` nor ``channels_first``,
            or the kernel does not fit the input.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.local_conv1d(K.ones((2, 7, 3)), K.ones((3, 6, 5)), (2,), (2,)))
        (2, 3, 5)
    """
    return _local(inputs, kernel, kernel_size, strides, None, data_format, 1, "local_conv1d")


def local_conv2d(inputs, kernel, kernel_size, strides, output_shape, data_format=None):
    """Apply 2D conv with un-shared weights.

    Arguments:
        inputs: 4D tensor, ``(batch_size, rows, cols, channels)`` if
            ``data_format='channels_last'``, else ``(batch_size, channels, rows, cols)``.
        kernel: the unshared weight for convolution, with shape
            ``(output_items, feature_dim, filters)``.
        kernel_size: a tuple of 2 integers, the height and width of the 2D window.
        strides: a tuple of 2 integers, the strides along height and width.
        output_shape: a tuple with ``(output_row, output_col)``.
        data_format: the data format, channels_first or channels_last.

    Returns:
        A 4d tensor ``(batch_size, new_rows, new_cols, filters)`` (``channels_last``) or
        ``(batch_size, filters, new_rows, new_cols)`` (``channels_first``).

    Raises:
        ValueError: if ``data_format`` is unknown or the kernel does not fit the input.

    Example:
        >>> from ferrokeras import backend as K
        >>> y = K.local_conv2d(K.ones((2, 4, 4, 3)), K.ones((9, 12, 5)), (2, 2), (1, 1), (3, 3))
        >>> K.int_shape(y)
        (2, 3, 3, 5)
    """
    return _local(
        inputs, kernel, kernel_size, strides, output_shape, data_format, 2, "local_conv2d"
    )


# ---------------------------------------------------------------- pooling


def _pool(x, pool_size, strides, padding, data_format, pool_mode, nsp, what):
    fmt = _fmt(data_format, what)
    window = _ints(pool_size, nsp, what, "pool_size")
    strides = _ints(strides, nsp, what, "strides")
    mode = _pad_mode(padding, what)
    if pool_mode not in ("max", "avg"):
        raise ValueError(f"{what}: unknown pool_mode {pool_mode!r}, expected 'max' or 'avg'")
    x = _to_last(_input(x, nsp, what), fmt, nsp)
    pad = "same" if mode == "same" else [(0, 0)] * nsp
    return _from_last(
        wrap(_core.pool(x._core, pool_mode, list(window), list(strides), pad)), fmt, nsp
    )


def pool2d(x, pool_size, strides=(1, 1), padding="valid", data_format=None, pool_mode="max"):
    """2D Pooling.

    Arguments:
        x: Tensor or variable.
        pool_size: tuple of 2 integers.
        strides: tuple of 2 integers.
        padding: string, ``"same"`` or ``"valid"``. With ``same``, an average is taken
            over the in-bounds elements of each window only (as TensorFlow).
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        pool_mode: string, ``"max"`` or ``"avg"``.

    Returns:
        A tensor, result of 2D pooling.

    Raises:
        ValueError: if ``data_format`` is neither ``"channels_last"`` or ``"channels_first"``.
        ValueError: if ``pool_mode`` is neither ``"max"`` or ``"avg"``.

    Example:
        >>> import numpy as np
        >>> from ferrokeras import backend as K
        >>> x = K.constant(np.arange(16.0).reshape(1, 4, 4, 1))
        >>> K.eval(K.pool2d(x, (2, 2), strides=(2, 2)))[0, :, :, 0]
        array([[ 5.,  7.],
               [13., 15.]], dtype=float32)
    """
    return _pool(x, pool_size, strides, padding, data_format, pool_mode, 2, "pool2d")


def pool3d(x, pool_size, strides=(1, 1, 1), padding="valid", data_format=None, pool_mode="max"):
    """3D Pooling.

    Arguments:
        x: Tensor or variable.
        pool_size: tuple of 3 integers.
        strides: tuple of 3 integers.
        padding: string, ``"same"`` or ``"valid"``.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        pool_mode: string, ``"max"`` or ``"avg"``.

    Returns:
        A tensor, result of 3D pooling.

    Raises:
        ValueError: if ``data_format`` is neither ``"channels_last"`` or ``"channels_first"``.
        ValueError: if ``pool_mode`` is neither ``"max"`` or ``"avg"``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.pool3d(K.ones((1, 5, 5, 5, 2)), (2, 2, 2), (2, 2, 2), padding='same', pool_mode='avg'))
        (1, 3, 3, 3, 2)
    """
    return _pool(x, pool_size, strides, padding, data_format, pool_mode, 3, "pool3d")


__all__ = [
    "conv1d",
    "conv2d",
    "conv3d",
    "depthwise_conv2d",
    "separable_conv1d",
    "separable_conv2d",
    "conv2d_transpose",
    "conv3d_transpose",
    "local_conv1d",
    "local_conv2d",
    "pool2d",
    "pool3d",
]
