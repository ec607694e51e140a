"""Where Keras code reads TensorFlow's behaviour, ferrokeras gives the same: attributes of
tensors and variables, dtypes of Python values, shapes given with tensors, tensor indices,
sparse flags, the static shapes Keras's backends record, and seeds of unseeded random ops.
"""

import itertools

import numpy as np
import pytest
import scipy.sparse
from ferrokeras import backend as K


def _int(v):
    return K.constant(v, dtype="int32")


# ---- attributes Keras reads on tensors and variables ---------------------------------------


def test_op_outputs_carry_no_learning_phase_flag():
    # TF marks only placeholders, variables and learning-phase dependent outputs; Keras's
    # TimeDistributed tests `hasattr(output, '_uses_learning_phase')`.
    x = K.placeholder(shape=(2, 3))
    v = K.variable(np.ones((2, 3)))
    assert x._uses_learning_phase is False and v._uses_learning_phase is False
    for out in (K.exp(x), x + v, K.dot(x, K.transpose(v)), K.sum(x, 1), x[0], K.shape(x)):
        assert not hasattr(out, "_uses_learning_phase"), out
    assert K.in_train_phase(x * 2, x)._uses_learning_phase is True


def test_variable_is_trainable_and_settable():
    v = K.variable(np.zeros(3))
    assert v.trainable is True
    v.trainable = False
    assert v.trainable is False
    assert K.zeros((2,)).trainable is True


def test_session_run_of_an_update_op_assigns_it():
    v = K.variable(np.array([1.0, 2.0]))
    w = K.variable(np.array([5.0]))
    out = K.get_session().run([K.update_add(v, [1.0, 1.0]), K.update(w, v[:1] * 10.0), v])
    np.testing.assert_array_equal(out[0], [2.0, 3.0])
    np.testing.assert_array_equal(out[1], [10.0])
    np.testing.assert_array_equal(out[2], [1.0, 2.0])  # values from before the call
    np.testing.assert_array_equal(K.get_value(v), [2.0, 3.0])
    np.testing.assert_array_equal(K.get_value(w), [10.0])
    assert K.get_session().run(K.update_sub(w, [4.0])).tolist() == [6.0]
    np.testing.assert_array_equal(K.get_value(w), [6.0])


# ---- dtypes of Python values ----------------------------------------------------------------


@pytest.mark.parametrize("fn", [K.zeros_like, K.ones_like])
def test_like_functions_of_python_floats_are_floatx(fn):
    assert fn([0.5, 1.0]).dtype == "float32"
    assert fn(((0.5,), (1.0,))).dtype == "float32"
    assert fn([1, 2]).dtype == "int32"
    assert fn(np.array([0.5, 1.0])).dtype == "float64"  # NumPy arrays keep their dtype


def test_numpy_scalars_keep_their_dtype():
    # As tf.convert_to_tensor: NumPy scalars keep their dtype, Python numbers do not.
    assert K.sqrt(np.float64(2.0)).dtype == "float64"
    assert K.sqrt(2.0).dtype == "float32"
    assert K.abs(np.int64(3)).dtype == "int64"
    assert K.abs(3).dtype == "int32"
    assert (K.constant([1.0]) * np.float64(2.0)).dtype == "float32"  # a tensor's dtype wins


def test_python_lists_convert_as_in_tensorflow():
    assert (K.constant([1.0]) + [0.5, 1.5]).dtype == "float32"
    assert K.switch(K.constant(True, dtype="bool"), K.zeros_like([0.5]), [1.0]).dtype == "float32"
    assert K.eval(K.zeros_like([2**40, 1])).dtype == np.int64  # does not fit int32: not wrapped
    assert K.eval(K.cumsum([2**40, 1])).tolist() == [2**40, 2**40 + 1]


# ---- shapes given with tensors --------------------------------------------------------------


@pytest.mark.parametrize("fn, fill", [(K.zeros, 0.0), (K.ones, 1.0)])
def test_filled_tensors_from_a_shape_with_tensors(fn, fill):
    x = K.placeholder(shape=(None, 2))
    for shape in ((K.shape(x)[0], 3), K.concatenate([K.shape(x)[:1], _int([3])])):
        t = fn(shape)
        assert t.shape == (None, 3) and not K.is_variable(t)
        out = K.function([x], [t])([np.zeros((4, 2), "float32")])[0]
        np.testing.assert_array_equal(out, np.full((4, 3), fill, "float32"))
    # A shape whose sizes are all known gives a variable, as in TensorFlow.
    v = fn((K.shape(K.ones((2, 5)))[1], 2), dtype="float64")
    assert K.is_variable(v) and v.dtype == "float64"
    np.testing.assert_array_equal(K.get_value(v), np.full((5, 2), fill))


def test_other_shape_taking_functions_accept_tensors():
    x = K.placeholder(shape=(None, 2))
    n = K.shape(x)[0]
    feed = [np.zeros((3, 2), "float32")]
    outs = K.function(
        [x],
        [
            K.eye(n),
            K.eye((n, 2)),
            K.constant(2.5, shape=(n, 2)),
            K.ones(n),
            K.random_uniform((n, 2)),
            K.random_normal(K.shape(x)),
        ],
    )(feed)
    np.testing.assert_array_equal(outs[0], np.eye(3, dtype="float32"))
    np.testing.assert_array_equal(outs[1], np.eye(3, 2, dtype="float32"))
    np.testing.assert_array_equal(outs[2], np.full((3, 2), 2.5, "float32"))
    np.testing.assert_array_equal(outs[3], np.ones(3, "float32"))
    assert outs[4].shape == (3, 2) and outs[5].shape == (3, 2)
    with pytest.raises(ValueError, match="scalar value"):
        K.constant([1.0, 2.0], shape=(n, 2))
    with pytest.raises(TypeError, match="static"):
        K.random_uniform_variable((n, 2), 0, 1)
    with pytest.raises(TypeError, match="static"):
        K.random_normal_variable((n, 2), 0, 1)


def test_padding_amounts_may_be_tensors():
    x = K.placeholder(shape=(None, 3, 2))
    n = K.shape(x)[0]
    a = np.arange(12, dtype="float32").reshape(2, 3, 2)
    y = K.temporal_padding(x, (n, 1))
    assert y.shape == (None, None, 2)
    out, g = K.function([x], [y, K.gradients(K.sum(y * y), [x])[0]])([a])
    np.testing.assert_array_equal(out, np.pad(a, ((0, 0), (2, 1), (0, 0))))
    np.testing.assert_array_equal(g, 2 * a)
    img = np.arange(24, dtype="float32").reshape(1, 2, 3, 4)
    z = K.spatial_2d_padding(K.constant(img), ((1, _int(2)), (0, _int(1))), "channels_first")
    np.testing.assert_array_equal(K.eval(z), np.pad(img, ((0, 0), (0, 0), (1, 2), (0, 1))))
    with pytest.raises(ValueError, match="non-negative"):
        K.temporal_padding(x, (-1, 1))
    with pytest.raises(TypeError, match="scalar int tensor"):
        K.temporal_padding(x, (K.constant(1.0), 1))


def test_filled_variables_reject_bad_shapes():
    with pytest.raises(ValueError, match="negative"):
        K.zeros((2, -1))
    with pytest.raises(TypeError, match="shape entry"):
        K.ones((2.5, 1))
    with pytest.raises(ValueError, match="1-D int tensor"):
        K.zeros(K.constant([2.0, 3.0]))
    with pytest.raises(TypeError, match="scalar int tensor"):
        K.zeros((K.constant(2.0), 3))


# ---- tensor indices and slice bounds --------------------------------------------------------


A = np.arange(24.0).reshape(4, 6).astype("float32")


@pytest.mark.parametrize("i", range(-4, 4))
def test_index_with_a_scalar_tensor(i):
    v = K.variable(A)
    np.testing.assert_array_equal(K.eval(v[_int(i)]), A[i])
    np.testing.assert_array_equal(K.eval(v[1:3, _int(i + 2)]), A[1:3, i + 2])
    np.testing.assert_array_equal(K.eval(v[_int(i), ::-2]), A[i, ::-2])
    assert v[_int(i)].shape == (6,)


def test_index_tensor_out_of_range_raises_when_run():
    v = K.variable(A)
    for i in (4, -5):
        with pytest.raises(ValueError, match="out of range"):
            K.eval(v[_int(i)])


def test_map_fn_over_indices():
    v = K.variable(A)
    r = K.map_fn(lambda i: K.sum(v[i]), K.arange(3), dtype="float32")
    np.testing.assert_allclose(K.eval(r), A[:3].sum(1))


BOUNDS = [None, -9, -6, -3, -1, 0, 1, 2, 5, 6, 9]


@pytest.mark.parametrize("step", [None, 1, 2, -1, -2, 4, -5])
def test_slice_bounds_given_as_tensors_follow_numpy(step):
    v = K.variable(A)
    for start, stop in itertools.product(BOUNDS, BOUNDS):
        ref = A[:, start:stop:step]
        keys = [
            slice(None if start is None else _int(start), stop, step),
            slice(start, None if stop is None else _int(stop), step),
            slice(start, stop, None if step is None else _int(step)),
        ]
        for key in keys:
            np.testing.assert_array_equal(K.eval(v[:, key]), ref, err_msg=str(key))


def test_slice_bounds_fed_at_run_time():
    x = K.placeholder(shape=(None, 6))
    lo, hi, st = (K.placeholder(shape=(), dtype="int32") for _ in range(3))
    y = x[lo:hi:st, 1]
    assert y.shape == (None,)
    f = K.function([x, lo, hi, st], [y])
    for a, b, s in [(0, 4, 1), (3, -5, -1), (-2, 10, 2), (1, 1, 1)]:
        np.testing.assert_array_equal(f([A, np.int32(a), np.int32(b), np.int32(s)])[0], A[a:b:s, 1])
    with pytest.raises(ValueError, match="step cannot be zero"):
        f([A, np.int32(0), np.int32(2), np.int32(0)])
    with pytest.raises(ValueError, match="step cannot be zero"):
        x[:: _int(0)]


def test_gradient_through_tensor_indices():
    v = K.variable(A)
    g = K.gradients(K.sum(v[_int(1), _int(1) : _int(4)] * 2.0), [v])[0]
    ref = np.zeros_like(A)
    ref[1, 1:4] = 2.0
    np.testing.assert_array_equal(K.eval(g), ref)


def test_bad_tensor_indices_are_type_errors():
    v = K.variable(A)
    with pytest.raises(TypeError, match="scalar integer tensor"):
        v[K.constant(1.0)]
    with pytest.raises(TypeError, match="K.gather"):
        v[_int([0, 1])]
    with pytest.raises(TypeError, match="scalar integer tensor"):
        v[: K.constant(2.0)]


# ---- argmax and argmin with NaN and infinities -------------------------------------------------

_M = float(np.finfo(np.float32).max)
# (row, TF's argmax, TF's argmin), from tf.math.argmax / argmin (TF 2.21, CPU)
_ARG_ROWS = [
    ([np.nan, 1, 2], 2, 1),
    ([1, np.nan, 2], 2, 0),
    ([2, np.nan, 1], 0, 2),
    ([np.nan, np.nan], 0, 0),
    ([-np.inf, -np.inf], 0, 0),
    ([np.nan, -np.inf], 0, 1),
    ([-np.inf, np.nan], 0, 0),
    ([-np.inf, -_M], 0, 0),
    ([np.inf, _M], 0, 0),
    ([np.inf, 1.0], 0, 1),
    ([np.nan, -_M, -_M], 0, 1),
    ([5, np.nan, 5], 0, 0),
    ([-np.inf] * 5 + [np.nan], 0, 0),
]


@pytest.mark.parametrize("row,amax,amin", _ARG_ROWS)
def test_argmax_and_argmin_skip_nan_as_tensorflow(row, amax, amin):
    # TF starts from index 0 holding the most negative (positive) finite value and takes an
    # element only where it is strictly greater (less): NaN never wins.
    x = K.placeholder(shape=(len(row),))
    a, b = K.function([x], [K.argmax(x), K.argmin(x)])([np.array(row, np.float32)])
    assert (int(a), int(b)) == (amax, amin)


def test_argmax_along_either_axis_and_over_long_rows_skips_nan():
    x = K.placeholder(shape=(2, 3))
    v = np.array([[np.nan, -np.inf, 1], [-np.inf, np.nan, np.nan]], np.float32)
    outs = K.function([x], [K.argmax(x, 0), K.argmin(x, 0), K.argmax(x, 1), K.argmin(x, 1)])([v])
    assert [o.tolist() for o in outs] == [[0, 0, 0], [1, 0, 0], [2, 0], [1, 0]]
    # longer than one GPU dispatch's steps: the NaN before the maximum still never wins
    long = np.full((1, 70001), np.nan, np.float32)
    long[0, 66000] = 3.0
    long[0, 69000] = -1.0
    y = K.placeholder(shape=(1, 70001))
    a, b = K.function([y], [K.argmax(y, 1), K.argmin(y, 1)])([long])
    assert (a.tolist(), b.tolist()) == ([66000], [69000])


# ---- relu, print_tensor ---------------------------------------------------------------------


def test_relu_with_negative_threshold_and_max_value_matches_tensorflow():
    x = K.constant([-3.5, -2.8, -0.5, 0.25, 4.0, 7.0])
    # TF: x * (x > threshold), clipped to [0, max_value], minus alpha * relu(threshold - x)
    np.testing.assert_allclose(
        K.eval(K.relu(x, alpha=0.1, max_value=5.0, threshold=-2.8)),
        [-0.07, 0.0, 0.0, 0.25, 4.0, 5.0],
        rtol=1e-6,
    )
    # Without max_value, TF keeps x above the threshold, negative values included.
    np.testing.assert_allclose(
        K.eval(K.relu(x, alpha=0.1, threshold=-2.8)), [-0.07, 0.0, -0.5, 0.25, 4.0, 7.0], rtol=1e-6
    )


# ---- sparse_categorical_crossentropy with channels-first targets -----------------------------


def test_sparse_categorical_crossentropy_flattens_a_target_of_the_output_rank():
    rng = np.random.default_rng(0)
    p = rng.random((2, 3, 4, 5)).astype("float32")
    p /= p.sum(1, keepdims=True)
    labels = rng.integers(0, 3, size=(2, 1, 4, 5))
    ref = -np.log(np.take_along_axis(p, labels, 1))[:, 0]
    t = K.placeholder(ndim=4)  # what Keras builds for a channels_first model's target
    o = K.placeholder(ndim=4)
    loss = K.sparse_categorical_crossentropy(t, o, axis=1)
    out = K.function([t, o], [loss])([labels.astype("float32"), p])[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5)
    # the same with static shapes, and with the label axis last
    static = K.sparse_categorical_crossentropy(K.constant(labels), K.constant(p), axis=1)
    np.testing.assert_allclose(K.eval(static), ref, rtol=1e-5)
    last = K.sparse_categorical_crossentropy(
        K.constant(np.moveaxis(labels, 1, -1)), K.constant(p), axis=1
    )
    np.testing.assert_allclose(K.eval(last), ref, rtol=1e-5)


# ---- static shapes Keras's backends record --------------------------------------------------


def test_repeat_elements_records_the_keras_shape():
    x = K.placeholder(shape=(None, None, 3))
    y = K.repeat_elements(x, 2, axis=1)
    assert y._keras_shape == (None, None, 3)
    x._keras_shape = (None, 4, 3)  # what a Keras layer records
    y = K.repeat_elements(x, 2, axis=1)
    assert y._keras_shape == (None, 8, 3) and K.int_shape(y) == (None, 8, 3)
    out = K.function([x], [y])([np.arange(24.0, dtype="float32").reshape(2, 4, 3)])[0]
    assert out.shape == (2, 8, 3)
    assert K.repeat_elements(K.ones((2, 3)), 3, axis=0)._keras_shape == (6, 3)


# ---- sparse flags ---------------------------------------------------------------------------


def test_sparse_values_keep_their_flag():
    m = scipy.sparse.csr_matrix(np.eye(3, dtype="float32"))
    v = K.variable(m)
    assert K.is_sparse(v)
    np.testing.assert_array_equal(K.get_value(v), np.eye(3))
    assert not K.is_sparse(K.variable(np.eye(3)))
    a, b = K.placeholder((2, 3), sparse=True), K.placeholder((2, 3), sparse=True)
    assert K.is_sparse(K.concatenate([a, b], axis=0))
    assert K.is_sparse(K.concatenate([a, v[:2]], axis=0)) is False  # one dense input
    assert not K.is_sparse(K.to_dense(K.concatenate([a, b])))


# ---- seeds of unseeded random ops -----------------------------------------------------------


def _draws():
    return [
        K.eval(K.random_uniform((3,))),
        K.eval(K.random_normal((3,))),
        K.eval(K.truncated_normal((3,))),
        K.eval(K.random_binomial((5,), p=0.5)),
        K.eval(K.dropout(K.ones((6,)), 0.5)),
        K.get_value(K.random_uniform_variable((2,), 0, 1)),
        K.get_value(K.random_normal_variable((2,), 0, 1)),
    ]


def test_unseeded_ops_take_their_seed_from_numpy():
    np.random.seed(1)
    first = _draws()
    np.random.seed(1)
    second = _draws()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    np.random.seed(2)
    third = _draws()
    assert not np.array_equal(first[0], third[0])


def test_set_random_seed():
    import random

    import ferrokeras

    ferrokeras.set_random_seed(5)
    a, r = _draws(), random.random()
    ferrokeras.set_random_seed(5)
    b = _draws()
    assert random.random() == r
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="seed"):
        ferrokeras.set_random_seed(-1)
    with pytest.raises(TypeError, match="seed"):
        ferrokeras.set_random_seed(1.5)
