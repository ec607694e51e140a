"""ferrokeras.distributed under real MPI: each test launches `mpiexec -n N python <script>`
(scripts in tests/distributed/) with a timeout and checks what the ranks print and save.

The scripts run on the device this pass of the suite runs on (FERROKERAS_DEVICE is
inherited). mpiexec comes from the same environment as this Python (`pip install
mpich mpi4py`, the `mpi` extra) or from PATH.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parent / "distributed"
ROOT = Path(__file__).resolve().parent.parent


def _mpiexec():
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.fail('mpiexec not found: pip install "ferrokeras[mpi]" (mpich and mpi4py)')
    return found


def launch(n, script, *args, timeout=120, env=None):
    """Runs `script` on `n` ranks (plain python when n is None), with `env` added to the
    environment; returns (returncode, combined output, seconds)."""
    cmd = [sys.executable, str(script), *map(str, args)]
    if n is not None:
        cmd = [_mpiexec(), "-n", str(n)] + cmd
    env = dict(os.environ, KERAS_BACKEND="ferrokeras.backend", PYTHONUNBUFFERED="1", **(env or {}))
    src = str(ROOT / "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not end within {timeout} s:\n{out}")
    return proc.returncode, out, time.monotonic() - start


@pytest.mark.parametrize("n", [2, 3])
def test_collectives(n):
    # allreduce sums exactly, allgather/broadcast, graph ops and their gradients,
    # broadcast of variables, the packed gradient average with and without chunks.
    os.environ["EXPECTED_SIZE"] = str(n)
    try:
        rc, out, _ = launch(n, SCRIPTS / "collectives.py")
    finally:
        del os.environ["EXPECTED_SIZE"]
    assert rc == 0, out
    for r in range(n):
        assert f"COLLECTIVES OK {r}" in out, out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The Keras script on 2 ranks and on one process; what each rank saved."""
    tmp = tmp_path_factory.mktemp("dist")
    rc, out, _ = launch(2, SCRIPTS / "train_keras.py", tmp / "two")
    assert rc == 0, out
    rc, out1, _ = launch(None, SCRIPTS / "train_keras.py", tmp / "one")
    assert rc == 0, out1
    load = lambda p: dict(np.load(p))
    return load(tmp / "two.rank0.npz"), load(tmp / "two.rank1.npz"), load(tmp / "one.rank0.npz")


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_two_ranks_on_halves_match_one_process_on_the_batch(trained, opt):
    r0, r1, single = trained
    weights = sorted(k for k in single if k.startswith(f"{opt}_w"))
    assert len(weights) == 4
    for k in weights:
        # Broadcast then identical averaged steps: the ranks agree bit for bit.
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
        np.testing.assert_allclose(r0[k], single[k], rtol=1e-4, atol=2e-5, err_msg=k)
        assert np.abs(r0[k] - single[k]).max() < 1e-2 * np.abs(single[k]).max()
    # One gradient collective per training step.
    assert r0[f"{opt}_collectives"] == r0[f"{opt}_steps"] == 18


def test_fp16_compression_trains_as_the_exact_average_within_float16(trained):
    # Two ranks with hvd.Compression.fp16 against one process training on whole batches
    # (with one rank nothing is compressed): the ranks agree bit for bit, the weights
    # are the exact ones within what float16 gradients change over 18 Adam steps, and
    # training converges as the exact run does.
    r0, r1, single = trained
    for i in range(4):
        w16, w1, w2 = r0[f"adam_fp16_w{i}"], single[f"adam_w{i}"], r0[f"adam_w{i}"]
        np.testing.assert_array_equal(w16, r1[f"adam_fp16_w{i}"])
        np.testing.assert_allclose(w16, w1, rtol=0, atol=5e-4)
        assert not np.array_equal(w16, w2)  # float16 on the wire, not float32
    loss16, loss = r0["adam_fp16_loss"], single["adam_loss"]
    assert loss16[-1] < 0.9 * loss16[0], loss16
    np.testing.assert_allclose(loss16, loss, rtol=1e-3)
    assert r0["adam_fp16_collectives"] == r0["adam_fp16_steps"] == 18
    # Saved with the compressed optimizer, loaded by plain Keras (train_keras.py checks
    # the class and the weights), with its step count.
    assert r0["fp16_loaded_iterations"] == 18


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_averaged_metrics_are_the_global_metrics(trained, opt):
    r0, r1, single = trained
    for m in ("loss", "accuracy"):
        key = f"{opt}_{m}"
        np.testing.assert_array_equal(r0[key], r1[key])
        np.testing.assert_allclose(r0[key], single[key], rtol=1e-4, atol=1e-5)


def test_one_node_per_step_on_the_gpu(trained):
    import ferrokeras

    r0, _, single = trained
    if not ferrokeras.device().startswith("gpu"):
        # On the CPU every node runs on the host; the count of collectives per step
        # (test above) is the check there.
        assert r0["adam_host_nodes"] == single["adam_host_nodes"] == 0
        return
    for opt in ("sgd", "adam", "adam_fp16"):
        # The callback node and the read of its result; one more readback per step.
        assert r0[f"{opt}_host_nodes"] == single[f"{opt}_host_nodes"] + 2
        assert r0[f"{opt}_submits"] == single[f"{opt}_submits"] + 1


def test_save_and_load_on_rank_0(trained):
    r0, r1, single = trained
    # train_keras.py asserts that the model saved with DistributedOptimizer loads as a
    # plain keras.optimizers.Adam with the same weights; its step count came back too.
    assert r0["loaded_iterations"] == 18
    assert "loaded_iterations" not in r1
    # hvd.load_model on every rank: the state comes back, the ranks train on in step.
    for r in (r0, r1):
        assert r["resumed_iterations"] == 18
        assert r["resumed_collectives"] == 6
    np.testing.assert_array_equal(r0["resumed_w0"], r1["resumed_w0"])
    np.testing.assert_allclose(r0["resumed_w0"], single["resumed_w0"], rtol=1e-4, atol=2e-5)


def test_learning_rate_warmup(trained):
    r0, r1, single = trained
    for run, size in ((r0, 2), (single, 1)):
        lr = run["warmup_lr"]
        epoch = np.arange(9) / 3.0
        expect = np.where(epoch < 2, 0.1 * (epoch * (size - 1) / 2 + 1) / size, 0.1)
        np.testing.assert_allclose(lr, expect, rtol=1e-6)
        assert run["momentum_after"] == pytest.approx(0.5)
    # Momentum correction: scaled by new_lr / old_lr on the batches where the rate moved
    # within the warm-up (from 0.1 to 0.05 on the first), restored after each batch.
    lr, momentum = r0["warmup_lr"], r0["warmup_momentum"]
    np.testing.assert_allclose(momentum[0], 0.5 * lr[0] / 0.1, rtol=1e-6)
    np.testing.assert_allclose(momentum[1:6], 0.5 * lr[1:6] / lr[0:5], rtol=1e-6)
    np.testing.assert_allclose(momentum[6:], 0.5, rtol=1e-6)
    # LearningRateScheduleCallback: 0.1 * 0.5 ** epoch on epochs 1 and 2, then left alone.
    for run in (r0, r1, single):
        expect = np.repeat([0.1, 0.05, 0.025, 0.025], 3)
        np.testing.assert_allclose(run["schedule_lr"], expect, rtol=1e-6)


@pytest.mark.parametrize("flags", [[], ["--fp16"]])
def test_example_distributed_digits(tmp_path, flags):
    ckpt = tmp_path / "digits.h5"
    example = ROOT / "examples" / "distributed_digits.py"
    args = ["--epochs", "4", "--checkpoint", ckpt, *flags]
    rc, out, _ = launch(2, example, *args, timeout=240)
    assert rc == 0, out
    assert ckpt.exists(), out
    line = [ln for ln in out.splitlines() if ln.startswith("test accuracy")]
    assert len(line) == 1, out  # printed by rank 0 only
    assert float(line[0].split()[-1]) > 0.85, out


@pytest.mark.parametrize(
    "case,named",
    [("mismatch", "dense_1/kernel float32[8, 6]"), ("window", "FERROKERAS_DIST_SHM_BYTES=0")],
    ids=["layouts", "window_settings"],
)
def test_mismatched_ranks_raise_on_every_rank(case, named):
    # Ranks whose gradient layouts differ, or that would size the shared-memory window
    # differently (hence allocate it at different steps), disagree at the first gradient
    # average instead of waiting; every rank's error names rank 1's side.
    rc, out, seconds = launch(2, SCRIPTS / "faults.py", case, timeout=60)
    assert rc == 0, out
    for r in (0, 1):
        assert f"CAUGHT rank {r}: the ranks are at different collectives" in out, out
    assert out.count(named) == 2, out
    assert seconds < 30


@pytest.mark.parametrize("n", [2, 3])
def test_exception_on_one_rank_ends_the_job(n):
    rc, out, seconds = launch(n, SCRIPTS / "faults.py", "raise", timeout=60)
    assert rc != 0, out
    assert "FINISHED" not in out, out
    assert f"rank 1 of {n}: uncaught exception, aborting the job" in out, out
    for r in range(n):
        if r != 1:
            assert f"rank {r} of {n}: stopping because another rank failed" in out, out
    # Rank 1's error, printed by rank 1 and again by every other rank.
    assert out.count("ValueError: deliberate failure on rank 1 at batch 2") >= n, out
    assert seconds < 30, out


def test_rank_out_of_data_fails_the_others():
    rc, out, seconds = launch(2, SCRIPTS / "faults.py", "outofdata", timeout=60)
    assert rc != 0, out
    assert "FINISHED rank 0" not in out, out
    assert "rank 1: exit #1" in out and "rank 0: gradient allreduce" in out, out
    assert "ran out of data" in out, out
    assert seconds < 30, out


def test_a_stalled_rank_times_out_when_asked():
    # Without FERROKERAS_DIST_TIMEOUT a rank waits as long as the others need (with a
    # warning after FERROKERAS_DIST_STALL_WARNING seconds); with it, it gives up.
    env = {"FERROKERAS_DIST_TIMEOUT": "1", "FERROKERAS_DIST_ABORT_GRACE": "1"}
    rc, out, seconds = launch(2, SCRIPTS / "faults.py", "timeout", timeout=60, env=env)
    assert rc != 0, out
    assert "rank 0: waited 1 s at gradient allreduce" in out, out
    assert seconds < 20, out  # rank 1 would sleep 30 s


def test_shard():
    import ferrokeras.distributed as hvd

    x = np.arange(11)
    y = np.arange(11) * 10
    parts = [hvd.shard(x, y, rank=r, size=3) for r in range(3)]
    assert [len(p[0]) for p in parts] == [3, 3, 3]
    np.testing.assert_array_equal(np.sort(np.concatenate([p[0] for p in parts])), np.arange(9))
    for px, py in parts:
        np.testing.assert_array_equal(py, px * 10)
    uneven = [hvd.shard(x, rank=r, size=3, drop_remainder=False) for r in range(3)]
    assert [len(p) for p in uneven] == [4, 4, 3]
    with pytest.raises(ValueError, match="differ in length"):
        hvd.shard(x, y[:5], rank=0, size=2)
    with pytest.raises(ValueError, match="rank must be in"):
        hvd.shard(x, rank=3, size=3)


class _Identity:
    """A host callback that returns its input (the gradient node's shape contract)."""

    def call(self, arrays):
        return [np.array(arrays[0])]

    def vjp(self, arrays, grads):
        return [np.array(grads[0])]


@pytest.mark.parametrize("static", [True, False])
def test_callbacks_with_static_results_keep_plans_specialised(static):
    # The gradient average is a host callback whose results have static shapes; a CPU
    # training step with it must still run the plan specialised to its feed shapes.
    import ferrokeras
    from ferrokeras import _core
    from ferrokeras import backend as K
    from ferrokeras.tensor import wrap

    if ferrokeras.device() != "cpu":
        pytest.skip("launch counts are those of the CPU executor")
    rng = np.random.default_rng(0)
    x = K.placeholder(shape=(None, 64))
    m = K.placeholder(shape=(None, 64))
    w = K.variable(rng.standard_normal((64, 64)).astype("float32") * 0.1)
    h = K.relu(K.dot(x, w)) * m
    (gw,) = K.gradients(K.sum(h * m), [w])
    shape = [64, 64] if static else [None, None]
    (summed,) = _core.host_call("identity", _Identity(), [gw._core], [(shape, "float32")])
    f = K.function([x, m], [wrap(summed) * 0.5])
    feeds = [rng.standard_normal((16, 64)).astype("float32"), np.ones((16, 64), "float32")]
    first = f(feeds)[0]
    generic = f.dispatches
    f(feeds)
    third = f(feeds)[0]
    np.testing.assert_array_equal(first, third)
    if static:
        assert f.dispatches < generic, (f.dispatches, generic)
    else:  # results of undeclared shapes: the generic plan, as before
        assert f.dispatches == generic
