"""In-place variable updates: on the CPU a training step writes the new values
of the variables it assigns into the variables' own buffers, where nothing can fail after
the write; the results are those of NumPy's update rules, outputs still see the values
from before the call, and readers on other threads never see a half-written variable.
"""

import threading

import ferrokeras
import numpy as np
import pytest
from ferrokeras import backend as K


@pytest.fixture
def on_cpu():
    """The in-place path is the CPU executor's; on a GPU the variables live on the device."""
    before = ferrokeras.device()
    ferrokeras.set_device("cpu")
    yield
    ferrokeras.set_device(before)


def _address(v):
    return v._var.host_address()


def _dense_problem(rng):
    x = K.placeholder(shape=(None, 12))
    y = K.placeholder(shape=(None, 5))
    w = K.variable(rng.normal(size=(12, 5)).astype(np.float32))
    b = K.variable(np.zeros(5, np.float32))
    loss = K.mean(K.square(K.dot(x, w) + b - y))
    xs = rng.normal(size=(8, 12)).astype(np.float32)
    ys = rng.normal(size=(8, 5)).astype(np.float32)
    return x, y, [w, b], loss, xs, ys


def _numpy_grads(params, xs, ys):
    w, b = params
    r = xs @ w + b - ys
    g = 2.0 * r / r.size
    return [xs.T @ g, g.sum(axis=0)]


# As Keras 2.3.1's optimizers build them: all gradients first, then per parameter its
# slot updates and its own.
def _rmsprop(params, grads, lr=0.01, rho=0.9, eps=1e-7):
    accs = [K.variable(np.zeros(K.int_shape(p), np.float32)) for p in params]
    ups = []
    for p, g, a in zip(params, grads, accs):
        a_new = rho * a + (1.0 - rho) * K.square(g)
        ups += [(a, a_new), (p, p - lr * g / (K.sqrt(a_new) + eps))]
    return accs, ups


def _rmsprop_numpy(ps, gs, accs, lr=0.01, rho=0.9, eps=1e-7):
    accs = [rho * a + (1.0 - rho) * g * g for a, g in zip(accs, gs)]
    ps = [p - lr * g / (np.sqrt(a) + eps) for p, g, a in zip(ps, gs, accs)]
    return ps, accs


def _adam(params, grads, lr=0.01, b1=0.9, b2=0.999, eps=1e-7):
    it = K.variable(0, dtype="int64")
    t = K.cast(it, "float32") + 1.0
    lr_t = lr * K.sqrt(1.0 - K.pow(b2, t)) / (1.0 - K.pow(b1, t))
    ms = [K.variable(np.zeros(K.int_shape(p), np.float32)) for p in params]
    vs = [K.variable(np.zeros(K.int_shape(p), np.float32)) for p in params]
    ups = [K.update_add(it, 1)]
    for p, g, m, v in zip(params, grads, ms, vs):
        m_t = b1 * m + (1.0 - b1) * g
        v_t = b2 * v + (1.0 - b2) * K.square(g)
        ups += [(m, m_t), (v, v_t), (p, p - lr_t * m_t / (K.sqrt(v_t) + eps))]
    return ms + vs, ups


def _adam_numpy(ps, gs, slots, step, lr=0.01, b1=0.9, b2=0.999, eps=1e-7):
    n = len(ps)
    ms, vs = slots[:n], slots[n:]
    lr_t = lr * np.sqrt(1.0 - b2**step) / (1.0 - b1**step)
    ms = [b1 * m + (1.0 - b1) * g for m, g in zip(ms, gs)]
    vs = [b2 * v + (1.0 - b2) * g * g for v, g in zip(vs, gs)]
    ps = [p - lr_t * m / (np.sqrt(v) + eps) for p, m, v in zip(ps, ms, vs)]
    return ps, ms + vs


@pytest.mark.parametrize("rule", ["rmsprop", "adam"])
def test_training_steps_update_every_variable_in_its_own_buffer(on_cpu, rng, rule):
    x, y, params, loss, xs, ys = _dense_problem(rng)
    grads = K.gradients(loss, params)
    slots, ups = (_rmsprop if rule == "rmsprop" else _adam)(params, grads)
    f = K.function([x, y], [loss], updates=ups)
    ps = [K.get_value(p).astype(np.float64) for p in params]
    sl = [np.zeros(K.int_shape(s)) for s in slots]
    for step in range(1, 5):
        addresses = [_address(v) for v in params + slots]
        f([xs, ys])
        gs = _numpy_grads(ps, xs.astype(np.float64), ys.astype(np.float64))
        if rule == "rmsprop":
            ps, sl = _rmsprop_numpy(ps, gs, sl)
        else:
            ps, sl = _adam_numpy(ps, gs, sl, step)
        for v, want in zip(params + slots, ps + sl):
            np.testing.assert_allclose(K.get_value(v), want, rtol=2e-5, atol=2e-6)
        assert [_address(v) for v in params + slots] == addresses, f"step {step}: a variable moved"


def test_outputs_read_the_values_from_before_the_call(on_cpu):
    v = K.variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    f = K.function([], [v * 3.0, K.sum(v), v], updates=[(v, v + 1.0)])
    for k in range(3):
        before = np.arange(6, dtype=np.float32).reshape(2, 3) + k
        tripled, total, same = f([])
        np.testing.assert_array_equal(tripled, before * 3)
        assert total == before.sum()
        np.testing.assert_array_equal(same, before)
    np.testing.assert_array_equal(K.get_value(v), np.arange(6).reshape(2, 3) + 3)


def test_a_value_handed_out_is_not_overwritten_later(on_cpu):
    """`get_value` and function outputs are copies: the next in-place step leaves them."""
    v = K.variable(np.zeros(1000, np.float32))
    f = K.function([], [], updates=[(v, v + 1.0)])
    held = K.get_value(v)
    f([])
    f([])
    np.testing.assert_array_equal(held, 0.0)
    np.testing.assert_array_equal(K.get_value(v), 2.0)


def test_readers_on_other_threads_never_see_a_half_written_variable(on_cpu):
    n = 1 << 21
    v = K.variable(np.zeros(n, np.float32))
    step = K.function([], [], updates=[(v, v + 1.0)])
    span = K.function([], [K.min(v), K.max(v)])
    step([])
    calls = 60
    stop = threading.Event()
    seen, errors = [], []

    def read():
        try:
            while not stop.is_set():
                lo, hi = span([])
                a = K.get_value(v)
                seen.append((float(lo), float(hi), float(a[0]), float(a[-1])))
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    in_place = 0
    try:
        for _ in range(calls):
            before = _address(v)
            step([])
            in_place += _address(v) == before
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=60)
    if errors:
        raise errors[0]
    assert in_place > 0, "no update was done in place"
    assert seen, "the readers never ran"
    torn = [s for s in seen if s[0] != s[1] or s[2] != s[3]]
    assert not torn, f"{len(torn)} of {len(seen)} reads saw a half-written variable: {torn[:3]}"
    np.testing.assert_array_equal(K.get_value(v), calls + 1.0)


_KERAS_RUN = r"""
import os, sys
os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
import numpy as np, keras
import ferrokeras
ferrokeras.set_device("cpu")
from keras.models import Sequential
from keras.layers import Dense, BatchNormalization, LSTM
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 20)).astype("float32")
y = keras.utils.to_categorical(rng.integers(0, 10, 256), 10)
out = []
def init(m, seed):
    m.set_weights([np.random.default_rng(seed).standard_normal(w.shape).astype("float32") * 0.1
                   + (0.5 if w.ndim == 1 else 0.0) for w in m.get_weights()])
for k, opt in enumerate(["sgd", keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True), "adagrad",
                         "adadelta", "adamax", "nadam", keras.optimizers.Adam(amsgrad=True), "rmsprop"]):
    m = Sequential([Dense(32, activation="relu", input_shape=(20,)), BatchNormalization(),
                    Dense(10, activation="softmax")])
    init(m, k)
    m.compile(opt, "categorical_crossentropy")
    out += m.fit(x, y, batch_size=64, epochs=2, verbose=0, shuffle=False).history["loss"]
    out += [float(np.sum(w)) for w in m.get_weights()]
m = Sequential([LSTM(8, input_shape=(5, 4)), Dense(10, activation="softmax")])
init(m, 9)
m.compile("adam", "categorical_crossentropy")
out += m.fit(x[:, :20].reshape(256, 5, 4), y, batch_size=32, epochs=2, verbose=0, shuffle=False).history["loss"]
out += [float(np.sum(w)) for w in m.get_weights()]
print(" ".join(repr(float(v)) for v in out))
"""


def test_keras_training_is_bitwise_the_same_with_and_without_in_place_updates():
    """Eight Keras optimizers (BatchNorm's moving averages included) and an LSTM: the same
    losses and weights, bit for bit, whether the steps update variables in place or not
    (the switch is read once per process, hence the subprocesses)."""
    import os
    import subprocess
    import sys

    runs = {}
    for flag in ("0", "1"):
        env = dict(os.environ, FERROKERAS_CPU_INPLACE=flag)
        r = subprocess.run(
            [sys.executable, "-c", _KERAS_RUN], env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr[-2000:]
        runs[flag] = [float(v) for v in r.stdout.split()[-(8 * (2 + 8) + 2 + 5) :]]
    assert all(np.isfinite(runs["1"])), runs["1"]
    assert runs["0"] == runs["1"]
