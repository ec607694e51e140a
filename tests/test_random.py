"""Random tensors and dropout.

Random values have no golden numbers, so each distribution record is checked against its
reference distribution (scipy.stats): a Kolmogorov-Smirnov distance for the continuous
ones, frequencies for the discrete ones, and the support. Seeds and per-call freshness
are checked as properties: the same seed gives the same draws in a new graph and in a new
process; every call of a compiled function draws new numbers.
"""

import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import assert_mentions, run
from scipy import stats

N = 20000
# KS critical distance for n = 20000 at significance 1e-4 (sqrt(-ln(alpha / 2) / (2 n))).
KS_MAX = np.sqrt(-np.log(1e-4 / 2) / (2 * N))


@dataclass(frozen=True)
class Dist:
    name: str
    k: Callable  # (shape, dtype, seed) -> K tensor
    cdf: Callable  # reference CDF (scipy.stats), None for discrete
    lo: float  # support
    hi: float

    def __repr__(self):
        return self.name


DISTS = [
    Dist(
        "random_normal_default",
        lambda s, d, seed: K.random_normal(s, dtype=d, seed=seed),
        stats.norm().cdf,
        -np.inf,
        np.inf,
    ),
    Dist(
        "random_normal_mean_stddev",
        lambda s, d, seed: K.random_normal(s, 1.5, 0.5, d, seed),
        stats.norm(1.5, 0.5).cdf,
        -np.inf,
        np.inf,
    ),
    Dist(
        "random_uniform_default",
        lambda s, d, seed: K.random_uniform(s, dtype=d, seed=seed),
        stats.uniform(0, 1).cdf,
        0.0,
        1.0,
    ),
    Dist(
        "random_uniform_range",
        lambda s, d, seed: K.random_uniform(s, -2.0, 3.0, d, seed),
        stats.uniform(-2, 5).cdf,
        -2.0,
        3.0,
    ),
    Dist(
        "truncated_normal_default",
        lambda s, d, seed: K.truncated_normal(s, dtype=d, seed=seed),
        stats.truncnorm(-2, 2).cdf,
        -2.0,
        2.0,
    ),
    Dist(
        "truncated_normal_mean_stddev",
        lambda s, d, seed: K.truncated_normal(s, -1.0, 2.0, d, seed),
        stats.truncnorm(-2, 2, loc=-1, scale=2).cdf,
        -5.0,
        3.0,
    ),
]


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("dist", DISTS, ids=repr)
def test_continuous_distributions(dist, dtype):
    t = dist.k((100, N // 100), dtype, 1234)
    assert K.dtype(t) == dtype and K.int_shape(t) == (100, N // 100)
    v = K.eval(t)
    assert v.dtype == np.dtype(dtype) and v.shape == (100, N // 100)
    assert v.min() >= dist.lo and v.max() <= dist.hi
    if dist.hi == 1.0:
        assert v.max() < 1.0  # uniform: [minval, maxval)
    d = stats.kstest(v.ravel().astype(np.float64), dist.cdf).statistic
    assert d < KS_MAX, (d, KS_MAX)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("dtype", ("float32", "float64", "int32", "bool"))
def test_random_binomial(p, dtype):
    v = K.eval(K.random_binomial((N,), p=p, dtype=dtype, seed=5))
    assert v.dtype == np.dtype(dtype)
    assert set(np.unique(v.astype(np.float64))) <= {0.0, 1.0}
    sd = np.sqrt(p * (1 - p) / N)
    assert abs(v.astype(np.float64).mean() - p) <= 5 * sd


def test_random_binomial_default_p_is_zero():
    np.testing.assert_array_equal(K.eval(K.random_binomial((100,))), np.zeros(100))


@pytest.mark.parametrize("dtype", ("int32", "int64"))
def test_random_uniform_integers(dtype):
    v = K.eval(K.random_uniform((N,), minval=2, maxval=7, dtype=dtype, seed=9))
    assert v.dtype == np.dtype(dtype)
    counts = np.array([(v == k).sum() for k in range(2, 7)])
    assert counts.sum() == N  # every value in [2, 7)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_tensor_mean_and_stddev():
    m = K.placeholder(shape=())
    s = K.placeholder(shape=())
    v = run(
        [m, s],
        [K.random_normal((N,), mean=m, stddev=s, seed=3)],
        [np.float32(-3.0), np.float32(0.25)],
    )[0]
    assert stats.kstest(v.astype(np.float64), stats.norm(-3.0, 0.25).cdf).statistic < KS_MAX
    lo, hi = K.placeholder(shape=()), K.placeholder(shape=())
    u = run([lo, hi], [K.random_uniform((N,), lo, hi, seed=3)], [np.float32(4.0), np.float32(6.0)])[
        0
    ]
    assert u.min() >= 4.0 and u.max() < 6.0


SHAPE_FORMS = [
    ("tuple", lambda x: (3, 4), (3, 4)),
    ("list", lambda x: [2, 5], (2, 5)),
    ("int", lambda x: 6, (6,)),
    ("scalar_shape", lambda x: (), ()),
    ("shape_tensor", lambda x: K.shape(x), (5, 3)),
    ("tuple_with_tensor_entry", lambda x: (K.shape(x)[0], 2), (5, 2)),
]


@pytest.mark.parametrize("name,shape,expected", SHAPE_FORMS, ids=[s[0] for s in SHAPE_FORMS])
@pytest.mark.parametrize(
    "fn",
    [K.random_normal, K.random_uniform, K.truncated_normal, K.random_binomial],
    ids=lambda f: f.__name__,
)
def test_shape_argument_forms(fn, name, shape, expected):
    x = K.placeholder(shape=(None, 3))
    out = fn(shape(x))
    v = run([x], [out], [np.zeros((5, 3))])[0]
    assert v.shape == expected


# ---- seeds and freshness ------------------------------------------------------------------------

SEEDED = [
    ("random_normal", lambda seed: K.random_normal((4, 5), seed=seed)),
    ("random_uniform", lambda seed: K.random_uniform((4, 5), seed=seed)),
    ("truncated_normal", lambda seed: K.truncated_normal((4, 5), seed=seed)),
    ("random_binomial", lambda seed: K.random_binomial((4, 5), 0.5, seed=seed)),
    ("dropout", lambda seed: K.dropout(K.ones((4, 5)), 0.5, seed=seed)),
]


@pytest.mark.parametrize("name,make", SEEDED, ids=[s[0] for s in SEEDED])
def test_same_seed_same_draws_in_a_new_graph(name, make):
    a, b, c = K.eval(make(42)), K.eval(make(42)), K.eval(make(43))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("name,make", SEEDED, ids=[s[0] for s in SEEDED])
def test_every_call_of_a_function_draws_anew(name, make):
    for seed in (None, 7):
        f = K.function([], [make(seed)])
        first, second = f([])[0], f([])[0]
        assert not np.array_equal(first, second)
    # A seeded op replays its sequence of draws when rebuilt.
    f1, f2 = K.function([], [make(11)]), K.function([], [make(11)])
    seq1 = [f1([])[0] for _ in range(3)]
    seq2 = [f2([])[0] for _ in range(3)]
    for a, b in zip(seq1, seq2):
        np.testing.assert_array_equal(a, b)


def test_unseeded_ops_differ_from_each_other():
    assert not np.array_equal(K.eval(K.random_normal((10,))), K.eval(K.random_normal((10,))))


def test_seeded_draws_are_reproducible_across_processes():
    code = (
        "import numpy as np; from ferrokeras import backend as K; "
        "print(repr(K.eval(K.random_normal((6,), seed=2024)).tolist()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    np.testing.assert_array_equal(np.array(eval(out)), K.eval(K.random_normal((6,), seed=2024)))


# ---- dropout -------------------------------------------------------------------------------------

DROPOUT_CASES = [
    # (x shape, level, noise_shape, axes along which the mask is constant)
    ((400, 50), 0.5, None, ()),
    ((400, 50), 0.2, None, ()),
    ((400, 50), 0.9, None, ()),
    ((200, 10, 10), 0.3, (200, 1, 10), (1,)),
    ((200, 10, 10), 0.5, (None, 1, None), (1,)),
    ((200, 10, 10), 0.5, [1, 10, 1], (0, 2)),
]


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("shape,level,noise_shape,const_axes", DROPOUT_CASES, ids=str)
def test_dropout(shape, level, noise_shape, const_axes, dtype, rng):
    x = rng.uniform(0.5, 1.5, size=shape).astype(dtype)
    ph = K.placeholder(shape=(None,) + shape[1:], dtype=dtype)
    out = K.dropout(ph, level, noise_shape=noise_shape)
    f = K.function([ph], [out])
    v1, v2 = f([x])[0], f([x])[0]
    assert v1.dtype == np.dtype(dtype)
    scale = 1.0 / (1.0 - level)
    for v in (v1, v2):
        kept = v != 0
        # Kept entries are x / (1 - level), the others 0.
        np.testing.assert_allclose(v[kept], (x.astype(np.float64) * scale)[kept], rtol=1e-6)
        mask = kept
        for ax in const_axes:
            assert np.all(mask == np.take(mask, [0], axis=ax))
        n_draws = mask.size // int(np.prod([shape[a] for a in const_axes]))
        sd = np.sqrt(level * (1 - level) / n_draws)
        assert abs(mask.mean() - (1 - level)) <= 5 * sd
    assert not np.array_equal(v1 != 0, v2 != 0)  # a new mask every call


def test_dropout_gradient_is_the_scaled_mask(rng):
    x = rng.uniform(0.5, 1.5, size=(50, 20))
    ph = K.placeholder(shape=x.shape, dtype="float64")
    out = K.dropout(ph, 0.4)
    g = K.gradients(K.sum(out), [ph])[0]
    v, gv = run([ph], [out, g], [x])  # one call: one mask for both
    np.testing.assert_allclose(gv, (v != 0) / 0.6, rtol=1e-12)


def test_dropout_level_zero_and_tensor_level(rng):
    x = rng.normal(size=(3, 4)).astype("float32")
    np.testing.assert_array_equal(K.eval(K.dropout(K.constant(x), 0.0)), x)
    level = K.placeholder(shape=())
    ph = K.placeholder(shape=(1000,))
    v = run([ph, level], [K.dropout(ph, level, seed=1)], [np.ones(1000), np.float32(0.75)])[0]
    assert set(np.unique(v)) <= {0.0, 4.0}
    assert abs((v != 0).mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / 1000)


def test_dropout_in_train_phase_pattern(rng):
    # The Keras Dropout layer: in_train_phase(dropout(x), x).
    x = rng.uniform(1, 2, size=(20, 30)).astype("float32")
    ph = K.placeholder(shape=(None, 30))
    out = K.in_train_phase(lambda: K.dropout(ph, 0.5), ph)
    f = K.function([ph, K.learning_phase()], [out])
    np.testing.assert_array_equal(f([x, 0])[0], x)
    v = f([x, 1])[0]
    assert np.any(v == 0) and np.allclose(v[v != 0], 2 * x[v != 0])


# ---- bad input -------------------------------------------------------------------------------------

BAD = [
    ("dropout_level_one", lambda: K.dropout(K.ones((2,)), 1.0), ("level",)),
    ("dropout_level_negative", lambda: K.dropout(K.ones((2,)), -0.1), ("level",)),
    ("dropout_level_type", lambda: K.dropout(K.ones((2,)), "half"), ("level",)),
    (
        "dropout_noise_shape_rank",
        lambda: K.dropout(K.ones((2, 3)), 0.5, noise_shape=(2,)),
        ("noise_shape",),
    ),
    (
        "dropout_noise_shape_mismatch",
        lambda: K.dropout(K.ones((2, 3)), 0.5, noise_shape=(2, 2)),
        ("noise_shape",),
    ),
    ("dropout_int_x", lambda: K.dropout(K.constant([1, 2], dtype="int32"), 0.5), ("float",)),
    ("binomial_p_range", lambda: K.random_binomial((2,), p=1.5), ("p",)),
    ("binomial_p_type", lambda: K.random_binomial((2,), p="x"), ("p",)),
    ("normal_int_dtype", lambda: K.random_normal((2,), dtype="int32"), ("dtype",)),
    ("truncated_bool_dtype", lambda: K.truncated_normal((2,), dtype="bool"), ("dtype",)),
    (
        "uniform_int_range",
        lambda: K.random_uniform((2,), 3, 3, dtype="int32"),
        ("maxval", "minval"),
    ),
    ("uniform_bad_dtype", lambda: K.random_uniform((2,), dtype="float13"), ("float13",)),
    ("shape_negative", lambda: K.random_normal((2, -1)), ("shape",)),
    ("shape_float", lambda: K.random_normal((2.5,)), ("shape",)),
    ("shape_type", lambda: K.random_uniform("abc"), ("shape",)),
    ("shape_float_tensor", lambda: K.random_normal(K.constant([2.0, 3.0])), ("shape",)),
    ("seed_type", lambda: K.random_normal((2,), seed="abc"), ("seed",)),
]


@pytest.mark.parametrize("name,trigger,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input(name, trigger, words):
    with pytest.raises((ValueError, TypeError)) as excinfo:
        trigger()
    assert_mentions(excinfo, *words)
