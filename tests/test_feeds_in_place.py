"""Feeds read in place: a `K.function` call reads a large C-contiguous, aligned
NumPy feed without copying it into the engine. The caller's array is never written, no
result or variable keeps pointing into it after the call (outputs and assigned values
are copies), and every borrowed buffer is let go when its call ends
(`_core.borrowed_feeds()` counts borrows and leaks; leaks must stay 0).

Runs on the device `FERROKERAS_DEVICE` selects, like the rest of the suite.
"""

import threading

import numpy as np
import pytest
from ferrokeras import _core
from ferrokeras import backend as K

BIG = (64, 96)  # 24 KiB of float32: above the size that is borrowed


def _leases():
    return _core.borrowed_feeds()[0]


@pytest.fixture(autouse=True)
def no_leaks():
    yield
    assert _core.borrowed_feeds()[1] == 0, "a borrowed feed was still held when its call ended"


def _data(shape=BIG, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def test_a_large_feed_is_read_in_place_and_left_unwritten():
    x = K.placeholder(shape=(None, BIG[1]))
    # exp(x) * 2 + x: a fused group whose last reader of x could take x's buffer for its
    # result if the engine owned it.
    f = K.function([x], [K.exp(x) * 2.0 + x])
    xv = _data()
    before = xv.copy()
    n = _leases()
    out = f([xv])[0]
    assert _leases() == n + 1
    np.testing.assert_array_equal(xv, before)
    np.testing.assert_allclose(out, np.exp(before) * 2 + before, rtol=1e-5, atol=1e-6)
    assert not np.shares_memory(out, xv)


def test_small_strided_and_misaligned_feeds_are_copied_and_still_right():
    x = K.placeholder(shape=(None, None))
    f = K.function([x], [x * 3.0])
    big = _data((64, 192))
    raw = np.zeros(4 * 64 * 96 + 1, np.uint8)
    misaligned = np.frombuffer(raw.data, dtype=np.float32, count=64 * 96, offset=1).reshape(BIG)
    assert misaligned.ctypes.data % 4 != 0
    cases = {
        "small": _data((4, 4)),
        "strided": big[:, ::2],
        "fortran": np.asfortranarray(_data()),
        "misaligned": misaligned,
    }
    for name, v in cases.items():
        n = _leases()
        out = f([v])[0]
        assert _leases() == n, name
        np.testing.assert_allclose(out, np.asarray(v) * 3, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    "view", ["identity", "reshape", "transpose", "slice", "expand_dims", "stop_gradient"]
)
def test_an_output_that_is_the_feed_or_a_view_of_it_is_a_copy(view):
    x = K.placeholder(shape=BIG)
    y = {
        "identity": lambda: x,
        "reshape": lambda: K.reshape(x, (BIG[0] * BIG[1],)),
        "transpose": lambda: K.transpose(x),
        "slice": lambda: x[8:40],
        "expand_dims": lambda: K.expand_dims(x, 0),
        "stop_gradient": lambda: K.stop_gradient(x),
    }[view]()
    ref = {
        "identity": lambda a: a,
        "reshape": lambda a: a.reshape(-1),
        "transpose": lambda a: a.T,
        "slice": lambda a: a[8:40],
        "expand_dims": lambda a: a[None],
        "stop_gradient": lambda a: a,
    }[view]
    f = K.function([x], [y, y])
    xv = _data()
    a, b = f([xv])
    expect = ref(xv).copy()
    np.testing.assert_array_equal(a, expect)
    np.testing.assert_array_equal(b, expect)
    assert not np.shares_memory(a, xv) and not np.shares_memory(b, xv)
    xv[...] = -1.0  # the caller reuses its array: results keep the values of the call
    np.testing.assert_array_equal(a, expect)
    np.testing.assert_array_equal(b, expect)


@pytest.mark.parametrize("how", ["feed", "reshape", "add"])
def test_a_variable_assigned_from_a_feed_keeps_its_value_after_the_call(how):
    x = K.placeholder(shape=BIG)
    v = K.variable(np.zeros(BIG, np.float32))
    new = {
        "feed": lambda: x,
        "reshape": lambda: K.reshape(K.reshape(x, (-1,)), BIG),
        "add": lambda: v + x,
    }[how]()
    f = K.function([x], [K.sum(x)], updates=[K.update(v, new)])
    xv = _data()
    expect = xv.copy()
    f([xv])
    xv[...] = 7.0
    np.testing.assert_array_equal(K.get_value(v), expect)
    f([xv])  # a second call reads the variable it assigned and the new feed
    np.testing.assert_array_equal(
        K.get_value(v), np.full(BIG, 7.0, np.float32) if how != "add" else expect + 7.0
    )


def test_a_feed_cast_to_the_placeholder_dtype_and_one_array_fed_twice():
    x = K.placeholder(shape=BIG, dtype="float32")
    y = K.placeholder(shape=BIG, dtype="float32")
    f = K.function([x, y], [x - y, x * y])
    xv = _data(dtype=np.float64)
    d, p = f([xv, xv.astype(np.float32)])
    np.testing.assert_allclose(d, 0, atol=1e-6)
    same = _data()
    d, p = f([same, same])
    np.testing.assert_array_equal(d, np.zeros(BIG, np.float32))
    np.testing.assert_allclose(p, same * same, rtol=1e-6)


def test_a_loop_over_a_fed_sequence_and_a_callback_that_returns_its_input():
    seq = K.placeholder(shape=(8, 20, 16))
    h0 = K.placeholder(shape=(8, 16))

    def step(x, states):
        h = K.tanh(x + states[0])
        return h, [h]

    last, outs, _ = K.rnn(step, seq, [h0])
    echo = K.py_function(lambda a: a, [seq], "float32")
    f = K.function([seq, h0], [last, outs, echo])
    sv, hv = _data((8, 20, 16)), np.zeros((8, 16), np.float32)
    last_v, outs_v, echo_v = f([sv, hv])
    h, ref = hv, []
    for t in range(20):
        h = np.tanh(sv[:, t] + h)
        ref.append(h)
    np.testing.assert_allclose(outs_v, np.stack(ref, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(last_v, h, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(echo_v, sv)
    assert not np.shares_memory(echo_v, sv)


def test_a_call_that_fails_lets_go_of_its_feeds():
    x = K.placeholder(shape=(None, None))
    f = K.function([x], [K.reshape(x, (7, -1))])
    xv = _data()
    before = xv.copy()
    with pytest.raises(ValueError):
        f([xv])
    np.testing.assert_array_equal(xv, before)
    out = K.function([x], [x + 1.0])([xv])[0]
    np.testing.assert_array_equal(out, before + 1.0)


def test_training_steps_on_several_threads_share_one_feed():
    x = K.placeholder(shape=BIG)
    ws = [K.variable(np.zeros(BIG[1], np.float32)) for _ in range(4)]
    fs = [K.function([x], [K.mean(x)], updates=[K.update_add(w, K.mean(x, axis=0))]) for w in ws]
    xv = _data()
    before = xv.copy()

    def work(f):
        for _ in range(25):
            f([xv])

    threads = [threading.Thread(target=work, args=(f,)) for f in fs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(xv, before)
    for w in ws:
        np.testing.assert_allclose(K.get_value(w), 25 * before.mean(axis=0), rtol=1e-4)
