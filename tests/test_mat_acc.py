"""`acc + dot(a, b)` on the CPU: the product is added into a buffer holding `acc` by the
GEMM (`compile::fuse::Item::MatAcc`) instead of written out and added in a second pass.

The buffer is `acc`'s own only when `acc` dies there and nothing else holds it; a
variable, a fed array, an output or an operand of the product is copied first. These
tests check the sums against NumPy and that nothing read as `acc` changes.
"""

import ferrokeras
import numpy as np
import pytest
from ferrokeras import backend as K


def on_cpu():
    return ferrokeras.device() == "cpu"


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m,k,n", [(64, 64, 256), (7, 5, 3), (200, 300, 100), (1, 9, 1)])
def test_intermediate_plus_product(rng, m, k, n):
    x = K.placeholder(shape=(None, n))
    a = K.placeholder(shape=(None, k))
    w = rng.standard_normal((k, n)).astype("float32")
    # Accumulators made by kernels (not elementwise groups the add would join), dying at
    # the add: their buffers take the product.
    y = K.cumsum(x, axis=1) + K.dot(a, K.variable(w))
    z = K.dot(a, K.variable(w)) + K.softmax(x)
    f = K.function([x, a], [y * 2.0, z])
    xs = rng.standard_normal((m, n)).astype("float32")
    as_ = rng.standard_normal((m, k)).astype("float32")
    y2, zv = f([xs, as_])
    prod = as_.astype(np.float64) @ w
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    close(y2, 2.0 * (np.cumsum(xs.astype(np.float64), axis=1) + prod))
    close(zv, prod + e / e.sum(axis=1, keepdims=True))


def test_variable_and_fed_accumulators_are_not_written(rng):
    v0 = rng.standard_normal((32, 48)).astype("float32")
    v = K.variable(v0)
    acc = K.placeholder(shape=(32, 48))
    a = K.placeholder(shape=(32, 16))
    b = K.placeholder(shape=(16, 48))
    f = K.function([acc, a, b], [v + K.dot(a, b), acc + K.dot(a, b)])
    accs = rng.standard_normal((32, 48)).astype("float32")
    keep = accs.copy()
    as_, bs = (
        rng.standard_normal((32, 16)).astype("float32"),
        rng.standard_normal((16, 48)).astype("float32"),
    )
    for _ in range(3):
        r1, r2 = f([accs, as_, bs])
        prod = as_.astype(np.float64) @ bs
        close(r1, v0 + prod)
        close(r2, keep + prod)
    np.testing.assert_array_equal(K.get_value(v), v0)
    np.testing.assert_array_equal(accs, keep)


def test_accumulator_that_is_also_an_output_or_an_operand(rng):
    a = K.placeholder(shape=(24, 24))
    w = K.placeholder(shape=(24, 24))
    h = K.relu(a)
    s = h + K.dot(h, w)  # acc is an operand of the product
    t = K.sigmoid(a)
    u = t + K.dot(t, w)  # acc is also returned
    f = K.function([a, w], [s, t, u])
    as_, ws = (
        rng.standard_normal((24, 24)).astype("float32"),
        rng.standard_normal((24, 24)).astype("float32"),
    )
    sv, tv, uv = f([as_, ws])
    h64 = np.maximum(as_.astype(np.float64), 0)
    t64 = 1 / (1 + np.exp(-as_.astype(np.float64)))
    close(sv, h64 + h64 @ ws)
    close(tv, t64)
    close(uv, t64 + t64 @ ws)


def test_transposed_operands_broadcasting_and_two_products(rng):
    a = K.placeholder(shape=(None, 12))
    g = K.placeholder(shape=(None, 20))
    c = K.placeholder(shape=(12, 20))
    row = K.placeholder(shape=(1, 20))
    r1 = K.square(c) + K.dot(K.transpose(a), g)  # aᵀ·g, a gradient-style product
    r2 = K.exp(row * 0.1) + K.dot(a, c)  # acc broadcasts over the rows
    r3 = K.dot(a, c) + K.dot(a, K.exp(c * 0.1))  # both operands are products
    r4 = K.abs(g) + K.dot(a, K.transpose(K.transpose(c)))
    f = K.function([a, g, c, row], [r1, r2, r3, r4])
    as_ = rng.standard_normal((9, 12)).astype("float32")
    gs = rng.standard_normal((9, 20)).astype("float32")
    cs = rng.standard_normal((12, 20)).astype("float32")
    rows = rng.standard_normal((1, 20)).astype("float32")
    v1, v2, v3, v4 = f([as_, gs, cs, rows])
    a64, c64 = as_.astype(np.float64), cs.astype(np.float64)
    close(v1, c64**2 + a64.T @ gs)
    close(v2, np.exp(rows * 0.1) + a64 @ c64)
    close(v3, a64 @ c64 + a64 @ np.exp(c64 * 0.1))
    close(v4, np.abs(gs) + a64 @ c64)


def test_rnn_gradient_accumulators(rng):
    # K.rnn's VJP adds xᵀ·dz and hᵀ·dz into its gradient accumulators at every step.
    x = K.placeholder(shape=(4, 6, 3))
    w0 = rng.standard_normal((3, 5)).astype("float32") * 0.5
    u0 = rng.standard_normal((5, 5)).astype("float32") * 0.5
    w, u = K.variable(w0), K.variable(u0)

    def step(inp, states):
        h = K.tanh(K.dot(inp, w) + K.dot(states[0], u))
        return h, [h]

    _, outs, _ = K.rnn(step, x, [K.zeros((4, 5))])
    loss = K.sum(K.square(outs))
    gw, gu = K.gradients(loss, [w, u])
    f = K.function([x], [loss, gw, gu])
    xs = rng.standard_normal((4, 6, 3)).astype("float32")

    def numpy_loss(w_, u_):
        h = np.zeros((4, 5))
        total = 0.0
        for t in range(6):
            h = np.tanh(xs[:, t] @ w_ + h @ u_)
            total += np.sum(h * h)
        return total

    lv, gwv, guv = f([xs])
    close(lv, numpy_loss(w0.astype(np.float64), u0.astype(np.float64)))
    eps = 1e-6
    for got, base, which in ((gwv, w0, 0), (guv, u0, 1)):
        num = np.zeros(base.shape)
        for idx in np.ndindex(*base.shape):
            p, q = base.astype(np.float64).copy(), base.astype(np.float64).copy()
            p[idx] += eps
            q[idx] -= eps
            args = lambda z: (
                (z, u0.astype(np.float64)) if which == 0 else (w0.astype(np.float64), z)
            )
            num[idx] = (numpy_loss(*args(p)) - numpy_loss(*args(q))) / (2 * eps)
        np.testing.assert_allclose(got, num, rtol=1e-3, atol=1e-3)


def test_one_launch_for_product_and_add(rng):
    if not on_cpu():
        pytest.skip("launch counts are those of the CPU executor")
    a = K.placeholder(shape=(16, 8))
    b = K.placeholder(shape=(8, 16))
    x = K.placeholder(shape=(16, 16))
    f = K.function([a, b, x], [K.cumsum(x, axis=0) + K.dot(a, b)])
    f(
        [
            rng.standard_normal((16, 8)).astype("float32"),
            rng.standard_normal((8, 16)).astype("float32"),
            rng.standard_normal((16, 16)).astype("float32"),
        ]
    )
    assert f.dispatches == 2, f.dispatches  # cumsum, then the product added into its buffer
