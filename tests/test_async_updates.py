"""Update tails that finish after their call returns: on the CPU, a call whose outputs are
computed before its variable updates (a Keras training call: loss and metrics, then the
optimizer's updates) returns its outputs while the in-place updates of its variables finish
on a worker thread (``FERROKERAS_CPU_ASYNC_UPDATES``). Every read of those variables waits
for them, so what anyone sees is what the synchronous path gives, bit for bit.
"""

import os
import subprocess
import sys
import threading

import ferrokeras
import numpy as np
import pytest
from env_child import env_is
from ferrokeras import backend as K
from test_inplace_updates import _KERAS_RUN

ASYNC = not env_is("FERROKERAS_CPU_ASYNC_UPDATES", "0")
N = 1 << 21  # float32 elements: an update tail of ~1 ms, long enough to be caught in flight


@pytest.fixture
def on_cpu():
    """Tails run after their call on the CPU executor only."""
    before = ferrokeras.device()
    ferrokeras.set_device("cpu")
    yield
    ferrokeras.set_device(before)


def _counter(value=0.0, step=1.0):
    """`K.function([x], [sum(x)], updates=[(w, w + step)])` over `N` elements, with its
    variable, after the three calls that specialise its plan (the third runs it)."""
    x = K.placeholder(shape=(None,))
    w = K.variable(np.full(N, value, np.float32))
    f = K.function([x], [K.sum(x)], updates=[(w, w + step)])
    xs = np.ones(3, np.float32)
    for _ in range(3):
        assert f([xs]) == [3.0]
    return w, f, xs


def _within(seconds, body):
    """Runs `body` on a daemon thread and fails if it has not ended in `seconds` (a
    deadlock fails the test instead of hanging the suite)."""
    errors = []

    def run():
        try:
            body()
        except BaseException as e:  # reported in the test's thread
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: a deadlock"
    if errors:
        raise errors[0]


def test_a_training_call_returns_before_its_updates_and_readers_wait_for_them(on_cpu):
    w, f, xs = _counter()
    assert f._f.async_updates == ASYNC
    span = K.function([], [K.min(w), K.max(w)])
    for k in range(4, 12):
        f([xs])
        # Each kind of read, right after the call: all see the updated values.
        if k % 4 == 0:
            np.testing.assert_array_equal(K.get_value(w), k)
        elif k % 4 == 1:
            (v,) = K.batch_get_value([w])
            np.testing.assert_array_equal(v, k)
        elif k % 4 == 2:
            assert [float(s) for s in span([])] == [k, k]
        else:
            np.testing.assert_array_equal(K.eval(w), k)
    assert f._f.async_updates == ASYNC


def test_an_assignment_after_the_call_is_not_overwritten_by_its_tail(on_cpu):
    w, f, xs = _counter()
    for k in range(5):
        f([xs])
        K.set_value(w, np.full(N, 100.0 * k, np.float32))
        np.testing.assert_array_equal(K.get_value(w), 100.0 * k)
    f([xs])
    np.testing.assert_array_equal(K.get_value(w), 401.0)


def test_two_functions_sharing_a_variable_see_each_others_updates(on_cpu):
    x = K.placeholder(shape=(None,))
    w = K.variable(np.full(N, 1.0, np.float32))
    a = K.variable(np.zeros(N, np.float32))
    double = K.function([x], [K.sum(x)], updates=[(w, w * 2.0), (a, a + w)])
    plus = K.function([x], [K.sum(x)], updates=[(w, w + 1.0), (a, a - 1.0)])
    xs = np.ones(3, np.float32)
    want_w, want_a = 1.0, 0.0
    for k in range(12):
        if k % 3 == 0:
            double([xs])
            want_w, want_a = want_w * 2.0, want_a + want_w
        else:
            plus([xs])
            want_w, want_a = want_w + 1.0, want_a - 1.0
    np.testing.assert_array_equal(K.get_value(w), want_w)
    np.testing.assert_array_equal(K.get_value(a), want_a)
    assert double._f.async_updates == ASYNC and plus._f.async_updates == ASYNC


def test_py_functions_reading_and_updating_variables_with_tails_in_flight(on_cpu):
    w, f, xs = _counter()
    v = K.variable(np.zeros(4, np.float32))
    inner = K.function([], [], updates=[(v, v + 1.0)])

    def read_w(t):
        return K.get_value(w)[:4] + 0.0 * t

    def call_inner(t):
        inner([])  # a call inside a call: its updates end before it returns
        return K.get_value(v) + 0.0 * t

    seed = K.constant(np.zeros(4, np.float32))
    reader = K.function([], [K.py_function(read_w, [seed], "float32")])
    # An updating function whose py_function reads the variable it updates: the value
    # from before the call.
    own = K.function([], [K.py_function(read_w, [seed], "float32")], updates=[(w, w + 1.0)])
    nested = K.function([], [K.py_function(call_inner, [seed], "float32")], updates=[(w, w + 1.0)])
    v0 = float(K.get_value(v)[0])  # the py_function's trial run at build time called inner

    def body():
        k = 3.0
        for step in range(6):
            f([xs])
            k += 1
            np.testing.assert_array_equal(reader([])[0], k)
            np.testing.assert_array_equal(own([])[0], k)
            k += 1
            np.testing.assert_array_equal(nested([])[0], v0 + step + 1)
            k += 1
        np.testing.assert_array_equal(K.get_value(w), k)

    _within(120, body)


def test_calls_on_several_threads_lose_no_update(on_cpu):
    w, f, xs = _counter()
    span = K.function([], [K.min(w), K.max(w)])
    torn = []

    def train():
        for _ in range(25):
            f([xs])

    def read():
        for _ in range(25):
            lo, hi = span([])
            if lo != hi:
                torn.append((lo, hi))

    def body():
        threads = [threading.Thread(target=train) for _ in range(4)]
        threads += [threading.Thread(target=read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    _within(300, body)
    assert not torn, torn[:3]
    np.testing.assert_array_equal(K.get_value(w), 3.0 + 100.0)


def test_a_gpu_run_reads_the_value_a_cpu_tail_writes(on_cpu, gpu):
    ferrokeras.set_device("cpu")
    w, f, xs = _counter()
    total = K.function([], [K.sum(w)])
    for k in range(4, 8):
        ferrokeras.set_device("cpu")
        f([xs])
        ferrokeras.set_device(gpu)
        assert float(total([])[0]) == float(k) * N


_EXIT_RUN = r"""
import sys
import numpy as np
import ferrokeras
from ferrokeras import backend as K
ferrokeras.set_device("cpu")
x = K.placeholder(shape=(None,))
w = K.variable(np.zeros(1 << 22, np.float32))
f = K.function([x], [K.sum(x)], updates=[(w, K.sqrt(w + 1.0) * 0.5)])
for _ in range(4):
    f([np.ones(3, np.float32)])
if sys.argv[1] == "clear":
    K.clear_session()
    f([np.ones(3, np.float32)])
print(f._f.async_updates)
"""


@pytest.mark.parametrize("then", ["exit", "clear"])
def test_the_interpreter_exits_with_a_tail_in_flight(then):
    for _ in range(3):
        r = subprocess.run(
            [sys.executable, "-c", _EXIT_RUN, then],
            env=dict(os.environ, FERROKERAS_DEVICE="cpu"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split() == [str(ASYNC)]


def test_keras_training_is_bitwise_the_same_with_and_without_async_updates():
    """The Keras runs of test_inplace_updates.py (eight optimizers and an LSTM): the same
    losses and weights whether the update tails finish after their calls or inside them."""
    runs = {}
    for flag in ("0", "1"):
        env = dict(os.environ, FERROKERAS_CPU_ASYNC_UPDATES=flag)
        r = subprocess.run(
            [sys.executable, "-c", _KERAS_RUN], env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr[-2000:]
        runs[flag] = [float(v) for v in r.stdout.split()[-(8 * (2 + 8) + 2 + 5) :]]
    assert all(np.isfinite(runs["1"])), runs["1"]
    assert runs["0"] == runs["1"]
