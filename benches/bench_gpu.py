"""GPU path vs CPU path vs NumPy (and PyTorch CUDA when importable).

    python benches/bench_gpu.py            # sizes picked from the adapter
    python benches/bench_gpu.py --quick    # small sizes only (CI smoke, llvmpipe)

Measures, on every device ferrokeras sees (the CPU and each GPU adapter):
  * matmul C = A @ B, fp32, as a compiled K.function: GFLOP/s (including the
    host -> device upload of A and B and the download of C, as a user sees it) and
    "resident" GFLOP/s (A, B variables already on the device, output reduced to a
    scalar so the readback is negligible);
  * K.function call overhead: a 1-element function, microseconds per call;
  * an MLP training step (784-256-256-10, batch 128, softmax cross-entropy built from
    primitives, SGD updates in the same call): milliseconds per step.
  * a 3x3 convolution, 64 -> 64 channels, 56x56, batch 32, 'same' padding, forward and
    backward (the input and kernel gradients) in one call, the kernel a variable already
    on the device: milliseconds per step and GFLOP/s (3 convolutions' worth of FLOPs).
    Software adapters and --quick run it at batch 2.
NumPy runs the same matmul and the same training step. With torch + CUDA, the matmul
also runs in PyTorch fp32 with TF32 off (torch.backends.cuda.matmul.allow_tf32 = False).

Software adapters (Mesa llvmpipe) are measured with small sizes only and labelled: their
numbers say nothing about GPU speed.
"""

import argparse
import time

import ferrokeras
import numpy as np
from ferrokeras import _core
from ferrokeras import backend as K


def timeit(fn, min_time=0.5, min_reps=3, max_reps=1000):
    fn()  # warm-up (compiles pipelines, fills the buffer pool)
    reps, start = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        el = time.perf_counter() - start
        if (el >= min_time and reps >= min_reps) or reps >= max_reps:
            return el / reps


def bench_matmul(n):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype("float32")
    b = rng.standard_normal((n, n)).astype("float32")
    pa, pb = K.placeholder(shape=(n, n)), K.placeholder(shape=(n, n))
    f = K.function([pa, pb], [K.dot(pa, pb)])
    t_io = timeit(lambda: f([a, b]))
    va, vb = K.variable(a), K.variable(b)
    g = K.function([], [K.sum(K.dot(va, vb))])
    t_res = timeit(lambda: g([]))
    flops = 2.0 * n**3
    return flops / t_io / 1e9, flops / t_res / 1e9


def bench_overhead():
    x = K.placeholder(shape=(1,))
    f = K.function([x], [x + 1.0])
    v = np.ones(1, "float32")
    return timeit(lambda: f([v]), min_time=0.5, max_reps=20000) * 1e6


def mlp_step(batch=128, sizes=(784, 256, 256, 10)):
    rng = np.random.default_rng(1)
    ws = [
        K.variable(rng.standard_normal((i, o)).astype("float32") * np.sqrt(2.0 / i))
        for i, o in zip(sizes, sizes[1:])
    ]
    bs = [K.variable(np.zeros(o, "float32")) for o in sizes[1:]]
    x = K.placeholder(shape=(None, sizes[0]))
    y = K.placeholder(shape=(None, sizes[-1]))
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = K.dot(h, w) + b
        if i < len(ws) - 1:
            h = K.maximum(h, 0.0)
    z = h - K.max(h, axis=1, keepdims=True)
    logp = z - K.log(K.sum(K.exp(z), axis=1, keepdims=True))
    loss = -K.mean(K.sum(y * logp, axis=1))
    params = ws + bs
    grads = K.gradients(loss, params)
    train = K.function([x, y], [loss], updates=[(p, p - 0.01 * g) for p, g in zip(params, grads)])
    xv = rng.standard_normal((batch, sizes[0])).astype("float32")
    yv = np.eye(sizes[-1], dtype="float32")[rng.integers(0, sizes[-1], batch)]
    return timeit(lambda: train([xv, yv]), min_time=1.0) * 1e3, train


def conv_step(batch=32, hw=56, c=64):
    rng = np.random.default_rng(2)
    x = K.placeholder(shape=(batch, hw, hw, c))
    k = K.variable(rng.standard_normal((3, 3, c, c)).astype("float32") * 0.05)
    y = K.conv2d(x, k, padding="same")
    loss = K.sum(y * y)
    gx, gk = K.gradients(loss, [x, k])
    f = K.function([x], [K.sum(gx), K.sum(gk)])
    xv = rng.standard_normal((batch, hw, hw, c)).astype("float32")
    t = timeit(lambda: f([xv]), min_time=1.0, min_reps=2)
    flops = 3 * 2.0 * batch * hw * hw * c * c * 9
    return t * 1e3, flops / t / 1e9, f


def numpy_mlp_step(batch=128, sizes=(784, 256, 256, 10)):
    rng = np.random.default_rng(1)
    ws = [
        rng.standard_normal((i, o)).astype("float32") * np.sqrt(2.0 / i)
        for i, o in zip(sizes, sizes[1:])
    ]
    bs = [np.zeros(o, "float32") for o in sizes[1:]]
    xv = rng.standard_normal((batch, sizes[0])).astype("float32")
    yv = np.eye(sizes[-1], dtype="float32")[rng.integers(0, sizes[-1], batch)]

    def step():
        acts, h = [xv], xv
        for i, (w, b) in enumerate(zip(ws, bs)):
            h = h @ w + b
            if i < len(ws) - 1:
                h = np.maximum(h, 0)
            acts.append(h)
        z = h - h.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        g = (p - yv) / batch
        for i in reversed(range(len(ws))):
            gw, gb = acts[i].T @ g, g.sum(axis=0)
            if i > 0:
                g = (g @ ws[i].T) * (acts[i] > 0)
            ws[i] -= 0.01 * gw
            bs[i] -= 0.01 * gb

    return timeit(step, min_time=1.0) * 1e3


def torch_matmul(n):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")

    def run():
        torch.mm(a, b)
        torch.cuda.synchronize()

    return 2.0 * n**3 / timeit(run) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--sizes", type=int, nargs="*", help="matmul sizes n (n x n x n)")
    args = ap.parse_args()

    devices = ferrokeras.devices()
    print("devices:")
    for d in devices:
        print(
            "  %-6s %s (%s, %s%s)"
            % (
                d["device"],
                d["name"],
                d["backend"],
                d["type"],
                ", software" if d["software"] else "",
            )
        )
    rows = []
    for d in devices:
        software = d["software"]
        sizes = args.sizes or (
            [128, 256]
            if (args.quick or software or d["device"] == "cpu")
            else [512, 1024, 2048, 4096]
        )
        if d["device"] == "cpu" and not args.quick and not args.sizes:
            sizes = [256, 512, 1024]
        ferrokeras.set_device(d["device"])
        label = d["device"] + (" (software: not a speed figure)" if software else "")
        print("\n== %s" % label)
        for n in sizes:
            io, res = bench_matmul(n)
            print(
                "  matmul %5d^3 fp32: %9.1f GFLOP/s with transfers, %9.1f GFLOP/s resident"
                % (n, io, res)
            )
            rows.append((d["device"], "matmul %d" % n, io, res))
        us = bench_overhead()
        print("  K.function call overhead: %.1f us" % us)
        if not (args.quick or software):
            ms, train = mlp_step()
            print(
                "  MLP training step (784-256-256-10, batch 128): %.2f ms  "
                "[%d dispatches, %d submit(s)]" % (ms, train.dispatches, train.submits)
            )
        batch = 2 if (args.quick or software) else 32
        ms, gflops, f = conv_step(batch)
        where = "" if d["device"] == "cpu" else ", %d nodes on the CPU fallback" % f._f.host_nodes
        print(
            "  conv 3x3 64->64 56x56 batch %d fwd+bwd: %.1f ms, %.1f GFLOP/s  [%d dispatches%s]"
            % (batch, ms, gflops, f.dispatches, where)
        )
        stats = _core.device_stats()
        if stats:
            print(
                "  buffer allocations %d (%.1f MiB), pipelines compiled %d"
                % (stats[0], stats[1] / 2**20, stats[2])
            )
    print("\n== numpy")
    for n in args.sizes or ([128, 256] if args.quick else [256, 512, 1024, 2048]):
        a = np.random.rand(n, n).astype("float32")
        b = np.random.rand(n, n).astype("float32")
        secs = timeit(lambda a=a, b=b: a @ b)
        print("  matmul %5d^3 fp32: %9.1f GFLOP/s" % (n, 2.0 * n**3 / secs / 1e9))
    if not args.quick:
        print("  MLP training step: %.2f ms" % numpy_mlp_step())
    for n in args.sizes or [1024, 4096]:
        t = torch_matmul(n)
        if t is not None:
            print("  torch CUDA matmul %5d^3 fp32 (TF32 off): %9.1f GFLOP/s" % (n, t))


if __name__ == "__main__":
    main()
