"""Sums and means folded into the fused elementwise pass that computes their input.

On the CPU a `sum`, `mean` or gradient `sum_to` of a fused group's member runs inside the
group: each tile of the member is added up right after it is computed, and a member read
by nothing else is never written out (`compile::fuse::folds`). The reduction pattern is
decided at run time: leading axes (batch-norm statistics, bias gradients), trailing axes
(row sums) and a run of axes between kept ones (a global pooling over rows and columns)
fold; other patterns (reduced axes on both sides of a kept one) compute the member in full
and reduce it as before. These tests compare every pattern with NumPy in float64, with one or several
folds per group, a member also returned, special values, empty batches, many tasks and
a convolution's epilogue; on the CPU they check the launches saved. On a GPU device the
same graphs run there (folded into the group's generated kernel, `test_fusion_gpu.py`)
and must give the same values.
"""

import ferrokeras
import numpy as np
import pytest
from ferrokeras import backend as K
from reference import np_nbt_grad


def on_cpu():
    return ferrokeras.device() == "cpu"


def close(got, want, rtol=2e-5):
    want = np.asarray(want, dtype="float64")
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def f64(*xs):
    return [x.astype("float64") for x in xs]


@pytest.mark.parametrize(
    "shape,axis,keepdims",
    [
        ((64, 8, 8, 32), [0, 1, 2], True),  # batch-norm statistics
        ((64, 8, 8, 32), [0, 1, 2], False),
        ((300, 7), 0, False),  # narrow columns
        ((50, 40, 3), -1, False),  # row sums
        ((50, 40, 3), [1, 2], True),
        ((9, 10, 11), None, False),  # everything
        ((9, 10, 11), 1, False),  # a middle axis
        ((8, 6, 6, 16), [1, 2], False),  # global pooling
        ((8, 6, 6, 16), [1, 2], True),
        ((9, 10, 11), [0, 2], False),  # reduced on both sides: not folded, same values
        ((1, 20, 1, 30), [0, 1], False),  # size-1 dims on either side
        ((40, 1, 30), 1, True),  # only a size-1 axis: nothing summed
    ],
)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_fold_matches_numpy(rng, shape, axis, keepdims, op):
    xv = rng.standard_normal(shape).astype("float32")
    yv = rng.standard_normal(shape).astype("float32")
    x, y = K.placeholder(shape=shape), K.placeholder(shape=shape)
    red = getattr(K, op)
    f = K.function([x, y], [red(K.exp(x * 0.5) * y - x, axis=axis, keepdims=keepdims)])
    (out,) = f([xv, yv])
    xd, yd = f64(xv, yv)
    ax = tuple(axis) if isinstance(axis, list) else axis
    close(out, getattr(np, op)(np.exp(xd * 0.5) * yd - xd, axis=ax, keepdims=keepdims))
    if on_cpu():
        # One pass: the group with its fold (axes reduced on both sides of a kept one fall
        # back inside it).
        assert f.dispatches == 1, f.dispatches


def test_batch_norm_statistics_and_gradient_match_numpy(rng):
    """The Keras batch-norm training path: mean, variance, the normalised output and the
    gradients with respect to x, gamma and beta (several folds in one group, a member that
    is both folded and written)."""
    shape = (16, 6, 6, 8)
    xv = (rng.standard_normal(shape) * 2 + 1).astype("float32")
    wv = rng.standard_normal(shape).astype("float32")
    gv = rng.uniform(0.5, 1.5, 8).astype("float32")
    bv = rng.standard_normal(8).astype("float32")
    x = K.placeholder(shape=(None,) + shape[1:])
    w = K.placeholder(shape=(None,) + shape[1:])
    gamma, beta = K.variable(gv), K.variable(bv)
    normed, mean, var = K.normalize_batch_in_training(x, gamma, beta, [0, 1, 2], epsilon=1e-3)
    loss = K.sum(K.relu(normed) * w)
    gx, gg, gb = K.gradients(loss, [x, gamma, beta])
    f = K.function([x, w], [normed, mean, var, gx, gg, gb])
    xd, wd = f64(xv, wv)
    m = xd.mean((0, 1, 2))
    v = ((xd - m) ** 2).mean((0, 1, 2))
    inv = 1 / np.sqrt(v + 1e-3)
    xhat = (xd - m) * inv
    y = xhat * gv + bv
    gx_ref, gg_ref, gb_ref = np_nbt_grad(xd, gv, [0, 1, 2], 1e-3, wd * (y > 0))
    for _ in range(3):  # the generic plan, then the specialised one
        out = f([xv, wv])
        for got, want in zip(out, [y, m, v, gx_ref, gg_ref, gb_ref]):
            close(got, want, rtol=1e-4)


def test_folded_member_also_returned(rng):
    xv = rng.standard_normal((128, 24)).astype("float32")
    x = K.placeholder(shape=(None, 24))
    h = K.tanh(x) * 2.0
    f = K.function([x], [h, K.sum(h, axis=0), K.mean(h, axis=-1)])
    h_out, s, m = f([xv])
    href = np.tanh(xv.astype("float64")) * 2
    close(h_out, href)
    close(s, href.sum(0))
    close(m, href.mean(-1))


def test_special_values_propagate(rng):
    xv = rng.standard_normal((64, 16)).astype("float32")
    xv[3, 2] = np.nan
    xv[7, 5] = np.inf
    xv[9, 5] = 1.0
    xv[10, 9] = -np.inf
    x = K.placeholder(shape=(None, 16))
    f = K.function([x], [K.sum(x * 2.0, axis=0), K.sum(x * 2.0, axis=-1)])
    cols, rows = f([xv])
    with np.errstate(invalid="ignore"):
        close(cols, (xv.astype("float64") * 2).sum(0))
        close(rows, (xv.astype("float64") * 2).sum(-1))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_small_and_empty_batches(rng, n):
    xv = rng.standard_normal((n, 5, 4)).astype("float32")
    x = K.placeholder(shape=(None, 5, 4))
    f = K.function([x], [K.sum(K.square(x), axis=[0, 1]), K.mean(K.abs(x) + 1.0, axis=-1)])
    s, m = f([xv])
    xd = xv.astype("float64")
    close(s, (xd**2).sum((0, 1)))
    assert m.shape == (n, 5)
    if n:
        close(m, (np.abs(xd) + 1).mean(-1))


def test_large_input_splits_across_tasks_in_whole_rows(rng):
    # Rows of 37 and columns of 37: tasks and tiles must not cut a row or a column block.
    xv = rng.standard_normal((4099, 37)).astype("float32")
    x = K.placeholder(shape=(None, 37))
    f = K.function(
        [x], [K.sum(x * x + 1.0, axis=0), K.sum(x * x + 1.0, axis=1), K.sum(x * x + 1.0)]
    )
    cols, rows, total = f([xv])
    xd = xv.astype("float64")
    close(cols, (xd * xd + 1).sum(0))
    close(rows, (xd * xd + 1).sum(1))
    close(total, (xd * xd + 1).sum(), rtol=1e-5)


def test_middle_axes_split_across_tasks_and_tiles(rng):
    # Blocks of 129 x 5 elements: tasks and tiles end inside blocks, and a tile may end
    # one block and start the next.
    xv = rng.standard_normal((67, 129, 5)).astype("float32")
    x = K.placeholder(shape=(None, 129, 5))
    h = K.abs(x) + x * x
    f = K.function([x], [K.mean(h, axis=1), K.sum(h, axis=1, keepdims=True)])
    m, s = f([xv])
    xd = xv.astype("float64")
    close(m, (np.abs(xd) + xd * xd).mean(1))
    close(s, (np.abs(xd) + xd * xd).sum(1, keepdims=True))
    if on_cpu():
        assert f.dispatches == 1, f.dispatches


def test_sum_to_of_broadcast_gradient(rng):
    """`sum_to` from a gradient: the bias of `x * b` broadcast over leading dims."""
    xv = rng.standard_normal((32, 10, 12)).astype("float32")
    bv = rng.standard_normal((1, 12)).astype("float32")
    x = K.placeholder(shape=(None, 10, 12))
    b = K.variable(bv)
    loss = K.sum(K.sigmoid(x * b))
    (gb,) = K.gradients(loss, [b])
    f = K.function([x], [gb])
    xd = xv.astype("float64")
    s = 1 / (1 + np.exp(-xd * bv))
    want = (s * (1 - s) * xd).sum((0, 1)).reshape(1, 12)
    for _ in range(3):
        close(f([xv])[0], want, rtol=1e-4)


def test_convolution_epilogue_with_folded_mean(rng):
    """conv + bias runs image by image with the bias add as its epilogue; the mean of the
    result folds into that epilogue."""
    xv = rng.standard_normal((8, 12, 12, 3)).astype("float32")
    wv = rng.standard_normal((3, 3, 3, 16)).astype("float32") * 0.3
    bv = rng.standard_normal(16).astype("float32")
    x = K.placeholder(shape=(None, 12, 12, 3))
    w, b = K.variable(wv), K.variable(bv)
    y = K.bias_add(K.conv2d(x, w, padding="same"), b)
    f = K.function([x], [K.mean(y, axis=[0, 1, 2]), K.relu(y)])
    m, r = f([xv])
    pad = np.pad(xv.astype("float64"), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = np.zeros((8, 12, 12, 16))
    for i in range(3):
        for j in range(3):
            ref += np.einsum("nhwc,cd->nhwd", pad[:, i : i + 12, j : j + 12], wv[i, j])
    ref += bv
    close(m, ref.mean((0, 1, 2)), rtol=1e-4)
    close(r, np.maximum(ref, 0), rtol=1e-4)


def test_convolution_epilogue_with_folded_global_pooling(rng):
    """A pointwise convolution + bias + relu with a global average pooling of the result
    (a separable or MobileNet head): the pooling folds into the epilogue, image by image,
    and its gradient matches NumPy's."""
    xv = rng.standard_normal((6, 9, 7, 8)).astype("float32")
    wv = rng.standard_normal((1, 1, 8, 32)).astype("float32") * 0.3
    bv = rng.standard_normal(32).astype("float32") * 0.1
    x = K.placeholder(shape=(None, 9, 7, 8))
    w, b = K.variable(wv), K.variable(bv)
    y = K.relu(K.bias_add(K.conv2d(x, w), b))
    pooled = K.mean(y, axis=[1, 2])
    f = K.function([x], [pooled, y])
    p, r = f([xv])
    ref = np.maximum(np.einsum("nhwc,cd->nhwd", xv.astype("float64"), wv[0, 0]) + bv, 0)
    close(p, ref.mean((1, 2)), rtol=1e-4)
    close(r, ref, rtol=1e-4)
    (gw,) = K.gradients(K.sum(pooled * pooled), [w])
    xd = xv.astype("float64")
    g = np.broadcast_to((2 * ref.mean((1, 2)) / 63)[:, None, None, :], ref.shape) * (ref > 0)
    close(K.function([x], [gw])([xv])[0], np.einsum("nhwc,nhwd->cd", xd, g)[None, None], rtol=1e-4)
