"""GPU reliability: the buffer pool gives idle memory back, and device faults
(a tensor too large for the device, device loss, a shader that does not compile) are
Python exceptions after which the CPU, and a freshly opened GPU, keep working.

Every test switches to a GPU explicitly (and back afterwards), so the file runs the same
in the cpu and the gpu pass of `make test`. Without any GPU adapter the tests are skipped,
unless FERROKERAS_REQUIRE_GPU=1 (CI), which makes the absence a failure. Tests that break
the device (loss) or need fresh pool settings from the environment run in a subprocess.
References are NumPy.
"""

import gc
import os
import subprocess
import sys
import textwrap

import ferrokeras
import numpy as np
import pytest
from ferrokeras import _core
from ferrokeras import backend as K

GPUS = [d for d in ferrokeras.devices() if d["device"] != "cpu"]
REQUIRE = os.environ.get("FERROKERAS_REQUIRE_GPU", "") not in ("", "0")
MIB = 1 << 20


def _need_gpu():
    if not GPUS:
        if REQUIRE:
            pytest.fail("FERROKERAS_REQUIRE_GPU=1 but wgpu found no GPU adapter")
        pytest.skip("no GPU adapter on this machine")


@pytest.fixture
def gpu():
    """Runs the test on the first GPU adapter; restores the device and pool bounds after."""
    _need_gpu()
    before = ferrokeras.device()
    name = ferrokeras.set_device("gpu")
    assert name.startswith("gpu:")
    st = _core.gpu_pool_stats()
    yield name
    ferrokeras.set_device(name)
    _core.gpu_pool_limits(st["max_idle_bytes"], st["max_idle_submits"])
    ferrokeras.set_device(before)


def _script(code, **env):
    """Runs `code` in a fresh interpreter; returns its stdout (asserting exit status 0)."""
    _need_gpu()
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, **env),
    )
    assert r.returncode == 0, "exit %d\nstdout:\n%s\nstderr:\n%s" % (
        r.returncode,
        r.stdout,
        r.stderr,
    )
    return r.stdout


def _scale_fn(n):
    x = K.placeholder(shape=(n,))
    return K.function([x], [K.exp(x * 0.5) + 1.0, K.sum(x)])


# ---------------------------------------------------------------- buffer pool


def test_pool_stats_shape(gpu):
    st = _core.gpu_pool_stats()
    for k in (
        "pooled_bytes",
        "pooled_buffers",
        "live_bytes",
        "allocated_bytes",
        "allocations",
        "reuses",
        "released",
        "max_idle_bytes",
        "max_idle_submits",
    ):
        assert isinstance(st[k], int) and st[k] >= 0, (k, st)
    assert st["device"] == gpu
    assert st["allocated_bytes"] >= st["pooled_bytes"] + st["live_bytes"]
    ferrokeras.set_device("cpu")
    assert _core.gpu_pool_stats() is None


def test_steady_state_calls_allocate_no_buffers(gpu, rng):
    gc.collect()  # buffers of earlier tests' garbage go back
    _core.gpu_pool_clear()  # no idle buffers of earlier tests ageing out
    f = _scale_fn(1000)
    xv = rng.standard_normal(1000).astype("float32")
    for _ in range(3):
        f([xv])
    st0 = _core.gpu_pool_stats()
    for k in range(1000):
        a = xv + np.float32(k / 1000)
        y, s = f([a])
    st1 = _core.gpu_pool_stats()
    np.testing.assert_allclose(y, np.exp(a.astype(np.float64) * 0.5) + 1.0, rtol=1e-5)
    assert s == pytest.approx(float(np.sum(a.astype(np.float64))), rel=1e-4, abs=1e-3)
    assert st1["allocations"] == st0["allocations"], (st0, st1)
    # every call takes its buffers (feed, results, parameters, staging) from the pool
    assert st1["reuses"] - st0["reuses"] >= 3000, (st0, st1)
    # nothing more is kept idle (buffers returned by earlier tests' objects after the clear
    # may age out meanwhile)
    assert st1["pooled_bytes"] <= st0["pooled_bytes"], (st0, st1)


def test_idle_buffers_of_a_big_call_are_released_after_small_calls(gpu, rng):
    _core.gpu_pool_limits(max_idle_bytes=256 * MIB, max_idle_submits=40)
    big = _scale_fn(1 << 20)  # 4 MiB per tensor
    big([np.ones(1 << 20, "float32")])
    st_big = _core.gpu_pool_stats()
    assert st_big["pooled_bytes"] >= 8 * MIB, st_big
    small = _scale_fn(16)
    for _ in range(100):
        out = small([np.zeros(16, "float32")])
    np.testing.assert_allclose(out[0], np.full(16, 2.0))
    st = _core.gpu_pool_stats()
    assert st["pooled_bytes"] < 64 * 1024, st
    assert st["released"] > st_big["released"], (st_big, st)
    assert st["allocated_bytes"] < st_big["allocated_bytes"] - 8 * MIB, (st_big, st)


def test_idle_bytes_stay_under_the_bound(gpu):
    _core.gpu_pool_limits(max_idle_bytes=1 * MIB)
    st = _core.gpu_pool_stats()
    assert st["max_idle_bytes"] == MIB and st["pooled_bytes"] <= MIB, st
    big = _scale_fn(1 << 20)
    small = _scale_fn(100)
    for _ in range(3):
        y = big([np.full(1 << 20, 2.0, "float32")])[0]
        st = _core.gpu_pool_stats()
        assert st["pooled_bytes"] <= MIB, st
        for _ in range(20):
            small([np.zeros(100, "float32")])
            st = _core.gpu_pool_stats()
            assert st["pooled_bytes"] <= MIB, st
    np.testing.assert_allclose(y[:5], np.full(5, np.e + 1.0), rtol=1e-6)


def test_pool_bound_from_the_environment():
    out = _script(
        """
        import numpy as np, ferrokeras
        from ferrokeras import _core, backend as K
        ferrokeras.set_device("gpu")
        st = _core.gpu_pool_stats()
        print("BOUNDS", st["max_idle_bytes"], st["max_idle_submits"])
        x = K.placeholder(shape=(1 << 21,))
        K.function([x], [x * 2.0, x + 1.0])([np.ones(1 << 21, "float32")])
        print("POOLED", _core.gpu_pool_stats()["pooled_bytes"])
    """,
        FERROKERAS_GPU_POOL_MAX_IDLE_MB="3",
        FERROKERAS_GPU_POOL_MAX_IDLE_SUBMITS="77",
    )
    assert "BOUNDS %d 77" % (3 * MIB) in out, out
    pooled = int(out.split("POOLED")[1])
    assert pooled <= 3 * MIB, out


def test_clear_session_empties_the_pool_and_keeps_held_variables(gpu, rng):
    init = rng.standard_normal((64, 64)).astype("float32")
    v = K.variable(init)
    step = K.function([], [K.sum(v)], updates=[(v, v * 2.0)])
    f = _scale_fn(4096)
    f([np.ones(4096, "float32")])
    step([])
    assert v._var.on_device()
    st = _core.gpu_pool_stats()
    assert st["pooled_buffers"] > 0 and st["pooled_bytes"] > 0, st
    K.clear_session()
    st = _core.gpu_pool_stats()
    assert st["pooled_buffers"] == 0 and st["pooled_bytes"] == 0, st
    assert st["live_bytes"] >= init.nbytes  # the variable's buffer is still held
    np.testing.assert_allclose(K.get_value(v), init * 2.0, rtol=1e-6)
    step([])
    np.testing.assert_allclose(K.get_value(v), init * 4.0, rtol=1e-6)
    np.testing.assert_allclose(f([np.zeros(4096, "float32")])[0], np.full(4096, 2.0))


# ---------------------------------------------------------------- faults


def test_tensor_over_the_device_limits_is_a_device_error(gpu):
    """No host array is involved: the tensor is made on the device, so only the device's
    limit can refuse it. The message names the size, the tensor and the way out."""
    n = 1 << 16
    huge = K.random_uniform((n, n), seed=1)  # 16 GiB of float32
    with pytest.raises(ferrokeras.DeviceError) as e:
        K.eval(K.sum(huge))
    msg = str(e.value)
    assert str(4 * n * n) in msg and "random_uniform" in msg and "[%d, %d]" % (n, n) in msg, msg
    assert "set_device('cpu')" in msg, msg
    # the GPU and the CPU both still work
    x = K.placeholder(shape=(3,))
    f = K.function([x], [K.square(x)])
    np.testing.assert_allclose(f([np.array([1, 2, 3], "float32")])[0], [1, 4, 9])
    ferrokeras.set_device("cpu")
    np.testing.assert_allclose(f([np.array([1, 2, 4], "float32")])[0], [1, 4, 16])


def test_feed_over_the_binding_limit_is_a_device_error():
    out = _script(
        """
        import numpy as np, ferrokeras
        from ferrokeras import backend as K
        ferrokeras.set_device("gpu")
        x = K.placeholder(shape=(None, 1000), name="big_feed")
        f = K.function([x], [K.sum(x * 2.0)])
        try:
            f([np.ones((600, 1000), "float32")])
            print("NO ERROR")
        except ferrokeras.DeviceError as e:
            print("ERR", e)
        print("SMALL", float(f([np.ones((10, 1000), "float32")])[0]))
        ferrokeras.set_device("cpu")
        print("CPU", float(f([np.ones((600, 1000), "float32")])[0]))
    """,
        FERROKERAS_GPU_MAX_BINDING=str(1 << 21),
    )
    assert "ERR" in out and "2400000-byte" in out and "big_feed" in out, out
    assert "SMALL 20000.0" in out and "CPU 1200000.0" in out, out


def test_device_loss_is_a_device_error_and_the_cpu_keeps_working():
    out = _script("""
        import numpy as np, ferrokeras
        from ferrokeras import _core, backend as K
        print("DEVICE", ferrokeras.set_device("gpu"))
        x = K.placeholder(shape=(4,))
        f = K.function([x], [K.exp(x) * 2.0])
        xv = np.arange(4, dtype="float32")
        print("BEFORE", f([xv])[0].tolist())
        v = K.variable(np.ones(4, "float32"))
        K.function([], [], updates=[(v, v + 1.0)])([])     # v now lives only on the GPU
        _core._debug_lose_gpu()
        for what, call in [("CALL", lambda: f([xv])), ("READ", lambda: K.get_value(v)),
                           ("EVAL", lambda: K.eval(K.constant([1.0]) + 1.0)),
                           ("WGSL", lambda: _core.compile_wgsl("@compute @workgroup_size(1) fn main() {}", "main"))]:
            try:
                call()
                print(what, "NO ERROR")
            except ferrokeras.DeviceError as e:
                print(what, "DeviceError", e)
        print("SWITCH", ferrokeras.set_device("cpu"))
        print("CPU", f([xv])[0].tolist())
        w = K.variable(np.full(4, 3.0, "float32"))
        K.function([], [], updates=[(w, w * 2.0)])([])
        print("CPUVAR", K.get_value(w).tolist())
        print("AGAIN", ferrokeras.set_device("gpu"))
        print("GPU", f([xv])[0].tolist())
        K.function([], [], updates=[(w, w * 2.0)])([])
        print("GPUVAR", K.get_value(w).tolist())
    """)
    want = (np.exp(np.arange(4, dtype=np.float32)) * 2.0).astype(np.float32)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    before = np.array(eval(lines["BEFORE"]))
    np.testing.assert_allclose(before, want, rtol=1e-6)
    for what in ("CALL", "READ", "EVAL", "WGSL"):
        assert lines[what].startswith("DeviceError") and "lost" in lines[what], out
    assert lines["SWITCH"] == "cpu"
    np.testing.assert_allclose(np.array(eval(lines["CPU"])), want, rtol=1e-6)
    assert eval(lines["CPUVAR"]) == [6.0] * 4
    assert lines["AGAIN"].startswith("gpu:")
    np.testing.assert_allclose(np.array(eval(lines["GPU"])), want, rtol=1e-6)
    assert eval(lines["GPUVAR"]) == [12.0] * 4


BAD_WGSL = [
    # (case, source, words of the naga message)
    ("syntax", "@compute @workgroup_size(1) fn main() { let x: u32 = -; }", ("expected", "-")),
    ("types", "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }", ("u32", "abstract")),
    (
        "binding",
        "@group(0) @binding(0) var<storage, read_write> b: array<f32>;\n"
        "@compute @workgroup_size(1) fn main() { b[0] = undefined_name; }",
        ("undefined_name",),
    ),
    ("entry", "// entry case\n@compute @workgroup_size(1) fn main() { }", ("not_there",)),
]


@pytest.mark.parametrize("case,src,words", BAD_WGSL, ids=[c[0] for c in BAD_WGSL])
def test_shader_compile_failure_is_a_device_error_with_the_naga_message(gpu, case, src, words):
    entry = "not_there" if case == "entry" else "main"
    compiled = _core.device_stats()[2]
    for _ in range(2):  # a failure is not cached as a pipeline
        with pytest.raises(ferrokeras.DeviceError) as e:
            _core.compile_wgsl(src, entry)
        msg = str(e.value)
        assert "shader compile failed" in msg and entry in msg, msg
        assert any(w in msg for w in words), msg
    assert _core.device_stats()[2] == compiled
    _core.compile_wgsl(f"// after {case}\n@compute @workgroup_size(1) fn main() {{ }}", "main")
    assert _core.device_stats()[2] == compiled + 1
    x = K.placeholder(shape=(3,))
    np.testing.assert_allclose(
        K.function([x], [K.tanh(x) * 2.0])([np.zeros(3, "float32")])[0], [0, 0, 0]
    )


# ---------------------------------------------------------------- concurrency


def test_four_threads_on_the_gpu_check_every_result(gpu):
    """4 threads x 250 calls of one function with updates and one without, on the GPU;
    every result is checked and no increment is lost."""
    import threading

    x = K.placeholder(shape=(None, 5))
    w = K.variable(np.linspace(-1, 1, 15).reshape(5, 3))
    count = K.variable(0.0)
    f = K.function([x], [K.dot(x, w) + 1.0, K.max(x, axis=1)])
    bump = K.function([x], [K.sum(x)], updates=[K.update_add(count, 1.0)])
    wv = K.get_value(w).astype(np.float64)
    errors, done = [], [0] * 4

    def work(i):
        try:
            rng = np.random.default_rng(i)
            for k in range(250):
                a = rng.normal(size=(1 + (k + i) % 7, 5)).astype(np.float32)
                y, m = f([a])
                np.testing.assert_allclose(y, a.astype(np.float64) @ wv + 1.0, rtol=1e-5, atol=1e-5)
                np.testing.assert_array_equal(m, a.max(axis=1))
                assert float(bump([a])[0]) == pytest.approx(float(a.sum()), rel=1e-5, abs=1e-5)
                done[i] += 1
        except Exception as e:  # re-raised in the main thread
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    if errors:
        raise errors[0]
    assert done == [250] * 4
    assert float(K.get_value(count)) == 1000.0
