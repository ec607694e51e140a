"""Every Keras optimizer, stepped by ``train_on_batch``, against a NumPy transcription of
its update rule in Keras 2.3.1's ``optimizers.py`` (float64 reference, epsilon 1e-7).

The model is one linear ``Dense`` layer with the mean squared error, whose gradient is
known in closed form: for residuals ``r = x @ W + b - y`` over ``N`` samples and ``O``
outputs, ``dL/dW = 2 / (N * O) * x.T @ r`` and ``dL/db = 2 / (N * O) * r.sum(0)``.
"""

import keras
import numpy as np
import pytest
from keras import optimizers
from keras.layers import Dense
from keras.models import Sequential

EPS = 1e-7
rng = np.random.RandomState(3)
X = rng.randn(16, 4).astype("float32")
Y = rng.randn(16, 3).astype("float32")
W0 = (rng.randn(4, 3) * 0.5).astype("float32")
B0 = (rng.randn(3) * 0.1).astype("float32")


def grads(params):
    w, b = params
    r = X.astype("float64") @ w + b - Y
    scale = 2.0 / r.size
    return [scale * X.T.astype("float64") @ r, scale * r.sum(0)]


def sgd(lr, momentum=0.0, decay=0.0, nesterov=False):
    def step(ps, st, i):
        lr_t = lr / (1.0 + decay * i)
        ms = st.setdefault("m", [np.zeros_like(p) for p in ps])
        out = []
        for k, (p, g) in enumerate(zip(ps, grads(ps))):
            v = momentum * ms[k] - lr_t * g
            ms[k] = v
            out.append(p + momentum * v - lr_t * g if nesterov else p + v)
        return out

    return step


def rmsprop(lr, rho=0.9):
    def step(ps, st, i):
        acc = st.setdefault("a", [np.zeros_like(p) for p in ps])
        out = []
        for k, (p, g) in enumerate(zip(ps, grads(ps))):
            acc[k] = rho * acc[k] + (1 - rho) * g * g
            out.append(p - lr * g / (np.sqrt(acc[k]) + EPS))
        return out

    return step


def adagrad(lr):
    def step(ps, st, i):
        acc = st.setdefault("a", [np.zeros_like(p) for p in ps])
        out = []
        for k, (p, g) in enumerate(zip(ps, grads(ps))):
            acc[k] = acc[k] + g * g
            out.append(p - lr * g / (np.sqrt(acc[k]) + EPS))
        return out

    return step


def adadelta(lr, rho=0.95):
    def step(ps, st, i):
        acc = st.setdefault("a", [np.zeros_like(p) for p in ps])
        dacc = st.setdefault("d", [np.zeros_like(p) for p in ps])
        out = []
        for k, (p, g) in enumerate(zip(ps, grads(ps))):
            acc[k] = rho * acc[k] + (1 - rho) * g * g
            upd = g * np.sqrt(dacc[k] + EPS) / np.sqrt(acc[k] + EPS)
            out.append(p - lr * upd)
            dacc[k] = rho * dacc[k] + (1 - rho) * upd * upd
        return out

    return step


def adam(lr, b1=0.9, b2=0.999, amsgrad=False):
    def step(ps, st, i):
        t = i + 1
        lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        ms = st.setdefault("m", [np.zeros_like(p) for p in ps])
        vs = st.setdefault("v", [np.zeros_like(p) for p in ps])
        vh = st.setdefault("vh", [np.zeros_like(p) for p in ps])
        out = []
        for k, (p, g) in enumerate(zip(ps, grads(ps))):
            ms[k] = b1 * ms[k] + (1 - b1) * g
            vs[k] = b2 * vs[k] + (1 - b2) * g * g
            vh[k] = np.maximum(vh[k], vs[k])
            out.append(p - lr_t * ms[k] / (np.sqrt(vh[k] if amsgrad else vs[k]) + EPS))
        return out

    return step


def adamax(lr, b1=0.9, b2=0.999):
    def step(ps, st, i):
        lr_t = lr / (1 - b1 ** (i + 1))
        ms = st.setdefault("m", [np.zeros_like(p) for p in ps])
        us = st.setdefault("u", [np.zeros_like(p) for p in ps])
        out = []
        for k, (p, g) in enumerate(zip(ps, grads(ps))):
            ms[k] = b1 * ms[k] + (1 - b1) * g
            us[k] = np.maximum(b2 * us[k], np.abs(g))
            out.append(p - lr_t * ms[k] / (us[k] + EPS))
        return out

    return step


def nadam(lr, b1=0.9, b2=0.999, schedule_decay=0.004):
    def step(ps, st, i):
        t = i + 1
        sched = st.setdefault("sched", 1.0)
        mc_t = b1 * (1 - 0.5 * 0.96 ** (t * schedule_decay))
        mc_t1 = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * schedule_decay))
        s_new = sched * mc_t
        s_next = sched * mc_t * mc_t1
        st["sched"] = s_new
        ms = st.setdefault("m", [np.zeros_like(p) for p in ps])
        vs = st.setdefault("v", [np.zeros_like(p) for p in ps])
        out = []
        for k, (p, g) in enumerate(zip(ps, grads(ps))):
            g_prime = g / (1 - s_new)
            ms[k] = b1 * ms[k] + (1 - b1) * g
            m_prime = ms[k] / (1 - s_next)
            vs[k] = b2 * vs[k] + (1 - b2) * g * g
            v_prime = vs[k] / (1 - b2**t)
            m_bar = (1 - mc_t) * g_prime + mc_t1 * m_prime
            out.append(p - lr * m_bar / (np.sqrt(v_prime) + EPS))
        return out

    return step


def clipped_sgd(lr, clipnorm, clipvalue):
    def step(ps, st, i):
        gs = grads(ps)
        norm = np.sqrt(sum((g * g).sum() for g in gs))
        gs = [g * clipnorm / max(norm, clipnorm) for g in gs]
        gs = [np.clip(g, -clipvalue, clipvalue) for g in gs]
        return [p - lr * g for p, g in zip(ps, gs)]

    return step


CASES = [
    ("sgd", optimizers.SGD(lr=0.1), sgd(0.1)),
    (
        "sgd_momentum_decay",
        optimizers.SGD(lr=0.1, momentum=0.9, decay=0.1),
        sgd(0.1, 0.9, decay=0.1),
    ),
    (
        "sgd_nesterov",
        optimizers.SGD(lr=0.1, momentum=0.8, nesterov=True),
        sgd(0.1, 0.8, nesterov=True),
    ),
    ("rmsprop", optimizers.RMSprop(lr=0.01), rmsprop(0.01)),
    ("adagrad", optimizers.Adagrad(lr=0.1), adagrad(0.1)),
    ("adadelta", optimizers.Adadelta(lr=1.0), adadelta(1.0)),
    ("adam", optimizers.Adam(lr=0.01), adam(0.01)),
    ("adam_amsgrad", optimizers.Adam(lr=0.01, amsgrad=True), adam(0.01, amsgrad=True)),
    ("adamax", optimizers.Adamax(lr=0.02), adamax(0.02)),
    ("nadam", optimizers.Nadam(lr=0.01), nadam(0.01)),
    (
        "clipnorm_clipvalue",
        optimizers.SGD(lr=0.5, clipnorm=0.5, clipvalue=0.1),
        clipped_sgd(0.5, 0.5, 0.1),
    ),
]


@pytest.mark.parametrize("name,opt,ref", CASES, ids=[c[0] for c in CASES])
def test_optimizer_steps_match_numpy(name, opt, ref):
    opt = type(opt).from_config(opt.get_config())  # a fresh instance per run
    model = Sequential([Dense(3, input_shape=(4,))])
    model.compile(opt, "mse")
    model.set_weights([W0, B0])
    params = [W0.astype("float64"), B0.astype("float64")]
    state = {}
    for i in range(4):
        loss = model.train_on_batch(X, Y)
        r = X.astype("float64") @ params[0] + params[1] - Y
        np.testing.assert_allclose(
            loss, np.mean(r**2), rtol=1e-4, err_msg=f"{name}: loss of step {i}"
        )
        params = ref(params, state, i)
        got = model.get_weights()
        for g, want in zip(got, params):
            np.testing.assert_allclose(
                g, want, rtol=2e-4, atol=2e-6, err_msg=f"{name}: weights after step {i}"
            )
    assert int(keras.backend.get_value(model.optimizer.iterations)) == 4


@pytest.mark.parametrize(
    "name", ["sgd", "rmsprop", "adagrad", "adadelta", "adam", "adamax", "nadam"]
)
def test_optimizer_by_name_learns(name, xor_data):
    x, y = xor_data
    model = Sequential(
        [Dense(16, input_shape=(8,), activation="tanh"), Dense(1, activation="sigmoid")]
    )
    model.compile(name, "binary_crossentropy")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=5, batch_size=32, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert np.isfinite(after) and after < before
