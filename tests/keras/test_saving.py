"""HDF5 saving and loading round trips: reloaded models predict the same values."""

import json

import keras
import numpy as np
import pytest
from keras.layers import Activation, Dense, Dropout, Input, concatenate
from keras.models import Model, Sequential, load_model


@pytest.fixture
def trained(xor_data):
    x, y = xor_data
    model = Sequential(
        [
            Dense(16, input_shape=(8,), activation="relu"),
            Dropout(0.2),
            Dense(2),
            Activation("softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    return model, x, y


def test_save_and_load_model(tmp_path, trained):
    model, x, y = trained
    path = str(tmp_path / "model.h5")
    model.save(path)
    keras.backend.clear_session()
    loaded = load_model(path)
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-6, atol=1e-7)
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]
    np.testing.assert_array_equal(
        keras.backend.get_value(loaded.optimizer.iterations),
        keras.backend.get_value(model.optimizer.iterations),
    )


def test_optimizer_state_survives_save(tmp_path, xor_data):
    """After a reload, one more training step gives the same weights as without the reload
    (no Dropout here, so both steps see the same gradients)."""
    x, y = xor_data
    model = Sequential(
        [Dense(8, input_shape=(8,), activation="tanh"), Dense(1, activation="sigmoid")]
    )
    model.compile(keras.optimizers.Adam(lr=0.01, amsgrad=True), "binary_crossentropy")
    model.fit(x, y, epochs=2, batch_size=64, verbose=0)
    path = str(tmp_path / "m.h5")
    model.save(path)
    loaded = load_model(path)
    model.train_on_batch(x[:32], y[:32])
    loaded.train_on_batch(x[:32], y[:32])
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(loaded.optimizer.get_weights(), model.optimizer.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_save_weights_and_load_weights(tmp_path, trained):
    model, x, _ = trained
    path = str(tmp_path / "weights.h5")
    model.save_weights(path)
    fresh = Sequential.from_config(model.get_config())
    assert not np.allclose(fresh.predict(x), model.predict(x))
    fresh.load_weights(path)
    np.testing.assert_allclose(fresh.predict(x), model.predict(x), rtol=1e-6, atol=1e-7)


def test_load_weights_by_name_into_a_different_model(tmp_path):
    a = Input(shape=(4,))
    h = Dense(5, name="shared")(a)
    out = Dense(2, name="head")(h)
    model = Model(a, out)
    path = str(tmp_path / "w.h5")
    model.save_weights(path)
    b = Input(shape=(4,))
    other = Model(b, Dense(7, name="other")(Dense(5, name="shared")(b)))
    other.load_weights(path, by_name=True)
    np.testing.assert_array_equal(
        other.get_layer("shared").get_weights()[0], model.get_layer("shared").get_weights()[0]
    )


def test_json_and_yaml_configs(trained):
    model, x, _ = trained
    clone = keras.models.model_from_json(model.to_json())
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone.predict(x), model.predict(x), rtol=1e-6, atol=1e-7)
    assert json.loads(model.to_json())["config"]["layers"][0]["class_name"] == "Dense"


def test_functional_model_round_trip(tmp_path, xor_data):
    x, _ = xor_data
    a = Input(shape=(4,), name="left")
    b = Input(shape=(4,), name="right")
    merged = concatenate([Dense(3, name="da")(a), Dense(3, name="db")(b)])
    out = Dense(1, activation="sigmoid", name="out")(merged)
    model = Model([a, b], out)
    model.compile("rmsprop", "binary_crossentropy")
    path = str(tmp_path / "functional.h5")
    model.save(path)
    loaded = load_model(path)
    feed = [x[:, :4], x[:, 4:]]
    np.testing.assert_allclose(loaded.predict(feed), model.predict(feed), rtol=1e-6, atol=1e-7)


def test_custom_objects(tmp_path, xor_data):
    x, y = xor_data

    def scaled_mse(y_true, y_pred):
        return 2.0 * keras.losses.mean_squared_error(y_true, y_pred)

    model = Sequential([Dense(1, input_shape=(8,)), keras.layers.Lambda(lambda t: t * 3.0)])
    model.compile("sgd", scaled_mse)
    model.fit(x, y, epochs=1, verbose=0)
    path = str(tmp_path / "custom.h5")
    model.save(path)
    loaded = load_model(path, custom_objects={"scaled_mse": scaled_mse})
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-6)


def test_model_checkpoint_weights_only(tmp_path, trained):
    model, x, y = trained
    pattern = str(tmp_path / "w.{epoch:02d}-{loss:.3f}.h5")
    model.fit(
        x,
        y,
        epochs=2,
        verbose=0,
        callbacks=[keras.callbacks.ModelCheckpoint(pattern, save_weights_only=True)],
    )
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and files[0].startswith("w.01-")
    model.load_weights(str(tmp_path / files[-1]))
