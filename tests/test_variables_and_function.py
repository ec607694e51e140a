"""Variables, constants, placeholders, configuration, K.function and its updates,
learning phase, gradients and slicing.

Where the behaviour is not written in the specification documents (docs/spec/), the expectation is TensorFlow's
`tf.keras.backend` in graph mode (DESIGN.md), said next to the test.
"""

import math

import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import check_grad, run

# ---- variable / constant / placeholder -----------------------------------------------------


def test_variable_defaults_to_floatx_and_keeps_value():
    val = np.array([[1, 2], [3, 4]])  # an int array becomes floatx
    v = K.variable(val)
    assert K.dtype(v) == "float32"
    value = K.eval(v)
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, val.astype(np.float32))


def test_variable_dtype_and_name():
    v = K.variable(np.array([[1, 2], [3, 4]]), dtype="float64", name="example_var")
    assert K.dtype(v) == "float64"
    assert "example_var" in v.name
    assert K.eval(v).dtype == np.float64


def test_variable_copies_its_initial_value(rng):
    a = rng.normal(size=(3,)).astype("float32")
    v = K.variable(a)
    expected = a.copy()
    a[:] = 100.0
    np.testing.assert_array_equal(K.get_value(v), expected)


def test_variable_from_scalar_and_list():
    s = K.variable(3.5)
    assert K.int_shape(s) == ()
    assert float(K.eval(s)) == 3.5
    lst = K.variable([1.0, 2.0, 3.0])
    assert K.int_shape(lst) == (3,)
    np.testing.assert_array_equal(K.eval(lst), [1.0, 2.0, 3.0])


def test_constant():
    c = K.constant([1, 2, 3])
    assert K.dtype(c) == "float32"
    np.testing.assert_array_equal(K.eval(c), np.array([1, 2, 3], dtype=np.float32))
    filled = K.constant(2.5, shape=(2, 3))
    assert K.int_shape(filled) == (2, 3)
    np.testing.assert_array_equal(K.eval(filled), np.full((2, 3), 2.5, dtype=np.float32))
    c64 = K.constant(np.arange(6).reshape(2, 3), dtype="float64")
    assert K.dtype(c64) == "float64"
    np.testing.assert_array_equal(K.eval(c64), np.arange(6).reshape(2, 3))


def test_placeholder_shapes_and_dtypes(rng):
    p = K.placeholder(shape=(None, 4, 5))
    assert K.int_shape(p) == (None, 4, 5)
    assert K.ndim(p) == 3
    assert K.dtype(p) == "float32"
    q = K.placeholder(ndim=3)
    assert K.int_shape(q) == (None, None, None)
    r = K.placeholder(shape=(2, 3), ndim=5)  # shape wins over ndim (keras_backends.md)
    assert K.int_shape(r) == (2, 3)
    d = K.placeholder(shape=(2,), dtype="float64", name="my_input")
    assert K.dtype(d) == "float64"
    assert "my_input" in d.name
    i = K.placeholder(shape=(3,), dtype="int32")
    assert K.dtype(i) == "int32"


def test_placeholder_with_none_dims_accepts_any_size(rng):
    p = K.placeholder(ndim=2)
    f = K.function([p], [K.sum(p, axis=1) * 2.0])
    for shape in [(3, 4), (1, 7), (5, 1)]:
        a = rng.normal(size=shape).astype("float32")
        np.testing.assert_allclose(
            f([a])[0], a.astype(np.float64).sum(axis=1) * 2.0, rtol=1e-5, atol=1e-5
        )


def test_is_placeholder():
    p = K.placeholder(shape=(2,))
    assert K.is_placeholder(p)
    assert not K.is_placeholder(K.variable([1.0, 2.0]))
    assert not K.is_placeholder(p * 2)
    assert not K.is_placeholder(np.zeros(2))


def test_is_keras_tensor():
    # keras_backends.md `is_keras_tensor`: a numpy array is not a symbolic tensor -> ValueError;
    # a backend variable or placeholder is symbolic but not a Keras tensor -> False.
    with pytest.raises(ValueError):
        K.is_keras_tensor(np.array([1, 2]))
    assert not K.is_keras_tensor(K.variable(np.array([1, 2])))
    assert not K.is_keras_tensor(K.placeholder(shape=(2, 4, 5)))


# ---- filled / random variables ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [None, "float32", "float64"])
def test_zeros_ones_eye(dtype):
    expected_dtype = dtype or "float32"
    for kfn, nfn in [(K.zeros, np.zeros), (K.ones, np.ones)]:
        v = kfn((3, 4), dtype=dtype)
        assert K.dtype(v) == expected_dtype
        value = K.eval(v)
        assert value.dtype == np.dtype(expected_dtype)
        np.testing.assert_array_equal(value, nfn((3, 4)))
    e = K.eye(3, dtype=dtype)
    assert K.dtype(e) == expected_dtype
    np.testing.assert_array_equal(K.eval(e), np.eye(3))


def test_zeros_and_ones_are_variables():
    v = K.zeros((2, 2))
    K.set_value(v, np.array([[1, 2], [3, 4]]))
    np.testing.assert_array_equal(K.get_value(v), [[1, 2], [3, 4]])
    w = K.ones((2,))
    f = K.function([], [w], updates=[(w, w * 3.0)])
    f([])
    np.testing.assert_array_equal(K.get_value(w), [3.0, 3.0])


def test_zeros_like_ones_like(rng):
    a = rng.normal(size=(2, 3))
    v = K.variable(a, dtype="float64")
    for kfn, nfn in [(K.zeros_like, np.zeros_like), (K.ones_like, np.ones_like)]:
        t = kfn(v)
        assert K.dtype(t) == "float64"
        assert K.int_shape(t) == (2, 3)
        np.testing.assert_array_equal(K.eval(t), nfn(a))
        t32 = kfn(v, dtype="float32")
        assert K.dtype(t32) == "float32"
        assert K.eval(t32).dtype == np.float32
    # On a placeholder with an unknown dim, the runtime shape is used.
    p = K.placeholder(shape=(None, 3))
    out = run([p], [K.ones_like(p)], [np.zeros((4, 3), dtype="float32")])[0]
    np.testing.assert_array_equal(out, np.ones((4, 3)))


def test_identity(rng):
    a = rng.normal(size=(2, 3)).astype("float32")
    v = K.variable(a)
    t = K.identity(v)
    np.testing.assert_array_equal(K.eval(t), a)
    p = K.placeholder(shape=(2, 3))
    np.testing.assert_array_equal(run([p], [K.identity(p)], [a])[0], a)


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_random_uniform_variable_statistics(dtype):
    low, high = -2.0, 3.0
    v = K.random_uniform_variable((200, 50), low, high, dtype=dtype, seed=7)
    assert K.int_shape(v) == (200, 50)
    assert K.dtype(v) == (dtype or "float32")
    x = K.eval(v).astype(np.float64)
    assert x.min() >= low and x.max() <= high
    width = high - low
    n = x.size
    assert abs(x.mean() - (low + high) / 2) < 5 * width / math.sqrt(12 * n)
    assert abs(x.std() - width / math.sqrt(12)) < 0.03 * width / math.sqrt(12)
    # roughly flat: each tenth of the interval gets about a tenth of the samples
    counts, _ = np.histogram(x, bins=10, range=(low, high))
    assert np.all(np.abs(counts - n / 10) < 5 * math.sqrt(n / 10))


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_random_normal_variable_statistics(dtype):
    mean, scale = 1.5, 0.5
    v = K.random_normal_variable((100, 100), mean, scale, dtype=dtype, seed=11)
    assert K.int_shape(v) == (100, 100)
    assert K.dtype(v) == (dtype or "float32")
    x = K.eval(v).astype(np.float64)
    n = x.size
    assert abs(x.mean() - mean) < 5 * scale / math.sqrt(n)
    assert abs(x.std() - scale) < 0.03 * scale
    # about 68.3% within one standard deviation
    inside = np.mean(np.abs(x - mean) < scale)
    assert abs(inside - 0.6827) < 0.02


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: K.random_uniform_variable((4, 5), 0, 1, seed=seed),
        lambda seed: K.random_normal_variable((4, 5), 0, 1, seed=seed),
    ],
    ids=["uniform", "normal"],
)
def test_random_variable_seeds(make):
    a = K.eval(make(123))
    b = K.eval(make(123))
    c = K.eval(make(124))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # Without a seed, two variables (two layers' weights) must not be identical.
    assert not np.array_equal(K.eval(make(None)), K.eval(make(None)))


# ---- shape functions, dtype, cast ----------------------------------------------------------


def test_count_params_int_shape_ndim():
    v = K.zeros((2, 3))
    assert K.count_params(v) == 6
    p = K.placeholder(shape=(2, 4, 5))
    assert K.count_params(p) == 40
    assert K.int_shape(v) == (2, 3)
    assert K.ndim(v) == 2
    assert K.ndim(p) == 3
    assert K.int_shape(K.variable(1.0)) == ()


def test_shape_is_a_tensor_with_runtime_values(rng):
    v = K.variable(np.zeros((2, 5)))
    s = K.shape(v)
    assert K.int_shape(s) == (2,)
    value = K.eval(s)
    assert np.issubdtype(value.dtype, np.integer)
    np.testing.assert_array_equal(value, [2, 5])
    p = K.placeholder(shape=(None, 3))
    f = K.function([p], [K.shape(p)])
    np.testing.assert_array_equal(f([np.zeros((7, 3), "float32")])[0], [7, 3])
    np.testing.assert_array_equal(f([np.zeros((2, 3), "float32")])[0], [2, 3])


def test_cast(rng):
    a = np.array([1.7, -1.7, 2.5, -0.5, 0.0, 3.0], dtype=np.float32)
    p = K.placeholder(shape=(6,))
    outs = [K.cast(p, "float64"), K.cast(p, "float16"), K.cast(p, "int32")]
    assert [K.dtype(t) for t in outs] == ["float64", "float16", "int32"]
    assert K.dtype(p) == "float32"  # cast is not in place
    v64, v16, vi = run([p], outs, [a])
    assert v64.dtype == np.float64 and v16.dtype == np.float16 and vi.dtype == np.int32
    np.testing.assert_array_equal(v64, a.astype(np.float64))
    np.testing.assert_array_equal(v16, a.astype(np.float16))
    np.testing.assert_array_equal(vi, a.astype(np.int32))  # truncation toward zero
    ip = K.placeholder(shape=(3,), dtype="int32")
    out = K.cast(ip, "float32") * 0.5
    np.testing.assert_array_equal(
        run([ip], [out], [np.array([1, 2, -3], np.int32)])[0], [0.5, 1.0, -1.5]
    )
    b = K.cast(K.greater(p, 0.0), "float32")
    np.testing.assert_array_equal(run([p], [b], [a])[0], (a > 0).astype(np.float32))


def test_float16_casts_round_as_numpy(rng):
    # Ties to even, the largest finite value and overflow to inf, subnormals, signed zero,
    # inf and nan; then large arrays (converted in parallel) and a transposed input.
    ulp = 2.0**-10
    edge = np.array(
        [
            1 + ulp / 2,
            1 + 3 * ulp / 2,
            65504,
            65519,
            65520,
            -65536,
            2.0**-24,
            2.0**-25,
            3 * 2.0**-26,
            1e-9,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            0.1,
            -7.3,
        ],
        np.float32,
    )
    big = (rng.standard_normal((300, 701)) * 1000).astype(np.float32)
    for a in (edge, big):
        p = K.placeholder(shape=a.shape)
        v16, back = run([p], [K.cast(p, "float16"), K.cast(K.cast(p, "float16"), "float32")], [a])
        assert v16.dtype == np.float16 and back.dtype == np.float32
        np.testing.assert_array_equal(v16, a.astype(np.float16))
        np.testing.assert_array_equal(back, a.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(np.signbit(v16), np.signbit(a.astype(np.float16)))
    p = K.placeholder(shape=big.shape)
    (t16,) = run([p], [K.cast(K.transpose(p), "float16")], [big])
    np.testing.assert_array_equal(t16, big.T.astype(np.float16))
    for shape in ((0, 1, 1, 2), (1, 5, 1), (3, 0)):
        e = rng.standard_normal(shape).astype(np.float32)
        p = K.placeholder(shape=shape)
        (t16,) = run(
            [p],
            [K.cast(K.permute_dimensions(p, (len(shape) - 1, *range(len(shape) - 1))), "float16")],
            [e],
        )
        np.testing.assert_array_equal(t16, np.moveaxis(e, -1, 0).astype(np.float16))
    h = K.placeholder(shape=big.shape, dtype="float16")
    (w,) = run([h], [K.cast(K.transpose(h), "float32") * 2.0], [big.astype(np.float16)])
    np.testing.assert_array_equal(w, big.astype(np.float16).T.astype(np.float32) * 2)


def test_cast_of_variable_is_a_tensor_with_the_values():
    v = K.variable(np.array([[1.25, 2.5]]))
    t = K.cast(v, "float64")
    assert K.dtype(t) == "float64"
    assert K.dtype(v) == "float32"
    np.testing.assert_array_equal(K.eval(t), [[1.25, 2.5]])


# ---- eval / get_value / set_value ------------------------------------------------------------


def test_get_set_value(rng):
    v = K.variable(np.zeros((2, 3)))
    new = rng.normal(size=(2, 3))  # float64 into a float32 variable
    K.set_value(v, new)
    assert K.dtype(v) == "float32"
    value = K.get_value(v)
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, new.astype(np.float32))
    np.testing.assert_array_equal(K.eval(v), new.astype(np.float32))
    # An expression built before set_value reads the new value when evaluated.
    doubled = v * 2.0
    K.set_value(v, np.ones((2, 3)))
    np.testing.assert_array_equal(K.eval(doubled), np.full((2, 3), 2.0))


def test_batch_get_and_set_value(rng):
    a, b = K.variable(np.zeros(3)), K.variable(np.zeros((2, 2)), dtype="float64")
    va, vb = rng.normal(size=3), rng.normal(size=(2, 2))
    K.batch_set_value([(a, va), (b, vb)])
    got = K.batch_get_value([a, b])
    assert isinstance(got, list) and len(got) == 2
    np.testing.assert_array_equal(got[0], va.astype(np.float32))
    np.testing.assert_array_equal(got[1], vb)
    assert got[1].dtype == np.float64
    assert K.batch_get_value([]) == []


def test_np_asarray_of_tensors(rng):
    a = rng.normal(size=(2, 3)).astype("float32")
    v = K.variable(a)
    arr = np.asarray(v)
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
    np.testing.assert_array_equal(arr, a)
    expr = np.asarray(K.constant(a) * 2.0 + v)
    np.testing.assert_allclose(expr, 3.0 * a.astype(np.float64), rtol=1e-6)


# ---- configuration ----------------------------------------------------------------------------


def test_config_defaults():
    # keras.json defaults in keras_backends.md: floatx float32, epsilon 1e-07, channels_last.
    assert K.floatx() == "float32"
    assert K.epsilon() == pytest.approx(1e-7)
    assert K.image_data_format() == "channels_last"


def test_set_floatx_changes_defaults():
    K.set_floatx("float64")
    assert K.floatx() == "float64"
    assert K.dtype(K.variable([1.0])) == "float64"
    assert K.dtype(K.placeholder(shape=(2,))) == "float64"
    assert K.dtype(K.zeros((2,))) == "float64"
    assert K.dtype(K.constant(1.0)) == "float64"
    assert K.cast_to_floatx(np.array([1.0], dtype=np.float32)).dtype == np.float64
    K.set_floatx("float16")
    assert K.floatx() == "float16"
    for bad in ["float8", "int32", "double"]:
        with pytest.raises(ValueError):
            K.set_floatx(bad)
    assert K.floatx() == "float16"


def test_epsilon_and_image_data_format():
    K.set_epsilon(1e-5)
    assert K.epsilon() == pytest.approx(1e-5)
    K.set_image_data_format("channels_first")
    assert K.image_data_format() == "channels_first"
    K.set_image_data_format("channels_last")
    assert K.image_data_format() == "channels_last"
    with pytest.raises(ValueError):
        K.set_image_data_format("channels_middle")
    assert K.image_data_format() == "channels_last"


def test_cast_to_floatx():
    arr = np.array([1.0, 2.0], dtype="float64")
    new = K.cast_to_floatx(arr)
    assert isinstance(new, np.ndarray)
    assert new.dtype == np.float32
    np.testing.assert_array_equal(new, [1.0, 2.0])


def test_backend_name():
    name = K.backend()
    assert isinstance(name, str) and name


def test_get_uid_and_reset_uids():
    K.reset_uids()
    assert K.get_uid("dense") == 1
    assert K.get_uid("dense") == 2
    assert K.get_uid("conv") == 1
    assert K.get_uid("dense") == 3
    K.reset_uids()
    assert K.get_uid("dense") == 1


def test_clear_session_keeps_user_variables(rng):
    a = rng.normal(size=(3,)).astype("float32")
    v = K.variable(a)
    K.get_uid("layer")
    K.clear_session()
    assert K.get_uid("layer") == 1  # uid counters are reset
    np.testing.assert_array_equal(K.get_value(v), a)  # held variables still work
    np.testing.assert_array_equal(K.eval(v * 2.0), 2.0 * a)


def test_manual_variable_initialization():
    try:
        K.manual_variable_initialization(True)
        v = K.variable([1.0, 2.0])
        K.manual_variable_initialization(False)
        w = K.variable([3.0])
        np.testing.assert_array_equal(K.get_value(w), [3.0])
        np.testing.assert_array_equal(K.get_value(v), [1.0, 2.0])
    finally:
        K.manual_variable_initialization(False)


# ---- K.function ---------------------------------------------------------------------------------


def test_function_returns_list_of_numpy_arrays(rng):
    x = K.placeholder(shape=(None, 3))
    y = K.placeholder(shape=(None, 3))
    f = K.function([x, y], [x + y, x * y], name="f")
    a = rng.normal(size=(2, 3)).astype("float32")
    b = rng.normal(size=(2, 3)).astype("float32")
    out = f([a, b])
    assert isinstance(out, list) and len(out) == 2
    assert all(isinstance(o, np.ndarray) for o in out)
    np.testing.assert_allclose(out[0], a + b, rtol=1e-6)
    np.testing.assert_allclose(out[1], a * b, rtol=1e-6)
    # Calling again with new values gives new results (nothing stale is cached).
    out2 = f([b, b])
    np.testing.assert_allclose(out2[0], b + b, rtol=1e-6)


def test_function_converts_fed_arrays_to_the_placeholder_dtype(rng):
    # Keras feeds whatever the user passes (float64 data, int labels, Python scalars)
    # to float32 placeholders; as in TF the values are converted, the result is float32.
    x = K.placeholder(shape=(None, 2))
    s = K.placeholder(shape=())
    f = K.function([x, s], [x * s])
    a = rng.normal(size=(3, 2))  # float64
    out = f([a, 2])[0]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, a.astype(np.float32) * 2, rtol=1e-6)
    out = f([np.array([[1, 2], [3, 4]]), np.float64(0.5)])[0]  # int64 data
    np.testing.assert_array_equal(out, [[0.5, 1.0], [1.5, 2.0]])


def test_function_accepts_tuple_inputs(rng):
    x = K.placeholder(shape=(2,))
    f = K.function((x,), [x * 3.0])
    np.testing.assert_allclose(f([np.array([1.0, 2.0], "float32")])[0], [3.0, 6.0])


def test_function_updates_use_pre_call_values():
    # DESIGN.md: all outputs and all update values are computed from the values before
    # the call, then the updates are assigned together.
    a = K.variable(np.array([1.0, 2.0]))
    b = K.variable(np.array([10.0, 20.0]))
    f = K.function([], [a, b, a + b], updates=[(a, b), (b, a)])
    out = f([])
    np.testing.assert_array_equal(out[0], [1.0, 2.0])  # outputs see old values
    np.testing.assert_array_equal(out[1], [10.0, 20.0])
    np.testing.assert_array_equal(out[2], [11.0, 22.0])
    np.testing.assert_array_equal(K.get_value(a), [10.0, 20.0])  # swapped
    np.testing.assert_array_equal(K.get_value(b), [1.0, 2.0])
    f([])
    np.testing.assert_array_equal(K.get_value(a), [1.0, 2.0])
    np.testing.assert_array_equal(K.get_value(b), [10.0, 20.0])


def test_function_update_depends_on_input(rng):
    v = K.variable(np.zeros(3))
    x = K.placeholder(shape=(3,))
    f = K.function([x], [K.sum(v)], updates=[(v, v + x)])
    total = np.zeros(3)
    for _ in range(3):
        a = rng.normal(size=3).astype("float32")
        before = f([a])[0]
        np.testing.assert_allclose(before, total.sum(), rtol=1e-5, atol=1e-6)
        total = total + a
        np.testing.assert_allclose(K.get_value(v), total, rtol=1e-5, atol=1e-6)


def test_update_ops_in_function():
    v = K.variable(np.array([1.0, 2.0]))
    w = K.variable(np.array([5.0, 5.0]))
    u = K.variable(np.array([0.0, 0.0]))
    it = K.variable(0.0)
    # increments given as a NumPy array, a tensor and a Python int (Keras optimizers
    # write `K.update_add(self.iterations, 1)`)
    ops = [
        K.update(v, v * 10.0),
        K.update_add(w, np.array([1.0, 2.0])),
        K.update_sub(u, K.constant([3.0, 4.0])),
        K.update_add(it, 1),
    ]
    # graph mode: building an update op does not assign anything yet
    np.testing.assert_array_equal(K.get_value(v), [1.0, 2.0])
    np.testing.assert_array_equal(K.get_value(w), [5.0, 5.0])
    f = K.function([], [v, w, u], updates=ops)
    out = f([])
    np.testing.assert_array_equal(out[0], [1.0, 2.0])
    np.testing.assert_array_equal(out[1], [5.0, 5.0])
    np.testing.assert_array_equal(out[2], [0.0, 0.0])
    np.testing.assert_array_equal(K.get_value(v), [10.0, 20.0])
    np.testing.assert_array_equal(K.get_value(w), [6.0, 7.0])
    np.testing.assert_array_equal(K.get_value(u), [-3.0, -4.0])
    f([])
    np.testing.assert_array_equal(K.get_value(v), [100.0, 200.0])
    np.testing.assert_array_equal(K.get_value(w), [7.0, 9.0])
    np.testing.assert_array_equal(K.get_value(u), [-6.0, -8.0])
    assert float(K.get_value(it)) == 2.0


def test_moving_average_update(rng):
    # TF semantics: x <- x * momentum + value * (1 - momentum)
    x0 = rng.normal(size=(4,))
    x = K.variable(x0, dtype="float64")
    val = K.placeholder(shape=(4,), dtype="float64")
    f = K.function([val], [K.sum(val)], updates=[K.moving_average_update(x, val, 0.9)])
    expected = x0.copy()
    for _ in range(3):
        b = rng.normal(size=(4,))
        f([b])
        expected = expected * 0.9 + b * (1 - 0.9)
        np.testing.assert_allclose(K.get_value(x), expected, rtol=1e-6)


def test_moving_average_update_rounds_as_tensorflow(rng):
    # Keras 2.3.1's TF backend: x - (x - value) * decay, decay = float32(1 - momentum);
    # float32 results equal to the bit over many steps (x * m + v * (1 - m) drifts by ulps)
    x0 = rng.normal(size=(4096,)).astype(np.float32)
    x = K.variable(x0)
    val = K.placeholder(shape=(4096,))
    f = K.function([val], [], updates=[K.moving_average_update(x, val, 0.99)])
    expected = x0.copy()
    decay = np.float32(1.0 - 0.99)
    for _ in range(20):
        b = rng.normal(size=(4096,)).astype(np.float32)
        f([b])
        expected = expected - (expected - b) * decay
    np.testing.assert_array_equal(K.get_value(x), expected)


def test_function_rejects_unknown_kwarg():
    x = K.placeholder(shape=(2,))
    with pytest.raises(ValueError) as excinfo:
        K.function([x], [x * 2], not_a_real_argument=1)
    assert "not_a_real_argument" in str(excinfo.value)


def test_function_rejects_non_list_inputs():
    x = K.placeholder(shape=(2,))
    with pytest.raises(TypeError):
        K.function(x, [x * 2])


# ---- learning phase ------------------------------------------------------------------------------


def test_learning_phase_defaults_to_zero_and_can_be_fed(rng):
    x = K.placeholder(shape=(3,))
    out = K.in_train_phase(x * 2.0, x * 3.0)
    a = np.array([1.0, 2.0, 3.0], dtype="float32")
    np.testing.assert_allclose(run([x], [out], [a])[0], a * 3.0)  # not fed: test phase
    lp = K.learning_phase()
    f = K.function([x, lp], [out])
    np.testing.assert_allclose(f([a, 1])[0], a * 2.0)
    np.testing.assert_allclose(f([a, 0])[0], a * 3.0)


def test_set_learning_phase_fixes_it():
    x = K.placeholder(shape=(2,))
    a = np.array([1.0, -1.0], dtype="float32")
    try:
        K.set_learning_phase(1)
        out = K.in_train_phase(x + 1.0, x - 1.0)
        np.testing.assert_allclose(run([x], [out], [a])[0], a + 1.0)
        with pytest.raises(ValueError):
            K.set_learning_phase(2)  # keras_backends.md: neither 0 nor 1 -> ValueError
    finally:
        K.clear_session()
    # As in TF, clear_session makes the learning phase a default-0 input again.
    x = K.placeholder(shape=(2,))
    out = K.in_train_phase(x + 1.0, x - 1.0)
    np.testing.assert_allclose(run([x], [out], [a])[0], a - 1.0)


# ---- gradients --------------------------------------------------------------------------------


def test_gradients_of_variables_and_none_for_unconnected(rng):
    a0, b0 = rng.normal(size=(3,)), rng.normal(size=(2,))
    a = K.variable(a0, dtype="float64")
    b = K.variable(b0, dtype="float64")
    loss = K.sum(K.square(a)) * 3.0
    grads = K.gradients(loss, [a, b])
    assert isinstance(grads, list) and len(grads) == 2
    assert grads[1] is None  # TF: None for an unconnected input
    np.testing.assert_allclose(K.eval(grads[0]), 6.0 * a0, rtol=1e-12)
    f = K.function([], [grads[0]])
    np.testing.assert_allclose(f([])[0], 6.0 * a0, rtol=1e-12)


def test_gradient_descent_step_with_function_updates(rng):
    # The pattern every Keras optimizer uses: gradients + K.function updates.
    w0 = rng.normal(size=(3,))
    target = rng.normal(size=(3,))
    w = K.variable(w0, dtype="float64")
    t = K.placeholder(shape=(3,), dtype="float64")
    loss = K.sum(K.square(w - t))
    g = K.gradients(loss, [w])[0]
    step = K.function([t], [loss], updates=[K.update_sub(w, 0.1 * g)])
    expected = w0.copy()
    for _ in range(5):
        out = step([target])[0]
        np.testing.assert_allclose(out, np.sum((expected - target) ** 2), rtol=1e-12)
        expected = expected - 0.1 * 2 * (expected - target)
    np.testing.assert_allclose(K.get_value(w), expected, rtol=1e-12)


def test_stop_gradient(rng):
    x0 = rng.normal(size=(4,))
    x = K.placeholder(shape=(4,), dtype="float64")
    y = K.sum(x * K.stop_gradient(x))  # d/dx = x, not 2x
    g = K.gradients(y, [x])[0]
    np.testing.assert_allclose(run([x], [g, y], [x0])[0], x0, rtol=1e-12)
    np.testing.assert_allclose(run([x], [y], [x0])[0], np.sum(x0 * x0), rtol=1e-12)
    both = list(K.stop_gradient([x, x * 2.0]))  # a list in, a list out
    assert len(both) == 2
    np.testing.assert_allclose(run([x], [both[1]], [x0])[0], 2 * x0, rtol=1e-12)


def test_second_order_gradient(rng):
    x0 = rng.uniform(-2, 2, size=(5,))
    x = K.placeholder(shape=(5,), dtype="float64")
    g = K.gradients(K.sum(x**3), [x])[0]  # 3 x^2
    gg = K.gradients(K.sum(g), [x])[0]  # 6 x
    v_g, v_gg = run([x], [g, gg], [x0])
    np.testing.assert_allclose(v_g, 3 * x0**2, rtol=1e-10)
    np.testing.assert_allclose(v_gg, 6 * x0, rtol=1e-10)


def test_second_order_gradient_of_composite(rng):
    # Hessian-vector product of sum(tanh(x) * x) by differentiating <grad, v>.
    x0, v0 = rng.normal(size=(4,)), rng.normal(size=(4,))
    x = K.placeholder(shape=(4,), dtype="float64")
    g = K.gradients(K.sum(K.tanh(x) * x), [x])[0]
    hv = K.gradients(K.sum(g * K.constant(v0, dtype="float64")), [x])[0]
    th = np.tanh(x0)
    sech2 = 1 - th**2
    # d2/dx2 [x tanh x] = 2 sech^2 x - 2 x tanh x sech^2 x
    expected = (2 * sech2 - 2 * x0 * th * sech2) * v0
    np.testing.assert_allclose(run([x], [hv], [x0])[0], expected, rtol=1e-10)


def test_unfed_placeholder_error_names_it():
    p = K.placeholder(shape=(2,), name="my_unfed_input")
    with pytest.raises((ValueError, TypeError)) as excinfo:
        K.eval(p * 2.0)
    assert "my_unfed_input" in str(excinfo.value)
    q = K.placeholder(shape=(2,), name="other_fed_input")
    with pytest.raises((ValueError, TypeError)) as excinfo:
        f = K.function([q], [q + p])
        f([np.zeros(2, "float32")])
    assert "my_unfed_input" in str(excinfo.value)


# ---- slicing ----------------------------------------------------------------------------------

E = Ellipsis
SLICES = [
    1,
    -1,
    slice(1, 3),
    slice(None, None, 2),
    slice(None, None, -1),
    slice(3, 0, -2),
    (slice(None), 1),
    (slice(None), slice(-2, None)),
    (E, 0),
    None,
    (slice(None), None, slice(2, 4)),
    (1, E, slice(None, None, 2)),
    (0, 1, 2),
    (slice(1, -1), slice(None, None, 3), -1),
    (E, None),
    slice(-3, -1),
    (slice(None), slice(None, None, -2), slice(1, 5, 2)),
]


@pytest.mark.parametrize("index", SLICES, ids=repr)
def test_slicing_matches_numpy(index, rng):
    a = rng.normal(size=(4, 5, 6)).astype("float32")
    p = K.placeholder(shape=(4, 5, 6))
    out = p[index]
    ref = a[index]
    assert K.int_shape(out) == ref.shape
    value = run([p], [out], [a])[0]
    np.testing.assert_array_equal(value, ref)
    np.testing.assert_array_equal(K.eval(K.variable(a)[index]), ref)


@pytest.mark.parametrize(
    "index",
    [
        1,
        slice(None, None, -1),
        (slice(None), 1),
        (1, E, slice(None, None, 2)),
        (slice(1, -1), None, -1),
        (slice(None), slice(None, None, -2), slice(1, 5, 2)),
    ],
    ids=repr,
)
def test_slicing_gradient(index, rng):
    check_grad(lambda t: t[index], [rng.normal(size=(4, 5, 6))])


def test_slicing_with_unknown_batch_dim(rng):
    p = K.placeholder(shape=(None, 5))
    out = p[:, 1:3]
    assert K.int_shape(out) == (None, 2)
    f = K.function([p], [out, p[-1]])
    for batch in (3, 6):
        a = rng.normal(size=(batch, 5)).astype("float32")
        v, last = f([a])
        np.testing.assert_array_equal(v, a[:, 1:3])
        np.testing.assert_array_equal(last, a[-1])
