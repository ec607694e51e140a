"""Where ferrokeras' time goes in a Keras training step (the MLP and LSTM rows of bench_keras).

Three modes, all on ferrokeras through Keras 2.3.1 (run with the project venv):

    # 1. Split one training step into Keras/Python work and time inside the engine call.
    .venv/bin/python benches/profile_step.py breakdown --workload mlp

    # 2. Keep training for N seconds: a target for a sampling profiler.
    py-spy record --native --format raw -o /tmp/mlp.folded -- \\
        .venv/bin/python benches/profile_step.py train --workload mlp --seconds 20
    .venv/bin/python benches/profile_summary.py /tmp/mlp.folded

    # 3. Time single primitives at the shapes the workloads use, next to NumPy.
    .venv/bin/python benches/profile_step.py ops --workload mlp

docs/performance.md says what these find and how to read them.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
# NumPy's reference column in `ops` runs on one thread: OpenBLAS's spinning threads collapse
# (100x) on this 2-core machine when anything else runs. ferrokeras uses no OpenBLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import peer_worker as pw  # noqa: E402


def model_and_data(keras, workload, n_batches=8):
    np.random.seed(0)
    model, shape = pw.BUILDERS[workload](keras)
    batch = pw.TRAIN_SIZES[workload]["batch"]
    x, y = pw.synthetic(np, shape, batch * n_batches)
    return model, x, y, batch


def steady_state_fit(model, x, y, batch, seconds):
    """The profiled loop (profile_summary.py counts only stacks through this frame)."""
    t0 = time.perf_counter()
    steps = 0
    while time.perf_counter() - t0 < seconds:
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        steps += len(x) // batch
    return steps


def cmd_train(a):
    import keras

    model, x, y, batch = model_and_data(keras, a.workload)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # compile + warm-up
    t0 = time.perf_counter()
    steps = steady_state_fit(model, x, y, batch, a.seconds)
    dt = time.perf_counter() - t0
    print(
        f"{a.workload}: {steps} steps in {dt:.1f}s, {dt / steps * 1e3:.2f} ms/step, "
        f"{steps * batch / dt:,.0f} samples/s"
    )


def cmd_breakdown(a):
    """Times train_on_batch, and inside it the engine call (`_core.Function.__call__`)
    and ferrokeras' Python wrapper around it (argument checks, dtype conversion)."""
    import keras
    from ferrokeras._k import function as kf

    model, x, y, batch = model_and_data(keras, a.workload)
    model.train_on_batch(x[:batch], y[:batch])  # builds and compiles the train function
    acc = {"engine": 0.0, "wrapper": 0.0, "calls": 0}
    orig_call = kf.Function.__call__

    class Timed:
        def __init__(self, f):
            self.f = f

        def __call__(self, arrs):
            t = time.perf_counter()
            try:
                return self.f(arrs)
            finally:
                acc["engine"] += time.perf_counter() - t

    def wrapped(self, inputs=()):
        if not isinstance(self._f, Timed):
            self._f = Timed(self._f)
        t = time.perf_counter()
        try:
            return orig_call(self, inputs)
        finally:
            acc["wrapper"] += time.perf_counter() - t
            acc["calls"] += 1

    kf.Function.__call__ = wrapped
    nb = len(x) // batch
    for i in range(3):  # warm-up
        model.train_on_batch(x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch])
    step_times, engine, wrapper = [], [], []
    for _ in range(a.repeats):
        for k in acc:
            acc[k] = 0 if k == "calls" else 0.0
        t0 = time.perf_counter()
        for i in range(nb):
            model.train_on_batch(x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch])
        step_times.append((time.perf_counter() - t0) / nb)
        engine.append(acc["engine"] / nb)
        wrapper.append(acc["wrapper"] / nb)
    kf.Function.__call__ = orig_call
    f = model.train_function._f
    f = getattr(f, "f", f)
    st, en, wr = (statistics.median(v) * 1e3 for v in (step_times, engine, wrapper))
    print(f"{a.workload}: train_on_batch {st:.2f} ms/step (median of {a.repeats} x {nb} steps)")
    print(
        "  engine (_core.Function.__call__, feeds in, plan run, outputs out): "
        f"{en:.2f} ms  ({en / st:.0%})"
    )
    print(
        "  ferrokeras Function wrapper (Python, around the engine):            "
        f"{wr - en:.3f} ms  ({(wr - en) / st:.1%})"
    )
    print(
        "  Keras 2.3.1 train_on_batch (standardize data, slice, callbacks):    "
        f"{st - wr:.3f} ms  ({(st - wr) / st:.1%})"
    )
    print(f"  kernel launches per step (plan steps): {getattr(f, 'dispatches', '?')}")
    # fit() adds per-batch work of its own (shuffling, slicing, callbacks, progbar logs)
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    fit_step = (time.perf_counter() - t0) / nb * 1e3
    print(f"  for comparison, fit(): {fit_step:.2f} ms/step")


def k_timed(f, args, repeats=7):
    f(args)
    calls = 1
    t0 = time.perf_counter()
    f(args)
    one = time.perf_counter() - t0
    calls = int(max(3, min(2000, 0.05 / max(one, 1e-7))))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            f(args)
        out.append((time.perf_counter() - t0) / calls)
    return statistics.median(out)


def np_timed(fn, repeats=7):
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    calls = int(max(3, min(2000, 0.05 / max(one, 1e-7))))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return statistics.median(out)


def cmd_ops(a):
    """Single primitives through K.function at the workload's shapes, next to NumPy."""
    from ferrokeras import backend as K

    rng = np.random.default_rng(0)
    B = pw.TRAIN_SIZES[a.workload]["batch"]
    rows = []

    def gemm(m, k, n, ta=False, tb=False, note=""):
        av = rng.standard_normal((k, m) if ta else (m, k)).astype("float32")
        bv = rng.standard_normal((n, k) if tb else (k, n)).astype("float32")
        pa, pb = K.placeholder(shape=av.shape), K.placeholder(shape=bv.shape)
        ea = K.transpose(pa) if ta else pa
        eb = K.transpose(pb) if tb else pb
        f = K.function([pa, pb], [K.dot(ea, eb)])
        t = k_timed(f, [av, bv])
        an = av.T if ta else av
        bn = bv.T if tb else bv
        tn = np_timed(lambda: an @ bn)
        fl = 2.0 * m * n * k
        rows.append(
            (
                f"gemm {m}x{k} @ {k}x{n}{' ' + note if note else ''}",
                t,
                tn,
                f"{fl / t / 1e9:.1f} vs {fl / tn / 1e9:.1f} GFLOP/s",
            )
        )

    def unary(name, shape, kfn, nfn):
        xv = rng.standard_normal(shape).astype("float32")
        p = K.placeholder(shape=shape)
        f = K.function([p], [kfn(p)])
        t = k_timed(f, [xv])
        tn = np_timed(lambda: nfn(xv))
        n = int(np.prod(shape))
        rows.append(
            (
                f"{name} {'x'.join(map(str, shape))}",
                t,
                tn,
                f"{t / n * 1e9:.2f} vs {tn / n * 1e9:.2f} ns/elem",
            )
        )

    def binary(name, sa, sb, kfn, nfn):
        av = rng.standard_normal(sa).astype("float32")
        bv = rng.standard_normal(sb).astype("float32")
        pa, pb = K.placeholder(shape=sa), K.placeholder(shape=sb)
        f = K.function([pa, pb], [kfn(pa, pb)])
        t = k_timed(f, [av, bv])
        tn = np_timed(lambda: nfn(av, bv))
        n = int(np.prod(np.broadcast_shapes(sa, sb)))
        rows.append(
            (
                f"{name} {'x'.join(map(str, sa))}, {'x'.join(map(str, sb))}",
                t,
                tn,
                f"{t / n * 1e9:.2f} vs {tn / n * 1e9:.2f} ns/elem",
            )
        )

    # the fixed cost every row below includes
    unary("identity (K.function floor)", (1,), lambda x: x * 1.0, lambda x: x * 1.0)
    if a.workload == "mlp":
        gemm(B, 784, 512, note="(fwd layer 1)")
        gemm(B, 512, 512, note="(fwd layer 2)")
        gemm(B, 512, 10, note="(fwd layer 3)")
        gemm(784, B, 512, ta=True, note="(dW1 = x^T g)")
        gemm(512, B, 512, ta=True, note="(dW2 = h^T g)")
        gemm(B, 512, 512, tb=True, note="(dx = g W^T)")
        unary("relu", (B, 512), K.relu, lambda x: np.maximum(x, 0))
        unary("exp", (B, 512), K.exp, np.exp)
        unary(
            "softmax",
            (B, 10),
            K.softmax,
            lambda x: (
                np.exp(x - x.max(1, keepdims=True))
                / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)
            ),
        )
        unary("sum axis 0", (B, 512), lambda x: K.sum(x, axis=0), lambda x: x.sum(0))
        binary("bias add", (B, 512), (512,), lambda a, b: a + b, lambda a, b: a + b)
        binary("multiply", (B, 512), (B, 512), lambda a, b: a * b, lambda a, b: a * b)
        binary(
            "relu grad (select)",
            (B, 512),
            (B, 512),
            lambda x, g: K.switch(x > 0, g, K.zeros_like(g)),
            lambda x, g: np.where(x > 0, g, 0),
        )
        binary(
            "rmsprop update",
            (784, 512),
            (784, 512),
            lambda p, g: p - 0.001 * g / (K.sqrt(0.9 * K.square(p) + 0.1 * K.square(g)) + 1e-7),
            lambda p, g: p - 0.001 * g / (np.sqrt(0.9 * np.square(p) + 0.1 * np.square(g)) + 1e-7),
        )
        unary(
            "dropout mask (random_uniform)",
            (B, 512),
            lambda x: x * K.cast(K.random_uniform((B, 512)) > 0.2, "float32"),
            lambda x: x * (rng.random((B, 512), dtype="float32") > 0.2),
        )
    else:  # lstm: per time step, batch 64, 32 -> 4*64 gates
        gemm(B, 32, 256, note="(x_t W, per step)")
        gemm(B, 64, 256, note="(h_{t-1} U, per step)")
        unary("sigmoid", (B, 64), K.sigmoid, lambda x: 1 / (1 + np.exp(-x)))
        unary("tanh", (B, 64), K.tanh, np.tanh)
        unary("hard_sigmoid", (B, 64), K.hard_sigmoid, lambda x: np.clip(0.2 * x + 0.5, 0, 1))
        binary("multiply", (B, 64), (B, 64), lambda a, b: a * b, lambda a, b: a * b)
        binary("bias add", (B, 256), (256,), lambda a, b: a + b, lambda a, b: a + b)
        unary("slice gate [:, :64]", (B, 256), lambda x: x[:, :64], lambda x: x[:, :64].copy())
        unary(
            "stack 50 steps (concat)",
            (50, B, 64),
            lambda x: K.concatenate([x[i : i + 1] for i in range(50)], axis=0),
            lambda x: np.concatenate([x[i : i + 1] for i in range(50)], axis=0),
        )
        # one whole LSTM step cell as Keras builds it, forward only, as a K.function
        xv = rng.standard_normal((B, 32)).astype("float32")
        hv = rng.standard_normal((B, 64)).astype("float32")
        W = K.variable(rng.standard_normal((32, 256)).astype("float32") * 0.1)
        U = K.variable(rng.standard_normal((64, 256)).astype("float32") * 0.1)
        bb = K.variable(np.zeros(256, "float32"))
        px, ph, pc = (
            K.placeholder(shape=(B, 32)),
            K.placeholder(shape=(B, 64)),
            K.placeholder(shape=(B, 64)),
        )
        z = K.dot(px, W) + K.dot(ph, U) + bb
        i_, f_, c_, o_ = z[:, :64], z[:, 64:128], z[:, 128:192], z[:, 192:]
        c2 = K.sigmoid(f_) * pc + K.sigmoid(i_) * K.tanh(c_)
        h2 = K.sigmoid(o_) * K.tanh(c2)
        f = K.function([px, ph, pc], [h2, c2])
        t = k_timed(f, [xv, hv, hv])
        Wn, Un = K.get_value(W), K.get_value(U)

        def npcell():
            zz = xv @ Wn + hv @ Un
            s = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
            cc = s(zz[:, 64:128]) * hv + s(zz[:, :64]) * np.tanh(zz[:, 128:192])
            return s(zz[:, 192:]) * np.tanh(cc), cc

        rows.append(
            (
                "one LSTM cell step, fwd (16 ops)",
                t,
                np_timed(npcell),
                f"{getattr(f, 'dispatches', '?')} launches",
            )
        )

    w = max(len(r[0]) for r in rows)
    print(
        f"{'op (ferrokeras via K.function)':{w}}  {'ferrokeras':>11}  {'numpy 1 thr':>9}  "
        "rate (ferrokeras vs numpy)"
    )
    for name, t, tn, rate in rows:
        print(f"{name:{w}}  {t * 1e6:9.1f}us  {tn * 1e6:7.1f}us  {rate}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--workload", choices=("mlp", "cnn", "lstm"), default="mlp")
    t.add_argument("--seconds", type=float, default=20.0)
    b = sub.add_parser("breakdown")
    b.add_argument("--workload", choices=("mlp", "cnn", "lstm"), default="mlp")
    b.add_argument("--repeats", type=int, default=5)
    o = sub.add_parser("ops")
    o.add_argument("--workload", choices=("mlp", "lstm"), default="mlp")
    a = p.parse_args()
    {"train": cmd_train, "breakdown": cmd_breakdown, "ops": cmd_ops}[a.cmd](a)


if __name__ == "__main__":
    main()
