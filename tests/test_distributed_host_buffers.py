"""The buffers of a host callback, the node behind ferrokeras.distributed's gradient
average: its inputs reach Python as writable arrays (the engine's own buffer where
nothing else holds it, else a copy), and results that view those arrays are read in place.
Nothing the callback writes reaches a value the graph, a variable or the caller still
reads, and no result shares memory that Python may write after the call.

Every result is checked against NumPy, on the device this pass of the suite runs on."""

import ferrokeras
import numpy as np
import pytest
from ferrokeras import _core
from ferrokeras import backend as K
from ferrokeras.tensor import wrap

N = 2048  # float32: 8 KiB, so that a feed of this size is read in place by the call


def host(runner, inputs, shapes, dtype="float32"):
    res = _core.host_call("test", runner, [t._core for t in inputs], [(s, dtype) for s in shapes])
    return [wrap(r) for r in res]


class AddOneInPlace:
    """Adds 1 to every input in place; returns the first whole, a slice of it and a
    reshape of the rest, then the other inputs whole. With ``keep`` it holds on to its
    arrays after the call."""

    def __init__(self, keep=False):
        self.keep = keep
        self.kept = []
        self.writeable = []
        self.addresses = []

    def call(self, arrays):
        self.writeable.append([a.flags.writeable for a in arrays])
        self.addresses.append([a.__array_interface__["data"][0] for a in arrays])
        for a in arrays:
            a += 1
        if self.keep:
            self.kept = list(arrays)
        first = arrays[0]
        return [first, first[:10], first[10:].reshape(-1, 2)] + list(arrays[1:])

    def vjp(self, arrays, grads):
        return [None] * len(arrays)


def _feed(seed=0):
    return np.random.default_rng(seed).standard_normal(N).astype("float32")


def test_results_view_an_input_that_dies_at_the_callback():
    x = K.placeholder(shape=(N,))
    runner = AddOneInPlace()
    whole, head, rest = host(runner, [x * 2.0], [[N], [10], [(N - 10) // 2, 2]])
    f = K.function([x], [whole, head * 3.0, rest + 0.0])
    for seed in range(3):  # the generic plan, then the one specialised to the feed shapes
        xs = _feed(seed)
        want = xs * 2 + 1
        out = f([xs])
        np.testing.assert_allclose(out[0], want, rtol=1e-6)
        np.testing.assert_allclose(out[1], want[:10] * 3, rtol=1e-6)
        np.testing.assert_allclose(out[2], want[10:].reshape(-1, 2), rtol=1e-6)
    assert all(all(w) for w in runner.writeable)


def test_an_input_read_after_the_callback_keeps_its_value():
    x = K.placeholder(shape=(N,))
    b = x + 3.0
    runner = AddOneInPlace()
    whole, _, _ = host(runner, [b], [[N], [10], [(N - 10) // 2, 2]])
    f = K.function([x], [whole, b * 1.0])
    for seed in range(3):
        xs = _feed(seed)
        out = f([xs])
        np.testing.assert_allclose(out[0], xs + 4, rtol=1e-6)
        np.testing.assert_allclose(out[1], xs + 3, rtol=1e-6)


def test_variables_and_feeds_given_to_the_callback_are_not_written():
    x = K.placeholder(shape=(N,))
    start = _feed(7)
    v = K.variable(start.copy())
    runner = AddOneInPlace()
    whole, _, _, fed = host(runner, [v, x], [[N], [10], [(N - 10) // 2, 2], [N]])
    f = K.function([x], [whole, fed])
    xs = _feed(1)
    xs_before = xs.copy()
    for _ in range(3):
        out = f([xs])
        np.testing.assert_allclose(out[0], start + 1, rtol=1e-6)
        np.testing.assert_allclose(out[1], xs_before + 1, rtol=1e-6)
        np.testing.assert_array_equal(K.get_value(v), start)
        np.testing.assert_array_equal(xs, xs_before)


def test_a_callback_that_keeps_its_arrays_cannot_change_earlier_results():
    x = K.placeholder(shape=(N,))
    runner = AddOneInPlace(keep=True)
    whole, head, _ = host(runner, [x * 2.0], [[N], [10], [(N - 10) // 2, 2]])
    f = K.function([x], [whole, head])
    xs = _feed(3)
    out = f([xs])
    for a in runner.kept:
        a[...] = -100.0  # after the call: must not reach the results already returned
    np.testing.assert_allclose(out[0], xs * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(out[1], xs[:10] * 2 + 1, rtol=1e-6)
    again = f([xs])
    np.testing.assert_allclose(again[0], xs * 2 + 1, rtol=1e-6)


def test_a_result_that_is_the_input_is_not_copied_on_the_cpu():
    # The callback's input (x * 2, dead after the callback) is the engine's own buffer,
    # lent without a copy; the result is that array; the function's output is that result.
    # On the CPU no copy is made on the way: the output's memory is the buffer the callback
    # saw. On a GPU the values come back through device buffers.
    x = K.placeholder(shape=(N,))
    runner = AddOneInPlace()
    whole, _, _ = host(runner, [x * 2.0], [[N], [10], [(N - 10) // 2, 2]])
    f = K.function([x], [whole])
    xs = _feed(4)
    (out,) = f([xs])
    np.testing.assert_allclose(out, xs * 2 + 1, rtol=1e-6)
    if ferrokeras.device() == "cpu":
        assert out.__array_interface__["data"][0] == runner.addresses[-1][0]


def test_bool_inputs_and_results():
    x = K.placeholder(shape=(N,))

    class Invert:
        def call(self, arrays):
            (a,) = arrays
            np.logical_not(a, out=a)
            return [a, a[:5]]

        def vjp(self, arrays, grads):
            return [None]

    whole, head = host(Invert(), [K.greater(x, 0.0)], [[N], [5]], dtype="bool")
    f = K.function([x], [whole, head])
    xs = _feed(5)
    out = f([xs])
    np.testing.assert_array_equal(out[0], xs <= 0)
    np.testing.assert_array_equal(out[1], (xs <= 0)[:5])


def test_a_failed_callback_changes_no_variable():
    x = K.placeholder(shape=(N,))
    start = _feed(6)
    v = K.variable(start.copy())

    class WriteThenFail:
        def call(self, arrays):
            for a in arrays:
                a[...] = 0.0
            raise ValueError("deliberate failure after writing the inputs")

        def vjp(self, arrays, grads):
            return [None] * len(arrays)

    (res,) = host(WriteThenFail(), [v, x * 2.0], [[N]])
    f = K.function([x], [res], updates=[(v, v + 1.0)])
    with pytest.raises(ValueError, match="deliberate failure"):
        f([_feed(0)])
    np.testing.assert_array_equal(K.get_value(v), start)
