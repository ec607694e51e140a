"""Sparse placeholders, is_sparse, to_dense and feeding scipy.sparse matrices.

The spec's examples (keras_backends.md, `is_sparse`, `to_dense`) first; then every scipy.sparse
format fed through `K.function`, compared with the same computation done in NumPy on the
densified matrix, gradients included.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from ferrokeras import backend as K
from gradcheck import run

FORMATS = ("csr", "csc", "coo", "lil", "dok", "bsr")


def sparse_matrix(rng, shape, fmt, dtype="float64", density=0.3):
    """A scipy.sparse matrix in format `fmt`, and the same values as a dense array."""
    dense = (rng.normal(size=shape) * (rng.uniform(size=shape) < density)).astype(dtype)
    return sp.coo_matrix(dense).asformat(fmt), dense


def test_spec_is_sparse_example():
    a = K.placeholder((2, 2), sparse=False)
    assert K.is_sparse(a) is False
    b = K.placeholder((2, 2), sparse=True)
    assert K.is_sparse(b) is True


def test_spec_to_dense_example():
    b = K.placeholder((2, 2), sparse=True)
    assert K.is_sparse(b) is True
    c = K.to_dense(b)
    assert K.is_sparse(c) is False
    assert K.int_shape(c) == (2, 2) and K.dtype(c) == K.dtype(b)


def test_to_dense_of_a_dense_tensor_is_the_tensor():
    x = K.placeholder((2, 3))
    assert K.to_dense(x) is x


def test_to_dense_of_a_scipy_matrix(rng):
    m, dense = sparse_matrix(rng, (3, 4), "csr")
    t = K.to_dense(m)
    assert K.is_tensor(t) and not K.is_sparse(t)
    np.testing.assert_array_equal(K.eval(t), dense)


def test_to_dense_rejects_other_values():
    with pytest.raises(TypeError) as excinfo:
        K.to_dense("not a tensor")
    assert "to_dense" in str(excinfo.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_feeding_a_sparse_matrix_to_a_sparse_placeholder(fmt, rng):
    m, dense = sparse_matrix(rng, (5, 4), fmt)
    w = rng.normal(size=(4, 3))
    x = K.placeholder(shape=(None, 4), dtype="float64", sparse=True)
    kw = K.variable(w, dtype="float64")
    y = K.dot(x, kw)
    loss = K.sum(K.square(y))
    g = K.gradients(loss, [kw])[0]
    out, grad = run([x], [y, g], [m])
    np.testing.assert_allclose(out, dense @ w, rtol=1e-12)
    np.testing.assert_allclose(grad, dense.T @ (2 * (dense @ w)), rtol=1e-12)


@pytest.mark.parametrize("fmt", ("csr", "coo"))
def test_sparse_through_to_dense_and_elementwise(fmt, rng):
    m, dense = sparse_matrix(rng, (3, 6), fmt)
    x = K.placeholder(shape=(3, 6), dtype="float64", sparse=True)
    out = K.sum(K.to_dense(x) * 2.0, axis=1)
    np.testing.assert_allclose(run([x], [out], [m])[0], (dense * 2).sum(axis=1), rtol=1e-12)


def test_sparse_matrix_dtype_is_converted_to_the_placeholder_dtype(rng):
    ints = sp.csr_matrix(rng.integers(0, 3, size=(4, 4)))
    x = K.placeholder(shape=(4, 4), sparse=True)  # floatx
    value = run([x], [x * 1.5], [ints])[0]
    assert value.dtype == np.float32
    np.testing.assert_allclose(value, ints.toarray() * 1.5)


def test_sparse_and_dense_feeds_mix(rng):
    m, dense = sparse_matrix(rng, (4, 3), "csr", "float32")
    d = rng.normal(size=(4, 3)).astype("float32")
    xs = K.placeholder(shape=(None, 3), sparse=True)
    xd = K.placeholder(shape=(None, 3))
    f = K.function([xs, xd], [xs + xd])
    np.testing.assert_allclose(f([m, d])[0], dense + d, rtol=1e-6)
    # A dense array fed to a sparse placeholder and a sparse matrix fed to a dense one.
    np.testing.assert_allclose(f([d, m])[0], d + dense, rtol=1e-6)


def test_sparse_feed_of_the_wrong_shape_is_rejected(rng):
    m, _ = sparse_matrix(rng, (4, 5), "csr")
    x = K.placeholder(shape=(None, 3), sparse=True)
    f = K.function([x], [x * 2.0])
    with pytest.raises(ValueError):
        f([m])


def test_variable_and_constant_from_a_sparse_matrix(rng):
    m, dense = sparse_matrix(rng, (3, 3), "csr")
    np.testing.assert_allclose(K.eval(K.variable(m)), dense.astype(np.float32))
    np.testing.assert_allclose(
        K.eval(K.dot(K.variable(m), K.constant(np.eye(3)))), dense.astype(np.float32), rtol=1e-6
    )
