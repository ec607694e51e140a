"""Kernel launches per Keras training step: the MLP, CNN and LSTM of `peer_worker.py`.

Trains each model for two batches with Keras 2.3.1 on ferrokeras and prints, for the
second call of the train function, the launches it recorded (`Function.dispatches`: on a
GPU the recorded WGSL dispatches, on the CPU the kernel launches of its schedule) and the
submits. The figures are deterministic for a given device and build, so they guard
fusion changes:

    FERROKERAS_DEVICE=gpu python benches/gpu_counts.py
    FERROKERAS_DEVICE=cpu python benches/gpu_counts.py
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import peer_worker  # noqa: E402


def count(keras, name):
    """(dispatches, submits) of the second training call of workload `name`."""
    np.random.seed(0)
    model, shape = peer_worker.BUILDERS[name](keras)
    batch = peer_worker.TRAIN_SIZES[name]["batch"]
    x, y = peer_worker.synthetic(np, shape, batch * 2)
    for k in range(2):
        model.train_on_batch(x[k * batch : (k + 1) * batch], y[k * batch : (k + 1) * batch])
    f = model.train_function._f
    return f.dispatches, f.submits


def main():
    import ferrokeras
    import keras

    device = str(getattr(ferrokeras, "device", lambda: "?")())
    print(f"device: {device}")
    print(f"{'model':<6} {'dispatches':>10} {'submits':>8}")
    for name in ("mlp", "cnn", "lstm"):
        dispatches, submits = count(keras, name)
        print(f"{name:<6} {dispatches:>10} {submits:>8}", flush=True)


if __name__ == "__main__":
    main()
