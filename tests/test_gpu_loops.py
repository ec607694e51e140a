"""Loops on the GPU: rnn, map_fn, foldl, foldr and their gradients recorded as GPU
dispatches into the call's one submit (`runtime::gpu::loops`), against NumPy loops and
the CPU device; a body that needs the host runs the whole loop on the CPU.

Step rows are windows of their sequences, and results are written straight into the rows
of their stacked results, where a row's byte offset is a multiple of the adapter's
`min_storage_buffer_offset_alignment` (at most 256 bytes): the tests run each loop with
rows of 256 bytes (every row a window) and with rows of an odd number of words (only
row 0 a window, the others copied by kernels).

Every test switches to a GPU explicitly (and back afterwards), as test_gpu.py does, so
the file runs the same in the cpu and the gpu pass of the suite. Without a GPU adapter
the tests are skipped, unless FERROKERAS_REQUIRE_GPU=1. With FERROKERAS_GPU_LOOPS=0 (the
last test runs the file so in a child process) every loop runs on the CPU inside the GPU
plan, with the same results.
"""

import json

import ferrokeras
import numpy as np
import pytest
from env_child import env_is, pytest_in_child
from ferrokeras import backend as K
from gradcheck import numeric_grad
from reference import np_rnn

TOL = dict(rtol=2e-4, atol=2e-5)
GPU_LOOPS = not env_is("FERROKERAS_GPU_LOOPS", "0")


def _host_spans(f, feeds, tmp):
    """The names of the nodes a call of `f` ran on the host (`ferrokeras.profile`)."""
    path = str(tmp / "trace.json")
    with ferrokeras.profile(path):
        out = f(feeds)
    with open(path) as fh:
        events = json.load(fh)
    events = events["traceEvents"] if isinstance(events, dict) else events
    return out, [e["name"] for e in events if e.get("cat") == "host"]


def _on_both(f, feeds, tmp=None):
    """`f(feeds)` on the GPU, asserting it ran in one submit with no node on the host
    (with `tmp`, a folder for a trace: no loop or loop result on the host, while shape
    vectors built outside the loop may be), then on the CPU, with the same results."""
    if not GPU_LOOPS:
        on_gpu = f(feeds)
        assert f._f.host_nodes > 0
    elif tmp is None:
        on_gpu = f(feeds)
        assert f._f.host_nodes == 0, f._f.host_nodes
        assert f._f.submits == 1, f._f.submits
    else:
        on_gpu, hosts = _host_spans(f, feeds, tmp)
        assert not [h for h in hosts if h == "loop" or h.startswith("result")], hosts
        assert f._f.host_nodes == len(hosts), (f._f.host_nodes, hosts)
        assert f._f.submits == 1, f._f.submits
    before = ferrokeras.device()
    ferrokeras.set_device("cpu")
    try:
        on_cpu = f(feeds)
    finally:
        ferrokeras.set_device(before)
    for a, b in zip(on_gpu, on_cpu):
        np.testing.assert_allclose(a, b, **TOL)
    return on_gpu


def _lstm_weights(rng, D, H):
    """An LSTM's input and recurrent kernels and bias, as float32 variables."""
    return (
        K.variable((rng.normal(size=(D, 4 * H)) * 0.4).astype("float32")),
        K.variable((rng.normal(size=(H, 4 * H)) * 0.4).astype("float32")),
        K.variable((rng.normal(size=(4 * H,)) * 0.1).astype("float32")),
    )


def _lstm_cell(z, c, H):
    """Keras' LSTM cell on the fused gate pre-activations `z` ([B, 4H], gates i, f, g, o)
    and the cell state `c`: the next hidden and cell states."""
    i, f, g, o = (
        K.sigmoid(z[:, :H]),
        K.sigmoid(z[:, H : 2 * H]),
        K.tanh(z[:, 2 * H : 3 * H]),
        K.sigmoid(z[:, 3 * H :]),
    )
    c2 = f * c + i * g
    return o * K.tanh(c2), c2


def _np_rnn_loss(x, h0, W, U, b, mask, go_backwards):
    last, outs, h = np_rnn(x, h0, W, U, b, mask, go_backwards)
    return (outs * outs).sum() + h.sum() + last.sum()


# (batch, features, units): rows of 12 and 15 words (copied but for row 0), and of 64
# words, 256 bytes (windows).
RNN_SHAPES = [(3, 4, 5), (4, 16, 16)]


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shape", RNN_SHAPES)
def test_rnn_runs_on_the_gpu(gpu, rng, tmp_path, masked, go_backwards, shape):
    B, D, H = shape
    W0 = (rng.normal(size=(D, H)) * 0.4).astype("float32")
    U0 = (rng.normal(size=(H, H)) * 0.4).astype("float32")
    b0 = (rng.normal(size=(H,)) * 0.1).astype("float32")
    x = K.placeholder(shape=(None, None, D))
    h0 = K.placeholder(shape=(None, H))
    m = K.placeholder(shape=(None, None)) if masked else None
    W, U = K.variable(W0), K.variable(U0)
    b = K.constant(b0)

    def step(x_t, states):
        h, bias = states[0], states[1]
        h2 = K.tanh(K.dot(x_t, W) + K.dot(h, U) + bias)
        return h2, [h2]

    last, outs, (h,) = K.rnn(
        step, x, [h0], mask=m, go_backwards=go_backwards, constants=[b], unroll=False
    )
    loss = K.sum(outs * outs) + K.sum(h) + K.sum(last)
    grads = K.gradients(loss, [x, h0, W, U])
    ins = [x, h0] + ([m] if masked else [])
    f = K.function(ins, [last, outs, h] + grads)
    # The trip count is the fed sequence's length, so one function serves several.
    for T in (7, 3):
        xv = rng.normal(size=(B, T, D)).astype("float32")
        hv = (rng.normal(size=(B, H)) * 0.1).astype("float32")
        mv = (rng.uniform(size=(B, T)) > 0.3).astype("float32") if masked else None
        out = _on_both(f, [xv, hv] + ([mv] if masked else []), tmp_path if masked else None)
        x64, h64, W64, U64, b64 = (a.astype("float64") for a in (xv, hv, W0, U0, b0))
        ref = np_rnn(x64, h64, W64, U64, b64, mv, go_backwards)
        for a, r in zip(out[:3], ref):
            np.testing.assert_allclose(a, r, **TOL)
        gW = numeric_grad(
            lambda a: _np_rnn_loss(x64, h64, a[0], U64, b64, mv, go_backwards), [W64], 0, 1e-6
        )
        gU = numeric_grad(
            lambda a: _np_rnn_loss(x64, h64, W64, a[0], b64, mv, go_backwards), [U64], 0, 1e-6
        )
        np.testing.assert_allclose(out[5], gW, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(out[6], gU, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("shape", [(4, 3, 5), (4, 16, 16)])
def test_lstm_like_step_with_slices_runs_on_the_gpu(gpu, rng, shape):
    # The step of a Keras LSTM: one matmul per input, the four gates sliced out of it,
    # two states, a bias constant; outputs and every gradient as on the CPU. The cell
    # state's next value reads the cell state: with rows of 256 bytes its kernel reads
    # one row of the cell state's history and is to write the next.
    B, D, H = shape
    T = 6
    x = K.placeholder(shape=(None, None, D))
    W, U, b = _lstm_weights(rng, D, H)

    def step(x_t, states):
        h, c, bias = states
        h2, c2 = _lstm_cell(K.dot(x_t, W) + K.dot(h, U) + bias, c, H)
        return h2, [h2, c2]

    zeros = K.zeros_like(x[:, 0, :1]) * K.zeros((1, H))
    last, outs, (h, c) = K.rnn(step, x, [zeros, zeros], constants=[b])
    loss = K.sum(outs * outs) + K.sum(c) + K.sum(last)
    f = K.function([x], [last, outs, h, c] + K.gradients(loss, [x, W, U, b]))
    xv = rng.normal(size=(B, T, D)).astype("float32")
    _on_both(f, [xv])


@pytest.mark.parametrize("n", [3, 64])
def test_map_fn_foldl_foldr_run_on_the_gpu(gpu, rng, n):
    x = K.placeholder(shape=(None, n))
    ys = [
        K.map_fn(lambda r: K.sin(r) * r, x),
        K.foldl(lambda a, r: a * 0.5 + r, x),
        K.foldr(lambda a, r: K.tanh(a + r), x),
        K.foldl(lambda a, r: a + r, x, initializer=K.ones((n,))),
    ]
    grads = [K.gradients(K.sum(y), [x])[0] for y in ys]
    f = K.function([x], ys + grads)
    v = rng.normal(size=(5, n)).astype("float32")
    out = _on_both(f, [v])
    v64 = v.astype("float64")
    fl, fr = v64[0], v64[-1]
    for r in v64[1:]:
        fl = fl * 0.5 + r
    for r in v64[-2::-1]:
        fr = np.tanh(fr + r)
    np.testing.assert_allclose(out[0], np.sin(v64) * v64, **TOL)
    np.testing.assert_allclose(out[1], fl, **TOL)
    np.testing.assert_allclose(out[2], fr, **TOL)
    np.testing.assert_allclose(out[3], 1 + v64.sum(0), **TOL)
    np.testing.assert_allclose(out[4], np.cos(v64) * v64 + np.sin(v64), **TOL)
    np.testing.assert_allclose(
        out[5], 0.5 ** np.arange(4, -1, -1)[:, None] * np.ones((5, n)), **TOL
    )
    np.testing.assert_allclose(out[7], np.ones((5, n)), **TOL)

    def fold_r(w):
        a = w[-1]
        for r in w[-2::-1]:
            a = np.tanh(a + r)
        return a.sum()

    np.testing.assert_allclose(
        out[6], numeric_grad(lambda a: fold_r(a[0]), [v64], 0, 1e-6), rtol=1e-3, atol=1e-4
    )


@pytest.mark.parametrize("inner", [(), (64,)])
def test_nested_loops_run_on_the_gpu(gpu, rng, inner):
    # A fold inside a map: the inner loop is recorded inside each step of the outer one.
    # With rows of 64 words the inner loop's rows are windows of the outer loop's rows.
    x = K.placeholder(shape=(None, None) + inner)
    y = K.map_fn(lambda row: K.foldl(lambda a, v: a * 0.5 + K.square(v), row), x)
    g = K.gradients(K.sum(y), [x])[0]
    f = K.function([x], [y, g])
    v = rng.normal(size=(4, 6) + inner).astype("float32")
    y_gpu, g_gpu = _on_both(f, [v])
    v64 = v.astype("float64")
    ref = v64[:, 0]
    for k in range(1, v64.shape[1]):
        ref = ref * 0.5 + v64[:, k] ** 2
    np.testing.assert_allclose(y_gpu, ref, **TOL)
    weights = np.array(
        [0.5 ** (v64.shape[1] - 1)] + [0.5 ** (v64.shape[1] - 1 - k) for k in range(1, 6)]
    ).reshape((1, 6) + (1,) * len(inner))
    first = (np.arange(6) == 0).reshape((1, 6) + (1,) * len(inner))
    dref = np.where(first, weights, weights * 2 * v64)
    np.testing.assert_allclose(g_gpu, dref, **TOL)


def _rnn_function(D, H, rng):
    """A tanh RNN over `x` (batch, time, D) with its loss gradients, and its weights."""
    W0 = (rng.normal(size=(D, H)) * 0.4).astype("float32")
    U0 = (rng.normal(size=(H, H)) * 0.4).astype("float32")
    x = K.placeholder(shape=(None, None, D))
    h0 = K.placeholder(shape=(None, H))
    W, U = K.variable(W0), K.variable(U0)

    def step(x_t, states):
        h2 = K.tanh(K.dot(x_t, W) + K.dot(states[0], U))
        return h2, [h2]

    last, outs, (h,) = K.rnn(step, x, [h0])
    loss = K.sum(outs * outs) + K.sum(h)
    f = K.function([x, h0], [outs, h] + K.gradients(loss, [x, W, U]))
    return f, W0, U0


def test_rows_in_place_save_the_copy_kernels(gpu, rng):
    # Per step, the forward loop reads one row of x and writes a row of the outputs and
    # of the state history; the VJP reads rows of its residuals and writes a row of dx.
    # With rows of 256 bytes those are windows; with rows of an odd number of words
    # each is a copy kernel (but for row 0): at least two dispatches more per step.
    if not GPU_LOOPS:
        pytest.skip("loops run on the CPU with FERROKERAS_GPU_LOOPS=0")
    per_step = {}
    for B, D, H in [(4, 16, 16), (3, 5, 7)]:
        f, W0, U0 = _rnn_function(D, H, rng)
        counts = []
        for T in (4, 8):
            xv = rng.normal(size=(B, T, D)).astype("float32")
            hv = (rng.normal(size=(B, H)) * 0.1).astype("float32")
            out = _on_both(f, [xv, hv])
            x64, h64 = xv.astype("float64"), hv.astype("float64")
            ref = np_rnn(x64, h64, W0.astype("float64"), U0.astype("float64"), 0.0)
            np.testing.assert_allclose(out[0], ref[1], **TOL)
            np.testing.assert_allclose(out[1], ref[2], **TOL)
            f([xv, hv])
            counts.append(f._f.dispatches)
        per_step[B] = (counts[1] - counts[0]) / 4
    assert per_step[3] >= per_step[4] + 2, per_step


def test_a_state_kept_on_the_device_from_a_row(gpu, rng):
    # The final state of an rnn can be a row of a stacked result: assigned to a variable,
    # it stays on the device as that row and reads back as the CPU's.
    B, D, H = 4, 16, 16
    x = K.placeholder(shape=(None, None, D))
    U = K.variable((rng.normal(size=(H, H)) * 0.4).astype("float32"))
    keep = K.variable(np.zeros((B, H), "float32"))

    def step(x_t, states):
        h2 = K.tanh(x_t + K.dot(states[0], U))
        return h2, [h2]

    last, outs, (h,) = K.rnn(step, x, [keep])
    g = K.function([x], [outs], updates=[K.update(keep, h)])
    xv = rng.normal(size=(B, 5, D)).astype("float32")
    on_gpu = [g([xv])[0], K.get_value(keep)]
    on_gpu.append(g([xv])[0])
    K.set_value(keep, np.zeros((B, H), "float32"))
    before = ferrokeras.device()
    ferrokeras.set_device("cpu")
    try:
        on_cpu = [g([xv])[0], K.get_value(keep), g([xv])[0]]
    finally:
        ferrokeras.set_device(before)
    for a, b in zip(on_gpu, on_cpu):
        np.testing.assert_allclose(a, b, **TOL)


def test_zero_length_sequences_on_the_gpu(gpu, rng):
    x = K.placeholder(shape=(None, 3))
    W = K.variable(rng.normal(size=(3, 4)).astype("float32"))
    y = K.map_fn(lambda r: K.tanh(K.dot(K.expand_dims(r, 0), W))[0], x)
    s = K.foldl(lambda a, r: a + r, x, initializer=K.ones((3,)))
    f = K.function([x], [y, s, K.gradients(K.sum(y) + K.sum(s), [W])[0]])
    empty = np.zeros((0, 3), "float32")
    out = f([empty])
    assert out[0].shape[0] == 0
    np.testing.assert_allclose(out[1], np.ones(3))
    np.testing.assert_allclose(out[2], np.zeros((3, 4)))
    v = rng.normal(size=(5, 3)).astype("float32")
    y5, s5, _ = _on_both(f, [v])
    np.testing.assert_allclose(y5, np.tanh(v.astype("float64") @ K.get_value(W)), **TOL)
    np.testing.assert_allclose(s5, 1 + v.astype("float64").sum(0), **TOL)


def test_a_body_with_a_py_function_runs_on_the_cpu(gpu, rng):
    # A callback in the body needs the host at every step: the loop runs on the CPU
    # inside the GPU plan, with the same results.
    x = K.placeholder(shape=(None, 3))

    def body(r):
        sq = K.py_function(lambda a: np.square(np.asarray(a)), [r], "float32")
        return K.reshape(sq, (3,)) + K.sin(r)

    y = K.map_fn(body, x)
    f = K.function([x], [y])
    v = rng.normal(size=(4, 3)).astype("float32")
    out = f([v])[0]
    assert f._f.host_nodes > 0
    np.testing.assert_allclose(out, v.astype("float64") ** 2 + np.sin(v), **TOL)
    ferrokeras.set_device("cpu")
    np.testing.assert_allclose(out, f([v])[0], **TOL)


def test_loops_stay_on_the_cpu_with_gpu_loops_off(gpu):
    pytest_in_child({"FERROKERAS_GPU_LOOPS": "0"}, __file__, "-k", "not with_gpu_loops_off")


def test_a_loop_holding_much_memory_submits_its_steps(gpu, rng):
    # Buffers return to the pool only after a submit: a loop whose recorded steps hold
    # more new bytes than the pool keeps idle submits them and goes on.
    from ferrokeras import _core

    before = _core.gpu_pool_stats()["max_idle_bytes"]
    x = K.placeholder(shape=(None, 64, 64))
    f = K.function([x], [K.foldl(lambda a, r: K.tanh(a * 0.5 + r), x)])
    v = rng.normal(size=(48, 64, 64)).astype("float32")
    _core.gpu_pool_limits(256 << 10, None)
    try:
        out = f([v])[0]
        submits = f._f.submits
    finally:
        _core.gpu_pool_limits(before, None)
    if GPU_LOOPS:
        assert submits > 2, submits
    ref = v[0].astype("float64")
    for r in v[1:]:
        ref = np.tanh(ref * 0.5 + r)
    np.testing.assert_allclose(out, ref, **TOL)


def test_lstm_step_dispatches_per_time_step(gpu, rng):
    # Per time step of a Keras LSTM cell (rows of 256 bytes: every row a window), the
    # forward body records its two products (the bias and the sum in the second's
    # epilogue), the cell kernel reading the four gates from the product's buffer and the
    # cell state from its history's row, and the hidden state's second row; the VJP,
    # specialised to its shapes after its first step, the cell's gradient kernel (writing
    # the four gate gradients into the concatenation's buffer), the bias gradient and
    # three products: at most the 4 + 8 launches of the CPU's specialised bodies.
    if not GPU_LOOPS:
        pytest.skip("loops run on the CPU with FERROKERAS_GPU_LOOPS=0")
    B, D, H = 4, 16, 16
    x = K.placeholder(shape=(None, None, D))
    W, U, b = _lstm_weights(rng, D, H)

    def step(x_t, states):
        h, c = states
        h2, c2 = _lstm_cell(K.bias_add(K.dot(x_t, W) + K.dot(h, U), b), c, H)
        return h2, [h2, c2]

    zeros = K.zeros_like(x[:, 0, :1]) * K.zeros((1, H))
    last, outs, _ = K.rnn(step, x, [zeros, zeros])
    loss = K.sum(outs * outs) + K.sum(last)
    f = K.function([x], [last] + K.gradients(loss, [W, U, b]))
    counts = []
    for T in (4, 8):
        xv = rng.normal(size=(B, T, D)).astype("float32")
        _on_both(f, [xv])
        f([xv])
        counts.append(f._f.dispatches)
    per_step = (counts[1] - counts[0]) / 4
    assert per_step <= 12, (per_step, counts)
