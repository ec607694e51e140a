"""Bad arguments raise ValueError/TypeError naming what was wrong; nothing crashes, and
the backend keeps working after the error (DESIGN.md, "What done means")."""

import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import assert_mentions

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
    ("maximum_broadcast_mismatch", _maximum_broadcast_mismatch, ("broadcast", "shape", "maximum")),
    (
        "sum_axis_2_of_rank_2",
        lambda: K.sum(K.placeholder(shape=(2, 3)), axis=2),
        ("axis", "dimension", "sum"),
    ),
    (
        "sum_axis_minus_3",
        lambda: K.sum(K.placeholder(shape=(2, 3)), axis=-3),
        ("axis", "dimension", "sum"),
    ),
    (
        "mean_axes_list",
        lambda: K.mean(K.placeholder(shape=(2, 3)), axis=[0, 4]),
        ("axis", "dimension", "mean"),
    ),
    ("max_axis", lambda: K.max(K.variable(np.zeros((2, 3))), axis=3), ("axis", "dimension", "max")),
    (
        "argmax_axis",
        lambda: K.argmax(K.placeholder(shape=(2, 3)), axis=5),
        ("axis", "dimension", "argmax"),
    ),
    (
        "cumsum_axis",
        lambda: K.cumsum(K.placeholder(shape=(2, 3)), axis=2),
        ("axis", "dimension", "cumsum"),
    ),
    ("placeholder_dtype", lambda: K.placeholder(shape=(2,), dtype="float13"), ("float13",)),
    ("cast_dtype", lambda: K.cast(K.placeholder(shape=(2,)), "complex512"), ("complex512",)),
    ("variable_dtype", lambda: K.variable([1.0], dtype="floaty"), ("floaty",)),
    ("zeros_dtype", lambda: K.zeros((2,), dtype="nodtype"), ("nodtype",)),
    (
        "function_non_list_inputs",
        lambda: K.function(K.placeholder(shape=(2,)), [K.constant(1.0)]),
        ("input", "list"),
    ),
    (
        "function_unknown_kwarg",
        lambda: K.function([K.placeholder(shape=(2,))], [K.constant(1.0)], bogus_option=3),
        ("bogus_option",),
    ),
    (
        "set_value_wrong_shape",
        lambda: K.set_value(K.variable(np.zeros((2, 3))), np.zeros((3, 2))),
        ("shape",),
    ),
]


def test_non_list_inputs_is_a_type_error():
    with pytest.raises(TypeError):
        K.function(K.placeholder(shape=(2,)), [K.constant(1.0)])


def test_unknown_kwarg_is_a_value_error():
    # tf_keras_backend_function.md: "ValueError: if invalid kwargs are passed in"
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
    ("wrong_rank_none_dims", [GOOD[0], np.ones((4,), "float32")], ("batch_input", "shape", "rank")),
    ("too_many_inputs", GOOD + [GOOD[0]], ("input", "expected", "argument")),
    ("too_few_inputs", GOOD[:1], ("input", "expected", "argument")),
    ("no_inputs", [], ("input", "expected", "argument")),
    (
        "string_data",
        [np.array([["a", "b", "c"]] * 2), GOOD[1]],
        ("feed_me", "dtype", "float", "str", "convert"),
    ),
]


@pytest.mark.parametrize("name,feeds,words", CALL_CASES, ids=[c[0] for c in CALL_CASES])
def test_bad_feeds_raise_and_function_still_works(fn, name, feeds, words):
    with pytest.raises(BAD) as excinfo:
        fn(feeds)
    assert_mentions(excinfo, *words)
    # the same compiled function still works after the error
    assert float(fn(GOOD)[0]) == pytest.approx(18.0)
    assert_backend_still_works()


@pytest.mark.parametrize(
    "make,good",
    [
        (K.zeros, np.zeros((2, 3))),
        (K.ones, np.ones((2, 3))),
        (lambda s: K.sum(K.ones(s) * 2.0), 12.0),
    ],
    ids=["zeros", "ones", "fused"],
)
def test_a_negative_target_shape_fed_at_run_time_raises(make, good):
    # broadcast_to's target shape comes from a fed tensor: TF refuses a negative entry.
    s = K.placeholder(shape=(2,), dtype="int32", name="target_shape")
    f = K.function([s], [make(s)])
    with pytest.raises(BAD) as excinfo:
        f([np.array([-2, 3], "int32")])
    assert_mentions(excinfo, "invalid dimension", "-2")
    np.testing.assert_array_equal(f([np.array([2, 3], "int32")])[0], good)
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


# ---- more bad inputs ------------------------------------


def _conv_int():
    K.conv1d(
        K.constant(np.ones((1, 3, 1)), dtype="int32"), K.constant(np.ones((2, 1, 1)), dtype="int32")
    )


def _conv_mixed():
    K.conv1d(
        K.constant(np.ones((1, 3, 1)), dtype="float64"),
        K.constant(np.ones((2, 1, 1)), dtype="float32"),
    )


MORE_CONSTRUCTION_CASES = [
    # unknown keyword arguments name the keyword
    ("placeholder_unknown_kwarg", lambda: K.placeholder(shape=(2,), bogus_kw=1), ("bogus_kw",)),
    ("variable_unknown_kwarg", lambda: K.variable(1.0, bogus_kw=1), ("bogus_kw",)),
    (
        "gradients_unknown_kwarg",
        lambda: K.gradients(K.constant(1.0), [K.variable(1.0)], bogus_kw=2),
        ("bogus_kw",),
    ),
    (
        "function_fetches_kwarg",
        lambda: K.function([], [K.constant(1.0)], fetches=[1]),
        ("fetches",),
    ),
    # a wrong dtype for each op family
    ("elementwise_int", lambda: K.exp(K.placeholder(shape=(3,), dtype="int32")), ("exp", "int32")),
    ("softmax_int", lambda: K.softmax(K.constant([[1, 2]], dtype="int32")), ("softmax", "float")),
    (
        "matmul_bool",
        lambda: K.dot(K.constant([[True]], dtype="bool"), K.constant([[True]], dtype="bool")),
        ("bool",),
    ),
    ("conv_int", _conv_int, ("float", "int32")),
    ("conv_mixed_float", _conv_mixed, ("float32", "float64")),
    (
        "pool_int",
        lambda: K.pool2d(K.constant(np.ones((1, 2, 2, 1)), dtype="int32"), (2, 2)),
        ("float", "int32"),
    ),
    (
        "gather_float_indices",
        lambda: K.gather(K.ones((3, 2)), K.constant([0.5, 1.0])),
        ("indices", "integer"),
    ),
    ("one_hot_float_indices", lambda: K.one_hot(K.constant([0.0, 1.0]), 3), ("indices", "integer")),
    ("cumsum_bool", lambda: K.cumsum(K.constant([True, False], dtype="bool")), ("bool", "cumsum")),
    # malformed updates
    (
        "update_of_a_constant",
        lambda: K.function([], [], updates=[(K.constant(1.0), K.constant(2.0))]),
        ("update", "variable"),
    ),
    (
        "update_not_a_pair",
        lambda: K.function([], [], updates=[(K.variable(np.zeros(2)),)]),
        ("update", "pair"),
    ),
    (
        "update_wrong_static_shape",
        lambda: K.function([], [], updates=[(K.variable(np.zeros((2, 3))), K.zeros((3, 2)))]),
        ("shape",),
    ),
    ("empty_axis_argmax", lambda: K.eval(K.argmax(K.zeros((0, 3)), axis=0)), ("argmax", "empty")),
]


@pytest.mark.parametrize(
    "name,trigger,words",
    CONSTRUCTION_CASES + MORE_CONSTRUCTION_CASES,
    ids=[c[0] for c in CONSTRUCTION_CASES + MORE_CONSTRUCTION_CASES],
)
def test_bad_arguments_raise(name, trigger, words):
    with pytest.raises(BAD) as excinfo:
        trigger()
    assert_mentions(excinfo, *words)
    assert_backend_still_works()


MORE_CALL_CASES = [
    # (id, dtype of the placeholder, feed, words)
    ("complex_to_float", "float32", np.array([1j, 1, 2]), ("complex",)),
    ("int64_overflowing_int32", "int32", np.array([1, 2, 2**40]), ("range", "int32")),
    ("float_too_big_for_int8", "int8", np.array([1.0, 300.0, 2.0]), ("range", "int8")),
    ("negative_to_uint8", "uint8", np.array([1, -1, 2]), ("range", "uint8")),
    ("inf_to_int", "int32", np.array([1.0, np.inf, 2.0]), ("non-integer", "range")),
    # np.asarray([None, 1, 2], dtype=float32) would give NaN for None; TF refuses None.
    ("none_in_list", "float32", [None, 1.0, 2.0], ("NoneType",)),
    ("none_in_object_array", "int32", np.array([1, None, 2], dtype=object), ("NoneType",)),
    ("strings", "float32", ["1", "2", "3"], ("str",)),
]


@pytest.mark.parametrize(
    "name,dtype,feed,words", MORE_CALL_CASES, ids=[c[0] for c in MORE_CALL_CASES]
)
def test_feeds_that_do_not_fit_the_dtype_raise(name, dtype, feed, words):
    """These used to be converted silently (2**40 fed to int32 became 0, complex lost its
    imaginary part); TF refuses them."""
    x = K.placeholder(shape=(3,), dtype=dtype, name="typed_feed")
    f = K.function([x], [x * 2])
    with pytest.raises(BAD) as excinfo:
        f([feed])
    assert_mentions(excinfo, *words)
    assert_mentions(excinfo, "typed_feed")
    np.testing.assert_array_equal(f([np.array([1, 2, 3])])[0], np.array([2, 4, 6], dtype=dtype))


NON_NUMERIC_VALUES = [
    ("variable", lambda v: K.variable(v)),
    ("constant", lambda v: K.constant(v)),
    ("set_value", lambda v: K.set_value(K.variable([0.0, 0.0]), v)),
    ("batch_set_value", lambda v: K.batch_set_value([(K.variable([0.0, 0.0]), v)])),
]


@pytest.mark.parametrize("name,make", NON_NUMERIC_VALUES, ids=[c[0] for c in NON_NUMERIC_VALUES])
@pytest.mark.parametrize(
    "value,words", [([None, 1.0], ("NoneType",)), (["1", "2"], ("str",))], ids=["none", "str"]
)
def test_non_numeric_values_raise(name, make, value, words):
    """NumPy turns None into NaN (and parses numeric strings) when asked for a float array;
    TF refuses both."""
    with pytest.raises(TypeError) as excinfo:
        make(value)
    assert_mentions(excinfo, *words)
    assert_backend_still_works()


def test_object_array_of_numbers_is_fed():
    x = K.placeholder(shape=(3,), dtype="float32")
    f = K.function([x], [x * 2])
    np.testing.assert_array_equal(
        f([np.array([1, 2.5, np.float32(3)], dtype=object)])[0], [2, 5, 6]
    )


def _unfed_rnn(p):
    return K.rnn(lambda inp, s: (inp * p[0], [s[0] + inp]), K.ones((2, 4, 3)), [K.zeros((2, 3))])[1]


UNFED_INSIDE = [
    ("rnn", _unfed_rnn),
    ("map_fn", lambda p: K.map_fn(lambda r: r * p[0], K.ones((2, 3)))),
    ("foldl", lambda p: K.foldl(lambda a, r: a + r * p[0], K.ones((2, 3)), K.zeros((3,)))),
    ("foldr", lambda p: K.foldr(lambda a, r: a + r * p[1], K.ones((2, 3)), K.zeros((3,)))),
    ("py_function", lambda p: K.py_function(lambda a: a * 2, [p], "float32")),
]


@pytest.mark.parametrize("name,build", UNFED_INSIDE, ids=[c[0] for c in UNFED_INSIDE])
def test_unfed_placeholder_inside_a_loop_or_callback_is_named(name, build):
    p = K.placeholder(shape=(2, 3), name="unfed_inside_" + name)
    out = build(p)
    with pytest.raises(BAD) as excinfo:
        K.eval(out)
    assert_mentions(excinfo, "unfed_inside_" + name)
    # fed, the same graph runs
    K.function([p], [out])([np.ones((2, 3), "float32")])
    assert_backend_still_works()


def test_nan_and_inf_feeds_propagate_as_in_numpy():
    x = K.placeholder(shape=(4,))
    xv = np.array([1.0, np.nan, -np.inf, np.inf], dtype=np.float32)
    s, m, a, r, c, g = K.function(
        [x], [K.sum(x), K.max(x), K.argmax(x), K.relu(x), K.clip(x, 0.0, 1.0), K.sigmoid(x)]
    )([xv])
    assert np.isnan(s) and np.isnan(m)
    assert int(a) == 3  # TF's argmax skips the NaN (NumPy's would pick it)
    np.testing.assert_array_equal(r, [1.0, np.nan, 0.0, np.inf])
    np.testing.assert_array_equal(c, [1.0, np.nan, 0.0, 1.0])
    np.testing.assert_array_equal(g[[1, 2, 3]], [np.nan, 0.0, 1.0])
    # a NaN in one row of a softmax does not leak into the others; in its own row it is
    # NaN and the other entries 0 (TF)
    y = K.placeholder(shape=(2, 3))
    sm = K.function([y], [K.softmax(y)])(
        [np.array([[0.0, np.nan, 1.0], [0.0, 1.0, 2.0]], np.float32)]
    )[0]
    np.testing.assert_array_equal(sm[0], [0.0, np.nan, 0.0])
    e = np.exp([0.0, 1.0, 2.0])
    np.testing.assert_allclose(sm[1], e / e.sum(), rtol=1e-6)


def test_empty_feeds_give_empty_results():
    e = K.placeholder(shape=(None, 3))
    z = np.zeros((0, 3), np.float32)
    mean, mx, sm, d, bn = K.function(
        [e],
        [
            K.mean(e),
            K.max(e, axis=0),
            K.softmax(e),
            K.dot(e, K.ones((3, 2))),
            K.batch_normalization(e, K.zeros((3,)), K.ones((3,)), K.zeros((3,)), K.ones((3,))),
        ],
    )([z])
    assert np.isnan(mean)  # numpy: mean of nothing is NaN
    np.testing.assert_array_equal(mx, [-np.inf] * 3)  # TF: max over nothing is -inf
    assert sm.shape == (0, 3) and d.shape == (0, 2) and bn.shape == (0, 3)
    g = K.gradients(K.sum(K.dot(e, K.variable(np.ones((3, 2))))), [e])[0]
    assert K.function([e], [g])([z])[0].shape == (0, 3)


def test_same_padding_over_an_empty_spatial_axis_is_empty():
    """TF: 'same' gives ceil(in / stride) outputs, 0 for an empty axis (this returned 1)."""
    w = K.variable(np.ones((2, 2, 2, 1), np.float32))
    for shape, want in [((1, 0, 3, 2), (1, 0, 3, 1)), ((1, 0, 0, 2), (1, 0, 0, 1))]:
        x = K.variable(np.zeros(shape, np.float32))
        y = K.conv2d(x, w, padding="same")
        assert y.shape == want and K.eval(y).shape == want
        gx, gw = K.gradients(K.sum(y), [x, w])
        assert K.eval(gx).shape == shape
        np.testing.assert_array_equal(K.eval(gw), np.zeros((2, 2, 2, 1)))
        assert K.eval(K.conv2d(x, w, padding="same", strides=(2, 2))).shape[1] == 0
    x1 = K.placeholder(shape=(1, None, 1))
    f = K.function([x1], [K.conv1d(x1, K.constant(np.ones((3, 1, 1), np.float32)), padding="same")])
    assert f([np.zeros((1, 0, 1), np.float32)])[0].shape == (1, 0, 1)
    np.testing.assert_allclose(f([np.ones((1, 2, 1), np.float32)])[0].ravel(), [2.0, 2.0])
    assert K.eval(K.pool2d(K.zeros((1, 0, 0, 2)), (2, 2), padding="same")).shape == (1, 0, 0, 2)
    # 'valid' still refuses a kernel larger than the input
    with pytest.raises(ValueError):
        K.conv2d(K.zeros((1, 0, 3, 2)), w, padding="valid")


def test_sparse_crossentropy_target_count_is_checked_when_fed():
    t = K.placeholder(shape=(None,), dtype="int32")
    o = K.placeholder(shape=(None, 2))
    f = K.function([t, o], [K.sparse_categorical_crossentropy(t, o)])
    with pytest.raises(ValueError) as excinfo:
        f([np.array([0, 1], dtype=np.int32), np.full((1, 2), 0.5, dtype=np.float32)])
    assert "2" in str(excinfo.value) and "1" in str(excinfo.value)
    np.testing.assert_allclose(
        f([np.array([0, 1], np.int32), np.full((2, 2), 0.5, np.float32)])[0],
        [np.log(2.0)] * 2,
        rtol=1e-6,
    )
    # the flattening path (targets of rank 2 against a rank-3 output)
    t2 = K.placeholder(shape=(None, None), dtype="int32")
    o3 = K.placeholder(shape=(None, None, 3))
    g = K.function([t2, o3], [K.sparse_categorical_crossentropy(t2, o3)])
    with pytest.raises(ValueError):
        g([np.zeros((2, 3), np.int32), np.full((2, 2, 3), 1 / 3, np.float32)])
    np.testing.assert_allclose(
        g([np.zeros((2, 2), np.int32), np.full((2, 2, 3), 1 / 3, np.float32)])[0],
        np.full((2, 2), np.log(3.0)),
        rtol=1e-6,
    )


def test_update_of_the_wrong_shape_at_run_time_changes_nothing():
    v = K.variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    w = K.variable(np.zeros(2, np.float32))
    q = K.placeholder(shape=(None, 3))
    f = K.function([q], [K.sum(q)], updates=[(w, w + 1.0), (v, q)])
    with pytest.raises(ValueError) as excinfo:
        f([np.ones((4, 3), np.float32)])
    assert_mentions(excinfo, "shape")
    np.testing.assert_array_equal(K.get_value(v), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(K.get_value(w), [0.0, 0.0])
    f([np.ones((2, 3), np.float32)])
    np.testing.assert_array_equal(K.get_value(v), np.ones((2, 3)))
    np.testing.assert_array_equal(K.get_value(w), [1.0, 1.0])


@pytest.mark.parametrize(
    "ret,words",
    [
        (lambda a: np.ones((5, 5), "float32"), ("shape", "broadcast")),
        (lambda a: "abc", ("abc", "convert", "float")),
    ],
    ids=["wrong_shape", "string"],
)
def test_py_function_returning_garbage_raises(ret, words):
    x = K.placeholder(shape=(2,))
    f = K.function([x], [K.py_function(ret, [x], "float32") + x])
    with pytest.raises(BAD) as excinfo:
        f([np.ones(2, "float32")])
    assert_mentions(excinfo, *words)
    assert_backend_still_works()


@pytest.mark.parametrize(
    "build",
    [
        lambda img: K.resize_images(img, 10**6, 10**6, "channels_last"),
        lambda img: K.tile(img, (1, 10**6, 10**6, 1)),
        lambda img: K.repeat_elements(img, 10**12, 1),
        lambda img: K.spatial_2d_padding(img, ((10**9, 10**9), (10**9, 10**9))),
    ],
    ids=["resize_images", "tile", "repeat_elements", "spatial_2d_padding"],
)
def test_results_larger_than_memory_are_refused_when_built(build):
    # Computing such a result would fail its allocation, which aborts the process.
    img = K.variable(np.ones((1, 4, 4, 2), "float32"))
    with pytest.raises((ValueError, OverflowError), match="memory|out of bounds|too large"):
        K.eval(build(img))
    assert K.eval(K.sum(img)) == 32.0
