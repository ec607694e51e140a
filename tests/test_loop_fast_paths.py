"""The fast paths the Keras LSTM step takes, against NumPy and the plain (unrolled) graph:

- `slice` copies a row at a time (awkward shapes, steps, dtypes, empty results);
- slice gradients that tile an axis are summed as one concatenation (and those that do not
  tile it, with gaps or overlaps, still add up right, to second order);
- a loop body runs specialised to its feed shapes after the first step (`shape` folded,
  `sum_to` to the same shape dropped); a new batch size makes a new specialisation;
- a loop VJP builds no gradient for inputs nothing asks for.
"""

import numpy as np
import pytest
from env_child import env_is, pytest_in_child
from ferrokeras import backend as K
from gradcheck import check_grad

SLICES = [
    ((5, 7), np.s_[:, 2:5]),
    ((5, 7), np.s_[1:4, ::2]),
    ((5, 7), np.s_[::-1, 3:]),
    ((4, 3, 6), np.s_[:, 1:2, 1:6]),
    ((4, 3, 6), np.s_[1:3, :, ::-2]),
    ((4, 3, 1), np.s_[:, 1:, :]),
    ((3, 8), np.s_[:, 4:4]),
    ((9,), np.s_[2:7]),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bool"])
@pytest.mark.parametrize("shape, index", SLICES)
def test_slice_matches_numpy(rng, shape, index, dtype):
    a = rng.normal(size=shape) * 5
    a = (a > 0) if dtype == "bool" else a.astype(dtype)
    x = K.placeholder(shape=shape, dtype=dtype)
    got = K.function([x], [x[index]])([a])[0]
    np.testing.assert_array_equal(got, a[index])


def _grad_of_slices(z_val, pieces, axis):
    """d/dz of sum_k sum(P_k * sin(z[piece_k])): its NumPy value and ferrokeras'."""
    z = K.placeholder(shape=z_val.shape, dtype="float64")
    rng = np.random.default_rng(1)
    want = np.zeros_like(z_val)
    loss = 0
    for lo, hi in pieces:
        idx = [slice(None)] * z_val.ndim
        idx[axis] = slice(lo, hi)
        idx = tuple(idx)
        p = rng.uniform(0.5, 1.5, size=z_val[idx].shape)
        loss = loss + K.sum(K.sin(z[idx]) * K.constant(p, dtype="float64"))
        want[idx] += p * np.cos(z_val[idx])
    g = K.gradients(loss, [z])[0]
    return K.function([z], [g])([z_val])[0], want


@pytest.mark.parametrize(
    "pieces, axis",
    [
        ([(0, 3), (3, 7), (7, 9)], 1),  # tiles axis 1: one concatenation
        ([(7, 9), (0, 3), (3, 7)], 1),  # the same, built in another order
        ([(0, 2), (2, 5)], 0),  # tiles axis 0
        ([(0, 3), (5, 9)], 1),  # a gap: zeros there
        ([(0, 5), (3, 9)], 1),  # an overlap: both pieces add there
        ([(0, 9)], 1),  # one piece
    ],
)
def test_gradient_of_slices_matches_numpy(rng, pieces, axis):
    z = rng.normal(size=(5, 9))
    got, want = _grad_of_slices(z, pieces, axis)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_second_order_through_tiled_slice_gradients(rng):
    """Finite differences of a gradient whose slice gradients became a concatenation."""

    def f(z):
        loss = (
            K.sum(K.sin(z[:, :2]) * z[:, :2]) + K.sum(K.exp(z[:, 2:5]) * 0.5) + K.sum(z[:, 5:] ** 3)
        )
        return K.gradients(loss, [z])[0]

    check_grad(f, [rng.normal(size=(3, 7))], eps=1e-5, rtol=1e-6, atol=1e-8)


def _lstm(x, h0, W, U, b, unroll):
    H = h0.shape[-1]

    def step(x_t, states):
        h, c = states
        z = K.dot(x_t, W) + K.dot(h, U) + b
        i, f, g, o = (
            K.sigmoid(z[:, :H]),
            K.sigmoid(z[:, H : 2 * H]),
            K.tanh(z[:, 2 * H : 3 * H]),
            K.sigmoid(z[:, 3 * H :]),
        )
        c2 = f * c + i * g
        h2 = o * K.tanh(c2)
        return h2, [h2, c2]

    # `b` is (1, 4H): its gradient is a `sum_to` over the batch, a no-op only at batch 1.
    return K.rnn(step, x, [h0 * 0.0 + h0, h0 * 0.5], unroll=unroll)


def _lstm_inputs(rng, T, D, H):
    """Weights (W, U, b) of an H-unit LSTM cell over D features, float64, and
    placeholders for a [batch, T, D] sequence and a [batch, H] initial state."""
    W = K.variable(rng.normal(size=(D, 4 * H)) * 0.5, dtype="float64")
    U = K.variable(rng.normal(size=(H, 4 * H)) * 0.5, dtype="float64")
    b = K.variable(rng.normal(size=(1, 4 * H)) * 0.1, dtype="float64")
    x = K.placeholder(shape=(None, T, D), dtype="float64")
    h0 = K.placeholder(shape=(None, H), dtype="float64")
    return W, U, b, x, h0


def test_loop_specialised_per_batch_size(rng):
    """Batch 1 (where the bias' `sum_to` is the identity), then 3, then 1 again, then 2:
    loop and unrolled graph agree on values and gradients each time."""
    T, D, H = 4, 3, 2
    W, U, b, x, h0 = _lstm_inputs(rng, T, D, H)
    fns = {}
    for unroll in (False, True):
        last, outs, (h, c) = _lstm(x, h0, W, U, b, unroll)
        loss = K.sum(outs * outs) + K.sum(c) + K.sum(last)
        fns[unroll] = K.function([x, h0], [outs, c] + K.gradients(loss, [x, h0, W, U, b]))
    for batch in (1, 3, 1, 2):
        feeds = [rng.normal(size=(batch, T, D)), rng.normal(size=(batch, H))]
        got, want = fns[False](feeds), fns[True](feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_loop_gradient_of_some_inputs(rng):
    """Asking for the weights' gradients alone (no gradient of the sequence, as in Keras
    training) gives the same values as asking for all of them."""
    T, D, H = 5, 3, 2
    W, U, b, x, h0 = _lstm_inputs(rng, T, D, H)
    last, outs, _ = _lstm(x, h0, W, U, b, unroll=False)
    loss = K.sum(last * last)
    feeds = [rng.normal(size=(2, T, D)), rng.normal(size=(2, H))]
    some = K.function([x, h0], K.gradients(loss, [W, U, b]))(feeds)
    every = K.function([x, h0], K.gradients(loss, [x, h0, W, U, b]))(feeds)
    for g, w in zip(some, every[2:]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_shapes_made_from_data_inside_a_body_are_not_folded():
    """A body whose reshape takes its shape from step data has different shapes at every
    step: it must not run specialised to the first step's shapes."""
    ks = np.array([1.0, 2.0, 4.0, 2.0, 1.0], dtype="float32")
    x = K.placeholder(shape=(1, 5, 1))

    def step(inp, states):
        k = K.cast(inp[0, 0], "int32")
        v = K.reshape(K.ones((4,)), K.stack([k, -1]))
        rows = K.cast(K.shape(v)[0], "float32")
        return K.reshape(rows, (1, 1)), [states[0] + rows]

    last, outs, states = K.rnn(step, x, [K.zeros((1, 1))])
    f = K.function([x], [outs, states[0]])
    got_outs, got_state = f([ks.reshape(1, 5, 1)])
    np.testing.assert_array_equal(got_outs.reshape(-1), ks)
    np.testing.assert_array_equal(got_state, [[ks.sum()]])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_loop_kernels_split_with_the_helper_thread(rng, dtype):
    """Inside a loop, products of 128k multiply-adds and more and costly fused groups run in
    two halves, one on a helper thread (by rows, or by columns when there are few rows), and
    so do the copies of slices and concatenations of 8192 elements and more, and the copies
    of a step's results into the stacked results (outputs and saved residuals) once they
    reach 32 KiB: the loop agrees with the unrolled graph, whose steps run whole."""
    T, D, H, batch = 3, 32, 64, 160
    W = K.variable(rng.normal(size=(D, 4 * H)) * 0.2, dtype=dtype)
    U = K.variable(rng.normal(size=(H, 4 * H)) * 0.2, dtype=dtype)
    V = K.variable(rng.normal(size=(H, 24)) * 0.2, dtype=dtype)
    Q = K.variable(rng.normal(size=(16, H)) * 0.2, dtype=dtype)
    x = K.placeholder(shape=(None, T, D), dtype=dtype)
    h0 = K.placeholder(shape=(None, H), dtype=dtype)

    def step(x_t, states):
        h, c = states
        z = K.dot(x_t, W) + K.dot(h, U)
        i, f, g, o = (
            K.sigmoid(z[:, :H]),
            K.sigmoid(z[:, H : 2 * H]),
            K.tanh(z[:, 2 * H : 3 * H]),
            K.sigmoid(z[:, 3 * H :]),
        )
        c2 = f * c + i * g
        h2 = o * K.tanh(c2)
        # [16, 4H]: few rows, split by columns; [batch, 24] and the rest: by rows.
        few = K.sum(K.dot(Q * K.mean(h2), U)) * 0.01
        return K.dot(h2, V) + few, [h2, c2]

    fns = {}
    for unroll in (False, True):
        last, outs, (h, c) = K.rnn(step, x, [h0, h0 * 0.5], unroll=unroll)
        loss = K.sum(outs * outs) + K.sum(K.tanh(c))
        fns[unroll] = K.function([x, h0], [outs, c] + K.gradients(loss, [W, U, V, Q, h0]))
    feeds = [
        rng.normal(size=(batch, T, D)).astype(dtype),
        rng.normal(size=(batch, H)).astype(dtype),
    ]
    tol = dict(rtol=2e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-11, atol=1e-12)
    for _ in range(3):
        got, want = fns[False](feeds), fns[True](feeds)
        for gv, wv in zip(got, want):
            np.testing.assert_allclose(gv, wv, **tol)


def test_loops_specialise_on_the_values_of_captured_shape_vectors():
    """A body reshaping by a shape vector made outside the loop from data: runs are
    specialised per value of that vector (it is fixed within a run), so a new value gives
    new shapes, not the folded ones of the last run."""
    x = K.placeholder(shape=(1, 3, 4))
    k = K.placeholder(shape=(), dtype="int32")
    target = K.stack([k, -1])

    def step(inp, states):
        v = K.reshape(inp, target)
        rows = K.cast(K.shape(v)[0], "float32")
        return K.reshape(rows, (1, 1)), [states[0] + K.sum(v)]

    last, outs, states = K.rnn(step, x, [K.zeros((1, 1))])
    f = K.function([x, k], [outs, states[0]])
    xv = np.arange(12, dtype="float32").reshape(1, 3, 4)
    for kv in (1, 2, 4, 2, 1):
        got_outs, got_state = f([xv, np.array(kv, dtype="int32")])
        np.testing.assert_array_equal(got_outs.reshape(-1), [kv] * 3)
        np.testing.assert_array_equal(got_state, [[xv.sum()]])


def test_gradient_through_shapes_that_change_every_step():
    """A body whose intermediate shape changes every step (a reshape by step data): with
    the forward cell recomputed in the VJP (`FERROKERAS_LOOP_OPT=0`, read once per process:
    in a child process; saved residuals must keep one shape and are refused with an
    error), neither loop may run specialised to one step's shapes; the gradient is 2x."""
    if not env_is("FERROKERAS_LOOP_OPT", "0"):
        pytest_in_child(
            {"FERROKERAS_LOOP_OPT": "0"},
            f"{__file__}::test_gradient_through_shapes_that_change_every_step",
        )
        return
    ks = np.array([1.0, 2.0, 4.0, 2.0], dtype="float32")
    x = K.placeholder(shape=(1, 4, 5))

    def step(inp, states):
        k = K.cast(inp[0, 0], "int32")
        v = K.reshape(inp[:, 1:], K.stack([k, -1]))
        return K.reshape(K.sum(v * v), (1, 1)), [states[0] + K.sum(v * v)]

    last, outs, states = K.rnn(step, x, [K.zeros((1, 1))])
    f = K.function([x], [states[0]] + K.gradients(K.sum(states[0]), [x]))
    xv = np.random.default_rng(0).normal(size=(1, 4, 5)).astype("float32")
    xv[0, :, 0] = ks
    for _ in range(2):
        total, grad = f([xv])
        np.testing.assert_allclose(total, [[(xv[0, :, 1:] ** 2).sum()]], rtol=1e-5)
        want = 2 * xv
        want[0, :, 0] = 0.0
        np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)
