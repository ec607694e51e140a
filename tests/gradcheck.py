"""Helpers of the test suite: running a K function once, tolerances, and the gradient check.

References are NumPy (CONTRIBUTING.md, "How the code reads"): every forward result is compared
with a NumPy computation (``reference.py``) and every gradient with central finite differences of
the forward function, evaluated in float64 (``check_grad``).
"""

import numpy as np
from ferrokeras import backend as K


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
