"""Core benchmarks: K.function call overhead and K.dot throughput, next to NumPy.

Each row times ferrokeras and NumPy doing the same work in the same process, and
reports the median over several repeats. See benches/README.md; run with `make bench`.
"""

import argparse
import os
import statistics
import time

import ferrokeras
import numpy as np
from ferrokeras import backend as K


def median_seconds(fn, calls, repeats):
    """Median over `repeats` of the mean wall time of one call, from `calls` calls."""
    fn()  # warm-up: compilation, buffer allocation, thread-pool start
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def bench_call_overhead(rng, calls, repeats):
    """tanh(x @ w + b) on a 4x4 input: the time is almost all per-call overhead."""
    xv = rng.standard_normal((4, 4)).astype("float32")
    wv = rng.standard_normal((4, 4)).astype("float32")
    bv = rng.standard_normal(4).astype("float32")

    x = K.placeholder(shape=(4, 4))
    w, b = K.variable(wv), K.variable(bv)
    f = K.function([x], [K.tanh(K.dot(x, w) + b)])
    np.testing.assert_allclose(f([xv])[0], np.tanh(xv @ wv + bv), rtol=1e-5, atol=1e-6)

    fk = median_seconds(lambda: f([xv]), calls, repeats)
    fn = median_seconds(lambda: np.tanh(xv @ wv + bv), calls, repeats)
    return ("K.function call, 4x4 tanh(x.w+b)", "us/call", fk * 1e6, fn * 1e6, fn / fk)


def tiny_call_overhead(calls, repeats):
    """K.function call time of x + 1 on a 2x2 input (what an idle hook on the call path would
    show up in): per round of `calls` calls, the mean wall time and the mean CPU time of
    the calling thread, in us. The CPU time leaves out time the thread waited for a core,
    so it holds still on a loaded machine where the wall time does not."""
    x = K.placeholder(shape=(2, 2))
    f = K.function([x], [x + 1])
    xv = np.ones((2, 2), "float32")
    for _ in range(calls // 10):
        f([xv])
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            f([xv])
        wall.append((time.perf_counter() - start) / calls * 1e6)
        cpu.append((time.thread_time() - start_cpu) / calls * 1e6)
    return wall, cpu


def bench_matmul(rng, n, repeats):
    """K.dot of two fed n x n float32 matrices, inputs and output crossing the boundary."""
    av = rng.standard_normal((n, n)).astype("float32")
    bv = rng.standard_normal((n, n)).astype("float32")

    a, b = K.placeholder(shape=(n, n)), K.placeholder(shape=(n, n))
    f = K.function([a, b], [K.dot(a, b)])
    got = f([av, bv])[0]

    # ferrokeras is timed before NumPy multiplies anything this size: OpenBLAS's threads
    # keep spinning for a while after a product, and would take a core from it.
    flop = 2.0 * n**3
    fk = median_seconds(lambda: f([av, bv]), 1, repeats)
    np.testing.assert_allclose(got, av @ bv, rtol=1e-3, atol=1e-2)
    fn = median_seconds(lambda: av @ bv, 1, repeats)
    return (
        f"K.dot {n}x{n}x{n} float32 via K.function",
        "GFLOP/s",
        flop / fk / 1e9,
        flop / fn / 1e9,
        fn / fk,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    parser.add_argument(
        "--tiny-call",
        action="store_true",
        help="only the call time of x + 1 on a 2x2 input: 20000 calls per round, 7 rounds",
    )
    args = parser.parse_args()
    if args.tiny_call:
        wall, cpu = tiny_call_overhead(20000, 7)
        print(
            "K.function call, 2x2 x + 1, us/call per round (wall):",
            " ".join(f"{r:.2f}" for r in wall),
        )
        print(
            "K.function call, 2x2 x + 1, us/call per round (thread CPU):",
            " ".join(f"{r:.2f}" for r in cpu),
        )
        print(
            f"median {statistics.median(wall):.2f} us/call wall, {statistics.median(cpu):.2f} us/call CPU"
        )
        return
    calls, repeats = (200, 3) if args.quick else (2000, 7)

    device = getattr(ferrokeras, "device", lambda: "cpu")()
    print(
        f"ferrokeras device: {device}   "
        f"FERROKERAS_DEVICE={os.environ.get('FERROKERAS_DEVICE', '(unset)')}   "
        f"numpy {np.__version__}   cores: {os.cpu_count()}"
    )

    rng = np.random.default_rng(0)
    rows = [
        bench_call_overhead(rng, calls, repeats),
        bench_matmul(rng, 1024, repeats),
    ]

    header = ("benchmark", "unit", "ferrokeras", "numpy", "speed vs numpy")
    widths = (max(len(header[0]), *(len(r[0]) for r in rows)), 8, 11, 11, 16)
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    print("  ".join("-" * w for w in widths).rstrip())
    for name, unit, ours, theirs, speedup in rows:
        cells = (name, unit, f"{ours:.2f}", f"{theirs:.2f}", f"{speedup:.2f}x")
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    print(
        f"\nMedian of {repeats} repeats. us/call: lower is better; GFLOP/s: higher is "
        "better;\nspeed vs numpy = numpy time / ferrokeras time (above 1x: ferrokeras is faster)."
    )


if __name__ == "__main__":
    main()
