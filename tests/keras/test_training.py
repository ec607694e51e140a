"""Sequential and functional models trained the way users write them: every optimizer,
``fit`` with validation and callbacks, ``evaluate``, ``predict``, the ``*_on_batch`` calls."""

import keras
import numpy as np
import pytest
from keras import backend as K
from keras import optimizers
from keras.layers import Activation, Dense, Dropout, Input, concatenate
from keras.models import Model, Sequential

# The name Keras logs `metrics=["accuracy"]` under: "acc" up to Keras 2.2.5, then "accuracy".
ACC = "accuracy" if tuple(map(int, keras.__version__.split(".")[:2])) >= (2, 3) else "acc"


def mlp(n_in=8, n_out=2, hidden=16, dropout=0.1):
    return Sequential(
        [
            Dense(hidden, input_shape=(n_in,)),
            Activation("relu"),
            Dropout(dropout),
            Dense(n_out, activation="softmax"),
        ]
    )


def test_mlp_learns_with_adam(xor_data):
    x, y = xor_data
    yc = keras.utils.to_categorical(y, 2)
    model = mlp()
    model.compile(
        optimizer=optimizers.Adam(lr=0.01), loss="categorical_crossentropy", metrics=["accuracy"]
    )
    before = model.evaluate(x, yc, verbose=0)[0]
    hist = model.fit(x, yc, epochs=15, batch_size=32, verbose=0)
    after, acc = model.evaluate(x, yc, verbose=0)
    assert np.all(np.isfinite(hist.history["loss"]))
    assert after < before
    assert acc > 0.8


def test_fit_with_validation_split_and_callbacks(tmp_path, xor_data, capsys):
    x, y = xor_data
    yc = keras.utils.to_categorical(y, 2)
    model = mlp()
    model.compile(optimizers.Adam(lr=0.01), "categorical_crossentropy", metrics=["accuracy"])
    ckpt = str(tmp_path / "best.h5")
    callbacks = [
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=1e9),
        keras.callbacks.ModelCheckpoint(ckpt, monitor="val_loss", save_best_only=True),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1),
        keras.callbacks.LearningRateScheduler(lambda epoch: 0.01 / (1 + epoch)),
        keras.callbacks.TerminateOnNaN(),
    ]
    hist = model.fit(
        x, yc, epochs=10, batch_size=64, validation_split=0.25, callbacks=callbacks, verbose=1
    )
    out = capsys.readouterr().out
    # Keras's progress bar, with the validation metrics at the end of each epoch.
    assert "Train on 192 samples, validate on 64 samples" in out
    assert "Epoch 1/10" in out and f"val_{ACC}" in out
    # min_delta is huge, so no epoch counts as an improvement: stops after 1 + patience.
    assert len(hist.history["loss"]) == 3
    assert set(hist.history) >= {"loss", ACC, "val_loss", f"val_{ACC}", "lr"}
    best = keras.models.load_model(ckpt)
    assert best.predict(x[:4]).shape == (4, 2)
    assert (tmp_path / "log.csv").read_text().count("\n") == 4


def test_metrics_report_the_current_batch(xor_data):
    """Stateful metrics report values that include the batch just seen (as under TF)."""
    x, y = xor_data
    model = Sequential([Dense(1, input_shape=(8,), activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", metrics=["accuracy"])
    pred = model.predict(x)
    expected = np.mean((pred[:, 0] > 0.5) == y)
    loss, acc = model.evaluate(x, y, batch_size=len(x), verbose=0)
    assert acc == pytest.approx(expected)
    # Several batches: the mean over all of them, not the last one only.
    loss, acc = model.evaluate(x, y, batch_size=50, verbose=0)
    assert acc == pytest.approx(expected)


def test_evaluate_predict_and_batch_calls(xor_data):
    x, y = xor_data
    yc = keras.utils.to_categorical(y, 2)
    model = mlp()
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    out = model.train_on_batch(x[:32], yc[:32])
    assert len(out) == 2 and all(np.isfinite(out))
    out = model.test_on_batch(x[:32], yc[:32])
    assert len(out) == 2
    p = model.predict_on_batch(x[:5])
    assert p.shape == (5, 2)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    # Dropout is off when predicting: the same input gives the same output.
    np.testing.assert_allclose(model.predict(x[:5]), model.predict(x[:5]))
    np.testing.assert_allclose(model.predict(x[:5], batch_size=2), p, rtol=1e-5, atol=1e-6)
    assert model.predict_classes(x[:5]).shape == (5,)
    loss, acc = model.evaluate(x, yc, batch_size=64, verbose=0)
    assert np.isfinite(loss) and 0.0 <= acc <= 1.0


def test_sample_and_class_weights(xor_data):
    x, y = xor_data
    model = Sequential([Dense(1, input_shape=(8,), activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", weighted_metrics=["accuracy"])
    sw = np.where(y == 1, 2.0, 0.5)
    h = model.fit(x, y, sample_weight=sw, epochs=2, verbose=0)
    assert np.all(np.isfinite(h.history["loss"]))
    h = model.fit(x, y, class_weight={0: 1.0, 1: 3.0}, epochs=1, verbose=0)
    assert np.isfinite(h.history["loss"][0])
    # With all weights equal to 1, the weighted loss is the plain one.
    ones = model.evaluate(x, y, sample_weight=np.ones(len(x)), verbose=0)
    plain = model.evaluate(x, y, verbose=0)
    np.testing.assert_allclose(ones, plain, rtol=1e-5)


def test_functional_api_two_inputs_two_outputs(xor_data):
    x, y = xor_data
    a = Input(shape=(4,), name="a")
    b = Input(shape=(4,), name="b")
    h = concatenate([Dense(8, activation="tanh")(a), Dense(8, activation="tanh")(b)])
    cls = Dense(2, activation="softmax", name="cls")(h)
    reg = Dense(1, name="reg")(h)
    model = Model(inputs=[a, b], outputs=[cls, reg])
    model.compile(
        "adam",
        loss={"cls": "categorical_crossentropy", "reg": "mse"},
        loss_weights={"cls": 1.0, "reg": 0.5},
        metrics={"cls": "accuracy"},
    )
    targets = [keras.utils.to_categorical(y, 2), x.sum(axis=1, keepdims=True)]
    hist = model.fit([x[:, :4], x[:, 4:]], targets, epochs=3, batch_size=32, verbose=0)
    assert {"loss", "cls_loss", "reg_loss", f"cls_{ACC}"} <= set(hist.history)
    first, last = hist.history["loss"][0], hist.history["loss"][-1]
    assert last < first
    loss, cls_loss, reg_loss, acc = model.evaluate([x[:, :4], x[:, 4:]], targets, verbose=0)
    assert loss == pytest.approx(cls_loss + 0.5 * reg_loss, rel=1e-4)
    p_cls, p_reg = model.predict({"a": x[:3, :4], "b": x[:3, 4:]})
    assert p_cls.shape == (3, 2) and p_reg.shape == (3, 1)
    # A sub-model over an intermediate tensor shares the weights.
    sub = Model(inputs=[a, b], outputs=h)
    assert sub.predict([x[:3, :4], x[:3, 4:]]).shape == (3, 16)


def test_regularizers_constraints_and_initializers(xor_data):
    x, y = xor_data
    model = Sequential(
        [
            Dense(
                8,
                input_shape=(8,),
                kernel_regularizer=keras.regularizers.l1_l2(0.01, 0.01),
                bias_regularizer="l2",
                activity_regularizer=keras.regularizers.l1(1e-3),
                kernel_constraint=keras.constraints.max_norm(1.0),
                kernel_initializer="he_normal",
                bias_initializer=keras.initializers.Constant(0.1),
            ),
            Dense(
                1,
                activation="sigmoid",
                kernel_initializer="glorot_uniform",
                kernel_constraint=keras.constraints.NonNeg(),
            ),
        ]
    )
    model.compile("sgd", "binary_crossentropy")
    assert len(model.losses) == 3
    model.fit(x, y, epochs=2, verbose=0)
    w = model.layers[0].get_weights()[0]
    assert np.all(np.sqrt((w**2).sum(axis=0)) <= 1.0 + 1e-5)
    assert np.all(model.layers[1].get_weights()[0] >= 0)


def test_learning_phase_is_fed(xor_data):
    """Dropout is active in training calls and not in test calls of the same model."""
    x, _ = xor_data
    model = Sequential([Dropout(0.5, input_shape=(8,))])
    f = K.function([model.input, K.learning_phase()], [model.output])
    train_out = f([x, 1])[0]
    test_out = f([x, 0])[0]
    np.testing.assert_allclose(test_out, x)
    zeros = np.mean(train_out == 0)
    assert 0.3 < zeros < 0.7
    np.testing.assert_allclose(train_out[train_out != 0], 2 * x[train_out != 0], rtol=1e-6)
