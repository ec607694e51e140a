"""One benchmark workload on one framework, in a process of its own; prints JSON.

Run by benches/bench_keras.py, once per (framework, workload), with the Python of the
virtual environment that holds that framework:

    ferrokeras  .venv                 Keras 2.3.1 on KERAS_BACKEND=ferrokeras.backend
    tf          benches/.venvs/tf     tensorflow-cpu + tf-keras (TF's Keras 2 API)
    jax         benches/.venvs/jax    Keras 3 on KERAS_BACKEND=jax
    torch       benches/.venvs/torch  Keras 3 on KERAS_BACKEND=torch

    python benches/peer_worker.py --framework tf --workload mlp [--quick]

The last line of stdout is ``@@RESULT@@ {json}``. Everything a workload builds uses only
the API common to Keras 2.3.1, tf-keras and Keras 3 (functional models, ``keras.Input``,
``learning_rate=``), so every framework runs the same model on the same data.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
import traceback

FRAMEWORKS = ("ferrokeras", "tf", "jax", "torch")
WORKLOADS = ("call4x4", "dot1024", "mlp", "cnn", "lstm")
MARK = "@@RESULT@@"


def rss_mib():
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return None


def load_framework(name):
    """Imports Keras for `name`; returns (keras module, K module or None, versions)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if name == "ferrokeras":
        os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
        import ferrokeras
        import keras

        device = getattr(ferrokeras, "device", lambda: "cpu")()
        return (
            keras,
            keras.backend,
            {
                "keras": keras.__version__,
                "ferrokeras": getattr(ferrokeras, "__version__", "?"),
                "device": str(device),
            },
        )
    if name == "tf":
        import tensorflow as tf
        import tf_keras as keras

        return keras, keras.backend, {"tensorflow": tf.__version__, "tf_keras": keras.__version__}
    if name in ("jax", "torch"):
        os.environ["KERAS_BACKEND"] = name
        import keras

        if name == "jax":
            import jax

            versions = {
                "keras": keras.__version__,
                "jax": jax.__version__,
                "jax_devices": [str(d) for d in jax.devices()],
            }
        else:
            import torch

            versions = {
                "keras": keras.__version__,
                "torch": torch.__version__,
                "torch_threads": torch.get_num_threads(),
            }
        return keras, None, versions
    raise SystemExit(f"unknown framework {name!r}")


# --------------------------------------------------------------------------------------
# micro-benchmarks through K.function (Keras 2 API only: ferrokeras and tf-keras)


def timed_calls(fn, calls, repeats):
    """Median over `repeats` of the mean wall time of one call, from `calls` calls."""
    for _ in range(3):
        fn()  # warm-up: compilation, buffer allocation, thread-pool start
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples), samples


def w_call4x4(keras, K, np, quick):
    """tanh(x.w + b) on a fed 4x4 float32 array: the fixed cost of one K.function call."""
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((4, 4)).astype("float32")
    wv = rng.standard_normal((4, 4)).astype("float32")
    bv = rng.standard_normal(4).astype("float32")
    x = K.placeholder(shape=(4, 4))
    w, b = K.variable(wv), K.variable(bv)
    f = K.function([x], [K.tanh(K.dot(x, w) + b)])
    np.testing.assert_allclose(np.asarray(f([xv])[0]), np.tanh(xv @ wv + bv), rtol=1e-5, atol=1e-5)
    # Calls per repeat: enough for ~0.1 s (quick) or ~0.4 s (full) per repeat, whatever
    # the framework's speed (TF's K.function takes ~1 ms a call, ferrokeras' a few us).
    call = lambda: f([xv])  # noqa: E731
    for _ in range(5):
        call()
    t0 = time.perf_counter()
    for _ in range(20):
        call()
    per = (time.perf_counter() - t0) / 20
    calls = int(min(20000, max(20, (0.1 if quick else 0.4) / per)))
    repeats = 3 if quick else 7
    med, samples = timed_calls(call, calls, repeats)
    return {
        "value": med * 1e6,
        "unit": "us/call",
        "samples_us": [s * 1e6 for s in samples],
        "calls_per_repeat": calls,
    }


def w_dot1024(keras, K, np, quick):
    """K.dot of two fed 1024x1024 float32 arrays through K.function (copies in and out included)."""
    n = 1024
    rng = np.random.default_rng(0)
    av = rng.standard_normal((n, n)).astype("float32")
    bv = rng.standard_normal((n, n)).astype("float32")
    a, b = K.placeholder(shape=(n, n)), K.placeholder(shape=(n, n))
    f = K.function([a, b], [K.dot(a, b)])
    np.testing.assert_allclose(np.asarray(f([av, bv])[0]), av @ bv, rtol=1e-3, atol=2e-2)
    calls, repeats = (2, 3) if quick else (3, 7)
    med, samples = timed_calls(lambda: f([av, bv]), calls, repeats)
    flop = 2.0 * n**3
    return {
        "value": flop / med / 1e9,
        "unit": "GFLOP/s",
        "seconds": med,
        "samples_gflops": [flop / s / 1e9 for s in samples],
    }


# --------------------------------------------------------------------------------------
# training workloads: model.fit on synthetic data, per-epoch wall time from a callback

# (samples per epoch, batch size); sample counts are multiples of the batch so every step
# has the same shape (JAX would otherwise compile a second step for the last batch).
TRAIN_SIZES = {
    "mlp": {"full": 128 * 80, "quick": 128 * 8, "batch": 128},
    "cnn": {"full": 64 * 24, "quick": 64 * 3, "batch": 64},
    "lstm": {"full": 64 * 32, "quick": 64 * 4, "batch": 64},
}
# warm-up epochs (excluded), most timed epochs, least timed epochs, time budget (s)
# after which the run stops once it has the least number of timed epochs.
EPOCHS = {"full": (2, 5, 3, 45.0), "quick": (1, 2, 2, 8.0)}


def synthetic(np, shape, n, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n,) + shape).astype("float32")
    y = np.eye(classes, dtype="float32")[rng.integers(0, classes, n)]
    return x, y


def build_mlp(keras):
    L = keras.layers
    inp = keras.Input(shape=(784,))
    h = L.Dense(512, activation="relu")(inp)
    h = L.Dropout(0.2)(h)
    h = L.Dense(512, activation="relu")(h)
    h = L.Dropout(0.2)(h)
    out = L.Dense(10, activation="softmax")(h)
    model = keras.Model(inp, out)
    model.compile(
        optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model, (784,)


def build_cnn(keras):
    L = keras.layers
    inp = keras.Input(shape=(28, 28, 1))
    h = L.Conv2D(32, (3, 3), activation="relu")(inp)
    h = L.Conv2D(64, (3, 3), activation="relu")(h)
    h = L.MaxPooling2D(pool_size=(2, 2))(h)
    h = L.Dropout(0.25)(h)
    h = L.Flatten()(h)
    h = L.Dense(128, activation="relu")(h)
    h = L.Dropout(0.5)(h)
    out = L.Dense(10, activation="softmax")(h)
    model = keras.Model(inp, out)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model, (28, 28, 1)


def build_lstm(keras):
    L = keras.layers
    inp = keras.Input(shape=(50, 32))
    h = L.LSTM(64)(inp)
    out = L.Dense(10, activation="softmax")(h)
    model = keras.Model(inp, out)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model, (50, 32)


BUILDERS = {"mlp": build_mlp, "cnn": build_cnn, "lstm": build_lstm}


def probe_ferrokeras_conv(K, np):
    """None if K.conv2d and K.pool2d work, else the reason the CNN row cannot run."""
    x = K.placeholder(shape=(1, 6, 6, 1))
    for name, build in (
        ("conv2d", lambda: K.conv2d(x, K.variable(np.zeros((3, 3, 1, 2), "float32")))),
        ("pool2d", lambda: K.pool2d(x, (2, 2), (2, 2))),
    ):
        try:
            build()
        except NotImplementedError:
            return f"{name} not available"
    return None


def w_train(name, keras, K, np, quick, framework):
    mode = "quick" if quick else "full"
    size = TRAIN_SIZES[name]
    n, batch = size[mode], size["batch"]
    warm, most, least, budget = EPOCHS[mode]
    if framework == "ferrokeras" and name == "cnn":
        reason = probe_ferrokeras_conv(K, np)
        if reason:
            return {"status": "n/a", "reason": reason}
    np.random.seed(0)
    rss_before_model = current_rss_mib()
    model, shape = BUILDERS[name](keras)
    x, y = synthetic(np, shape, n)
    rss_with_data = current_rss_mib()

    times = []
    t_start = [0.0]

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            t_start[0] = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - t_start[0])
            timed = times[warm:]
            if len(timed) >= least and sum(timed) > budget:
                self.model.stop_training = True

    t0 = time.perf_counter()
    hist = model.fit(
        x,
        y,
        batch_size=batch,
        epochs=warm + most,
        shuffle=True,
        verbose=0,
        callbacks=[EpochTimer()],
    )
    total = time.perf_counter() - t0
    timed = times[warm:]
    med = statistics.median(timed)
    losses = [float(v) for v in hist.history.get("loss", [])]
    if not all(np.isfinite(losses)):
        raise RuntimeError(f"non-finite training loss: {losses}")
    return {
        "value": n / med,
        "unit": "samples/s",
        "samples_per_epoch": n,
        "batch": batch,
        "steps_per_epoch": n // batch,
        "step_ms": med / (n // batch) * 1e3,
        "warmup_epochs_s": times[:warm],
        "timed_epochs_s": timed,
        "fit_total_s": total,
        "loss": losses,
        "params": int(model.count_params()),
        "peak_rss_mib": rss_mib(),
        "rss_before_model_mib": rss_before_model,
        "rss_with_data_mib": rss_with_data,
    }


def run_one(framework, workload, quick, keras, K, versions, import_s):
    import numpy as np

    out = {
        "framework": framework,
        "workload": workload,
        "quick": quick,
        "python": platform.python_version(),
        "pid": os.getpid(),
        "versions": versions,
        "import_s": import_s,
        "rss_after_import_mib": current_rss_mib(),
    }
    t0 = time.perf_counter()
    try:
        if workload in ("call4x4", "dot1024"):
            if K is None:
                out.update(status="n/a", reason="Keras 3 has no K.function")
            else:
                fn = w_call4x4 if workload == "call4x4" else w_dot1024
                out.update(status="ok", **fn(keras, K, np, quick))
        else:
            out.update({"status": "ok", **w_train(workload, keras, K, np, quick, framework)})
    except NotImplementedError as e:
        out.update(status="n/a", reason=str(e).split(";")[0][:120])
    except Exception as e:  # report, do not crash the harness
        out.update(
            status="error",
            reason=f"{type(e).__name__}: {e}"[:400],
            traceback=traceback.format_exc()[-3000:],
        )
    out["wall_s"] = time.perf_counter() - t0
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", choices=FRAMEWORKS, required=True)
    p.add_argument(
        "--workload",
        required=True,
        help="one of %s, or several separated by commas (one process: then the "
        "peak RSS of later workloads includes the earlier ones)" % ",".join(WORKLOADS),
    )
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    workloads = a.workload.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}")

    t0 = time.perf_counter()
    try:
        keras, K, versions = load_framework(a.framework)
    except Exception as e:
        for w in workloads:
            print(
                MARK,
                json.dumps(
                    {
                        "framework": a.framework,
                        "workload": w,
                        "status": "error",
                        "reason": f"import failed: {type(e).__name__}: {e}"[:400],
                    }
                ),
                flush=True,
            )
        return
    import_s = time.perf_counter() - t0
    for w in workloads:
        out = run_one(a.framework, w, a.quick, keras, K, versions, import_s)
        out["shared_process"] = len(workloads) > 1
        sys.stdout.flush()
        print(MARK, json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
