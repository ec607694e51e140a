"""rnn, map_fn, foldl and foldr against explicit NumPy loops; gradients by finite differences.

The references are plain Python loops over time written with NumPy (STYLE 9).
"""

import itertools
import os

import numpy as np
import pytest
from env_child import env_is, pytest_in_child
from ferrokeras import backend as K
from gradcheck import check_grad
from reference import np_rnn


def _k_rnn(x, h0, W, U, b, mask=None, go_backwards=False, unroll=False):
    def step(x_t, states):
        h = K.tanh(K.dot(x_t, W) + K.dot(states[0], U) + b)
        return h, [h]

    return K.rnn(step, x, [h0], go_backwards=go_backwards, mask=mask, unroll=unroll)


@pytest.fixture
def data(rng):
    B, T, D, H = 3, 7, 4, 5
    return dict(
        x=rng.normal(size=(B, T, D)),
        h0=rng.normal(size=(B, H)) * 0.1,
        W=rng.normal(size=(D, H)) * 0.4,
        U=rng.normal(size=(H, H)) * 0.4,
        b=rng.normal(size=(H,)) * 0.1,
        mask=(rng.uniform(size=(B, T)) > 0.3).astype("float64"),
    )


@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_rnn_matches_numpy_loop(data, unroll, go_backwards, masked):
    d = data
    x = K.placeholder(shape=(None,) + d["x"].shape[1:], dtype="float64")
    h0 = K.placeholder(shape=(None, d["h0"].shape[1]), dtype="float64")
    W, U, b = (K.variable(d[k], dtype="float64") for k in "WUb")
    m = K.placeholder(shape=(None, d["x"].shape[1]), dtype="float64") if masked else None
    last, outs, states = _k_rnn(x, h0, W, U, b, mask=m, go_backwards=go_backwards, unroll=unroll)
    ins = [x, h0] + ([m] if masked else [])
    feeds = [d["x"], d["h0"]] + ([d["mask"]] if masked else [])
    got = K.function(ins, [last, outs, states[0]])(feeds)
    want = np_rnn(
        d["x"], d["h0"], d["W"], d["U"], d["b"], d["mask"] if masked else None, go_backwards
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    assert K.int_shape(outs) == (None,) + d["x"].shape[1:2] + (d["h0"].shape[1],)


@pytest.mark.parametrize("unroll", [False, True])
def test_rnn_gradients(data, unroll):
    d = data

    def f(x, h0, W, U, b):
        _, outs, _ = _k_rnn(x, h0, W, U, b, unroll=unroll)
        return outs

    check_grad(f, [d["x"], d["h0"], d["W"], d["U"], d["b"]], eps=1e-5, rtol=1e-6, atol=1e-8)


def test_rnn_masked_gradients(data):
    d = data
    mask = K.constant(d["mask"], dtype="float64")

    def f(x, W, U):
        last, outs, states = _k_rnn(
            x,
            K.constant(d["h0"], dtype="float64"),
            W,
            U,
            K.constant(d["b"], dtype="float64"),
            mask=mask,
        )
        return outs + K.expand_dims(states[0], 1)

    check_grad(f, [d["x"], d["W"], d["U"]], eps=1e-5, rtol=1e-6, atol=1e-8)


def test_rnn_several_states_and_constants(rng):
    """An LSTM-like step with two states (h, c) and a constant bias."""
    B, T, D, H = 2, 5, 3, 4
    x = rng.normal(size=(B, T, D))
    W = rng.normal(size=(D, 4 * H)) * 0.3
    U = rng.normal(size=(H, 4 * H)) * 0.3
    bias = rng.normal(size=(4 * H,)) * 0.1

    def sig(v):
        return 1 / (1 + np.exp(-v))

    def np_lstm():
        h, c = np.zeros((B, H)), np.zeros((B, H))
        outs = []
        for t in range(T):
            z = x[:, t] @ W + h @ U + bias
            i, f, g, o = (
                sig(z[:, :H]),
                sig(z[:, H : 2 * H]),
                np.tanh(z[:, 2 * H : 3 * H]),
                sig(z[:, 3 * H :]),
            )
            c = f * c + i * g
            h = o * np.tanh(c)
            outs.append(h)
        return h, np.stack(outs, 1), c

    Wk, Uk = K.constant(W, dtype="float64"), K.constant(U, dtype="float64")

    def step(x_t, states):
        h, c, b = states
        z = K.dot(x_t, Wk) + K.dot(h, Uk) + b
        i, f, g, o = (
            K.sigmoid(z[:, :H]),
            K.sigmoid(z[:, H : 2 * H]),
            K.tanh(z[:, 2 * H : 3 * H]),
            K.sigmoid(z[:, 3 * H :]),
        )
        c2 = f * c + i * g
        h2 = o * K.tanh(c2)
        return h2, [h2, c2]

    z0 = K.constant(np.zeros((B, H)), dtype="float64")
    last, outs, (h, c) = K.rnn(
        step,
        K.constant(x, dtype="float64"),
        [z0, z0],
        constants=[K.constant(bias, dtype="float64")],
    )
    got = K.batch_get_value([last, outs, c])
    want = np_lstm()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_second_order_through_loop():
    """d2/dw2 of sum_t (w * x_t)^2 over a loop equals 2 * sum(x^2)."""
    xs = np.array([[[1.0], [2.0], [3.0]]])
    w = K.variable(0.7, dtype="float64")

    def step(x_t, states):
        s = states[0] + K.sum(K.square(w * x_t), axis=-1)
        return s, [s]

    _, _, (s,) = K.rnn(step, K.constant(xs, dtype="float64"), [K.constant([0.0], dtype="float64")])
    g = K.gradients(K.sum(s), [w])[0]
    gg = K.gradients(g, [w])[0]
    np.testing.assert_allclose(K.eval(g), 2 * 0.7 * 14.0, rtol=1e-12)
    np.testing.assert_allclose(K.eval(gg), 2 * 14.0, rtol=1e-12)


def test_map_fn_foldl_foldr(rng):
    v = rng.normal(size=(6, 3))
    x = K.constant(v, dtype="float64")
    np.testing.assert_allclose(
        K.eval(K.map_fn(lambda r: K.sum(r * r), x)), (v * v).sum(1), rtol=1e-12
    )
    np.testing.assert_allclose(
        K.eval(K.foldl(lambda a, r: a * 0.5 + r, x)), _np_fold(v, False), rtol=1e-12
    )
    np.testing.assert_allclose(
        K.eval(K.foldr(lambda a, r: a * 0.5 + r, x)), _np_fold(v, True), rtol=1e-12
    )
    init = K.constant(np.ones(3), dtype="float64")
    np.testing.assert_allclose(
        K.eval(K.foldl(lambda a, r: a + r, x, initializer=init)), 1 + v.sum(0), rtol=1e-12
    )
    assert K.eval(K.map_fn(lambda r: K.sum(r), x, dtype="float32")).dtype == np.float32


def _np_fold(v, reverse):
    rows = list(v[::-1]) if reverse else list(v)
    acc = rows[0]
    for r in rows[1:]:
        acc = acc * 0.5 + r
    return acc


def test_map_fn_and_fold_gradients(rng):
    check_grad(lambda x: K.map_fn(lambda r: K.sin(r) * r, x), [rng.normal(size=(4, 3))])
    check_grad(lambda x: K.foldl(lambda a, r: a * r, x), [rng.uniform(0.5, 1.5, size=(4, 3))])
    check_grad(lambda x: K.foldr(lambda a, r: K.tanh(a + r), x), [rng.normal(size=(4, 3))])


def test_rnn_bad_input(rng):
    x = K.constant(rng.normal(size=(2, 3, 4)))
    with pytest.raises(ValueError, match="at least 3D"):
        K.rnn(lambda a, s: (a, s), K.constant(np.ones((2, 3))), [])
    with pytest.raises(ValueError, match="shape"):
        # the state grows from 4 to 8 features: a shape change between steps
        K.rnn(lambda a, s: (a, [K.concatenate([s[0], s[0]])]), x, [K.zeros((2, 4))])
    with pytest.raises(ValueError, match="mask"):
        K.rnn(lambda a, s: (a, s), x, [K.zeros((2, 4))], mask=K.constant(np.ones((2, 5))))
    with pytest.raises(ValueError):
        K.rnn(lambda a, s: a, x, [K.zeros((2, 4))])


def test_long_sequence_graph_does_not_grow():
    """A 1000-step LSTM-sized loop compiles quickly: the body is traced once."""
    import time

    B, T, D, H = 2, 1000, 8, 16
    W = K.variable(np.full((D, 4 * H), 0.01))
    U = K.variable(np.full((H, 4 * H), 0.01))
    x = K.placeholder(shape=(None, T, D))

    def step(x_t, states):
        h, c = states
        z = K.dot(x_t, W) + K.dot(h, U)
        i, f, o, g = (
            K.sigmoid(z[:, :H]),
            K.sigmoid(z[:, H : 2 * H]),
            K.sigmoid(z[:, 2 * H : 3 * H]),
            K.tanh(z[:, 3 * H :]),
        )
        c2 = f * c + i * g
        h2 = o * K.tanh(c2)
        return h2, [h2, c2]

    h0 = K.zeros((B, H))
    t0 = time.perf_counter()
    last, outs, _ = K.rnn(step, x, [h0, h0])
    grads = K.gradients(K.sum(last), [W, U])
    f = K.function([x], [last] + grads)
    build = time.perf_counter() - t0
    out = f([np.ones((B, T, D), dtype="float32")])
    assert out[0].shape == (B, H) and np.all(np.isfinite(out[1]))
    # generous bound: the point is independence from T (an unrolled graph takes minutes)
    assert build < 5.0, build


# ---------------------------------------------------------------- loop rewrites
# src/ops/loop_opt.rs has the forward loop save the residuals its VJP reads;
# FERROKERAS_LOOP_OPT=0 turns that off. Both settings must give the plain loop's numbers,
# which the NumPy references above pin down. The core reads the variable once per process,
# so the tests below run in this process's setting, and the tests of the other setting in
# a child process.

SAVING = not env_is("FERROKERAS_LOOP_OPT", "0")
LSTM_CASES = list(itertools.product([False, True], repeat=3))


def _lstm_data(rng, B=3, T=6, D=4, H=5):
    return dict(
        x=rng.normal(size=(B, T, D)),
        h0=rng.normal(size=(B, H)) * 0.1,
        W=rng.normal(size=(D, 4 * H)) * 0.4,
        U=rng.normal(size=(H, 4 * H)) * 0.4,
        V=rng.normal(size=(D, 4 * H)) * 0.4,
        b=rng.normal(size=(4 * H,)) * 0.1,
        mask=(rng.uniform(size=(B, T)) > 0.3).astype("float64"),
    )


def _lstm_values(d, masked, go_backwards, state_dependent_matmul):
    """Outputs, final states and gradients of an LSTM-like K.rnn with a constant bias.

    With ``state_dependent_matmul`` the step also multiplies ``x_t * h[:, :D]`` by a
    matrix: a matmul of a step input that depends on the state, which must stay in the body.
    """
    H, D = d["h0"].shape[1], d["x"].shape[2]
    x = K.placeholder(shape=(None,) + d["x"].shape[1:], dtype="float64")
    h0 = K.placeholder(shape=(None, H), dtype="float64")
    W, U, V, b = (K.variable(d[k], dtype="float64") for k in "WUVb")
    m = K.constant(d["mask"], dtype="float64") if masked else None

    def step(x_t, states):
        h, c, bias = states
        z = K.dot(x_t, W) + K.dot(h, U) + bias
        if state_dependent_matmul:
            z = z + K.dot(x_t * h[:, :D], V)
        i, f, g, o = (
            K.sigmoid(z[:, :H]),
            K.sigmoid(z[:, H : 2 * H]),
            K.tanh(z[:, 2 * H : 3 * H]),
            K.sigmoid(z[:, 3 * H :]),
        )
        c2 = f * c + i * g
        h2 = o * K.tanh(c2)
        return h2, [h2, c2]

    last, outs, (h, c) = K.rnn(
        step, x, [h0, h0 * 0.5], constants=[b], mask=m, go_backwards=go_backwards
    )
    loss = K.sum(outs * outs) + K.sum(c) + K.sum(last)
    grads = K.gradients(loss, [x, h0, W, U, V, b] if state_dependent_matmul else [x, h0, W, U, b])
    return K.function([x, h0], [last, outs, h, c] + grads)([d["x"], d["h0"]])


def _all_lstm_values():
    """`_lstm_values` for every case of `LSTM_CASES`, on the same data."""
    d = _lstm_data(np.random.default_rng(20240521))
    return [_lstm_values(d, *case) for case in LSTM_CASES]


def test_loop_rewrites_match_the_plain_loop(tmp_path):
    """Saved residuals (this process) against the plain loop (a child process)."""
    if not SAVING:
        # The child: saves the plain loop's values for the parent to compare.
        values = [v for vals in _all_lstm_values() for v in vals]
        if "PLAIN_LOOP_RESULTS_FILE" in os.environ:
            np.savez(os.environ["PLAIN_LOOP_RESULTS_FILE"], *values)
        return
    plain = tmp_path / "plain.npz"
    pytest_in_child(
        {"FERROKERAS_LOOP_OPT": "0", "PLAIN_LOOP_RESULTS_FILE": str(plain)},
        f"{__file__}::test_loop_rewrites_match_the_plain_loop",
    )
    got = [v for vals in _all_lstm_values() for v in vals]
    with np.load(plain) as saved:
        want = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=f"value {i}")


def test_loop_rewrites_off():
    """The loop tests below, in a child process with FERROKERAS_LOOP_OPT=0."""
    if not SAVING:
        pytest.skip("this process runs with FERROKERAS_LOOP_OPT=0: the tests below do")
    pytest_in_child(
        {"FERROKERAS_LOOP_OPT": "0"},
        __file__,
        "-k",
        "test_loop_rewrites_gradients or test_second_order_through_a_loop_matmul"
        " or test_zero_length_loop_with_a_matmul",
    )


def test_loop_rewrites_gradients(rng):
    """Finite differences through saved residuals and a state matmul."""
    B, T, D, H = 2, 4, 3, 4

    def f(x, W, U):
        def step(x_t, states):
            z = K.dot(x_t, W) + K.dot(states[0], U)
            h = K.sigmoid(z[:, :H]) * K.tanh(z[:, H:])
            return h, [h]

        return K.rnn(step, x, [K.zeros((B, H), dtype="float64")])[1]

    check_grad(
        f,
        [
            rng.normal(size=(B, T, D)),
            rng.normal(size=(D, 2 * H)) * 0.5,
            rng.normal(size=(H, 2 * H)) * 0.5,
        ],
        eps=1e-5,
        rtol=1e-6,
        atol=1e-8,
    )


def test_second_order_through_a_loop_matmul():
    """d2/dw2 of sum_t tanh(x_t · w)^2, x_t · w a matmul in the loop body."""
    xs = np.array([[[1.0], [2.0], [3.0]]])
    w = K.variable(np.full((1, 1), 0.7), dtype="float64")

    def step(x_t, states):
        s = states[0] + K.sum(K.square(K.tanh(K.dot(x_t, w))), axis=-1)
        return s, [s]

    _, _, (s,) = K.rnn(step, K.constant(xs, dtype="float64"), [K.constant([0.0], dtype="float64")])
    g = K.gradients(K.sum(s), [w])[0]
    gg = K.gradients(K.sum(g), [w])[0]
    # f(w) = sum_t tanh(x_t w)^2: f' = sum 2 t x sech^2, f'' = sum 2 x^2 sech^2 (sech^2 - 2 t^2)
    t = np.tanh(xs.ravel() * 0.7)
    s2 = 1 - t * t
    np.testing.assert_allclose(K.eval(g).ravel(), [np.sum(2 * t * xs.ravel() * s2)], rtol=1e-12)
    np.testing.assert_allclose(
        K.eval(gg).ravel(), [np.sum(2 * xs.ravel() ** 2 * s2 * (s2 - 2 * t * t))], rtol=1e-10
    )


def test_zero_length_loop_with_a_matmul():
    W = K.variable(np.ones((3, 2)), dtype="float64")
    x = K.placeholder(shape=(None, 4, 3), dtype="float64")
    y = K.map_fn(lambda r: K.tanh(K.dot(r, W)), x)
    gW = K.gradients(K.sum(y), [W])[0]
    out, g = K.function([x], [y, gW])([np.zeros((0, 4, 3))])
    assert out.shape == (0, 4, 2)
    np.testing.assert_array_equal(g, np.zeros((3, 2)))


def test_keras_zero_initial_state_is_folded():
    """sum(zeros_like(x), axis=(1, 2)), Keras' zero initial state, needs no pass over x."""
    x = K.placeholder(shape=(None, 5, 3))
    z = K.sum(K.zeros_like(x), axis=(1, 2))
    assert K.int_shape(z) == (None,)
    np.testing.assert_array_equal(K.function([x], [z])([np.ones((4, 5, 3))])[0], np.zeros(4))
    c = K.sum(K.zeros_like(K.constant(np.ones((2, 5, 3)))), axis=1, keepdims=True)
    assert K.int_shape(c) == (2, 1, 3)
    np.testing.assert_array_equal(K.eval(c), np.zeros((2, 1, 3)))


def test_rnn_over_no_timesteps_says_so():
    x = K.placeholder((2, 0, 3))
    with pytest.raises(ValueError, match="no timesteps"):
        K.rnn(lambda i, s: (i + s[0], [s[0] + i]), x, [K.zeros((2, 3))])
