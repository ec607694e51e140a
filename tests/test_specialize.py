"""CPU runs of a `K.function` use its plan specialised to the feeds' shapes.

Once a set of feed shapes comes a second time, the CPU executor records the slot shapes of
that call and from then on runs a copy of the plan in which `shape` nodes are folded and `sum_to` / `broadcast_to` nodes that change nothing are
dropped, so a gradient's elementwise chain fuses into one pass (`compile::Specialised`).
These tests check that the results stay those of NumPy when feed shapes change between
calls (a `sum_to` that is a no-op for one batch shape and a reduction for another), that
a plan whose shapes depend on fed values is not specialised, and, on the CPU, that the
third call launches fewer kernels. A scalar feed that is a `select` condition (Keras'
learning phase) is fixed by value too: each phase's plan runs only the branch it takes.
"""

import ferrokeras
import numpy as np
import pytest
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
    sets = [
        ((4, 3), (4, 3)),
        ((1, 3), (4, 3)),
        ((4, 3), (1, 3)),
        ((2, 3), (2, 3)),
        ((1, 3), (1, 3)),
        ((5, 3), (1, 3)),
    ]
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


def _bn_step(rng):
    """A batch-norm layer as Keras 2.3.1 builds it: the batch statistics in the training
    phase, the moving ones otherwise, switched on the learning phase; with the gradients
    of a loss in x, gamma and beta."""
    x = K.placeholder(shape=(None, 6))
    gamma = K.variable(rng.uniform(0.5, 1.5, 6).astype("float32"))
    beta = K.variable(rng.standard_normal(6).astype("float32"))
    mm, mv = (
        K.variable(rng.standard_normal(6).astype("float32")),
        K.variable(rng.uniform(0.5, 2, 6).astype("float32")),
    )

    def train():
        return K.normalize_batch_in_training(x, gamma, beta, [0], epsilon=1e-3)[0]

    def infer():
        return K.batch_normalization(x, mm, mv, beta, gamma, epsilon=1e-3)

    return x, (gamma, beta, mm, mv), train, infer


def _bn_ref(xs, params, phase):
    g, b, mm, mv = (K.get_value(p).astype(np.float64) for p in params)
    x = xs.astype(np.float64)
    if phase:
        m, v = x.mean(axis=0), x.var(axis=0)
        inv = 1.0 / np.sqrt(v + 1e-3)
        xh = (x - m) * inv
        y = xh * g + b
        dy = 2.0 * y
        dg, db = (dy * xh).sum(axis=0), dy.sum(axis=0)
        dxh = dy * g
        dx = inv * (dxh - dxh.mean(axis=0) - xh * (dxh * xh).mean(axis=0))
    else:
        inv = 1.0 / np.sqrt(mv + 1e-3)
        y = (x - mm) * inv * g + b
        dy = 2.0 * y
        dg, db, dx = (dy * (x - mm) * inv).sum(axis=0), dy.sum(axis=0), dy * inv * g
    return [np.sum(y * y), dx, dg, db]


def test_learning_phase_switch_matches_numpy_in_either_phase(rng):
    # The learning phase fixed by value in the specialised plans: each phase's plan runs
    # the branch it takes, and gradients flow to that branch only. Phases alternate in
    # runs of three (the third call of a run is specialised), and come back.
    x, params, train, infer = _bn_step(rng)
    y = K.in_train_phase(train, infer)
    loss = K.sum(y * y)
    f = K.function([x, K.learning_phase()], [loss] + K.gradients(loss, [x, params[0], params[1]]))
    for phase in (1, 0, 1, 0):
        for _ in range(3):
            xs = rng.standard_normal((16, 6)).astype("float32")
            for got, want in zip(f([xs, phase]), _bn_ref(xs, params, phase)):
                np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_learning_phase_specialised_runs_one_branch(rng):
    # Once specialised to a phase, the plan launches what a plan built for that phase
    # alone (`training=` a Python value) launches: the other branch and the zero gradient
    # it would send back are gone.
    if not on_cpu():
        pytest.skip("launch counts are those of the CPU executor")
    x, params, train, infer = _bn_step(rng)
    wrt = [x, params[0], params[1]]

    def fn(y, feeds):
        loss = K.sum(y * y)
        return K.function(feeds, [loss] + K.gradients(loss, wrt))

    dyn = fn(K.in_train_phase(train, infer), [x, K.learning_phase()])
    xs = rng.standard_normal((16, 6)).astype("float32")
    for phase in (1, 0):
        fixed = fn(K.in_train_phase(train, infer, training=phase), [x])
        for _ in range(3):
            got = dyn([xs, phase])
        want = fixed([xs])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        fixed([xs]), fixed([xs])
        assert dyn.dispatches == fixed.dispatches, (phase, dyn.dispatches, fixed.dispatches)
