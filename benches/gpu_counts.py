"""Kernel launches per Keras training step, on the GPU device and the CPU device.

Builds each standard Keras 2.3.1 training step below (the MLP, CNN and LSTM of
`peer_worker.py`, models of `bench_models.py`, Keras' metrics and every optimizer of
Keras 2.3.1 on a small MLP), trains it for two batches and prints, for the second call of
the train function:

- on the GPU device: the recorded WGSL dispatches (`Function.dispatches`), the queue
  submits, the nodes that ran their CPU kernel inside the GPU plan (`host_nodes`: loops,
  and dtypes or ops the device does not compute exactly) and the shape-arithmetic nodes
  computed on the host from host values (`shape_nodes`, no transfer);
- on the CPU device: the kernel launches of its schedule for the same step, and the
  launches it performs including every step of its loops (`rnn`): each loop node's body
  plan, specialised to its step shapes, launches its schedule once per step (counted from
  a `ferrokeras.profile` trace of the call: its schedule items at every loop depth). The
  GPU's dispatches include every loop step's, so that column is the like-for-like one.

Each step runs first on the GPU, then again from the same weights and optimizer state on
the CPU device; the losses, metrics and updated weights of the two must agree within
float32 tolerance (1e-3 relative; the models with dropout are not compared, since the
CPU's two calls draw other masks than the GPU's).
The figures are deterministic for a given device and build, so they guard fusion and
placement changes:

    FERROKERAS_DEVICE=gpu python benches/gpu_counts.py             # the table, checked
    python benches/gpu_counts.py --markdown                        # docs/performance.md
    python benches/gpu_counts.py --models mlp,cnn --no-check       # counts only
    python benches/gpu_counts.py --json before.json                # on the earlier build
    python benches/gpu_counts.py --markdown --before before.json   # before -> after

Without a GPU adapter only the CPU column is filled.
"""

import argparse
import json
import os
import sys
import tempfile

os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import peer_worker  # noqa: E402


def _peer(name):
    def build(keras):
        model, shape = peer_worker.BUILDERS[name](keras)
        batch = peer_worker.TRAIN_SIZES[name]["batch"]
        x, y = peer_worker.synthetic(np, shape, batch * 2)
        return model, x, y, batch

    return build


def _bench_model(name):
    def build(keras):
        import bench_models

        i, o, opt, loss, x, y, batch = bench_models.models(keras, np)[name]()
        model = keras.Model(i, o)
        model.compile(optimizer=opt, loss=loss)
        return model, x[: 2 * batch], y[: 2 * batch], batch

    return build


def _mlp_sgd(keras):
    L = keras.layers
    inp = keras.Input(shape=(784,))
    out = L.Dense(10, activation="softmax")(L.Dense(512, activation="relu")(inp))
    model = keras.Model(inp, out)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.01), loss="categorical_crossentropy"
    )
    x, y = peer_worker.synthetic(np, (784,), 256)
    return model, x, y, 128


def _small(optimizer=None, metric=None, sparse=False):
    """A 32-64-10 MLP, batch 32: one optimizer or one metric at a time."""

    def build(keras):
        L = keras.layers
        inp = keras.Input(shape=(32,))
        out = L.Dense(10, activation="softmax")(L.Dense(64, activation="relu")(inp))
        model = keras.Model(inp, out)
        opt = optimizer(keras.optimizers) if optimizer else keras.optimizers.SGD()
        loss = "sparse_categorical_crossentropy" if sparse else "categorical_crossentropy"
        model.compile(optimizer=opt, loss=loss, metrics=[metric] if metric else [])
        x, y = peer_worker.synthetic(np, (32,), 64)
        if sparse:
            y = np.argmax(y, axis=1).astype("float32")[:, None]
        return model, x, y, 32

    return build


# Cases whose dropout masks differ between the two devices' calls: not compared.
DROPOUT = {"mlp", "cnn"}

# (name, builder, what it covers)
CASES = [
    ("mlp", _peer("mlp"), "784-512-512-10, dropout, RMSprop, accuracy"),
    ("cnn", _peer("cnn"), "2 conv, max pool, dropout, Adam, accuracy"),
    ("lstm", _peer("lstm"), "LSTM(64) over 50 steps, Adam, accuracy"),
    ("mlp_sgd", _mlp_sgd, "784-512-10, SGD, no metric"),
    ("gru", _bench_model("gru"), "GRU(64) over 50 steps, Adam"),
    ("cifar_bn", _bench_model("cifar_bn"), "3 conv + batch norm, Adam"),
    ("embedding", _bench_model("conv1d"), "Embedding + Conv1D + global max pool, Adam"),
    ("acc", _small(metric="accuracy"), "metric accuracy"),
    (
        "sparse_acc",
        _small(metric="sparse_categorical_accuracy", sparse=True),
        "metric sparse_categorical_accuracy",
    ),
    ("top_k", _small(metric="top_k_categorical_accuracy"), "metric top_k_categorical_accuracy"),
    ("sgd_momentum", _small(lambda o: o.SGD(momentum=0.9)), "SGD(momentum=0.9)"),
    (
        "sgd_nesterov",
        _small(lambda o: o.SGD(momentum=0.9, nesterov=True)),
        "SGD(momentum=0.9, nesterov=True)",
    ),
    ("rmsprop", _small(lambda o: o.RMSprop()), "RMSprop()"),
    ("adam", _small(lambda o: o.Adam()), "Adam()"),
    ("amsgrad", _small(lambda o: o.Adam(amsgrad=True)), "Adam(amsgrad=True)"),
    ("adagrad", _small(lambda o: o.Adagrad()), "Adagrad()"),
    ("adadelta", _small(lambda o: o.Adadelta()), "Adadelta()"),
    ("nadam", _small(lambda o: o.Nadam()), "Nadam()"),
    ("adamax", _small(lambda o: o.Adamax()), "Adamax()"),
]


# Profiled schedule items that are kernel launches (`runtime::profile::cpu_item`); a
# `loop` item holds its steps' items one depth deeper.
LAUNCH_CATS = {"op", "fused", "callback"}


def _launches(trace, top):
    """The launches of a profiled CPU call whose schedule launches `top` kernels, with
    every loop step's: each loop node counts by its steps' items, not as a launch."""
    with open(trace) as f:
        spans = json.load(f)["traceEvents"]
    depth = [(s.get("cat"), s.get("args", {}).get("depth", 0)) for s in spans]
    loops = sum(1 for c, d in depth if c == "loop" and d == 0)
    inner = sum(1 for c, d in depth if c in LAUNCH_CATS and d > 0)
    return top - loops + inner


def _steps(model, x, y, batch, profiled=False):
    """Two training calls; the metrics of each, the train function after the second and,
    where `profiled`, the launches of the second call counted from its profile."""
    import ferrokeras

    outs = []
    launches = None
    for k in range(2):
        xb, yb = x[k * batch : (k + 1) * batch], y[k * batch : (k + 1) * batch]
        if profiled and k == 1:
            with tempfile.TemporaryDirectory() as d:
                trace = os.path.join(d, "trace.json")
                with ferrokeras.profile(trace):
                    r = model.train_on_batch(xb, yb)
                launches = _launches(trace, model.train_function._f.dispatches)
        else:
            r = model.train_on_batch(xb, yb)
        outs.append(np.atleast_1d(np.asarray(r, dtype="float64")))
    return outs, model.train_function._f, launches


def measure(keras, name, build, gpu, check):
    """The counts of case `name` on each device (GPU first when there is one), and the
    largest difference between the devices' results (None unchecked)."""
    import ferrokeras
    from keras import backend as K

    np.random.seed(0)
    model, x, y, batch = build(keras)
    model._make_train_function()
    start = K.batch_get_value(model.weights + model.optimizer.weights)
    row = {"name": name}
    results = {}
    for device in (["gpu"] if gpu else []) + ["cpu"]:
        ferrokeras.set_device(device)
        K.batch_set_value(list(zip(model.weights + model.optimizer.weights, start)))
        outs, f, launches = _steps(model, x, y, batch, profiled=device == "cpu")
        results[device] = outs + K.batch_get_value(model.weights + model.optimizer.weights)
        if device == "gpu":
            row["dispatches"], row["submits"] = f.dispatches, f.submits
            row["host_nodes"] = f.host_nodes
            row["shape_nodes"] = getattr(f, "shape_nodes", None)
        else:
            row["cpu"] = f.dispatches
            row["cpu_steps"] = launches
    row["diff"] = None
    if gpu and check and name not in DROPOUT:
        worst = 0.0
        for a, b in zip(results["gpu"], results["cpu"]):
            a, b = np.asarray(a, "float64"), np.asarray(b, "float64")
            err = np.abs(a - b) / (1e-3 + 1e-3 * np.abs(b))
            worst = max(worst, float(err.max(initial=0.0)))
        row["diff"] = worst
    return row


def _cell(v):
    return "-" if v is None else str(v)


def _change(before, after, key):
    """`before -> after` of one count, or the count alone where there is no before."""
    a = _cell(after.get(key))
    if before is None or before.get(key) is None or before.get(key) == after.get(key):
        return a
    return f"{before[key]} → {a}"


def markdown(rows, before):
    """The table of docs/performance.md: GPU counts (before -> after where a `--json`
    file of an earlier build is given) and the CPU device's launches."""
    old = {r["name"]: r for r in before or []}
    print(
        "| step | what | GPU dispatches | GPU submits | host nodes | shape nodes "
        "| CPU launches | CPU launches, loop steps included |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        b = old.get(r["name"]) if before is not None else None
        cells = [_change(b, r, k) for k in ("dispatches", "submits", "host_nodes")]
        cells += [_cell(r.get("shape_nodes")), _change(b, r, "cpu"), _change(b, r, "cpu_steps")]
        print(f"| {r['name']} | {r['what']} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated case names (default: all)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument(
        "--before", help="a --json file of an earlier build: the table shows before -> after"
    )
    ap.add_argument("--no-check", action="store_true", help="skip the GPU = CPU check")
    args = ap.parse_args()
    import ferrokeras
    import keras

    gpu = any(d["device"] != "cpu" for d in ferrokeras.devices())
    names = args.models.split(",") if args.models else [c[0] for c in CASES]
    unknown = set(names) - {c[0] for c in CASES}
    if unknown:
        ap.error(f"unknown models: {', '.join(sorted(unknown))}")
    start_device = ferrokeras.device()
    rows = []
    try:
        for name, build, what in CASES:
            if name not in names:
                continue
            row = measure(keras, name, build, gpu, not args.no_check)
            row["what"] = what
            rows.append(row)
            if not args.markdown:
                if len(rows) == 1:
                    print(f"device: {ferrokeras.devices()[1]['name'] if gpu else 'cpu only'}")
                    print(
                        f"{'model':<13} {'dispatches':>10} {'submits':>8} {'host':>5} "
                        f"{'shape':>6} {'cpu':>5} {'cpu+steps':>9}  gpu-cpu"
                    )
                diff = None if row["diff"] is None else round(row["diff"], 3)
                print(
                    f"{name:<13} {_cell(row.get('dispatches')):>10} "
                    f"{_cell(row.get('submits')):>8} {_cell(row.get('host_nodes')):>5} "
                    f"{_cell(row.get('shape_nodes')):>6} {row['cpu']:>5} "
                    f"{_cell(row.get('cpu_steps')):>9}  {_cell(diff)}",
                    flush=True,
                )
    finally:
        ferrokeras.set_device(start_device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.markdown:
        before = None
        if args.before:
            with open(args.before) as f:
                before = json.load(f)
        markdown(rows, before)
    bad = [r["name"] for r in rows if r["diff"] is not None and r["diff"] > 1.0]
    if bad:
        sys.exit(f"GPU and CPU results differ beyond float32 tolerance: {', '.join(bad)}")


if __name__ == "__main__":
    main()
