"""keras.applications ResNet50 and MobileNetV2 on ferrokeras against TF, CPU.

Each (framework, model) pair runs in a process of its own, with the Python of the venv that
holds the framework (as bench_keras.py: the project .venv for ferrokeras on Keras 2.3.1,
benches/.venvs/tf for tf-keras), the frameworks taking turns within a round and their order
rotated round by round; each cell is the median round.

    .venv/bin/python benches/bench_apps.py                 # 3 rounds, ~10 min
    .venv/bin/python benches/bench_apps.py --quick         # 1 round, fewer steps
    .venv/bin/python benches/bench_apps.py --models resnet50 --frameworks ferrokeras
    # two builds of ferrokeras, A/B, rounds interleaved (each path is put on PYTHONPATH):
    .venv/bin/python benches/bench_apps.py --frameworks fk=/tmp/old/python,fk=python
    # one compute thread each, timed by process CPU time (steadier on a loaded machine):
    .venv/bin/python benches/bench_apps.py --one-thread --models mobilenetv2

Models: `keras.applications.<Model>(weights=None, input_shape=(128, 128, 3), classes=10)`,
SGD(0.01, momentum 0.9), categorical cross-entropy, random data. Per model and framework:
the median `train_on_batch` step at batch 8, the median `predict_on_batch` at batch 1 and 32,
the time from `compile` to the end of the first training step, and the process's peak RSS
after training (and at the end, after the batch-32 predictions). With `--one-thread` each
framework computes on one thread (`RAYON_NUM_THREADS=1`; TF with one intra- and one
inter-op thread) and the step and predict times are the process's CPU time, which moves
much less than wall time when other processes load the machine.
"""

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

MARK = "@@RESULT@@"
MODELS = {"resnet50": "ResNet50", "mobilenetv2": "MobileNetV2"}
SIZE, CLASSES, TRAIN_BATCH = 128, 10, 8
# metric key, label, unit; every metric is lower-is-better
METRICS = [
    ("train_s", "train step b8", "s"),
    ("predict1_ms", "predict b1", "ms"),
    ("predict32_ms", "predict b32", "ms"),
    ("first_step_s", "compile..first step", "s"),
    ("rss_train_mib", "peak RSS after training", "MiB"),
    ("rss_peak_mib", "peak RSS at end", "MiB"),
]


# ------------------------------------------------------------------------------ worker


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def timed(fn, warm, reps, clock=time.perf_counter):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def worker(framework, model_key, quick, one_thread=False):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np

    if framework == "ferrokeras":
        os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
        import ferrokeras
        import keras

        versions = {"keras": keras.__version__, "ferrokeras": ferrokeras.__file__}
    else:
        import tensorflow as tf
        import tf_keras as keras

        versions = {"tensorflow": tf.__version__, "tf_keras": keras.__version__}
        if one_thread:
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
    clock = time.process_time if one_thread else time.perf_counter
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, SIZE, SIZE, 3)).astype("float32")
    y = np.eye(CLASSES, dtype="float32")[rng.integers(0, CLASSES, 32)]
    ctor = getattr(keras.applications, MODELS[model_key])
    model = ctor(weights=None, input_shape=(SIZE, SIZE, 3), classes=CLASSES)
    opt = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    xb, yb = x[:TRAIN_BATCH], y[:TRAIN_BATCH]
    t0 = time.perf_counter()
    model.compile(opt, "categorical_crossentropy")
    loss0 = float(np.asarray(model.train_on_batch(xb, yb)))
    first = time.perf_counter() - t0
    steps = 3 if quick else 8
    train = timed(lambda: model.train_on_batch(xb, yb), 1, steps, clock)
    rss_train = rss_mib()
    x1 = x[:1]
    p1 = timed(lambda: model.predict_on_batch(x1), 2, 5 if quick else 15, clock)
    p32 = timed(lambda: model.predict_on_batch(x), 1, 2 if quick else 5, clock)
    out = np.asarray(model.predict_on_batch(x1))
    assert out.shape == (1, CLASSES) and np.all(np.isfinite(out)), out
    return {
        "status": "ok",
        "versions": versions,
        "loss0": loss0,
        "train_s": statistics.median(train),
        "predict1_ms": statistics.median(p1) * 1e3,
        "predict32_ms": statistics.median(p32) * 1e3,
        "first_step_s": first,
        "rss_train_mib": rss_train,
        "rss_peak_mib": rss_mib(),
        "samples": {"train_s": train, "predict1_s": p1, "predict32_s": p32},
    }


# ------------------------------------------------------------------------------ driver


def parse_frameworks(spec):
    """`ferrokeras`, `tf`, or `NAME=PYTHONPATH` (a ferrokeras build whose python/ folder is
    PYTHONPATH, for A/B runs of two builds) -> [(label, kind, pythonpath or None)]."""
    out = []
    for item in filter(None, spec.split(",")):
        if item in ("ferrokeras", "tf"):
            out.append((item, item, None))
        elif "=" in item:
            name, path = item.split("=", 1)
            label = name
            while label in {o[0] for o in out}:
                label += "'"
            out.append((f"{label}:{path}", "ferrokeras", str(Path(path).resolve())))
        else:
            raise SystemExit(f"unknown framework {item!r} (ferrokeras, tf or NAME=PYTHONPATH)")
    return out


def run_one(fw, model_key, quick, timeout, one_thread=False):
    from bench_keras import python_for, worker_env

    label, kind, pypath = fw
    env = worker_env(kind)
    if one_thread:
        env["RAYON_NUM_THREADS"] = "1"
    if pypath:
        env["PYTHONPATH"] = pypath
    elif kind == "ferrokeras":
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")])
        )
    cmd = [str(python_for(kind)), str(Path(__file__).resolve()), "--worker", kind, model_key]
    if quick:
        cmd.append("--quick")
    if one_thread:
        cmd.append("--one-thread")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
        stdout, stderr, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        stdout, stderr, rc = "", f"timed out after {timeout}s", "timeout"
    for ln in stdout.splitlines():
        if ln.startswith(MARK):
            res = json.loads(ln[len(MARK) :])
            res["subprocess_s"] = time.perf_counter() - t0
            return res
    tail = (stderr or stdout).strip().splitlines()[-3:]
    return {"status": "error", "reason": f"worker exit {rc}: " + " | ".join(tail)[:400]}


def median_of(runs, key):
    vals = [r[key] for r in runs if r.get("status") == "ok"]
    return statistics.median(vals) if vals else None


def table(results, frameworks, models):
    ref = frameworks[-1][0]
    head = ["model", "metric"] + [f[0] for f in frameworks]
    if len(frameworks) > 1:
        head += [f"{ref} / {f[0]}" for f in frameworks[:-1]]
    rows = [head]
    for m in models:
        for key, label, unit in METRICS:
            vals = [median_of(results[m][f[0]], key) for f in frameworks]
            row = [m, f"{label} ({unit})"]
            row += ["n/a" if v is None else f"{v:.3f}" if unit == "s" else f"{v:.1f}" for v in vals]
            if len(frameworks) > 1:
                for v in vals[:-1]:
                    r = vals[-1]
                    row.append("n/a" if v is None or r is None else f"{r / v:.2f}x")
            rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    text = [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows[1:]]
    return "\n".join(text), "\n".join(md)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "MODEL"), help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="one round, fewer steps: a smoke run")
    p.add_argument(
        "--one-thread",
        action="store_true",
        help="one compute thread per framework; step and predict times in process CPU time",
    )
    p.add_argument(
        "--frameworks",
        default="ferrokeras,tf",
        help="comma-separated: ferrokeras, tf, NAME=PYTHONPATH (a ferrokeras build); "
        "ratios are the last one's time over each other's (above 1x: the others are faster)",
    )
    p.add_argument("--models", default=",".join(MODELS), help=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per worker")
    p.add_argument("--out", help="raw JSON (default benches/out/<date>-<time>-apps.json)")
    a = p.parse_args()
    if a.worker:
        try:
            res = worker(a.worker[0], a.worker[1], a.quick, a.one_thread)
        except Exception as e:  # reported as the cell's error by the driver
            import traceback

            traceback.print_exc()
            res = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:400]}
        print(MARK, json.dumps(res), flush=True)
        return

    from bench_keras import machine, peer_missing

    frameworks = parse_frameworks(a.frameworks)
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}")
    for f in list(frameworks):
        why = peer_missing(f[1])
        if why:
            print(f"skipping {f[0]}: {why}")
            frameworks.remove(f)
    rounds = a.rounds or (1 if a.quick else 3)
    info = machine()
    info["loadavg_start"] = os.getloadavg()
    info["one_thread"] = a.one_thread
    print(
        f"machine: {info.get('cpu_model')}, {info.get('cores')} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    results = {m: {f[0]: [] for f in frameworks} for m in models}
    for r in range(rounds):
        for m in models:
            k = (r + models.index(m)) % len(frameworks)
            for f in frameworks[k:] + frameworks[:k]:
                res = run_one(f, m, a.quick, a.timeout, a.one_thread)
                results[m][f[0]].append(res)
                if res.get("status") == "ok":
                    desc = ", ".join(
                        f"{key} {res[key]:.3f}" if unit == "s" else f"{key} {res[key]:.0f}"
                        for key, _, unit in METRICS
                    )
                else:
                    desc = res.get("reason")
                print(f"round {r + 1} {m:12s} {f[0]:12s} {desc}", flush=True)
    text, md = table(results, frameworks, models)
    print()
    print(text)
    print()
    print(md)
    out = Path(a.out) if a.out else HERE / "out" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-apps.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    info["loadavg_end"] = os.getloadavg()
    out.write_text(json.dumps({"machine": info, "results": results}, indent=1))
    print(f"\nraw results: {out}")


if __name__ == "__main__":
    main()
