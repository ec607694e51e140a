"""Elementwise functions, tensor operators and broadcasting, against NumPy.

Table-driven (CONTRIBUTING.md, "How the code reads"): one record per op drives the forward test (three ways
of giving inputs: placeholder fed through K.function, K.variable and K.constant evaluated
with K.eval), the dtype test and the finite-difference gradient test.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import check_grad, run, tolerances

FLOATS = ("float32", "float64")
SHAPE = (2, 3, 4)


# ---- input domains: sampler(rng, shape) -> float64 array --------------------------


def uniform(lo, hi):
    def sample(rng, shape):
        return rng.uniform(lo, hi, size=shape)

    return sample


def away_from(lo, hi, kinks, gap=0.05):
    """Uniform on [lo, hi] but at least `gap` from every kink (for non-smooth points)."""

    def sample(rng, shape):
        x = rng.uniform(lo, hi, size=shape)
        for _ in range(100):
            bad = np.zeros(x.shape, dtype=bool)
            for k in kinks:
                bad |= np.abs(x - k) < gap
            if not bad.any():
                return x
            x = np.where(bad, rng.uniform(lo, hi, size=shape), x)
        raise AssertionError("sampler did not converge")

    return sample


def grid(lo, hi, step, offset):
    """Values offset + k*step in [lo, hi]: two grids with different offsets never tie."""

    def sample(rng, shape):
        k = rng.integers(
            int(np.ceil((lo - offset) / step)), int(np.floor((hi - offset) / step)) + 1, size=shape
        )
        return offset + k * step

    return sample


def small_ints(lo, hi):
    """Integer-valued floats, so that equality cases occur often."""

    def sample(rng, shape):
        return rng.integers(lo, hi + 1, size=shape).astype(np.float64)

    return sample


def with_zeros(base):
    def sample(rng, shape):
        x = base(rng, shape)
        flat = x.reshape(-1)
        flat[::5] = 0.0
        return flat.reshape(shape)

    return sample


def with_halves(rng, shape):
    """Exact ties k + 0.5 first (half-to-even cases), random values after."""
    x = rng.uniform(-4, 4, size=shape).reshape(-1)
    ties = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.0, -3.5, 4.5])
    n = min(ties.size, x.size)
    x[:n] = ties[:n]
    return x.reshape(shape)


# ---- op records ---------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    name: str
    k: Callable  # takes K tensors, returns a K tensor
    ref: Callable  # NumPy reference, takes float64 arrays
    arity: int = 1
    domain: tuple[Callable, ...] = (uniform(-3, 3),)  # one sampler per input
    dtypes: tuple[str, ...] = FLOATS
    tol32: tuple[float, float] = (1e-5, 1e-6)  # (rtol, atol) for float32
    grad: bool = True
    boolean: bool = False  # result is a bool tensor (comparisons)

    def sample(self, rng, shapes):
        doms = self.domain if len(self.domain) == self.arity else self.domain * self.arity
        return [d(rng, s) for d, s in zip(doms, shapes)]

    def __repr__(self):
        return self.name


# WGSL allows an absolute error of 2**-11 for sin/cos on [-pi, pi] and a few ULP (plus
# |x|-dependent terms) for exp/log/pow/tanh; the CPU path is much tighter than this.
TRANSCENDENTAL = (2e-5, 1e-5)
TRIG = (1e-5, 5e-4)

UNARY = [
    Op("abs", K.abs, np.abs, domain=(away_from(-3, 3, [0.0]),)),
    Op("square", K.square, np.square),
    Op("sqrt", K.sqrt, np.sqrt, domain=(uniform(0.1, 4),), tol32=TRANSCENDENTAL),
    Op("exp", K.exp, np.exp, tol32=TRANSCENDENTAL),
    Op("log", K.log, np.log, domain=(uniform(0.1, 5),), tol32=TRANSCENDENTAL),
    Op("sign", K.sign, np.sign, domain=(with_zeros(uniform(-3, 3)),), grad=False),
    # The doc (keras_backends.md, `round`): "In case of tie, the rounding mode used is
    # 'half to even'", which is what np.round does.
    Op("round", K.round, np.round, domain=(with_halves,), grad=False),
    Op("pow2", lambda x: K.pow(x, 2), lambda x: np.power(x, 2)),
    Op("pow3_negative_base", lambda x: K.pow(x, 3), lambda x: np.power(x, 3), tol32=TRANSCENDENTAL),
    Op(
        "pow_half",
        lambda x: K.pow(x, 0.5),
        lambda x: np.power(x, 0.5),
        domain=(uniform(0.1, 4),),
        tol32=TRANSCENDENTAL,
    ),
    Op(
        "pow_minus1",
        lambda x: K.pow(x, -1),
        lambda x: np.power(x, -1.0),
        domain=(uniform(0.5, 3),),
        tol32=TRANSCENDENTAL,
    ),
    Op(
        "pow_1p5",
        lambda x: K.pow(x, 1.5),
        lambda x: np.power(x, 1.5),
        domain=(uniform(0.1, 3),),
        tol32=TRANSCENDENTAL,
    ),
    Op(
        "clip",
        lambda x: K.clip(x, -0.5, 0.7),
        lambda x: np.clip(x, -0.5, 0.7),
        domain=(away_from(-2, 2, [-0.5, 0.7]),),
    ),
    Op(
        "clip_int_bounds",
        lambda x: K.clip(x, 0, 1),
        lambda x: np.clip(x, 0, 1),
        domain=(away_from(-2, 2, [0.0, 1.0]),),
    ),
    Op("sin", K.sin, np.sin, tol32=TRIG),
    Op("cos", K.cos, np.cos, tol32=TRIG),
    Op("tanh", K.tanh, np.tanh, tol32=TRANSCENDENTAL),
    Op(
        "sigmoid",
        K.sigmoid,
        lambda x: 1.0 / (1.0 + np.exp(-x)),
        domain=(uniform(-6, 6),),
        tol32=TRANSCENDENTAL,
    ),
    Op("neg", lambda x: -x, np.negative),
    Op("scalar_rsub", lambda x: 2 - x, lambda x: 2 - x),
    Op("scalar_rdiv", lambda x: 1 / x, lambda x: 1 / x, domain=(away_from(-3, 3, [0.0], 0.3),)),
    Op("scalar_radd", lambda x: 3 + x, lambda x: 3 + x),
    Op("scalar_rmul", lambda x: 2.5 * x, lambda x: 2.5 * x),
    Op("scalar_rpow", lambda x: 2**x, lambda x: np.power(2.0, x), tol32=TRANSCENDENTAL),
    Op("scalar_sub", lambda x: x - 2, lambda x: x - 2),
    Op("scalar_div", lambda x: x / 4, lambda x: x / 4),
    Op("scalar_pow", lambda x: x**2, lambda x: x**2),
    Op("scalar_pow_int3", lambda x: x**3, lambda x: x**3, tol32=TRANSCENDENTAL),
    Op(
        "scalar_maximum",
        lambda x: K.maximum(x, 0.5),
        lambda x: np.maximum(x, 0.5),
        domain=(away_from(-3, 3, [0.5]),),
    ),
    Op(
        "scalar_minimum",
        lambda x: K.minimum(x, 0.5),
        lambda x: np.minimum(x, 0.5),
        domain=(away_from(-3, 3, [0.5]),),
    ),
    Op("scalar_greater", lambda x: x > 0.5, lambda x: x > 0.5, grad=False, boolean=True),
    Op(
        "scalar_less_equal",
        lambda x: x <= 1.0,
        lambda x: x <= 1.0,
        domain=(small_ints(-2, 2),),
        grad=False,
        boolean=True,
    ),
    Op("scalar_reflected_less", lambda x: 0.5 < x, lambda x: 0.5 < x, grad=False, boolean=True),
    Op(
        "K_equal_scalar",
        lambda x: K.equal(x, 1.0),
        lambda x: x == 1.0,
        domain=(small_ints(-2, 2),),
        grad=False,
        boolean=True,
    ),
    Op(
        "K_greater_scalar",
        lambda x: K.greater(x, 0.0),
        lambda x: x > 0.0,
        domain=(small_ints(-2, 2),),
        grad=False,
        boolean=True,
    ),
]

TIES = (small_ints(-2, 2),)  # comparisons: many equal pairs
NO_TIES = (grid(-3, 3, 0.2, 0.05), grid(-3, 3, 0.2, 0.15))  # |x - y| >= 0.1 always
NONZERO = (uniform(-3, 3), away_from(-3, 3, [0.0], 0.3))
POSITIVE_BASE = (uniform(0.5, 2.0), uniform(-2, 2))

BINARY = [
    Op("add", lambda x, y: x + y, np.add, arity=2),
    Op("sub", lambda x, y: x - y, np.subtract, arity=2),
    Op("mul", lambda x, y: x * y, np.multiply, arity=2),
    Op("truediv", lambda x, y: x / y, np.divide, arity=2, domain=NONZERO),
    Op(
        "pow_tensor",
        lambda x, y: x**y,
        np.power,
        arity=2,
        domain=POSITIVE_BASE,
        tol32=TRANSCENDENTAL,
    ),
    Op("maximum", K.maximum, np.maximum, arity=2, domain=NO_TIES),
    Op("minimum", K.minimum, np.minimum, arity=2, domain=NO_TIES),
    Op("equal", K.equal, np.equal, arity=2, domain=TIES, grad=False, boolean=True),
    Op("not_equal", K.not_equal, np.not_equal, arity=2, domain=TIES, grad=False, boolean=True),
    Op("greater", K.greater, np.greater, arity=2, domain=TIES, grad=False, boolean=True),
    Op(
        "greater_equal",
        K.greater_equal,
        np.greater_equal,
        arity=2,
        domain=TIES,
        grad=False,
        boolean=True,
    ),
    Op("less", K.less, np.less, arity=2, domain=TIES, grad=False, boolean=True),
    Op("less_equal", K.less_equal, np.less_equal, arity=2, domain=TIES, grad=False, boolean=True),
    Op("op_lt", lambda x, y: x < y, np.less, arity=2, domain=TIES, grad=False, boolean=True),
    Op("op_le", lambda x, y: x <= y, np.less_equal, arity=2, domain=TIES, grad=False, boolean=True),
    Op("op_gt", lambda x, y: x > y, np.greater, arity=2, domain=TIES, grad=False, boolean=True),
    Op(
        "op_ge",
        lambda x, y: x >= y,
        np.greater_equal,
        arity=2,
        domain=TIES,
        grad=False,
        boolean=True,
    ),
]

ALL = UNARY + BINARY
MODES = ("placeholder", "variable", "constant")


def _check_result(op, out_tensor, value, ref, dtype):
    value = np.asarray(value)
    assert value.shape == ref.shape, (value.shape, ref.shape)
    if op.boolean:
        assert K.dtype(out_tensor) == "bool"
        assert value.dtype == np.bool_
        np.testing.assert_array_equal(value, ref)
    else:
        assert K.dtype(out_tensor) == dtype
        assert value.dtype == np.dtype(dtype)
        rtol, atol = tolerances(dtype, *op.tol32)
        np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ALL, ids=repr)
def test_forward(op, dtype, mode, rng):
    arrays = [a.astype(dtype) for a in op.sample(rng, [SHAPE] * op.arity)]
    ref = op.ref(*[a.astype(np.float64) for a in arrays])
    if mode == "placeholder":
        phs = [K.placeholder(shape=SHAPE, dtype=dtype) for _ in arrays]
        out = op.k(*phs)
        assert K.int_shape(out) == SHAPE
        value = run(phs, [out], arrays)[0]
    else:
        make = K.variable if mode == "variable" else K.constant
        out = op.k(*[make(a, dtype=dtype) for a in arrays])
        value = K.eval(out)
    _check_result(op, out, value, ref, dtype)


@pytest.mark.parametrize("op", [o for o in ALL if o.grad], ids=repr)
def test_gradient(op, rng):
    arrays = op.sample(rng, [(2, 3)] * op.arity)
    check_grad(op.k, arrays)


# ---- numpy scalars on the left of an operator ----------------------------------------

NUMPY_SCALAR_OPS = [
    ("rsub", lambda s, x: s - x),
    ("radd", lambda s, x: s + x),
    ("rmul", lambda s, x: s * x),
    ("rdiv", lambda s, x: s / x),
    ("rpow", lambda s, x: s**x),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name,f", NUMPY_SCALAR_OPS, ids=[n for n, _ in NUMPY_SCALAR_OPS])
def test_numpy_scalar_on_the_left_stays_symbolic(name, f, dtype, rng):
    # `np.float32(2) - x` must build a graph node (NumPy has to defer to the tensor's
    # reflected operator), not try to turn the placeholder into an array.
    x = rng.uniform(0.5, 2.0, size=(3, 4)).astype(dtype)
    s = np.dtype(dtype).type(2.0)
    ph = K.placeholder(shape=x.shape, dtype=dtype)
    out = f(s, ph)
    assert not isinstance(out, np.ndarray)
    value = run([ph], [out], [x])[0]
    ref = f(np.float64(2.0), x.astype(np.float64))
    assert value.dtype == np.dtype(dtype)
    rtol, atol = tolerances(dtype, *TRANSCENDENTAL)
    np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol)


# ---- matmul operator -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_operator(dtype, rng):
    a = rng.normal(size=(2, 3)).astype(dtype)
    b = rng.normal(size=(3, 4)).astype(dtype)
    pa = K.placeholder(shape=a.shape, dtype=dtype)
    pb = K.placeholder(shape=b.shape, dtype=dtype)
    out = pa @ pb
    assert K.int_shape(out) == (2, 4)
    value = run([pa, pb], [out], [a, b])[0]
    assert value.dtype == np.dtype(dtype)
    rtol, atol = tolerances(dtype)
    np.testing.assert_allclose(
        value, a.astype(np.float64) @ b.astype(np.float64), rtol=rtol, atol=atol
    )


def test_matmul_operator_gradient(rng):
    check_grad(lambda a, b: a @ b, [rng.normal(size=(2, 3)), rng.normal(size=(3, 4))])


# ---- broadcasting ------------------------------------------------------------------------

BROADCAST_SHAPES = [
    ((3, 1), (1, 4)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((2, 3, 4), ()),
    ((), (3,)),
    ((2, 1, 4), (3, 1)),
]
BROADCAST_OPS = [
    o
    for o in BINARY
    if o.name
    in (
        "add",
        "sub",
        "mul",
        "truediv",
        "pow_tensor",
        "maximum",
        "minimum",
        "equal",
        "greater",
        "less_equal",
    )
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("op", BROADCAST_OPS, ids=repr)
def test_broadcast_forward(op, shapes, dtype, rng):
    arrays = [np.asarray(a).astype(dtype) for a in op.sample(rng, list(shapes))]
    phs = [K.placeholder(shape=s, dtype=dtype) for s in shapes]
    out = op.k(*phs)
    expected_shape = np.broadcast_shapes(*shapes)
    assert K.int_shape(out) == expected_shape
    value = run(phs, [out], arrays)[0]
    ref = np.asarray(op.ref(*[a.astype(np.float64) for a in arrays]))
    _check_result(op, out, value, ref, dtype)


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("op", [o for o in BROADCAST_OPS if o.grad], ids=repr)
def test_broadcast_gradient(op, shapes, rng):
    # The gradient of a broadcast input is summed back to that input's shape.
    check_grad(op.k, op.sample(rng, list(shapes)))


@pytest.mark.parametrize("dtype", FLOATS)
def test_python_scalar_keeps_tensor_dtype(dtype, rng):
    x = rng.normal(size=(4,)).astype(dtype)
    ph = K.placeholder(shape=(4,), dtype=dtype)
    outs = [ph + 1, 1 + ph, ph * 0.5, 2.0 - ph, ph / 3, 1 / (ph * ph + 1), -ph]
    for t in outs:
        assert K.dtype(t) == dtype
    values = run([ph], outs, [x])
    x64 = x.astype(np.float64)
    refs = [x64 + 1, 1 + x64, x64 * 0.5, 2.0 - x64, x64 / 3, 1 / (x64 * x64 + 1), -x64]
    rtol, atol = tolerances(dtype)
    for v, r in zip(values, refs):
        assert v.dtype == np.dtype(dtype)
        np.testing.assert_allclose(v, r, rtol=rtol, atol=atol)


def test_chained_expression_matches_numpy(rng):
    # A longer elementwise chain (the kind a compiler fuses) against NumPy.
    a = rng.normal(size=(5, 6)).astype("float32")
    b = rng.uniform(0.5, 2.0, size=(6,)).astype("float32")
    pa = K.placeholder(shape=(None, 6))
    pb = K.placeholder(shape=(6,))
    out = K.tanh(pa * pb + 1.0) - K.exp(-K.square(pa)) / pb + K.sigmoid(pa) ** 2
    value = run([pa, pb], [out], [a, b])[0]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.tanh(a64 * b64 + 1.0) - np.exp(-(a64**2)) / b64 + (1 / (1 + np.exp(-a64))) ** 2
    np.testing.assert_allclose(value, ref, rtol=2e-5, atol=2e-5)


def test_pow_gradient_with_a_zero_exponent_is_zero_at_zero():
    # x ** 0 is constant: d/dx is 0 everywhere, also at x = 0 (not 0 * inf = NaN); with a
    # tensor exponent that is zero only in places, the other places keep b * x ** (b - 1).
    x = K.placeholder(shape=(4,))
    b = K.placeholder(shape=(4,))
    xv = np.array([0.0, 0.0, 2.0, 0.0], "float32")
    bv = np.array([0.0, 2.0, 0.0, 3.0], "float32")
    g_const, g_tensor = K.function(
        [x, b],
        [K.gradients(K.sum(K.pow(x, 0)), [x])[0], K.gradients(K.sum(K.pow(x, b)), [x])[0]],
    )([xv, bv])
    np.testing.assert_array_equal(g_const, [0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(g_tensor, [0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(
        K.function([x, b], [K.gradients(K.sum(K.pow(x, b)), [x])[0]])(
            [np.array([1.5, 2.0, 3.0, -1.0], "float32"), np.array([0.0, 2.0, 1.0, 3.0], "float32")]
        )[0],
        [0.0, 4.0, 1.0, 3.0],
    )
