"""The runnable examples of the specification documents (docs/spec/), one test each.

tf_keras_backend_function.md: tf.keras.backend.function; tf_keras_backend_module.md: the
tf.keras.backend module index (no examples); k_function_on_a_keras_model.md: a K.function
walk-through on a Keras model; tf_py_function.md: tf.py_function (tests/test_pyfunc.py);
keras_backends.md: the Keras "backends" page with the backend function docs.
Golden values are the documented outputs; where a doc shows random numbers only the
documented shape/dtype/range is checked. Examples that need Keras layers/models, sparse
tensors, conv, rnn, ctc or py_function are not here.
"""

import numpy as np
import pytest
from ferrokeras import backend as K

# ---- keras_backends.md, "Using the abstract Keras backend to write new code" -------------------------


def test_intro_placeholders():
    inputs = K.placeholder(shape=(2, 4, 5))
    assert K.int_shape(inputs) == (2, 4, 5)
    inputs = K.placeholder(shape=(None, 4, 5))
    assert K.int_shape(inputs) == (None, 4, 5)
    inputs = K.placeholder(ndim=3)
    assert K.int_shape(inputs) == (None, None, None)


def test_intro_variables():
    val = np.random.default_rng(0).random((3, 4, 5))
    var = K.variable(value=val)
    np.testing.assert_allclose(K.eval(var), val.astype(np.float32))
    var = K.zeros(shape=(3, 4, 5))
    np.testing.assert_array_equal(K.eval(var), np.zeros((3, 4, 5)))
    var = K.ones(shape=(3, 4, 5))
    np.testing.assert_array_equal(K.eval(var), np.ones((3, 4, 5)))


def test_intro_tensor_arithmetic():
    b = K.random_uniform_variable(shape=(3, 4), low=0, high=1)
    c = K.random_normal_variable(shape=(3, 4), mean=0, scale=1)
    d = K.random_normal_variable(shape=(3, 4), mean=0, scale=1)
    vb, vc, vd = (K.eval(t).astype(np.float64) for t in (b, c, d))
    assert np.all((vb >= 0) & (vb <= 1))

    a = b + c * K.abs(d)
    va = vb + vc * np.abs(vd)
    np.testing.assert_allclose(K.eval(a), va, rtol=1e-5, atol=1e-6)
    c2 = K.dot(a, K.transpose(b))
    assert K.int_shape(c2) == (3, 3)
    np.testing.assert_allclose(K.eval(c2), va @ vb.T, rtol=1e-5, atol=1e-5)
    a2 = K.sum(b, axis=1)
    np.testing.assert_allclose(K.eval(a2), vb.sum(axis=1), rtol=1e-5, atol=1e-6)
    a3 = K.softmax(b)
    e = np.exp(vb - vb.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(K.eval(a3), e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)
    a4 = K.concatenate([b, c2], axis=-1)
    assert K.int_shape(a4) == (3, 7)
    np.testing.assert_allclose(
        K.eval(a4), np.concatenate([vb, va @ vb.T], axis=-1), rtol=1e-5, atol=1e-5
    )


# ---- keras_backends.md, function by function ----------------------------------------------------------


def test_is_sparse_dense_placeholder():
    a = K.placeholder((2, 2), sparse=False)
    assert K.is_sparse(a) is False


def test_variable_example():
    val = np.array([[1, 2], [3, 4]])
    kvar = K.variable(value=val, dtype="float64", name="example_var")
    assert K.dtype(kvar) == "float64"
    assert "example_var" in str(kvar.name)  # doc: print(kvar) -> example_var
    value = kvar.eval()  # doc: kvar.eval()
    assert value.dtype == np.float64
    np.testing.assert_array_equal(value, [[1.0, 2.0], [3.0, 4.0]])


def test_is_keras_tensor_example():
    np_var = np.array([1, 2])
    with pytest.raises(ValueError):  # "A numpy array is not a symbolic tensor."
        K.is_keras_tensor(np_var)
    keras_var = K.variable(np_var)
    assert K.is_keras_tensor(keras_var) is False
    keras_placeholder = K.placeholder(shape=(2, 4, 5))
    assert K.is_keras_tensor(keras_placeholder) is False


def test_placeholder_example():
    input_ph = K.placeholder(shape=(2, 4, 5))
    assert input_ph._keras_shape == (2, 4, 5)
    assert K.int_shape(input_ph) == (2, 4, 5)
    assert K.dtype(input_ph) == "float32"


def test_shape_example():
    val = np.array([[1, 2], [3, 4]])
    kvar = K.variable(value=val)
    inputs = K.placeholder(shape=(2, 4, 5))
    assert K.int_shape(K.shape(kvar)) == (2,)
    assert K.int_shape(K.shape(inputs)) == (3,)
    s = K.eval(K.shape(kvar))
    np.testing.assert_array_equal(s, [2, 2])
    assert s.dtype == np.int32  # doc: array([2, 2], dtype=int32)
    # A fully known static shape evaluates without feeding the placeholder.
    np.testing.assert_array_equal(K.eval(K.shape(inputs)), [2, 4, 5])


def test_int_shape_example():
    inputs = K.placeholder(shape=(2, 4, 5))
    assert K.int_shape(inputs) == (2, 4, 5)
    kvar = K.variable(value=np.array([[1, 2], [3, 4]]))
    assert K.int_shape(kvar) == (2, 2)


def test_ndim_example():
    inputs = K.placeholder(shape=(2, 4, 5))
    kvar = K.variable(value=np.array([[1, 2], [3, 4]]))
    assert K.ndim(inputs) == 3
    assert K.ndim(kvar) == 2


def test_dtype_example():
    assert K.dtype(K.placeholder(shape=(2, 4, 5))) == "float32"
    assert K.dtype(K.placeholder(shape=(2, 4, 5), dtype="float32")) == "float32"
    assert K.dtype(K.placeholder(shape=(2, 4, 5), dtype="float64")) == "float64"
    # The doc shows TF1's 'float32_ref' for variables; TF 2's tf.keras gives 'float32'.
    kvar = K.variable(np.array([[1, 2], [3, 4]]))
    assert K.dtype(kvar) in ("float32", "float32_ref")
    kvar = K.variable(np.array([[1, 2], [3, 4]]), dtype="float32")
    assert K.dtype(kvar) in ("float32", "float32_ref")


def test_eval_example():
    kvar = K.variable(np.array([[1, 2], [3, 4]]), dtype="float32")
    value = K.eval(kvar)
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, [[1.0, 2.0], [3.0, 4.0]])


def test_zeros_example():
    value = K.eval(K.zeros((3, 4)))
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, np.zeros((3, 4)))


def test_ones_example():
    value = K.eval(K.ones((3, 4)))
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, np.ones((3, 4)))


def test_eye_example():
    value = K.eval(K.eye(3))
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, [[1, 0, 0], [0, 1, 0], [0, 0, 1]])


def test_zeros_like_ones_like_example():
    kvar = K.variable(np.random.default_rng(1).random((2, 3)))
    z = K.eval(K.zeros_like(kvar))
    o = K.eval(K.ones_like(kvar))
    assert z.dtype == np.float32 and o.dtype == np.float32
    np.testing.assert_array_equal(z, np.zeros((2, 3)))
    np.testing.assert_array_equal(o, np.ones((2, 3)))


def test_random_uniform_variable_example():
    kvar = K.random_uniform_variable((2, 3), 0, 1)
    value = K.eval(kvar)  # the doc's numbers are random
    assert value.shape == (2, 3) and value.dtype == np.float32
    assert np.all((value >= 0) & (value <= 1))


def test_random_normal_variable_example():
    value = K.eval(K.random_normal_variable((2, 3), 0, 1))
    assert value.shape == (2, 3) and value.dtype == np.float32
    assert np.all(np.isfinite(value))


def test_count_params_example():
    kvar = K.zeros((2, 3))
    assert K.count_params(kvar) == 6
    np.testing.assert_array_equal(K.eval(kvar), np.zeros((2, 3)))


def test_cast_example():
    inp = K.placeholder((2, 3), dtype="float32")
    assert K.dtype(K.cast(inp, dtype="float16")) == "float16"
    assert K.dtype(inp) == "float32"  # "It doesn't work in-place"
    inp = K.cast(inp, dtype="float16")
    assert K.dtype(inp) == "float16"
    assert K.int_shape(inp) == (2, 3)


def test_dot_examples():
    x = K.placeholder(shape=(2, 3))
    y = K.placeholder(shape=(3, 4))
    assert K.int_shape(K.dot(x, y)) == (2, 4)
    x = K.placeholder(shape=(32, 28, 3))
    y = K.placeholder(shape=(3, 4))
    assert K.int_shape(K.dot(x, y)) == (32, 28, 4)
    # Theano-like behavior example
    x = K.random_uniform_variable(shape=(2, 3), low=0, high=1)
    y = K.ones((4, 3, 5))
    xy = K.dot(x, y)
    assert K.int_shape(xy) == (2, 4, 5)
    np.testing.assert_allclose(
        K.eval(xy), np.dot(K.eval(x).astype(np.float64), np.ones((4, 3, 5))), rtol=1e-5, atol=1e-6
    )


def test_batch_dot_examples():
    # x = [[1, 2], [3, 4]], y = [[5, 6], [7, 8]]: batch_dot(x, y, axes=1) = [[17, 53]]
    # "which is the main diagonal of x.dot(y.T)"; rank-1 results become (batch, 1).
    x = K.variable(np.array([[1, 2], [3, 4]]))
    y = K.variable(np.array([[5, 6], [7, 8]]))
    value = K.eval(K.batch_dot(x, y, axes=1))
    np.testing.assert_array_equal(value.ravel(), [17, 53])
    assert value.shape == (2, 1)
    # Shape inference: (100, 20) . (100, 30, 20) with axes (1, 2) -> (100, 30)
    out = K.batch_dot(
        K.placeholder(shape=(100, 20)), K.placeholder(shape=(100, 30, 20)), axes=(1, 2)
    )
    assert K.int_shape(out) == (100, 30)
    x_batch = K.ones(shape=(32, 20, 1))
    y_batch = K.ones(shape=(32, 30, 20))
    xy_batch_dot = K.batch_dot(x_batch, y_batch, axes=[1, 2])
    assert K.int_shape(xy_batch_dot) == (32, 1, 30)
    np.testing.assert_array_equal(K.eval(xy_batch_dot), np.full((32, 1, 30), 20.0))


def test_transpose_examples():
    var = K.variable([[1, 2, 3], [4, 5, 6]])
    value = K.eval(var)
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, [[1, 2, 3], [4, 5, 6]])
    transposed = K.eval(K.transpose(var))
    assert transposed.dtype == np.float32
    np.testing.assert_array_equal(transposed, [[1, 4], [2, 5], [3, 6]])
    inputs = K.placeholder((2, 3))
    assert K.int_shape(inputs) == (2, 3)
    assert K.int_shape(K.transpose(inputs)) == (3, 2)


def test_round_is_half_to_even():
    # keras_backends.md `round`: "In case of tie, the rounding mode used is 'half to even'."
    x = K.constant([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(K.eval(K.round(x)), [-2, -2, -0, 0, 2, 2, 4])


def test_set_learning_phase_rejects_other_values():
    # keras_backends.md `set_learning_phase`: ValueError if value is neither 0 nor 1.
    with pytest.raises(ValueError):
        K.set_learning_phase(3)


def test_set_epsilon_example():
    # The doc's `K.epsilon()` before the call shows 1e-08, the keras.json section of the
    # same page says 1e-07 (TF's default): only the documented effect of the call is
    # asserted here; the default is checked in test_variables_and_function.
    K.set_epsilon(1e-05)
    assert K.epsilon() == 1e-05


def test_floatx_examples():
    assert K.floatx() == "float32"
    K.set_floatx("float16")
    assert K.floatx() == "float16"


def test_cast_to_floatx_example():
    assert K.floatx() == "float32"
    arr = np.array([1.0, 2.0], dtype="float64")
    assert arr.dtype == np.dtype("float64")
    new_arr = K.cast_to_floatx(arr)
    np.testing.assert_array_equal(new_arr, [1.0, 2.0])
    assert new_arr.dtype == np.dtype("float32")


def test_image_data_format_examples():
    # keras.json in the same page: the default is "channels_last".
    assert K.image_data_format() == "channels_last"
    K.set_image_data_format("channels_first")
    assert K.image_data_format() == "channels_first"
    K.set_image_data_format("channels_last")
    assert K.image_data_format() == "channels_last"


# ---- tf_keras_backend_function.md: tf.keras.backend.function ---------------------------------------------------------


def test_function_returns_numpy_arrays_and_rejects_invalid_kwargs():
    # "Returns: Output values as Numpy arrays." / "Raises: ValueError: if invalid kwargs
    # are passed in".
    x = K.placeholder(shape=(2,))
    f = K.function([x], [x * 2.0], name="double")
    out = f([np.array([1.0, 2.0], dtype="float32")])
    assert isinstance(out[0], np.ndarray)
    np.testing.assert_array_equal(out[0], [2.0, 4.0])
    with pytest.raises(ValueError):
        K.function([x], [x * 2.0], invalid_session_kwarg=True)


# ---- k_function_on_a_keras_model.md: the K.function walk-through, written with backend ops instead of layers ------


def test_function_walkthrough_shapes_and_dtype():
    # The seed feeds x_val of shape (1, 1, 20) to an Input(shape=(None, 20)) followed by
    # Dense(64) and relu, and gets back a list holding one float32 array of shape
    # (1, 1, 64) with non-negative entries. Same computation with backend ops, compared
    # with NumPy.
    rng = np.random.default_rng(2)
    x_val = rng.random((1, 1, 20))
    w = rng.normal(size=(20, 64)) * 0.3
    bias = rng.normal(size=(64,)) * 0.1
    q1 = K.placeholder(shape=(None, None, 20))
    dense1 = K.dot(q1, K.variable(w)) + K.variable(bias)
    act1 = K.maximum(dense1, 0.0)
    f = K.function([q1], [act1])
    out = f([x_val])
    assert isinstance(out, list) and len(out) == 1
    assert out[0].shape == (1, 1, 64)
    assert out[0].dtype == np.float32
    w32, b32 = w.astype(np.float32), bias.astype(np.float32)
    ref = np.maximum(np.dot(x_val.astype(np.float32).astype(np.float64), w32) + b32, 0.0)
    np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-5)
    assert np.all(out[0] >= 0)
