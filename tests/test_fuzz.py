"""Property-based fuzzing of every function in the API table (tests/data/api.tsv): bad input.

Each name in the API table has a driver here (a test fails for a name without one). A
driver draws random inputs with hypothesis -- shapes with zero-size dims and rank 0,
every dtype, axes in and out of range, NaN and infinities, mismatched arguments -- builds
the function on placeholders fed through ``K.function``, on constants evaluated with
``K.eval`` or on variables, and checks the contract:

* when NumPy (the oracles of reference.py, shared with the family tests) computes a value and the
  arguments are valid for the function, the result matches it (shape, dtype, values,
  NaN and infinity positions);
* otherwise the call raises ``ValueError``, ``TypeError`` or ``IndexError``; anything
  else fails the test, in particular ``RuntimeError: internal error ...``, which is a
  Rust panic caught by ``guarded()`` in ``src/py/mod.rs``.

Time: the ``ci`` profile (the default) is derandomized and bounded (~60-90 s for the whole
file on 2 cores). ``HYPOTHESIS_PROFILE=fuzz`` runs many more random examples, e.g.
``HYPOTHESIS_PROFILE=fuzz .venv/bin/python -m pytest tests/test_fuzz.py -x``.
A hang is turned into a failure with a traceback by a ``faulthandler`` watchdog.
"""

import contextlib
import faulthandler
import math
import os
import sys
import warnings

import numpy as np
import pytest
from api_table import ROWS
from ferrokeras import backend as K
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from reference import (
    default_axes,
    np_arg,
    np_batch_dot,
    np_bce,
    np_bce_logits,
    np_bn,
    np_cce,
    np_cce_logits,
    np_in_top_k,
    np_l2_normalize,
    np_logsumexp,
    np_nbt,
    np_pad,
    np_relu,
    np_resize,
    np_scce,
    np_sigmoid,
    np_softmax,
    ref_conv,
    ref_pool,
)

# ---- profiles --------------------------------------------------------------------------------

_COMMON = dict(suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile(
    "ci", max_examples=100, derandomize=True, database=None, deadline=5000, **_COMMON
)
settings.register_profile("dev", max_examples=100, deadline=5000, **_COMMON)
settings.register_profile("fuzz", max_examples=2000, deadline=5000, **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FUZZ = settings(settings.get_profile(PROFILE if PROFILE in ("ci", "dev", "fuzz") else "ci"))
HANG_S = 120  # per test (one API name): far above the slowest name under the ci profile

ALLOWED = (ValueError, TypeError, IndexError)

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8")
NUMERIC = FLOATS + INTS
ALL_DTYPES = NUMERIC + ("bool",)
# (rtol, atol) of a float result against a float64 reference rounded to its dtype.
TOL = {"float16": (2e-3, 2e-3), "float32": (2e-5, 2e-6), "float64": (1e-10, 1e-12)}


def _tol(dtype):
    return TOL.get(np.dtype(dtype).name, (0, 0))


def _eps(dtype):
    d = np.dtype(dtype)
    return float(np.finfo(d).eps) if d.kind == "f" else 0.0


# ---- drawing inputs --------------------------------------------------------------------------


def draw_shape(data, min_dims=0, max_dims=4, min_side=0, max_side=3, label="shape"):
    rank = data.draw(st.integers(min_dims, max_dims), label=f"{label}.rank")
    return tuple(
        data.draw(
            st.lists(st.integers(min_side, max_side), min_size=rank, max_size=rank), label=label
        )
    )


def make_array(data, shape, dtype, kind=None, label="x"):
    """A random array: floats mix normals, scaled normals and specials (NaN, +-inf, +-0);
    ints are small or span the dtype; bools are random."""
    seed = data.draw(st.integers(0, 2**32 - 1), label=f"{label}.seed")
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        return (rng.random(n) < 0.5).reshape(shape)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        wide = (
            data.draw(st.sampled_from([False, False, True]), label=f"{label}.wide")
            if kind is None
            else kind == "wide"
        )
        lo, hi = (info.min, info.max) if wide else (max(info.min, -20), min(info.max, 20))
        return rng.integers(lo, hi, size=n, endpoint=True).astype(dt).reshape(shape)
    kind = kind or data.draw(
        st.sampled_from(["normal", "normal", "large", "special", "unit"]), label=f"{label}.kind"
    )
    if kind == "unit":  # |x| <= 1 plus specials: products never overflow
        x = rng.uniform(-1, 1, size=n)
        p_special = 0.1
    elif kind == "positive":
        x = rng.uniform(0.05, 3, size=n)
        p_special = 0.0
    elif kind == "finite":
        x = rng.normal(0, 3, size=n)
        p_special = 0.0
    else:
        x = rng.normal(0, 100 if kind == "large" else 3, size=n)
        p_special = {"normal": 0.0, "large": 0.05, "special": 0.3}[kind]
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0])
    mask = rng.random(n) < p_special
    x[mask] = rng.choice(specials, size=int(mask.sum()))
    with np.errstate(over="ignore"):
        return x.astype(dt).reshape(shape)


def draw_array(
    data,
    dtypes=FLOATS,
    min_dims=0,
    max_dims=4,
    max_side=3,
    min_side=0,
    kind=None,
    label="x",
    shape=None,
):
    dtype = data.draw(st.sampled_from(dtypes), label=f"{label}.dtype")
    if shape is None:
        shape = draw_shape(data, min_dims, max_dims, min_side, max_side, label=f"{label}.shape")
    return make_array(data, shape, dtype, kind=kind, label=label)


def draw_axis(data, rank, allow_none=True, allow_list=True, label="axis"):
    """An axis argument: None, an int (in or out of range), a list/tuple (maybe repeated
    or out of range entries), or a non-int (TypeError)."""
    choices = ["int", "int", "oob"]
    if allow_none:
        choices.append("none")
    if allow_list:
        choices += ["list", "list"]
    choices.append("junk")
    kind = data.draw(st.sampled_from(choices), label=f"{label}.kind")
    if kind == "none":
        return None
    if kind == "int":
        return (
            data.draw(st.integers(-rank, rank - 1), label=label)
            if rank
            else data.draw(st.integers(-1, 0), label=label)
        )
    if kind == "oob":
        return data.draw(st.sampled_from([rank, -rank - 1, rank + 3, -rank - 5]), label=label)
    if kind == "junk":
        return data.draw(st.sampled_from([1.5, "0", True, [0.5]]), label=label)
    ax = data.draw(
        st.lists(st.integers(-rank - 1, rank), min_size=0, max_size=rank + 1), label=label
    )
    return tuple(ax) if data.draw(st.booleans(), label=f"{label}.tuple") else ax


def valid_axes(axis, rank):
    """The axes as a sorted tuple of non-negative ints, or None if the argument is invalid
    (out of range, repeated, not ints)."""
    if axis is None:
        return tuple(range(rank))
    items = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    out = []
    for a in items:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            return None
        if not -rank <= a < rank:
            return None
        out.append(a % rank)
    if len(set(out)) != len(out):
        return None
    return tuple(sorted(out))


# ---- building and evaluating -----------------------------------------------------------------


def _listify(o):
    return list(o) if isinstance(o, (list, tuple)) else [o]


def evaluate(data, fn, arrays, modes=("feed", "feed_none", "const", "variable")):
    """Builds ``fn`` on ``arrays`` given as placeholders (fed with ``K.function``, with
    known or unknown dims), constants or variables, and returns its outputs as arrays
    (a list if ``fn`` returned a list or tuple)."""
    mode = data.draw(st.sampled_from(modes), label="mode")
    if mode in ("const", "variable"):
        make = K.constant if mode == "const" else K.variable
        xs = [make(a, dtype=a.dtype.name) for a in arrays]
        out = fn(*xs)
        vals = [K.eval(o) for o in _listify(out)]
    else:
        phs = []
        for i, a in enumerate(arrays):
            shape = a.shape
            if mode == "feed_none":
                shape = tuple(
                    None if data.draw(st.booleans(), label=f"none{i}") else d for d in shape
                )
            phs.append(K.placeholder(shape=shape, dtype=a.dtype.name))
        out = fn(*phs)
        vals = K.function(phs, _listify(out))(list(arrays))
    vals = [np.asarray(v) for v in vals]
    return vals if isinstance(out, (list, tuple)) else vals[0]


class _Raises:
    def __init__(self, exc):
        self.exc = exc

    def __repr__(self):
        return f"<NumPy raised {self.exc!r}>"


def reference(thunk):
    """The NumPy reference value, or a `_Raises` when NumPy rejects the arguments."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return thunk()
        except (ValueError, IndexError, TypeError) as e:
            return _Raises(e)


def assert_matches(out, ref, dtype=None, rtol=None, atol=None, what=""):
    """``out`` equals ``ref``: same shape, dtype ``dtype`` (if given), values within the
    tolerance of the result dtype, NaN where NaN, the same infinities."""
    out = np.asarray(out)
    ref = np.asarray(ref)
    assert out.shape == ref.shape, f"{what}: shape {out.shape}, NumPy gives {ref.shape}"
    if dtype is not None:
        assert out.dtype == np.dtype(dtype), f"{what}: dtype {out.dtype}, expected {dtype}"
    r0, a0 = _tol(out.dtype)
    rtol = r0 if rtol is None else rtol
    atol = a0 if atol is None else atol
    if out.dtype.kind in "biu" and ref.dtype.kind in "biu" + "f" and rtol == 0 and atol == 0:
        np.testing.assert_array_equal(
            out, ref.astype(out.dtype) if ref.dtype.kind != "f" else ref, err_msg=what
        )
        return
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(
            out.astype(np.float64),
            ref.astype(np.float64),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
            err_msg=what,
        )


def check(
    data,
    fn,
    arrays,
    ref,
    *,
    valid=True,
    dtype=None,
    rtol=None,
    atol=None,
    alt=None,
    modes=("feed", "feed_none", "const", "variable"),
    compare=None,
):
    """The contract. ``ref`` is a thunk computing the NumPy reference. ``valid``: the
    arguments are ones the function must accept (else raising is also fine). ``alt``: a
    thunk for an accepted alternative value where NumPy raises (e.g. max of an empty axis
    is -inf, as TF). ``compare(out, ref)`` replaces `assert_matches`."""
    r = reference(ref)
    try:
        out = evaluate(data, fn, arrays, modes)
    except ALLOWED as e:
        assert not (valid and not isinstance(r, _Raises)), (
            f"K raised {type(e).__name__}: {e}\nbut the arguments are valid and NumPy gives {r!r}"
        )
        _check_message(e)
        return None
    if isinstance(r, _Raises):
        assert alt is not None, f"K returned {out!r}, but NumPy rejects the arguments: {r.exc!r}"
        r = reference(alt)
    if compare is not None:
        compare(out, r)
    elif isinstance(r, (list, tuple)):
        assert len(out) == len(r)
        for i, (o, rr) in enumerate(zip(out, r)):
            assert_matches(o, rr, dtype=dtype, rtol=rtol, atol=atol, what=f"output {i}")
    else:
        assert_matches(out, r, dtype=dtype, rtol=rtol, atol=atol)
    return out


def _check_message(e):
    msg = str(e)
    assert "internal error" not in msg, f"a Rust panic reached Python: {msg}"
    assert msg.strip(), f"{type(e).__name__} without a message"


def must_raise(thunk, types=ALLOWED):
    """``thunk`` (a K call on invalid arguments) raises one of ``types`` with a message."""
    with pytest.raises(types) as info:
        thunk()
    _check_message(info.value)


def attempt(thunk):
    """Runs ``thunk``; an allowed exception is returned (and its message checked), anything
    else propagates and fails the test."""
    try:
        return thunk()
    except ALLOWED as e:
        _check_message(e)
        return e


def f64(a):
    return np.asarray(a).astype(np.float64)


def rounded(ref_f64, dtype):
    """A float64 reference rounded to the result dtype (overflow to inf as the dtype does)."""
    with np.errstate(all="ignore"):
        return np.asarray(ref_f64).astype(dtype)


# ---- the drivers -----------------------------------------------------------------------------

DRIVERS = {}


def driver(*names):
    def deco(f):
        for n in names:
            assert n not in DRIVERS, n
            DRIVERS[n] = f
        return f

    return deco


# -- elementwise unary --------------------------------------------------------------------------


def _np_softsign(x):
    return np.where(np.isinf(x), np.sign(x), x / (1 + np.abs(x)))


# name -> (K call, float64 reference, dtypes that must work, reference for integer inputs)
UNARY = {
    "abs": (K.abs, np.abs, NUMERIC, np.abs),
    "square": (K.square, np.square, NUMERIC, np.square),
    "sign": (K.sign, np.sign, NUMERIC, np.sign),
    "round": (K.round, np.round, NUMERIC, lambda x: x),
    "exp": (K.exp, np.exp, FLOATS, None),
    "log": (K.log, np.log, FLOATS, None),
    "sin": (K.sin, np.sin, FLOATS, None),
    "cos": (K.cos, np.cos, FLOATS, None),
    "tanh": (K.tanh, np.tanh, FLOATS, None),
    "sqrt": (K.sqrt, lambda x: np.sqrt(np.maximum(x, 0)), FLOATS, None),  # Keras clips at 0
    "sigmoid": (K.sigmoid, np_sigmoid, FLOATS, None),
    "softplus": (K.softplus, lambda x: np.logaddexp(0, x), FLOATS, None),
    "softsign": (K.softsign, _np_softsign, FLOATS, None),
    "hard_sigmoid": (K.hard_sigmoid, lambda x: np.clip(0.2 * x + 0.5, 0, 1), FLOATS, None),
}


@driver(*UNARY)
def _unary(data, name):
    k, ref, ok, int_ref = UNARY[name]
    x = draw_array(data, ALL_DTYPES)
    dt = x.dtype
    if dt.kind == "f":
        r = lambda: rounded(ref(f64(x)), dt)
    elif int_ref is not None and dt.kind in "iu":
        r = lambda: int_ref(x)
    else:
        r = lambda: _Raises(None)
    check(data, k, [x], r, valid=dt.name in ok, dtype=dt if dt.name in ok else None)


@driver("elu")
def _elu(data, name):
    x = draw_array(data, ALL_DTYPES)
    alpha = data.draw(st.sampled_from([1.0, 0.5, 0.0, 2]), label="alpha")
    if x.dtype.kind != "f":
        return check(data, lambda t: K.elu(t, alpha), [x], lambda: _Raises(None), valid=False)
    ref = lambda: rounded(
        np.where(f64(x) > 0, f64(x), alpha * np.expm1(np.minimum(f64(x), 0))), x.dtype
    )
    check(data, lambda t: K.elu(t, alpha), [x], ref, dtype=x.dtype)


@driver("relu")
def _relu(data, name):
    x = draw_array(data, ALL_DTYPES)
    alpha = data.draw(st.sampled_from([0.0, 0.0, 0.1, 1.5]), label="alpha")
    max_value = data.draw(st.sampled_from([None, None, 6.0, 0.5, 0.0]), label="max_value")
    threshold = data.draw(st.sampled_from([0.0, 0.0, 1.0, -0.5]), label="threshold")
    # max_value below threshold: the documented pieces contradict each other
    assume(max_value is None or max_value >= threshold)
    fn = lambda t: K.relu(t, alpha=alpha, max_value=max_value, threshold=threshold)
    plain = alpha == 0 and max_value is None and threshold == 0
    if x.dtype.kind == "f":

        def ref():
            # np_relu, with 0 (not 0 * -inf) below the threshold when alpha is 0; NaN stays NaN
            xf = f64(x)
            r = (
                np_relu(xf, alpha, max_value, threshold)
                if alpha
                else np_relu(np.maximum(xf, -1e300), 0.0, max_value, threshold)
            )
            return rounded(np.where(np.isnan(xf), np.nan, r), x.dtype)

        return check(data, fn, [x], ref, dtype=x.dtype)
    if x.dtype.kind in "iu" and plain:
        return check(data, fn, [x], lambda: np.maximum(x, 0).astype(x.dtype), dtype=x.dtype)
    # non-integer parameters on an integer tensor, or bool: a TypeError or an integer result
    check(
        data,
        fn,
        [x],
        lambda: _Raises(None),
        valid=False,
        alt=lambda: np_relu(f64(x), alpha, max_value, threshold),
        compare=lambda o, r: assert_matches(
            o, r.astype(o.dtype) if o.dtype.kind != "f" else r, rtol=1e-5, atol=1
        ),
    )


# -- elementwise binary -------------------------------------------------------------------------


def draw_pair(data, dtypes=ALL_DTYPES):
    """Two arrays whose shapes broadcast, or (sometimes) do not; same or different dtypes."""
    s = draw_shape(data, label="a.shape")
    mode = data.draw(
        st.sampled_from(["same", "broadcast", "broadcast", "random", "scalar"]), label="pair"
    )
    if mode == "same":
        t = s
    elif mode == "broadcast":
        t = tuple(data.draw(st.sampled_from([d, 1]), label="b.dim") for d in s)
        t = t[data.draw(st.integers(0, len(t)), label="b.drop") :]
    elif mode == "scalar":
        t = ()
    else:
        t = draw_shape(data, label="b.shape")
    if data.draw(st.booleans(), label="swap"):
        s, t = t, s
    da = data.draw(st.sampled_from(dtypes), label="a.dtype")
    db = (
        da
        if data.draw(st.integers(0, 3), label="mixed")
        else data.draw(st.sampled_from(dtypes), label="b.dtype")
    )
    kind = data.draw(st.sampled_from(["normal", "special", "large"]), label="kind")
    return make_array(data, s, da, kind=kind, label="a"), make_array(
        data, t, db, kind=kind, label="b"
    )


def _broadcasts(a, b):
    try:
        np.broadcast_shapes(a.shape, b.shape)
        return True
    except ValueError:
        return False


COMPARE = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "less": np.less,
    "less_equal": np.less_equal,
}
MINMAX = {"maximum": np.maximum, "minimum": np.minimum}


@driver(*COMPARE, *MINMAX)
def _binary(data, name):
    a, b = draw_pair(data)
    k = getattr(K, name)
    same = a.dtype == b.dtype
    if name in COMPARE:
        ref = lambda: COMPARE[name](a, b) if _broadcasts(a, b) else _Raises(None)
        valid = same and (name in ("equal", "not_equal") or a.dtype.kind != "b")
        return check(data, k, [a, b], ref, valid=valid, dtype=bool)
    ref = lambda: MINMAX[name](a, b) if _broadcasts(a, b) else _Raises(None)
    check(
        data, k, [a, b], ref, valid=same and a.dtype.kind in "fiu", dtype=a.dtype if same else None
    )


@driver("pow")
def _pow(data, name):
    x = draw_array(data, NUMERIC)
    a = data.draw(st.sampled_from([2, 3, 0, 1, -1, 0.5, -2.5, 2.0]), label="a")
    if x.dtype.kind == "f":

        def ref():
            r = np.power(f64(x), float(a))
            if not float(a).is_integer():  # C99 pow(-inf, y): +inf for y > 0, +0 for y < 0
                r = np.where(
                    np.isneginf(f64(x)), np.inf if a > 0 else 0.0, r
                )  # NumPy's float64 says NaN
            return rounded(r, x.dtype)

        return check(
            data, lambda t: K.pow(t, a), [x], ref, dtype=x.dtype, rtol=_tol(x.dtype)[0] * 4
        )
    if isinstance(a, int) and a >= 0:
        return check(
            data, lambda t: K.pow(t, a), [x], lambda: np.power(x, a, dtype=x.dtype), dtype=x.dtype
        )
    # a negative or fractional power of an integer tensor: TypeError, or some number
    check(
        data,
        lambda t: K.pow(t, a),
        [x],
        lambda: _Raises(None),
        valid=False,
        alt=lambda: None,
        compare=lambda o, r: None,
    )


@driver("clip")
def _clip(data, name):
    x = draw_array(data, NUMERIC)
    lo = data.draw(st.sampled_from([None, -1.0, 0.0, 2.0, -np.inf, 0]), label="min")
    hi = data.draw(st.sampled_from([None, 1.0, 0.5, -2.0, np.inf, 3]), label="max")
    fn = lambda t: K.clip(t, lo, hi)

    def ref():
        lo_ = -np.inf if lo is None else lo
        hi_ = (
            np.inf if hi is None else max(hi, lo_)
        )  # Keras: max_value below min_value is raised to it
        return np.minimum(np.maximum(f64(x), lo_), hi_)

    if x.dtype.kind == "f":
        return check(data, fn, [x], lambda: rounded(ref(), x.dtype), dtype=x.dtype)
    integral = all(v is None or float(v).is_integer() for v in (lo, hi))

    def int_ref():
        info = np.iinfo(x.dtype)
        lo_, hi_ = (None if v is None else int(min(max(v, info.min), info.max)) for v in (lo, hi))
        if lo_ is not None and hi_ is not None and hi_ < lo_:
            hi_ = lo_
        out = x if lo_ is None else np.maximum(x, np.array(lo_, x.dtype))
        return out if hi_ is None else np.minimum(out, np.array(hi_, x.dtype))

    check(data, fn, [x], int_ref, valid=integral, dtype=x.dtype if integral else None)


# -- reductions ----------------------------------------------------------------------------------


def _red_ref(name, x, axis, keepdims):
    dt = x.dtype
    if name == "sum":
        return np.sum(x, axis=axis, keepdims=keepdims, dtype=dt)
    if name == "prod":
        return np.prod(x, axis=axis, keepdims=keepdims, dtype=dt)
    if name in ("max", "min"):
        return getattr(np, name)(x, axis=axis, keepdims=keepdims)
    if name == "any":
        return np.any(x, axis=axis, keepdims=keepdims)
    if name == "all":
        return np.all(x, axis=axis, keepdims=keepdims)
    if dt.kind != "f":
        raise TypeError("float reduction")
    xf = f64(x)
    if name == "mean":
        return rounded(np.mean(xf, axis=axis, keepdims=keepdims), dt)
    if name == "var":
        return rounded(np.var(xf, axis=axis, keepdims=keepdims), dt)
    if name == "std":
        return rounded(np.std(xf, axis=axis, keepdims=keepdims), dt)
    if name == "logsumexp":
        return rounded(np_logsumexp(xf, axis, keepdims), dt)
    raise AssertionError(name)


def _empty_alt(name, x, axis, keepdims):
    """TF's value for max/min over an empty axis: the identity of the reduction."""
    dt = x.dtype
    if dt.kind == "f":
        init = -np.inf if name == "max" else np.inf
    elif dt.kind == "b":
        init = name == "min"
    else:
        init = np.iinfo(dt).min if name == "max" else np.iinfo(dt).max
    return getattr(np, name)(x, axis=axis, keepdims=keepdims, initial=init)


@driver("sum", "prod", "max", "min", "mean", "var", "std", "logsumexp", "any", "all")
def _reduction(data, name):
    kind = "unit" if name == "prod" else None
    x = draw_array(data, ALL_DTYPES, kind=kind)
    axis = draw_axis(data, x.ndim)
    keepdims = data.draw(st.booleans(), label="keepdims")
    ax = valid_axes(axis, x.ndim)
    fn = lambda t: getattr(K, name)(t, axis=axis, keepdims=keepdims)
    dt = x.dtype
    ok_dtype = {
        "sum": NUMERIC,
        "prod": NUMERIC,
        "max": ALL_DTYPES,
        "min": ALL_DTYPES,
        "mean": FLOATS + ("bool",),
        "var": FLOATS + ("bool",),
        "std": FLOATS + ("bool",),
        "logsumexp": FLOATS,
        "any": ALL_DTYPES,
        "all": ALL_DTYPES,
    }[name]
    if dt.kind == "b" and name in ("mean", "var", "std"):
        xb = x.astype(K.floatx())
        ref = lambda: _red_ref(name, xb, ax, keepdims)
    else:
        ref = lambda: _red_ref(name, x, ax, keepdims)
    if ax is None:
        ref = lambda: _Raises(None)
    # float tolerances grow with the number of terms and their magnitude
    rtol = atol = None
    if dt.kind == "f" and x.size:
        fin = np.abs(f64(x)[np.isfinite(x)])
        scale = float(fin.max()) if fin.size else 1.0
        n = x.size
        atol = (
            _eps(dt)
            * n
            * max(scale, 1.0)
            * (max(scale, 1.0) if name in ("var", "std") else 1.0)
            * 4
        )
        if name == "std":
            atol = math.sqrt(atol)
        rtol = max(_tol(dt)[0], _eps(dt) * n * 4)
    expected = {"any": bool, "all": bool}.get(
        name, K.floatx() if dt.kind == "b" and name in ("mean", "var", "std") else None
    )
    if expected is None and dt.name in ok_dtype:
        expected = dt
    alt = (
        (lambda: _empty_alt(name, x, ax, keepdims))
        if name in ("max", "min") and ax is not None
        else None
    )
    compare = None
    if dt.kind in "iu" and name in ("mean", "var", "std") and ax is not None:
        # TF computes the mean of integers in integers (truncating); var/std likewise
        n = int(np.prod([x.shape[a] for a in ax], dtype=np.int64))
        ref = lambda: np.sum(x.astype(np.int64), axis=ax, keepdims=keepdims)
        compare = lambda o, r: (
            assert_matches(o, np.trunc(r / n).astype(dt) if name == "mean" and n else o, dtype=dt)
            if o.shape == r.shape
            else pytest.fail(f"shape {o.shape}, expected {r.shape}")
        )
    check(
        data,
        fn,
        [x],
        ref,
        valid=dt.name in ok_dtype,
        dtype=expected,
        rtol=rtol,
        atol=atol,
        alt=alt,
        compare=compare,
    )


@driver("argmax", "argmin")
def _arg(data, name):
    x = draw_array(data, ALL_DTYPES)
    axis = draw_axis(data, x.ndim, allow_none=False, allow_list=False)
    ax = valid_axes(axis, x.ndim)
    ref = (lambda: np_arg(x, ax[0], name)) if ax else (lambda: _Raises(None))
    check(data, lambda t: getattr(K, name)(t, axis=axis), [x], ref, dtype=np.int64)


@driver("cumsum", "cumprod")
def _scan(data, name):
    x = draw_array(data, ALL_DTYPES, kind="unit" if name == "cumprod" else None)
    axis = draw_axis(data, x.ndim, allow_none=False, allow_list=False)
    ax = valid_axes(axis, x.ndim)
    f = np.cumsum if name == "cumsum" else np.cumprod
    ref = (lambda: f(x, axis=ax[0], dtype=x.dtype)) if ax else (lambda: _Raises(None))
    atol = _eps(x.dtype) * max(x.size, 1) * 100 * 4 if x.dtype.kind == "f" else None
    rtol = (
        max(_tol(x.dtype)[0], _eps(x.dtype) * max(x.size, 1) * 4) if x.dtype.kind == "f" else None
    )
    check(
        data,
        lambda t: getattr(K, name)(t, axis=axis),
        [x],
        ref,
        valid=x.dtype.kind != "b",
        dtype=x.dtype if x.dtype.kind != "b" else None,
        rtol=rtol,
        atol=atol,
    )


# -- shapes and layout ---------------------------------------------------------------------------


def _same(fn_np, x):
    return lambda: fn_np(x)


@driver("reshape")
def _reshape(data, name):
    x = draw_array(data, ALL_DTYPES)
    mode = data.draw(st.sampled_from(["permuted", "random", "minus1"]), label="target")
    if mode == "random":
        shape = draw_shape(data, max_side=5, label="target.shape")
        shape = tuple(
            data.draw(st.sampled_from([d, -1, -2]), label="t") if i == 0 else d
            for i, d in enumerate(shape)
        )
    else:
        dims = list(x.shape)
        perm = data.draw(st.permutations(dims), label="perm") if dims else []
        shape = tuple(perm)
        if mode == "minus1" and shape:
            i = data.draw(st.integers(0, len(shape) - 1), label="i")
            shape = shape[:i] + (-1,) + shape[i + 1 :]

    def ref():
        if sum(1 for d in shape if d < 0) > 1 or any(d < -1 for d in shape):
            raise ValueError("bad shape")
        return np.reshape(x, shape)

    # -1 with a zero-size tensor is ambiguous: NumPy raises, and so may K
    check(data, lambda t: K.reshape(t, shape), [x], ref, dtype=x.dtype)


@driver("expand_dims")
def _expand_dims(data, name):
    x = draw_array(data, ALL_DTYPES)
    axis = data.draw(st.integers(-x.ndim - 3, x.ndim + 2), label="axis")
    check(
        data, lambda t: K.expand_dims(t, axis), [x], lambda: np.expand_dims(x, axis), dtype=x.dtype
    )


@driver("squeeze")
def _squeeze(data, name):
    s = draw_shape(data, max_side=2)
    x = make_array(data, s, data.draw(st.sampled_from(ALL_DTYPES), label="dtype"))
    axis = data.draw(st.integers(-x.ndim - 2, x.ndim + 1), label="axis")
    ref = (lambda: np.squeeze(x, axis)) if x.ndim else (lambda: _Raises(None))
    check(
        data,
        lambda t: K.squeeze(t, axis),
        [x],
        ref,
        dtype=x.dtype,
        modes=("feed", "const", "variable"),
    )


@driver("flatten")
def _flatten(data, name):
    x = draw_array(data, ALL_DTYPES)
    check(data, K.flatten, [x], lambda: x.reshape(-1), dtype=x.dtype)


@driver("batch_flatten")
def _batch_flatten(data, name):
    x = draw_array(data, ALL_DTYPES)

    def ref():
        if x.ndim == 0:
            raise ValueError("scalar")
        return x.reshape((x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64))))

    check(data, K.batch_flatten, [x], ref, dtype=x.dtype)


@driver("permute_dimensions")
def _permute(data, name):
    x = draw_array(data, ALL_DTYPES)
    if data.draw(st.booleans(), label="valid"):
        pattern = tuple(data.draw(st.permutations(range(x.ndim)), label="pattern"))
    else:
        pattern = tuple(
            data.draw(
                st.lists(st.integers(-x.ndim - 1, x.ndim), max_size=x.ndim + 1), label="pattern"
            )
        )
    check(
        data,
        lambda t: K.permute_dimensions(t, pattern),
        [x],
        lambda: np.transpose(x, pattern),
        dtype=x.dtype,
    )


@driver("transpose")
def _transpose(data, name):
    x = draw_array(data, ALL_DTYPES)
    check(data, K.transpose, [x], lambda: np.transpose(x), dtype=x.dtype)


@driver("repeat_elements")
def _repeat_elements(data, name):
    x = draw_array(data, ALL_DTYPES)
    rep = data.draw(st.integers(-1, 3), label="rep")
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim), label="axis")

    def ref():
        if x.ndim == 0 or rep < 0:
            raise ValueError("rank 0 or negative count")
        return np.repeat(x, rep, axis=axis)

    check(data, lambda t: K.repeat_elements(t, rep, axis), [x], ref, dtype=x.dtype)


@driver("tile")
def _tile(data, name):
    x = draw_array(data, ALL_DTYPES)
    if data.draw(st.booleans(), label="int"):
        n = data.draw(st.integers(-1, 3), label="n")
    else:
        n = data.draw(st.lists(st.integers(-1, 3), max_size=x.ndim + 1), label="n")
    reps = [n] if isinstance(n, int) else n

    def ref():
        if any(r < 0 for r in reps):
            raise ValueError("negative")
        return np.tile(x, reps)

    # TF requires one multiple per axis; NumPy pads the shorter one with 1s: either is fine
    check(data, lambda t: K.tile(t, n), [x], ref, valid=len(reps) == x.ndim, dtype=x.dtype)


@driver("reverse")
def _reverse(data, name):
    x = draw_array(data, ALL_DTYPES)
    axes = draw_axis(data, x.ndim, allow_none=False)
    ax = valid_axes(axes, x.ndim)
    ref = (lambda: np.flip(x, ax)) if ax is not None else (lambda: _Raises(None))
    check(data, lambda t: K.reverse(t, axes), [x], ref, dtype=x.dtype)


@driver("concatenate")
def _concatenate(data, name):
    base = draw_shape(data)
    n = data.draw(st.integers(1, 3), label="n")
    axis = data.draw(st.integers(-len(base) - 1, len(base)), label="axis")
    dtype = data.draw(st.sampled_from(ALL_DTYPES), label="dtype")
    arrays = []
    for i in range(n):
        s = list(base)
        if base and -len(base) <= axis < len(base):
            s[axis] = data.draw(st.integers(0, 3), label="len")
        if data.draw(st.integers(0, 4), label="mismatch") == 0:
            s = list(draw_shape(data, label="other"))
        d = (
            dtype
            if data.draw(st.integers(0, 4), label="mixed")
            else data.draw(st.sampled_from(ALL_DTYPES), label="d")
        )
        arrays.append(make_array(data, tuple(s), d, label=f"x{i}"))
    same = all(a.dtype == arrays[0].dtype for a in arrays)
    ref = lambda: np.concatenate(arrays, axis=axis)
    check(
        data,
        lambda *ts: K.concatenate(list(ts), axis=axis),
        arrays,
        ref,
        valid=same,
        dtype=arrays[0].dtype if same else None,
    )


@driver("stack")
def _stack(data, name):
    base = draw_shape(data)
    n = data.draw(st.integers(1, 3), label="n")
    axis = data.draw(st.integers(-len(base) - 2, len(base) + 1), label="axis")
    dtype = data.draw(st.sampled_from(ALL_DTYPES), label="dtype")
    arrays = []
    for i in range(n):
        s = (
            base
            if data.draw(st.integers(0, 4), label="mismatch")
            else draw_shape(data, label="other")
        )
        arrays.append(make_array(data, s, dtype, label=f"x{i}"))
    check(
        data,
        lambda *ts: K.stack(list(ts), axis=axis),
        arrays,
        lambda: np.stack(arrays, axis=axis),
        dtype=dtype,
    )


@driver("repeat")
def _repeat(data, name):
    x = draw_array(data, ALL_DTYPES, min_dims=1, max_dims=3)
    n = data.draw(st.integers(-1, 3), label="n")

    def ref():
        if x.ndim != 2 or n < 0:
            raise ValueError("repeat wants a 2-D tensor and n >= 0")
        return np.repeat(x[:, None, :], n, axis=1)

    check(data, lambda t: K.repeat(t, n), [x], ref, dtype=x.dtype)


def _draw_pad_pairs(data, k):
    return tuple(
        tuple(data.draw(st.lists(st.integers(-1, 2), min_size=2, max_size=2), label="pad"))
        for _ in range(k)
    )


@driver("temporal_padding")
def _temporal_padding(data, name):
    x = draw_array(data, ALL_DTYPES, min_dims=2, max_dims=4)
    (pad,) = _draw_pad_pairs(data, 1)

    def ref():
        if x.ndim != 3 or min(pad) < 0:
            raise ValueError("bad")
        return np.pad(x, [(0, 0), pad, (0, 0)])

    check(data, lambda t: K.temporal_padding(t, pad), [x], ref, dtype=x.dtype)


@driver("spatial_2d_padding", "spatial_3d_padding")
def _spatial_padding(data, name):
    k = 2 if name == "spatial_2d_padding" else 3
    x = draw_array(data, ALL_DTYPES, min_dims=k + 1, max_dims=k + 3, max_side=2)
    pads = _draw_pad_pairs(data, k)
    fmt = data.draw(st.sampled_from(["channels_last", "channels_first", None, "nchw"]), label="fmt")

    def ref():
        if x.ndim != k + 2 or min(min(p) for p in pads) < 0 or fmt == "nchw":
            raise ValueError("bad")
        return np_pad(x, pads, (fmt or K.image_data_format()) == "channels_first")

    check(data, lambda t: getattr(K, name)(t, pads, fmt), [x], ref, dtype=x.dtype)


@driver("resize_images", "resize_volumes")
def _resize(data, name):
    k = 2 if name == "resize_images" else 3
    x = draw_array(data, FLOATS + INTS, min_dims=k + 1, max_dims=k + 3, max_side=2, kind="finite")
    factors = tuple(data.draw(st.integers(-1, 3), label="f") for _ in range(k))
    fmt = data.draw(st.sampled_from(["channels_last", "channels_first", "nchw"]), label="fmt")

    def ref():
        if x.ndim != k + 2 or min(factors) < 1 or fmt == "nchw":
            raise ValueError("bad")
        axes = range(2, 2 + k) if fmt == "channels_first" else range(1, 1 + k)
        return np_resize(x, axes, factors, "nearest")

    check(data, lambda t: getattr(K, name)(t, *factors, fmt), [x], ref, dtype=x.dtype)


@driver("gather")
def _gather(data, name):
    x = draw_array(data, ALL_DTYPES, min_dims=0)
    n0 = x.shape[0] if x.ndim else 1
    idx_shape = draw_shape(data, max_dims=2, label="idx.shape")
    idt = data.draw(st.sampled_from(["int32", "int64", "float32", "uint8"]), label="idx.dtype")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="idx.seed"))
    idx = rng.integers(-1, n0 + 1, size=idx_shape).astype(idt)

    def ref():
        if x.ndim == 0 or idx.dtype.kind == "f":
            raise TypeError("bad")
        if idx.size and (idx.min() < 0 or idx.max() >= n0):
            raise IndexError("out of range")
        return np.take(x, idx.astype(np.int64), axis=0)

    check(data, K.gather, [x, idx], ref, dtype=x.dtype)


@driver("one_hot")
def _one_hot(data, name):
    idx_shape = draw_shape(data, max_dims=3)
    idt = data.draw(st.sampled_from(["int32", "int64", "int8", "float32"]), label="dtype")
    n = data.draw(st.integers(-1, 4), label="num_classes")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    idx = rng.integers(-2, 6, size=idx_shape).astype(idt)

    def ref():
        if idt == "float32" or n < 0:
            raise TypeError("bad")
        return (idx[..., None] == np.arange(n)).astype(np.float32)  # out of range: zeros (TF)

    check(data, lambda t: K.one_hot(t, n), [idx], ref, dtype=np.float32)


@driver("arange")
def _arange(data, name):
    start = data.draw(st.sampled_from([0, 1, -3, 5, 2.5, 0.0]), label="start")
    stop = data.draw(st.sampled_from([None, 0, 4, -2, 7.5, 10]), label="stop")
    step = data.draw(st.sampled_from([1, 2, -1, 0, 0.5, -1.5]), label="step")
    dtype = data.draw(
        st.sampled_from(["int32", "int64", "float32", "float64", "bool", "nope"]), label="dtype"
    )

    def ref():
        if step == 0 or dtype in ("bool", "nope"):
            raise ValueError("bad")
        # Keras 2.3.1 (and Theano): arange(n) with n < 0 is empty, whatever the step
        lo, hi = (0, max(start, 0)) if stop is None else (start, stop)
        if np.dtype(dtype).kind == "i" and not all(float(v).is_integer() for v in (lo, hi, step)):
            raise TypeError("fractional")
        return np.arange(lo, hi, step).astype(dtype)

    out = attempt(lambda: K.eval(K.arange(start, stop, step, dtype)))
    r = reference(ref)
    if isinstance(out, Exception):
        assert (
            isinstance(r, _Raises)
            or np.asarray(r).dtype.kind == "i"
            and any(not float(v).is_integer() for v in (start, step, stop or 0))
        ), (out, r)
        return
    if isinstance(r, _Raises):
        # fractional arguments with an int dtype: TF computes in the argument type then casts
        assert r.exc.args[0] == "fractional", (out, r)
        return
    assert_matches(out, r, dtype=dtype)


@driver("eye")
def _eye(data, name):
    size = data.draw(st.sampled_from([0, 1, 3, -1, 2.5, (2, 3), (0, 2)]), label="size")
    dtype = data.draw(st.sampled_from([None, "float32", "int32", "float64", "bool"]), label="dtype")

    def ref():
        if isinstance(size, float) or (np.ndim(size) == 0 and size < 0):
            raise ValueError("bad size")
        n, m = size if isinstance(size, tuple) else (size, size)
        return np.eye(n, m, dtype=dtype or K.floatx())

    out = attempt(lambda: K.eval(K.eye(size, dtype=dtype)))
    r = reference(ref)
    if isinstance(out, Exception):
        assert isinstance(r, _Raises) or dtype == "bool", (out, r)
    else:
        assert not isinstance(r, _Raises), out
        assert_matches(out, r, dtype=dtype or K.floatx())


@driver("zeros", "ones")
def _zeros_ones(data, name):
    shape = draw_shape(data)
    if data.draw(st.integers(0, 4), label="bad") == 0:
        shape = data.draw(st.sampled_from([(-1, 2), (2.5,), ("a",), 3, None]), label="bad shape")
    dtype = data.draw(st.sampled_from([None, *ALL_DTYPES, "nope"]), label="dtype")

    def ref():
        if dtype == "nope" or shape is None or isinstance(shape, int):
            raise TypeError("bad")
        if any(not isinstance(d, int) for d in shape):
            raise TypeError("bad")
        return getattr(np, name)(shape, dtype=dtype or K.floatx())

    out = attempt(lambda: K.eval(getattr(K, name)(shape, dtype=dtype)))
    r = reference(ref)
    if isinstance(out, Exception):
        assert isinstance(r, _Raises) or isinstance(shape, int), (
            out,
            r,
        )  # K.zeros(3) may be allowed
    elif isinstance(r, _Raises):
        assert isinstance(shape, int) and out.shape == (shape,), (out, r)
    else:
        assert_matches(out, r, dtype=dtype or K.floatx())


@driver("zeros_like", "ones_like")
def _like(data, name):
    x = draw_array(data, ALL_DTYPES)
    dtype = data.draw(st.sampled_from([None, *ALL_DTYPES]), label="dtype")
    f = np.zeros_like if name == "zeros_like" else np.ones_like
    check(
        data,
        lambda t: getattr(K, name)(t, dtype=dtype),
        [x],
        lambda: f(x, dtype=dtype or x.dtype),
        dtype=dtype or x.dtype,
    )


@driver("cast")
def _cast(data, name):
    x = draw_array(data, ALL_DTYPES)
    dtype = data.draw(st.sampled_from([*ALL_DTYPES, "float13", np.float32, "int"]), label="dtype")
    name_ = np.dtype(dtype).name if dtype in (np.float32,) else dtype
    if name_ not in ALL_DTYPES:
        return check(
            data,
            lambda t: K.cast(t, dtype),
            [x],
            lambda: _Raises(None),
            valid=False,
            alt=lambda: x.astype(np.dtype(dtype)),
            compare=lambda o, r: assert_matches(o, r),
        )
    target = np.dtype(name_)
    if x.dtype.kind == "f" and target.kind in "iub":
        # NaN, infinities and out-of-range floats to ints are undefined in NumPy: check the
        # in-range entries only (K saturates, as Rust's `as`)
        info = np.iinfo(target) if target.kind != "b" else None
        ok = (
            np.isfinite(x)
            if info is None
            else np.isfinite(x) & (f64(x) > info.min - 1) & (f64(x) < info.max + 1)
        )

        def compare(o, r):
            assert o.shape == x.shape and o.dtype == target
            np.testing.assert_array_equal(o[ok], r[ok])

        return check(
            data,
            lambda t: K.cast(t, dtype),
            [x],
            lambda: x.astype(target),
            dtype=target,
            compare=compare,
        )
    check(data, lambda t: K.cast(t, dtype), [x], lambda: x.astype(target), dtype=target)


@driver("cast_to_floatx")
def _cast_to_floatx(data, name):
    x = draw_array(data, ALL_DTYPES)
    as_list = data.draw(st.booleans(), label="list") and x.size > 0
    v = x.tolist() if as_list else x
    out = attempt(lambda: K.cast_to_floatx(v))
    assert not isinstance(out, Exception), out
    assert_matches(out, np.asarray(x, dtype=K.floatx()), dtype=K.floatx())


@driver("constant")
def _constant(data, name):
    x = draw_array(data, ALL_DTYPES)
    dtype = data.draw(st.sampled_from([None, *ALL_DTYPES, "nope"]), label="dtype")
    shape = data.draw(st.sampled_from([None, "same", "other"]), label="shape")
    shp = None if shape is None else x.shape if shape == "same" else draw_shape(data, label="other")
    scalar = data.draw(st.booleans(), label="scalar")
    value = float(x.reshape(-1)[0]) if scalar and x.size and x.dtype.kind == "f" else x
    target = dtype or K.floatx()

    def ref():
        if target == "nope":
            raise TypeError("bad")
        v = np.asarray(value)
        if shp is not None:
            if v.size == 1 or v.ndim == 0:
                return np.broadcast_to(v.reshape(()), shp).astype(target)
            return v.reshape(shp).astype(target)
        return v.astype(target)

    out = attempt(lambda: K.eval(K.constant(value, dtype=dtype, shape=shp)))
    r = reference(ref)
    if isinstance(out, Exception):
        # an unsupported value for a dtype: floats with NaN for an int dtype, etc.
        assert isinstance(r, _Raises) or (
            np.dtype(target).kind in "iub" and np.asarray(value).dtype.kind == "f"
        ), (out, r)
        return
    assert not isinstance(r, _Raises), (out, r)
    if np.dtype(target).kind in "iub" and np.asarray(value).dtype.kind == "f":
        return  # float -> int conversion of NaN/inf is undefined in NumPy
    assert_matches(out, r, dtype=target)


@driver("variable")
def _variable(data, name):
    x = draw_array(data, ALL_DTYPES)
    dtype = data.draw(st.sampled_from([None, *ALL_DTYPES, "nope"]), label="dtype")
    target = dtype or K.floatx()  # Keras: floatx() unless a dtype is given
    v = attempt(lambda: K.variable(x, dtype=dtype))
    if isinstance(v, Exception):
        assert dtype == "nope" or (np.dtype(dtype).kind in "iub" and x.dtype.kind == "f"), v
        return
    assert dtype != "nope"
    out = K.get_value(v)
    assert out.shape == x.shape and out.dtype == np.dtype(target)
    if not (np.dtype(out.dtype).kind in "iub" and x.dtype.kind == "f"):
        with np.errstate(all="ignore"):
            assert_matches(out, x.astype(out.dtype))
    assert K.int_shape(v) == x.shape and K.ndim(v) == x.ndim


@driver("placeholder")
def _placeholder(data, name):
    shape = data.draw(
        st.sampled_from([None, (), (2,), (None, 3), (0, None), (-1, 2), (2.5,), "x"]), label="shape"
    )
    ndim = data.draw(st.sampled_from([None, None, 0, 2, -1]), label="ndim")
    dtype = data.draw(st.sampled_from([None, *ALL_DTYPES, "nope"]), label="dtype")
    p = attempt(lambda: K.placeholder(shape=shape, ndim=ndim, dtype=dtype))
    bad_shape = shape in ((-1, 2), (2.5,), "x") or (shape is None and ndim is not None and ndim < 0)
    if isinstance(p, Exception):
        assert bad_shape or dtype == "nope" or (shape is None and ndim is None), p
        return
    assert not bad_shape and dtype != "nope", p
    assert K.is_placeholder(p)
    if shape is not None:
        assert K.int_shape(p) == tuple(shape)
    elif ndim is not None:
        assert K.ndim(p) == ndim
    assert K.dtype(p) == (dtype or K.floatx())
    # feeding a value of the right shape works, of a wrong shape raises
    if shape is not None:
        good = np.zeros([d if d is not None else 2 for d in shape], dtype=dtype or K.floatx())
        out = K.function([p], [K.identity(p)])([good])[0]
        assert_matches(out, good)
        must_raise(
            lambda: K.function([p], [K.identity(p)])(
                [np.zeros((7,) * (len(shape) + 1), dtype=good.dtype)]
            )
        )


# -- variables, introspection and graph API ---------------------------------------------------


@driver("identity", "stop_gradient", "to_dense", "eval", "print_tensor")
def _passthrough(data, name):
    x = draw_array(data, ALL_DTYPES)
    fn = {
        "identity": K.identity,
        "stop_gradient": K.stop_gradient,
        "to_dense": K.to_dense,
        "eval": lambda t: K.constant(K.eval(t), dtype=x.dtype.name),
        "print_tensor": lambda t: K.print_tensor(t, message="fuzz "),
    }[name]
    modes = ("const", "variable") if name == "eval" else ("feed", "feed_none", "const", "variable")
    check(data, fn, [x], lambda: x, dtype=x.dtype, modes=modes)


@driver(
    "int_shape",
    "ndim",
    "dtype",
    "shape",
    "count_params",
    "is_keras_tensor",
    "is_placeholder",
    "is_sparse",
)
def _introspection(data, name):
    x = draw_array(data, ALL_DTYPES)
    kind = data.draw(
        st.sampled_from(["placeholder", "variable", "constant", "array", "junk"]), label="kind"
    )
    obj = {
        "placeholder": lambda: K.placeholder(shape=x.shape, dtype=x.dtype.name),
        "variable": lambda: K.variable(x, dtype=x.dtype.name),
        "constant": lambda: K.constant(x, dtype=x.dtype.name),
        "array": lambda: x,
        "junk": lambda: "junk",
    }[kind]()
    out = attempt(lambda: getattr(K, name)(obj))
    if kind == "junk":
        if name in ("is_keras_tensor", "is_placeholder", "is_sparse"):
            assert out is False or isinstance(out, Exception), out
        return
    if name == "int_shape":
        assert out == x.shape, out
    elif name == "ndim":
        assert out == x.ndim
    elif name == "dtype":
        assert isinstance(out, Exception) or out == x.dtype.name, out
    elif name == "shape":
        if kind != "array":
            out = K.function([obj], [out])([x])[0] if kind == "placeholder" else K.eval(out)
        np.testing.assert_array_equal(np.asarray(out), np.array(x.shape))
    elif name == "count_params":
        assert out == x.size, out
    elif name == "is_placeholder":
        assert out == (kind == "placeholder")
    elif name == "is_sparse":
        assert out is False
    elif name == "is_keras_tensor":
        # Keras: raises ValueError for something that is not a tensor
        assert isinstance(out, ValueError) if kind == "array" else out in (True, False), out


@driver("get_value", "batch_get_value")
def _get_value(data, name):
    arrays = [
        draw_array(data, ALL_DTYPES, label=f"x{i}")
        for i in range(data.draw(st.integers(0, 3), label="n"))
    ]
    vs = [K.variable(a, dtype=a.dtype.name) for a in arrays]
    if name == "get_value":
        for a, v in zip(arrays, vs):
            assert_matches(K.get_value(v), a, dtype=a.dtype)
        must_raise(lambda: K.get_value("junk"))
    else:
        mixed = [v if i % 2 else K.identity(v) for i, v in enumerate(vs)]  # variables and tensors
        out = K.batch_get_value(mixed)
        assert len(out) == len(arrays)
        for o, a in zip(out, arrays):
            assert_matches(o, a, dtype=a.dtype if a.dtype.kind != "b" else None)


@driver("set_value", "batch_set_value")
def _set_value(data, name):
    x = draw_array(data, ALL_DTYPES)
    v = K.variable(x, dtype=x.dtype.name)
    same = data.draw(st.booleans(), label="same shape")
    new = make_array(
        data,
        x.shape if same else draw_shape(data, label="new.shape"),
        data.draw(st.sampled_from(ALL_DTYPES), label="new.dtype"),
        label="new",
    )
    if name == "set_value":
        out = attempt(lambda: K.set_value(v, new))
    else:
        y = K.variable(x, dtype=x.dtype.name)
        out = attempt(lambda: K.batch_set_value([(y, x), (v, new)]))
    if new.shape != x.shape:
        assert isinstance(out, ValueError), out
        assert_matches(K.get_value(v), x)  # unchanged
        return
    if isinstance(out, Exception):
        assert new.dtype.kind == "f" and x.dtype.kind in "iub", out
        assert_matches(K.get_value(v), x)
        return
    got = K.get_value(v)
    assert got.dtype == x.dtype and got.shape == x.shape
    if not (new.dtype.kind == "f" and x.dtype.kind in "iub"):
        with np.errstate(all="ignore"):
            assert_matches(got, new.astype(x.dtype))


@driver("update", "update_add", "update_sub", "moving_average_update")
def _update(data, name):
    x = draw_array(data, FLOATS + INTS)
    v = K.variable(x, dtype=x.dtype.name)
    same = data.draw(st.integers(0, 3), label="same shape")
    new = make_array(
        data, x.shape if same else draw_shape(data, label="new.shape"), x.dtype, label="new"
    )
    if name == "moving_average_update":
        m = data.draw(st.sampled_from([0.0, 0.5, 0.99, 1.0]), label="momentum")
        op = attempt(lambda: K.moving_average_update(v, K.constant(new, dtype=x.dtype.name), m))
        # Keras 2.3.1's TF backend, in the variable's dtype: x - (x - new) * (1 - m)
        ref = lambda: x - (x - new) * x.dtype.type(1 - m)
    else:
        op = attempt(lambda: getattr(K, name)(v, K.constant(new, dtype=x.dtype.name)))
        ref = {"update": lambda: new, "update_add": lambda: x + new, "update_sub": lambda: x - new}[
            name
        ]
    if isinstance(op, Exception):
        assert new.shape != x.shape or (name == "moving_average_update" and x.dtype.kind != "f"), op
        assert_matches(K.get_value(v), x)
        return
    f = attempt(lambda: K.function([], [], updates=[op]))
    if isinstance(f, Exception):
        assert new.shape != x.shape, f
        assert_matches(K.get_value(v), x)
        return
    r = attempt(lambda: f([]))
    if isinstance(r, Exception):
        assert new.shape != x.shape, r
        assert_matches(K.get_value(v), x)
        return
    assert _broadcasts(x, new) and np.broadcast_shapes(x.shape, new.shape) == x.shape
    with np.errstate(all="ignore"):
        expect = np.broadcast_to(np.asarray(ref()), x.shape).astype(x.dtype)
    assert_matches(K.get_value(v), expect, dtype=x.dtype)


@driver("gradients")
def _gradients(data, name):
    x = draw_array(data, FLOATS + ("int32",))
    v = K.variable(x, dtype=x.dtype.name)
    op = data.draw(st.sampled_from(["square", "sum", "exp", "unrelated"]), label="op")
    loss = {
        "square": lambda: K.sum(K.square(v)),
        "sum": lambda: K.sum(v * 3),
        "exp": lambda: K.sum(K.exp(v)),
        "unrelated": lambda: K.sum(K.constant(1.0) * 2),
    }
    lo = attempt(loss[op])
    if isinstance(lo, Exception):
        assert x.dtype.kind != "f", lo
        return
    g = attempt(lambda: K.gradients(lo, [v]))
    if isinstance(g, Exception):
        assert x.dtype.kind != "f", g
        return
    if op == "unrelated":
        assert g == [None]
        return
    if x.dtype.kind != "f":
        return
    ref = {
        "square": lambda: 2 * f64(x),
        "sum": lambda: np.full(x.shape, 3.0),
        "exp": lambda: np.exp(f64(x)),
    }[op]
    assert_matches(K.eval(g[0]), rounded(reference(ref), x.dtype), dtype=x.dtype)


@driver("function")
def _function(data, name):
    x = draw_array(data, FLOATS + INTS)
    shape = tuple(None if data.draw(st.booleans(), label="none") else d for d in x.shape)
    p = K.placeholder(shape=shape, dtype=x.dtype.name)
    v = K.variable(np.zeros((), dtype=x.dtype), dtype=x.dtype.name)
    kw = {"bogus": 1} if data.draw(st.integers(0, 5), label="kw") == 0 else {}
    f = attempt(
        lambda: K.function([p], [p * 2, K.sum(p)], updates=[K.update_add(v, K.sum(p))], **kw)
    )
    if kw:
        assert isinstance(f, ValueError), f
        return
    feed_kind = data.draw(
        st.sampled_from(["good", "good", "shape", "dtype", "count", "list", "junk"]), label="feed"
    )
    feeds = {
        "good": lambda: [x],
        "shape": lambda: [np.zeros(x.shape + (2,), x.dtype)],
        "dtype": lambda: [np.full(x.shape, 0.5)],
        "count": lambda: [x, x],
        "list": lambda: [x.tolist()],
        "junk": lambda: ["junk"],
    }[feed_kind]()
    before = K.get_value(v)
    out = attempt(lambda: f(feeds))
    if isinstance(out, Exception):
        assert feed_kind not in ("good", "list") or x.size == 0 and feed_kind == "list", out
        assert_matches(K.get_value(v), before)  # a failed call changes nothing
        return
    assert feed_kind in ("good", "list", "dtype") or (
        feed_kind == "dtype" and x.dtype.kind == "f"
    ), feed_kind
    if feed_kind == "dtype":
        assert x.dtype.kind == "f" or x.size == 0, (
            "non-integer floats fed to an int placeholder must raise"
        )
        return
    with np.errstate(all="ignore"):
        assert_matches(
            out[0],
            (x * 2).astype(x.dtype),
            dtype=x.dtype,
            rtol=_tol(x.dtype)[0],
            atol=_tol(x.dtype)[1],
        )
        s = np.sum(x, dtype=x.dtype)
    rtol = max(_tol(x.dtype)[0], _eps(x.dtype) * x.size * 4) if x.dtype.kind == "f" else 0
    atol = (
        _eps(x.dtype)
        * x.size
        * float(np.nanmax(np.abs(np.where(np.isfinite(f64(x)), f64(x), 0)), initial=1))
        * 4
        if x.dtype.kind == "f"
        else 0
    )
    assert_matches(out[1], s, dtype=x.dtype, rtol=rtol, atol=atol)


# -- linear algebra and nn -------------------------------------------------------------------------


@driver("dot")
def _dot(data, name):
    a = draw_array(data, NUMERIC, max_dims=3, kind="finite", label="a")
    mode = data.draw(st.sampled_from(["matching", "matching", "random"]), label="mode")
    if mode == "matching" and a.ndim:
        k = a.shape[-1]
        tail = draw_shape(data, min_dims=0, max_dims=2, label="b.tail")
        s = tail[:-1] + (k,) + tail[-1:] if len(tail) >= 1 else (k,)
    else:
        s = draw_shape(data, max_dims=3, label="b.shape")
    dt = (
        a.dtype
        if data.draw(st.integers(0, 3), label="mixed")
        else np.dtype(data.draw(st.sampled_from(NUMERIC), label="b.dtype"))
    )
    b = make_array(data, s, dt, kind="finite", label="b")

    def ref():
        if a.dtype != b.dtype:
            raise TypeError("dtypes")
        if a.dtype.kind == "f":
            return rounded(np.dot(f64(a), f64(b)), a.dtype)
        return np.dot(a, b).astype(a.dtype)

    valid = a.dtype == b.dtype and a.ndim >= 2 and b.ndim >= 2
    n = a.shape[-1] if a.ndim else 1
    atol = _eps(a.dtype) * 9 * max(n, 1) * 10 * 4 if a.dtype.kind == "f" else None
    rtol = max(_tol(a.dtype)[0], _eps(a.dtype) * 8) if a.dtype.kind == "f" else None
    check(
        data,
        K.dot,
        [a, b],
        ref,
        valid=valid,
        dtype=a.dtype if a.dtype == b.dtype else None,
        rtol=rtol,
        atol=atol,
    )


@driver("batch_dot")
def _batch_dot(data, name):
    B = data.draw(st.integers(0, 3), label="batch")
    a = make_array(
        data,
        (B,) + draw_shape(data, 1, 3, 1, 3, label="a.shape"),
        "float32",
        kind="finite",
        label="a",
    )
    axes_mode = data.draw(st.sampled_from(["none", "int", "pair", "bad"]), label="axes")
    if data.draw(st.booleans(), label="match"):
        k = a.shape[-1]
        s = (B,) + draw_shape(data, 0, 2, 1, 3, label="b.shape")
        s = s[:-1] + (k,) + s[-1:] if len(s) > 2 else s + (k,) if len(s) == 1 else (B, k)
    else:
        s = (B,) + draw_shape(data, 1, 3, 1, 3, label="b.shape")
    b = make_array(data, s, "float32", kind="finite", label="b")
    axes = {
        "none": None,
        "int": data.draw(st.integers(-1, 3), label="axis"),
        "pair": tuple(
            data.draw(st.lists(st.integers(-1, 3), min_size=2, max_size=2), label="pair")
        ),
        "bad": data.draw(st.sampled_from([(1, 2, 3), 0, (0, 1), "x"]), label="badaxes"),
    }[axes_mode]

    def ref():
        ax = (
            default_axes(a.ndim, b.ndim)
            if axes is None
            else (axes, axes)
            if isinstance(axes, int)
            else axes
        )
        if not isinstance(ax, tuple) or len(ax) != 2 or not all(isinstance(q, int) for q in ax):
            raise ValueError("axes")
        ax = tuple(q % r if -r <= q < r else -1 for q, r in zip(ax, (a.ndim, b.ndim)))
        if min(ax) < 1 or a.shape[ax[0]] != b.shape[ax[1]]:
            raise ValueError("axes")
        if B == 0:
            raise ValueError("empty batch")  # np.stack of nothing: compared by shape below
        return np_batch_dot(f64(a), f64(b), ax)

    r = reference(ref)
    out = attempt(lambda: evaluate(data, lambda x, y: K.batch_dot(x, y, axes), [a, b]))
    if isinstance(out, Exception):
        assert isinstance(r, _Raises), (out, r)
        return
    if isinstance(r, _Raises):
        assert B == 0 and r.exc.args[0] == "empty batch", (out, r)
        return
    assert_matches(out, rounded(r, np.float32), dtype=np.float32, rtol=1e-4, atol=1e-4)


@driver("l2_normalize")
def _l2_normalize(data, name):
    x = draw_array(data, FLOATS, max_dims=3)
    axis = draw_axis(data, x.ndim, allow_list=False)
    ax = valid_axes(axis, x.ndim)
    with np.errstate(all="ignore"):
        # float16: a sum of squares beyond 65504 overflows (as in TF), out of scope here
        assume(
            x.dtype != np.float16
            or not np.isinf(np.sum(np.square(x.astype(np.float16)), dtype=np.float16))
        )
    ref = (
        (lambda: rounded(np_l2_normalize(f64(x), None if axis is None else ax), x.dtype))
        if ax is not None
        else (lambda: _Raises(None))
    )
    check(
        data,
        lambda t: K.l2_normalize(t, axis),
        [x],
        ref,
        dtype=x.dtype,
        rtol=_tol(x.dtype)[0] * 5,
        atol=_tol(x.dtype)[1] * 5,
    )


@driver("bias_add")
def _bias_add(data, name):
    x = draw_array(data, FLOATS, min_dims=1, max_dims=5)
    dt = x.dtype
    fmt = data.draw(
        st.sampled_from([None, "channels_last", "channels_first", "bogus"]), label="fmt"
    )
    cf = (fmt or K.image_data_format()) == "channels_first"
    C = x.shape[1] if cf and x.ndim > 1 else x.shape[-1]
    bshape = data.draw(st.sampled_from([(C,), (C + 1,), (), "full"]), label="bias.shape")
    if bshape == "full":
        bshape = x.shape[1:]
    b = make_array(data, bshape, dt, label="bias")

    def ref():
        if fmt == "bogus" or b.ndim == 0 or (b.ndim != 1 and b.ndim != x.ndim - 1):
            raise ValueError("bad")
        if b.ndim == 1:
            if b.shape[0] != C and not (C == 0 and b.shape[0] == 1):
                raise ValueError("bad")
            shape = [1] * x.ndim
            shape[1 if cf and x.ndim > 2 else -1] = b.shape[0]
            return rounded(f64(x) + f64(b).reshape(shape), dt)
        if cf and x.ndim > 2:
            return (
                rounded(f64(x) + np.moveaxis(f64(b), -1, 0)[None], dt)
                if b.shape == x.shape[1:]
                else _Raises(None)
            )
        return rounded(f64(x) + f64(b)[None], dt)

    check(
        data,
        lambda t, u: K.bias_add(t, u, fmt),
        [x, b],
        ref,
        valid=bshape == (C,) and fmt != "bogus" and x.ndim >= 2,
        dtype=dt,
    )


@driver("batch_normalization")
def _batch_normalization(data, name):
    x = draw_array(data, ("float32", "float64"), min_dims=1, max_dims=4, kind="finite")
    C = x.shape[-1]
    ps = [
        make_array(
            data,
            data.draw(st.sampled_from([(C,), (C,), (C + 1,)]), label="p.shape"),
            x.dtype,
            kind="positive" if i == 1 else "finite",
            label=f"p{i}",
        )
        for i in range(4)
    ]
    eps = data.draw(st.sampled_from([1e-3, 0.0, 1e-5]), label="eps")
    ok = all(p.shape == (C,) for p in ps)
    ref = lambda: rounded(
        np_bn(*(f64(a) for a in [x, *ps[:2]]), f64(ps[2]), f64(ps[3]), eps), x.dtype
    )
    check(
        data,
        lambda t, m, v, bb, g: K.batch_normalization(t, m, v, bb, g, epsilon=eps),
        [x, *ps],
        ref,
        valid=ok,
        dtype=x.dtype,
        rtol=1e-4,
        atol=1e-4,
    )


@driver("normalize_batch_in_training")
def _nbt(data, name):
    x = draw_array(data, ("float32", "float64"), min_dims=1, max_dims=4, min_side=1, kind="finite")
    axes = data.draw(
        st.lists(st.integers(-1, x.ndim), min_size=1, max_size=x.ndim, unique=True), label="axes"
    )
    ax = valid_axes(axes, x.ndim)
    pshape = tuple(d for i, d in enumerate(x.shape) if ax is None or i not in ax)
    g = make_array(data, pshape, x.dtype, kind="positive", label="g")
    b = make_array(data, pshape, x.dtype, kind="finite", label="b")
    ref = (
        (lambda: [rounded(r, x.dtype) for r in np_nbt(f64(x), f64(g), f64(b), ax, 1e-3)])
        if ax
        else (lambda: _Raises(None))
    )
    check(
        data,
        lambda t, gg, bb: list(K.normalize_batch_in_training(t, gg, bb, axes)),
        [x, g, b],
        ref,
        dtype=x.dtype,
        rtol=1e-3,
        atol=1e-3,
    )


@driver("softmax")
def _softmax(data, name):
    x = draw_array(data, ALL_DTYPES, kind=None)
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim), label="axis")
    valid = x.dtype.kind == "f" and -x.ndim <= axis < x.ndim
    ref = (lambda: rounded(np_softmax(f64(x), axis), x.dtype)) if valid else (lambda: _Raises(None))
    check(
        data,
        lambda t: K.softmax(t, axis),
        [x],
        ref,
        valid=valid,
        dtype=x.dtype,
        rtol=_tol(x.dtype)[0] * 5,
        atol=_tol(x.dtype)[1] * 5,
        alt=(lambda: x) if x.size == 0 else None,
    )


def _probs(data, shape, dtype, label):
    a = make_array(data, shape, dtype, kind="positive", label=label)
    return (a / np.maximum(a.sum(axis=-1, keepdims=True), 1e-3)).astype(dtype) if a.ndim else a


@driver("categorical_crossentropy", "binary_crossentropy", "sparse_categorical_crossentropy")
def _crossentropy(data, name):
    dt = data.draw(st.sampled_from(["float32", "float64"]), label="dtype")
    shape = draw_shape(data, 1, 3, 1, 3)
    from_logits = data.draw(st.booleans(), label="from_logits")
    out_arr = (
        make_array(data, shape, dt, kind="large", label="logits")
        if from_logits
        else _probs(data, shape, dt, "p")
    )
    if not from_logits and data.draw(st.integers(0, 3), label="raw") == 0:
        out_arr = make_array(data, shape, dt, label="raw")  # NaN, negatives, > 1
    tshape = (
        shape
        if data.draw(st.integers(0, 4), label="tmatch")
        else draw_shape(data, 1, 3, 1, 3, label="t.shape")
    )
    if name == "sparse_categorical_crossentropy":
        tshape = shape[:-1] if data.draw(st.integers(0, 4), label="tmatch2") else tshape
        rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="t.seed"))
        t = rng.integers(0, max(shape[-1], 1), size=tshape).astype(
            data.draw(st.sampled_from(["int32", "int64", dt]), label="t.dtype")
        )
    elif name == "categorical_crossentropy":
        t = _probs(data, tshape, dt, "t")
    else:
        t = make_array(data, tshape, dt, kind="unit", label="t")
        t = np.abs(t).astype(dt)
    fn = lambda tt, oo: getattr(K, name)(tt, oo, from_logits=from_logits)
    cls_ok = len(shape) >= 1

    def ref():
        # logits in float64; clipped probabilities in the tensor's dtype, since the clip to
        # [eps, 1 - eps] rounds differently in float32 (as in TF)
        T, O = (f64(t), f64(out_arr)) if from_logits else (t.astype(dt), out_arr)  # noqa: E741 (target, output)
        if name == "binary_crossentropy":
            return rounded(np_bce_logits(T, O) if from_logits else np_bce(T, O), dt)
        if name == "categorical_crossentropy":
            np.broadcast_shapes(T.shape, O.shape)
            return rounded(np_cce_logits(T, O) if from_logits else np_cce(T, O), dt)
        if t.size != int(np.prod(O.shape[:-1])) or not cls_ok:
            raise ValueError("shape")
        # Keras 2.3.1 flattens the targets: any shape with one target per row is accepted
        return rounded(np_scce(t.reshape(O.shape[:-1]), O, from_logits=from_logits), dt)

    def compare(o, r):
        assert o.shape == r.shape and o.dtype == np.dtype(dt)
        # finite inputs give finite results
        fin = np.all(np.isfinite(out_arr))
        if fin:
            assert np.all(np.isfinite(o) | np.isnan(r)) or not np.all(np.isfinite(r)), o
        np.testing.assert_allclose(o, r, rtol=1e-3, atol=1e-4, equal_nan=True)

    check(
        data,
        fn,
        [t, out_arr],
        ref,
        compare=compare,
        valid=t.shape == out_arr.shape
        or (
            name == "sparse_categorical_crossentropy" and t.shape in (shape[:-1], shape[:-1] + (1,))
        ),
    )


@driver("in_top_k")
def _in_top_k(data, name):
    B = data.draw(st.integers(0, 3), label="B")
    C = data.draw(st.integers(0, 4), label="C")
    pred = make_array(
        data, (B, C), data.draw(st.sampled_from(["float32", "float64"]), label="dt"), label="pred"
    )
    if data.draw(st.integers(0, 4), label="predbad") == 0:
        pred = make_array(data, draw_shape(data, label="pred.shape"), "float32", label="pred2")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    tdt = data.draw(st.sampled_from(["int32", "int64", "float32"]), label="t.dtype")
    tshape = (
        (B,) if data.draw(st.integers(0, 4), label="tmatch") else draw_shape(data, label="t.shape")
    )
    t = rng.integers(-1, C + 2, size=tshape).astype(tdt)
    k = data.draw(st.integers(-1, 5), label="k")

    def ref():
        if pred.ndim != 2 or t.shape != (pred.shape[0],) or t.dtype.kind == "f":
            raise ValueError("shape")
        return np_in_top_k(f64(pred), t.astype(int), k)

    check(
        data,
        lambda p, tt: K.in_top_k(p, tt, k),
        [pred, t],
        ref,
        dtype=bool,
        modes=("feed", "const"),
    )


@driver("dropout")
def _dropout(data, name):
    x = draw_array(data, FLOATS, kind="finite")
    level = data.draw(st.sampled_from([0.0, 0.5, 0.9, 1.0, -0.1, 1.5]), label="level")
    seed = data.draw(st.sampled_from([None, 0, 123]), label="seed")
    ns = data.draw(st.sampled_from([None, "ones", "bad"]), label="noise_shape")
    noise_shape = (
        None if ns is None else tuple(1 for _ in x.shape) if ns == "ones" else (7,) * (x.ndim + 1)
    )
    out = attempt(
        lambda: K.eval(K.dropout(K.constant(x, dtype=x.dtype.name), level, noise_shape, seed))
    )
    valid = 0 <= level < 1 and ns != "bad"
    if isinstance(out, Exception):
        assert not valid, out
        return
    # level 0 keeps everything, so the noise shape is never used
    assert valid or (ns == "bad" and level == 0), (
        f"dropout(level={level}, noise_shape={noise_shape}) returned"
    )
    assert out.shape == x.shape and out.dtype == x.dtype
    kept = f64(x) / (1 - level)
    ok = (out == 0) | np.isclose(
        f64(out), kept, rtol=_tol(x.dtype)[0] * 10, atol=_tol(x.dtype)[1] * 10
    )
    assert ok.all(), (x, out)


@driver("random_uniform", "random_normal", "truncated_normal", "random_binomial")
def _random(data, name):
    shape = draw_shape(data, max_side=4)
    if data.draw(st.integers(0, 5), label="bad") == 0:
        shape = data.draw(st.sampled_from([(-1,), (2.5,), None]), label="bad shape")
    dtype = data.draw(
        st.sampled_from([None, "float32", "float64", "float16", "int32"]), label="dtype"
    )
    seed = data.draw(st.sampled_from([None, 0, 7, 2**31]), label="seed")
    a = data.draw(st.sampled_from([0.0, -2.0, 1.0, 0.5]), label="a")
    b = data.draw(st.sampled_from([1.0, 0.0, 3.0, -1.0]), label="b")
    args = {
        "random_uniform": dict(minval=a, maxval=b),
        "random_normal": dict(mean=a, stddev=b),
        "truncated_normal": dict(mean=a, stddev=b),
        "random_binomial": dict(p=min(abs(a), 1.0)),
    }[name]
    out = attempt(lambda: K.eval(getattr(K, name)(shape, dtype=dtype, seed=seed, **args)))
    bad = shape is None or any(not isinstance(d, int) or d < 0 for d in shape) or dtype == "int32"
    if isinstance(out, Exception):
        assert (
            bad
            or (name != "random_binomial" and b < 0 and name != "random_uniform")
            or (name == "random_uniform" and b < a)
        ), out
        return
    assert not (shape is None or any(not isinstance(d, int) or d < 0 for d in shape)), out
    assert out.shape == tuple(shape) and out.dtype == np.dtype(dtype or K.floatx())
    assert np.all(np.isfinite(out))
    if name == "random_uniform" and a < b and out.dtype.kind == "f":
        assert np.all((out >= a) & (out <= b))
    if name == "truncated_normal" and b >= 0:
        assert np.all(np.abs(f64(out) - a) <= 2 * b * (1 + 1e-3) + 1e-6)
    if name == "random_binomial":
        assert np.all((out == 0) | (out == 1))


@driver("random_uniform_variable", "random_normal_variable")
def _random_variable(data, name):
    shape = draw_shape(data, max_side=4)
    dtype = data.draw(st.sampled_from([None, "float32", "float64"]), label="dtype")
    seed = data.draw(st.sampled_from([None, 0, 7]), label="seed")
    a, b = data.draw(
        st.sampled_from([(0.0, 1.0), (-1.0, 1.0), (2.0, 2.0), (1.0, 0.0)]), label="params"
    )
    v = attempt(lambda: getattr(K, name)(shape, a, b, dtype=dtype, seed=seed))
    if isinstance(v, Exception):
        assert b < a or (name == "random_normal_variable" and b < 0), v
        return
    out = K.get_value(v)
    assert out.shape == shape and out.dtype == np.dtype(dtype or K.floatx())
    assert np.all(np.isfinite(out))
    if name == "random_uniform_variable" and a < b:
        assert np.all((out >= a) & (out <= b))


# -- control flow ----------------------------------------------------------------------------------


@driver("switch")
def _switch(data, name):
    x = draw_array(data, FLOATS + INTS, label="then")
    y = make_array(
        data,
        x.shape
        if data.draw(st.integers(0, 4), label="same")
        else draw_shape(data, label="else.shape"),
        x.dtype,
        label="else",
    )
    crank = data.draw(st.integers(0, x.ndim + 1), label="cond.rank")
    cshape = x.shape[:crank] if crank <= x.ndim else draw_shape(data, label="cond.shape")
    cdt = data.draw(st.sampled_from(["bool", "float32", "int32"]), label="cond.dtype")
    c = make_array(data, cshape, cdt, label="cond")

    def ref():
        cc = c.astype(bool)  # Keras: the condition's axes are the leading ones
        nd = max(x.ndim, y.ndim)
        if c.ndim <= nd:
            cc = cc.reshape(c.shape + (1,) * (nd - c.ndim))
        return np.where(cc, x, y)  # shapes that differ broadcast (tf.where)

    check(
        data,
        K.switch,
        [c, x, y],
        ref,
        valid=cdt == "bool" and x.shape == y.shape and c.shape == x.shape[: c.ndim],
        dtype=x.dtype,
    )


@driver("in_train_phase", "in_test_phase")
def _phase(data, name):
    x = draw_array(data, FLOATS, label="x")
    alt = make_array(
        data,
        x.shape
        if data.draw(st.integers(0, 3), label="same")
        else draw_shape(data, label="alt.shape"),
        x.dtype,
        label="alt",
    )
    training = data.draw(st.sampled_from([None, 0, 1, True, False, "tensor"]), label="training")
    xs, alts = K.constant(x, dtype=x.dtype.name), K.constant(alt, dtype=x.dtype.name)
    if training == "tensor":
        p = K.placeholder(shape=(), dtype="bool")
        phase = data.draw(st.booleans(), label="phase")
        out = attempt(
            lambda: K.function([p], [getattr(K, name)(xs, alts, training=p)])([np.array(phase)])[0]
        )
    else:
        phase = (
            bool(training) if training is not None else False
        )  # the learning phase defaults to 0
        out = attempt(lambda: K.eval(getattr(K, name)(xs, alts, training=training)))
    first = phase if name == "in_train_phase" else not phase
    if isinstance(out, Exception):
        assert x.shape != alt.shape, out
        return
    want = x if first else alt
    if x.shape != alt.shape and out.shape != want.shape:
        # a runtime switch selects elementwise, broadcasting the branches
        want = np.broadcast_to(want, np.broadcast_shapes(x.shape, alt.shape))
    assert_matches(out, want, dtype=x.dtype)


@driver("map_fn")
def _map_fn(data, name):
    x = draw_array(data, FLOATS, min_dims=1, max_dims=3, kind="finite")
    check(
        data,
        lambda t: K.map_fn(lambda r: r * 2.0 + 1.0, t),
        [x],
        lambda: rounded(f64(x) * 2 + 1, x.dtype),
        dtype=x.dtype,
        modes=("feed", "const"),
    )


@driver("foldl", "foldr")
def _fold(data, name):
    x = draw_array(data, FLOATS, min_dims=1, max_dims=3, kind="finite")
    init = data.draw(st.sampled_from(["none", "zeros", "bad"]), label="init")

    def build(t):
        if init == "none":
            return getattr(K, name)(lambda a, e: a * 0.5 + e, t)
        shape = x.shape[1:] if init == "zeros" else ()  # "bad": the body's result has another shape
        return getattr(K, name)(
            lambda a, e: a * 0.5 + e, t, initializer=K.zeros(shape, dtype=x.dtype.name)
        )

    def ref():
        seq = f64(x) if name == "foldl" else f64(x)[::-1]
        if init == "bad" and x.ndim >= 2:
            raise ValueError("shape")
        if init == "none":
            if seq.shape[0] == 0:
                raise ValueError("empty without initializer")
            acc, seq = seq[0], seq[1:]
        else:
            acc = np.zeros(x.shape[1:])
        for e in seq:
            acc = acc * 0.5 + e
        return rounded(acc, x.dtype)

    tol = 1e-2 if x.dtype == np.float16 else 1e-4
    check(data, build, [x], ref, dtype=x.dtype, rtol=tol, atol=tol, modes=("feed", "const"))


@driver("rnn")
def _rnn(data, name):
    B, T, D = (data.draw(st.integers(0, 3), label=n) for n in "BTD")
    x = make_array(data, (B, T, D), "float32", kind="finite", label="x")
    h0 = make_array(
        data,
        (B, D) if data.draw(st.integers(0, 4), label="h0ok") else (B, D + 1),
        "float32",
        kind="finite",
        label="h0",
    )
    back = data.draw(st.booleans(), label="go_backwards")
    unroll = data.draw(st.booleans(), label="unroll") and T > 0

    def step(inp, states):
        h = K.tanh(inp + states[0] * 0.5)
        return h, [h]

    def ref():
        if T == 0:
            raise ValueError("no time steps")
        h, outs = f64(h0), []  # a state of another width broadcasts when D == 1
        for s in range(T - 1, -1, -1) if back else range(T):
            h_new = np.tanh(f64(x)[:, s] + h * 0.5)
            if h_new.shape != h.shape and not unroll:  # unrolled steps are plain graph code
                raise ValueError("the state changes shape")
            h = h_new
            outs.append(h)
        return [h.astype("float32"), np.stack(outs, 1).astype("float32"), h.astype("float32")]

    def build(t, s0):
        last, outs, states = K.rnn(step, t, [s0], go_backwards=back, unroll=unroll)
        return [last, outs, states[0]]

    check(
        data, build, [x, h0], ref, dtype=np.float32, rtol=1e-5, atol=1e-5, modes=("feed", "const")
    )


@driver("py_function")
def _py_function(data, name):
    x = draw_array(data, FLOATS + INTS)
    behaviour = data.draw(
        st.sampled_from(["double", "double", "raise", "wrong_dtype", "wrong_shape", "junk"]),
        label="behaviour",
    )

    def body(a):
        a = np.asarray(a)
        if behaviour == "raise":
            raise ValueError("raised inside the py_function body")
        if behaviour == "wrong_dtype":
            return (a * 2).astype(np.float64 if a.dtype != np.float64 else np.float32)
        if behaviour == "wrong_shape":
            return np.zeros(a.shape + (3,), a.dtype)
        if behaviour == "junk":
            return "junk"
        return (a * 2).astype(a.dtype)

    p = K.placeholder(shape=x.shape, dtype=x.dtype.name)
    y = attempt(lambda: K.py_function(body, [p], x.dtype.name))
    if isinstance(y, Exception):
        raise AssertionError(f"py_function construction failed: {y!r}")
    f = K.function([p], [y])
    out = attempt(lambda: f([x]))
    if behaviour == "double":
        assert not isinstance(out, Exception), out
        with np.errstate(all="ignore"):
            assert_matches(out[0], (x * 2).astype(x.dtype), dtype=x.dtype)
    elif behaviour == "raise":
        assert isinstance(out, ValueError) and "inside the py_function" in str(out), out
    elif not isinstance(out, Exception):
        # a result of another dtype may be converted; of another shape or type it may not
        assert behaviour in ("wrong_dtype", "wrong_shape"), (behaviour, out)


# -- configuration and session -----------------------------------------------------------------------


@contextlib.contextmanager
def _saved_config():
    saved = (K.floatx(), K.epsilon(), K.image_data_format())
    try:
        yield
    finally:
        K.set_floatx(saved[0])
        K.set_epsilon(saved[1])
        K.set_image_data_format(saved[2])
        K.set_learning_phase(0)
        K.clear_session()


@driver(
    "floatx",
    "set_floatx",
    "epsilon",
    "set_epsilon",
    "image_data_format",
    "set_image_data_format",
    "backend",
    "manual_variable_initialization",
)
def _config(data, name):
    with _saved_config():
        if name in ("floatx", "set_floatx"):
            v = data.draw(
                st.sampled_from(["float16", "float32", "float64", "int32", "float13", 3, None]),
                label="v",
            )
            out = attempt(lambda: K.set_floatx(v))
            if v in FLOATS:
                assert out is None and K.floatx() == v
                assert K.dtype(K.zeros((2,))) == v and K.eval(K.constant([1.5])).dtype == v
            else:
                assert isinstance(out, Exception), v
        elif name in ("epsilon", "set_epsilon"):
            v = data.draw(st.sampled_from([1e-7, 1e-3, 0.0, 1, "x", None]), label="v")
            out = attempt(lambda: K.set_epsilon(v))
            if isinstance(v, (int, float)):
                assert out is None and K.epsilon() == v
            else:
                assert isinstance(out, Exception) or K.epsilon() == v, out
        elif name in ("image_data_format", "set_image_data_format"):
            v = data.draw(
                st.sampled_from(["channels_first", "channels_last", "nhwc", None, 1]), label="v"
            )
            out = attempt(lambda: K.set_image_data_format(v))
            if v in ("channels_first", "channels_last"):
                assert out is None and K.image_data_format() == v
            else:
                assert isinstance(out, Exception), v
        elif name == "backend":
            assert K.backend() == "ferrokeras"
        else:
            v = data.draw(st.booleans(), label="v")
            assert attempt(lambda: K.manual_variable_initialization(v)) is None


@driver("learning_phase", "set_learning_phase")
def _learning_phase(data, name):
    with _saved_config():
        v = data.draw(st.sampled_from([0, 1, True, False, 2, -1, "1", None, 0.5]), label="v")
        out = attempt(lambda: K.set_learning_phase(v))
        if v in (0, 1) and not isinstance(v, str):
            assert out is None
            lp = K.learning_phase()
            assert int(K.eval(K.cast(lp, "int32")) if hasattr(lp, "dtype") else lp) == int(v)
        else:
            assert isinstance(out, ValueError), (v, out)


@driver("get_uid", "reset_uids", "clear_session")
def _uids(data, name):
    with _saved_config():
        prefix = data.draw(st.sampled_from(["", "dense", "x/y", "é"]), label="prefix")
        n = data.draw(st.integers(1, 5), label="n")
        K.reset_uids()
        got = [K.get_uid(prefix) for _ in range(n)]
        assert got == list(range(1, n + 1))
        v = K.variable(np.arange(3.0))
        (K.clear_session if name == "clear_session" else K.reset_uids)()
        assert K.get_uid(prefix) == 1
        np.testing.assert_array_equal(K.get_value(v), np.arange(3.0))  # still valid


# -- families still landing (stubs today): drivers run once the stub is replaced ------------------


def _conv_out(n, k, s, d, padding):
    eff = (k - 1) * d + 1
    if padding == "valid":
        return max(0, (n - eff) // s + 1) if n >= eff else 0
    return -(-n // s)


def _np_conv(x, w, strides, padding, dilation, data_format):
    """N-d cross-correlation (TF conv) in either data format: `ref_conv` on channels-last."""
    cf = data_format == "channels_first"
    y = ref_conv(np.moveaxis(x, 1, -1) if cf else x, w, strides, dilation, padding)
    return np.moveaxis(y, -1, 1) if cf else y


@driver("conv1d", "conv2d", "conv3d")
def _conv(data, name):
    nd = {"conv1d": 1, "conv2d": 2, "conv3d": 3}[name]
    B, Ci, Co = (
        data.draw(st.integers(0 if n == "B" else 1, 2), label=n) for n in ("B", "Ci", "Co")
    )
    sp = tuple(data.draw(st.integers(0, 5), label="sp") for _ in range(nd))
    ks = tuple(data.draw(st.integers(1, 3), label="k") for _ in range(nd))
    s = data.draw(st.integers(1, 2), label="stride")
    d = data.draw(st.integers(1, 2), label="dilation") if s == 1 else 1
    padding = data.draw(
        st.sampled_from(
            ["valid", "same", "causal", "full"] if nd == 1 else ["valid", "same", "bogus"]
        ),
        label="padding",
    )
    fmt = data.draw(st.sampled_from(["channels_last", "channels_first"]), label="fmt")
    x = make_array(
        data,
        (B, Ci) + sp if fmt == "channels_first" else (B,) + sp + (Ci,),
        "float32",
        kind="finite",
    )
    wci = Ci if data.draw(st.integers(0, 4), label="match") else Ci + 1
    w = make_array(data, ks + (wci, Co), "float32", kind="finite", label="w")
    args = dict(
        strides=s if nd == 1 else (s,) * nd,
        padding=padding,
        data_format=fmt,
        dilation_rate=d if nd == 1 else (d,) * nd,
    )

    def ref():
        if padding not in ("valid", "same", "causal") or wci != Ci:
            raise ValueError("bad")
        out = [
            _conv_out(n, k, s, d, padding if padding != "causal" else "same")
            for n, k in zip(sp, ks)
        ]
        if min(out, default=1) <= 0 and padding == "valid":
            raise ValueError("kernel larger than input")
        return rounded(_np_conv(f64(x), f64(w), (s,) * nd, padding, (d,) * nd, fmt), np.float32)

    # an empty spatial axis may also be rejected (causal padding of an empty sequence)
    check(
        data,
        lambda t, u: getattr(K, name)(t, u, **args),
        [x, w],
        ref,
        dtype=np.float32,
        rtol=1e-4,
        atol=1e-4,
        modes=("feed", "const"),
        valid=0 not in sp,
    )


def _np_pool(x, pool, strides, padding, mode, data_format):
    """Max or average pooling in either data format: `ref_pool` on channels-last."""
    cf = data_format == "channels_first"
    y = ref_pool(np.moveaxis(x, 1, -1) if cf else x, pool, strides, padding, mode)
    return np.moveaxis(y, -1, 1) if cf else y


@driver("pool2d", "pool3d")
def _pool(data, name):
    nd = 2 if name == "pool2d" else 3
    B, C = data.draw(st.integers(0, 2), label="B"), data.draw(st.integers(1, 2), label="C")
    sp = tuple(data.draw(st.integers(1, 5), label="sp") for _ in range(nd))
    pool = tuple(data.draw(st.integers(1, 3), label="pool") for _ in range(nd))
    strides = tuple(data.draw(st.integers(1, 3), label="s") for _ in range(nd))
    padding = data.draw(st.sampled_from(["valid", "same", "bogus"]), label="padding")
    mode = data.draw(st.sampled_from(["max", "avg", "median"]), label="mode")
    fmt = data.draw(st.sampled_from(["channels_last", "channels_first"]), label="fmt")
    x = make_array(
        data, (B, C) + sp if fmt == "channels_first" else (B,) + sp + (C,), "float32", kind="finite"
    )

    def ref():
        if padding == "bogus" or mode == "median":
            raise ValueError("bad")
        if padding == "valid" and any(n < k for n, k in zip(sp, pool)):
            raise ValueError("window larger than input")
        return rounded(_np_pool(f64(x), pool, strides, padding, mode, fmt), np.float32)

    check(
        data,
        lambda t: getattr(K, name)(t, pool, strides, padding, fmt, mode),
        [x],
        ref,
        dtype=np.float32,
        rtol=1e-5,
        atol=1e-5,
        modes=("feed", "const"),
    )


def _contract_only(call):
    """Drivers for functions without a NumPy reference here yet: the call must return
    arrays of finite or NaN floats or raise a ValueError/TypeError/IndexError."""
    out = attempt(call)
    if not isinstance(out, Exception):
        for o in _listify(out):
            o = np.asarray(o)
            assert o.dtype.kind in "fiub", o.dtype
    return out


@driver(
    "depthwise_conv2d",
    "separable_conv2d",
    "conv2d_transpose",
    "conv3d_transpose",
    "local_conv1d",
    "local_conv2d",
)
def _conv_other(data, name):
    B, C = data.draw(st.integers(0, 2), label="B"), data.draw(st.integers(1, 2), label="C")
    H, W = data.draw(st.integers(0, 4), label="H"), data.draw(st.integers(0, 4), label="W")
    k = data.draw(st.integers(1, 3), label="k")
    padding = data.draw(st.sampled_from(["valid", "same", "bogus"]), label="padding")
    x4 = make_array(data, (B, H, W, C), "float32", kind="finite")
    if name == "depthwise_conv2d":
        # finite weights: whether a padded zero times an infinite weight is NaN is not specified
        w = make_array(data, (k, k, C, 2), "float32", kind="finite", label="w")
        out = _contract_only(
            lambda: K.eval(K.depthwise_conv2d(K.constant(x4), K.constant(w), padding=padding))
        )
        if not isinstance(out, Exception):
            ref = np.concatenate(
                [
                    _np_conv(
                        f64(x4)[..., c : c + 1],
                        f64(w)[:, :, c : c + 1, :],
                        (1, 1),
                        padding,
                        (1, 1),
                        "channels_last",
                    )
                    for c in range(C)
                ],
                axis=-1,
            )
            assert_matches(out, rounded(ref, np.float32), rtol=1e-4, atol=1e-4)
    elif name == "separable_conv2d":
        dw = make_array(data, (k, k, C, 1), "float32", label="dw")
        pw = make_array(data, (1, 1, C, 3), "float32", label="pw")
        _contract_only(
            lambda: K.eval(
                K.separable_conv2d(K.constant(x4), K.constant(dw), K.constant(pw), padding=padding)
            )
        )
    elif name == "conv2d_transpose":
        w = make_array(data, (k, k, 2, C), "float32", label="w")
        s = data.draw(st.integers(1, 2), label="s")
        os_ = (
            (B, H * s, W * s, 2) if padding == "same" else (B, (H - 1) * s + k, (W - 1) * s + k, 2)
        )
        out = _contract_only(
            lambda: K.eval(K.conv2d_transpose(K.constant(x4), K.constant(w), os_, (s, s), padding))
        )
        if not isinstance(out, Exception):
            assert out.shape == os_, out.shape
    elif name == "conv3d_transpose":
        x5 = make_array(data, (B, H, W, 2, C), "float32", kind="finite", label="x5")
        w = make_array(data, (k, k, k, 2, C), "float32", label="w")
        os_ = (B, H, W, 2, 2) if padding == "same" else (B, H + k - 1, W + k - 1, 2 + k - 1, 2)
        out = _contract_only(
            lambda: K.eval(K.conv3d_transpose(K.constant(x5), K.constant(w), os_, padding=padding))
        )
        if not isinstance(out, Exception):
            assert out.shape == os_, out.shape
    elif name == "local_conv1d":
        x3 = make_array(data, (B, H, C), "float32", kind="finite", label="x3")
        Ho = max(H - k + 1, 0)
        w = make_array(data, (Ho, k * C, 2), "float32", label="w")
        _contract_only(lambda: K.eval(K.local_conv1d(K.constant(x3), K.constant(w), (k,), (1,))))
    else:
        Ho, Wo = max(H - k + 1, 0), max(W - k + 1, 0)
        w = make_array(data, (Ho * Wo, k * k * C, 2), "float32", label="w")
        _contract_only(
            lambda: K.eval(K.local_conv2d(K.constant(x4), K.constant(w), (k, k), (1, 1), (Ho, Wo)))
        )


@driver("ctc_batch_cost", "ctc_decode", "ctc_label_dense_to_sparse")
def _ctc(data, name):
    B, T, C = (data.draw(st.integers(0 if n == "B" else 1, 4), label=n) for n in "BTC")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    y_pred = _probs(data, (B, T, C), "float32", "y_pred")
    L = data.draw(st.integers(0, 3), label="L")
    labels = rng.integers(0, max(C - 1, 1), size=(B, L)).astype("int32")
    in_len = rng.integers(0, T + 2, size=(B, 1)).astype("int32")
    lab_len = rng.integers(0, L + 2, size=(B, 1)).astype("int32")
    if name == "ctc_batch_cost":
        out = _contract_only(
            lambda: K.eval(
                K.ctc_batch_cost(
                    K.constant(labels, dtype="int32"),
                    K.constant(y_pred),
                    K.constant(in_len, dtype="int32"),
                    K.constant(lab_len, dtype="int32"),
                )
            )
        )
        if not isinstance(out, Exception):
            assert out.shape == (B, 1), out.shape
    elif name == "ctc_decode":
        greedy = data.draw(st.booleans(), label="greedy")
        _contract_only(
            lambda: [
                K.eval(t)
                for t in _listify(K.ctc_decode(K.constant(y_pred), in_len[:, 0], greedy=greedy)[0])
            ]
        )
    else:
        _contract_only(
            lambda: K.eval(
                K.to_dense(
                    K.ctc_label_dense_to_sparse(
                        K.constant(labels, dtype="int32"), K.constant(lab_len[:, 0], dtype="int32")
                    )
                )
            )
        )


@driver("get_session", "set_session")
def _session(data, name):
    if name == "get_session":
        attempt(K.get_session)
    else:
        attempt(
            lambda: K.set_session(data.draw(st.sampled_from([None, object()]), label="session"))
        )


# ---- the test ----------------------------------------------------------------------------------

NAMES = [name for name, _ in ROWS]


@contextlib.contextmanager
def _watchdog(seconds):
    """Dumps every thread's stack and exits if the body hangs (a hang fails loudly instead
    of stalling CI)."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_every_api_name_has_a_driver():
    missing = sorted(set(NAMES) - set(DRIVERS))
    assert not missing, f"no fuzz driver for {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_fuzz(name):
    fn = getattr(K, name, None)
    assert fn is not None, f"ferrokeras.backend has no {name}"
    drive = DRIVERS[name]

    @FUZZ
    @given(data=st.data())
    def run(data):
        drive(data, name)

    with _watchdog(HANG_S):
        run()


# ---- regressions, and known open bugs (strict xfail: remove the marker when fixed) --------------


def test_max_of_an_empty_integer_axis_is_the_dtype_identity():
    """Fixed in src/ops/reduce.rs: the i64 identity (i64::MIN) wrapped on the cast back, so
    K.max over an empty int8 axis was 0 and K.any of an empty tensor True."""
    z = np.zeros((0, 2), dtype=np.int8)
    assert K.eval(K.any(K.constant(np.zeros((0,))))) == np.False_
    np.testing.assert_array_equal(K.eval(K.max(K.constant(z, dtype="int8"), axis=0)), [-128, -128])
    np.testing.assert_array_equal(K.eval(K.min(K.constant(z, dtype="int8"), axis=0)), [127, 127])
    assert K.eval(K.max(K.constant(np.zeros((0,), bool), dtype="bool"))) == np.False_


def test_sparse_crossentropy_target_count_is_checked_at_run_time():
    """Fixed in _k/nn.py: the targets are reshaped to the row count, so a count known only
    at run time raises there instead of broadcasting."""
    t = K.placeholder(shape=(None,), dtype="int32")
    o = K.placeholder(shape=(None, 2))
    f = K.function([t, o], [K.sparse_categorical_crossentropy(t, o)])
    with pytest.raises(ValueError):
        f([np.array([0, 1], dtype=np.int32), np.full((1, 2), 0.5, dtype=np.float32)])


def test_same_conv_of_an_empty_spatial_axis_is_empty():
    """Fixed in src/ops/conv/mod.rs: 'same' over an empty axis gave size 1 (TF: ceil(0 / s) = 0)."""
    x = K.constant(np.zeros((1, 0, 0, 1), np.float32))
    w = K.constant(np.ones((2, 2, 1, 1), np.float32))
    assert K.eval(K.conv2d(x, w, padding="same")).shape == (1, 0, 0, 1)
    x1 = K.constant(np.zeros((1, 0, 1), np.float32))
    assert K.eval(
        K.conv1d(x1, K.constant(np.ones((2, 1, 1), np.float32)), padding="same")
    ).shape == (1, 0, 1)
