"""Keras 2.3.1 code that depends on TensorFlow's behaviour in the backend: attributes Keras
reads on tensors and variables, dtypes of Python values, tensor indices in metrics and
channels-first sparse targets."""

import numpy as np
import pytest
from keras import backend as K
from keras import metrics
from keras.layers import Conv2D, Dense, Input, Layer, TimeDistributed
from keras.models import Model, Sequential


def test_time_distributed_with_a_fixed_batch_size():
    # Keras guards a block of TimeDistributed.call with hasattr(y, '_uses_learning_phase');
    # TF's op outputs have no such attribute, so the (broken) block never runs.
    model = Sequential([TimeDistributed(Dense(2), batch_input_shape=(1, 3, 4))])
    assert model.output_shape == (1, 3, 2)
    x = np.random.RandomState(0).rand(1, 3, 4).astype("float32")
    w, b = model.layers[0].get_weights()
    np.testing.assert_allclose(model.predict(x), x @ w + b, rtol=1e-5, atol=1e-6)


class _Scale(Layer):
    """A layer that keeps its weight as a plain `K.variable` attribute."""

    def build(self, input_shape):
        self.scale = K.variable(2.0, name="scale")
        super().build(input_shape)

    def call(self, x):
        return x * self.scale


@pytest.mark.skipif(
    not hasattr(Layer, "__setattr__") or Layer.__setattr__ is object.__setattr__,
    reason="Keras 2.2 does not track variables assigned to layer attributes (2.3 does)",
)
def test_variable_assigned_to_a_layer_is_trainable(capsys):
    layer = _Scale()
    inp = Input((3,))
    model = Model(inp, Dense(1)(layer(inp)))
    assert layer.trainable_weights == [layer.scale] and layer.non_trainable_weights == []
    model.compile("sgd", "mse")
    before = K.get_value(layer.scale)
    model.train_on_batch(np.ones((4, 3), "float32"), np.full((4, 1), 10.0, "float32"))
    assert K.get_value(layer.scale) != before


@pytest.mark.skipif(
    not hasattr(metrics, "SensitivityAtSpecificity"), reason="metric classes are Keras 2.3+"
)
@pytest.mark.parametrize("name", ["SensitivityAtSpecificity", "SpecificityAtSensitivity"])
def test_threshold_metrics(name):
    metric = getattr(metrics, name)(0.5)
    # Built on K.zeros_like([...]) of Python floats (float32 in TF) and K.switch.
    y_true = K.constant([0.0, 0.0, 1.0, 1.0])
    y_pred = K.constant([0.1, 0.3, 0.6, 0.9])
    K.get_session().run(metric.update_state(y_true, y_pred))  # as under TensorFlow 1
    assert float(K.eval(metric.result())) == pytest.approx(1.0)
    model = Sequential([Dense(1, activation="sigmoid", input_shape=(4,))])
    model.compile("sgd", "binary_crossentropy", metrics=[metric])
    x = np.random.RandomState(1).rand(32, 4).astype("float32")
    history = model.fit(x, (x.sum(1) > 2).astype("float32"), epochs=1, verbose=0)
    assert 0.0 <= history.history[metric.name][0] <= 1.0


def test_channels_first_sparse_categorical_crossentropy():
    K.set_image_data_format("channels_first")
    try:
        model = Sequential(
            [
                Conv2D(
                    3, 1, activation="softmax", input_shape=(2, 3, 3), data_format="channels_first"
                )
            ]
        )
        model.compile("sgd", lambda t, p: K.sparse_categorical_crossentropy(t, p, axis=1))
        rng = np.random.RandomState(2)
        x = rng.rand(2, 2, 3, 3).astype("float32")
        y = rng.randint(0, 3, (2, 1, 3, 3))
        p = np.clip(model.predict(x), 1e-7, 1 - 1e-7)
        ref = -np.log(np.take_along_axis(p, y, 1) / p.sum(1, keepdims=True)).mean()
        np.testing.assert_allclose(model.test_on_batch(x, y), ref, rtol=1e-5)
    finally:
        K.set_image_data_format("channels_last")


def test_map_fn_indexing_a_variable_with_its_element():
    v = K.variable(np.arange(6.0).reshape(3, 2))
    r = K.map_fn(lambda i: K.sum(v[i]), K.arange(3), dtype="float32")
    np.testing.assert_allclose(K.eval(r), [1.0, 5.0, 9.0])
