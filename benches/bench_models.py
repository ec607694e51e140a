"""Eleven more Keras models, ferrokeras next to its peers: training and prediction speed.

`bench_keras.py` times three Keras workloads (MLP, CNN, LSTM); this script times a wider set of
the layers real Keras code uses (GRU, Embedding + LSTM, batch normalisation, Conv1D,
separable and depthwise convolutions, transposed convolutions, strided 5x5 convolutions
with average pooling, bidirectional and simple RNNs, an autoencoder), to find the ones
where ferrokeras falls behind. Each framework runs in a process of its own, with the
Python of its virtual environment (those of `make bench`, see `peer_worker.py`):

    .venv/bin/python benches/bench_models.py                  # ferrokeras and TF
    .venv/bin/python benches/bench_models.py --frameworks ferrokeras,tf,jax --models gru,cifar_bn

Training: samples per second over the median of three epochs after a first one (random
data, every model built with the API common to Keras 2.3.1, tf-keras and Keras 3).
Prediction: samples per second of `model.predict` on 1,024 samples in batches of 256.
The table gives each peer's figure and ferrokeras' ratio to it (above 1 is faster).

`--rounds N` runs every framework N times, taking turns, and reports the median of each
cell. `--one-thread` computes on one thread in every framework (`RAYON_NUM_THREADS=1`; TF
with one intra- and one inter-op thread; Torch `set_num_threads(1)`; JAX through XLA's
flags) and times by the process's CPU time instead of the wall clock: figures that other
jobs on a shared machine move far less.

    .venv/bin/python benches/bench_models.py --one-thread --rounds 3 --models separable
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "@@MODELS@@"


def models(keras, np):
    L = keras.layers
    rng = np.random.default_rng(0)

    def cls(n, k=10):
        return np.eye(k, dtype="float32")[rng.integers(0, k, n)]

    def normal(*shape):
        return rng.standard_normal(shape).astype("float32")

    def gru():
        i = keras.Input((50, 32))
        o = L.Dense(10, activation="softmax")(L.GRU(64)(i))
        return i, o, "adam", "categorical_crossentropy", normal(2048, 50, 32), cls(2048), 64

    def imdb():
        i = keras.Input((100,), dtype="int32")
        h = L.LSTM(64)(L.Embedding(10000, 128)(i))
        o = L.Dense(1, activation="sigmoid")(h)
        x, y = (
            rng.integers(0, 10000, (1024, 100)).astype("int32"),
            rng.integers(0, 2, (1024, 1)).astype("float32"),
        )
        return i, o, "adam", "binary_crossentropy", x, y, 32

    def cifar_bn():
        i = keras.Input((32, 32, 3))
        h = i
        for filters, pool in ((32, False), (32, True), (64, True)):
            h = L.Conv2D(filters, 3, padding="same")(h)
            h = L.Activation("relu")(L.BatchNormalization()(h))
            if pool:
                h = L.MaxPooling2D()(h)
        h = L.Dense(128, activation="relu")(L.Flatten()(h))
        o = L.Dense(10, activation="softmax")(h)
        return i, o, "adam", "categorical_crossentropy", normal(1024, 32, 32, 3), cls(1024), 64

    def conv1d():
        i = keras.Input((200,), dtype="int32")
        h = L.Conv1D(128, 5, activation="relu")(L.Embedding(5000, 64)(i))
        h = L.Dense(64, activation="relu")(L.GlobalMaxPooling1D()(h))
        o = L.Dense(1, activation="sigmoid")(h)
        x, y = (
            rng.integers(0, 5000, (2048, 200)).astype("int32"),
            rng.integers(0, 2, (2048, 1)).astype("float32"),
        )
        return i, o, "adam", "binary_crossentropy", x, y, 64

    def autoencoder():
        i = keras.Input((784,))
        h = i
        for n in (256, 64, 256):
            h = L.Dense(n, activation="relu")(h)
        o = L.Dense(784, activation="sigmoid")(h)
        x = rng.random((8192, 784)).astype("float32")
        return i, o, "adam", "binary_crossentropy", x, x, 256

    def bilstm():
        i = keras.Input((40, 16))
        o = L.Dense(5, activation="softmax")(L.Bidirectional(L.LSTM(32))(i))
        return i, o, "rmsprop", "categorical_crossentropy", normal(2048, 40, 16), cls(2048, 5), 64

    def simple_rnn():
        i = keras.Input((30, 16))
        o = L.Dense(10, activation="softmax")(L.SimpleRNN(128)(i))
        return i, o, "sgd", "categorical_crossentropy", normal(4096, 30, 16), cls(4096), 128

    def separable():
        i = keras.Input((32, 32, 16))
        h = L.SeparableConv2D(32, 3, padding="same", activation="relu")(i)
        h = L.Conv2D(64, 1, activation="relu")(L.DepthwiseConv2D(3, padding="same")(h))
        o = L.Dense(10, activation="softmax")(L.GlobalAveragePooling2D()(h))
        return i, o, "adam", "categorical_crossentropy", normal(1024, 32, 32, 16), cls(1024), 64

    def deconv():
        i = keras.Input((7, 7, 64))
        h = L.Conv2DTranspose(32, 3, strides=2, padding="same", activation="relu")(i)
        h = L.Conv2DTranspose(16, 3, strides=2, padding="same", activation="relu")(h)
        o = L.Conv2D(1, 3, padding="same", activation="sigmoid")(h)
        y = rng.random((1024, 28, 28, 1)).astype("float32")
        return i, o, "adam", "binary_crossentropy", normal(1024, 7, 7, 64), y, 64

    def wide_mlp():
        i = keras.Input((784,))
        h = L.Dense(1024, activation="relu")(L.Dense(1024, activation="relu")(i))
        o = L.Dense(10, activation="softmax")(h)
        return i, o, "sgd", "categorical_crossentropy", normal(8192, 784), cls(8192), 512

    def strided_cnn():
        i = keras.Input((64, 64, 3))
        h = L.AveragePooling2D()(L.Conv2D(16, 5, strides=2, activation="elu")(i))
        h = L.GlobalMaxPooling2D()(L.Conv2D(32, 3, activation="tanh")(h))
        o = L.Dense(10, activation="softmax")(h)
        return i, o, "adagrad", "categorical_crossentropy", normal(1024, 64, 64, 3), cls(1024), 32

    return {
        f.__name__: f
        for f in (
            gru,
            imdb,
            cifar_bn,
            conv1d,
            autoencoder,
            bilstm,
            simple_rnn,
            separable,
            deconv,
            wide_mlp,
            strided_cnn,
        )
    }


def one_thread_env(env):
    """`env` with every framework's compute limited to one thread (set before it loads)."""
    env = dict(env, RAYON_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["XLA_FLAGS"] = " ".join(
        filter(
            None,
            [
                env.get("XLA_FLAGS"),
                "--xla_cpu_multi_thread_eigen=false",
                "intra_op_parallelism_threads=1",
            ],
        )
    )
    return env


def worker(framework, names, one_thread=False):
    """Runs the models in this process; prints one JSON line of results."""
    sys.path.insert(0, HERE)
    import numpy as np
    import peer_worker

    keras, _, versions = peer_worker.load_framework(framework)
    if one_thread and framework == "tf":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if one_thread and framework == "torch":
        import torch

        torch.set_num_threads(1)
    clock = time.process_time if one_thread else time.perf_counter
    table = models(keras, np)
    out = {"framework": framework, "versions": versions, "models": {}}
    for name in names:
        i, o, opt, loss, x, y, batch = table[name]()
        model = keras.Model(i, o)
        model.compile(optimizer=opt, loss=loss)

        class Timer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.times = []

            def on_epoch_begin(self, epoch, logs=None):
                self.t = clock()

            def on_epoch_end(self, epoch, logs=None):
                self.times.append(clock() - self.t)

        timer = Timer()
        hist = model.fit(x, y, batch_size=batch, epochs=4, verbose=0, callbacks=[timer])
        times = timer.times
        loss_last = float(hist.history["loss"][-1])
        if not np.isfinite(loss_last):
            raise RuntimeError(f"{name}: non-finite training loss {loss_last}")
        xp = x[:1024]
        model.predict(xp, batch_size=256, verbose=0)
        t = clock()
        model.predict(xp, batch_size=256, verbose=0)
        model.predict(xp, batch_size=256, verbose=0)
        out["models"][name] = {
            "train": len(x) / statistics.median(times[1:]),
            "predict": 2 * len(xp) / (clock() - t),
            "loss": loss_last,
        }
        print(
            f"  {framework:10s} {name:12s} train {out['models'][name]['train']:9.0f}/s",
            file=sys.stderr,
            flush=True,
        )
    print(MARK, json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frameworks", default="ferrokeras,tf")
    p.add_argument("--models", default="all")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--rounds", type=int, default=1, help="runs of each framework, taking turns")
    p.add_argument(
        "--one-thread",
        action="store_true",
        help="one compute thread per framework, timed by process CPU time",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    names = a.models.split(",") if a.models != "all" else None
    if a.worker:
        import numpy as np

        worker(a.worker, names or list(models(_Stub(), np)), a.one_thread)
        return
    frameworks = a.frameworks.split(",")
    runs = {}
    for rnd in range(a.rounds):
        for fw in frameworks:
            python = (
                sys.executable
                if fw == "ferrokeras"
                else os.path.join(HERE, ".venvs", fw, "bin", "python")
            )
            if not os.path.exists(python):
                print(
                    f"{fw}: no virtual environment at {python} (make bench creates it)",
                    file=sys.stderr,
                )
                continue
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
            cmd = [python, os.path.abspath(__file__), "--worker", fw, "--models", a.models]
            if a.one_thread:
                env = one_thread_env(env)
                cmd.append("--one-thread")
            print(f"round {rnd + 1}/{a.rounds}: {fw}", file=sys.stderr, flush=True)
            r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith(MARK)]
            if r.returncode or not line:
                print(f"{fw}: failed (exit {r.returncode})", file=sys.stderr)
                continue
            runs.setdefault(fw, []).append(json.loads(line[-1][len(MARK) :]))
    results = {}
    for fw, rs in runs.items():
        merged = dict(rs[0], rounds=len(rs), one_thread=a.one_thread, models={})
        for name in rs[0]["models"]:
            cells = [r["models"][name] for r in rs if name in r["models"]]
            merged["models"][name] = {
                k: statistics.median(c[k] for c in cells) for k in ("train", "predict", "loss")
            }
            merged["models"][name]["rounds"] = {
                k: [c[k] for c in cells] for k in ("train", "predict")
            }
        results[fw] = merged
    if "ferrokeras" not in results:
        raise SystemExit("ferrokeras did not run")
    fk = results["ferrokeras"]["models"]
    peers = [f for f in frameworks if f in results and f != "ferrokeras"]
    head = f"{'model':12s} {'ferrokeras':>11s}" + "".join(f" {f:>9s} {'ratio':>6s}" for f in peers)
    unit = "samples per CPU second, one thread" if a.one_thread else "samples/s"
    for kind in ("train", "predict"):
        print(f"\n{kind} ({unit}, median of {a.rounds})\n{head}")
        for name, r in fk.items():
            row = f"{name:12s} {r[kind]:11.0f}"
            for f in peers:
                v = results[f]["models"].get(name, {}).get(kind)
                row += f" {v:9.0f} {r[kind] / v:5.2f}x" if v else f" {'-':>9s} {'-':>6s}"
            print(row)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)


class _Stub:
    """Enough of a Keras module for `models()` to list its names without building anything."""

    layers = None

    def __getattr__(self, name):
        raise AttributeError(name)


if __name__ == "__main__":
    main()
