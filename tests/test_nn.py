"""Activations, crossentropies, normalisation and bias against NumPy.

Table-driven (CONTRIBUTING.md, "How the code reads"): each record gives the K call (differentiable inputs
only; fixed targets are captured NumPy arrays), the NumPy reference, the input shapes and
domain, the float32 tolerance and whether it is differentiable. The records drive a
forward test (float32 and float64) and a finite-difference gradient test (float64).
The references follow the formulas of tf.keras.backend (TF 2.x), quoted next to each.
Separate tests cover inputs of magnitude 1e4, the clipping edges of the crossentropies,
in_top_k's tie rule and the argument checks.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import assert_mentions, check_grad, run, tolerances
from reference import (
    np_bce,
    np_bce_logits,
    np_bn,
    np_cce,
    np_cce_logits,
    np_in_top_k,
    np_l2_normalize,
    np_nbt,
    np_relu,
    np_scce,
    np_softmax,
)

FLOATS = ("float32", "float64")


# ---- input domains: sampler(rng, shape) -> float64 array -----------------------------------------


def normal(scale=1.0):
    return lambda rng, shape: rng.normal(scale=scale, size=shape)


def away_from(lo, hi, kinks, gap=0.05):
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


def probs(axis=-1):
    """Rows that sum to 1 along `axis`, every entry well inside (eps, 1 - eps)."""

    def sample(rng, shape):
        e = np.exp(rng.normal(scale=0.3, size=shape))
        return e / e.sum(axis=axis, keepdims=True)

    return sample


def uniform(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, size=shape)


# ---- NumPy references ----------------------------------------------------------------------------


def along(v, axis, ndim):
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


# Fixed targets, drawn once from a fixed seed.
_T = np.random.default_rng(7)
ONEHOT_3x4 = np.eye(4)[_T.integers(0, 4, size=3)]
SOFT_3x4 = probs()(_T, (3, 4))
ONEHOT_2x3x4_AXIS1 = np.moveaxis(np.eye(3)[_T.integers(0, 3, size=(2, 4))], -1, 1)
INT_3 = _T.integers(0, 4, size=3)
INT_2x4 = _T.integers(0, 3, size=(2, 4))
INT_2x3 = _T.integers(0, 4, size=(2, 3))
BIN_2x3 = _T.integers(0, 2, size=(2, 3)).astype(float)
SOFTBIN_2x3 = _T.uniform(0, 1, size=(2, 3))


@dataclass(frozen=True)
class Rec:
    name: str
    k: Callable
    ref: Callable
    shapes: tuple[tuple, ...]
    domain: tuple[Callable, ...] = (normal(),)
    tol32: tuple[float, float] = (1e-5, 1e-6)
    grad: bool = True

    def sample(self, rng):
        doms = (
            self.domain if len(self.domain) == len(self.shapes) else self.domain * len(self.shapes)
        )
        return [d(rng, s) for d, s in zip(doms, self.shapes)]

    def __repr__(self):
        return self.name


S = (2, 3, 4)
TR = (2e-5, 1e-5)  # transcendental chains in float32

ACTIVATIONS = [
    Rec("relu", K.relu, np_relu, (S,), (away_from(-3, 3, [0.0]),)),
    Rec(
        "relu_alpha",
        lambda x: K.relu(x, alpha=0.2),
        lambda x: np_relu(x, 0.2),
        (S,),
        (away_from(-3, 3, [0.0]),),
    ),
    Rec(
        "relu_max_value",
        lambda x: K.relu(x, max_value=1.5),
        lambda x: np_relu(x, max_value=1.5),
        (S,),
        (away_from(-3, 3, [0.0, 1.5]),),
    ),
    Rec(
        "relu_max_value_6",
        lambda x: K.relu(x, max_value=6.0),
        lambda x: np_relu(x, max_value=6.0),
        (S,),
        (away_from(-8, 8, [0.0, 6.0]),),
    ),
    Rec(
        "relu_threshold",
        lambda x: K.relu(x, threshold=0.5),
        lambda x: np_relu(x, threshold=0.5),
        (S,),
        (away_from(-3, 3, [0.5]),),
    ),
    Rec(
        "relu_all",
        lambda x: K.relu(x, alpha=0.1, max_value=2.0, threshold=-0.5),
        lambda x: np_relu(x, 0.1, 2.0, -0.5),
        (S,),
        (away_from(-3, 3, [-0.5, 2.0]),),
    ),
    Rec(
        "relu_positional",
        lambda x: K.relu(x, 0.3, 1.0),
        lambda x: np_relu(x, 0.3, 1.0),
        (S,),
        (away_from(-3, 3, [0.0, 1.0]),),
    ),
    Rec(
        "elu",
        K.elu,
        lambda x: np.where(x > 0, x, np.expm1(x)),
        (S,),
        (away_from(-3, 3, [0.0]),),
        TR,
    ),
    Rec(
        "elu_alpha",
        lambda x: K.elu(x, 0.5),
        lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)),
        (S,),
        (away_from(-3, 3, [0.0]),),
        TR,
    ),
    Rec("softmax", K.softmax, np_softmax, (S,), (normal(2.0),), TR),
    Rec(
        "softmax_axis0",
        lambda x: K.softmax(x, axis=0),
        lambda x: np_softmax(x, 0),
        (S,),
        (normal(),),
        TR,
    ),
    Rec(
        "softmax_axis1",
        lambda x: K.softmax(x, 1),
        lambda x: np_softmax(x, 1),
        (S,),
        (normal(),),
        TR,
    ),
    Rec("softplus", K.softplus, lambda x: np.logaddexp(0, x), (S,), (normal(3.0),), TR),
    Rec("softsign", K.softsign, lambda x: x / (1 + np.abs(x)), (S,), (away_from(-3, 3, [0.0]),)),
    Rec(
        "hard_sigmoid",
        K.hard_sigmoid,
        lambda x: np.clip(0.2 * x + 0.5, 0, 1),
        (S,),
        (away_from(-4, 4, [-2.5, 2.5]),),
    ),
    Rec("sigmoid", K.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (S,), (normal(3.0),), TR),
    Rec("tanh", K.tanh, np.tanh, (S,), (normal(),), TR),
]

LOSSES = [
    Rec(
        "categorical_crossentropy_onehot",
        lambda p: K.categorical_crossentropy(ONEHOT_3x4, p),
        lambda p: np_cce(ONEHOT_3x4, p),
        ((3, 4),),
        (probs(),),
        TR,
    ),
    Rec(
        "categorical_crossentropy_soft_unnormalised",
        lambda p: K.categorical_crossentropy(SOFT_3x4, p),
        lambda p: np_cce(SOFT_3x4, p),
        ((3, 4),),
        (uniform(0.1, 2.0),),
        TR,
    ),
    Rec(
        "categorical_crossentropy_target_grad",
        lambda t, p: K.categorical_crossentropy(t, p),
        np_cce,
        ((3, 4), (3, 4)),
        (probs(), probs()),
        TR,
    ),
    Rec(
        "categorical_crossentropy_logits",
        lambda z: K.categorical_crossentropy(SOFT_3x4, z, from_logits=True),
        lambda z: np_cce_logits(SOFT_3x4, z),
        ((3, 4),),
        (normal(3.0),),
        TR,
    ),
    Rec(
        "categorical_crossentropy_axis1",
        lambda p: K.categorical_crossentropy(ONEHOT_2x3x4_AXIS1, p, axis=1),
        lambda p: np_cce(ONEHOT_2x3x4_AXIS1, p, 1),
        ((2, 3, 4),),
        (probs(1),),
        TR,
    ),
    Rec(
        "categorical_crossentropy_logits_axis1",
        lambda z: K.categorical_crossentropy(ONEHOT_2x3x4_AXIS1, z, from_logits=True, axis=1),
        lambda z: np_cce_logits(ONEHOT_2x3x4_AXIS1, z, 1),
        ((2, 3, 4),),
        (normal(),),
        TR,
    ),
    Rec(
        "categorical_crossentropy_of_softmax",
        lambda z: K.categorical_crossentropy(SOFT_3x4, K.softmax(z)),
        lambda z: np_cce_logits(SOFT_3x4, z),
        ((3, 4),),
        (normal(),),
        TR,
    ),
    Rec(
        "sparse_categorical_crossentropy",
        lambda p: K.sparse_categorical_crossentropy(INT_3, p),
        lambda p: np_scce(INT_3, p),
        ((3, 4),),
        (probs(),),
        TR,
    ),
    Rec(
        "sparse_categorical_crossentropy_unnormalised",
        lambda p: K.sparse_categorical_crossentropy(INT_3, p),
        lambda p: np_scce(INT_3, p),
        ((3, 4),),
        (uniform(0.1, 0.9),),
        TR,
    ),
    Rec(
        "sparse_categorical_crossentropy_float_target",
        lambda p: K.sparse_categorical_crossentropy(INT_3.astype(float), p),
        lambda p: np_scce(INT_3, p),
        ((3, 4),),
        (probs(),),
        TR,
    ),
    Rec(
        "sparse_categorical_crossentropy_target_n1",
        lambda p: K.sparse_categorical_crossentropy(INT_3[:, None], p),
        lambda p: np_scce(INT_3[:, None], p),
        ((3, 4),),
        (probs(),),
        TR,
    ),
    Rec(
        "sparse_categorical_crossentropy_logits",
        lambda z: K.sparse_categorical_crossentropy(INT_2x3, z, from_logits=True),
        lambda z: np_scce(INT_2x3, z, from_logits=True),
        ((2, 3, 4),),
        (normal(2.0),),
        TR,
    ),
    Rec(
        "sparse_categorical_crossentropy_axis1",
        lambda p: K.sparse_categorical_crossentropy(INT_2x4, p, axis=1),
        lambda p: np_scce(INT_2x4, p, axis=1),
        ((2, 3, 4),),
        (probs(1),),
        TR,
    ),
    Rec(
        "sparse_categorical_crossentropy_logits_axis1",
        lambda z: K.sparse_categorical_crossentropy(INT_2x4, z, True, 1),
        lambda z: np_scce(INT_2x4, z, axis=1, from_logits=True),
        ((2, 3, 4),),
        (normal(),),
        TR,
    ),
    Rec(
        "sparse_categorical_crossentropy_of_softmax",
        lambda z: K.sparse_categorical_crossentropy(INT_3, K.softmax(z)),
        lambda z: np_scce(INT_3, z, from_logits=True),
        ((3, 4),),
        (normal(),),
        TR,
    ),
    Rec(
        "binary_crossentropy",
        lambda p: K.binary_crossentropy(BIN_2x3, p),
        lambda p: np_bce(BIN_2x3, p),
        ((2, 3),),
        (uniform(0.05, 0.95),),
        TR,
    ),
    Rec(
        "binary_crossentropy_soft",
        lambda t, p: K.binary_crossentropy(t, p),
        np_bce,
        ((2, 3), (2, 3)),
        (uniform(0, 1), uniform(0.05, 0.95)),
        TR,
    ),
    Rec(
        "binary_crossentropy_logits",
        lambda z: K.binary_crossentropy(SOFTBIN_2x3, z, from_logits=True),
        lambda z: np_bce_logits(SOFTBIN_2x3, z),
        ((2, 3),),
        (normal(3.0),),
        TR,
    ),
    Rec(
        "binary_crossentropy_logits_target_grad",
        lambda t, z: K.binary_crossentropy(t, z, True),
        np_bce_logits,
        ((2, 3), (2, 3)),
        (uniform(0, 1), normal(3.0)),
        TR,
    ),
    Rec(
        "binary_crossentropy_of_sigmoid",
        lambda z: K.binary_crossentropy(SOFTBIN_2x3, K.sigmoid(z)),
        lambda z: np_bce_logits(SOFTBIN_2x3, z),
        ((2, 3),),
        (normal(3.0),),
        TR,
    ),
]

_G = np.random.default_rng(11)
VAR3 = _G.uniform(0.5, 2.0, size=3)
MEAN3 = _G.normal(size=3)

NORMS = (
    [
        Rec("l2_normalize_all", K.l2_normalize, np_l2_normalize, (S,)),
        Rec(
            "l2_normalize_axis1",
            lambda x: K.l2_normalize(x, axis=1),
            lambda x: np_l2_normalize(x, 1),
            (S,),
        ),
        Rec(
            "l2_normalize_axis_minus1",
            lambda x: K.l2_normalize(x, -1),
            lambda x: np_l2_normalize(x, -1),
            (S,),
        ),
        Rec(
            "l2_normalize_axes_list",
            lambda x: K.l2_normalize(x, [0, 2]),
            lambda x: np_l2_normalize(x, (0, 2)),
            (S,),
        ),
        Rec(
            "batch_normalization_last_axis",
            lambda x, m, v, b, g: K.batch_normalization(x, m, v, b, g, epsilon=1e-3),
            lambda x, m, v, b, g: np_bn(x, m, v, b, g, 1e-3),
            ((2, 3, 4), (4,), (4,), (4,), (4,)),
            (normal(), normal(), uniform(0.5, 2), normal(), normal()),
        ),
        Rec(
            "batch_normalization_axis1_4d",
            lambda x, m, v, b, g: K.batch_normalization(x, m, v, b, g, axis=1),
            lambda x, m, v, b, g: np_bn(
                x, along(m, 1, 4), along(v, 1, 4), along(b, 1, 4), along(g, 1, 4), 1e-3
            ),
            ((2, 3, 2, 2), (3,), (3,), (3,), (3,)),
            (normal(), normal(), uniform(0.5, 2), normal(), normal()),
        ),
        Rec(
            "batch_normalization_broadcast_params",
            lambda x, m, v, b, g: K.batch_normalization(x, m, v, b, g, 0.01),
            lambda x, m, v, b, g: np_bn(x, m, v, b, g, 0.01),
            ((2, 3, 4), (1, 3, 1), (1, 3, 1), (1, 3, 1), (1, 3, 1)),
            (normal(), normal(), uniform(0.5, 2), normal(), normal()),
        ),
        Rec(
            "batch_normalization_no_beta_gamma",
            lambda x: K.batch_normalization(
                x, K.constant(MEAN3, dtype=x.dtype), K.constant(VAR3, dtype=x.dtype), None, None
            ),
            lambda x: np_bn(x, MEAN3, VAR3, None, None, 1e-3),
            ((4, 3),),
        ),
        Rec("bias_add_2d", lambda x, b: K.bias_add(x, b), lambda x, b: x + b, ((3, 4), (4,))),
        Rec(
            "bias_add_2d_channels_first",
            lambda x, b: K.bias_add(x, b, "channels_first"),
            lambda x, b: x + b,
            ((3, 4), (4,)),
        ),
    ]
    + [
        Rec(
            f"bias_add_{len(s)}d_{fmt}_vector",
            (lambda fmt: lambda x, b: K.bias_add(x, b, data_format=fmt))(fmt),
            (lambda fmt, r: lambda x, b: x + (along(b, 1, r) if fmt == "channels_first" else b))(
                fmt, len(s)
            ),
            (s, (s[1] if fmt == "channels_first" else s[-1],)),
        )
        for s in [(2, 3, 4), (2, 3, 2, 4), (1, 2, 3, 2, 2)]
        for fmt in ("channels_last", "channels_first")
    ]
    + [
        # A bias of rank ndim(x) - 1 is reshaped (not transposed) to (1, b[-1]) + b[:-1] for
        # channels_first, as in tf.keras.backend.bias_add and Keras 2.3.1's backends.
        Rec(
            f"bias_add_{len(s)}d_{fmt}_full",
            (lambda fmt: lambda x, b: K.bias_add(x, b, data_format=fmt))(fmt),
            (
                lambda fmt, cs: (
                    lambda x, b: x + (b.reshape((1,) + cs) if fmt == "channels_first" else b[None])
                )
            )(fmt, s[1:]),
            (s, s[1:] if fmt == "channels_last" else s[2:] + s[1:2]),
        )
        for s in [(2, 3, 4), (2, 2, 3, 4), (1, 2, 2, 3, 2)]
        for fmt in ("channels_last", "channels_first")
    ]
)

RECS = ACTIVATIONS + LOSSES + NORMS


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rec", RECS, ids=repr)
def test_forward(rec, dtype, rng):
    arrays = [a.astype(dtype) for a in rec.sample(rng)]
    ref = np.asarray(rec.ref(*[a.astype(np.float64) for a in arrays]))
    phs = [K.placeholder(shape=a.shape, dtype=dtype) for a in arrays]
    out = rec.k(*phs)
    assert K.int_shape(out) == ref.shape
    value = run(phs, [out], arrays)[0]
    assert value.dtype == np.dtype(dtype)
    rtol, atol = tolerances(dtype, *rec.tol32)
    np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("rec", [r for r in RECS if r.grad], ids=repr)
def test_gradient(rec, rng):
    # eps 1e-4: the third derivatives of -log(p) make the O(eps**2) error of central
    # differences visible at the default 1e-3.
    check_grad(rec.k, rec.sample(rng), eps=1e-4)


def test_forward_on_variables_and_unknown_batch(rng):
    z = rng.normal(size=(3, 4))
    v = K.variable(z, dtype="float64")
    np.testing.assert_allclose(K.eval(K.softmax(v)), np_softmax(z), rtol=1e-12)
    logits = K.placeholder(shape=(None, 4), dtype="float64")
    target = K.placeholder(shape=(None,), dtype="int32")
    losses = [
        K.sparse_categorical_crossentropy(target, logits, from_logits=True),
        K.categorical_crossentropy(K.one_hot(target, 4), K.softmax(logits)),
    ]
    assert K.int_shape(losses[0]) == (None,)
    values = run([logits, target], losses, [z, INT_3])
    for value in values:
        np.testing.assert_allclose(value, np_scce(INT_3, z, from_logits=True), rtol=1e-12)


# ---- inputs of magnitude 1e4 ----------------------------------------------------------------------

BIG = np.array([[1e4, -1e4, 0.0, 5e3], [-1e4, -1e4, 1e4, 1e4], [3.0, -2.0, 1e4, -5e3]])
BIG_T = np.eye(4)[[1, 2, 0]]


@pytest.mark.parametrize("dtype", FLOATS)
def test_large_logits_are_finite_and_exact(dtype):
    z = K.placeholder(shape=BIG.shape, dtype=dtype)
    t = K.constant(BIG_T, dtype=dtype)
    ti = K.constant([1, 2, 0], dtype="int32")
    bt = K.constant((BIG > 0).astype(float), dtype=dtype)
    cases = [
        (K.softmax(z), np_softmax(BIG)),
        (K.softplus(z), np.logaddexp(0, BIG)),
        (K.sigmoid(z), 0.5 * (1 + np.tanh(BIG / 2))),
        (K.elu(z), np.where(BIG > 0, BIG, np.expm1(np.minimum(BIG, 0)))),
        (K.softsign(z), BIG / (1 + np.abs(BIG))),
        (K.categorical_crossentropy(t, z, from_logits=True), np_cce_logits(BIG_T, BIG)),
        (K.categorical_crossentropy(t, K.softmax(z)), np_cce_logits(BIG_T, BIG)),
        (K.sparse_categorical_crossentropy(ti, z, from_logits=True), np_cce_logits(BIG_T, BIG)),
        (K.sparse_categorical_crossentropy(ti, K.softmax(z)), np_cce_logits(BIG_T, BIG)),
        (
            K.binary_crossentropy(bt, z, from_logits=True),
            np_bce_logits((BIG > 0).astype(float), BIG),
        ),
        (K.binary_crossentropy(bt, K.sigmoid(z)), np_bce_logits((BIG > 0).astype(float), BIG)),
        (K.l2_normalize(z, 1), np_l2_normalize(BIG, 1)),
    ]
    values = run([z], [c[0] for c in cases], [BIG.astype(dtype)])
    for (_, ref), v in zip(cases, values):
        assert np.all(np.isfinite(v))
        np.testing.assert_allclose(v, ref, rtol=1e-6, atol=1e-6)


def test_large_logits_gradients_are_finite_and_exact():
    # d/dz of the crossentropies from logits: softmax(z) - t and sigmoid(z) - t.
    z = K.placeholder(shape=BIG.shape, dtype="float64")
    bt = (BIG > 0).astype(float)
    pairs = [
        (K.sum(K.categorical_crossentropy(BIG_T, z, from_logits=True)), np_softmax(BIG) - BIG_T),
        (K.sum(K.categorical_crossentropy(BIG_T, K.softmax(z))), np_softmax(BIG) - BIG_T),
        (
            K.sum(K.sparse_categorical_crossentropy(np.array([1, 2, 0]), z, from_logits=True)),
            np_softmax(BIG) - BIG_T,
        ),
        (K.sum(K.binary_crossentropy(bt, z, from_logits=True)), 0.5 * (1 + np.tanh(BIG / 2)) - bt),
        (K.sum(K.binary_crossentropy(bt, K.sigmoid(z))), 0.5 * (1 + np.tanh(BIG / 2)) - bt),
        (K.sum(K.softplus(z)), 0.5 * (1 + np.tanh(BIG / 2))),
        (K.sum(K.elu(z)), np.where(BIG > 0, 1.0, np.exp(np.minimum(BIG, 0)))),
        (K.sum(K.logsumexp(z, axis=1)), np_softmax(BIG)),
    ]
    grads = run([z], [K.gradients(loss, [z])[0] for loss, _ in pairs], [BIG])
    for (_, ref), g in zip(pairs, grads):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, ref, rtol=1e-9, atol=1e-12)


def test_binary_crossentropy_from_logits_gradient_at_zero():
    # sigmoid(0) - t exactly, though |z| has a kink at 0.
    z = K.variable(np.zeros(3), dtype="float64")
    t = np.array([0.0, 0.3, 1.0])
    g = K.eval(K.gradients(K.sum(K.binary_crossentropy(t, z, from_logits=True)), [z])[0])
    np.testing.assert_allclose(g, 0.5 - t, rtol=1e-12)


# ---- clipping edges ----------------------------------------------------------------------------------

EDGE_P = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
EDGE_T = np.eye(3)[[1, 2, 2]]


@pytest.mark.parametrize("dtype", FLOATS)
def test_crossentropies_at_the_clipping_edges(dtype):
    # Probabilities of exactly 0 and 1: finite losses equal to the clipped references, and
    # finite gradients. The references run in `dtype` too: in float32, 1 - epsilon rounds
    # to 1 - 2**-23, which is what the clipped loss sees.
    p = K.placeholder(shape=EDGE_P.shape, dtype=dtype)
    pt, tt = EDGE_P.astype(dtype), EDGE_T.astype(dtype)
    cases = [
        (K.categorical_crossentropy(EDGE_T, p), np_cce(tt, pt)),
        (K.sparse_categorical_crossentropy(np.array([1, 2, 2]), p), np_scce([1, 2, 2], pt)),
        (K.binary_crossentropy(EDGE_T, p), np_bce(tt, pt)),
    ]
    outs = [c[0] for c in cases]
    grads = [K.gradients(K.sum(o), [p])[0] for o in outs]
    values = run([p], outs + grads, [EDGE_P.astype(dtype)])
    for (_, ref), v in zip(cases, values[:3]):
        assert np.all(np.isfinite(v))
        rtol, atol = tolerances(dtype, 1e-5, 1e-6)
        np.testing.assert_allclose(v, ref, rtol=rtol, atol=atol)
    for g in values[3:]:
        assert np.all(np.isfinite(g))


@pytest.mark.parametrize("bad", [3, -1, 12])
def test_sparse_crossentropy_out_of_range_target_raises(bad):
    out = K.sparse_categorical_crossentropy(
        K.constant([0, bad, 1], dtype="int32"), K.constant(np.full((3, 3), 1 / 3))
    )
    with pytest.raises(ValueError, match=f"index {bad} is out of range for an axis of size 3"):
        K.eval(out)
    ok = K.sparse_categorical_crossentropy(
        K.constant([0, 2, 1], dtype="int32"), K.constant(np.full((3, 3), 1 / 3))
    )
    np.testing.assert_allclose(K.eval(ok), np.full(3, np.log(3)), rtol=1e-6)


def test_sparse_crossentropy_bad_label_applies_no_update():
    # A training step whose labels are fed (float, as Keras feeds them, so the cast to int
    # runs on the device): a label out of range fails the call before any update.
    x = K.placeholder(shape=(None, 4))
    y = K.placeholder(shape=(None,))
    w = K.variable(np.full((4, 10), 0.1, dtype="float32"))
    step = K.variable(0.0)
    loss = K.mean(K.sparse_categorical_crossentropy(y, K.softmax(K.dot(x, w))))
    g = K.gradients(loss, [w])[0]
    train = K.function([x, y], [loss], updates=[(w, w - 0.5 * g), (step, step + 1.0)])
    xs = np.ones((2, 4), dtype="float32")
    train([xs, np.array([1.0, 9.0], "float32")])
    before = K.get_value(w).copy()
    with pytest.raises(ValueError, match="index 12 is out of range"):
        train([xs, np.array([1.0, 12.0], "float32")])
    np.testing.assert_array_equal(K.get_value(w), before)
    assert K.get_value(step) == 1.0
    train([xs, np.array([3.0, 4.0], "float32")])
    assert K.get_value(step) == 2.0


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_of_rows_with_inf_or_nan(dtype):
    # As TF: +inf and NaN entries give NaN, the other entries of their row 0; a row of
    # -inf only is NaN; -inf entries of other rows give 0.
    x = np.array(
        [
            [np.inf, 1.0, 2.0],
            [np.nan, 1.0, 2.0],
            [1.0, np.inf, np.inf],
            [-np.inf, -np.inf, -np.inf],
            [-np.inf, 0.0, np.log(3.0)],
            [1.0, 2.0, 3.0],
        ],
        dtype=dtype,
    )
    v = run([], [K.softmax(K.constant(x, dtype=dtype))], [])[0]
    want = np.array(
        [
            [np.nan, 0.0, 0.0],
            [np.nan, 0.0, 0.0],
            [0.0, np.nan, np.nan],
            [np.nan, np.nan, np.nan],
            [0.0, 0.25, 0.75],
            np_softmax(np.array([1.0, 2.0, 3.0])),
        ]
    )
    np.testing.assert_allclose(v, want, rtol=1e-6, atol=1e-7, equal_nan=True)
    on_axis0 = run([], [K.softmax(K.constant(x.T, dtype=dtype), axis=0)], [])[0]
    np.testing.assert_allclose(on_axis0, want.T, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_softmax_output_of_a_layer_is_not_unwrapped():
    # As TF 2: a K.softmax result with _keras_history (a layer output) is treated as
    # probabilities, so the clipped formula applies.
    z = np.array([[30.0, 0.0, 0.0]])
    s = K.softmax(K.constant(z, dtype="float64"))
    s._keras_history = ("layer", 0, 0)
    v = K.eval(K.categorical_crossentropy(np.array([[0.0, 1.0, 0.0]]), s))
    np.testing.assert_allclose(v, np_cce(np.array([[0.0, 1.0, 0.0]]), np_softmax(z)), rtol=1e-9)


# ---- normalize_batch_in_training -------------------------------------------------------------------

NBT_CASES = [
    # (x shape, reduction_axes, gamma/beta shape or None)
    ((4, 3), [0], (3,)),
    ((2, 3, 4), [0, 1], (4,)),
    ((2, 3, 2, 2), [0, 2, 3], (3,)),  # channels_first batch norm: broadcast path
    ((2, 2, 2, 3), (0, 1, 2), (3,)),
    ((3, 4), [0], None),
    ((2, 3, 4), [0, 2], (1, 3, 1)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("xs,axes,ps", NBT_CASES, ids=str)
def test_normalize_batch_in_training(xs, axes, ps, dtype, rng):
    x = rng.normal(1.0, 2.0, size=xs).astype(dtype)
    g = None if ps is None else rng.uniform(0.5, 1.5, size=ps).astype(dtype)
    b = None if ps is None else rng.normal(size=ps).astype(dtype)
    px = K.placeholder(shape=xs, dtype=dtype)
    normed, mean, var = K.normalize_batch_in_training(
        px,
        None if g is None else K.constant(g, dtype=dtype),
        None if b is None else K.constant(b, dtype=dtype),
        axes,
        epsilon=1e-3,
    )
    refs = np_nbt(
        x.astype(np.float64),
        None if g is None else g.astype(np.float64),
        None if b is None else b.astype(np.float64),
        axes,
        1e-3,
    )
    values = run([px], [normed, mean, var], [x])
    rtol, atol = tolerances(dtype, 2e-5, 2e-5)
    for v, r in zip(values, refs):
        assert v.shape == r.shape and v.dtype == np.dtype(dtype)
        np.testing.assert_allclose(v, r, rtol=rtol, atol=atol)


@pytest.mark.parametrize("xs,axes,ps", [c for c in NBT_CASES if c[2] is not None], ids=str)
def test_normalize_batch_in_training_gradient(xs, axes, ps, rng):
    check_grad(
        lambda x, g, b: K.normalize_batch_in_training(x, g, b, axes, epsilon=0.01)[0],
        [rng.normal(size=xs), rng.uniform(0.5, 1.5, size=ps), rng.normal(size=ps)],
    )
    check_grad(
        lambda x: K.normalize_batch_in_training(x, None, None, axes)[2], [rng.normal(size=xs)]
    )


@pytest.mark.parametrize("scale,shift", [(False, False), (True, False), (False, True)])
def test_normalize_batch_in_training_gradient_without_gamma_or_beta(scale, shift, rng):
    xs, ps = (3, 2, 4), (4,)
    arrays = [rng.normal(1.0, 2.0, size=xs)]
    arrays += [rng.uniform(0.5, 1.5, size=ps)] if scale else []
    arrays += [rng.normal(size=ps)] if shift else []

    def fn(x, *ps):
        g = ps[0] if scale else None
        b = ps[-1] if shift else None
        return K.normalize_batch_in_training(x, g, b, [0, 1], epsilon=0.01)[0]

    check_grad(fn, arrays)
    # The returned mean's gradient: the mean itself, not the output's stopped copy.
    check_grad(lambda x: K.normalize_batch_in_training(x, None, None, [0, 1])[1] * 3.0, arrays[:1])


def test_normalize_batch_in_training_second_order(rng):
    # A Hessian-vector product through batch norm in training (a gradient penalty through a
    # normalised critic) against central differences of the gradient: the mean and the
    # variance stay differentiable in the gradient's graph too.
    xv = rng.standard_normal((6, 4))
    x = K.placeholder(shape=(6, 4), dtype="float64")
    gamma = K.constant(rng.standard_normal(4) + 1.5, dtype="float64")
    beta = K.constant(rng.standard_normal(4), dtype="float64")
    y = K.normalize_batch_in_training(x, gamma, beta, [0], epsilon=1e-3)[0]
    w = K.constant(rng.standard_normal((6, 4)), dtype="float64")
    g = K.gradients(K.sum(K.square(y * w)), [x])[0]
    uv = rng.standard_normal((6, 4))
    hv = K.gradients(K.sum(g * K.constant(uv, dtype="float64")), [x])[0]
    f = K.function([x], [g, hv])
    eps = 1e-5
    fd = (f([xv + eps * uv])[0] - f([xv - eps * uv])[0]) / (2 * eps)
    np.testing.assert_allclose(f([xv])[1], fd, rtol=1e-6, atol=1e-6 * np.abs(fd).max())


@pytest.mark.parametrize("batch", [1, 5])
def test_gradient_sums_with_per_channel_factors(batch, rng):
    # Gradients summed over broadcast axes where part of the product is constant along
    # them (`sum_like` factors it out of the sum): per-channel scales, a broadcast of a
    # per-channel value to the input's runtime shape, a division by a per-channel value,
    # at an unknown batch dim that is 1 or more at run time, against float64 NumPy.
    xv = rng.normal(size=(batch, 3, 4))
    sv, tv = rng.uniform(0.5, 1.5, size=(1, 1, 4)), rng.uniform(0.5, 1.5, size=(1, 1, 4))
    px = K.placeholder(shape=(None, 3, 4), dtype="float64")
    s, t = K.variable(sv, dtype="float64"), K.variable(tv, dtype="float64")
    m = K.mean(px, axis=[0, 1], keepdims=True)
    y = K.sum(K.square(px * s - m * t) / t) + K.sum(K.mean(K.square(px * s), axis=[0, 1]) * t)
    gx, gs, gt = run([px], K.gradients(y, [px, s, t]), [xv])
    # y = Σ (x s - m t)² / t + Σ_c t mean(x² s²); m = mean over axes 0, 1.
    n = batch * 3
    u = xv * sv - xv.mean(axis=(0, 1), keepdims=True) * tv
    du = 2 * u / tv
    ref_x = du * sv - (du.sum(axis=(0, 1), keepdims=True) * tv) / n + 2 * xv * sv**2 * tv / n
    ref_s = (du * xv).sum(axis=(0, 1), keepdims=True) + (2 * xv**2 * sv * tv / n).sum(
        axis=(0, 1), keepdims=True
    )
    ref_t = (-du * xv.mean(axis=(0, 1), keepdims=True) - u**2 / tv**2).sum(
        axis=(0, 1), keepdims=True
    ) + (xv**2 * sv**2).mean(axis=(0, 1), keepdims=True)
    for got, ref in ((gx, ref_x), (gs, ref_s), (gt, ref_t)):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("axes", [[0], [1], [0, 1]], ids=str)
def test_gradient_through_a_centred_input_scaled_per_channel(axes, rng):
    # The sum of `x - mean(x, axes)` over those axes is zero as a function of x (its
    # gradient summed through the mean is a zero constant); a full-size weight keeps
    # the sum. Gradients and their second derivatives against central differences.
    xs = (4, 3, 2)
    keep = [1 if i in axes else d for i, d in enumerate(xs)]
    sv = rng.uniform(0.5, 1.5, size=keep)
    wv = rng.normal(size=xs)

    def centred(x):
        return x - K.mean(x, axis=axes, keepdims=True)

    check_grad(
        lambda x: K.square(centred(x) * K.constant(sv, dtype="float64")), [rng.normal(size=xs)]
    )
    check_grad(lambda x: centred(x) * K.constant(wv, dtype="float64"), [rng.normal(size=xs)])
    px = K.placeholder(shape=xs, dtype="float64")
    g = K.gradients(K.sum(centred(px) * K.constant(sv, dtype="float64")), [px])[0]
    np.testing.assert_array_equal(run([px], [g], [rng.normal(size=xs)])[0], np.zeros(xs))


def test_normalize_batch_in_training_unknown_batch(rng):
    x = rng.normal(size=(5, 3))
    px = K.placeholder(shape=(None, 3), dtype="float64")
    normed, mean, var = K.normalize_batch_in_training(
        px, K.ones((3,), dtype="float64"), K.zeros((3,), dtype="float64"), [0]
    )
    refs = np_nbt(x, np.ones(3), np.zeros(3), [0], 1e-3)
    for v, r in zip(run([px], [normed, mean, var], [x]), refs):
        np.testing.assert_allclose(v, r, rtol=1e-12)


# ---- in_top_k ----------------------------------------------------------------------------------------


TOPK_PRED = np.array(
    [
        [0.1, 0.7, 0.2, 0.0],
        [0.3, 0.3, 0.3, 0.1],  # a three-way tie
        [0.5, np.nan, 0.2, 0.3],
        [np.inf, 1.0, 2.0, 3.0],
        [0.0, 0.0, 0.0, 0.0],
        [-1.0, -2.0, -3.0, -4.0],
    ]
)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize(
    "targets", [[1, 3, 1, 0, 2, 3], [2, 0, 0, 3, 0, 0], [0, 2, 2, 1, 4, -1]], ids=str
)
def test_in_top_k(targets, k):
    p = K.placeholder(shape=(None, 4))
    t = K.placeholder(shape=(None,), dtype="int32")
    out = K.in_top_k(p, t, k)
    assert K.dtype(out) == "bool"
    value = run([p, t], [out], [TOPK_PRED.astype("float32"), np.array(targets, dtype="int32")])[0]
    np.testing.assert_array_equal(value, np_in_top_k(TOPK_PRED, targets, k))


def test_in_top_k_random_against_reference(rng):
    pred = rng.integers(0, 5, size=(20, 6)).astype(np.float64)  # many ties
    targets = rng.integers(0, 6, size=20)
    for k in (1, 2, 4):
        v = K.eval(K.in_top_k(K.constant(pred), targets.astype(np.int64), k))
        np.testing.assert_array_equal(v, np_in_top_k(pred, targets, k))


# ---- bad input -------------------------------------------------------------------------------------


def _ph(*shape, dtype=None):
    return K.placeholder(shape=shape, dtype=dtype)


BAD = [
    ("relu_alpha_type", lambda: K.relu(_ph(2), alpha="a"), ("alpha",)),
    ("relu_max_value_type", lambda: K.relu(_ph(2), max_value=[1]), ("max_value",)),
    ("elu_int", lambda: K.elu(_ph(2, dtype="int32")), ("float",)),
    ("softmax_axis", lambda: K.softmax(_ph(2, 3), axis=2), ("axis",)),
    ("softmax_scalar", lambda: K.softmax(K.constant(1.0)), ("axis",)),
    ("cce_shapes", lambda: K.categorical_crossentropy(_ph(2, 3), _ph(2, 4)), ("shape",)),
    ("cce_axis", lambda: K.categorical_crossentropy(_ph(2, 3), _ph(2, 3), axis=2), ("axis",)),
    (
        "cce_int_output",
        lambda: K.categorical_crossentropy(_ph(2, 3), _ph(2, 3, dtype="int32")),
        ("output",),
    ),
    (
        "scce_axis",
        lambda: K.sparse_categorical_crossentropy(_ph(2, dtype="int32"), _ph(2, 3), axis=-3),
        ("axis",),
    ),
    (
        "scce_target_shape",
        lambda: K.sparse_categorical_crossentropy(_ph(3, dtype="int32"), _ph(2, 3)),
        ("target", "shape"),
    ),
    (
        "scce_bool_target",
        lambda: K.sparse_categorical_crossentropy(_ph(2, dtype="bool"), _ph(2, 3)),
        ("target",),
    ),
    ("bce_shapes", lambda: K.binary_crossentropy(_ph(2, 3), _ph(3, 2)), ("shape",)),
    ("l2_normalize_axis", lambda: K.l2_normalize(_ph(2, 3), axis=3), ("axis",)),
    ("in_top_k_rank", lambda: K.in_top_k(_ph(2, 3, 4), [0, 1], 1), ("predictions",)),
    ("in_top_k_targets_float", lambda: K.in_top_k(_ph(2, 3), _ph(2), 1), ("targets",)),
    (
        "in_top_k_targets_rank",
        lambda: K.in_top_k(_ph(2, 3), np.zeros((2, 1), dtype=int), 1),
        ("targets",),
    ),
    ("in_top_k_k", lambda: K.in_top_k(_ph(2, 3), [0, 1], 1.5), ("k",)),
    (
        "bn_channels",
        lambda: K.batch_normalization(_ph(2, 3), _ph(4), _ph(4), None, None),
        ("mean", "entries"),
    ),
    (
        "bn_axis",
        lambda: K.batch_normalization(_ph(2, 3), _ph(3), _ph(3), None, None, axis=2),
        ("axis",),
    ),
    (
        "nbt_axes_empty",
        lambda: K.normalize_batch_in_training(_ph(2, 3), None, None, []),
        ("reduction_axes",),
    ),
    (
        "nbt_axes_range",
        lambda: K.normalize_batch_in_training(_ph(2, 3), None, None, [2]),
        ("reduction_axes",),
    ),
    (
        "nbt_axes_repeat",
        lambda: K.normalize_batch_in_training(_ph(2, 3), None, None, [0, -2]),
        ("reduction_axes",),
    ),
    (
        "bias_add_format",
        lambda: K.bias_add(_ph(2, 3), _ph(3), data_format="NHWC"),
        ("data_format",),
    ),
    ("bias_add_rank", lambda: K.bias_add(_ph(2, 3, 4), _ph(3, 4, 1)), ("bias",)),
    ("bias_add_length", lambda: K.bias_add(_ph(2, 3, 4), _ph(3)), ("bias", "channels")),
    (
        "bias_add_length_cf",
        lambda: K.bias_add(_ph(2, 3, 4), _ph(4), "channels_first"),
        ("bias", "channels"),
    ),
    ("bias_add_x_rank", lambda: K.bias_add(_ph(3), _ph(3)), ("x",)),
]


@pytest.mark.parametrize("name,trigger,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input(name, trigger, words):
    with pytest.raises((ValueError, TypeError)) as excinfo:
        trigger()
    assert_mentions(excinfo, *words)


@pytest.mark.parametrize("alpha", [0.2, 1.5])
def test_leaky_relu_is_tf_leaky_relu_at_special_values(alpha):
    """`relu(x, alpha)` with no threshold or cap is TF's leaky_relu (which Keras 2.3.1
    calls for these arguments): `x` where `x > 0`, else `alpha * x`, NaN and infinities
    included; its gradient is 1 or `alpha` by the sign of `x`, and `x`'s own part where
    alpha is a tensor."""
    xs = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -1.0, 2.0, -3.5], dtype="float32")
    x = K.placeholder(shape=xs.shape)
    a = K.variable(np.float32(alpha))
    for al in (alpha, a):
        y = K.relu(x, alpha=al)
        f = K.function([x], [y] + K.gradients(K.sum(y), [x]))
        out, gx = f([xs])
        np.testing.assert_array_equal(out, np.where(xs > 0, xs, np.float32(alpha) * xs))
        np.testing.assert_array_equal(gx, np.where(xs > 0, 1, np.float32(alpha)).astype("float32"))
    finite = xs[np.isfinite(xs)]
    xf = K.placeholder(shape=finite.shape)
    (ga,) = K.function([xf], K.gradients(K.sum(K.relu(xf, alpha=a)), [a]))([finite])
    np.testing.assert_allclose(ga, np.where(finite > 0, 0, finite).sum(), rtol=1e-6)


def test_elu_is_tf_elu_at_special_values():
    """`K.elu` is TF's elu (for `alpha != 1`, `where(x > 0, elu(x), alpha * elu(x))`, as
    Keras's TF backend writes it): values, gradients (TF's EluGrad, from the output: 1 at
    -0, 0 and NaN) and second derivatives, as TF 2.21 gives them."""
    xs = np.array([-np.inf, -1.0, -0.0, 0.0, 0.5, np.inf, np.nan], dtype="float32")
    e = float(np.exp(np.float32(-1.0)))
    want = {
        1.0: ([-1.0, -0.63212055, -0.0, 0.0, 0.5, np.inf, np.nan], [0, e, 1, 1, 1, 1, 1]),
        0.5: ([-0.5, -0.31606028, -0.0, 0.0, 0.5, np.inf, np.nan], [0, e / 2, 0.5, 0.5, 1, 1, 0.5]),
    }
    x = K.placeholder(shape=xs.shape)
    for alpha, (out_tf, grad_tf) in want.items():
        for al in (alpha, K.variable(np.float32(alpha))):
            y = K.elu(x, al)
            (g,) = K.gradients(K.sum(y), [x])
            (g2,) = K.gradients(K.sum(g), [x])
            out, gx, gxx = K.function([x], [y, g, g2])([xs])
            np.testing.assert_allclose(out, out_tf, rtol=1e-6)
            assert np.array_equal(np.signbit(out[:-1]), np.signbit(np.array(out_tf[:-1])))
            np.testing.assert_allclose(gx, grad_tf, rtol=1e-6)
            np.testing.assert_allclose(gxx, [0, alpha * e, 0, 0, 0, 0, 0], rtol=1e-6)


def test_relu_max_value_6_is_tf_relu6_at_the_cap():
    """`K.relu(x, max_value=6)` is `tf.nn.relu6`, which Keras calls for this cap without a
    threshold: its gradient is 0 at 0 and at 6. Another cap keeps TF's `clip_by_value`
    gradient, 1 at the cap."""
    xs = np.array([-1.0, 0.0, 3.0, 5.0, 6.0, 7.0, np.nan], dtype="float32")
    x = K.placeholder(shape=xs.shape)
    for cap, grad in [(6.0, [0, 0, 1, 1, 0, 0, 0]), (5.0, [0, 0, 1, 1, 0, 0])]:
        n = len(grad)
        y = K.relu(x[:n], max_value=cap)
        out, gx = K.function([x], [y] + K.gradients(K.sum(y), [x]))([xs])
        np.testing.assert_array_equal(out, np.minimum(np.maximum(xs[:n], 0), cap))
        np.testing.assert_array_equal(gx[:n], np.array(grad, dtype="float32"))
