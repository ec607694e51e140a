"""Convolutions and pooling against straightforward NumPy references, both data formats,
each padding, strides and dilation; gradients (first and second order) by central finite
differences in float64.

The references (`ref_conv` and `ref_pool` in reference.py, the others below) are the
executable spec: loops over kernel offsets with plain matmuls, written from the definitions
(cross-correlation; TensorFlow's `same` split puts the odd padding element at the end;
`causal` pads the left only; `avg` pooling with `same` divides by the number of in-bounds
elements), independent of the kernels under test.
"""

import numpy as np
import pytest
from env_child import env_is, pytest_in_child
from ferrokeras import backend as K
from gradcheck import assert_mentions, check_grad, run
from reference import pads_for, ref_conv, ref_pool, windows

# ---- references (channels-last) --------------------------------------------------------


def ref_conv_transpose(y, k, out_shape, strides, dil, mode):
    """The adjoint of `ref_conv` in x: scatter y @ k^T back into the padded input."""
    nsp = y.ndim - 2
    ks = k.shape[:nsp]
    pads = pads_for(mode, out_shape[1:-1], ks, strides, dil)
    xp = np.zeros(
        (out_shape[0],)
        + tuple(n + a + b for n, (a, b) in zip(out_shape[1:-1], pads))
        + (out_shape[-1],)
    )
    for kidx in np.ndindex(*ks):
        xp[(slice(None),) + windows(y.shape[1:-1], kidx, strides, dil)] += y @ k[kidx].T
    return xp[(slice(None),) + tuple(slice(a, a + n) for n, (a, _) in zip(out_shape[1:-1], pads))]


def ref_depthwise(x, dk, strides, dil, mode):
    """Each channel alone (a one-channel ref_conv), output channel c * M + m."""
    c, m = dk.shape[-2:]
    outs = [
        ref_conv(x[..., ci : ci + 1], dk[..., ci : ci + 1, mi : mi + 1], strides, dil, mode)
        for ci in range(c)
        for mi in range(m)
    ]
    return np.concatenate(outs, axis=-1)


def ref_local(x, kernel, ks, strides, fmt):
    """Keras 2.3.1 `local_conv`: each window flattened in the input's own layout order."""
    nsp = len(ks)
    xl = x if fmt == "channels_last" else np.moveaxis(x, 1, -1)
    out = [(xl.shape[1 + i] - ks[i]) // strides[i] + 1 for i in range(nsp)]
    y = np.zeros((x.shape[0], *out, kernel.shape[-1]))
    for item, pos in enumerate(np.ndindex(*out)):
        sl = tuple(slice(p * s, p * s + k) for p, s, k in zip(pos, strides, ks))
        patch = xl[(slice(None),) + sl]
        if fmt == "channels_first":
            patch = np.moveaxis(patch, -1, 1)
        y[(slice(None),) + pos] = patch.reshape(x.shape[0], -1) @ kernel[item]
    return y if fmt == "channels_last" else np.moveaxis(y, -1, 1)


def to_first(a):
    return np.moveaxis(a, -1, 1)


def from_first(a):
    return np.moveaxis(a, 1, -1)


# ---- forward, table-driven ---------------------------------------------------------------
# (K function, x shape (channels-last), kernel shape(s), kwargs, reference)


def _conv_case(fn, nsp):
    def ref(x, ks, kw):
        return ref_conv(
            x,
            ks[0],
            _tup(kw.get("strides", 1), nsp),
            _tup(kw.get("dilation_rate", 1), nsp),
            kw.get("padding", "valid"),
        )

    return fn, ref


def _tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


def _depthwise_ref(x, ks, kw):
    return ref_depthwise(
        x,
        ks[0],
        _tup(kw.get("strides", 1), 2),
        _tup(kw.get("dilation_rate", 1), 2),
        kw.get("padding", "valid"),
    )


def _separable_ref(nsp):
    def ref(x, ks, kw):
        d = ref_depthwise(
            x,
            ks[0],
            _tup(kw.get("strides", 1), nsp),
            _tup(kw.get("dilation_rate", 1), nsp),
            kw.get("padding", "valid"),
        )
        return d @ ks[1].reshape(ks[1].shape[-2:])

    return ref


CONV_CASES = [
    # conv1d: every padding, strides, dilation
    ("conv1d", (2, 9, 3), [(3, 3, 4)], dict(padding="valid")),
    ("conv1d", (2, 9, 3), [(3, 3, 4)], dict(padding="same", strides=2)),
    ("conv1d", (2, 9, 3), [(2, 3, 4)], dict(padding="same")),
    ("conv1d", (2, 9, 3), [(3, 3, 4)], dict(padding="causal", dilation_rate=2)),
    ("conv1d", (2, 10, 3), [(4, 3, 2)], dict(padding="causal", strides=3)),
    # conv2d
    ("conv2d", (2, 7, 6, 3), [(3, 3, 3, 4)], dict()),
    ("conv2d", (2, 7, 6, 3), [(3, 3, 3, 4)], dict(padding="same")),
    ("conv2d", (2, 7, 6, 3), [(3, 2, 3, 4)], dict(padding="same", strides=(2, 3))),
    ("conv2d", (2, 8, 8, 3), [(2, 3, 3, 4)], dict(padding="valid", strides=2)),
    ("conv2d", (2, 9, 8, 3), [(3, 3, 3, 2)], dict(padding="same", dilation_rate=(2, 3))),
    ("conv2d", (1, 9, 8, 2), [(2, 3, 2, 2)], dict(padding="valid", dilation_rate=2)),
    ("conv2d", (3, 6, 6, 5), [(1, 1, 5, 3)], dict(padding="valid")),
    # 3x3, stride 1, >= 16 channels: the Winograd kernel (odd sizes leave partial tiles)
    ("conv2d", (3, 7, 9, 16), [(3, 3, 16, 17)], dict(padding="same")),
    ("conv2d", (1, 8, 5, 17), [(3, 3, 17, 16)], dict(padding="valid")),
    # conv3d
    ("conv3d", (2, 5, 4, 6, 2), [(2, 3, 2, 2, 3)], dict()),
    ("conv3d", (2, 5, 4, 6, 2), [(3, 3, 3, 2, 3)], dict(padding="same", strides=(2, 1, 2))),
    ("conv3d", (1, 6, 5, 5, 2), [(2, 2, 2, 2, 2)], dict(padding="same", dilation_rate=(2, 1, 2))),
    # depthwise / separable (groups)
    ("depthwise_conv2d", (2, 7, 6, 3), [(3, 3, 3, 1)], dict()),
    ("depthwise_conv2d", (2, 7, 6, 3), [(3, 2, 3, 2)], dict(padding="same", strides=2)),
    ("depthwise_conv2d", (2, 8, 7, 2), [(2, 3, 2, 3)], dict(padding="same", dilation_rate=(2, 2))),
    # 16 and 32 channels, one kernel each: the forward and the kernel gradient sum 16
    # channels in registers, a 3x3 window with its 9 taps (or 9 sums) in registers too
    ("depthwise_conv2d", (2, 7, 6, 32), [(3, 3, 32, 1)], dict(padding="same", strides=2)),
    ("depthwise_conv2d", (2, 9, 8, 16), [(3, 3, 16, 1)], dict(dilation_rate=(1, 2))),
    ("depthwise_conv2d", (1, 4, 4, 48), [(3, 3, 48, 1)], dict(padding="same")),
    # read from the unpadded image: rows with no pixel whose window lies inside it, and
    # images with no such pixel at all
    ("depthwise_conv2d", (2, 2, 1, 16), [(3, 3, 16, 1)], dict(padding="same")),
    ("depthwise_conv2d", (1, 5, 3, 16), [(3, 3, 16, 1)], dict(padding="same", dilation_rate=2)),
    ("depthwise_conv2d", (1, 6, 9, 16), [(3, 3, 16, 1)], dict(padding="same", strides=(1, 2))),
    (
        "depthwise_conv2d",
        (1, 8, 7, 16),
        [(3, 2, 16, 1)],
        dict(padding="same", dilation_rate=(2, 1)),
    ),
    ("separable_conv2d", (2, 7, 6, 3), [(3, 3, 3, 2), (1, 1, 6, 4)], dict()),
    (
        "separable_conv2d",
        (2, 7, 6, 3),
        [(3, 3, 3, 1), (1, 1, 3, 5)],
        dict(padding="same", strides=(2, 1)),
    ),
    ("separable_conv1d", (2, 9, 3), [(3, 3, 2), (1, 6, 4)], dict(padding="same", dilation_rate=2)),
    ("separable_conv1d", (2, 9, 3), [(2, 3, 1), (1, 3, 2)], dict(strides=2)),
]

REFS = {
    "conv1d": _conv_case(K.conv1d, 1)[1],
    "conv2d": _conv_case(K.conv2d, 2)[1],
    "conv3d": _conv_case(K.conv3d, 3)[1],
    "depthwise_conv2d": _depthwise_ref,
    "separable_conv2d": _separable_ref(2),
    "separable_conv1d": _separable_ref(1),
}


def _case_id(c):
    return f"{c[0]}-{c[1]}-{'-'.join(f'{k}={v}' for k, v in c[3].items())}"


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", CONV_CASES, ids=_case_id)
def test_conv_forward(case, fmt, rng):
    name, xshape, kshapes, kw = case
    x = rng.normal(size=xshape)
    ks = [rng.normal(size=s) for s in kshapes]
    ref = REFS[name](x, ks, kw)
    xin = x if fmt == "channels_last" else to_first(x)
    ph = K.placeholder(shape=(None,) + xin.shape[1:], dtype="float64")
    out = getattr(K, name)(ph, *[K.constant(k, dtype="float64") for k in ks], data_format=fmt, **kw)
    got = run([ph], [out], [xin])[0]
    got = got if fmt == "channels_last" else from_first(got)
    assert got.shape == ref.shape
    assert K.int_shape(out)[1:] == (ref if fmt == "channels_last" else to_first(ref)).shape[1:]
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 2e-2)])
@pytest.mark.parametrize(
    "name,xshape,kshape,kw",
    [
        ("conv2d", (2, 9, 9, 8), (3, 3, 8, 16), dict(padding="same")),
        ("conv2d", (2, 9, 9, 8), (3, 3, 8, 16), dict(padding="valid", strides=2)),
        ("depthwise_conv2d", (2, 9, 9, 8), (3, 3, 8, 1), dict(padding="same")),
        ("conv2d", (2, 9, 11, 32), (3, 3, 32, 24), dict(padding="same")),
    ],
)
def test_conv_low_precision(name, xshape, kshape, kw, dtype, tol, rng):
    x, k = rng.normal(size=xshape), rng.normal(size=kshape) / 4
    ref = REFS[name](x, [k], kw)
    out = getattr(K, name)(K.constant(x, dtype=dtype), K.constant(k, dtype=dtype), **kw)
    got = K.eval(out)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * 4)


@pytest.mark.parametrize(
    "xshape,kshape,kw",
    [
        # 16 or 32 output channels (or, in the input gradient, input channels): float32
        # products with a right operand one or two vectors wide, in blocks of 8 rows and a
        # tail, from im2col rows, pixel rows read in place and a transposed kernel
        ((2, 11, 13, 3), (5, 5, 3, 16), dict(strides=2)),
        ((1, 9, 7, 5), (3, 3, 5, 32), dict(padding="same", strides=(1, 2))),
        ((2, 9, 10, 16), (1, 1, 16, 32), dict()),
        ((3, 5, 7, 32), (1, 1, 32, 16), dict()),
        ((1, 30, 31, 3), (3, 3, 3, 16), dict(padding="same")),
        # the direct narrow kernels, taps read from the image where they lie: dilated
        # windows (one segment per pixel of the window), runs of small images with 16
        # input channels (the input gradient as the flipped kernel's convolution, two
        # vectors, chunks of taps), 32 input channels and a tail of rows
        ((1, 12, 13, 5), (3, 3, 5, 16), dict(padding="same", dilation_rate=2)),
        ((3, 8, 9, 16), (3, 3, 16, 32), dict(padding="same")),
        ((2, 7, 5, 32), (3, 3, 32, 16), dict()),
        ((2, 14, 14, 16), (3, 3, 16, 32), dict(strides=2, padding="same")),
        # one output channel (or, in the input gradient, one input channel): each
        # window's dot product with the kernel in vectors of taps, a segment's last
        # vector masked, windows of more vectors than one pass sums in registers
        ((2, 10, 9, 16), (3, 3, 16, 1), dict(padding="same")),
        ((1, 20, 21, 5), (3, 3, 5, 1), dict(strides=2)),
        ((1, 12, 12, 40), (5, 5, 40, 1), dict(padding="same")),
        ((2, 9, 8, 1), (3, 3, 1, 16), dict(padding="same")),
    ],
)
def test_narrow_float32_products_match_float64(xshape, kshape, kw, rng):
    x, k = rng.normal(size=xshape), rng.normal(size=kshape) / 4
    ref = REFS["conv2d"](x, [k], kw)
    res = {}
    for dtype in ("float32", "float64"):
        xp = K.placeholder(shape=xshape, dtype=dtype)
        kp = K.placeholder(shape=kshape, dtype=dtype)
        out = K.conv2d(xp, kp, **kw)
        dy = K.constant(rng.normal(size=ref.shape) if not res else res["dy"], dtype=dtype)
        gx, gk = K.gradients(K.sum(out * dy), [xp, kp])
        res[dtype] = run([xp, kp], [out, gx, gk], [x.astype(dtype), k.astype(dtype)])
        res["dy"] = K.eval(dy).astype(np.float64)
    np.testing.assert_allclose(res["float32"][0], ref, rtol=1e-4, atol=1e-4)
    for got, want in zip(res["float32"], res["float64"]):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def test_narrow_float32_products_on_one_thread():
    # The direct kernels run an image to a thread, so with fewer images than threads the
    # convolution keeps its parallel products: on one thread every case above takes them.
    if not env_is("RAYON_NUM_THREADS", "1"):
        pytest_in_child(
            {"RAYON_NUM_THREADS": "1"},
            f"{__file__}::test_narrow_float32_products_match_float64",
            f"{__file__}::test_pool",
        )


@pytest.mark.parametrize("cin,cout", [(520, 130), (520, 260), (130, 520)], ids=str)
def test_pointwise_gradients_with_wide_channels(cin, cout, rng):
    # A 1x1 convolution's gradients over 512 pixels: `xᵀ·gy` with 520 input channels and
    # `gy·wᵀ` with 520 output channels read a transposed operand stored in long rows,
    # which is copied first where FERROKERAS_COPY_TRANSPOSED (or the CPU) says so (`xᵀ`
    # only for 256 output channels or more); against float64 NumPy, with the copy,
    # without it, and as this CPU picks.
    x = rng.standard_normal((2, 16, 16, cin)).astype("float32")
    w = (rng.standard_normal((1, 1, cin, cout)) / np.sqrt(cin)).astype("float32")
    gy = rng.standard_normal((2, 16, 16, cout)).astype("float32")
    px, pg = K.placeholder(shape=x.shape), K.placeholder(shape=gy.shape)
    pw = K.placeholder(shape=w.shape)
    dx, dw = K.gradients(K.sum(K.conv2d(px, pw) * pg), [px, pw])
    got_dx, got_dw = run([px, pw, pg], [dx, dw], [x, w, gy])
    x64, w64, g64 = x.astype(np.float64), w[0, 0].astype(np.float64), gy.astype(np.float64)
    np.testing.assert_allclose(got_dx, g64 @ w64.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        got_dw[0, 0], np.einsum("nhwc,nhwd->cd", x64, g64), rtol=1e-4, atol=1e-3
    )


@pytest.mark.parametrize("setting", ["1", "0"])
def test_pointwise_gradients_copying_transposed_operands_or_not(setting):
    if not env_is("FERROKERAS_COPY_TRANSPOSED", setting):
        pytest_in_child(
            {"FERROKERAS_COPY_TRANSPOSED": setting},
            f"{__file__}::test_pointwise_gradients_with_wide_channels",
        )


# ---- transposed convolutions ----------------------------------------------------------

TRANSPOSE_CASES = [
    (
        K.conv2d_transpose,
        (2, 3, 3, 4),
        (3, 3, 2, 4),
        (2, 6, 6, 2),
        dict(strides=(2, 2), padding="same"),
    ),
    (
        K.conv2d_transpose,
        (2, 3, 3, 4),
        (3, 3, 2, 4),
        (2, 7, 7, 2),
        dict(strides=(2, 2), padding="valid"),
    ),
    (K.conv2d_transpose, (2, 4, 3, 3), (2, 3, 2, 3), (2, 5, 5, 2), dict(padding="valid")),
    (K.conv2d_transpose, (2, 4, 4, 3), (3, 3, 5, 3), (2, 4, 4, 5), dict(padding="same")),
    (
        K.conv2d_transpose,
        (1, 4, 4, 3),
        (3, 3, 2, 3),
        (1, 8, 8, 2),
        dict(padding="valid", dilation_rate=2),
    ),
    (
        K.conv2d_transpose,
        (2, 3, 4, 3),
        (2, 3, 2, 3),
        (2, 9, 8, 2),
        dict(strides=(3, 2), padding="same"),
    ),
    (K.conv2d_transpose, (2, 5, 6, 16), (3, 3, 20, 16), (2, 5, 6, 20), dict(padding="same")),
    (K.conv2d_transpose, (1, 3, 4, 18), (3, 3, 16, 18), (1, 5, 6, 16), dict(padding="valid")),
    (
        K.conv3d_transpose,
        (1, 2, 3, 2, 3),
        (2, 2, 2, 2, 3),
        (1, 4, 6, 4, 2),
        dict(strides=(2, 2, 2), padding="same"),
    ),
    (K.conv3d_transpose, (2, 2, 2, 2, 2), (2, 3, 2, 3, 2), (2, 3, 4, 3, 3), dict()),
]


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("fn,xshape,kshape,oshape,kw", TRANSPOSE_CASES)
def test_conv_transpose_forward(fn, xshape, kshape, oshape, kw, fmt, rng):
    x, k = rng.normal(size=xshape), rng.normal(size=kshape)
    nsp = len(xshape) - 2
    s = _tup(kw.get("strides", 1), nsp)
    d = _tup(kw.get("dilation_rate", 1), nsp)
    ref = ref_conv_transpose(x, k, oshape, s, d, kw.get("padding", "valid"))
    first = fmt == "channels_first"
    xin = to_first(x) if first else x
    osh = (None,) + ((oshape[-1],) + oshape[1:-1] if first else oshape[1:])
    ph = K.placeholder(shape=(None,) + xin.shape[1:], dtype="float64")
    out = fn(ph, K.constant(k, dtype="float64"), osh, data_format=fmt, **kw)
    got = run([ph], [out], [xin])[0]
    np.testing.assert_allclose(from_first(got) if first else got, ref, rtol=1e-10, atol=1e-10)


def test_conv_transpose_is_adjoint_of_conv(rng):
    # <conv2d(x, k), y> == <x, conv2d_transpose(y, k)>: the defining property.
    x, k, y = (
        rng.normal(size=(2, 7, 7, 3)),
        rng.normal(size=(3, 3, 3, 4)),
        rng.normal(size=(2, 4, 4, 4)),
    )
    kc = K.constant(k, dtype="float64")
    fwd = K.eval(K.conv2d(K.constant(x, dtype="float64"), kc, strides=2, padding="same"))
    back = K.eval(
        K.conv2d_transpose(
            K.constant(y, dtype="float64"), kc, (2, 7, 7, 3), strides=2, padding="same"
        )
    )
    assert np.isclose(np.sum(fwd * y), np.sum(x * back), rtol=1e-12)


def test_winograd_gradient_matches_direct(rng):
    # The input gradient of a 3x3 stride-1 convolution with 16+ channels runs the Winograd
    # kernel; its float64 result must match the transposed-convolution reference.
    x, k = rng.normal(size=(2, 6, 7, 16)), rng.normal(size=(3, 3, 16, 16))
    g = rng.normal(size=(2, 6, 7, 16))
    xv = K.variable(x, dtype="float64")
    y = K.conv2d(xv, K.constant(k, dtype="float64"), padding="same")
    dx = K.eval(K.gradients(K.sum(y * K.constant(g, dtype="float64")), [xv])[0])
    np.testing.assert_allclose(
        dx, ref_conv_transpose(g, k, x.shape, (1, 1), (1, 1), "same"), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "n,length,cin,cout,taps,padding",
    [
        (3, 30, 32, 64, 5, "valid"),  # partial last tile
        (9, 17, 36, 65, 3, "same"),  # channels off the vector width; runs of images
        (2, 9, 32, 64, 6, "causal"),
        (4, 8, 33, 64, 7, "valid"),  # two outputs, one tile
        (5, 1, 32, 80, 4, "same"),  # one output: most of the tile in the padding
        (1, 1000, 32, 64, 5, "same"),  # one image across several blocks of tiles
    ],
)
def test_winograd_conv1d_matches_direct(n, length, cin, cout, taps, padding, dtype, rng):
    # A stride-1 1-D convolution of 3 to 7 taps with 32+ input and 64+ output channels runs
    # the Winograd F(m, r) kernel (8 points): its result must match the direct sum.
    x, k = rng.normal(size=(n, length, cin)), rng.normal(size=(taps, cin, cout))
    got = K.eval(K.conv1d(K.constant(x, dtype=dtype), K.constant(k, dtype=dtype), padding=padding))
    if padding == "causal":
        ref = ref_conv(np.pad(x, ((0, 0), (taps - 1, 0), (0, 0))), k, (1,), (1,), "valid")
    else:
        ref = ref_conv(x, k, (1,), (1,), padding)
    tol = 1e-10 if dtype == "float64" else 2e-5 * np.sqrt(taps * cin)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "n,length,cin,cout,taps,padding",
    [
        (3, 30, 64, 32, 5, "valid"),
        (9, 17, 65, 36, 3, "same"),
        (2, 9, 64, 32, 6, "causal"),
        (1, 600, 80, 40, 4, "same"),
    ],
)
def test_winograd_conv1d_input_gradient_matches_direct(
    n, length, cin, cout, taps, padding, dtype, rng
):
    # The input gradient of a stride-1 1-D convolution is the convolution of the output
    # gradient with the flipped kernel, by Winograd where that one has 32+ input (here
    # `cout`) and 64+ output (`cin`) channels: dx[t] = sum_k gy[t + front - k] . w[k]ᵀ.
    x, k = rng.normal(size=(n, length, cin)), rng.normal(size=(taps, cin, cout))
    xv = K.variable(x, dtype=dtype)
    y = K.conv1d(xv, K.constant(k, dtype=dtype), padding=padding)
    g = rng.normal(size=K.int_shape(y))
    dx = K.eval(K.gradients(K.sum(y * K.constant(g, dtype=dtype)), [xv])[0])
    front = {"valid": 0, "same": (taps - 1) // 2, "causal": taps - 1}[padding]
    ref = np.zeros_like(x)
    for kk in range(taps):
        for t in range(g.shape[1]):
            src = t + kk - front
            if 0 <= src < length:
                ref[:, src] += g[:, t] @ k[kk].T
    tol = 1e-10 if dtype == "float64" else 2e-5 * np.sqrt(taps * cout)
    np.testing.assert_allclose(dx, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "n,length,cin,cout,taps,padding",
    [
        (3, 30, 32, 64, 5, "valid"),
        (9, 17, 36, 65, 3, "same"),
        (2, 9, 32, 64, 6, "causal"),
        (4, 8, 33, 64, 7, "valid"),
        (1, 600, 40, 80, 4, "same"),
    ],
)
def test_winograd_conv1d_kernel_gradient_matches_direct(
    n, length, cin, cout, taps, padding, dtype, rng
):
    # The kernel gradient of a 1-D convolution the Winograd kernel takes is summed in the
    # Winograd domain: dw[k] = sum over images and outputs t of x[t + k - front]ᵀ gy[t].
    x, k = rng.normal(size=(n, length, cin)), rng.normal(size=(taps, cin, cout))
    kv = K.variable(k, dtype=dtype)
    y = K.conv1d(K.constant(x, dtype=dtype), kv, padding=padding)
    g = rng.normal(size=K.int_shape(y))
    dk = K.eval(K.gradients(K.sum(y * K.constant(g, dtype=dtype)), [kv])[0])
    front = {"valid": 0, "same": (taps - 1) // 2, "causal": taps - 1}[padding]
    ref = np.zeros_like(k)
    for kk in range(taps):
        for t in range(g.shape[1]):
            src = t + kk - front
            if 0 <= src < length:
                ref[kk] += x[:, src].T @ g[:, t]
    scale = np.sqrt(n * g.shape[1])
    tol = 1e-10 * scale if dtype == "float64" else 2e-5 * scale
    np.testing.assert_allclose(dk, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "xshape,kshape,padding",
    [
        ((2, 7, 9, 16), (3, 3, 16, 17), "same"),  # odd sizes: partial 2x2 tiles at the edges
        ((1, 8, 5, 17), (3, 3, 17, 16), "valid"),
        ((3, 6, 6, 20), (3, 3, 20, 16), "same"),
    ],
)
def test_winograd_kernel_gradient_matches_direct(xshape, kshape, padding, rng):
    # The kernel gradient of a 3x3 stride-1 convolution with 16+ channels is summed in the
    # Winograd domain; its float64 result must match the direct sum over output pixels.
    x, k = rng.normal(size=xshape), rng.normal(size=kshape)
    p = 1 if padding == "same" else 0
    oh, ow = xshape[1] + 2 * p - 2, xshape[2] + 2 * p - 2
    g = rng.normal(size=(xshape[0], oh, ow, kshape[3]))
    kv = K.variable(k, dtype="float64")
    y = K.conv2d(K.constant(x, dtype="float64"), kv, padding=padding)
    dk = K.eval(K.gradients(K.sum(y * K.constant(g, dtype="float64")), [kv])[0])
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    ref = np.stack(
        [
            np.stack(
                [np.einsum("nhwc,nhwo->co", xp[:, i : i + oh, j : j + ow], g) for j in range(3)]
            )
            for i in range(3)
        ]
    )
    np.testing.assert_allclose(dk, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "xshape,kshape,strides,dil,padding",
    [
        (
            (2, 48, 47, 64),
            (3, 3, 64, 4),
            (2, 2),
            (1, 1),
            "same",
        ),  # strided: 576 pixels, two column tiles
        (
            (1, 40, 41, 8),
            (5, 5, 8, 4),
            (1, 1),
            (1, 1),
            "same",
        ),  # 8 input channels: col2im input gradient
        ((2, 23, 21, 3), (5, 4, 3, 6), (2, 3), (1, 1), "valid"),
        ((1, 30, 29, 5), (3, 3, 5, 7), (1, 1), (2, 3), "same"),  # dilated, col2im input gradient
    ],
)
def test_strided_and_narrow_gradients_match_direct(xshape, kshape, strides, dil, padding, rng):
    # The kernel gradient at stride > 1 sums column tiles (colsᵀ · gy); the input gradient at
    # stride > 1 or with fewer than 16 input channels adds gy · wᵀ back along the windows
    # (col2im). Both float64, against the direct sums, with more pixels than one tile holds.
    x, k = rng.normal(size=xshape), rng.normal(size=kshape)
    xv, kv = K.variable(x, dtype="float64"), K.variable(k, dtype="float64")
    y = K.conv2d(xv, kv, strides=strides, padding=padding, dilation_rate=dil)
    g = rng.normal(size=K.int_shape(y))
    dx, dk = K.batch_get_value(K.gradients(K.sum(y * K.constant(g, dtype="float64")), [xv, kv]))
    np.testing.assert_allclose(
        dx, ref_conv_transpose(g, k, x.shape, strides, dil, padding), rtol=1e-10, atol=1e-10
    )
    xp = np.pad(x, [(0, 0)] + pads_for(padding, x.shape[1:3], kshape[:2], strides, dil) + [(0, 0)])
    ref = np.zeros(kshape)
    for kidx in np.ndindex(*kshape[:2]):
        ref[kidx] = np.einsum(
            "nhwc,nhwo->co", xp[(slice(None),) + windows(g.shape[1:3], kidx, strides, dil)], g
        )
    np.testing.assert_allclose(dk, ref, rtol=1e-10, atol=1e-10)


RUN_CASES = [
    # 16 output pixels a image: the five images run as one GEMM (Winograd does not apply)
    ((5, 4, 4, 16), (3, 3, 16, 24), (1, 1), "same"),
    # 64 pixels: runs of four images (the last one short), more runs than threads
    ((9, 8, 8, 20), (3, 3, 20, 16), (1, 1), "same"),
    # 1x1, stride 1, unpadded: the images' rows read in place, one GEMM per run
    ((7, 6, 6, 8), (1, 1, 8, 12), (1, 1), "valid"),
    # 1x1 at stride 2: gathered columns, col2im input gradient over the run
    ((6, 9, 9, 16), (1, 1, 16, 8), (2, 2), "valid"),
    ((4, 7, 7, 4), (3, 3, 4, 5), (2, 2), "same"),
    # 400 pixels a image: one image at a time (1x1 reads in place; 3x3 is Winograd)
    ((3, 20, 20, 16), (1, 1, 16, 16), (1, 1), "valid"),
    ((3, 20, 20, 16), (3, 3, 16, 16), (1, 1), "same"),
    # one image of 16 pixels: one GEMM of its columns, col2im input gradient
    ((1, 4, 4, 16), (3, 3, 16, 24), (1, 1), "same"),
    # one image of 420 pixels: Winograd, two blocks of tiles, the 16 products of a block
    # split between the threads
    ((1, 20, 21, 16), (3, 3, 16, 24), (1, 1), "same"),
]


@pytest.mark.parametrize("xshape,kshape,strides,padding", RUN_CASES)
def test_runs_of_small_images_match_direct(xshape, kshape, strides, padding, rng):
    # Images with few output pixels run several to a GEMM (their columns gathered one
    # image after another, or read in place for a 1x1 stride-1 kernel): the forward, the
    # input gradient and the kernel gradient, float64, against the direct sums.
    x, k = rng.normal(size=xshape), rng.normal(size=kshape)
    xv, kv = K.variable(x, dtype="float64"), K.variable(k, dtype="float64")
    y = K.conv2d(xv, kv, strides=strides, padding=padding)
    np.testing.assert_allclose(
        K.eval(y), ref_conv(x, k, strides, (1, 1), padding), rtol=1e-10, atol=1e-10
    )
    g = rng.normal(size=K.int_shape(y))
    dx, dk = K.batch_get_value(K.gradients(K.sum(y * K.constant(g, dtype="float64")), [xv, kv]))
    np.testing.assert_allclose(
        dx, ref_conv_transpose(g, k, x.shape, strides, (1, 1), padding), rtol=1e-10, atol=1e-10
    )
    xp = np.pad(
        x, [(0, 0)] + pads_for(padding, x.shape[1:3], kshape[:2], strides, (1, 1)) + [(0, 0)]
    )
    ref = np.zeros(kshape)
    for kidx in np.ndindex(*kshape[:2]):
        ref[kidx] = np.einsum(
            "nhwc,nhwo->co", xp[(slice(None),) + windows(g.shape[1:3], kidx, strides, (1, 1))], g
        )
    np.testing.assert_allclose(dk, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n", [1, 3, 9])
@pytest.mark.parametrize("kshape,strides", [((3, 3, 16, 24), 1), ((1, 1, 16, 24), 2)])
def test_runs_of_small_images_with_fused_epilogue(n, kshape, strides, rng):
    # float32 with a bias and relu after the convolution: the group runs on each image of
    # a run once the run's GEMM has written it (runs in parallel, or one run with a
    # parallel GEMM); one image, a single run, and runs of four.
    x, k = rng.normal(size=(n, 8, 8, 16)), rng.normal(size=kshape)
    b = rng.normal(size=kshape[-1])
    ph = K.placeholder(shape=(None, 8, 8, 16))
    out = K.relu(
        K.bias_add(K.conv2d(ph, K.constant(k), strides=strides, padding="same"), K.constant(b))
    )
    got = run([ph], [out], [x.astype("float32")])[0]
    ref = np.maximum(ref_conv(x, k, (strides,) * 2, (1, 1), "same") + b, 0)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("strides,padding", [(1, "valid"), (2, "same")])
def test_global_max_of_conv1d_epilogue(n, strides, padding, rng):
    # A text CNN in inference: conv1d -> bias -> relu -> max over time, the max the
    # relu's only reader (taken on each image as the group writes it); and the same
    # with the relu also returned.
    x, k = rng.normal(size=(n, 30, 8)), rng.normal(size=(5, 8, 32))
    b = rng.normal(size=32)
    ph = K.placeholder(shape=(None, 30, 8))
    act = K.relu(
        K.bias_add(K.conv1d(ph, K.constant(k), strides=strides, padding=padding), K.constant(b))
    )
    xs = x[:, None].astype("float32")
    ref_act = np.maximum(ref_conv(x[:, None], k[None], (1, strides), (1, 1), padding)[:, 0] + b, 0)
    got = run([ph], [K.max(act, axis=1)], [xs[:, 0]])[0]
    np.testing.assert_allclose(got, ref_act.max(axis=1), rtol=1e-4, atol=1e-3)
    got_max, got_act = run([ph], [K.max(act, axis=1), act], [xs[:, 0]])
    np.testing.assert_allclose(got_act, ref_act, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(got_max, got_act.max(axis=1))


@pytest.mark.parametrize(
    "xshape,kshape,strides",
    [
        ((3, 4, 4, 16), (3, 3, 16, 16), 1),
        ((5, 5, 5, 3), (1, 1, 3, 4), 2),
        ((4, 3, 3, 2), (1, 1, 2, 3), 1),
    ],
)
def test_runs_of_small_images_gradients(xshape, kshape, strides, rng):
    check_grad(
        lambda x, k: K.conv2d(x, k, strides=strides, padding="same"),
        [rng.normal(size=xshape), rng.normal(size=kshape)],
        eps=1e-6,
        rtol=1e-5,
        atol=1e-6,
    )


def test_conv_transpose_output_shape_tensor(rng):
    x, k = (
        rng.normal(size=(2, 3, 3, 4)).astype("float32"),
        rng.normal(size=(3, 3, 2, 4)).astype("float32"),
    )
    ph = K.placeholder(shape=(None, 3, 3, 4))
    osh = K.concatenate([K.shape(ph)[0:1], K.constant(np.array([6, 6, 2]), dtype="int32")])
    out = K.conv2d_transpose(ph, K.constant(k), osh, strides=(2, 2), padding="same")
    got = run([ph], [out], [x])[0]
    ref = ref_conv_transpose(
        x.astype(np.float64), k.astype(np.float64), (2, 6, 6, 2), (2, 2), (1, 1), "same"
    )
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


# ---- locally connected ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize(
    "xshape,ks,strides,filters",
    [
        ((2, 7, 3), (2,), (2,), 4),
        ((2, 6, 2), (3,), (1,), 3),
        ((2, 5, 6, 3), (2, 3), (1, 2), 4),
        ((2, 6, 5, 2), (3, 2), (2, 1), 3),
    ],
)
def test_local_conv(xshape, ks, strides, filters, fmt, rng):
    nsp = len(ks)
    x = rng.normal(size=xshape)
    out_sp = tuple((xshape[1 + i] - ks[i]) // strides[i] + 1 for i in range(nsp))
    kernel = rng.normal(size=(int(np.prod(out_sp)), int(np.prod(ks)) * xshape[-1], filters))
    xin = to_first(x) if fmt == "channels_first" else x
    ref = ref_local(xin, kernel, ks, strides, fmt)
    xc, kc = K.constant(xin, dtype="float64"), K.constant(kernel, dtype="float64")
    if nsp == 1:
        out = K.local_conv1d(xc, kc, ks, strides, data_format=fmt)
    else:
        out = K.local_conv2d(xc, kc, ks, strides, out_sp, data_format=fmt)
    np.testing.assert_allclose(K.eval(out), ref, rtol=1e-10, atol=1e-10)


# ---- pooling ------------------------------------------------------------------------------

POOL_CASES = [
    ((2, 6, 7, 3), (2, 2), (2, 2), "valid"),
    ((2, 6, 7, 3), (2, 2), (2, 2), "same"),
    ((2, 7, 7, 2), (3, 3), (2, 2), "same"),
    ((2, 7, 6, 2), (3, 2), (1, 1), "same"),
    ((1, 8, 7, 2), (3, 3), (3, 2), "valid"),
    ((2, 5, 4, 6, 2), (2, 2, 2), (2, 2, 2), "same"),
    ((1, 5, 5, 5, 2), (3, 2, 3), (2, 1, 2), "valid"),
    # unpadded windows over blocks of 16 channels: the average and max without window lists
    # (disjoint windows with rows left over, overlapping windows, 3-D)
    ((2, 7, 9, 16), (2, 2), (2, 2), "valid"),
    ((1, 8, 7, 32), (3, 3), (2, 1), "valid"),
    ((1, 5, 4, 6, 16), (2, 2, 3), (1, 2, 2), "valid"),
]


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("pool_mode", ["max", "avg"])
@pytest.mark.parametrize("xshape,window,strides,padding", POOL_CASES)
def test_pool(xshape, window, strides, padding, pool_mode, fmt, rng):
    x = rng.normal(size=xshape)
    ref = ref_pool(x, window, strides, padding, pool_mode)
    xin = to_first(x) if fmt == "channels_first" else x
    fn = K.pool2d if len(window) == 2 else K.pool3d
    ph = K.placeholder(shape=(None,) + xin.shape[1:], dtype="float64")
    out = fn(ph, window, strides=strides, padding=padding, data_format=fmt, pool_mode=pool_mode)
    got = run([ph], [out], [xin])[0]
    np.testing.assert_allclose(
        from_first(got) if fmt == "channels_first" else got, ref, rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("window,strides", [((2, 2), (2, 2)), ((3, 3), (2, 1))])
def test_max_pool_nans_match_across_channel_counts(window, strides, rng):
    # 16, 32 and 64 channels take the kernels with the window's maximum in registers, 65
    # the general loop: the same maxima, NaNs included (a NaN is kept where a window
    # starts with it, as `v > max` scans do).
    x = rng.normal(size=(2, 7, 8, 65)).astype("float32")
    x[rng.random(x.shape) < 0.1] = np.nan
    pool = lambda t: K.eval(K.pool2d(K.constant(t), window, strides, "valid", pool_mode="max"))
    wide = pool(x)
    for c in (16, 32, 64):
        narrow = pool(np.ascontiguousarray(x[..., :c]))
        np.testing.assert_array_equal(narrow, wide[..., :c])
        assert np.isnan(narrow).any()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_pool_low_precision(dtype, rng):
    x = rng.normal(size=(2, 7, 7, 4))
    for mode in ("max", "avg"):
        got = K.eval(K.pool2d(K.constant(x, dtype=dtype), (3, 3), (2, 2), "same", pool_mode=mode))
        assert got.dtype == np.dtype(dtype)
        ref = ref_pool(x.astype(dtype).astype(np.float64), (3, 3), (2, 2), "same", mode)
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=1e-2)


# ---- gradients ----------------------------------------------------------------------------

GRAD_CASES = [
    ("conv1d", lambda x, k: K.conv1d(x, k, strides=2, padding="same"), (2, 7, 2), (3, 2, 3)),
    (
        "conv1d causal",
        lambda x, k: K.conv1d(x, k, padding="causal", dilation_rate=2),
        (2, 7, 2),
        (2, 2, 3),
    ),
    ("conv2d same", lambda x, k: K.conv2d(x, k, padding="same"), (2, 5, 4, 2), (3, 3, 2, 3)),
    (
        "conv2d strided",
        lambda x, k: K.conv2d(x, k, strides=(2, 1), padding="valid"),
        (2, 5, 5, 2),
        (3, 2, 2, 2),
    ),
    (
        "conv2d dilated cf",
        lambda x, k: K.conv2d(x, k, padding="same", dilation_rate=2, data_format="channels_first"),
        (2, 2, 5, 5),
        (2, 2, 2, 2),
    ),
    (
        "conv3d",
        lambda x, k: K.conv3d(x, k, strides=(1, 2, 1), padding="same"),
        (1, 3, 4, 3, 2),
        (2, 2, 2, 2, 2),
    ),
    (
        "depthwise",
        lambda x, k: K.depthwise_conv2d(x, k, strides=2, padding="same"),
        (2, 5, 5, 3),
        (3, 3, 3, 2),
    ),
    (
        "depthwise s1",
        lambda x, k: K.depthwise_conv2d(x, k, padding="valid"),
        (1, 4, 5, 2),
        (2, 2, 2, 1),
    ),
    (
        "depthwise 16",
        lambda x, k: K.depthwise_conv2d(x, k, padding="same"),
        (1, 4, 3, 16),
        (3, 3, 16, 1),
    ),
    (
        "depthwise 16 dilated",
        lambda x, k: K.depthwise_conv2d(x, k, padding="same", dilation_rate=2),
        (1, 5, 6, 16),
        (3, 3, 16, 1),
    ),
    (
        "depthwise 16 small image",
        lambda x, k: K.depthwise_conv2d(x, k, padding="same"),
        (2, 2, 1, 16),
        (3, 3, 16, 1),
    ),
    (
        "depthwise 32 s2",
        lambda x, k: K.depthwise_conv2d(x, k, strides=(2, 1), padding="same"),
        (2, 5, 4, 32),
        (3, 3, 32, 1),
    ),
    (
        "conv2d_transpose",
        lambda x, k: K.conv2d_transpose(x, k, (2, 6, 5, 2), strides=2, padding="same"),
        (2, 3, 3, 3),
        (3, 3, 2, 3),
    ),
    (
        "conv2d_transpose s1",
        lambda x, k: K.conv2d_transpose(x, k, (1, 5, 5, 2), padding="valid"),
        (1, 3, 4, 3),
        (3, 2, 2, 3),
    ),
    (
        "local_conv2d",
        lambda x, k: K.local_conv2d(x, k, (2, 2), (1, 1), (2, 3)),
        (2, 3, 4, 2),
        (6, 8, 2),
    ),
    (
        "local_conv1d cf",
        lambda x, k: K.local_conv1d(x, k, (2,), (2,), data_format="channels_first"),
        (2, 2, 6),
        (3, 4, 2),
    ),
]


@pytest.mark.parametrize("name,fn,xshape,kshape", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_conv_gradients(name, fn, xshape, kshape, rng):
    check_grad(
        fn, [rng.normal(size=xshape), rng.normal(size=kshape)], eps=1e-6, rtol=1e-6, atol=1e-8
    )


def test_separable_gradients(rng):
    fn = lambda x, d, p: K.separable_conv2d(x, d, p, padding="same", strides=(1, 2))  # noqa: E731
    check_grad(
        fn,
        [
            rng.normal(size=(2, 4, 5, 2)),
            rng.normal(size=(3, 3, 2, 2)),
            rng.normal(size=(1, 1, 4, 3)),
        ],
        eps=1e-6,
        rtol=1e-6,
        atol=1e-8,
    )


@pytest.mark.parametrize("pool_mode", ["max", "avg"])
@pytest.mark.parametrize(
    "window,strides,padding",
    [((2, 2), (2, 2), "valid"), ((3, 3), (2, 2), "same"), ((3, 2), (1, 1), "same")],
)
def test_pool_gradients(window, strides, padding, pool_mode, rng):
    # Distinct values (a shuffled range) keep every max away from a tie within eps.
    x = rng.permutation(2 * 5 * 5 * 2).reshape(2, 5, 5, 2) / 10.0
    check_grad(
        lambda t: K.pool2d(t, window, strides, padding, pool_mode=pool_mode),
        [x],
        eps=1e-6,
        rtol=1e-6,
        atol=1e-8,
    )


@pytest.mark.parametrize(
    "window,strides,xshape",
    [((2, 2), (2, 2), (2, 5, 7, 16)), ((3, 2), (2, 1), (1, 6, 5, 32))],
)
def test_avg_pool_gradients_over_channel_blocks(window, strides, xshape, rng):
    # Unpadded average pooling over blocks of 16 channels, against finite differences.
    check_grad(
        lambda t: K.pool2d(t, window, strides, "valid", pool_mode="avg"),
        [rng.normal(size=xshape)],
        eps=1e-6,
        rtol=1e-6,
        atol=1e-8,
    )


def test_pool3d_gradients(rng):
    x = rng.permutation(1 * 4 * 3 * 4 * 2).reshape(1, 4, 3, 4, 2) / 10.0
    for mode in ("max", "avg"):
        check_grad(
            lambda t: K.pool3d(t, (2, 2, 2), (1, 2, 2), "same", pool_mode=mode),
            [x],
            eps=1e-6,
            rtol=1e-6,
            atol=1e-8,
        )


@pytest.mark.parametrize("strides,padding", [((1, 1), "same"), ((2, 2), "same"), ((2, 1), "valid")])
def test_conv_second_order(strides, padding, rng):
    # Gradients of gradients: d/dx and d/dk of K.gradients(sum(conv(x, k)^2 * P), [x, k]),
    # which runs the VJPs of the transposed and kernel-gradient primitives.
    proj = K.constant(rng.uniform(0.5, 1.5, size=(64,)), dtype="float64")

    def grad_of(x, k, i):
        y = K.conv2d(x, k, strides=strides, padding=padding)
        return K.gradients(
            K.sum(
                K.square(y)
                * K.reshape(proj[: int(np.prod(K.int_shape(y)[1:]))], K.int_shape(y)[1:])
            ),
            [x, k],
        )[i]

    arrays = [rng.normal(size=(1, 4, 4, 2)), rng.normal(size=(2, 2, 2, 2))]
    check_grad(lambda x, k: grad_of(x, k, 0), arrays, eps=1e-5, rtol=1e-5, atol=1e-7)
    check_grad(lambda x, k: grad_of(x, k, 1), arrays, eps=1e-5, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("pool_mode", ["max", "avg"])
def test_pool_second_order(pool_mode, rng):
    # d/dx of the gradient of sum(pool(x * w)^2): runs the VJPs of PoolGrad and PoolSelect.
    x = rng.permutation(36).reshape(1, 6, 6, 1) / 10.0
    w = rng.uniform(0.5, 1.5, size=(1, 6, 6, 1))

    def fn(t):
        return K.gradients(
            K.sum(
                K.square(
                    K.pool2d(
                        t * K.constant(w, dtype="float64"), (2, 2), (2, 2), pool_mode=pool_mode
                    )
                )
            ),
            [t],
        )[0]

    check_grad(fn, [x], eps=1e-6, rtol=1e-6, atol=1e-8)


PAD_CASES = [
    # ZeroPadding2D before a strided depthwise convolution with `valid` padding, as in
    # MobileNetV2, then asymmetric pads under a dense, dilated and a depthwise multiplier.
    ("depthwise s2", (2, 8, 6, 16), (3, 3, 16, 1), ((0, 1), (0, 1)), dict(strides=2)),
    ("depthwise m2", (1, 5, 6, 3), (3, 3, 3, 2), ((2, 0), (1, 1)), dict()),
    ("conv2d dilated", (2, 5, 4, 2), (2, 3, 2, 3), ((1, 2), (0, 1)), dict(dilation_rate=2)),
    ("conv2d same", (1, 5, 4, 2), (3, 3, 2, 3), ((1, 0), (0, 2)), dict(padding="same")),
]


@pytest.mark.parametrize("name,xshape,kshape,pads,kw", PAD_CASES, ids=[c[0] for c in PAD_CASES])
def test_zero_padding_then_conv(name, xshape, kshape, pads, kw, rng):
    """A zero pad of the spatial dims followed by a convolution (which folds the pad into
    its own padding where that is explicit): the convolution of the padded array, and
    finite-difference gradients; a second reader of the padded tensor sees it padded."""
    fn = K.depthwise_conv2d if name.startswith("depthwise") else K.conv2d
    conv = lambda x, k: fn(K.spatial_2d_padding(x, pads), k, **kw)  # noqa: E731
    x, k = rng.normal(size=xshape), rng.normal(size=kshape)
    xp = np.pad(x, ((0, 0),) + pads + ((0, 0),))
    opts = dict(kw, padding=kw.get("padding", "valid"))
    strides, dil = _tup(opts.get("strides", 1), 2), _tup(opts.get("dilation_rate", 1), 2)
    if fn is K.depthwise_conv2d:
        ref = ref_depthwise(xp, k, strides, dil, opts["padding"])
    else:
        ref = ref_conv(xp, k, strides, dil, opts["padding"])
    ph = K.placeholder(shape=xshape, dtype="float64")
    padded = K.spatial_2d_padding(ph, pads)
    out = fn(padded, K.constant(k, dtype="float64"), **kw)
    got, got_padded = run([ph], [out, padded * 2.0], [x])
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got_padded, xp * 2.0, rtol=0, atol=0)
    check_grad(conv, [x, k], eps=1e-6, rtol=1e-6, atol=1e-8)


def test_gradients_flow_through_unknown_batch(rng):
    x = rng.normal(size=(3, 6, 6, 2))
    k = K.variable(rng.normal(size=(3, 3, 2, 4)), dtype="float64")
    ph = K.placeholder(shape=(None, None, None, 2), dtype="float64")
    y = K.pool2d(
        K.conv2d(ph, k, strides=2, padding="same"), (2, 2), padding="same", pool_mode="avg"
    )
    assert K.int_shape(y) == (None, None, None, 4)
    g = K.gradients(K.sum(y), [k])[0]
    got_y, got_g = run([ph], [y, g], [x])
    np.testing.assert_allclose(
        got_y,
        ref_pool(
            ref_conv(x, K.get_value(k), (2, 2), (1, 1), "same"), (2, 2), (1, 1), "same", "avg"
        ),
        rtol=1e-10,
        atol=1e-10,
    )
    assert got_g.shape == (3, 3, 2, 4)


# ---- bad input ----------------------------------------------------------------------------

BAD = [
    (lambda: K.conv2d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 2, 4))), ("channel", "kernel")),
    (lambda: K.conv2d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 4))), ("kernel", "rank")),
    (lambda: K.conv2d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 3, 4)), padding="full"), ("padding",)),
    (lambda: K.conv2d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 3, 4)), padding="causal"), ("padding",)),
    (
        lambda: K.conv2d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 3, 4)), data_format="nchw"),
        ("data_format",),
    ),
    (
        lambda: K.conv2d(K.ones((1, 9, 9, 3)), K.ones((3, 3, 3, 4)), strides=2, dilation_rate=2),
        ("strides", "dilation"),
    ),
    (lambda: K.conv2d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 3, 4)), strides=(1, 1, 1)), ("strides",)),
    (lambda: K.conv2d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 3, 4)), strides=0), ("strides",)),
    (lambda: K.conv2d(K.ones((1, 2, 2, 3)), K.ones((3, 3, 3, 4))), ("kernel", "size")),
    (lambda: K.conv1d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 4))), ("rank",)),
    (
        lambda: K.depthwise_conv2d(K.ones((1, 5, 5, 3)), K.ones((3, 3, 2, 1))),
        ("channels", "depthwise_kernel"),
    ),
    (
        lambda: K.separable_conv2d(
            K.ones((1, 5, 5, 3)), K.ones((3, 3, 3, 1)), K.ones((1, 1, 4, 2))
        ),
        ("pointwise_kernel",),
    ),
    (
        lambda: K.conv2d_transpose(
            K.ones((1, 3, 3, 4)), K.ones((3, 3, 2, 4)), (1, 9, 9, 2), strides=2, padding="same"
        ),
        ("output_shape",),
    ),
    (
        lambda: K.conv2d_transpose(
            K.ones((1, 3, 3, 4)), K.ones((3, 3, 2, 5)), (1, 6, 6, 2), strides=2, padding="same"
        ),
        ("channels",),
    ),
    (lambda: K.pool2d(K.ones((1, 5, 5, 3)), (2, 2), pool_mode="min"), ("pool_mode",)),
    (lambda: K.pool2d(K.ones((1, 5, 5, 3)), (2, 2), padding="causal"), ("padding",)),
    (
        lambda: K.pool2d(K.ones((1, 5, 5, 3)), (2, 2), data_format="channels_middle"),
        ("data_format",),
    ),
    (lambda: K.pool3d(K.ones((1, 5, 5, 3)), (2, 2, 2)), ("rank",)),
    (
        lambda: K.local_conv2d(K.ones((1, 4, 4, 3)), K.ones((9, 10, 5)), (2, 2), (1, 1), (3, 3)),
        ("feature_dim",),
    ),
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_input(i):
    fn, words = BAD[i]
    with pytest.raises(ValueError) as e:
        fn()
    assert_mentions(e, *words)


def test_dtype_mismatch_is_type_error():
    with pytest.raises(TypeError):
        K.conv2d(K.ones((1, 5, 5, 3), dtype="float64"), K.ones((3, 3, 3, 4), dtype="float32"))


def test_runtime_shape_mismatch_raises_value_error(rng):
    ph = K.placeholder(shape=(None, None, None, 3))
    f = K.function([ph], [K.conv2d(ph, K.ones((3, 3, 3, 2)))])
    with pytest.raises(ValueError):
        f([np.ones((1, 2, 2, 3), dtype="float32")])


def test_all_functions_exported():
    names = [
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
    for n in names:
        assert callable(getattr(K, n)), n
        assert getattr(K, n).__doc__ and "Example" in getattr(K, n).__doc__, n


def test_many_images_run_in_parallel_and_agree(rng):
    # More images than threads takes the per-image parallel path; one image the GEMM-
    # parallel path. Both must agree with the reference.
    x, k = rng.normal(size=(5, 12, 11, 6)), rng.normal(size=(3, 3, 6, 7))
    for xs in (x, x[:1]):
        got = K.eval(
            K.conv2d(
                K.constant(xs, dtype="float64"), K.constant(k, dtype="float64"), padding="same"
            )
        )
        np.testing.assert_allclose(
            got, ref_conv(xs, k, (1, 1), (1, 1), "same"), rtol=1e-10, atol=1e-10
        )


def test_docstring_examples_run():
    import doctest

    from ferrokeras._k import conv

    result = doctest.testmod(conv)
    assert result.failed == 0 and result.attempted >= 12


# ---- max-pool gradient where windows do not overlap ---------------------------------------
# Strides at least the pool size take a kernel that writes each element of dx once (zeroing
# first only where some pixel lies in no window: gaps between windows, a remainder, padding).


def ref_max_pool_grad(x, gy, window, strides, padding):
    """dx of a channels-last max pool: each window's gradient to its first maximum (in
    window order, as TensorFlow's MaxPoolGrad), with TensorFlow's `same` padding split."""
    nsp = len(window)
    dx = np.zeros_like(x)
    starts = []
    for d in range(nsp):
        n, k, s, o = x.shape[1 + d], window[d], strides[d], gy.shape[1 + d]
        before = max((o - 1) * s + k - n, 0) // 2 if padding == "same" else 0
        starts.append([i * s - before for i in range(o)])
    for b in range(x.shape[0]):
        for opix in np.ndindex(*gy.shape[1:-1]):
            lo = [max(starts[d][opix[d]], 0) for d in range(nsp)]
            hi = [min(starts[d][opix[d]] + window[d], x.shape[1 + d]) for d in range(nsp)]
            sl = tuple(slice(lo[d], hi[d]) for d in range(nsp))
            win = x[(b,) + sl].reshape(-1, x.shape[-1])
            first = np.argmax(win, axis=0)
            for c in range(x.shape[-1]):
                at = np.unravel_index(first[c], [hi[d] - lo[d] for d in range(nsp)])
                dx[(b,) + tuple(lo[d] + at[d] for d in range(nsp)) + (c,)] += gy[(b,) + opix + (c,)]
    return dx


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "xshape,window,strides,padding",
    [
        ((3, 6, 8, 5), (2, 2), (2, 2), "valid"),  # windows cover the image exactly
        ((2, 7, 5, 3), (2, 2), (2, 2), "valid"),  # a remainder row and column in no window
        ((2, 7, 5, 17), (2, 2), (2, 2), "same"),  # padding (windows cut at the edge)
        ((2, 8, 9, 4), (2, 3), (3, 4), "valid"),  # gaps between windows
        ((2, 9, 3), (3,), (3,), "valid"),  # 1-D (as 2-D with a unit dim)
        ((1, 4, 5, 6, 2), (2, 2, 2), (2, 3, 2), "same"),  # 3-D
        ((0, 4, 4, 2), (2, 2), (2, 2), "valid"),  # no images
        # 16, 32 and 64 channels: the window's maximum kept in registers
        ((2, 6, 6, 16), (2, 2), (2, 2), "valid"),
        ((2, 7, 5, 32), (2, 2), (2, 2), "same"),
        ((2, 8, 9, 64), (2, 3), (3, 4), "valid"),
    ],
    ids=str,
)
def test_max_pool_grad_disjoint_windows(xshape, window, strides, padding, dtype, rng):
    # Values from a small set, so many windows hold ties (the first maximum takes it all).
    x = rng.integers(0, 4, size=xshape).astype(dtype)
    px = K.placeholder(shape=xshape, dtype=dtype)
    if len(window) == 1:  # no K.pool1d: a 2-D pool over a unit first dim
        y = K.squeeze(K.pool2d(K.expand_dims(px, 1), (1,) + window, (1,) + strides, padding), 1)
    else:
        y = {2: K.pool2d, 3: K.pool3d}[len(window)](px, window, strides, padding, pool_mode="max")
    gy = rng.normal(size=K.int_shape(y)).astype(dtype)
    pg = K.placeholder(shape=gy.shape, dtype=dtype)
    dx = run([px, pg], [K.gradients(K.sum(y * pg), [px])[0]], [x, gy])[0]
    want = ref_max_pool_grad(x.astype(np.float64), gy.astype(np.float64), window, strides, padding)
    assert dx.dtype == np.dtype(dtype)
    np.testing.assert_allclose(dx, want, rtol=1e-6, atol=1e-6)


def _depthwise_kernel_grad_ref(x, gy, k, stride):
    """dw[a, b, c, 0] = sum over images and output pixels of gy * the input pixel tap (a, b)
    reads, 'same' padding, in float64."""
    n, h, w, c = x.shape
    oh, ow = gy.shape[1:3]
    (pt, _), (pl, _) = pads_for("same", (h, w), (k, k), (stride, stride), (1, 1))
    xp = np.zeros((n, h + 2 * k, w + 2 * k, c))
    xp[:, pt : pt + h, pl : pl + w] = x
    dw = np.zeros((k, k, c, 1))
    for a in range(k):
        for b in range(k):
            win = xp[:, a : a + stride * oh : stride, b : b + stride * ow : stride]
            dw[a, b, :, 0] = np.einsum("nijc,nijc->c", win[:, :oh, :ow], gy)
    return dw


@pytest.mark.parametrize(
    "xshape,stride",
    [
        ((2, 48, 40, 32), 1),  # few channels, the image over several bands of rows
        ((1, 40, 40, 80), 1),  # many channels, an image larger than one band
        ((2, 41, 40, 32), 2),
        ((2, 10, 12, 96), 1),  # many channels, a small image: the loop over all channels
    ],
)
def test_depthwise_kernel_gradient_over_bands_of_rows(xshape, stride, rng):
    x = rng.normal(size=xshape).astype(np.float32)
    kern = rng.normal(size=(3, 3, xshape[-1], 1)).astype(np.float32)
    xs, ks = K.placeholder(shape=xshape), K.variable(kern)
    y = K.depthwise_conv2d(xs, ks, strides=(stride, stride), padding="same")
    gy = rng.normal(size=K.int_shape(y)).astype(np.float32)
    g = K.placeholder(shape=K.int_shape(y))
    dw = K.gradients(K.sum(y * g), [ks])[0]
    got = run([xs, g], [dw], [x, gy])[0]
    ref = _depthwise_kernel_grad_ref(x.astype(np.float64), gy.astype(np.float64), 3, stride)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("xshape", [(1, 4, 0, 32), (1, 0, 3, 32), (0, 4, 4, 32)])
def test_depthwise_empty_images(xshape):
    """Images with no pixels (or no images) give empty results and a zero kernel gradient
    through the kernels that read the unpadded image."""
    xs = K.placeholder(shape=(None, None, None, 32))
    ks = K.variable(np.ones((3, 3, 32, 1), dtype=np.float32))
    y = K.depthwise_conv2d(xs, ks, padding="same")
    out, gx, gw = run([xs], [y] + K.gradients(K.sum(y), [xs, ks]), [np.ones(xshape, np.float32)])
    assert out.shape == xshape and gx.shape == xshape
    np.testing.assert_array_equal(gw, np.zeros((3, 3, 32, 1), np.float32))
