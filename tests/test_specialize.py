"""CPU runs of a `K.function` use its plan specialised to the feeds' shapes.

Once a set of feed shapes comes a second time, the CPU executor records the slot shapes of
that call and from then on runs a copy of the plan in which `shape` nodes are folded and `sum_to` / `broadcast_to` nodes that change nothing are
dropped, so a gradient's elementwise chain fuses into one pass (`compile::Specialised`).
These tests check that the results stay those of NumPy when feed shapes change between
calls (a `sum_to` that is a no-op for one batch shape and a reduction for another), that
a plan whose shapes depend on fed values is not specialised, and, on the CPU, that the
third call launches fewer kernels.
"""

import numpy as np
import pytest

import ferrokeras
from ferrokeras import backend as K


def on_cpu():
    return ferrokeras.device() == "cpu"


def relu(x):
    return np.maximum(x, 0.0)


def test_dense_gradient_chain_fuses_from_the_second_call(rng):
    x = K.placeholder(shape=(None, 32))
    m = K.placeholder(shape=(None, 16))
    w0 = rng.standard_normal((32, 16)).astype("float32") * 0.3
    b0 = rng.standard_normal(16).astype("float32") * 0.3
    w, b = K.variable(w0), K.variable(b0)
    h = K.relu(K.dot(x, w) + b) * m * 2.0
    loss = K.sum(h * h) / K.cast(K.shape(x)[0], "float32")
    gw, gb, gm = K.gradients(loss, [w, b, m])
    f = K.function([x, m], [loss, gw, gb, gm])
    for n in (8, 8, 5, 8, 5):
        xs = rng.standard_normal((n, 32)).astype("float32")
        ms = (rng.uniform(size=(n, 16)) > 0.3).astype("float32")
        got = f([xs, ms])
        pre = xs.astype(np.float64) @ w0 + b0
        a = relu(pre)
        hv = a * ms * 2.0
        dh = 2.0 * hv / n
        dpre = dh * ms * 2.0 * (pre > 0)
        want = [np.sum(hv * hv) / n, xs.T.astype(np.float64) @ dpre, dpre.sum(axis=0), dh * a * 2.0]
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-5)


def test_dispatches_drop_once_specialised(rng):
    if not on_cpu():
        pytest.skip("launch counts are those of the CPU executor")
    x = K.placeholder(shape=(None, 64))
    m = K.placeholder(shape=(None, 64))
    w = K.variable(rng.standard_normal((64, 64)).astype("float32") * 0.1)
    b = K.variable(np.zeros(64, "float32"))
    h = K.relu(K.dot(x, w) + b) * m
    (gx,) = K.gradients(K.sum(h * m), [x])
    f = K.function([x, m], [gx])
    feeds = [rng.standard_normal((16, 64)).astype("float32"), np.ones((16, 64), "float32")]
    first = f(feeds)[0]
    generic = f.dispatches
    f(feeds)  # shapes seen before: this call records them
    assert f.dispatches == generic
    third = f(feeds)[0]
    np.testing.assert_array_equal(first, third)
    assert f.dispatches < generic, (f.dispatches, generic)


def test_shapes_seen_once_are_not_specialised(rng):
    if not on_cpu():
        pytest.skip("launch counts are those of the CPU executor")
    x = K.placeholder(shape=(None, 8))
    w = K.variable(rng.standard_normal((8, 8)).astype("float32"))
    (g,) = K.gradients(K.sum(K.relu(K.dot(x, w)) * x), [x])
    f = K.function([x], [g])
    counts = []
    for n in range(1, 12):
        f([rng.standard_normal((n, 8)).astype("float32")])
        counts.append(f.dispatches)
    assert len(set(counts)) == 1, counts  # every call ran the generic plan
    f([rng.standard_normal((10, 8)).astype("float32")])  # (10, 8) again: recorded
    assert f.dispatches == counts[0]
    f([rng.standard_normal((10, 8)).astype("float32")])
    assert f.dispatches < counts[0]


@pytest.mark.parametrize("order", [0, 1])
def test_sum_to_that_reduces_for_some_shapes(rng, order):
    # d(x*y)/dx is sum_to(g * y, shape(x)): a no-op when x and y have the same shape, a sum
    # over the batch when x has one row. Each shape set runs three times in a row (the
    # third call runs the specialised plan), and more shape sets than the cache keeps are
    # used.
    x = K.placeholder(shape=(None, 3))
    y = K.placeholder(shape=(None, 3))
    z = K.exp(x * 0.1) * y + x
    loss = K.sum(z * z)
    f = K.function([x, y], K.gradients(loss, [x, y]) + [z])
    sets = [((4, 3), (4, 3)), ((1, 3), (4, 3)), ((4, 3), (1, 3)), ((2, 3), (2, 3)), ((1, 3), (1, 3)), ((5, 3), (1, 3))]
    if order:
        sets = sets[::-1]
    for sx, sy in sets + sets:
        for _ in range(3):
            xs = rng.standard_normal(sx).astype("float32")
            ys = rng.standard_normal(sy).astype("float32")
            gx, gy, zv = f([xs, ys])
            x64, y64 = xs.astype(np.float64), ys.astype(np.float64)
            e = np.exp(x64 * 0.1)
            zr = e * y64 + x64
            dz = 2.0 * zr
            dx = dz * (0.1 * e * y64 + 1.0)
            dy = dz * e
            dx = dx.sum(axis=0, keepdims=True) if sx[0] == 1 and sy[0] != 1 else dx
            dy = dy.sum(axis=0, keepdims=True) if sy[0] == 1 and sx[0] != 1 else dy
            np.testing.assert_allclose(zv, zr, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(gx, dx, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(gy, dy, rtol=1e-5, atol=1e-5)
            assert gx.shape == sx and gy.shape == sy


def test_fed_shape_vector_keeps_the_plan_generic(rng):
    # The result's shape follows the fed *values* of `s`, not the feeds' shapes: a plan
    # specialised on shapes alone would keep the first call's shape.
    x = K.placeholder(shape=(None,))
    s = K.placeholder(shape=(2,), dtype="int32")
    r = K.reshape(x, s)
    f = K.function([x, s], [K.shape(r), K.sum(r, axis=0)])
    xs = np.arange(6, dtype="float32")
    for shape in ([2, 3], [3, 2], [2, 3], [6, 1], [1, 6]):
        got_shape, got_sum = f([xs, np.array(shape, "int32")])
        assert got_shape.tolist() == shape
        np.testing.assert_array_equal(got_sum, xs.reshape(shape).sum(axis=0))


def test_training_step_updates_match_before_and_after_specialising(rng):
    # A training function with updates: the first call runs the generic plan (recording
    # shapes), later ones the specialised plan, both updating the variable in place.
    x = K.placeholder(shape=(None, 8))
    w0 = rng.standard_normal((8, 4)).astype("float32")
    w = K.variable(w0)
    loss = K.mean(K.square(K.relu(K.dot(x, w))))
    (g,) = K.gradients(loss, [w])
    f = K.function([x], [loss], updates=[K.update_sub(w, 0.1 * g)])
    ref = w0.astype(np.float64)
    for n in (6, 6, 6, 3, 3, 6):
        xs = rng.standard_normal((n, 8)).astype("float32")
        pre = xs.astype(np.float64) @ ref
        want_loss = np.mean(relu(pre) ** 2)
        grad = xs.T.astype(np.float64) @ (2.0 * relu(pre) / pre.size)
        (got,) = f([xs])
        np.testing.assert_allclose(got, want_loss, rtol=1e-5, atol=1e-6)
        ref = ref - 0.1 * grad
        np.testing.assert_allclose(K.get_value(w), ref, rtol=1e-5, atol=1e-6)


def test_data_dependent_shape_keeps_the_plan_generic():
    # arange over a fed scalar: every call feeds a 0-d array (one shape set), but the
    # result's length follows the value.
    n = K.placeholder(shape=(), dtype="int32")
    r = K.arange(n)
    f = K.function([n], [K.cast(r, "float32") * 2.0, K.shape(r)])
    for v in (3, 3, 3, 5, 5, 5, 1, 1, 4):
        vals, shape = f([np.array(v, "int32")])
        np.testing.assert_array_equal(vals, np.arange(v) * 2.0)
        assert shape.tolist() == [v]
