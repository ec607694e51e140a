"""Reductions and scans against NumPy: every axis form, keepdims, dtypes, gradients."""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import check_grad, run, tolerances
from reference import np_logsumexp

FLOATS = ("float32", "float64")
SHAPE = (2, 3, 4)


def distinct(rng, shape):
    """Values at least 0.15 apart (no ties, so max/min/argmax have one answer and
    max/min gradients are well defined)."""
    n = int(np.prod(shape))
    x = (rng.permutation(n) - n / 2) * 0.25 + rng.uniform(-0.05, 0.05, size=n)
    return x.reshape(shape)


def signed_near_one(rng, shape):
    """|x| in [0.5, 1.5], both signs: products stay O(1) and never hit zero."""
    mag = rng.uniform(0.5, 1.5, size=shape)
    return mag * rng.choice([-1.0, 1.0], size=shape)


def np_axis(axis):
    return tuple(axis) if isinstance(axis, list) else axis


@dataclass(frozen=True)
class Red:
    name: str
    k: Callable
    ref: Callable
    domain: Callable = distinct
    tol32: tuple[float, float] = (1e-5, 1e-5)
    grad: bool = True

    def __repr__(self):
        return self.name


REDUCTIONS = [
    Red("sum", K.sum, np.sum),
    Red("prod", K.prod, np.prod, domain=signed_near_one),
    Red("max", K.max, np.max),
    Red("min", K.min, np.min),
    Red("mean", K.mean, np.mean),
    Red("var", K.var, np.var),  # population variance (ddof=0), as TF
    Red("std", K.std, np.std),
    Red("logsumexp", K.logsumexp, np_logsumexp, tol32=(2e-5, 2e-5)),
]

AXES = [None, 0, 1, 2, -1, -2, [0, 2], (1, 2), (0, 1, 2), [-1, 0]]
GRAD_AXES = [None, 1, -1, [0, 2]]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("red", REDUCTIONS, ids=repr)
def test_reduction_forward(red, dtype, axis, keepdims, rng):
    x = red.domain(rng, SHAPE).astype(dtype)
    ph = K.placeholder(shape=SHAPE, dtype=dtype)
    out = red.k(ph, axis=axis, keepdims=keepdims)
    ref = np.asarray(red.ref(x.astype(np.float64), axis=np_axis(axis), keepdims=keepdims))
    assert K.int_shape(out) == ref.shape
    assert K.dtype(out) == dtype
    value = run([ph], [out], [x])[0]
    assert value.shape == ref.shape
    assert value.dtype == np.dtype(dtype)
    rtol, atol = tolerances(dtype, *red.tol32)
    np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("red", REDUCTIONS, ids=repr)
def test_reduction_on_variable_default_axis(red, rng):
    x = red.domain(rng, SHAPE)
    v = K.variable(x)
    value = K.eval(red.k(v))
    assert value.shape == ()
    np.testing.assert_allclose(
        value, red.ref(x.astype(np.float32).astype(np.float64)), rtol=2e-5, atol=2e-5
    )


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", GRAD_AXES, ids=str)
@pytest.mark.parametrize("red", REDUCTIONS, ids=repr)
def test_reduction_gradient(red, axis, keepdims, rng):
    check_grad(lambda t: red.k(t, axis=axis, keepdims=keepdims), [red.domain(rng, SHAPE)])


def test_prod_gradient_with_a_zero(rng):
    # d prod / d x_i at x_i == 0 is the product of the others: prod / x is not enough.
    x = signed_near_one(rng, (3, 4))
    x[1, 2] = 0.0
    x[2, 0] = 0.0
    check_grad(lambda t: K.prod(t, axis=1), [x])
    check_grad(lambda t: K.prod(t), [x])


# ---- None (runtime) dimensions ------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kfn,nfn",
    [
        ("sum", K.sum, np.sum),
        ("mean", K.mean, np.mean),
        ("var", K.var, np.var),
        ("std", K.std, np.std),
        ("max", K.max, np.max),
        ("logsumexp", K.logsumexp, np_logsumexp),
    ],
)
def test_reduction_over_unknown_batch_dim(name, kfn, nfn, rng):
    # The divisor of mean/var/std over a None axis is the runtime size.
    ph = K.placeholder(shape=(None, 3))
    out = kfn(ph, axis=0)
    assert K.int_shape(out) == (3,)
    f = K.function([ph], [out, kfn(ph, axis=1)])
    for batch in (5, 2):
        x = distinct(rng, (batch, 3)).astype("float32")
        v0, v1 = f([x])
        x64 = x.astype(np.float64)
        np.testing.assert_allclose(v0, nfn(x64, axis=0), rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(v1, nfn(x64, axis=1), rtol=2e-5, atol=2e-5)


# ---- any / all ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8", "uint8"])
@pytest.mark.parametrize("name,kfn,nfn", [("max", K.max, np.max), ("min", K.min, np.min)])
def test_max_min_along_long_rows(name, kfn, nfn, dtype, rng):
    # Rows longer than the kernel's 16 lanes, and of lengths off them: the extreme value
    # (and a NaN, which wins) placed in the lanes, in the tail, first and last.
    for n in (1, 15, 16, 17, 40, 1000):
        if np.dtype(dtype).kind == "f":
            x = rng.normal(size=(8, n)).astype(dtype)
        else:
            info = np.iinfo(dtype)
            x = rng.integers(info.min, info.max, size=(8, n), endpoint=True).astype(dtype)
        extreme = np.inf if dtype.startswith("float") else None
        for row, col in ((1, 0), (2, n - 1), (3, n // 2), (4, min(16, n - 1))):
            if extreme is not None:
                x[row, col] = extreme if name == "max" else -extreme
        if dtype.startswith("float"):
            x[5, n - 1] = np.nan
            x[6, n // 3] = np.nan
        p = K.placeholder(x.shape, dtype=dtype)
        got = K.function([p], [kfn(p, axis=-1)])([x])[0]
        np.testing.assert_array_equal(got, nfn(x, axis=-1), err_msg=f"length {n}")


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("name,kfn,nfn", [("any", K.any, np.any), ("all", K.all, np.all)])
def test_any_all(name, kfn, nfn, axis, keepdims, rng):
    # Numeric input: nonzero counts as true. Densities chosen so that both outcomes occur.
    p = 0.25 if name == "any" else 0.85
    x = (rng.random(SHAPE) < p).astype("float32") * rng.uniform(0.5, 2, size=SHAPE)
    x = x.astype("float32")
    ph = K.placeholder(shape=SHAPE)
    out = kfn(ph, axis=axis, keepdims=keepdims)
    ref = nfn(x != 0, axis=np_axis(axis), keepdims=keepdims)
    value = np.asarray(run([ph], [out], [x])[0])
    assert value.shape == np.shape(ref)
    # The Keras doc says "a uint8 tensor (0s and 1s)", TF returns bool: compare truth.
    np.testing.assert_array_equal(value.astype(bool), ref)


@pytest.mark.parametrize("name,kfn,nfn", [("any", K.any, np.any), ("all", K.all, np.all)])
def test_any_all_on_bool_tensor(name, kfn, nfn, rng):
    x = rng.normal(size=(4, 5)).astype("float32")
    ph = K.placeholder(shape=(4, 5))
    outs = [kfn(K.greater(ph, -0.5), axis=1), kfn(K.greater(ph, -0.5))]
    v1, v2 = run([ph], outs, [x])
    np.testing.assert_array_equal(np.asarray(v1).astype(bool), nfn(x > -0.5, axis=1))
    assert bool(np.asarray(v2)) == bool(nfn(x > -0.5))


# ---- argmax / argmin --------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -2], ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "name,kfn,nfn", [("argmax", K.argmax, np.argmax), ("argmin", K.argmin, np.argmin)]
)
def test_argmax_argmin(name, kfn, nfn, dtype, axis, rng):
    x = distinct(rng, SHAPE).astype(dtype)
    ph = K.placeholder(shape=SHAPE, dtype=dtype)
    if axis is None:
        out, ref = kfn(ph), nfn(x, axis=-1)  # default axis=-1
    else:
        out, ref = kfn(ph, axis=axis), nfn(x, axis=axis)
    assert K.int_shape(out) == ref.shape
    value = np.asarray(run([ph], [out], [x])[0])
    assert np.issubdtype(value.dtype, np.integer), value.dtype
    np.testing.assert_array_equal(value, ref)


# ---- cumsum / cumprod --------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -2], ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "name,kfn,nfn,domain",
    [
        ("cumsum", K.cumsum, np.cumsum, distinct),
        ("cumprod", K.cumprod, np.cumprod, signed_near_one),
    ],
)
def test_cumulative(name, kfn, nfn, domain, dtype, axis, rng):
    x = domain(rng, SHAPE).astype(dtype)
    ph = K.placeholder(shape=SHAPE, dtype=dtype)
    if axis is None:
        out, ref = kfn(ph), nfn(x.astype(np.float64), axis=0)  # default axis=0
    else:
        out, ref = kfn(ph, axis=axis), nfn(x.astype(np.float64), axis=axis)
    assert K.int_shape(out) == SHAPE
    value = run([ph], [out], [x])[0]
    assert value.dtype == np.dtype(dtype)
    rtol, atol = tolerances(dtype, 1e-5, 1e-5)
    np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize(
    "name,kfn,domain",
    [
        ("cumsum", K.cumsum, distinct),
        ("cumprod", K.cumprod, signed_near_one),
    ],
)
def test_cumulative_gradient(name, kfn, domain, axis, rng):
    check_grad(lambda t: kfn(t, axis=axis), [domain(rng, SHAPE)])


# ---- logsumexp stability -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("offset", [1e4, -1e4])
def test_logsumexp_is_stable_for_large_magnitudes(offset, dtype, rng):
    x = (offset + rng.normal(size=(3, 5))).astype(dtype)
    ph = K.placeholder(shape=(3, 5), dtype=dtype)
    outs = [K.logsumexp(ph, axis=1), K.logsumexp(ph), K.logsumexp(ph, axis=0, keepdims=True)]
    values = run([ph], outs, [x])
    x64 = x.astype(np.float64)
    refs = [np_logsumexp(x64, axis=1), np_logsumexp(x64), np_logsumexp(x64, axis=0, keepdims=True)]
    for v, r in zip(values, refs):
        assert np.all(np.isfinite(v)), v
        np.testing.assert_allclose(v, r, rtol=1e-6, atol=0)


def test_logsumexp_gradient_is_stable_for_large_magnitudes(rng):
    # d logsumexp / dx = softmax(x): finite and summing to 1 even at |x| ~ 1e4.
    x = 1e4 + rng.normal(size=(3, 5))
    ph = K.placeholder(shape=(3, 5), dtype="float64")
    g = K.gradients(K.sum(K.logsumexp(ph, axis=1)), [ph])[0]
    value = run([ph], [g], [x])[0]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(value, e / e.sum(axis=1, keepdims=True), rtol=1e-10, atol=1e-12)


# ---- kernel paths over leading and middle axes ------------------------------------------
# Shapes large enough for the CPU kernel's register strips (16 float32 / 8 float64 columns
# and a remainder), the row-split across threads for one block of many narrow rows, and
# the column split for wide rows.

BIG_SHAPE = (37, 21, 40)
# 48 and 432 columns: an odd number of 16-column float32 strips, so the kernel's two-vector
# strips leave one single strip (and float64 runs its 8-column strips in pairs).
ODD_STRIPS_SHAPE = (23, 9, 48)
ALL_AXES = [None, 0, 1, 2, (0, 1), (0, 2), (1, 2), (0, 1, 2)]


def near_one(rng, shape):
    return rng.uniform(0.99, 1.01, size=shape)


@pytest.mark.parametrize("axis", ALL_AXES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "name,kfn,nfn,domain",
    [
        ("sum", K.sum, np.sum, distinct),
        ("mean", K.mean, np.mean, distinct),
        ("max", K.max, np.max, distinct),
        ("min", K.min, np.min, distinct),
        ("prod", K.prod, np.prod, near_one),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@pytest.mark.parametrize("shape", [BIG_SHAPE, ODD_STRIPS_SHAPE], ids=str)
def test_reduction_every_axis_set_large(name, kfn, nfn, domain, dtype, axis, shape, rng):
    x = domain(rng, shape).astype(dtype)
    ph = K.placeholder(shape=shape, dtype=dtype)
    value = run([ph], [kfn(ph, axis=axis)], [x])[0]
    ref = nfn(x.astype(np.float64), axis=axis)
    eps, count = np.finfo(dtype).eps, x.size / np.size(ref)
    if name in ("sum", "mean"):
        # compensated: within a few ulps of the float64 sum of magnitudes (/count for mean)
        bound = (
            4
            * eps
            * np.sum(np.abs(x.astype(np.float64)), axis=axis)
            / (count if name == "mean" else 1)
        )
    elif name == "prod":
        bound = count * eps * np.abs(ref)
    else:
        bound = 0 * ref  # max/min pick an element: exact
    assert np.all(np.abs(value - ref) <= bound), (
        f"max error {np.max(np.abs(value - ref) - bound)} over the bound"
    )


@pytest.mark.parametrize(
    "shape,axis",
    [
        ((100_000, 3), 0),  # one block of many narrow rows: split across threads
        ((400, 9, 40), (0, 1)),  # a bias gradient's shape family
        ((64, 24, 24, 64), (0, 1, 2)),
        ((3, 20_000, 5), 1),  # several blocks
        ((50, 5000), 0),  # wide rows: split by columns
    ],
)
def test_column_sums_of_offset_float32_stay_accurate(shape, axis, rng):
    # Documented bound (README, "Reliability guarantees"): rtol 1e-6 of the float64 sum.
    x = (1000 + rng.uniform(0, 1, size=shape)).astype(np.float32)
    ph = K.placeholder(shape=shape)
    s, m = run([ph], [K.sum(ph, axis=axis), K.mean(ph, axis=axis)], [x])
    ref = np.sum(x.astype(np.float64), axis=axis)
    np.testing.assert_allclose(s, ref, rtol=1e-6)
    np.testing.assert_allclose(m, ref / (x.size / ref.size), rtol=1e-6)


def test_column_sums_with_infinities_and_nans():
    x = np.ones((300, 40), np.float32)
    x[5, 0] = np.inf
    x[7, 1], x[9, 1] = np.inf, -np.inf
    x[11, 2] = np.nan
    x[13, 3] = np.float32(3e38)
    x[14, 3] = np.float32(3e38)  # overflows to inf
    ph = K.placeholder(shape=x.shape)
    s, mx = run([ph], [K.sum(ph, axis=0), K.max(ph, axis=0)], [x])
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.sum(x, axis=0)
    np.testing.assert_array_equal(s[:4], ref[:4])
    np.testing.assert_allclose(s[4:], ref[4:])
    assert np.isnan(mx[2]) and mx[0] == np.inf


# ---- gradients at zeros and of 0-d products -----------------------------------------------


def test_prod_gradient_of_a_0d_tensor():
    v = K.variable(2.5)
    g = K.gradients(K.prod(v), [v])[0]
    assert K.eval(g) == 1.0
    check_grad(lambda t: K.prod(t) * t, [np.array(1.5)])
    check_grad(lambda t: K.prod(t, axis=[]), [np.array([1.5, -2.0])])


@pytest.mark.parametrize("axis", [0, 1])
def test_cumprod_gradient_is_exact_at_zeros(axis):
    # One zero, two zeros, a zero first and last; the product is multilinear, so central
    # differences are exact up to rounding.
    x = np.array(
        [
            [2.0, 0.0, 3.0, -1.5, 0.5],
            [0.0, 1.5, 0.0, 2.0, -2.0],
            [1.5, -0.5, 2.0, 3.0, 0.0],
            [0.0, 0.0, 0.0, 1.0, 2.0],
        ]
    )
    grads = check_grad(lambda t: K.cumprod(t, axis=axis), [x])
    assert np.all(np.isfinite(grads[0]))


def test_cumprod_gradient_at_a_zero_by_hand():
    x = K.variable(np.array([2.0, 0.0, 3.0, 4.0], "float32"))
    g = K.eval(K.gradients(K.sum(K.cumprod(x)), [x])[0])
    # y = [x0, x0 x1, x0 x1 x2, x0 x1 x2 x3]
    np.testing.assert_allclose(g, [1.0, 2.0 + 6.0 + 24.0, 0.0, 0.0])


def test_prod_second_derivative_at_zeros():
    # The gradient of prod is built from exclusive and reversed cumprods; differentiating
    # it again runs their gradient at zeros.
    x = np.array([[2.0, 0.0, 3.0, 0.5], [0.0, 0.0, 1.5, 2.0], [1.0, -2.0, 0.5, 3.0]])
    check_grad(lambda t: K.gradients(K.sum(K.prod(t, axis=1) ** 2), [t])[0], [x])
