"""Shared fixtures and helpers for the ferrokeras test suite.

The suite runs on whatever device ``FERROKERAS_DEVICE`` selects (``make test`` runs it
once per available device), so no test is parametrised over devices.

References are NumPy (CONTRIBUTING.md, "How the code reads"): every forward result is compared with a NumPy
computation and every gradient with central finite differences of the forward function,
evaluated in float64.
"""

import sys
from pathlib import Path

import ferrokeras
import numpy as np
import pytest
from ferrokeras import backend as K

_THIS_MODULE = sys.modules[__name__]
_TESTS_DIR = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collectstart(collector):
    # The test modules in this folder import their helpers with `from conftest import ...`.
    # A conftest.py in a subfolder (tests/keras/) is imported under the same top-level
    # name `conftest` and replaces this one in sys.modules; point the name back at this
    # file just before a module of this folder is imported. (Pytest itself removes
    # `conftest` from sys.modules before it imports any further conftest.py.)
    path = getattr(collector, "path", None)
    if (
        isinstance(collector, pytest.Module)
        and path is not None
        and Path(path).resolve().parent == _TESTS_DIR
    ):
        sys.modules["conftest"] = _THIS_MODULE


def pytest_report_header(config):
    device = getattr(ferrokeras, "device", None)
    if device is None:
        return "ferrokeras device: (ferrokeras.device() not available)"
    try:
        name = device()
        info = [d for d in ferrokeras.devices() if d["device"] == name]
        if info and name != "cpu":
            name = "{} ({}, {}, {})".format(
                name, info[0]["name"], info[0]["backend"], info[0]["type"]
            )
        return f"ferrokeras device: {name}"
    except Exception as exc:  # the header must never break collection
        return f"ferrokeras device: <error: {exc!r}>"


@pytest.fixture
def rng():
    """A seeded NumPy Generator, fresh for every test."""
    return np.random.default_rng(20240521)


@pytest.fixture(autouse=True, scope="session")
def _no_leaked_feeds():
    """No test of the suite leaves a feed read in place held past its call
    (`_core.leased_feeds`, test_feeds_in_place.py)."""
    yield
    from ferrokeras import _core

    leased, leaked = _core.leased_feeds()
    assert leaked == 0, (
        f"{leaked} of {leased} feeds read in place were still held when their call ended"
    )


@pytest.fixture(autouse=True)
def _restore_config():
    """Put the global backend configuration back after every test."""
    saved = (K.floatx(), K.epsilon(), K.image_data_format())
    yield
    K.set_floatx(saved[0])
    K.set_epsilon(saved[1])
    K.set_image_data_format(saved[2])


def tolerances(dtype, rtol32=1e-5, atol32=1e-6, rtol64=1e-12, atol64=1e-12):
    """(rtol, atol) for a result of `dtype`."""
    if np.dtype(dtype) == np.float64:
        return rtol64, atol64
    return rtol32, atol32


def run(inputs, outputs, feeds):
    """Compile `K.function(inputs, outputs)` and call it once on `feeds`."""
    return K.function(list(inputs), list(outputs))(list(feeds))


def numeric_grad(f, arrays, index, eps):
    """Central finite differences of the scalar `f(arrays)` w.r.t. `arrays[index]`."""
    base = [np.array(a, dtype=np.float64, copy=True) for a in arrays]
    target = base[index]
    grad = np.zeros_like(target)
    flat = target.reshape(-1)
    gflat = grad.reshape(-1)
    for i in range(flat.size):
        orig = flat[i]
        flat[i] = orig + eps
        plus = f(base)
        flat[i] = orig - eps
        minus = f(base)
        flat[i] = orig
        gflat[i] = (plus - minus) / (2.0 * eps)
    return grad


def check_grad(fn, arrays, wrt=None, eps=1e-3, rtol=1e-4, atol=1e-6, seed=0):
    """Check K.gradients of `fn` against central finite differences, in float64.

    `fn` takes K tensors (one per array) and returns one K tensor. The scalar that is
    differentiated is ``K.sum(fn(*xs) * P)`` for a fixed random projection P, so every
    element of the output contributes with a distinct weight.
    Returns the analytic gradients (list of arrays, one per index in `wrt`).
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    if wrt is None:
        wrt = list(range(len(arrays)))
    phs = [K.placeholder(shape=a.shape, dtype="float64") for a in arrays]
    out = fn(*phs)
    forward = K.function(phs, [out])
    out_val = np.asarray(forward(arrays)[0])
    assert out_val.dtype == np.float64, f"forward of a float64 input gave {out_val.dtype}"

    proj = np.random.default_rng(seed).uniform(0.5, 1.5, size=out_val.shape)
    loss = K.sum(out * K.constant(proj, dtype="float64"))
    grads = K.gradients(loss, [phs[i] for i in wrt])
    assert len(grads) == len(wrt)
    for i, g in zip(wrt, grads):
        assert g is not None, "gradient w.r.t. input %d is None" % i
    analytic = K.function(phs, list(grads))(arrays)

    def scalar(vals):
        return float(np.sum(np.asarray(forward(vals)[0], dtype=np.float64) * proj))

    for i, g in zip(wrt, analytic):
        g = np.asarray(g)
        assert g.shape == arrays[i].shape, (g.shape, arrays[i].shape)
        num = numeric_grad(scalar, arrays, i, eps)
        np.testing.assert_allclose(
            g,
            num,
            rtol=rtol,
            atol=atol,
            err_msg="analytic vs finite-difference gradient w.r.t. input %d" % i,
        )
    return analytic


def assert_mentions(excinfo, *words):
    """The exception message mentions at least one of `words` (case-insensitive)."""
    msg = str(excinfo.value).lower()
    assert any(w.lower() in msg for w in words), (
        f"message {str(excinfo.value)!r} mentions none of {words!r}"
    )
