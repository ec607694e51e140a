"""CPU elementwise fusion: fused functions give the same results as unfused ones.

`FERROKERAS_CPU_FUSION=0` turns fusion off. The core reads it once per process, so the
`unfused` fixture runs this module once more in a child process with fusion off, which
saves every result it computes; each test here then compares its fused results with the
child's. The per-element code is shared, so float32 results are bitwise equal; NumPy is
the reference where a test says so (in both processes). On a GPU device the functions run
there and the comparison still holds; launch counts are only checked on the CPU.
"""

import itertools
import os
import re
import types

import ferrokeras
import numpy as np
import pytest
from env_child import env_is, pytest_in_child
from ferrokeras import backend as K
from reference import np_nbt_grad

FUSED = not env_is("FERROKERAS_CPU_FUSION", "0")
# Where the child run with fusion off saves its results.
SAVE_TO = os.environ.get("UNFUSED_RESULTS_DIR")


def on_cpu():
    return ferrokeras.device() == "cpu"


def launches_checked():
    """Launch counts are checked on the CPU, in the fused run (which has both counts)."""
    return on_cpu() and FUSED


@pytest.fixture(scope="module")
def unfused(tmp_path_factory):
    """The directory of every `both` result of this module with CPU fusion off, from one
    child run of the module; None in that child."""
    if not FUSED:
        return None
    out = tmp_path_factory.mktemp("unfused")
    pytest_in_child({"FERROKERAS_CPU_FUSION": "0", "UNFUSED_RESULTS_DIR": str(out)}, __file__)
    return out


@pytest.fixture
def both(request, unfused):
    """`both(build, feeds)` compiles `build()` -> (inputs, outputs) and runs it on `feeds`;
    returns the results and the launch counts of the fused and the unfused function (each
    with a `dispatches` attribute), having checked that the unfused run (the child's)
    gave the same results."""
    calls = itertools.count()

    def run(build, feeds):
        ins, outs = build()
        f = K.function(ins, outs)
        res = f(list(feeds))
        key = re.sub(r"[^\w.-]", "_", f"{request.node.name}-{next(calls)}") + ".npz"
        if not FUSED:
            if SAVE_TO:
                arrays = {f"r{i}": np.asarray(r) for i, r in enumerate(res)}
                np.savez(os.path.join(SAVE_TO, key), dispatches=f.dispatches, **arrays)
            counts = types.SimpleNamespace(dispatches=f.dispatches)
            return res, (counts, counts)
        with np.load(unfused / key) as saved:
            other = [saved[f"r{i}"] for i in range(len(saved.files) - 1)]
            other_dispatches = int(saved["dispatches"])
        assert len(other) == len(res)
        for a, b in zip(res, other):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
        return res, (
            types.SimpleNamespace(dispatches=f.dispatches),
            types.SimpleNamespace(dispatches=other_dispatches),
        )

    return run


def specials(rng, shape):
    x = rng.uniform(-4, 4, size=shape).astype("float32")
    flat = x.reshape(-1)
    vals = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 100.0, -100.0], "float32")
    if flat.size:
        idx = rng.integers(0, flat.size, size=min(flat.size, 16))
        flat[idx] = vals[np.arange(idx.size) % vals.size]
    return x


def test_rmsprop_chain_is_one_pass(both, rng):
    shape = (784, 512)
    feeds = [np.abs(rng.standard_normal(shape)).astype("float32") for _ in range(3)]

    def build():
        p, g, acc = (K.placeholder(shape=shape) for _ in range(3))
        new_acc = 0.9 * acc + 0.1 * K.square(g)
        new_p = p - 0.001 * g / (K.sqrt(new_acc) + 1e-7)
        return [p, g, acc], [new_p, new_acc]

    (new_p, new_acc), (fused, unfused) = both(build, feeds)
    p, g, acc = (x.astype("float64") for x in feeds)
    ref_acc = 0.9 * acc + 0.1 * g * g
    np.testing.assert_allclose(new_acc, ref_acc, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        new_p, p - 0.001 * g / (np.sqrt(ref_acc) + 1e-7), rtol=1e-5, atol=1e-6
    )
    if launches_checked():
        assert fused.dispatches == 1 and unfused.dispatches > 5, (
            fused.dispatches,
            unfused.dispatches,
        )


@pytest.mark.parametrize("bshape", [(6,), (1, 6), (4, 1, 6), (4, 5, 1), (1, 5, 1), (), (4, 5, 6)])
def test_broadcast_patterns(both, rng, bshape):
    x = specials(rng, (4, 5, 6))
    b = rng.uniform(-2, 2, size=bshape).astype("float32")

    def build():
        xp, bp = K.placeholder(shape=x.shape), K.placeholder(shape=bshape)
        h = K.tanh(xp * bp + 0.5)
        return [xp, bp], [K.relu(h) - K.sigmoid(bp), h > 0]

    (y, m), (fused, _) = both(build, [x, b])
    h = np.tanh(x.astype("float64") * b + 0.5)
    ref = np.maximum(h, 0) - 1 / (1 + np.exp(-b.astype("float64")))
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(m, h > 0)
    if launches_checked():
        assert fused.dispatches <= 2


def test_nan_inf_and_transcendentals_match_numpy(both, rng):
    x = specials(rng, (3000,))
    x[:8] = [np.nan, np.inf, -np.inf, 0.0, 89.0, -104.0, 1e-42, -1e-42]
    fns = {
        "exp": (K.exp, np.exp),
        "log": (K.log, np.log),
        "tanh": (K.tanh, np.tanh),
        "sigmoid": (K.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
        "softplus": (K.softplus, lambda v: np.logaddexp(0, v)),
        # 1 + t rounds to float32 first, as in the graph.
        "log(1+x)": (
            lambda t: K.log(1 + t),
            lambda v: np.log((1 + v.astype("float32")).astype("float64")),
        ),
    }
    with np.errstate(all="ignore"):
        for name, (kf, nf) in fns.items():

            def build(kf=kf):
                p = K.placeholder(shape=x.shape)
                return [p], [kf(p)]

            (y,), _ = both(build, [x])
            ref = nf(x.astype("float64")).astype("float32")
            if on_cpu():
                np.testing.assert_allclose(y, ref, rtol=3e-7 * 4, atol=1e-37, err_msg=name)
            else:
                # WGSL allows log an absolute error of 2^-21 near 1 and lets a device
                # flush subnormal inputs to zero: those are left out on a GPU.
                normal = ~((x != 0) & (np.abs(x) < np.finfo(np.float32).tiny))
                np.testing.assert_allclose(
                    y[normal], ref[normal], rtol=1e-5, atol=2e-6, err_msg=name
                )


def test_zero_size_and_rank_0(both):
    for shape in [(0, 5), (3, 0), ()]:
        x = np.full(shape, 0.75, "float32")

        def build():
            p = K.placeholder(shape=shape)
            return [p], [K.exp(p) * 2 + 1, K.equal(p, 0.75)]

        (y, m), _ = both(build, [x])
        assert y.shape == shape and m.shape == shape
        np.testing.assert_allclose(y, np.exp(x) * 2 + 1, rtol=1e-6)


def test_fused_group_feeding_a_loop(both, rng):
    x = rng.standard_normal((3, 7, 4)).astype("float32")
    w = rng.standard_normal((4, 4)).astype("float32")

    def build():
        xp, wp = K.placeholder(shape=x.shape), K.placeholder(shape=w.shape)
        seq = K.tanh(xp * 0.5 + 0.1)  # a fused group whose result the loop reads

        def step(inp, states):
            h = K.sigmoid(K.dot(inp, wp) + states[0] * 0.5)
            return h, [h]

        last, outs, _ = K.rnn(step, seq, [K.zeros_like(seq[:, 0, :])])
        loss = K.sum(outs * outs)
        return [xp, wp], [last, outs, K.gradients(loss, [wp])[0]]

    (last, outs, gw), _ = both(build, [x, w])
    h = np.zeros((3, 4))
    seq = np.tanh(x.astype("float64") * 0.5 + 0.1)
    for t in range(7):
        h = 1 / (1 + np.exp(-(seq[:, t] @ w + h * 0.5)))
        np.testing.assert_allclose(outs[:, t], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(last, h, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(gw))


def test_gradients_unchanged(both, rng):
    x = rng.standard_normal((32, 16)).astype("float32")
    w = rng.standard_normal((16, 8)).astype("float32")

    def build():
        xp, wp = K.placeholder(shape=x.shape), K.placeholder(shape=w.shape)
        h = K.relu(K.dot(xp, wp) + 0.1)
        y = K.sum(K.tanh(h) * K.sigmoid(h) + K.square(K.maximum(h, 0.5)))
        return [xp, wp], K.gradients(y, [xp, wp])

    (gx, gw), (fused, unfused) = both(build, [x, w])
    # Against float64 NumPy.
    z = x.astype("float64") @ w + 0.1
    h = np.maximum(z, 0)
    s = 1 / (1 + np.exp(-h))
    t = np.tanh(h)
    dh = (1 - t * t) * s + t * s * (1 - s) + 2 * np.maximum(h, 0.5) * (h >= 0.5)
    dz = dh * (z > 0)
    np.testing.assert_allclose(gw, x.T.astype("float64") @ dz, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gx, dz @ w.T, rtol=1e-4, atol=1e-4)
    if launches_checked():
        assert fused.dispatches < unfused.dispatches


@pytest.mark.parametrize("dtype", ["float64", "float16", "int32"])
def test_other_dtypes_unchanged(both, rng, dtype):
    x = (rng.uniform(-3, 3, size=(5, 6)) * (10 if dtype == "int32" else 1)).astype(dtype)

    def build():
        p = K.placeholder(shape=x.shape, dtype=dtype)
        return [p], [K.maximum(p * 2 - 1, K.zeros_like(p))]

    (y,), _ = both(build, [x])
    np.testing.assert_allclose(
        y.astype("float64"), np.maximum(x.astype("float64") * 2 - 1, 0), rtol=1e-3
    )


def check_batch_norm_gradients(got, x, gamma, eps, g):
    """`got` = (dx, dgamma, dbeta) of batch norm over every axis but the last, against float64
    NumPy given the normalised output's gradient `g` (the folded sums are not bitwise those
    of the unfused reductions)."""
    ref, dg, db = np_nbt_grad(x.astype("float64"), gamma, [0, 1, 2], eps, g)
    np.testing.assert_allclose(got[2], db, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[1], dg, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[0], ref, rtol=1e-3, atol=1e-5)


def fused_groups(path):
    """The members of every fused group a `ferrokeras.profile` trace recorded."""
    import json

    events = json.load(open(path))["traceEvents"]
    return [e["args"]["members"] for e in events if e.get("cat") == "fused"]


@pytest.mark.parametrize("batch", [None, 2], ids=["unknown_batch", "static"])
def test_batch_norm_input_gradient_is_one_pass_after_the_sums(batch, rng, tmp_path):
    """Batch norm in training with relu, gradients of the input, gamma and beta: the sums
    (beta's, gamma's, the mean's) come from one pass over the incoming gradient, and the
    input gradient is one elementwise pass after it, as a Keras model builds it (unknown
    batch) and at a static shape; results as float64 NumPy's."""
    shape, eps = (2, 16, 16, 64), 1e-3
    x = (rng.standard_normal(shape) * 2 + 0.5).astype("float32")
    gy = rng.standard_normal(shape).astype("float32")
    gamma = rng.uniform(0.5, 1.5, shape[-1]).astype("float32")
    beta = rng.uniform(-0.5, 0.5, shape[-1]).astype("float32")
    xp = K.placeholder(shape=(batch,) + shape[1:])
    gp = K.placeholder(shape=(batch,) + shape[1:])
    g, b = K.variable(gamma), K.variable(beta)
    y = K.relu(K.normalize_batch_in_training(xp, g, b, [0, 1, 2], epsilon=eps)[0])
    f = K.function([xp, gp], K.gradients(K.sum(y * gp), [xp, g, b]))
    for _ in range(2):  # the generic plan, recording shapes; then the specialised one
        f([x, gy])
    path = str(tmp_path / "trace.json")
    with ferrokeras.profile(path):
        grads = f([x, gy])
    x64 = x.astype("float64")
    c = x64 - x64.mean(axis=(0, 1, 2))
    r = 1 / np.sqrt((c * c).mean(axis=(0, 1, 2)) + eps)
    check_batch_norm_gradients(grads, x, gamma, eps, np.where(c * r * gamma + beta > 0, gy, 0))
    if launches_checked():
        summing = [m for m in fused_groups(path) if "sum_to" in m]
        assert len(summing) == 1, summing


def test_batch_norm_relu6_gradient_recomputes_what_it_reads(rng, tmp_path):
    """Batch norm in training, relu6 and a 1x1 convolution, with the gradients, at 2**19
    elements an activation: the relu6 gradient's group computes the normalised output and
    its relu again from the centred input instead of reading them back
    (`compile::fuse::recompute`); results as float64 NumPy's (the folded sums are not
    bitwise those of the unfused reductions)."""
    shape, eps = (2, 32, 32, 256), 1e-3
    x = (rng.standard_normal(shape) * 2 + 0.5).astype("float32")
    gz = rng.standard_normal(shape[:-1] + (8,)).astype("float32")
    gamma = rng.uniform(0.5, 1.5, shape[-1]).astype("float32")
    beta = rng.uniform(-0.5, 0.5, shape[-1]).astype("float32")
    w = (rng.standard_normal((1, 1, shape[-1], 8)) / 16).astype("float32")

    def build():
        xp, gp = K.placeholder(shape=shape), K.placeholder(shape=gz.shape)
        g, b, k = K.variable(gamma), K.variable(beta), K.variable(w)
        normed, _, _ = K.normalize_batch_in_training(xp, g, b, [0, 1, 2], epsilon=eps)
        z = K.conv2d(K.relu(normed, max_value=6.0), k)
        return [xp, gp], [z] + K.gradients(K.sum(z * gp), [xp, g, b])

    path = str(tmp_path / "trace.json")
    ins, outs = build()
    f = K.function(ins, outs)
    with ferrokeras.profile(path):
        z, *grads = f([x, gz])
    x64 = x.astype("float64")
    c = x64 - x64.mean(axis=(0, 1, 2))
    r = 1 / np.sqrt((c * c).mean(axis=(0, 1, 2)) + eps)
    pre = c * r * gamma + beta
    y = np.clip(pre, 0, 6)
    np.testing.assert_allclose(z, y @ w[0, 0], rtol=1e-4, atol=1e-4)
    gy = gz @ w[0, 0].T
    check_batch_norm_gradients(grads, x, gamma, eps, np.where((pre > 0) & (pre < 6), gy, 0))
    if launches_checked():
        groups = fused_groups(path)
        assert any("greater" in m and "relu" in m and "add" in m for m in groups), groups


@pytest.mark.parametrize("shape", [(2, 3, 4, 7), (3, 50, 50, 7)], ids=["below_a_chunk", "chunks"])
def test_per_channel_members_match_unfused(both, rng, shape):
    """Members whose operands are per-channel values and single values only (a mean's
    gradient broadcast and divided by the count, as batch norm's input gradient has them)
    are computed once a call over one period in the fused kernel: results bitwise those of
    the unfused ops, zeros and infinities included, next to a value that repeats with a
    different period, below one chunk of elements and over several."""
    x = specials(rng, shape)
    gamma = rng.uniform(-2, 2, shape[-1]).astype("float32")
    gamma[0] = 0.0
    rows = rng.uniform(-1, 1, shape[-2:]).astype("float32")
    axes = [0, 1, 2]

    def build():
        xp, gp, rp = (
            K.placeholder(shape=(None,) + shape[1:]),
            K.placeholder(shape=gamma.shape),
            K.placeholder(shape=rows.shape),
        )
        loss = K.sum(K.mean(K.square(xp - rp), axis=axes) / gp) + K.sum(K.mean(xp, axis=axes))
        return [xp, gp, rp], K.gradients(loss, [xp])

    (gx,), (fused, _) = both(build, [x, gamma, rows])
    count = np.prod(shape[:3])
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = 2 * (x.astype("float64") - rows) / gamma / count + 1.0 / count
    np.testing.assert_allclose(gx, ref, rtol=1e-5, atol=1e-7)


def test_sums_of_one_member_over_the_same_axes(rng, tmp_path):
    """A member summed three times over the same axes in one fused pass (a `sum`, a `mean`
    and a `sum` keeping dims of one product, as batch norm's gradient sums one value for
    beta and for the mean), the sums taken once; each result as float64 NumPy's."""
    shape = (4, 16, 16, 32)
    x = rng.standard_normal(shape).astype("float32")
    w = rng.uniform(0.5, 1.5, shape).astype("float32")
    xp, wp = K.placeholder(shape=(None,) + shape[1:]), K.placeholder(shape=(None,) + shape[1:])
    y = xp * wp
    outs = [
        K.sum(y, axis=[0, 1, 2]),
        K.sum(K.square(y), axis=[0, 1, 2]),
        K.mean(y, axis=[0, 1, 2], keepdims=True),
        K.sum(y, axis=[0, 1, 2], keepdims=True),
    ]
    f = K.function([xp, wp], outs)
    for _ in range(2):  # the generic plan, then the plan specialised to the shapes
        f([x, w])
    path = str(tmp_path / "trace.json")
    with ferrokeras.profile(path):
        got = f([x, w])
    y64 = x.astype("float64") * w
    np.testing.assert_allclose(got[0], y64.sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[1], (y64 * y64).sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[2], y64.mean(axis=(0, 1, 2), keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(got[3], y64.sum(axis=(0, 1, 2), keepdims=True), rtol=1e-5)
    if launches_checked():
        assert any(m.count("sum") + m.count("mean") == 3 for m in fused_groups(path)), fused_groups(
            path
        )
