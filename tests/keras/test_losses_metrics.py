"""Every built-in Keras loss and metric, through ``compile``/``evaluate``, against NumPy.

The model is the identity (``Activation('linear')``), so ``evaluate(y_pred, y_true)``
reports the loss and metrics of ``y_pred`` itself; the references are NumPy transcriptions
of the formulas in Keras 2.3.1's ``losses.py`` and ``metrics.py`` (epsilon 1e-7).
"""

import keras
import numpy as np
import pytest
from keras.layers import Activation
from keras.models import Sequential

EPS = 1e-7
rng = np.random.RandomState(42)
N, C = 24, 5
P = rng.dirichlet(np.ones(C), size=N).astype("float32")  # probabilities
LABELS = rng.randint(0, C, size=N)
ONEHOT = np.eye(C, dtype="float32")[LABELS]
BIN_T = rng.randint(0, 2, size=(N, 3)).astype("float32")
BIN_P = rng.uniform(0.05, 0.95, size=(N, 3)).astype("float32")
REG_T = rng.uniform(0.5, 2.0, size=(N, 3)).astype("float32")
REG_P = rng.uniform(0.5, 2.0, size=(N, 3)).astype("float32")


def _softplus(x):
    return np.log1p(np.exp(x))


def _l2n(x):
    return x / np.sqrt(np.maximum((x**2).sum(-1, keepdims=True), 1e-12))


def _bce(t, p):
    p = np.clip(p, EPS, 1 - EPS)
    return -(t * np.log(p) + (1 - t) * np.log(1 - p))


def _cce(t, p):
    p = p / p.sum(-1, keepdims=True)
    return -(t * np.log(np.clip(p, EPS, 1 - EPS))).sum(-1)


# name, y_true, y_pred, per-sample NumPy reference
LOSSES = [
    ("mean_squared_error", REG_T, REG_P, lambda t, p: ((p - t) ** 2).mean(-1)),
    ("mean_absolute_error", REG_T, REG_P, lambda t, p: np.abs(p - t).mean(-1)),
    (
        "mean_absolute_percentage_error",
        REG_T,
        REG_P,
        lambda t, p: 100 * np.abs((t - p) / np.clip(np.abs(t), EPS, None)).mean(-1),
    ),
    (
        "mean_squared_logarithmic_error",
        REG_T,
        REG_P,
        lambda t, p: (
            (np.log(np.clip(p, EPS, None) + 1) - np.log(np.clip(t, EPS, None) + 1)) ** 2
        ).mean(-1),
    ),
    (
        "squared_hinge",
        BIN_T,
        BIN_P - 0.5,
        lambda t, p: (np.maximum(1 - (2 * t - 1) * p, 0) ** 2).mean(-1),
    ),
    ("hinge", BIN_T, BIN_P - 0.5, lambda t, p: np.maximum(1 - (2 * t - 1) * p, 0).mean(-1)),
    (
        "categorical_hinge",
        ONEHOT,
        P,
        lambda t, p: np.maximum(0, ((1 - t) * p).max(-1) - (t * p).sum(-1) + 1),
    ),
    ("logcosh", REG_T, REG_P, lambda t, p: np.log(np.cosh(p - t)).mean(-1)),
    (
        "huber_loss",
        REG_T,
        3 * REG_P,
        # Keras's huber_loss is per element, not averaged over the last axis.
        lambda t, p: (
            0.5 * np.minimum(np.abs(p - t), 1) ** 2 + (np.abs(p - t) - np.minimum(np.abs(p - t), 1))
        ),
    ),
    ("categorical_crossentropy", ONEHOT, P, _cce),
    (
        "sparse_categorical_crossentropy",
        LABELS[:, None].astype("float32"),
        P,
        lambda t, p: -np.log(np.clip(p[np.arange(N), t[:, 0].astype(int)], EPS, 1 - EPS)),
    ),
    ("binary_crossentropy", BIN_T, BIN_P, lambda t, p: _bce(t, p).mean(-1)),
    (
        "kullback_leibler_divergence",
        ONEHOT * 0.9 + 0.02,
        P,
        lambda t, p: (np.clip(t, EPS, 1) * np.log(np.clip(t, EPS, 1) / np.clip(p, EPS, 1))).sum(-1),
    ),
    ("poisson", REG_T, REG_P, lambda t, p: (p - t * np.log(p + EPS)).mean(-1)),
    ("cosine_proximity", REG_T - 1, REG_P - 1, lambda t, p: -(_l2n(t) * _l2n(p)).sum(-1)),
]


def identity_model(n):
    return Sequential([Activation("linear", input_shape=(n,))])


@pytest.mark.parametrize("name,t,p,ref", LOSSES, ids=[loss[0] for loss in LOSSES])
def test_every_loss_matches_numpy(name, t, p, ref):
    model = identity_model(p.shape[1])
    model.compile("sgd", loss=name)
    got = model.evaluate(p, t, batch_size=N, verbose=0)
    want = np.mean(ref(t.astype("float64"), p.astype("float64")))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
    # Also through the loss function itself, on concrete arrays, and the Loss class.
    direct = keras.backend.eval(
        keras.losses.get(name)(keras.backend.constant(t), keras.backend.constant(p))
    )
    np.testing.assert_allclose(
        direct, ref(t.astype("float64"), p.astype("float64")), rtol=2e-4, atol=1e-6
    )


LOSS_CLASSES = [
    (keras.losses.MeanSquaredError(), REG_T, REG_P, "mean_squared_error"),
    (keras.losses.CategoricalCrossentropy(label_smoothing=0.1), ONEHOT, P, None),
    (keras.losses.BinaryCrossentropy(from_logits=True), BIN_T, BIN_P - 0.5, None),
    (keras.losses.Huber(delta=0.5), REG_T, REG_P, None),
]


@pytest.mark.parametrize(
    "loss,t,p,_", LOSS_CLASSES, ids=[type(c[0]).__name__ for c in LOSS_CLASSES]
)
def test_loss_classes_train(loss, t, p, _):
    model = identity_model(p.shape[1])
    model.compile("sgd", loss=loss)
    assert np.isfinite(model.evaluate(p, t, verbose=0))


def test_label_smoothing_and_logits_match_numpy():
    t, p = ONEHOT, P
    cce = keras.losses.CategoricalCrossentropy(label_smoothing=0.1)
    got = keras.backend.eval(cce(keras.backend.constant(t), keras.backend.constant(p)))
    np.testing.assert_allclose(got, _cce(t * 0.9 + 0.1 / C, p.astype("float64")).mean(), rtol=1e-4)
    logits = BIN_P - 0.5
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    got = keras.backend.eval(bce(keras.backend.constant(BIN_T), keras.backend.constant(logits)))
    x, z = logits.astype("float64"), BIN_T
    want = (np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x)))).mean()
    np.testing.assert_allclose(got, want, rtol=1e-4)


# name, y_true, y_pred, per-sample NumPy reference
METRICS = [
    ("accuracy", ONEHOT, P, lambda t, p: (t.argmax(-1) == p.argmax(-1)).astype(float)),
    ("binary_accuracy", BIN_T, BIN_P, lambda t, p: (t == np.round(p)).mean(-1)),
    ("categorical_accuracy", ONEHOT, P, lambda t, p: (t.argmax(-1) == p.argmax(-1)).astype(float)),
    (
        "top_k_categorical_accuracy",
        ONEHOT,
        P,
        lambda t, p: np.array(
            [t[i].argmax() in np.argsort(-p[i])[:5] for i in range(len(t))], float
        ),
    ),
    ("mse", REG_T, REG_P, lambda t, p: ((p - t) ** 2).mean(-1)),
    ("mae", REG_T, REG_P, lambda t, p: np.abs(p - t).mean(-1)),
    ("mape", REG_T, REG_P, lambda t, p: 100 * np.abs((t - p) / t).mean(-1)),
    ("msle", REG_T, REG_P, lambda t, p: ((np.log(p + 1) - np.log(t + 1)) ** 2).mean(-1)),
    ("cosine", REG_T - 1, REG_P - 1, lambda t, p: (_l2n(t) * _l2n(p)).sum(-1)),
    (
        "kullback_leibler_divergence",
        ONEHOT * 0.9 + 0.02,
        P,
        lambda t, p: (t * np.log(t / p)).sum(-1),
    ),
    ("poisson", REG_T, REG_P, lambda t, p: (p - t * np.log(p + EPS)).mean(-1)),
]


@pytest.mark.parametrize("name,t,p,ref", METRICS, ids=[m[0] for m in METRICS])
def test_every_metric_matches_numpy(name, t, p, ref):
    model = identity_model(p.shape[1])
    model.compile("sgd", loss="mse", metrics=[name])
    _, got = model.evaluate(p, t, batch_size=7, verbose=0)  # several batches, one mean
    np.testing.assert_allclose(
        got, np.mean(ref(t.astype("float64"), p.astype("float64"))), rtol=2e-4, atol=1e-6
    )


def test_sparse_categorical_metrics():
    model = identity_model(C)
    model.compile(
        "sgd",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy", "sparse_top_k_categorical_accuracy"],
    )
    _, acc, top5 = model.evaluate(P, LABELS[:, None], verbose=0)
    assert acc == pytest.approx(np.mean(P.argmax(-1) == LABELS))
    assert top5 == pytest.approx(1.0)
    model.compile(
        "sgd",
        loss="sparse_categorical_crossentropy",
        metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=2)],
    )
    _, top2 = model.evaluate(P, LABELS[:, None], verbose=0)
    assert top2 == pytest.approx(np.mean([LABELS[i] in np.argsort(-P[i])[:2] for i in range(N)]))


def test_confusion_matrix_metrics():
    t = BIN_T[:, :1]
    p = BIN_P[:, :1]
    model = identity_model(1)
    model.compile(
        "sgd",
        loss="binary_crossentropy",
        metrics=[
            keras.metrics.TruePositives(),
            keras.metrics.FalsePositives(),
            keras.metrics.TrueNegatives(),
            keras.metrics.FalseNegatives(),
            keras.metrics.Precision(),
            keras.metrics.Recall(),
            keras.metrics.AUC(num_thresholds=400),
            keras.metrics.BinaryAccuracy(),
            keras.metrics.RootMeanSquaredError(),
        ],
    )
    _, tp, fp, tn, fn, prec, rec, auc, acc, rmse = model.evaluate(p, t, batch_size=5, verbose=0)
    pred = p > 0.5
    want = [
        np.sum(pred & (t == 1)),
        np.sum(pred & (t == 0)),
        np.sum(~pred & (t == 0)),
        np.sum(~pred & (t == 1)),
    ]
    np.testing.assert_array_equal([tp, fp, tn, fn], want)
    assert prec == pytest.approx(want[0] / (want[0] + want[1]), rel=1e-5)
    assert rec == pytest.approx(want[0] / (want[0] + want[3]), rel=1e-5)
    from sklearn.metrics import roc_auc_score

    assert auc == pytest.approx(roc_auc_score(t[:, 0], p[:, 0]), abs=0.02)
    assert acc == pytest.approx(np.mean(pred == (t == 1)))
    assert rmse == pytest.approx(np.sqrt(np.mean((p - t) ** 2)), rel=1e-5)


def test_custom_metric_function_and_add_metric():
    def mean_pred(y_true, y_pred):
        return keras.backend.mean(y_pred)

    model = identity_model(3)
    model.compile("sgd", loss="mse", metrics=[mean_pred])
    _, got = model.evaluate(REG_P, REG_T, batch_size=N, verbose=0)
    assert got == pytest.approx(REG_P.mean(), rel=1e-5)
