"""Common-subexpression elimination when a `K.function` is compiled: nodes with the same
op and the same inputs are computed once (`compile::Plan::new`). Random draws, feeds,
variables and callbacks are never merged. Launch counts are read with CPU fusion off
(`FERROKERAS_CPU_FUSION=0`, read once per process: in a child process), where each node
is one launch.
"""

import ferrokeras
import numpy as np
from env_child import env_is, pytest_in_child
from ferrokeras import backend as K


def on_cpu():
    return ferrokeras.device() == "cpu"


def test_repeated_subexpressions_run_once(rng):
    if not env_is("FERROKERAS_CPU_FUSION", "0"):
        pytest_in_child(
            {"FERROKERAS_CPU_FUSION": "0"}, f"{__file__}::test_repeated_subexpressions_run_once"
        )
        return
    x = K.placeholder(shape=(None, 8))
    w = K.variable(rng.standard_normal((8, 4)).astype("float32"))
    # The same product and the same exp built twice each, as Keras code often does.
    a = K.exp(K.dot(x, w)) + K.exp(K.dot(x, w))
    b = K.sum(K.exp(K.dot(x, w)), axis=-1)
    f = K.function([x], [a, b])
    xv = rng.standard_normal((5, 8)).astype("float32")
    out_a, out_b = f([xv])
    e = np.exp(xv.astype("float64") @ K.get_value(w))
    np.testing.assert_allclose(out_a, 2 * e, rtol=1e-5)
    np.testing.assert_allclose(out_b, e.sum(-1), rtol=1e-5)
    if on_cpu():
        # matmul, exp, add, sum: the duplicates add nothing.
        assert f.dispatches == 4, f.dispatches


def test_random_draws_and_feeds_stay_distinct(rng):
    r1 = K.random_uniform((1000,), seed=None)
    r2 = K.random_uniform((1000,), seed=None)
    x = K.placeholder(shape=(3,))
    y = K.placeholder(shape=(3,))
    f = K.function([x, y], [r1 - r2, x * 2.0 - y * 2.0])
    d, e = f([np.ones(3, "float32"), np.zeros(3, "float32")])
    assert np.count_nonzero(d) > 900
    np.testing.assert_array_equal(e, [2.0, 2.0, 2.0])


def test_gradients_through_shared_nodes(rng):
    x = K.placeholder(shape=(None, 6))
    t = K.tanh(x)
    loss = K.sum(K.tanh(x) * K.tanh(x)) + K.sum(t)
    (g,) = K.gradients(loss, [x])
    f = K.function([x], [g])
    xv = rng.standard_normal((4, 6)).astype("float32")
    th = np.tanh(xv.astype("float64"))
    np.testing.assert_allclose(f([xv])[0], (2 * th + 1) * (1 - th**2), rtol=1e-5, atol=1e-6)
