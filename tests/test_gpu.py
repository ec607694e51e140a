"""GPU-specific behaviour: device selection, fusion (dispatch counts), one submit per
call, resident variables, the CPU fallback for dtypes WGSL lacks, Philox equality between
devices, and device errors as Python exceptions.

Every test here switches to a GPU explicitly (and back afterwards), so the file runs the
same in the cpu and the gpu pass of `make test`. Without any GPU adapter the tests are
skipped, unless FERROKERAS_REQUIRE_GPU=1 (CI), which makes the absence a failure.
References are NumPy.
"""

import os
import subprocess
import sys

import ferrokeras
import numpy as np
import pytest
from ferrokeras import _core
from ferrokeras import backend as K
from ferrokeras.tensor import wrap

GPUS = [d for d in ferrokeras.devices() if d["device"] != "cpu"]
REQUIRE = os.environ.get("FERROKERAS_REQUIRE_GPU", "") not in ("", "0")


def test_device_listing():
    devs = ferrokeras.devices()
    assert devs[0]["device"] == "cpu" and devs[0]["backend"] == "host"
    for d in devs[1:]:
        assert d["device"].startswith("gpu:")
        assert d["backend"] in ("Vulkan", "Metal", "Dx12", "Gl")
        assert d["type"] in ("cpu", "discrete", "integrated", "virtual", "other")
        assert isinstance(d["name"], str) and d["name"]
    if REQUIRE:
        assert GPUS, "FERROKERAS_REQUIRE_GPU=1 but wgpu found no GPU adapter"


def test_current_device_name():
    name = ferrokeras.device()
    assert name == "cpu" or name.startswith("gpu:")
    if os.environ.get("FERROKERAS_DEVICE", "").startswith("gpu") and REQUIRE:
        assert name.startswith("gpu:")


def test_bad_device_names():
    before = ferrokeras.device()
    with pytest.raises(ValueError, match="gpu:N"):
        ferrokeras.set_device("tpu")
    with pytest.raises(ferrokeras.DeviceError):
        ferrokeras.set_device("gpu:99")
    assert ferrokeras.device() == before
    assert issubclass(ferrokeras.DeviceError, RuntimeError)


def test_fused_chain_is_one_dispatch(gpu, rng):
    x = K.placeholder(shape=(None, 6))
    w = K.variable(rng.standard_normal((6, 5)).astype("float32"))
    b = K.variable(rng.standard_normal(5).astype("float32"))
    y = _relu(K.dot(x, w) + b) * 2.0
    f = K.function([x], [y])
    xv = rng.standard_normal((7, 6)).astype("float32")
    out = f([xv])[0]
    ref = np.maximum(xv @ K.get_value(w) + K.get_value(b), 0) * 2.0
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert f.dispatches == 1  # the matmul, computing (+ b, relu, * 2) as it stores
    assert f._f.submits == 1


def test_conv_bias_relu_is_one_dispatch(gpu, rng):
    # The bias add and relu run in the convolution's kernel; the product's result is
    # also read by `shape` (the bias gradient's sum_to target) in a training step.
    for cout in (4, 24):  # the direct kernel and the tiled one
        x = K.placeholder(shape=(None, 7, 6, 3))
        w = K.variable(rng.standard_normal((3, 3, 3, cout)).astype("float32"))
        b = K.variable(rng.standard_normal(cout).astype("float32"))
        y = _relu(K.bias_add(K.conv2d(x, w), b))
        f = K.function([x], [y])
        xv = rng.standard_normal((5, 7, 6, 3)).astype("float32")
        out = f([xv])[0]
        wv, bv = K.get_value(w), K.get_value(b)
        ref = np.zeros((5, 5, 4, cout), np.float32)
        for i in range(3):
            for j in range(3):
                ref += np.einsum("nhwc,co->nhwo", xv[:, i : i + 5, j : j + 4], wv[i, j])
        np.testing.assert_allclose(out, np.maximum(ref + bv, 0), rtol=1e-4, atol=1e-4)
        assert f.dispatches == 1


def test_updates_of_several_variables_are_one_dispatch(gpu, rng):
    # Each variable's update is a group nothing reads; the groups run as one kernel over
    # their concatenated elements (sizes 3, 20, 42, 1; a broadcast row, a scalar variable
    # and folded constants among the inputs, the learning rate bound once).
    shapes = [(3,), (4, 5), (7, 2, 3), (1,)]
    vals = [rng.standard_normal(s).astype("float32") for s in shapes]
    vs = [K.variable(v) for v in vals]
    lr = K.variable(np.float32(0.1))
    x = K.placeholder(shape=(2,))
    row = K.placeholder(shape=(3,))
    gs = [K.placeholder(shape=s) for s in shapes]
    new = [v - lr * K.square(g) * 0.5 + 1.0 for v, g in zip(vs, gs)]
    new[2] = new[2] + row
    f = K.function([x, row] + gs, [K.sum(x)], updates=list(zip(vs, new)))
    rv = rng.standard_normal(3).astype("float32")
    gv = [rng.standard_normal(s).astype("float32") for s in shapes]
    f([np.ones(2, "float32"), rv] + gv)
    for k, (v, a, g) in enumerate(zip(vs, vals, gv)):
        want = a - np.float32(0.1) * g**2 * 0.5 + 1.0 + (rv if k == 2 else 0)
        np.testing.assert_allclose(K.get_value(v), want, rtol=1e-5, atol=1e-6)
    assert f.dispatches == 2  # the sum, and one kernel for the four updates


def test_dense_epilogue_in_a_training_step(gpu, rng):
    # relu(x @ w + b) trained: forward and backward products with their epilogues; the
    # results match NumPy's step.
    xv = rng.standard_normal((16, 6)).astype("float32")
    wv = rng.standard_normal((6, 5)).astype("float32")
    bv = rng.standard_normal(5).astype("float32")
    x = K.placeholder(shape=(None, 6))
    w, b = K.variable(wv), K.variable(bv)
    loss = K.sum(_relu(K.dot(x, w) + b))
    gw, gb = K.gradients(loss, [w, b])
    f = K.function([x], [loss, gw, gb])
    lv, gwv, gbv = f([xv])
    z = xv @ wv + bv
    np.testing.assert_allclose(lv, np.maximum(z, 0).sum(), rtol=1e-4)
    np.testing.assert_allclose(gwv, xv.T @ (z > 0).astype("float32"), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gbv, (z > 0).sum(axis=0), rtol=1e-4, atol=1e-4)


def test_long_elementwise_chain_is_one_dispatch(gpu, rng):
    x = K.placeholder(shape=(3, 4))
    y = K.sigmoid(K.tanh(x) * 3.0 - 1.0) + K.exp(-K.abs(x)) / (1.0 + K.square(x))
    f = K.function([x], [y])
    xv = rng.standard_normal((3, 4)).astype("float32")
    ref = 1 / (1 + np.exp(-(np.tanh(xv) * 3 - 1))) + np.exp(-np.abs(xv)) / (1 + xv * xv)
    np.testing.assert_allclose(f([xv])[0], ref, rtol=1e-5, atol=1e-6)
    assert f.dispatches == 1


def test_broadcasting_inside_a_fused_kernel(gpu, rng):
    a = K.placeholder(shape=(4, 1, 3))
    b = K.placeholder(shape=(5, 1))
    c = K.placeholder(shape=(3,))
    y = K.maximum(a * b, c) - 1.0
    f = K.function([a, b, c], [y])
    av, bv, cv = (rng.standard_normal(s).astype("float32") for s in [(4, 1, 3), (5, 1), (3,)])
    np.testing.assert_allclose(f([av, bv, cv])[0], np.maximum(av * bv, cv) - 1.0, rtol=1e-6)
    assert f.dispatches == 1


def test_a_fused_kernel_writes_each_value_read_after_it(gpu, rng):
    x = K.placeholder(shape=(None, 5))
    t = x * x + 1.0
    a = K.exp(-t)
    b = t * 3.0
    f = K.function([x], [a, b, t])
    xv = rng.standard_normal((4, 5)).astype("float32")
    tv = xv * xv + 1.0
    for got, ref in zip(f([xv]), [np.exp(-tv), tv * 3.0, tv]):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert f.dispatches == 1


def test_a_broadcast_operand_fuses_into_its_reader(gpu, rng):
    x = K.placeholder(shape=(None, 5))
    w = K.variable(rng.standard_normal(5).astype("float32"))
    y = x * K.exp(w * 0.5)
    f = K.function([x], [y])
    xv = rng.standard_normal((3, 5)).astype("float32")
    ref = xv * np.exp(K.get_value(w) * 0.5)
    np.testing.assert_allclose(f([xv])[0], ref, rtol=1e-5, atol=1e-6)
    assert f.dispatches == 1


def test_fused_outputs_whose_shapes_differ_at_run_time(gpu, rng):
    # u and w share the static shape (None, 3); with a of one row, u is (1, 3) and w is
    # (4, 3), so their group runs member by member.
    a = K.placeholder(shape=(None, 3))
    b = K.placeholder(shape=(None, 3))
    u = a * 2.0
    w = u + b
    f = K.function([a, b], [u, w])
    for rows, launches in [(1, 2), (4, 1)]:
        av = rng.standard_normal((rows, 3)).astype("float32")
        bv = rng.standard_normal((4, 3)).astype("float32")
        uv, wv = f([av, bv])
        np.testing.assert_allclose(uv, av * 2.0, rtol=1e-6)
        np.testing.assert_allclose(wv, av * 2.0 + bv, rtol=1e-6)
        assert f.dispatches == launches


def test_variables_stay_resident(gpu, rng):
    init = rng.standard_normal((8, 3)).astype("float32")
    v = K.variable(init)
    step = K.function([], [], updates=[(v, v * 2.0 + 1.0)])
    step([])
    assert v._var.on_device()
    stats0 = _core.device_stats()
    for _ in range(5):
        step([])
    assert step._f.submits == 1
    stats1 = _core.device_stats()
    assert stats1[0] == stats0[0], "steady-state calls allocated new GPU buffers"
    ref = init.copy()
    for _ in range(6):
        ref = ref * 2 + 1
    np.testing.assert_allclose(K.get_value(v), ref, rtol=1e-6)
    # A host write replaces the device copy; the next call uploads it again.
    K.set_value(v, np.ones((8, 3), "float32"))
    step([])
    np.testing.assert_allclose(K.get_value(v), np.full((8, 3), 3.0), rtol=1e-6)


def test_resident_variable_read_after_switching_to_cpu(gpu):
    v = K.variable(np.arange(6, dtype="float32").reshape(2, 3))
    K.function([], [], updates=[(v, v + 10.0)])([])
    ferrokeras.set_device("cpu")
    out = K.function([], [K.sum(v)])([])[0]
    assert out == pytest.approx(float(np.arange(6).sum() + 60))
    np.testing.assert_allclose(K.get_value(v), np.arange(6).reshape(2, 3) + 10.0)


def test_float64_runs_on_the_cpu_path_exactly(gpu, rng):
    x = K.placeholder(shape=(5, 4), dtype="float64")
    w = K.constant(rng.standard_normal((4, 3)), dtype="float64")
    y = K.sum(K.exp(K.dot(x, w)) * 1e-3, axis=0)
    xv = rng.standard_normal((5, 4))
    f = K.function([x], [y])
    out = f([xv])[0]
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, np.sum(np.exp(xv @ K.get_value(w)) * 1e-3, axis=0), rtol=1e-13)


def test_mixed_float64_and_float32(gpu, rng):
    x = K.placeholder(shape=(6,), dtype="float64")
    y = K.cast(K.square(x), "float32") * 3.0 + 1.0  # f64 on the CPU, then f32 on the GPU
    z = K.cast(y, "float64") / 7.0
    xv = rng.standard_normal(6)
    out = K.function([x], [z])([xv])[0]
    ref = ((xv**2).astype(np.float32) * np.float32(3) + np.float32(1)).astype(np.float64) / 7.0
    np.testing.assert_allclose(out, ref, rtol=1e-7)


def test_int64_and_argmax(gpu, rng):
    x = K.placeholder(shape=(4, 7))
    xv = rng.standard_normal((4, 7)).astype("float32")
    am = K.argmax(x, axis=1)
    f = K.function([x], [am, am * 3 + 1])
    a, b = f([xv])
    assert a.dtype == np.int64
    np.testing.assert_array_equal(a, np.argmax(xv, axis=1))
    np.testing.assert_array_equal(b, np.argmax(xv, axis=1) * 3 + 1)


def _random(dist, n, seed):
    shape = _core.constant(np.array([n], dtype="int32"))
    return _core.evaluate([_core.random(dist, shape, "float32", seed)])[0]


def test_philox_matches_between_cpu_and_gpu(gpu):
    on_gpu = {d: _random(d, 4099, 1234) for d in ("uniform", "normal", "truncated_normal")}
    ferrokeras.set_device("cpu")
    on_cpu = {d: _random(d, 4099, 1234) for d in ("uniform", "normal", "truncated_normal")}
    np.testing.assert_array_equal(on_gpu["uniform"], on_cpu["uniform"])
    np.testing.assert_allclose(on_gpu["normal"], on_cpu["normal"], rtol=1e-4, atol=1e-5)
    t_gpu, t_cpu = on_gpu["truncated_normal"], on_cpu["truncated_normal"]
    assert np.all(np.abs(t_gpu) <= 2.0)
    close = np.isclose(t_gpu, t_cpu, rtol=1e-4, atol=1e-5)
    # A draw within float rounding of the +-2 cut may be kept on one device only.
    assert close.mean() > 0.999


def test_gather_index_out_of_range_computed_on_gpu(gpu):
    p = K.placeholder(shape=(5, 2))
    i = K.placeholder(shape=(3,), dtype="int32")
    y = _gather(p, i * 2)  # the indices are computed on the device
    f = K.function([p, i], [y])
    pv = np.arange(10, dtype="float32").reshape(5, 2)
    np.testing.assert_array_equal(f([pv, np.array([0, 1, 2], "int32")])[0], pv[[0, 2, 4]])
    with pytest.raises(ValueError, match="out of range"):
        f([pv, np.array([0, 1, 3], "int32")])
    # The device still works after the error.
    np.testing.assert_array_equal(f([pv, np.array([2, 1, 0], "int32")])[0], pv[[4, 2, 0]])


def test_shader_compile_failure_is_a_python_exception(gpu):
    with pytest.raises(ferrokeras.DeviceError, match="shader"):
        _core.compile_wgsl("@compute @workgroup_size(1) fn main() { let x: u32 = -; }", "main")
    x = K.placeholder(shape=(3,))
    np.testing.assert_allclose(K.function([x], [x * 2.0])([np.ones(3, "float32")])[0], [2, 2, 2])


def test_matmul_shapes_against_numpy(gpu, rng):
    for m, k, n in [(1, 1, 1), (3, 70, 5), (65, 17, 130), (128, 64, 64)]:
        a = K.placeholder(shape=(m, k))
        b = K.placeholder(shape=(n, k))
        f = K.function([a, b], [K.dot(a, K.transpose(b))])
        av = rng.standard_normal((m, k)).astype("float32")
        bv = rng.standard_normal((n, k)).astype("float32")
        np.testing.assert_allclose(f([av, bv])[0], av @ bv.T, rtol=1e-4, atol=1e-4)
    a = K.placeholder(shape=(2, 3, 4, 5))
    b = K.placeholder(shape=(3, 5, 6))
    av = rng.standard_normal((2, 3, 4, 5)).astype("float32")
    bv = rng.standard_normal((3, 5, 6)).astype("float32")
    np.testing.assert_allclose(
        K.function([a, b], [_matmul(a, b)])([av, bv])[0], av @ bv, rtol=1e-5, atol=1e-5
    )


def _matmul(a, b):
    return wrap(_core.matmul(a._core, b._core, False, False))


def _relu(x):
    return wrap(_core.unary("relu", x._core))


def _gather(p, i):
    return wrap(_core.gather(p._core, i._core, 0))


def test_training_step_is_one_submit(gpu, rng):
    x = K.placeholder(shape=(None, 4))
    y = K.placeholder(shape=(None, 1))
    w1 = K.variable(rng.standard_normal((4, 8)).astype("float32") * 0.5)
    w2 = K.variable(rng.standard_normal((8, 1)).astype("float32") * 0.5)
    loss = K.mean(K.square(K.dot(K.tanh(K.dot(x, w1)), w2) - y))
    g1, g2 = K.gradients(loss, [w1, w2])
    train = K.function([x, y], [loss], updates=[(w1, w1 - 0.1 * g1), (w2, w2 - 0.1 * g2)])
    xv = rng.standard_normal((32, 4)).astype("float32")
    yv = np.sin(xv.sum(axis=1, keepdims=True)).astype("float32")
    losses = [float(train([xv, yv])[0]) for _ in range(30)]
    assert train._f.submits == 1
    assert losses[-1] < losses[0]


def test_oversize_buffer_is_refused_clearly():
    if not GPUS:
        pytest.skip("no GPU adapter on this machine")
    code = r"""
import numpy as np, ferrokeras
from ferrokeras import backend as K
ferrokeras.set_device("gpu")
x = K.placeholder(shape=(300, 300))
f = K.function([x], [K.exp(x) + 1.0])
try:
    f([np.ones((300, 300), "float32")])
except ferrokeras.DeviceError as e:
    print("ERR", e)
ferrokeras.set_device("cpu")
print("CPU", float(f([np.zeros((300, 300), "float32")])[0].sum()))
"""
    env = dict(os.environ, FERROKERAS_GPU_MAX_BINDING="65536")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "ERR" in r.stdout and "limit" in r.stdout and "(300, 300)" in r.stdout, r.stdout
    assert "CPU 180000.0" in r.stdout, r.stdout


# ---------------------------------------------------------------- device parity
#
# Every primitive with a WGSL lowering, run through `_core` on the GPU and on the CPU
# (whose kernels the rest of the suite checks against NumPy), over the dtypes the GPU
# stores in 32-bit words: float32, float16 (rounded after each op), int32, int16, int8,
# uint8 and bool (wrapped / 0-1 after each op).


def _inputs(dtype, shape, rng, lo=-3.0, hi=3.0):
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -300), min(info.max, 300) + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def _on_both(build, arrays):
    phs = [_core.placeholder("p%d" % k, list(a.shape), str(a.dtype)) for k, a in enumerate(arrays)]
    outs = build(*phs)
    outs = outs if isinstance(outs, list) else [outs]
    f = _core.Function(phs, outs, [])
    res = {}
    for dev in ("cpu", "gpu"):
        ferrokeras.set_device(dev)
        res[dev] = f(list(arrays))
        if dev == "gpu":
            # Ran as GPU kernels (one submit), unless WGSL has no lowering for the dtypes.
            assert f.submits == 1 or not f.dispatches, (f.submits, f.dispatches)
            gpu_dispatches.append(f.dispatches)
    ferrokeras.set_device("gpu")
    return res["gpu"], res["cpu"], f


gpu_dispatches = []


def _same(gpu_out, cpu_out, rtol=2e-5, atol=1e-5):
    for g, c in zip(gpu_out, cpu_out):
        assert g.dtype == c.dtype and g.shape == c.shape, (g.dtype, c.dtype, g.shape, c.shape)
        if g.dtype.kind == "f":
            tol = (2e-3, 1e-3) if g.dtype == np.float16 else (rtol, atol)
            np.testing.assert_allclose(
                g.astype(np.float64), c.astype(np.float64), rtol=tol[0], atol=tol[1], equal_nan=True
            )
        else:
            np.testing.assert_array_equal(g, c)


INT_UNARY = ["neg", "abs", "sign", "square", "relu", "round", "floor", "ceil"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int16", "int8", "uint8"])
def test_parity_unary(gpu, rng, dtype):
    names = _core.UNARY_OPS if np.dtype(dtype).kind == "f" else INT_UNARY
    for name in names:
        if name == "logical_not":
            continue
        lo, hi = (
            (0.1, 3.0)
            if name in ("sqrt", "rsqrt", "log", "reciprocal")
            else (-1.0, 1.0)
            if name == "tan"
            else (-3.0, 3.0)
        )
        x = _inputs(dtype, (5, 7), rng, lo, hi)
        g, c, _ = _on_both(lambda p, name=name: _core.unary(name, p), [x])
        _same(g, c)
    b = _inputs("bool", (9,), rng)
    _same(*_on_both(lambda p: _core.unary("logical_not", p), [b])[:2])


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int16", "uint8"])
def test_parity_binary(gpu, rng, dtype):
    for name in _core.BINARY_OPS:
        if name.startswith("logical"):
            continue
        a = _inputs(dtype, (4, 1, 6), rng)
        b = _inputs(dtype, (3, 6), rng)
        if name in ("divide", "floor_divide", "mod") and np.dtype(dtype).kind == "f":
            b = np.where(np.abs(b) < 0.25, 1, b).astype(dtype)
        if name == "pow":
            a = np.abs(a).astype(dtype) if np.dtype(dtype).kind == "f" else a
            b = (np.abs(b) % 4).astype(dtype)
        g, c, _ = _on_both(lambda p, q, name=name: _core.binary(name, p, q), [a, b])
        _same(g, c)
    p, q = _inputs("bool", (6,), rng), _inputs("bool", (6,), rng)
    for name in ("logical_and", "logical_or", "equal"):
        _same(*_on_both(lambda x, y, name=name: _core.binary(name, x, y), [p, q])[:2])


def test_pow_special_values_match_the_cpu(gpu):
    # IEEE pow (the CPU's, NumPy's, TF's) at signed zeros, infinities, NaN, negative bases
    # with integer and fractional exponents, and exponents too large to be odd.
    inf, nan = np.inf, np.nan
    bases = [-inf, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, inf, nan]
    exps = [-inf, -3.0, -2.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 2.0**25 + 2, inf, nan]
    a, b = (np.array(v, np.float32) for v in zip(*[(x, y) for x in bases for y in exps]))
    g, c, _ = _on_both(lambda p, q: _core.binary("pow", p, q), [a, b])
    g, c = np.ravel(g), np.ravel(c)
    with np.errstate(all="ignore"):
        want = np.power(a, b)
    for got in (c, g):  # finite results to an ulp or two (a vectorised exp2/log2)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
        num = ~np.isnan(want)
        assert np.array_equal(np.signbit(got[num]), np.signbit(want[num]))


DTYPES = ["float32", "float16", "int32", "int16", "int8", "uint8", "bool"]


@pytest.mark.parametrize("src", DTYPES)
def test_parity_cast_and_select(gpu, rng, src):
    x = _inputs(src, (17,), rng, -300.0, 300.0)
    if np.dtype(src).kind == "f":
        x[:3] = [np.nan, 0.5, -0.5]
    for dst in DTYPES:
        g, c, _ = _on_both(lambda p, dst=dst: _core.cast(p, dst), [x])
        _same(g, c)
    cond = _inputs("bool", (17,), rng)
    y = _inputs(src, (1,), rng)
    _same(*_on_both(lambda k, p, q: _core.select(k, p, q), [cond, x, y])[:2])


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int8", "bool"])
def test_parity_reductions(gpu, rng, dtype):
    x = _inputs(dtype, (3, 70, 4, 5), rng, 0.5, 1.5)
    big = _inputs(dtype, (2, 3000), rng, 0.5, 1.5)
    ops = ["max", "min"] if dtype == "bool" else ["sum", "prod", "max", "min", "mean"]
    for name in ops:
        for arr, axes in [
            (x, [1]),
            (x, [0, 2]),
            (x, [3]),
            (x, [1, 3]),
            (x, [0, 1, 2, 3]),
            (big, [1]),
        ]:
            if name == "prod" and arr is big:
                continue
            g, c, f = _on_both(
                lambda p, name=name, axes=axes: _core.reduce(name, p, axes, True), [arr]
            )
            _same(g, c, rtol=1e-4, atol=1e-4)
            # Integer means run on the CPU path (an i32 sum could wrap where int64 does not).
            assert f.submits == (
                0 if (name == "mean" and dtype != "float32" and dtype != "float16") else 1
            )
    if dtype != "bool":
        for name in ("argmax", "argmin"):
            _same(*_on_both(lambda p, name=name: _core.arg(name, p, 1), [x])[:2])
        for name in ("cumsum", "cumprod"):
            for excl in (False, True):
                for rev in (False, True):
                    v = _inputs(dtype, (3, 6, 2), rng, 0.5, 1.5)
                    g, c, _ = _on_both(
                        lambda p, name=name, e=excl, r=rev: _core.scan(name, p, 1, e, r), [v]
                    )
                    _same(g, c, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "width,rows,count",
    # Rows of 256 bytes from row 2, and all rows: windows of x's buffer, no kernel but
    # the exp. Rows of 12 bytes from row 1: an offset no adapter's alignment admits, so
    # no window, but the exp's kernel reads them in place through an offset (a lazy
    # slice); read by a product, a kernel gathers them.
    [(64, (2, 6), 1), (64, (0, 8), 1), (3, (1, 3), 1)],
)
def test_a_slice_of_whole_rows_is_a_window(gpu, rng, width, rows, count):
    a, b = rows
    x = K.placeholder(shape=(8, width))
    y = K.exp(x[a:b])
    g = K.gradients(K.sum(y * y), [x])[0]
    f = K.function([x], [y])
    fg = K.function([x], [y, g])
    xv = rng.standard_normal((8, width)).astype("float32")
    np.testing.assert_allclose(f([xv])[0], np.exp(xv[a:b]), rtol=1e-5, atol=1e-6)
    assert f.dispatches == count
    if width == 3:
        w = K.placeholder(shape=(3, 2))
        p = K.function([x, w], [K.dot(x[a:b], w)])
        wv = rng.standard_normal((3, 2)).astype("float32")
        np.testing.assert_allclose(p([xv, wv])[0], xv[a:b] @ wv, rtol=1e-5, atol=1e-5)
        assert p.dispatches == 2
    out = fg([xv])
    ref = np.zeros((8, width))
    ref[a:b] = 2 * np.exp(2 * xv[a:b].astype("float64"))
    np.testing.assert_allclose(out[0], np.exp(xv[a:b]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], ref, rtol=1e-4, atol=1e-5)
    # Columns are no run of elements: read by a generated kernel only, they are read in
    # place from x's buffer through strides (a lazy slice), with no gather kernel; read
    # by a product, a kernel gathers them.
    h = K.function([x], [x[:, 1:3] + 1.0])
    np.testing.assert_allclose(h([xv])[0], xv[:, 1:3] + 1.0, rtol=1e-6)
    assert h.dispatches == 1
    w = K.placeholder(shape=(2, 4))
    m = K.function([x, w], [K.dot(x[:, 1:3], w)])
    wv = rng.standard_normal((2, 4)).astype("float32")
    np.testing.assert_allclose(m([xv, wv])[0], xv[:, 1:3] @ wv, rtol=1e-5, atol=1e-5)
    assert m.dispatches == 2


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "bool"])
def test_parity_movement(gpu, rng, dtype):
    x = _inputs(dtype, (4, 5, 6), rng)
    cases = [
        lambda p: _core.transpose(p, [2, 0, 1]),
        lambda p: _core.slice(p, [(None, None, -1), (1, 4, 2), (-5, None, 3)]),
        lambda p: _core.slice(p, [(3, 0, -2), (None, None, 1), (2, 2, 1)]),
        lambda p: _core.pad(p, [(1, 0), (0, 2), (3, 1)], 1.0),
        lambda p: _core.reverse(p, [0, 2]),
        lambda p: _core.concat([p, _core.unary("neg", p) if dtype != "bool" else p, p], 1),
        lambda p: _core.gather(p, _core.constant(np.array([[3, 0], [1, 1]], "int32")), 1),
    ]
    for build in cases:
        _same(*_on_both(build, [x])[:2])


def test_parity_gradients_of_movement(gpu, rng):
    x = _inputs("float32", (4, 5, 6), rng)
    idx = _core.constant(np.array([3, 0, 3, 1], "int32"))

    def build(p):
        y = _core.concat(
            [
                _core.slice(p, [(None, None, 2), (1, 4, 1), (None, None, -1)]),
                _core.slice(p, [(None, None, 2), (0, 3, 1), (None, None, 1)]),
            ],
            1,
        )
        z = _core.gather(p, idx, 1)
        s = _core.binary(
            "add",
            _core.reduce("sum", _core.unary("square", y), [0, 1, 2], False),
            _core.reduce("sum", _core.unary("exp", z), [0, 1, 2], False),
        )
        return _core.gradients(s, [p])

    g, c, f = _on_both(build, [x])
    _same(g, c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int8"])
@pytest.mark.parametrize("mkn", [(33, 19, 70), (36, 20, 68), (4, 132, 8)])  # scalar and vec4 loads
def test_parity_matmul(gpu, rng, dtype, mkn):
    m, k, n = mkn
    for ta in (False, True):
        for tb in (False, True):
            a = _inputs(dtype, (2, m, k) if not ta else (2, k, m), rng, -1, 1)
            b = _inputs(dtype, (k, n) if not tb else (n, k), rng, -1, 1)
            g, c, _ = _on_both(lambda p, q, ta=ta, tb=tb: _core.matmul(p, q, ta, tb), [a, b])
            _same(g, c, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- convolution and pooling
#
# The conv primitives (forward, transposed = input gradient, kernel gradient) and the
# pooling primitives (forward, gradient, and the select that is the gradient's adjoint)
# run as the WGSL kernels of shaders/conv.wgsl and shaders/pool.wgsl: no node of these
# plans falls back to the CPU (`host_nodes`), and results match the CPU kernels (which
# tests/test_conv.py checks against NumPy and finite differences).

# (x shape, kernel shape, strides, dilation, padding, groups): every kernel path: tiled
# GEMMs (>= 16 channels on the column side), the one-output-per-thread kernels (fewer:
# depthwise), strided, dilated, explicit/causal/same padding, grouped, 1-D, 2-D, 3-D,
# and batch*spatial long enough that the kernel gradient is split into chunks.
CONV_CASES = [
    ((2, 7, 9, 16), (3, 3, 16, 20), [1, 1], [1, 1], "same", 1),
    ((3, 8, 7, 5), (3, 2, 5, 4), [2, 1], [1, 1], "same", 1),
    ((2, 9, 9, 18), (3, 3, 18, 17), [1, 1], [2, 3], [(1, 2), (0, 1)], 1),
    ((2, 7, 6, 32), (3, 3, 16, 32), [2, 2], [1, 1], "same", 2),
    ((2, 7, 6, 4), (3, 3, 1, 8), [1, 2], [1, 1], "same", 4),
    ((2, 10, 10, 24), (5, 5, 1, 24), [2, 2], [1, 1], [(2, 1), (0, 3)], 24),
    ((4, 24, 24, 8), (3, 3, 1, 8), [1, 1], [1, 1], "same", 8),
    ((4, 20, 20, 16), (3, 3, 16, 16), [1, 1], [1, 1], "same", 1),
    ((1, 11, 3), (4, 3, 2), [3], [1], [(3, 0)], 1),
    ((2, 40, 17), (5, 17, 33), [2], [2], "same", 1),
    ((2, 4, 5, 6, 2), (2, 3, 2, 2, 3), [2, 1, 2], [1, 1, 1], "same", 1),
    ((1, 5, 6, 7, 16), (3, 3, 3, 16, 16), [1, 1, 1], [1, 1, 1], "same", 1),
    ((2, 5, 5, 16), (1, 1, 16, 24), [1, 1], [1, 1], [(0, 0), (0, 0)], 1),
    ((2, 9, 8, 20), (3, 3, 20, 16), [3, 2], [1, 1], "same", 1),
    ((2, 11, 10, 16), (3, 3, 16, 16), [2, 2], [3, 1], "same", 1),
]


def _conv_with_grads(spec):
    strides, dilation, padding, groups = spec

    def build(x, w, u):
        y = _core.conv(x, w, strides, dilation, padding, groups)
        dx, dw = _core.gradients(y, [x, w], u)
        return [y, dx, dw]

    return build


def _conv_arrays(rng, xs, ws, strides, dilation, padding, groups, dtype):
    x = _inputs(dtype, xs, rng, -1, 1)
    w = _inputs(dtype, ws, rng, -1, 1)
    ph = [_core.placeholder("x", list(xs), dtype), _core.placeholder("w", list(ws), dtype)]
    yshape = _core.Function(ph, [_core.conv(*ph, strides, dilation, padding, groups)], [])([x, w])[
        0
    ].shape
    return x, w, _inputs(dtype, yshape, rng, -1, 1)


@pytest.mark.parametrize(
    "case", CONV_CASES, ids=lambda c: "x%s_w%s_s%s_d%s_g%d" % (c[0], c[1], c[2], c[3], c[5])
)
def test_parity_conv_and_its_gradients(gpu, rng, case):
    xs, ws, strides, dilation, padding, groups = case
    x, w, u = _conv_arrays(rng, xs, ws, strides, dilation, padding, groups, "float32")
    g, c, f = _on_both(_conv_with_grads((strides, dilation, padding, groups)), [x, w, u])
    _same(g, c, rtol=1e-4, atol=1e-4)
    assert f.host_nodes == 0 and f.submits == 1, (f.host_nodes, f.submits)


# Tiled and direct kernels, and kernel gradients split into chunks (6, 7), whose f32
# partial sums are rounded to f16 once, as the CPU rounds its f32 accumulation.
@pytest.mark.parametrize(
    "case", [CONV_CASES[k] for k in (0, 1, 4, 6, 7, 9)], ids=lambda c: f"x{c[0]}_w{c[1]}"
)
def test_parity_conv_float16(gpu, rng, case):
    xs, ws, strides, dilation, padding, groups = case
    x, w, u = _conv_arrays(rng, xs, ws, strides, dilation, padding, groups, "float16")
    g, c, f = _on_both(_conv_with_grads((strides, dilation, padding, groups)), [x, w, u])
    for a, b in zip(g, c):
        assert a.dtype == b.dtype == np.float16 and a.shape == b.shape
        # f32 accumulation in a different order, then one rounding to f16: one f16 ulp.
        scale = max(1.0, float(np.abs(b.astype(np.float32)).max()))
        np.testing.assert_allclose(
            a.astype(np.float32), b.astype(np.float32), rtol=2e-3, atol=2e-3 * scale
        )
    assert f.host_nodes == 0


def test_parity_conv_transpose_primitive(gpu, rng):
    # conv_transpose as K.conv2d_transpose builds it: the input-gradient primitive alone,
    # its target shape a constant.
    for xs, ws, strides, padding, groups in [
        ((2, 6, 5, 16), (3, 3, 8, 16), [2, 2], "same", 2),
        ((2, 6, 5, 3), (4, 4, 5, 3), [2, 3], [(1, 2), (0, 0)], 1),
        ((1, 4, 4, 4, 16), (2, 2, 2, 24, 16), [2, 2, 2], "same", 1),
    ]:
        gshape = xs
        xshape = [gshape[0]] + [d * s for d, s in zip(gshape[1:-1], strides)] + [ws[-2] * groups]
        if padding != "same":
            xshape = [gshape[0], 12, 16, ws[-2]]
        gv = _inputs("float32", gshape, rng, -1, 1)
        wv = _inputs("float32", ws, rng, -1, 1)
        target = _core.constant(np.array(xshape, "int32"))
        build = lambda p, q, target=target, strides=strides, padding=padding, groups=groups: (
            _core.conv_transpose(p, q, target, strides, [1] * len(strides), padding, groups)
        )
        g, c, f = _on_both(build, [gv, wv])
        assert list(g[0].shape) == xshape
        _same(g, c, rtol=1e-4, atol=1e-4)
        assert f.host_nodes == 0


# (mode, x shape, window, strides, padding)
POOL_CASES = [
    ("max", (2, 9, 8, 5), [3, 3], [2, 2], "same"),
    ("avg", (2, 9, 8, 5), [3, 3], [2, 2], "same"),
    ("max", (3, 8, 8, 4), [2, 2], [2, 2], [(0, 0), (0, 0)]),
    ("avg", (2, 7, 9, 3), [3, 2], [1, 2], "same"),
    ("max", (2, 13, 6), [3], [2], "same"),
    ("avg", (2, 13, 6), [4], [3], "same"),
    ("max", (2, 4, 6, 5, 3), [2, 2, 2], [1, 2, 2], "same"),
    ("avg", (1, 5, 5, 4, 2), [3, 3, 2], [2, 2, 1], "same"),
    ("max", (2, 6, 7, 3), [3, 3], [2, 1], [(1, 2), (0, 1)]),
    ("avg", (2, 6, 7, 3), [3, 3], [2, 1], [(1, 2), (0, 1)]),
    # Windows wholly in the padding: -inf (max), NaN (avg), as on the CPU.
    ("max", (1, 4, 4, 2), [2, 2], [1, 1], [(2, 0), (0, 0)]),
    ("avg", (1, 4, 4, 2), [2, 2], [1, 1], [(2, 0), (0, 0)]),
]


def _pool_with_grads(mode, window, strides, padding):
    def build(x, u, v):
        y = _core.pool(x, mode, window, strides, padding)
        (dx,) = _core.gradients(y, [x], u)  # PoolGrad(x, u)
        (sel,) = _core.gradients(dx, [u], v)  # PoolSelect(x, v), the adjoint in u
        return [y, dx, sel]

    return build


def _pool_arrays(rng, mode, xs, window, strides, padding, ties=False):
    x = (rng.integers(0, 3, size=xs) if ties else rng.uniform(-2, 2, size=xs)).astype("float32")
    ph = _core.placeholder("x", list(xs), "float32")
    yshape = _core.Function([ph], [_core.pool(ph, mode, window, strides, padding)], [])([x])[
        0
    ].shape
    return x, _inputs("float32", yshape, rng, -1, 1), _inputs("float32", xs, rng, -1, 1)


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]}_x{c[1]}_k{c[2]}_s{c[3]}")
def test_parity_pool_and_its_gradients(gpu, rng, case):
    mode, xs, window, strides, padding = case
    g, c, f = _on_both(_pool_with_grads(mode, window, strides, padding), _pool_arrays(rng, *case))
    _same(g, c, rtol=1e-5, atol=1e-6)
    assert f.host_nodes == 0 and f.submits == 1, (f.host_nodes, f.submits)


@pytest.mark.parametrize(
    "case", [c for c in POOL_CASES if c[0] == "max"][:4], ids=lambda c: f"x{c[1]}_k{c[2]}"
)
def test_max_pool_ties_route_to_the_first_maximum_as_on_the_cpu(gpu, rng, case):
    _, xs, window, strides, padding = case
    arrays = _pool_arrays(rng, *case, ties=True)
    g, c, _ = _on_both(_pool_with_grads("max", window, strides, padding), arrays)
    for a, b in zip(g, c):
        np.testing.assert_array_equal(a, b)  # same elements chosen, same order of sums


def test_pool_float16(gpu, rng):
    for mode in ("max", "avg"):
        x, u, v = (
            a.astype("float16")
            for a in _pool_arrays(rng, mode, (2, 9, 8, 5), [3, 3], [2, 2], "same")
        )
        g, c, f = _on_both(_pool_with_grads(mode, [3, 3], [2, 2], "same"), [x, u, v])
        _same(g, c)
        assert f.host_nodes == 0


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_conv_net_step_runs_wholly_on_the_gpu(gpu, rng, fmt):
    # A K-level conv net (both data formats; channels_first is transposes around the same
    # channels-last primitives) with its gradients: every node a GPU kernel, one submit.
    shape = (4, 10, 10, 3) if fmt == "channels_last" else (4, 3, 10, 10)
    x = K.placeholder(shape=shape)
    k1 = K.variable(rng.standard_normal((3, 3, 3, 16)).astype("float32") * 0.3)
    k2 = K.variable(rng.standard_normal((3, 3, 16, 1)).astype("float32") * 0.3)
    h = K.relu(K.conv2d(x, k1, padding="same", data_format=fmt))
    h = K.depthwise_conv2d(h, k2, strides=(2, 2), padding="same", data_format=fmt)
    h = K.pool2d(h, (2, 2), strides=(2, 2), padding="same", data_format=fmt, pool_mode="max")
    h = K.pool2d(h, (2, 2), strides=(1, 1), padding="same", data_format=fmt, pool_mode="avg")
    loss = K.mean(K.square(h))
    grads = K.gradients(loss, [k1, k2])
    f = K.function([x], [loss] + grads)
    xv = rng.standard_normal(shape).astype("float32")
    out = f([xv])
    assert f._f.host_nodes == 0 and f._f.submits == 1, (f._f.host_nodes, f._f.submits)
    ferrokeras.set_device("cpu")
    ref = f([xv])
    for a, b in zip(out, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_float64_conv_is_an_observable_cpu_fallback(gpu, rng):
    x = K.placeholder(shape=(2, 6, 6, 3), dtype="float64")
    k = K.constant(rng.standard_normal((3, 3, 3, 4)), dtype="float64")
    f = K.function([x], [K.pool2d(K.conv2d(x, k), (2, 2))])
    xv = rng.standard_normal((2, 6, 6, 3))
    out = f([xv])[0]
    assert out.dtype == np.float64
    assert f._f.host_nodes >= 2  # WGSL has no f64: conv and pool run their CPU kernels
    ferrokeras.set_device("cpu")
    np.testing.assert_allclose(out, f([xv])[0], rtol=1e-13)


# ---------------------------------------------------------------- int64 on the device
#
# int64 lives on the GPU as two 32-bit words per element; the generated kernels compute
# the ops a Keras step uses on it (wrapping arithmetic, comparisons, min/max, select,
# casts) and arg-reductions write their int64 indices there, with NumPy's (and the CPU
# device's) results bit for bit: values past 2^31, negative values, overflow wrapping.
# Division, modulo and powers of int64 stay on the host.

INT64_EDGES = [0, 1, -1, 2**31, -(2**31), 2**31 - 1, 2**32, -(2**32), 2**32 - 1]
INT64_EDGES += [2**63 - 1, -(2**63), 3 * 2**32 + 5, -(3 * 2**32) - 5, 2**60 + 2**36 + 2**7]


def _int64(rng, shape):
    big = rng.integers(-(2**63), 2**63 - 1, size=shape, dtype=np.int64)
    small = rng.integers(-300, 300, size=shape, dtype=np.int64)
    v = np.where(rng.random(shape) < 0.5, big, small)
    flat = v.reshape(-1)
    k = min(len(INT64_EDGES), flat.size)
    flat[:k] = INT64_EDGES[:k]
    return v


def _on_gpu_exactly(build, arrays):
    """GPU results of `build`, checked equal to the CPU device's, with no host node."""
    g, c, f = _on_both(build, arrays)
    _same(g, c)
    assert f.host_nodes == 0 and f.submits == 1, (f.host_nodes, f.submits)
    return g


def test_int64_elementwise_ops_are_exact_on_the_gpu(gpu, rng):
    a = _int64(rng, (4, 1, 6))
    b = _int64(rng, (3, 6))
    b.reshape(-1)[: len(INT64_EDGES)] = INT64_EDGES[::-1][: b.size]
    with np.errstate(over="ignore"):
        unary = {
            "neg": -a,
            "abs": np.abs(a),
            "sign": np.sign(a),
            "square": a * a,
            "relu": np.maximum(a, 0),
            "round": a,
            "floor": a,
            "ceil": a,
        }
        binary = {
            "add": a + b,
            "subtract": a - b,
            "multiply": a * b,
            "maximum": np.maximum(a, b),
            "minimum": np.minimum(a, b),
            "equal": a == b,
            "not_equal": a != b,
            "less": a < b,
            "less_equal": a <= b,
            "greater": a > b,
            "greater_equal": a >= b,
        }
    for name, ref in unary.items():
        (g,) = _on_gpu_exactly(lambda p, name=name: _core.unary(name, p), [a])
        np.testing.assert_array_equal(g, ref, err_msg=name)
    for name, ref in binary.items():
        (g,) = _on_gpu_exactly(lambda p, q, name=name: _core.binary(name, p, q), [a, b])
        assert g.dtype == ref.dtype, name
        np.testing.assert_array_equal(g, ref, err_msg=name)
    # Overflow wraps as NumPy's int64 does.
    top = np.array([2**63 - 1, -(2**63), 2**62, 3 * 2**40], np.int64)
    one = np.array([1, -1, 2, 3 * 2**40], np.int64)
    with np.errstate(over="ignore"):
        refs = [top + one, top - one, top * one, -top]
    g = _on_gpu_exactly(
        lambda p, q: [
            _core.binary("add", p, q),
            _core.binary("subtract", p, q),
            _core.binary("multiply", p, q),
            _core.unary("neg", p),
        ],
        [top, one],
    )
    for x, ref in zip(g, refs):
        np.testing.assert_array_equal(x, ref)
    # A fused chain of int64 ops with a folded int64 scalar and a select.
    k = _core.constant(np.array(2**40 + 3, np.int64))
    c = rng.random((4, 3, 6)) > 0.5
    (g,) = _on_gpu_exactly(
        lambda p, q, s: _core.select(
            s, _core.binary("multiply", _core.binary("add", p, q), k), _core.unary("neg", q)
        ),
        [a, b, c],
    )
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(g, np.where(c, (a + b) * np.int64(2**40 + 3), -b))


def test_int64_casts_are_exact_on_the_gpu(gpu, rng):
    a = _int64(rng, (40,))
    for dst in ["float32", "float16", "int32", "int16", "int8", "uint8", "bool"]:
        (g,) = _on_gpu_exactly(lambda p, dst=dst: _core.cast(p, dst), [a])
        # The CPU converts int64 to a float through float64 (two roundings); float16
        # overflows to inf.
        with np.errstate(over="ignore"):
            ref = a.astype(np.float64).astype(dst) if dst.startswith("float") else a.astype(dst)
        np.testing.assert_array_equal(g, ref, err_msg=dst)
    # 2^60 + 2^36 + 2^7: float64 rounds it to a tie that float32 rounds to even, 2^60.
    (g,) = _on_gpu_exactly(lambda p: _core.cast(p, "float32"), [a])
    assert g[len(INT64_EDGES) - 1] == np.float32(2**60)
    x = rng.uniform(-3e18, 3e18, 30).astype("float32")
    x[:8] = [0.5, -0.5, -1.5, 2.0**40 + 2.0**20, 2.0**31, -(2.0**31), 1e10, -1e10]
    for src in ["float32", "float16", "int32", "int16", "int8", "uint8", "bool"]:
        v = x if src == "float32" else _inputs(src, (30,), rng)
        (g,) = _on_gpu_exactly(lambda p: _core.cast(p, "int64"), [v])
        np.testing.assert_array_equal(g, v.astype(np.int64), err_msg=src)
    # Out of range: saturated, NaN to 0, as the CPU's conversion.
    edge = np.array([np.nan, np.inf, -np.inf, 1e19, -1e19, 2.0**63, -(2.0**63)], "float32")
    (g,) = _on_gpu_exactly(lambda p: _core.cast(p, "int64"), [edge])
    top, low = 2**63 - 1, -(2**63)
    np.testing.assert_array_equal(g, np.array([0, top, low, top, low, top, low], np.int64))


def test_int64_argmax_and_argmin_on_the_gpu(gpu, rng):
    x = rng.standard_normal((5, 7, 3)).astype("float32")
    long = rng.standard_normal((3, 20000)).astype("float32")  # several dispatches
    for name, ref in (("argmax", np.argmax), ("argmin", np.argmin)):
        for v, axis in ((x, 1), (x, 2), (long, 1)):
            (g,) = _on_gpu_exactly(lambda p, name=name, axis=axis: _core.arg(name, p, axis), [v])
            assert g.dtype == np.int64
            np.testing.assert_array_equal(g, ref(v, axis=axis))
    # Indices read by int64 kernels on the device: Keras' accuracy.
    p, q = (rng.integers(0, 3, (40, 5)).astype("float32") for _ in range(2))
    (g,) = _on_gpu_exactly(
        lambda p, q: _core.cast(
            _core.binary("equal", _core.arg("argmax", p, 1), _core.arg("argmax", q, 1)),
            "float32",
        ),
        [p, q],
    )
    np.testing.assert_array_equal(g, np.argmax(p, 1) == np.argmax(q, 1))


def test_int64_division_stays_on_the_host(gpu, rng):
    a, b = _int64(rng, (12,)), rng.integers(1, 2**40, 12)
    for name, ref in (("floor_divide", a // b), ("mod", a % b)):
        g, c, f = _on_both(lambda p, q, name=name: _core.binary(name, p, q), [a, b])
        np.testing.assert_array_equal(g[0], ref)
        assert f.host_nodes == 1


def test_int64_variable_updates_stay_on_the_gpu(gpu):
    it = K.variable(np.int64(2**32 - 1), dtype="int64")
    step = K.function([], [], updates=[(it, it + K.constant(1, dtype="int64"))])
    for _ in range(3):
        step([])
    assert step._f.host_nodes == 0 and step._f.submits == 1
    assert K.get_value(it) == 2**32 + 2


def test_shape_arithmetic_is_computed_apart_from_host_nodes(gpu, rng):
    # Small int vectors that only feed target shapes, computed from host values: no
    # host node, no transfer.
    x = K.placeholder(shape=(None, 6))
    n = K.shape(x)[:1] * 2
    y = K.reshape(x, K.concatenate([n, K.constant([3], dtype="int32")]))
    f = K.function([x], [y * 2.0])
    xv = rng.standard_normal((4, 6)).astype("float32")
    np.testing.assert_array_equal(f([xv])[0], xv.reshape(8, 3) * 2.0)
    assert f._f.shape_nodes >= 2 and f._f.host_nodes == 0 and f._f.submits == 1
    # One that reads a variable (whose value may live on the device) is a host node.
    s = K.variable(np.array([2, 12], "int32"), dtype="int32")
    g = K.function([x], [K.reshape(x, s * 1) * 2.0])
    np.testing.assert_array_equal(g([xv])[0], xv.reshape(2, 12) * 2.0)
    assert g._f.shape_nodes == 0 and g._f.host_nodes == 1, (g._f.shape_nodes, g._f.host_nodes)


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_keras_mlp_step_with_accuracy_has_no_host_node(gpu, optimizer):
    import keras

    np.random.seed(0)
    model = keras.models.Sequential(
        [
            keras.layers.Dense(16, activation="relu", input_shape=(8,)),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.compile(optimizer, "categorical_crossentropy", ["accuracy"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype("float32")
    y = np.eye(4, dtype="float32")[rng.integers(0, 4, 32)]
    for _ in range(2):
        loss, acc = model.train_on_batch(x, y)
    f = model.train_function._f
    assert f.host_nodes == 0 and f.submits == 1, (f.host_nodes, f.submits)
    assert f.shape_nodes > 0  # the dropout mask's shape, computed on the host
    assert np.isfinite(loss) and 0 <= acc <= 1
    assert K.get_value(model.optimizer.iterations) == 2


# ---------------------------------------------------------------- long axes, large grids


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_scans_along_axes_longer_than_a_shader_loop_may_run(gpu, rng, dtype):
    # llvmpipe ends any shader loop after 65535 iterations; a long scan is split over
    # dispatches that go on from one another (here 5 of them, the last one partial).
    n = 70001
    ones = np.ones((2, n), dtype=dtype)
    signs = rng.choice([-1, 1], size=(n, 2)).astype(dtype)
    for excl in (False, True):
        for rev in (False, True):
            g, c, _ = _on_both(lambda p, e=excl, r=rev: _core.scan("cumsum", p, 1, e, r), [ones])
            _same(g, c, rtol=0, atol=0)
            g, c, _ = _on_both(lambda p, e=excl, r=rev: _core.scan("cumprod", p, 0, e, r), [signs])
            _same(g, c, rtol=0, atol=0)
    got = K.eval(K.cumsum(K.ones(n, dtype=dtype)))
    np.testing.assert_array_equal(got, np.arange(1, n + 1, dtype=dtype))


def test_batched_matmul_past_the_grid_limit(gpu, rng):
    # 70000 batch matrices: more than the 65535 workgroups a grid dimension may hold.
    a = rng.standard_normal((70000, 2, 3)).astype("float32")
    b = rng.standard_normal((70000, 3, 2)).astype("float32")
    g, c, _ = _on_both(lambda x, y: _core.matmul(x, y, False, False), [a, b])
    _same(g, c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g[0], np.einsum("bij,bjk->bik", a, b), rtol=1e-5, atol=1e-5)


def test_gpu_gather_error_names_the_index(gpu):
    p = K.placeholder(shape=(5, 2))
    i = K.placeholder(shape=(3,), dtype="int32")
    f = K.function([p, i], [_gather(p, i * 2)])  # the indices are computed on the device
    pv = np.arange(10, dtype="float32").reshape(5, 2)
    with pytest.raises(ValueError, match="gather: index 6 is out of range for an axis of size 5"):
        f([pv, np.array([0, 3, 1], "int32")])


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_no_stderr_output_without_a_display_session(device):
    # With no XDG_RUNTIME_DIR, probing Vulkan adapters used to make libwayland print an
    # error per probe; the CPU device probes nothing at all.
    if device == "gpu" and not GPUS:
        pytest.skip("no GPU adapter on this machine")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XDG_RUNTIME_DIR", "WAYLAND_DISPLAY", "WAYLAND_SOCKET", "NODEVICE_SELECT")
    }
    env.update(FERROKERAS_DEVICE=device, RUST_BACKTRACE="0")
    code = (
        "import ferrokeras, ferrokeras.backend as K, os; K.eval(K.ones(2)); "
        "print(ferrokeras.device(), 'NODEVICE_SELECT' in os.environ)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    assert r.stdout.split()[0].startswith(device), r.stdout
    assert r.stdout.split()[1] == "False", r.stdout


def test_reductions_along_axes_longer_than_a_shader_loop_may_run(gpu, rng):
    # Fed, not constants (a constant graph is folded on the host): argmax/argmin over 70001
    # steps (5 dispatches of one thread per output), and sum/max/mean over 17M elements,
    # 66407 steps for each thread of the workgroup tree.
    v = rng.standard_normal((2, 70001)).astype("float32")
    v[0, 70000] = 9.0
    v[1, 65536] = -9.0
    g, c, _ = _on_both(lambda p: [_core.arg("argmax", p, 1), _core.arg("argmin", p, 1)], [v])
    _same(g, c)
    assert g[0].tolist() == np.argmax(v, axis=1).tolist() and g[1][1] == 65536
    big = np.ones(17_000_000, dtype="float32")
    big[-3] = 5.0
    x = K.placeholder(shape=(None,))
    s, m, a, mean = K.function([x], [K.sum(x), K.max(x), K.argmax(x), K.mean(x)])([big])
    assert (float(s), float(m), int(a)) == (17_000_004.0, 5.0, 16_999_997)
    np.testing.assert_allclose(mean, 17_000_004 / 17_000_000, rtol=1e-6)


def test_matmul_with_a_contracted_dim_longer_than_a_shader_loop_may_run(gpu, rng):
    # K = 70000: three slices of the contracted dim, the later ones added to the first.
    a = rng.standard_normal((3, 70000)).astype("float32")
    b = rng.standard_normal((70000, 5)).astype("float32")
    g, c, _ = _on_both(lambda x, y: _core.matmul(x, y, False, False), [a, b])
    _same(g, c, rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(g[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-2)
    g, c, _ = _on_both(lambda x, y: _core.matmul(x, y, False, True), [a, b.T.copy()])
    _same(g, c, rtol=1e-4, atol=1e-2)


def test_convolutions_and_pools_with_very_long_windows(gpu, rng):
    # 3x3 taps over 8000 input channels (72000 products per output) and a 256x256 pooling
    # window: past what one shader invocation may loop over on llvmpipe, so these nodes run
    # their CPU kernel inside the GPU plan.
    x = rng.standard_normal((1, 3, 3, 8000)).astype("float32")
    w = rng.standard_normal((3, 3, 8000, 16)).astype("float32")
    xp, wp = K.placeholder(shape=x.shape), K.placeholder(shape=w.shape)
    f = K.function([xp, wp], [K.conv2d(xp, wp)])
    got = f([x, w])[0]
    want = np.einsum("hwc,hwco->o", x[0].astype(np.float64), w)
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-4, atol=1e-2)
    img = rng.uniform(size=(1, 256, 256, 1)).astype("float32")
    ip = K.placeholder(shape=img.shape)
    mean, top = K.function(
        [ip], [K.pool2d(ip, (256, 256), pool_mode="avg"), K.pool2d(ip, (256, 256))]
    )([img])
    np.testing.assert_allclose(mean.reshape(()), img.mean(dtype=np.float64), rtol=1e-5)
    assert top.reshape(()) == img.max()
