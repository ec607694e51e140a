"""Train a two-layer network with the ferrokeras backend API alone.

A 20 -> 64 -> 1 tanh network fits a smooth synthetic regression target with plain
gradient descent. The whole training step (forward pass, gradients, parameter updates)
is one compiled `K.function` with `updates=`, called once per step.

Run it with `make demo`, or `python examples/quickstart.py` once ferrokeras is installed.
"""

import sys
import time

import ferrokeras
import numpy as np
from ferrokeras import backend as K

N_SAMPLES, N_IN, N_HIDDEN = 512, 20, 64
STEPS, LOG_EVERY, LEARNING_RATE = 300, 50, 0.1


def glorot_uniform(rng, fan_in, fan_out):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype("float32")


def make_data(rng):
    """Targets are a fixed smooth function of the inputs, so the loss can go near 0."""
    x = rng.standard_normal((N_SAMPLES, N_IN)).astype("float32")
    direction = rng.standard_normal((N_IN, 1)) / np.sqrt(N_IN)
    y = np.sin(2.0 * x @ direction) + 0.5 * x[:, :1] * x[:, 1:2]
    return x, y.astype("float32")


def main():
    device = getattr(ferrokeras, "device", lambda: "cpu")()
    print(f"ferrokeras device: {device}")

    rng = np.random.default_rng(0)
    x_train, y_train = make_data(rng)

    x = K.placeholder(shape=(None, N_IN), name="x")
    y = K.placeholder(shape=(None, 1), name="y")
    w1 = K.variable(glorot_uniform(rng, N_IN, N_HIDDEN), name="w1")
    b1 = K.variable(np.zeros(N_HIDDEN, dtype="float32"), name="b1")
    w2 = K.variable(glorot_uniform(rng, N_HIDDEN, 1), name="w2")
    b2 = K.variable(np.zeros(1, dtype="float32"), name="b2")
    params = [w1, b1, w2, b2]

    hidden = K.tanh(K.dot(x, w1) + b1)
    prediction = K.dot(hidden, w2) + b2
    loss = K.mean(K.square(prediction - y))

    grads = K.gradients(loss, params)
    updates = [(p, p - LEARNING_RATE * g) for p, g in zip(params, grads)]
    train_step = K.function([x, y], [loss], updates=updates)

    # The first call compiles the plan; keep it out of the per-step timing.
    initial_loss = float(train_step([x_train, y_train])[0])
    print(f"step {0:4d}  loss {initial_loss:.5f}")

    start = time.perf_counter()
    for step in range(1, STEPS + 1):
        current = float(train_step([x_train, y_train])[0])
        if step % LOG_EVERY == 0:
            print(f"step {step:4d}  loss {current:.5f}")
    elapsed = time.perf_counter() - start

    # The loss returned by a call is computed before that call's updates; evaluate the
    # parameters as they are now.
    final_loss = float(K.function([x, y], [loss])([x_train, y_train])[0])
    print(f"final loss {final_loss:.5f} (initial {initial_loss:.5f})")
    print(
        f"mean time per training step: {1e3 * elapsed / STEPS:.3f} ms "
        f"({N_SAMPLES} samples, {N_IN}->{N_HIDDEN}->1)"
    )
    print(f"first-layer weight norm: {np.linalg.norm(K.get_value(w1)):.4f}")

    if not final_loss < 0.5 * initial_loss:
        print("error: the loss did not fall by at least half", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
