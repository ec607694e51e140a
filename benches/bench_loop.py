"""Loop primitive: compile time and step time of a hand-written LSTM through K.rnn.

The body is traced once, so building the graph, its gradient and the compiled function
should take about the same time for 10 and for 1000 timesteps; an unrolled graph grows
with T. Run: .venv/bin/python benches/bench_loop.py
"""

import time

import numpy as np
from ferrokeras import backend as K


def lstm_function(T, B=32, D=32, H=64, unroll=False):
    rng = np.random.default_rng(0)
    W = K.variable(rng.normal(size=(D, 4 * H)) * 0.1)
    U = K.variable(rng.normal(size=(H, 4 * H)) * 0.1)
    x = K.placeholder(shape=(None, T, D))

    def step(x_t, states):
        h, c = states
        z = K.dot(x_t, W) + K.dot(h, U)
        i, f = K.sigmoid(z[:, :H]), K.sigmoid(z[:, H : 2 * H])
        o, g = K.sigmoid(z[:, 2 * H : 3 * H]), K.tanh(z[:, 3 * H :])
        c2 = f * c + i * g
        h2 = o * K.tanh(c2)
        return h2, [h2, c2]

    h0 = K.zeros((B, H))
    last, _, _ = K.rnn(step, x, [h0, h0], unroll=unroll)
    loss = K.sum(last)
    grads = K.gradients(loss, [W, U])
    f = K.function([x], [loss] + grads)
    return f, rng.normal(size=(B, T, D)).astype("float32")


def main():
    print(f"{'timesteps':>10} {'unroll':>7} {'build+compile s':>16} {'fwd+bwd ms/step':>16}")
    for T, unroll in [(10, False), (100, False), (1000, False), (10, True), (100, True)]:
        t0 = time.perf_counter()
        f, xv = lstm_function(T, unroll=unroll)
        build = time.perf_counter() - t0
        f([xv])
        reps = 3
        t0 = time.perf_counter()
        for _ in range(reps):
            f([xv])
        per_step = (time.perf_counter() - t0) / reps / T * 1e3
        print(f"{T:>10} {str(unroll):>7} {build:>16.3f} {per_step:>16.3f}")


if __name__ == "__main__":
    main()
