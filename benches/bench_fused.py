"""Batch norm in training with relu6 (MobileNetV2's `BatchNormalization` + `ReLU(6.)`) and
its gradient at the model's activation shapes: each fused group's time per element.

    RAYON_NUM_THREADS=1 .venv/bin/python benches/bench_fused.py
    .venv/bin/python benches/bench_fused.py --shapes 8x64x64x96 --calls 20
    .venv/bin/python benches/bench_fused.py --python /other/worktree/python   # another build

Per shape, one `K.function` is a training step's share of one block: `x` through
`normalize_batch_in_training`, the scale and shift, `relu(max_value=6)` and a 1x1
convolution (which the elementwise groups cannot fuse across, as in the model), and the
gradients of `sum(z * gz)` with respect to `x`, gamma, beta and the kernel. Each schedule
item is timed with `ferrokeras.profile` over `--calls` calls (after two warm-ups): the
table gives every fused group and `mean` of the step, its median ms per call and ns per
element of the activation, and the step's process CPU time per call. The NumPy column is
the batch norm + relu6 forward and backward arithmetic written as NumPy passes, for scale;
the results are checked against it.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "ferrokeras.backend")

# MobileNetV2 at 128x128, batch 8: the expanded activations (batch norm + relu6) by shape.
SHAPES = ["8x64x64x96", "8x32x32x144", "8x16x16x192", "8x8x8x384", "8x4x4x960"]
EPS = 1e-3
AXES = (0, 1, 2)


def numpy_step(x, gamma, beta, w, gz):
    """The function's outputs in NumPy: z and the gradients (x, gamma, beta, kernel)."""
    n = x.size // x.shape[-1]
    m = x.mean(axis=AXES, keepdims=True)
    c = x - m
    v = np.square(c).mean(axis=AXES, keepdims=True)
    r = 1 / np.sqrt(v + EPS)
    xh = c * r
    pre = xh * gamma + beta
    y = np.minimum(np.maximum(pre, 0), 6)
    z = y @ w
    gy = gz @ w.T
    g = np.where((pre > 0) & (pre < 6), gy, 0)
    dbeta = g.sum(axis=AXES)
    dgamma = (g * xh).sum(axis=AXES)
    dx = (gamma * r / n) * (n * g - dbeta - xh * dgamma)
    dw = y.reshape(-1, y.shape[-1]).T @ gz.reshape(-1, gz.shape[-1])
    return z, dx, dgamma, dbeta, dw


def build(K, shape, rng):
    c = shape[-1]
    x = K.placeholder(shape=shape)
    gz = K.placeholder(shape=shape[:-1] + (c // 2,))
    gamma = K.variable(rng.uniform(0.5, 1.5, c).astype("float32"))
    beta = K.variable(rng.uniform(-0.5, 0.5, c).astype("float32"))
    w = K.variable((rng.standard_normal((1, 1, c, c // 2)) / np.sqrt(c)).astype("float32"))
    normed, _, _ = K.normalize_batch_in_training(x, gamma, beta, list(AXES), epsilon=EPS)
    z = K.conv2d(K.relu(normed, max_value=6.0), w)
    grads = K.gradients(K.sum(z * gz), [x, gamma, beta, w])
    f = K.function([x, gz], [z] + grads, name="bn_relu6_step")
    return f, [K.eval(v) for v in (gamma, beta, w)]


def spans(f, feeds, calls):
    """Median ms per call of each fused group and mean, by members; process CPU per call."""
    import ferrokeras

    path = os.path.join(tempfile.mkdtemp(), "t.json")
    with ferrokeras.profile(path):
        t0 = time.process_time()
        for _ in range(calls):
            f(feeds)
        cpu = (time.process_time() - t0) / calls
    per = defaultdict(lambda: defaultdict(float))
    for e in json.load(open(path))["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in ("fused", "op"):
            continue
        a = e.get("args", {})
        name = "+".join(a["members"]) if e.get("cat") == "fused" else e["name"]
        if e.get("cat") == "op" and name not in ("mean", "sum_to", "sum"):
            continue
        per[name][e["ts"] // 1] += 0  # keep the key
        per[name]["_t"] += e["dur"] / 1e3
    os.remove(path)
    return {k: v["_t"] / calls for k, v in per.items()}, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="median over rounds of --calls")
    ap.add_argument("--python", default=os.path.join(ROOT, "python"), help="the build to run")
    args = ap.parse_args()
    sys.path.insert(0, args.python)
    from ferrokeras import backend as K

    rng = np.random.default_rng(0)
    total = defaultdict(float)
    for s in args.shapes.split(","):
        shape = tuple(int(d) for d in s.split("x"))
        f, (g, b, w) = build(K, shape, rng)
        x = rng.standard_normal(shape).astype("float32") * 2 + 0.5
        gz = rng.standard_normal(shape[:-1] + (shape[-1] // 2,)).astype("float32")
        n = x.size
        out = f([x, gz])
        ref = numpy_step(x, g, b, w[0, 0], gz)
        err = max(np.abs(o - r).max() / (np.abs(r).max() + 1e-6) for o, r in zip(out, ref))
        f([x, gz])
        rounds = [spans(f, [x, gz], args.calls) for _ in range(args.rounds)]
        cpu = statistics.median(r[1] for r in rounds)
        t0 = time.process_time()
        for _ in range(3):
            numpy_step(x, g, b, w[0, 0], gz)
        tn = (time.process_time() - t0) / 3
        print(f"{s}: step {cpu * 1e3:.2f} ms of CPU, NumPy {tn * 1e3:.2f}, max rel err {err:.1e}")
        groups = sorted(rounds[0][0], key=lambda k: -rounds[0][0][k])
        fused = 0.0
        for k in groups:
            t = statistics.median(r[0].get(k, 0.0) for r in rounds)
            fused += t
            total[k] += t
            print(f"  {t:8.3f} ms {t / n * 1e6:6.2f} ns/elt  {k}")
        print(f"  {fused:8.3f} ms {fused / n * 1e6:6.2f} ns/elt  (these together)")
        total["(these together)"] += fused
    if len(args.shapes.split(",")) > 1:
        print("all shapes:")
        for k, t in sorted(total.items(), key=lambda kv: -kv[1]):
            print(f"  {t:8.3f} ms  {k}")


if __name__ == "__main__":
    main()
