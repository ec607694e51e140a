"""The two pictures of docs/monitoring.md, drawn with matplotlib from what ferrokeras wrote:
the scalars of a TensorBoard log directory (ferrokeras.callbacks.TensorBoard's event
files), and one training step's Chrome trace (ferrokeras.profile) as a timeline, one lane
per thread, one bar per span.

matplotlib is not a ferrokeras dependency; run this from any environment that has it and
the ``tensorboard`` package (for the event reader):

    python benches/plot_monitoring.py scalars <log_dir> docs/images/training_scalars.png
    python benches/plot_monitoring.py trace <trace.json> docs/images/profile_step.png

``--train`` makes both inputs first (needs ferrokeras and Keras 2.3.1 importable): a small
MLP on random data, 8 epochs with the TensorBoard callback, then one profiled training
step of a small LSTM.

    KERAS_BACKEND=ferrokeras.backend python benches/plot_monitoring.py --train <out_dir>
"""

import json
import os
import sys


def train(out):
    import ferrokeras
    import ferrokeras.callbacks
    import keras
    import numpy as np
    from keras.layers import LSTM, Dense

    ferrokeras.set_random_seed(0)
    rng = np.random.RandomState(0)
    x = rng.rand(512, 16).astype("float32")
    y = np.eye(4, dtype="float32")[(x[:, :4].argmax(1))]
    model = keras.models.Sequential(
        [Dense(32, activation="relu", input_shape=(16,)), Dense(4, activation="softmax")]
    )
    model.compile(keras.optimizers.Adam(0.01), "categorical_crossentropy", ["accuracy"])
    logs = os.path.join(out, "logs")
    cb = ferrokeras.callbacks.TensorBoard(logs, write_graph=False)
    model.fit(x, y, batch_size=32, epochs=8, validation_split=0.25, callbacks=[cb], verbose=0)
    # One step of a small LSTM: the call on the calling thread, the loops' steps on the
    # rayon worker that ran them.
    seq = keras.models.Sequential([LSTM(8, input_shape=(6, 4)), Dense(1)])
    seq.compile("sgd", "mse")
    xs, ys = rng.rand(16, 6, 4).astype("float32"), rng.rand(16, 1).astype("float32")
    for _ in range(3):
        seq.train_on_batch(xs, ys)
    trace = os.path.join(out, "step.json")
    with ferrokeras.profile(trace):
        seq.train_on_batch(xs, ys)
    return logs, trace


def plot_scalars(log_dir, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(log_dir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    pairs = [("loss", "val_loss"), ("accuracy", "val_accuracy")]
    fig, axes = plt.subplots(1, 2, figsize=(7, 2.6), dpi=80)
    for ax, names in zip(axes, pairs):
        for name in names:
            if name in tags:
                ev = acc.Scalars(name)
                ax.plot([e.step for e in ev], [e.value for e in ev], marker="o", ms=3, label=name)
        ax.set_xlabel("epoch")
        ax.set_title(names[0])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png)


def plot_trace(trace, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    t0 = min(s["ts"] for s in spans)
    lanes = sorted(
        {s["tid"] for s in spans}, key=lambda t: min(s["ts"] for s in spans if s["tid"] == t)
    )
    colours = {
        "call": "#bbbbbb",
        "op": "#4c72b0",
        "fused": "#dd8452",
        "loop": "#55a868",
        "loop.run": "#55a868",
        "loop.step": "#8fd19e",
        "callback": "#c44e52",
        "gpu.record": "#8172b3",
        "gpu.submit": "#937860",
        "host": "#da8bc3",
    }
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * len(lanes)), dpi=80)
    for lane, tid in enumerate(lanes):
        mine = sorted((s for s in spans if s["tid"] == tid), key=lambda s: (s["ts"], -s["dur"]))
        open_ends = []
        for s in mine:
            while open_ends and open_ends[-1] <= s["ts"]:
                open_ends.pop()
            level = len(open_ends)
            open_ends.append(s["ts"] + s["dur"])
            height = 0.8 / (1 + level * 0.6)
            ax.broken_barh(
                [((s["ts"] - t0) / 1e3, max(s["dur"], 0.5) / 1e3)],
                (lane - 0.4 + (0.8 - height), height),
                facecolors=colours.get(s["cat"], "#cccccc"),
                edgecolor="white",
                linewidth=0.3,
            )
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([names.get(t, str(t)) for t in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=c)
        for k, c in colours.items()
        if any(s["cat"] == k for s in spans)
    ]
    labels = [k for k in colours if any(s["cat"] == k for s in spans)]
    fig.legend(handles, labels, fontsize=7, ncol=len(labels), loc="upper center", frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(png)


def main(argv):
    if len(argv) == 2 and argv[0] == "--train":
        print(*train(argv[1]))
    elif len(argv) == 3 and argv[0] == "scalars":
        plot_scalars(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "trace":
        plot_trace(argv[1], argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
