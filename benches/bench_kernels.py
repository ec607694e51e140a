"""CPU kernels at the Keras workloads' shapes (GEMM, convolution, pooling, reductions).

Each row is one primitive through `K.function`, median over interleaved repeats. With
`--ab VAR`, every repeat is timed twice, once with the environment variable VAR set and
once without, in the same process, so the ratio is not at the mercy of a shared
machine's load; that needs a temporary build whose kernels read VAR to select their
previous path. Without one, compare two builds by CPU time on one thread (run the same
command with each build's extension on PYTHONPATH):

    .venv/bin/python benches/bench_kernels.py                  # all groups
    .venv/bin/python benches/bench_kernels.py --only gemm,reduce --filter lstm
    RAYON_NUM_THREADS=1 .venv/bin/python benches/bench_kernels.py --cpu-time

Rates: GFLOP/s for GEMM and convolution (2 flops per multiply-add), ns per input element
otherwise.
"""

import argparse
import os
import statistics
import time

import numpy as np
from ferrokeras import _core
from ferrokeras import backend as K
from ferrokeras.tensor import wrap

CLOCK = time.perf_counter


def timed(f, args, budget=0.05):
    """Mean seconds per call, from enough calls to fill `budget` seconds."""
    f(args)
    t0 = CLOCK()
    f(args)
    one = CLOCK() - t0
    calls = int(max(2, min(1000, budget / max(one, 1e-7))))
    t0 = CLOCK()
    for _ in range(calls):
        f(args)
    return (CLOCK() - t0) / calls


def measure(f, args, repeats, ab):
    """Median seconds per call without and (when `ab` names a variable) with it set."""
    new, old = [], []
    for _ in range(repeats):
        if ab:
            os.environ[ab] = "1"
            old.append(timed(f, args))
            del os.environ[ab]
        new.append(timed(f, args))
    return statistics.median(new), (statistics.median(old) if old else None)


def cases(rng):
    """(group, name, function, feeds, work, unit): work is flops or elements."""
    out = []

    def gemm(m, k, n, ta=False, tb=False, batch=(), note=""):
        av = rng.standard_normal(batch + ((k, m) if ta else (m, k))).astype("float32")
        bv = rng.standard_normal(batch + ((n, k) if tb else (k, n))).astype("float32")
        pa, pb = K.placeholder(shape=av.shape), K.placeholder(shape=bv.shape)
        f = K.function([pa, pb], [wrap(_core.matmul(pa._core, pb._core, ta, tb))])
        want = np.matmul(
            np.swapaxes(av, -1, -2) if ta else av, np.swapaxes(bv, -1, -2) if tb else bv
        )
        np.testing.assert_allclose(f([av, bv])[0], want, rtol=1e-3, atol=1e-3)
        t = "".join(["A" if not ta else "Aᵀ", "·", "B" if not tb else "Bᵀ"])
        b = f"{batch[0]}x " if batch else ""
        out.append(
            (
                "gemm",
                f"{b}{m}x{k}x{n} {t} {note}".rstrip(),
                f,
                [av, bv],
                2.0 * m * n * k * max(1, int(np.prod(batch))),
                "GFLOP/s",
            )
        )

    gemm(1024, 1024, 1024, note="(K.dot 1024^3)")
    gemm(128, 784, 512, note="(mlp fwd 1)")
    gemm(128, 512, 512, tb=True, note="(mlp dx = g Wᵀ)")
    gemm(784, 128, 512, ta=True, note="(mlp dW = xᵀ g)")
    gemm(128, 512, 10, note="(mlp fwd 3)")
    gemm(128, 10, 512, tb=True, note="(mlp dx 3)")
    gemm(512, 128, 10, ta=True, note="(mlp dW 3)")
    gemm(64, 64, 256, note="(lstm h U)")
    gemm(64, 256, 64, tb=True, note="(lstm g Uᵀ)")
    gemm(64, 64, 256, ta=True, note="(lstm hᵀ g)")
    gemm(64, 9216, 128, note="(cnn dense)")
    gemm(64, 128, 9216, tb=True, note="(cnn dense dx)")
    gemm(9216, 64, 128, ta=True, note="(cnn dense dW)")
    gemm(16, 32, 32, batch=(64,), note="(batch of small)")

    def conv(xs, ws, what):
        xv = rng.standard_normal(xs).astype("float32")
        wv = (rng.standard_normal(ws) * 0.1).astype("float32")
        px, pw = K.placeholder(shape=xs), K.placeholder(shape=ws)
        y = K.conv2d(px, pw)
        ys = tuple(K.int_shape(y))
        flop = 2.0 * np.prod(ys) * ws[0] * ws[1] * ws[2]
        if what == "fwd":
            out.append(
                ("conv", f"conv {xs} * {ws}", K.function([px, pw], [y]), [xv, wv], flop, "GFLOP/s")
            )
            return
        gv = rng.standard_normal(ys).astype("float32")
        pg = K.placeholder(shape=ys)
        if what == "dx":
            dx = K.gradients(K.sum(K.conv2d(px, K.constant(wv)) * pg), [px])[0]
            out.append(
                (
                    "conv",
                    f"conv dx {xs} * {ws}",
                    K.function([px, pg], [dx]),
                    [xv, gv],
                    flop,
                    "GFLOP/s",
                )
            )
        else:
            dw = K.gradients(K.sum(K.conv2d(K.constant(xv), pw) * pg), [pw])[0]
            out.append(
                (
                    "conv",
                    f"conv dW {xs} * {ws}",
                    K.function([pw, pg], [dw]),
                    [wv, gv],
                    flop,
                    "GFLOP/s",
                )
            )

    for what in ("fwd", "dx", "dW"):
        conv((64, 26, 26, 32), (3, 3, 32, 64), what)
    for what in ("fwd", "dW"):
        conv((64, 28, 28, 1), (3, 3, 1, 32), what)

    xs = (64, 24, 24, 64)
    xv = rng.standard_normal(xs).astype("float32")
    px = K.placeholder(shape=xs)
    y = K.pool2d(px, (2, 2), strides=(2, 2))
    out.append(
        ("pool", "max_pool 2x2 64x24x24x64", K.function([px], [y]), [xv], xv.size, "ns/elem")
    )
    gy = K.placeholder(shape=K.int_shape(y))
    dx = K.gradients(K.sum(K.pool2d(px, (2, 2), strides=(2, 2)) * gy), [px])[0]
    gv = rng.standard_normal(K.int_shape(y)).astype("float32")
    out.append(
        (
            "pool",
            "max_pool grad 64x24x24x64",
            K.function([px, gy], [dx]),
            [xv, gv],
            xv.size,
            "ns/elem",
        )
    )

    def red(shape, axis, fn=K.sum, name="sum"):
        v = rng.standard_normal(shape).astype("float32")
        p = K.placeholder(shape=shape)
        f = K.function([p], [fn(p, axis=axis)])
        np.testing.assert_allclose(
            f([v])[0], getattr(np, name)(v.astype("float64"), axis=axis), rtol=1e-4, atol=1e-2
        )
        out.append(
            ("reduce", f"{name} {'x'.join(map(str, shape))} axis={axis}", f, [v], v.size, "ns/elem")
        )

    red((128, 512), 0)
    red((128, 10), 0)
    red((64, 256), 0)
    red((64, 24, 24, 64), (0, 1, 2))
    red((64, 26, 26, 32), (0, 1, 2))
    red((128, 512), 1)
    red((128, 512), 0, K.max, "max")
    red((64, 50, 32), (1, 2))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="gemm,conv,pool,reduce", help="comma-separated groups")
    ap.add_argument("--ab", default="", help="environment variable selecting the previous kernels")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--filter", default="", help="only rows whose name contains this")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by the process's CPU time, not wall time: with RAYON_NUM_THREADS=1 this "
        "compares single-thread kernel efficiency on a machine other jobs load",
    )
    a = ap.parse_args()
    if a.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    groups = a.only.split(",")
    rng = np.random.default_rng(0)
    rows = [c for c in cases(rng) if c[0] in groups and a.filter in c[1]]
    w = max(len(r[1]) for r in rows)
    print(f"{'kernel':{w}}  {'new':>10}  {'old (' + a.ab + ')' if a.ab else '':>12}  {'ratio':>6}")
    for _, name, f, args, work, unit in rows:
        t, t_old = measure(f, args, a.repeats, a.ab)
        if unit == "GFLOP/s":
            rate = lambda s, work=work: work / s / 1e9  # noqa: E731
        else:
            rate = lambda s, work=work: s / work * 1e9  # noqa: E731
        old = f"{rate(t_old):10.2f}" if t_old else ""
        ratio = f"{t_old / t:6.2f}x" if t_old else ""
        print(
            f"{name:{w}}  {rate(t):10.2f}  {old:>12}  {ratio}  {unit}  ({t * 1e6:.0f} us)",
            flush=True,
        )


if __name__ == "__main__":
    main()
