"""Data-parallel scaling of Keras 2.3.1 training on ferrokeras.distributed: training
throughput of one process against N MPI ranks, each rank with the per-rank batch of the
single process (weak scaling: N ranks train on N times the samples per step).

    python benches/bench_distributed.py [--ranks 2] [--workloads mlp,cnn]
                                        [--threads 1,default] [--modes plain,none,fp16]
                                        [--epochs 3] [--priority] [--json out.json]
                                        [--mpi-tunables VAR=VALUE,...]
    python benches/bench_distributed.py --node-cost [--workloads mlp] [--rounds 40]

Workloads are those of bench_keras.py: MLP 784-512-512-10 with dropout, RMSprop, batch
128; CNN conv32-conv64-pool-d128, Adam, batch 64. ``--threads 1`` runs every process with
one compute thread (RAYON_NUM_THREADS=1), ``default`` with ferrokeras' own choice. The N
ranks run as ``--modes`` says: ``plain`` side by side without communicating (plain Keras
optimizers: the ceiling the machine gives), ``none`` with DistributedOptimizer, ``mpi``
with DistributedOptimizer summing by ``MPI_Allreduce`` instead of the shared-memory window
(``FERROKERAS_DIST_SHM_BYTES=0``), ``fp16`` with ``compression=hvd.Compression.fp16``. For each configuration (``--rounds`` runs
each, all configurations taking turns; the median run is reported) it prints samples/s
(all ranks together, median epoch), the speed-up over one process with the same threads,
CPU ms per step, and per step the time inside the gradient average: waiting for the
other ranks (agreement check and load imbalance) and the collective itself. Then the
collectives alone (MPI_Allreduce of the gradients' size against the shared-memory window's
sum and a memcpy; for the MLP also as float16), again under each ``--mpi-tunables``
setting.

``--node-cost`` measures, in one process, what the gradient node adds to a step's CPU
time and where that goes (``node_cost_worker``).

Run on a quiet machine: every rank needs a core of its own. On a machine that other jobs
share, ``--priority`` (Linux, root) runs every process at nice -20 in a scheduling group
of its own.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

MARK = "@@RESULT@@"
MODES = {
    "plain": "no communication",
    "none": "DistributedOptimizer",
    "mpi": "DistributedOptimizer, MPI",
    "fp16": "Compression.fp16",
}
# Worker mode and environment of each mode: `mpi` is DistributedOptimizer with the
# shared-memory window off, every buffer summed by MPI_Allreduce.
MODE_RUNS = {"mpi": ("none", {"FERROKERAS_DIST_SHM_BYTES": "0"})}
WORKLOADS = {
    # name: (batch per rank, steps per epoch)
    "mlp": (128, 40),
    "cnn": (64, 12),
}


def raise_priority():
    """With --priority (Linux, root): this process at nice -20 in a scheduling group
    (autogroup) of its own at nice -20, so that other jobs on a shared machine take as
    little of the cores as the scheduler allows. mpiexec starts every rank in a session
    of its own, hence the autogroup; each worker calls this first."""
    if os.environ.get("BENCH_DIST_PRIORITY") != "1":
        return
    try:
        Path("/proc/self/autogroup").write_text("-20")
        os.nice(-20 - os.nice(0))
    except OSError as e:
        raise SystemExit(f"--priority: cannot raise this process's priority ({e})") from None


def build(name, keras):
    L = keras.layers
    if name == "mlp":
        inp = keras.Input(shape=(784,))
        h = L.Dense(512, activation="relu")(inp)
        h = L.Dropout(0.2)(h)
        h = L.Dense(512, activation="relu")(h)
        h = L.Dropout(0.2)(h)
        out = L.Dense(10, activation="softmax")(h)
        return keras.Model(inp, out), keras.optimizers.RMSprop(learning_rate=1e-3), (784,)
    inp = keras.Input(shape=(28, 28, 1))
    h = L.Conv2D(32, (3, 3), activation="relu")(inp)
    h = L.Conv2D(64, (3, 3), activation="relu")(h)
    h = L.MaxPooling2D(pool_size=(2, 2))(h)
    h = L.Dropout(0.25)(h)
    h = L.Flatten()(h)
    h = L.Dense(128, activation="relu")(h)
    h = L.Dropout(0.5)(h)
    out = L.Dense(10, activation="softmax")(h)
    return keras.Model(inp, out), keras.optimizers.Adam(learning_rate=1e-3), (28, 28, 1)


def worker(args):
    raise_priority()
    os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
    import ferrokeras.distributed as hvd
    import keras
    import numpy as np

    hvd.init()
    batch, steps = WORKLOADS[args.workload]
    model, opt, shape = build(args.workload, keras)
    if args.mode == "none":
        opt = hvd.DistributedOptimizer(opt)
    elif args.mode == "fp16":
        opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)
    # "plain": the ranks train side by side, never communicating.
    model.compile(opt, "categorical_crossentropy", ["accuracy"])
    rng = np.random.default_rng(hvd.rank())
    n = batch * steps
    x = rng.random((n,) + shape, dtype=np.float32)
    y = keras.utils.to_categorical(rng.integers(0, 10, n), 10)

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()
            self.c0 = time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)
            if epoch == 0:
                hvd.stats(reset=True)  # the first epoch compiles and warms up

    times, cpu = [], []
    cbs = [EpochTimes()]
    if args.mode != "plain":
        cbs.insert(0, hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    model.fit(x, y, batch_size=batch, epochs=1 + args.epochs, verbose=0, callbacks=cbs)
    st = hvd.stats()
    epoch_s = statistics.median(times[1:])
    # The ranks step together; the slowest rank's epoch is the job's.
    epoch_s = float(hvd.allreduce(np.array([epoch_s]), op=hvd.Max)[0])
    if hvd.rank() == 0:
        res = {
            "workload": args.workload,
            "ranks": hvd.size(),
            "samples_per_s": hvd.size() * n / epoch_s,
            "epoch_s": epoch_s,
            "epochs_s": times[1:],
            "steps": st["steps"],
            # CPU seconds per step of rank 0 (MPI waits spinning, so this includes waits).
            "cpu_ms_per_step": 1e3 * statistics.median(cpu[1:]) / steps,
            "wait_ms_per_step": 1e3 * st["wait_s"] / max(st["steps"], 1),
            "allreduce_ms_per_step": 1e3 * st["allreduce_s"] / max(st["steps"], 1),
            "allreduce_mb_per_step": st["bytes"] / max(st["steps"], 1) / 2**20,
        }
        print(MARK, json.dumps(res), flush=True)


def allreduce_worker(args):
    """The collectives alone, on the gradient sizes of the workloads (medians of 50, the
    ranks meeting at a barrier before each): MPI_Allreduce in place of float32, and a
    memcpy of the same bytes (the floor under the gradient average's cost per step);
    for the MLP also what float16 on the wire can use: an Allgather of float16, MPICH's
    own float16 sum (MPI_FLOAT16_T) and a user-defined one (NumPy). Where the ranks share
    a machine, also the gradient average's sum through the shared-memory window."""
    raise_priority()
    import ferrokeras.distributed as hvd
    import numpy as np

    hvd.init()
    comm, MPI = hvd._comm.S.comm, hvd._comm.S.MPI

    def timed(fn, reps=50):
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            comm.Barrier()
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1e3 * statistics.median(times)

    def measure(params, float16):
        a = np.ones(params, np.float32)
        b = np.empty_like(a)
        out = {
            "mib": a.nbytes / 2**20,
            "allreduce_ms": timed(lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)),
            "memcpy_ms": timed(lambda: np.copyto(b, a)),
        }
        shm = hvd._comm.shared_memory()
        if shm is not None:
            out["shm_sum_ms"] = timed(lambda: shm.sum_in_place([a], hvd._shm.slot_limit()))
        if float16:
            h = np.ones(params, np.float16)
            rows = np.empty((comm.Get_size(), params), np.float16)
            user = MPI.Op.Create(hvd._ops._f16_sum, commute=True)
            out.update(
                allgather_f16_ms=timed(lambda: comm.Allgather(h, rows)),
                allreduce_f16_mpich_ms=timed(
                    lambda: comm.Allreduce(MPI.IN_PLACE, h, op=MPI.SUM), 10
                ),
                allreduce_f16_user_op_ms=timed(
                    lambda: comm.Allreduce(MPI.IN_PLACE, h, op=user), 10
                ),
            )
            user.Free()
        return out

    res = {"mlp": measure(669_706, True), "cnn": measure(1_199_882, False)}
    if hvd.rank() == 0:
        print(MARK, json.dumps(res), flush=True)


def node_cost_worker(args):
    """One process: CPU ms per training step without the gradient node and with it, and
    where the node's time goes.

    The node is built as for two ranks and runs on a communicator of one, where its MPI
    calls cost next to nothing, so the difference is the node's own work: packing the
    gradients (a concatenation in the graph), handing the buffer to the callback and its
    results back, and the callback itself (agreement check, Allreduce call, counters).
    The two models train in alternating rounds (``--rounds``, ``--steps`` steps each), so
    that drifts in the machine's load fall on both; CPU time, not wall time, is counted.
    """
    os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
    import ferrokeras
    import ferrokeras.distributed as hvd
    import keras
    import numpy as np

    hvd.init()
    hvd._comm.S.size = 2  # the node is built and run as on two ranks
    batch, _ = WORKLOADS[args.workload]
    models = {}
    for variant in ("plain", "node"):
        model, opt, shape = build(args.workload, keras)
        if variant == "node":
            opt = hvd.DistributedOptimizer(opt)
        model.compile(opt, "categorical_crossentropy", ["accuracy"])
        models[variant] = model
    rng = np.random.default_rng(0)
    x = rng.random((batch,) + shape, dtype=np.float32)
    y = keras.utils.to_categorical(rng.integers(0, 10, batch), 10)
    for model in models.values():
        for _ in range(20):  # compiles, specialises, warms up
            model.train_on_batch(x, y)
    cpu = {v: [] for v in models}
    for _ in range(args.rounds):
        for v, model in models.items():
            c0 = time.process_time()
            for _ in range(args.steps):
                model.train_on_batch(x, y)
            cpu[v].append(1e3 * (time.process_time() - c0) / args.steps)
    # Where the node's time goes: a profiled run of the node's model (wall time of the
    # packing and of the whole callback per step), with the CPU time of the callback's
    # Python body (agreement, Allreduce call, counters) counted apart.
    runner = hvd._ops._GradientAverage
    body, inner = [], runner._sum

    def timed(self, arrays):
        c0 = time.thread_time()
        out = inner(self, arrays)
        body.append(time.thread_time() - c0)
        return out

    runner._sum = timed
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_dist_node_{os.getpid()}.json"
    with ferrokeras.profile(path):
        for _ in range(args.steps * 4):
            models["node"].train_on_batch(x, y)
    runner._sum = inner
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    path.unlink()
    node = [s for s in spans if s["name"] == "py_function:gradient_allreduce"]
    item = node[0]["args"]["item"]
    pack = [
        s
        for s in spans
        if s["name"] == "concatenate" and s["args"].get("item") == item - 1 and s["args"]["inputs"]
    ]
    med = statistics.median
    print(
        MARK,
        json.dumps(
            {
                "workload": args.workload,
                "cpu_ms_per_step_without": med(cpu["plain"]),
                "cpu_ms_per_step_with": med(cpu["node"]),
                "node_cpu_ms_per_step": med(b - a for a, b in zip(cpu["plain"], cpu["node"])),
                "rounds": args.rounds,
                "pack_us": med(s["dur"] for s in pack) if pack else None,
                "callback_us": med(s["dur"] for s in node),
                "python_cpu_us": 1e6 * med(body),
            }
        ),
        flush=True,
    )


def node_cost(workload, rounds, steps):
    env = dict(os.environ, KERAS_BACKEND="ferrokeras.backend", FERROKERAS_DEVICE="cpu")
    env.update(OPENBLAS_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--worker", "node-cost", "--node-workload", workload]
    cmd += ["--rounds", str(rounds), "--steps", str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")


def mpiexec():
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def run(workload, ranks, threads, epochs, mode="none", env=None):
    mode, mode_env = MODE_RUNS.get(mode, (mode, {}))
    env = dict(
        os.environ,
        KERAS_BACKEND="ferrokeras.backend",
        FERROKERAS_DEVICE="cpu",
        **mode_env,
        **(env or {}),
    )
    env["OPENBLAS_NUM_THREADS"] = "1"
    if threads == "1":
        env.update(RAYON_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--worker", workload, "--epochs", str(epochs)]
    cmd += ["--mode", mode]
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")


def median_run(runs):
    """The run with the median throughput."""
    return sorted(runs, key=lambda r: r["samples_per_s"])[len(runs) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", metavar="WORKLOAD", help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workloads", default="mlp,cnn")
    p.add_argument("--threads", default="1,default")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs (after one warm-up)")
    p.add_argument(
        "--rounds", type=int, help="runs of each configuration (3; --node-cost: 40 rounds)"
    )
    p.add_argument(
        "--modes",
        default="plain,none,mpi,fp16",
        help="what the N ranks run: plain (side by side, no communication: the ceiling), "
        "none (DistributedOptimizer), mpi (DistributedOptimizer with MPI_Allreduce instead "
        "of the shared-memory window), fp16 (compression=hvd.Compression.fp16)",
    )
    p.add_argument(
        "--mpi-tunables",
        help="comma-separated VAR=VALUE settings (MPIR_CVAR_...) under which the collectives "
        "alone are measured again, one at a time",
    )
    p.add_argument(
        "--priority",
        action="store_true",
        help="run every process at nice -20 in a scheduling group of its own (Linux, root): "
        "for a machine that other jobs share",
    )
    p.add_argument("--json", help="also write the results here")
    p.add_argument(
        "--node-cost",
        action="store_true",
        help="instead: in one process, the CPU time per step of the gradient node (rounds of "
        "--steps steps) and where it goes",
    )
    p.add_argument("--steps", type=int, default=25, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="none", help=argparse.SUPPRESS)
    p.add_argument("--node-workload", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.priority:
        os.environ["BENCH_DIST_PRIORITY"] = "1"
        raise_priority()
    if args.rounds is None:
        args.rounds = 40 if args.node_cost else 3
    if args.worker == "allreduce":
        return allreduce_worker(args)
    if args.worker == "node-cost":
        args.workload = args.node_workload
        return node_cost_worker(args)
    if args.node_cost:
        for workload in args.workloads.split(","):
            r = node_cost(workload, args.rounds, args.steps)
            pack = "n/a" if r["pack_us"] is None else f"{r['pack_us']:.0f}"
            print(
                f"{workload:4s} one process, 1 thread: CPU ms per step "
                f"{r['cpu_ms_per_step_without']:.2f} without the gradient node, "
                f"{r['cpu_ms_per_step_with']:.2f} with it: the node {r['node_cpu_ms_per_step']:.2f} "
                f"ms (median of {r['rounds']} paired rounds) | median wall us per step: packing {pack}, "
                f"callback {r['callback_us']:.0f} (its Python body: {r['python_cpu_us']:.0f} us of CPU)",
                flush=True,
            )
        return None
    if args.worker:
        args.workload = args.worker
        return worker(args)
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    rows = []
    for workload in args.workloads.split(","):
        if workload not in WORKLOADS:
            raise SystemExit(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
        for threads in args.threads.split(","):
            modes = args.modes.split(",")
            runs = {m: [] for m in ["one"] + modes}
            for _ in range(args.rounds):  # the configurations take turns, against drifts in load
                runs["one"].append(run(workload, 1, threads, args.epochs))
                for m in modes:
                    runs[m].append(run(workload, args.ranks, threads, args.epochs, m))
            one = median_run(runs["one"])
            line = (
                f"{workload:4s} threads={threads:7s} 1 process {one['samples_per_s']:7.0f} samples/s "
                f"({one['cpu_ms_per_step']:.2f} CPU ms/step; rounds "
                + " ".join(f"{x['samples_per_s']:.0f}" for x in runs["one"])
                + ")"
            )
            for key, rounds in runs.items():
                r = median_run(rounds)
                r.update(threads=threads, mode=key if key != "one" else None)
                r["rounds_samples_per_s"] = [x["samples_per_s"] for x in rounds]
                rows.append(r)
                if key == "one":
                    continue
                line += (
                    f"\n     {args.ranks} ranks, {MODES[key]:26s} {r['samples_per_s']:7.0f} samples/s "
                    f"= {r['samples_per_s'] / one['samples_per_s']:.2f}x | CPU ms/step "
                    f"{r['cpu_ms_per_step']:.2f}"
                )
                if key != "plain":
                    line += (
                        f" | per step: wait {r['wait_ms_per_step']:.2f} ms, collective "
                        f"{r['allreduce_ms_per_step']:.2f} ms of {r['allreduce_mb_per_step']:.2f} MiB"
                    )
                line += " | rounds " + " ".join(f"{x['samples_per_s']:.0f}" for x in rounds)
            print(line, flush=True)
    for tunable in [""] + (args.mpi_tunables.split(",") if args.mpi_tunables else []):
        env = dict([tunable.split("=", 1)]) if tunable else {}
        ar = run("allreduce", args.ranks, "1", 0, env=env)
        for name, r in ar.items():
            line = (
                f"{name:4s} gradient alone{' with ' + tunable if tunable else ''}: "
                f"{r['mib']:.2f} MiB, MPI_Allreduce on {args.ranks} ranks "
                f"{r['allreduce_ms']:.2f} ms, "
                + (f"shared-memory sum {r['shm_sum_ms']:.2f} ms, " if "shm_sum_ms" in r else "")
                + f"memcpy {r['memcpy_ms']:.2f} ms"
            )
            if "allgather_f16_ms" in r:
                line += (
                    f" | as float16: Allgather {r['allgather_f16_ms']:.2f} ms, Allreduce with "
                    f"MPICH's float16 sum {r['allreduce_f16_mpich_ms']:.2f} ms, with a NumPy sum "
                    f"{r['allreduce_f16_user_op_ms']:.2f} ms"
                )
            print(line, flush=True)
        rows.append({"allreduce_alone": ar, "tunable": tunable})
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
