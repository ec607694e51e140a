"""3x3 convolution, 64 -> 64 channels, 56x56, batch 32, float32, `same` padding: forward
and forward+backward (gradients w.r.t. input and kernel), ferrokeras vs TensorFlow CPU
(oneDNN) vs PyTorch CPU, side by side in one run.

    make bench-conv            # creates the tf and torch venvs of benches/.venvs on first use
    python benches/bench_conv.py [--repeat N] [--batch N]

Each framework runs in its own process (the peers from their own virtual environments),
on the same input and kernel, with every thread it wants on this machine; the table
gives the median wall time of `--repeat` timed calls after two warm-up calls. The driver
also checks that the peers' outputs and gradients agree with ferrokeras's, so the
figures compare the same computation.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# The peer venvs `make bench` creates (benches/.venvs/<peer>); another directory of them
# with FERROKERAS_BENCH_VENVS.
VENVS = os.environ.get("FERROKERAS_BENCH_VENVS", os.path.join(HERE, ".venvs"))
PEERS = {
    "tensorflow": os.path.join(VENVS, "tf", "bin", "python"),
    "torch": os.path.join(VENVS, "torch", "bin", "python"),
}


def timed(fn, repeat):
    """Median wall ms of `repeat` calls after two warm-ups; CPU ms (all threads) of the
    same calls are kept in CPU_MS, a figure less disturbed by other load on the machine."""
    fn()
    fn()
    ts, cs = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(time.process_time() - c0)
    CPU_MS.append(float(np.median(cs)) * 1e3)
    return float(np.median(ts)) * 1e3


CPU_MS = []


# ---------------------------------------------------------------- workers


def run_ferrokeras(x, k, repeat, out):
    from ferrokeras import backend as K

    xv, kv = K.variable(x), K.variable(k)
    y = K.conv2d(xv, kv, padding="same")
    dx, dk = K.gradients(K.sum(y), [xv, kv])
    fwd = K.function([], [y])
    both = K.function([], [y, dx, dk])
    res = {
        "forward": timed(lambda: fwd([]), repeat),
        "forward+backward": timed(lambda: both([]), repeat),
    }
    np.savez(out, *both([]))
    return res


def run_tensorflow(x, k, repeat, out):
    import tensorflow as tf

    xv, kv = tf.Variable(x), tf.Variable(k)

    @tf.function
    def fwd():
        return tf.nn.conv2d(xv, kv, 1, "SAME")

    @tf.function
    def both():
        with tf.GradientTape() as tape:
            y = tf.nn.conv2d(xv, kv, 1, "SAME")
            loss = tf.reduce_sum(y)
        dx, dk = tape.gradient(loss, [xv, kv])
        return y, dx, dk

    res = {"forward": timed(fwd, repeat), "forward+backward": timed(both, repeat)}
    res["version"] = tf.__version__
    np.savez(out, *[t.numpy() for t in both()])
    return res


def run_torch(x, k, repeat, out, channels_last=False):
    import torch

    torch.set_num_threads(os.cpu_count())
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).requires_grad_(
        True
    )  # NCHW
    kt = torch.from_numpy(np.ascontiguousarray(k.transpose(3, 2, 0, 1))).requires_grad_(
        True
    )  # OIHW
    if channels_last:
        xt = xt.detach().to(memory_format=torch.channels_last).requires_grad_(True)
        kt = kt.detach().to(memory_format=torch.channels_last).requires_grad_(True)

    def fwd():
        with torch.no_grad():
            return torch.nn.functional.conv2d(xt, kt, padding=1)

    def both():
        y = torch.nn.functional.conv2d(xt, kt, padding=1)
        dx, dk = torch.autograd.grad(y.sum(), [xt, kt])
        return y, dx, dk

    res = {
        "forward": timed(fwd, repeat),
        "forward+backward": timed(both, repeat),
        "version": torch.__version__,
    }
    y, dx, dk = both()
    np.savez(
        out,
        y.detach().numpy().transpose(0, 2, 3, 1),
        dx.numpy().transpose(0, 2, 3, 1),
        dk.numpy().transpose(2, 3, 1, 0),
    )
    return res


WORKERS = {
    "ferrokeras": run_ferrokeras,
    "tensorflow": run_tensorflow,
    "torch": run_torch,
    "torch-channels_last": lambda x, k, r, o: run_torch(x, k, r, o, channels_last=True),
}


# ---------------------------------------------------------------- driver


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--worker")
    ap.add_argument("--dir")
    a = ap.parse_args()
    if a.worker:
        data = np.load(os.path.join(a.dir, "inputs.npz"))
        res = WORKERS[a.worker](
            data["x"], data["k"], a.repeat, os.path.join(a.dir, a.worker + ".npz")
        )
        res["cpu"] = {"forward": CPU_MS[0], "forward+backward": CPU_MS[1]}
        print("RESULT " + json.dumps(res))
        return

    load0 = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.batch, 56, 56, 64), dtype=np.float32)
    k = (rng.standard_normal((3, 3, 64, 64), dtype=np.float32) / 24).astype(np.float32)
    flops = 2 * x.shape[0] * 56 * 56 * 64 * 64 * 9
    with tempfile.TemporaryDirectory() as d:
        np.savez(os.path.join(d, "inputs.npz"), x=x, k=k)
        results = {}
        for name in WORKERS:
            py = sys.executable if name == "ferrokeras" else PEERS[name.split("-")[0]]
            if not os.path.exists(py):
                print(f"skipping {name}: {py} not found (run `make bench-conv`)")
                continue
            p = subprocess.run(
                [py, __file__, "--worker", name, "--dir", d, "--repeat", str(a.repeat)],
                capture_output=True,
                text=True,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
            )
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                print(f"{name} failed:\n{p.stderr[-2000:]}")
                continue
            results[name] = json.loads(line[0][7:])
        ref = np.load(os.path.join(d, "ferrokeras.npz")) if "ferrokeras" in results else None
        for name in results:
            if ref is None or name == "ferrokeras":
                continue
            got = np.load(os.path.join(d, name + ".npz"))
            errs = []
            for i in range(3):  # y, dx, dk
                r, g = ref[f"arr_{i}"], got[f"arr_{i}"]
                errs.append(float(np.max(np.abs(r - g)) / (np.max(np.abs(r)) + 1e-30)))
            results[name]["max_rel_err_vs_ferrokeras"] = max(errs)

    print(
        f"\nconv2d 3x3, {x.shape[0]}x56x56x64 -> 64, float32, padding=same, "
        f"{os.cpu_count()} CPU threads; median of {a.repeat}.\n"
        "ms = wall time per call, GF/s = direct-convolution FLOPs / wall time, "
        "ratio = peer / ferrokeras wall time (> 1: ferrokeras is faster),\n"
        "cpu = CPU ms per call over all threads (less sensitive to other load);\n"
        f"load average before the run: {load0:.2f}"
    )
    cols = ["forward", "forward+backward"]
    print(f"{'':22}" + "".join(f"{c + ' (ms GF/s ratio cpu)':>38}" for c in cols) + "   check")
    base = results.get("ferrokeras")
    for name, r in results.items():
        row = f"{name:22}"
        for c, mult in zip(cols, (1, 3)):
            ratio = f"x{r[c] / base[c]:.2f}" if base else ""
            row += f"{r[c]:>12.1f} {mult * flops / r[c] / 1e6:>8.0f} {ratio:>8} {r['cpu'][c]:>7.0f}"
        chk = r.get("max_rel_err_vs_ferrokeras")
        row += "   " + (
            "" if chk is None else f"max rel err {chk:.1e}" + ("" if chk < 1e-4 else "  MISMATCH")
        )
        print(row)
    if base:
        best = {
            c: min((r[c] for n, r in results.items() if n != "ferrokeras"), default=None)
            for c in cols
        }
        for c in cols:
            if best[c] is not None:
                print(
                    f"{c}: ferrokeras / fastest peer = {base[c] / best[c]:.2f} "
                    f"({'meets' if base[c] <= best[c] else 'misses'} "
                    "the target of at least the fastest peer)"
                )


if __name__ == "__main__":
    main()
