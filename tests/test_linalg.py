"""dot, batch_dot and transpose against NumPy, with the shape rules of the Keras docs."""

import itertools

import numpy as np
import pytest
from env_child import env_is, pytest_in_child
from ferrokeras import backend as K
from gradcheck import check_grad, run, tolerances
from reference import default_axes, np_batch_dot

FLOATS = ("float32", "float64")


def _feed_and_compare(shapes, build, ref_fn, dtype, rng, expected_shape=None):
    arrays = [rng.normal(size=s).astype(dtype) for s in shapes]
    phs = [K.placeholder(shape=s, dtype=dtype) for s in shapes]
    out = build(*phs)
    ref = ref_fn(*[a.astype(np.float64) for a in arrays])
    if expected_shape is not None:
        assert ref.shape == expected_shape  # the reference agrees with the documented rule
    assert K.int_shape(out) == ref.shape
    value = run(phs, [out], arrays)[0]
    assert value.dtype == np.dtype(dtype)
    rtol, atol = tolerances(dtype, 1e-5, 1e-5)
    np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol)


# ---- dot ----------------------------------------------------------------------------------

DOT_CASES = [
    ((2, 3), (3, 4), (2, 4)),  # keras_backends.md `dot` example 1
    ((1, 3), (3, 1), (1, 1)),
    ((4, 1), (1, 5), (4, 5)),  # outer product
    ((32, 28, 3), (3, 4), (32, 28, 4)),  # keras_backends.md `dot` example 2
    ((2, 3), (4, 3, 5), (2, 4, 5)),  # keras_backends.md: "(2, 3) * (4, 3, 5) -> (2, 4, 5)"
    ((2, 3, 4), (5, 4, 6), (2, 3, 5, 6)),
    ((2, 3, 4), (4, 5), (2, 3, 5)),
    ((17, 33), (33, 9), (17, 9)),  # sizes that are not multiples of a tile
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("xs,ys,expected", DOT_CASES, ids=str)
def test_dot(xs, ys, expected, dtype, rng):
    # The nD rule is Theano's / np.dot's: contract x's last axis with y's
    # second-to-last axis.
    _feed_and_compare([xs, ys], K.dot, np.dot, dtype, rng, expected)


def test_dot_with_unknown_batch_dim(rng):
    x = K.placeholder(shape=(None, 28, 3))
    w = rng.normal(size=(3, 4)).astype("float32")
    out = K.dot(x, K.variable(w))
    assert K.int_shape(out) == (None, 28, 4)
    f = K.function([x], [out])
    for batch in (1, 3):
        a = rng.normal(size=(batch, 28, 3)).astype("float32")
        np.testing.assert_allclose(f([a])[0], np.dot(a.astype(np.float64), w), rtol=1e-5, atol=1e-5)


def test_dot_on_variables_with_eval(rng):
    a = rng.normal(size=(3, 5))
    b = rng.normal(size=(5, 2))
    value = K.eval(K.dot(K.variable(a), K.constant(b)))
    np.testing.assert_allclose(
        value, np.dot(a.astype(np.float32), b.astype(np.float32)), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "xs,ys",
    [((2, 3), (3, 4)), ((2, 3), (4, 3, 5)), ((2, 3, 4), (4, 2)), ((2, 2, 3), (2, 3, 2))],
    ids=str,
)
def test_dot_gradient(xs, ys, rng):
    check_grad(K.dot, [rng.normal(size=xs), rng.normal(size=ys)])


# ---- batch_dot ------------------------------------------------------------------------------

BATCH_DOT_CASES = [
    # (x shape, y shape, axes, expected shape, where the expectation comes from)
    ((32, 20, 1), (32, 30, 20), (1, 2), (32, 1, 30)),  # keras_backends.md `batch_dot` example
    ((32, 20, 1), (32, 30, 20), [1, 2], (32, 1, 30)),
    ((10, 20), (10, 30, 20), (1, 2), (10, 30)),  # keras_backends.md "Shape inference"
    ((4, 3), (4, 3), 1, (4, 1)),  # 2-D inputs -> (batch, 1)
    ((4, 3), (4, 3), None, (4, 1)),
    ((4, 2, 3), (4, 3, 5), None, (4, 2, 5)),  # axes=None: batched matmul
    ((4, 2, 3), (4, 5, 3), 2, (4, 2, 5)),  # int axes: same axis in both
    ((4, 3), (4, 3, 5), None, (4, 5)),
    ((4, 2, 3), (4, 3), None, (4, 2)),
    ((4, 3, 2), (4, 3, 5), (1, 1), (4, 2, 5)),
    ((4, 2, 3, 2), (4, 2, 5), (3, 1), (4, 2, 3, 5)),
]


def _axes_pair(axes, x_ndim, y_ndim):
    if axes is None:
        return default_axes(x_ndim, y_ndim)
    if isinstance(axes, int):
        return (axes, axes)
    return tuple(axes)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("xs,ys,axes,expected", BATCH_DOT_CASES, ids=str)
def test_batch_dot(xs, ys, axes, expected, dtype, rng):
    pair = _axes_pair(axes, len(xs), len(ys))
    _feed_and_compare(
        [xs, ys],
        lambda x, y: K.batch_dot(x, y, axes=axes),
        lambda x, y: np_batch_dot(x, y, pair),
        dtype,
        rng,
        expected,
    )


def test_batch_dot_doc_values():
    # keras_backends.md `batch_dot`: x = [[1, 2], [3, 4]], y = [[5, 6], [7, 8]],
    # batch_dot(x, y, axes=1) is the main diagonal of x.dot(y.T): 17 and 53,
    # reshaped to (batch_size, 1) because the result has rank 1.
    x = K.variable(np.array([[1, 2], [3, 4]]))
    y = K.variable(np.array([[5, 6], [7, 8]]))
    value = K.eval(K.batch_dot(x, y, axes=1))
    assert value.shape == (2, 1)
    np.testing.assert_array_equal(value.ravel(), [17, 53])


def test_batch_dot_unknown_batch_dim(rng):
    x = K.placeholder(shape=(None, 20, 1))
    y = K.placeholder(shape=(None, 30, 20))
    out = K.batch_dot(x, y, axes=(1, 2))
    assert K.int_shape(out) == (None, 1, 30)
    a = rng.normal(size=(3, 20, 1)).astype("float32")
    b = rng.normal(size=(3, 30, 20)).astype("float32")
    value = run([x, y], [out], [a, b])[0]
    np.testing.assert_allclose(
        value,
        np_batch_dot(a.astype(np.float64), b.astype(np.float64), (1, 2)),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "xs,ys,axes",
    [
        ((3, 4, 2), (3, 2, 5), None),
        ((3, 4), (3, 4), 1),
        ((3, 5, 2), (3, 4, 5), (1, 2)),
    ],
    ids=str,
)
def test_batch_dot_gradient(xs, ys, axes, rng):
    check_grad(
        lambda x, y: K.batch_dot(x, y, axes=axes), [rng.normal(size=xs), rng.normal(size=ys)]
    )


# ---- transpose ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(2, 3), (5,), (2, 3, 4), (1, 4, 1, 2)], ids=str)
def test_transpose(shape, dtype, rng):
    # K.transpose reverses all axes, as np.transpose does.
    _feed_and_compare([shape], K.transpose, np.transpose, dtype, rng)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "uint8", "bool"])
@pytest.mark.parametrize(
    "shape", [(3, 1, 17, 9), (2, 16, 24, 8), (1, 33, 1, 40), (2, 0, 3, 4)], ids=str
)
def test_every_permutation_moves_every_element(shape, dtype, rng):
    # Permutations that amount to matrix transposes (a 2-D swap, NHWC <-> NCHW, the last
    # two axes swapped, with axes of size 1 anywhere) go through the blocked kernel, and
    # its edges (sizes off its 8 x 8 blocks); the others through row copies.
    x = rng.normal(size=shape) * 100
    x = x.astype(dtype) if dtype != "bool" else x > 0
    p = K.placeholder(shape, dtype=dtype)
    for perm in itertools.permutations(range(len(shape))):
        got = K.function([p], [K.permute_dimensions(p, perm)])([x])[0]
        assert got.dtype == x.dtype and got.shape == x.transpose(perm).shape
        np.testing.assert_array_equal(got, x.transpose(perm), err_msg=str(perm))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_permutation_of_five_axes(dtype, rng):
    # Permutations that move the last axis and are no batch of matrix transposes run one
    # strided matrix transpose per index of the other axes.
    x = rng.normal(size=(2, 3, 9, 5, 17)).astype(dtype)
    p = K.placeholder(x.shape, dtype=dtype)
    for perm in itertools.permutations(range(5)):
        got = K.function([p], [K.permute_dimensions(p, perm)])([x])[0]
        np.testing.assert_array_equal(got, x.transpose(perm), err_msg=str(perm))


@pytest.mark.parametrize(
    "shape,perm",
    [((1024, 1030), (1, 0)), ((3, 515, 600), (0, 2, 1)), ((40, 30, 1000), (2, 1, 0))],
)
def test_large_transposes_split_among_threads(shape, perm, rng):
    x = rng.normal(size=shape).astype("float32")
    p = K.placeholder(shape)
    got = K.function([p], [K.permute_dimensions(p, perm)])([x])[0]
    np.testing.assert_array_equal(got, x.transpose(perm))


def test_transpose_gradient(rng):
    check_grad(K.transpose, [rng.normal(size=(2, 3, 4))])
    check_grad(lambda x: K.dot(x, K.transpose(x)), [rng.normal(size=(3, 4))])


# ---- matmul kernel paths --------------------------------------------------------------------
# The CPU GEMM takes a different route by shape: a transposed copy of a transposed operand,
# column panels of A·Bᵀ each with its own transposed block, a split along k for a small
# result, blocks of columns for few rows, a column-major result for skinny n,
# single-threaded under a work threshold, whole small matrices per task in a batch, and the
# k = 0 / empty edges. Each case runs all four
# transpose flags of the primitive against np.matmul.

from ferrokeras import _core  # noqa: E402
from ferrokeras.tensor import wrap  # noqa: E402

MATMUL_PATHS = [
    # (batch of a, batch of b, m, k, n)
    ((), (), 1, 1, 1),
    ((), (), 5, 0, 3),  # k = 0: zeros
    ((), (), 0, 4, 3),  # empty result
    ((), (), 3, 4, 0),
    ((), (), 7, 5, 1),  # n = 1
    ((), (), 1, 9, 6),  # m = 1
    ((), (), 3, 9, 6),  # m below the transposed-copy threshold
    ((), (), 33, 17, 10),  # skinny n (the MLP's output layer)
    ((), (), 130, 70, 16),  # the skinny limit
    ((), (), 40, 3, 17),
    ((), (), 160, 130, 110),  # above the threading threshold
    ((4,), (4,), 6, 5, 7),
    ((3, 1), (1, 4), 5, 6, 3),  # broadcast batch dims
    ((2,), (), 20, 8, 12),  # one b shared by the batch
    ((), (3,), 20, 8, 12),
    ((5,), (5,), 20, 8, 3),  # batched, skinny
    ((64,), (64,), 16, 32, 32),  # many small matrices, several per task
    ((0,), (0,), 4, 4, 4),
    ((), (), 9, 2100, 130),  # small result, long k: split along k across threads
    ((), (), 100, 90, 520),  # few rows, many columns: a block of columns per thread
    ((), (), 17, 40, 3300),  # A·Bᵀ with long n: column panels (the last one short)
    ((), (), 64, 100, 256),  # A·Bᵀ read in place by gemm, one thread
    ((), (), 70, 300, 257),  # the same above the threading threshold, too few for panels
    # Small f32 products with n a multiple of 16, summed without packing: blocks of 6 rows
    # by 1-4 vectors and the rows and vectors left over; k at its bound and past it.
    ((), (), 1, 1, 16),
    ((), (), 7, 5, 16),
    ((), (), 13, 33, 48),
    ((), (), 64, 64, 256),  # a Keras LSTM(64)'s h·U
    ((), (), 11, 1024, 80),
    ((), (), 5, 1025, 32),
    ((4,), (4,), 9, 7, 32),
    ((3,), (), 6, 10, 64),
    # Long contractions and strides with 128+ rows and columns: a transposed operand
    # copied before `gemm` where FERROKERAS_COPY_TRANSPOSED (or the CPU) says so (test
    # below).
    ((), (), 520, 530, 140),
    ((2,), (), 512, 512, 129),
]

# The products of MATMUL_PATHS whose transposed operands may be copied first.
LONG_CONTRACTIONS = [c for c in MATMUL_PATHS if min(c[2], c[3]) >= 512 and c[4] >= 128]


@pytest.mark.parametrize("dtype", ("float32", "float64", "float16"))
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("ba,bb,m,k,n", MATMUL_PATHS, ids=str)
def test_matmul_paths(ba, bb, m, k, n, ta, tb, dtype, rng):
    a = rng.normal(size=ba + ((k, m) if ta else (m, k))).astype(dtype)
    b = rng.normal(size=bb + ((n, k) if tb else (k, n))).astype(dtype)
    pa, pb = K.placeholder(shape=a.shape, dtype=dtype), K.placeholder(shape=b.shape, dtype=dtype)
    out = run([pa, pb], [wrap(_core.matmul(pa._core, pb._core, ta, tb))], [a, b])[0]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.matmul(
        np.swapaxes(a64, -1, -2) if ta else a64, np.swapaxes(b64, -1, -2) if tb else b64
    )
    assert out.shape == ref.shape and out.dtype == np.dtype(dtype)
    tol = {"float16": 2e-2, "float32": 2e-5, "float64": 1e-12}[dtype] * max(1.0, np.sqrt(k))
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("setting", ["1", "0"])
def test_matmul_paths_copying_transposed_operands_or_not(setting):
    # Both ways of reading a transposed operand of a long contraction, whichever this CPU
    # picks by itself: copied transposed first, or gathered by `gemm`'s packing.
    if not env_is("FERROKERAS_COPY_TRANSPOSED", setting):
        dims = " or ".join("-".join(map(str, c[2:])) for c in LONG_CONTRACTIONS)
        out = pytest_in_child(
            {"FERROKERAS_COPY_TRANSPOSED": setting},
            __file__,
            "-k",
            f"test_matmul_paths and float32 and ({dims}) and not False-False",
        )
        assert f"{3 * len(LONG_CONTRACTIONS)} passed" in out, out
        return
    assert LONG_CONTRACTIONS


@pytest.mark.parametrize(
    "xs,ys", [((6, 5), (5, 3)), ((9, 20), (20, 12)), ((4, 6, 5), (5, 2))], ids=str
)
def test_dot_gradient_through_transposed_paths(xs, ys, rng):
    # dx = g·yᵀ and dy = xᵀ·g take the transposed-copy and skinny routes.
    check_grad(K.dot, [rng.normal(size=xs), rng.normal(size=ys)])


@pytest.mark.parametrize("perm_a,perm_b", [(False, True), (True, False), (True, True)])
def test_dot_of_transposes_reads_them_through_the_flags(perm_a, perm_b, rng):
    # `K.dot(x, K.transpose(w))` becomes one product with the transpose flag (no copy of
    # w first): the values, the gradients, and a batched swap of the last two axes.
    a = rng.normal(size=(7, 5) if perm_a else (5, 7))
    b = rng.normal(size=(3, 7) if perm_b else (7, 3))
    ta = (lambda x: K.transpose(x)) if perm_a else (lambda x: x)
    tb = (lambda x: K.transpose(x)) if perm_b else (lambda x: x)
    pa, pb = K.placeholder(shape=a.shape), K.placeholder(shape=b.shape)
    out = run([pa, pb], [K.dot(ta(pa), tb(pb))], [a.astype("float32"), b.astype("float32")])[0]
    ref = (a.T if perm_a else a) @ (b.T if perm_b else b)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    check_grad(lambda x, y: K.dot(ta(x), tb(y)), [a, b])
    x, y = rng.normal(size=(4, 5, 6)), rng.normal(size=(4, 3, 6))
    px, py = K.placeholder(shape=x.shape), K.placeholder(shape=y.shape)
    swapped = wrap(_core.matmul(px._core, K.permute_dimensions(py, (0, 2, 1))._core, False, False))
    got = run([px, py], [swapped], [x.astype("float32"), y.astype("float32")])[0]
    np.testing.assert_allclose(got, x @ np.swapaxes(y, 1, 2), rtol=1e-5, atol=1e-5)
