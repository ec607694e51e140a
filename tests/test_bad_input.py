"""Bad arguments raise ValueError/TypeError naming what was wrong; nothing crashes, and
the backend keeps working after the error (DESIGN.md, "What done means")."""

import numpy as np
import pytest

from conftest import assert_mentions
from ferrokeras import backend as K

BAD = (ValueError, TypeError)


def assert_backend_still_works():
    x = K.placeholder(shape=(None, 2))
    v = K.variable(np.array([1.0, -1.0]))
    f = K.function([x], [K.sum(x * v, axis=1)])
    out = f([np.array([[1.0, 2.0], [3.0, 5.0]], dtype="float32")])[0]
    np.testing.assert_allclose(out, [-1.0, -2.0])


# Each case: (id, callable that must raise, words of which the message names at least one)
def _dot_inner_mismatch():
    K.dot(K.placeholder(shape=(2, 3)), K.placeholder(shape=(4, 5)))


def _dot_nd_mismatch():
    K.dot(K.placeholder(shape=(2, 3)), K.placeholder(shape=(4, 5, 6)))


def _batch_dot_axis_mismatch():
    K.batch_dot(K.placeholder(shape=(4, 3)), K.placeholder(shape=(4, 5)), axes=1)


def _batch_dot_batch_mismatch():
    K.batch_dot(K.placeholder(shape=(4, 3)), K.placeholder(shape=(5, 3)), axes=1)


def _broadcast_mismatch():
    K.placeholder(shape=(2, 3)) + K.placeholder(shape=(4,))


def _maximum_broadcast_mismatch():
    K.maximum(K.placeholder(shape=(2, 3)), K.placeholder(shape=(2,)))


CONSTRUCTION_CASES = [
    ("dot_inner_mismatch", _dot_inner_mismatch, ("dot", "matmul", "shape")),
    ("dot_nd_mismatch", _dot_nd_mismatch, ("dot", "matmul", "shape")),
    ("batch_dot_axis_mismatch", _batch_dot_axis_mismatch, ("batch_dot", "shape", "axes")),
    ("batch_dot_batch_mismatch", _batch_dot_batch_mismatch, ("batch", "shape")),
    ("broadcast_mismatch", _broadcast_mismatch, ("broadcast", "shape", "add")),
    ("maximum_broadcast_mismatch", _maximum_broadcast_mismatch,
     ("broadcast", "shape", "maximum")),
    ("sum_axis_2_of_rank_2", lambda: K.sum(K.placeholder(shape=(2, 3)), axis=2),
     ("axis", "dimension", "sum")),
    ("sum_axis_minus_3", lambda: K.sum(K.placeholder(shape=(2, 3)), axis=-3),
     ("axis", "dimension", "sum")),
    ("mean_axes_list", lambda: K.mean(K.placeholder(shape=(2, 3)), axis=[0, 4]),
     ("axis", "dimension", "mean")),
    ("max_axis", lambda: K.max(K.variable(np.zeros((2, 3))), axis=3),
     ("axis", "dimension", "max")),
    ("argmax_axis", lambda: K.argmax(K.placeholder(shape=(2, 3)), axis=5),
     ("axis", "dimension", "argmax")),
    ("cumsum_axis", lambda: K.cumsum(K.placeholder(shape=(2, 3)), axis=2),
     ("axis", "dimension", "cumsum")),
    ("placeholder_dtype", lambda: K.placeholder(shape=(2,), dtype="float13"), ("float13",)),
    ("cast_dtype", lambda: K.cast(K.placeholder(shape=(2,)), "complex512"), ("complex512",)),
    ("variable_dtype", lambda: K.variable([1.0], dtype="floaty"), ("floaty",)),
    ("zeros_dtype", lambda: K.zeros((2,), dtype="nodtype"), ("nodtype",)),
    ("function_non_list_inputs",
     lambda: K.function(K.placeholder(shape=(2,)), [K.constant(1.0)]), ("input", "list")),
    ("function_unknown_kwarg",
     lambda: K.function([K.placeholder(shape=(2,))], [K.constant(1.0)], bogus_option=3),
     ("bogus_option",)),
    ("set_value_wrong_shape",
     lambda: K.set_value(K.variable(np.zeros((2, 3))), np.zeros((3, 2))), ("shape",)),
]


@pytest.mark.parametrize("name,trigger,words", CONSTRUCTION_CASES,
                         ids=[c[0] for c in CONSTRUCTION_CASES])
def test_bad_arguments_raise(name, trigger, words):
    with pytest.raises(BAD) as excinfo:
        trigger()
    assert_mentions(excinfo, *words)
    assert_backend_still_works()


def test_non_list_inputs_is_a_type_error():
    with pytest.raises(TypeError):
        K.function(K.placeholder(shape=(2,)), [K.constant(1.0)])


def test_unknown_kwarg_is_a_value_error():
    # seed 000: "ValueError: if invalid kwargs are passed in"
    with pytest.raises(ValueError):
        K.function([K.placeholder(shape=(2,))], [K.constant(1.0)], bogus_option=3)


# ---- errors when a compiled function is called ----------------------------------------------

@pytest.fixture
def fn():
    x = K.placeholder(shape=(2, 3), name="feed_me")
    y = K.placeholder(shape=(None, 3), name="batch_input")
    return K.function([x, y], [K.sum(x) + K.sum(y)])


GOOD = [np.ones((2, 3), "float32"), np.ones((4, 3), "float32")]

CALL_CASES = [
    ("wrong_shape", [np.ones((3, 2), "float32"), GOOD[1]], ("feed_me", "shape")),
    ("wrong_rank", [np.ones((2, 3, 1), "float32"), GOOD[1]], ("feed_me", "shape", "rank")),
    ("wrong_known_dim", [GOOD[0], np.ones((4, 4), "float32")], ("batch_input", "shape")),
    ("wrong_rank_none_dims", [GOOD[0], np.ones((4,), "float32")],
     ("batch_input", "shape", "rank")),
    ("too_many_inputs", GOOD + [GOOD[0]], ("input", "expected", "argument")),
    ("too_few_inputs", GOOD[:1], ("input", "expected", "argument")),
    ("no_inputs", [], ("input", "expected", "argument")),
    ("string_data", [np.array([["a", "b", "c"]] * 2), GOOD[1]],
     ("feed_me", "dtype", "float", "str", "convert")),
]


@pytest.mark.parametrize("name,feeds,words", CALL_CASES, ids=[c[0] for c in CALL_CASES])
def test_bad_feeds_raise_and_function_still_works(fn, name, feeds, words):
    with pytest.raises(BAD) as excinfo:
        fn(feeds)
    assert_mentions(excinfo, *words)
    # the same compiled function still works after the error
    assert float(fn(GOOD)[0]) == pytest.approx(18.0)
    assert_backend_still_works()


def test_unfed_placeholder_raises_with_its_name():
    p = K.placeholder(shape=(3,), name="never_fed_placeholder")
    q = K.placeholder(shape=(3,), name="fed_placeholder")
    with pytest.raises(BAD) as excinfo:
        K.eval(K.sum(p * 2.0))
    assert_mentions(excinfo, "never_fed_placeholder")
    with pytest.raises(BAD) as excinfo:
        K.function([q], [p + q])([np.zeros(3, "float32")])
    assert_mentions(excinfo, "never_fed_placeholder")
    assert_backend_still_works()


def test_many_errors_in_a_row_do_not_break_the_backend():
    for _ in range(20):
        with pytest.raises(BAD):
            K.dot(K.placeholder(shape=(2, 3)), K.placeholder(shape=(4, 5)))
        with pytest.raises(BAD):
            K.eval(K.placeholder(shape=(2,)) + 1.0)
    assert_backend_still_works()
