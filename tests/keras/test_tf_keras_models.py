"""Models saved by tf.keras 2.x load with ``keras.models.load_model`` and predict as
TensorFlow did.

The fixtures in ``tests/data/tf_keras/`` were written by ``make_fixtures.py`` there (tf_keras
2.21 on TensorFlow 2.21): ``<name>.h5`` files and, in ``expected.npz``, TensorFlow's
predictions on fixed inputs, and for two compiled models its predictions after one more
``train_on_batch``. No TensorFlow is needed here.
"""

import os
import warnings

import h5py
import keras
import numpy as np
import pytest
from ferrokeras._keras_tf_h5 import (
    TfKerasConfigError,
    _slot_of,
    translate_model_config,
    translate_training_config,
)
from keras import backend as K

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "tf_keras")
EXPECTED = np.load(os.path.join(DATA, "expected.npz"))
MODELS = [
    "mlp",
    "mlp_step",
    "sgd_step",
    "cnn2d",
    "conv1d",
    "conv1d_extra",
    "activations",
    "conv3d",
    "rnn",
    "merge",
    "nested",
    "adagrad",
    "zoo",
]
# Small models compiled with each optimizer, as tf.keras 2.11+ and its legacy optimizers
# save them.
OPTIMIZER_MODELS = {
    "opt_sgd": "SGD",
    "opt_adamax": "Adamax",
    "opt_adadelta": "Adadelta",
    "opt_legacy_adam_amsgrad": "Adam",
    "opt_legacy_rmsprop": "RMSprop",
    "opt_legacy_nadam": "Nadam",
    "opt_legacy_adagrad": "Adagrad",
    "opt_legacy_adadelta": "Adadelta",
    "opt_legacy_adamax": "Adamax",
}


def path(name):
    return os.path.join(DATA, name + ".h5")


def arrays(name, prefix):
    out, i = [], 0
    while f"{name}/{prefix}{i}" in EXPECTED:
        out.append(EXPECTED[f"{name}/{prefix}{i}"])
        i += 1
    return out


def one(xs):
    return xs[0] if len(xs) == 1 else xs


def predict(model, name):
    ys = model.predict(one(arrays(name, "x")))
    return ys if isinstance(ys, list) else [ys]


@pytest.mark.parametrize("name", MODELS + list(OPTIMIZER_MODELS))
def test_predictions_match_tensorflow(name):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.models.load_model(path(name))
    assert not [w for w in caught if "was not loaded" in str(w.message)]  # nor its optimizer state
    got, want = predict(model, name), arrays(name, "y")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_compile_false_loads_the_same_model(name):
    model = keras.models.load_model(path(name), compile=False)
    assert getattr(model, "optimizer", None) is None
    for g, w in zip(predict(model, name), arrays(name, "y")):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "name,optimizer,loss",
    [
        ("mlp", "Adam", "categorical_crossentropy"),
        ("mlp_step", "Adam", "mse"),
        ("sgd_step", "SGD", "mean_absolute_error"),
        ("cnn2d", "RMSprop", "categorical_crossentropy"),
        ("rnn", "Adam", "mse"),
        ("nested", "Nadam", "binary_crossentropy"),
        ("adagrad", "Adagrad", "mse"),
    ]
    + [(name, opt, "mse") for name, opt in OPTIMIZER_MODELS.items() if name != "opt_sgd"],
)
def test_compiled_models_come_back_compiled_with_their_optimizer_state(name, optimizer, loss):
    model = keras.models.load_model(path(name))
    assert type(model.optimizer).__name__ == optimizer
    assert model.loss == loss
    with h5py.File(path(name), "r") as f:
        group = f["optimizer_weights"]
        saved = {str(n): np.asarray(group[n]) for n in group.attrs["weight_names"]}
    opt = model.optimizer
    params = model._collected_trainable_weights
    values = K.batch_get_value(opt.weights)
    # The step count comes over ...
    step = [v for n, v in saved.items() if n.split("/")[-1].split(":")[0] in ("iter", "iteration")]
    assert int(K.get_value(opt.iterations)) == int(step[0]) > 0
    # ... and every slot of the first parameter, found in the file by the variable's path
    # (tf.keras names slots "Adam/m/dense/kernel:0", or "SGD/dense/kernel/momentum:0").
    first = params[0].name.split(":")[0]
    slots = [v for n, v in saved.items() if _slot_of(n)[1] == first]
    n = len(params)
    groups = len(values) // n  # after 0-2 scalars (iterations, Nadam's schedule)
    firsts = [values[len(values) - (groups - g) * n] for g in range(groups)]
    assert slots and len(slots) <= groups, (first, list(saved))
    for s in slots:
        assert np.abs(s).sum() > 0
        assert any(f.shape == s.shape and np.array_equal(f, s) for f in firsts), first


@pytest.mark.parametrize(
    "name", ["mlp_step", "sgd_step", "cnn2d", "rnn", "adagrad"] + list(OPTIMIZER_MODELS)
)
def test_training_continues_as_in_tensorflow(name):
    """One more step from the saved optimizer state (Adam's moments and step count, SGD's
    Nesterov momentum, the accumulators of RMSprop, Adagrad, Adadelta, Adamax, the legacy
    Nadam's schedule; batch normalization's moving statistics) gives TensorFlow's weights."""
    model = keras.models.load_model(path(name))
    model.train_on_batch(one(arrays(name, "train_x")), one(arrays(name, "train_y")))
    for g, w in zip(predict(model, name), arrays(name, "after")):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_nadam_of_tensorflow_2_11_says_its_schedule_differs():
    """TF 2.11+'s Nadam is not Keras 2's (its momentum warm-up differs): the model comes
    back compiled with Keras 2's Nadam and the saved state, with a warning saying so."""
    with pytest.warns(UserWarning, match="Nadam"):
        model = keras.models.load_model(path("nested"))
    model.train_on_batch(one(arrays("nested", "train_x")), one(arrays("nested", "train_y")))
    after = predict(model, "nested")[0]
    assert np.all(np.isfinite(after))
    assert np.abs(after - arrays("nested", "after")[0]).max() < 0.1


def test_conv1d_transpose_and_depthwise_conv1d_save_train_and_reload(tmp_path):
    """ferrokeras's Keras 2 versions of tf.keras's Conv1DTranspose and DepthwiseConv1D
    round-trip through a Keras 2 ``.h5`` file and train."""
    model = keras.models.load_model(path("conv1d_extra"))
    assert [type(lay).__name__ for lay in model.layers[:4]] == [
        "Conv1DTranspose",
        "DepthwiseConv1D",
        "Conv1DTranspose",
        "DepthwiseConv1D",
    ]
    x = arrays("conv1d_extra", "x")[0]
    model.save(str(tmp_path / "again.h5"))
    again = keras.models.load_model(str(tmp_path / "again.h5"))
    np.testing.assert_allclose(again.predict(x), model.predict(x), rtol=1e-6, atol=1e-7)
    again.compile("sgd", "mse")
    before = again.get_weights()
    again.train_on_batch(x, np.ones((len(x), 2), "float32"))
    assert all(np.abs(a - b).max() > 0 for a, b in zip(again.get_weights(), before))


@pytest.mark.parametrize("name", ["merge", "conv1d_extra"])
def test_model_from_json_of_tf_keras_then_load_weights(name):
    """tf.keras's ``model.to_json()`` goes through the same translation, and the weights
    of its ``.h5`` file load into the model."""
    with open(os.path.join(DATA, name + ".json")) as f:
        model = keras.models.model_from_json(f.read())
    model.load_weights(path(name))
    for g, w in zip(predict(model, name), arrays(name, "y")):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_tf_keras_only_layer_is_named():
    with pytest.raises(TfKerasConfigError, match="LayerNormalization"):
        keras.models.load_model(path("bad_layer"))


def test_a_tf_keras_only_argument_is_named():
    with pytest.raises(TfKerasConfigError, match="groups=2"):
        keras.models.load_model(path("bad_argument"))


def test_custom_objects_supply_a_tf_keras_only_layer():
    class LayerNormalization(keras.layers.Layer):
        def __init__(self, axis=-1, epsilon=1e-3, **kwargs):
            for key in (
                ("center", "scale")
                + tuple(k for k in list(kwargs) if k.endswith(("_initializer", "_regularizer")))
                + tuple(k for k in list(kwargs) if k.endswith("_constraint"))
            ):
                kwargs.pop(key, None)
            super().__init__(**kwargs)
            self.axis, self.epsilon = axis, epsilon

        def build(self, input_shape):
            d = input_shape[-1]
            self.gamma = self.add_weight(name="gamma", shape=(d,), initializer="ones")
            self.beta = self.add_weight(name="beta", shape=(d,), initializer="zeros")
            super().build(input_shape)

        def call(self, x):
            mean = K.mean(x, axis=-1, keepdims=True)
            var = K.var(x, axis=-1, keepdims=True)
            return (x - mean) / K.sqrt(var + self.epsilon) * self.gamma + self.beta

    model = keras.models.load_model(
        path("bad_layer"), custom_objects={"LayerNormalization": LayerNormalization}
    )
    x = np.random.RandomState(0).randn(5, 3).astype("float32")
    w, b = model.layers[0].get_weights()
    h = x @ w + b
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-3)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-5)


# Translation of configs tf.keras writes that the fixtures above do not cover.


def layer(cls, **config):
    config.setdefault("name", cls.lower())
    return {"class_name": cls, "config": config}


def functional(*layers, inputs=("in", 0, 0), outputs=("out", 0, 0)):
    return {
        "class_name": "Functional",
        "config": {
            "name": "m",
            "layers": list(layers),
            "input_layers": list(inputs),
            "output_layers": list(outputs),
        },
    }


def test_single_input_and_output_triples_become_lists():
    cfg = functional(
        dict(layer("InputLayer", batch_input_shape=[None, 3], ragged=False), inbound_nodes=[]),
        dict(layer("Dense", units=2, name="out"), inbound_nodes=[[["inputlayer", 0, 0, {}]]]),
    )
    out = translate_model_config(cfg)
    assert out["class_name"] == "Model"
    assert out["config"]["input_layers"] == [["in", 0, 0]]
    assert out["config"]["output_layers"] == [["out", 0, 0]]
    assert "ragged" not in out["config"]["layers"][0]["config"]


@pytest.mark.parametrize(
    "bad,named",
    [
        (layer("InputLayer", batch_input_shape=[None, 3], ragged=True), "ragged=True"),
        (layer("GlobalAveragePooling2D", keepdims=True), "keepdims=True"),
        (layer("LSTM", units=2, time_major=True), "time_major=True"),
        (
            layer(
                "Dense",
                units=2,
                dtype={"class_name": "Policy", "config": {"name": "mixed_float16"}},
            ),
            "mixed_float16",
        ),
        (layer("Dense", units=2, lora_rank=4), "lora_rank"),
        (layer("BatchNormalization", axis=[1, 2]), "several axes"),
        (layer("UnitNormalization"), "UnitNormalization"),
        (
            layer(
                "Bidirectional",
                layer=layer("LSTM", units=2),
                backward_layer=layer("GRU", units=2, go_backwards=True),
            ),
            "backward_layer",
        ),
    ],
)
def test_tf_keras_only_layers_and_arguments_are_named(bad, named):
    cfg = {"class_name": "Sequential", "config": {"name": "s", "layers": [bad]}}
    with pytest.raises(TfKerasConfigError, match=named.replace("[", r"\[")):
        translate_model_config(cfg)


def test_arguments_at_their_keras_2_value_are_dropped():
    cfg = {
        "class_name": "Sequential",
        "config": {
            "name": "s",
            "layers": [
                dict(
                    layer(
                        "BatchNormalization",
                        axis=[3],
                        synchronized=False,
                        gamma_regularizer={"class_name": "L2", "config": {"l2": 0.5}},
                        beta_initializer={
                            "module": "keras.initializers",
                            "class_name": "HeNormal",
                            "config": {"seed": 3},
                            "registered_name": None,
                        },
                        dtype={"class_name": "Policy", "config": {"name": "float32"}},
                    ),
                    module="keras.layers",
                ),
                layer("Conv2D", filters=2, kernel_size=[3, 3], groups=1),
                layer("Embedding", input_dim=3, output_dim=2, sparse=False),
                layer(
                    "Bidirectional",
                    layer=layer("GRU", units=2, time_major=False, reset_after=True),
                    backward_layer=layer(
                        "GRU",
                        units=2,
                        name="b",
                        go_backwards=True,
                        time_major=False,
                        reset_after=True,
                    ),
                ),
            ],
        },
    }
    bn, conv, emb, bi = translate_model_config(cfg)["config"]["layers"]
    assert bn["config"]["axis"] == 3 and "synchronized" not in bn["config"]
    assert bn["config"]["dtype"] == "float32"
    assert bn["config"]["gamma_regularizer"] == {
        "class_name": "L1L2",
        "config": {"l1": 0.0, "l2": 0.5},
    }
    assert bn["config"]["beta_initializer"] == {"class_name": "he_normal", "config": {"seed": 3}}
    assert "groups" not in conv["config"] and "sparse" not in emb["config"]
    assert (
        "backward_layer" not in bi["config"] and "time_major" not in bi["config"]["layer"]["config"]
    )


def training(optimizer, loss="mse", metrics=None):
    return {"loss": loss, "metrics": metrics, "optimizer_config": optimizer}


def adam(**config):
    base = {
        "name": "Adam",
        "learning_rate": 0.01,
        "weight_decay": None,
        "use_ema": False,
        "is_legacy_optimizer": False,
        "jit_compile": False,
    }
    base.update(config)
    return {"class_name": "Custom>Adam", "config": base}


@pytest.mark.parametrize(
    "cls,fn",
    [
        ("MeanSquaredError", "mean_squared_error"),
        ("SparseCategoricalCrossentropy", "sparse_categorical_crossentropy"),
        ("KLDivergence", "kullback_leibler_divergence"),
        ("LogCosh", "logcosh"),
        ("CosineSimilarity", "cosine_proximity"),
    ],
)
def test_loss_objects_become_keras_2_loss_functions(cls, fn):
    loss = {
        "module": "keras.losses",
        "class_name": cls,
        "config": {"reduction": "auto", "name": "x", "axis": -1},
        "registered_name": None,
    }
    out = translate_training_config(training(adam(), loss=loss))
    assert out["loss"] == fn
    assert callable(keras.losses.get(fn))


def test_training_config_translation():
    out = translate_training_config(
        training(
            adam(clipnorm=1.0),
            loss={
                "class_name": "CategoricalCrossentropy",
                "config": {"from_logits": False, "reduction": "auto"},
            },
            metrics=[
                [{"class_name": "MeanMetricWrapper", "config": {"name": "acc", "fn": "x"}}],
                ["mae"],
            ],
        ),
        output_names=["a", "b"],
    )
    opt = out["optimizer_config"]
    assert opt["class_name"] == "Adam"
    assert opt["config"]["clipnorm"] == 1.0
    lr_key = "learning_rate" if keras.__version__ >= "2.3" else "lr"
    assert opt["config"][lr_key] == 0.01
    assert not {"name", "use_ema", "weight_decay", "jit_compile"} & set(opt["config"])
    assert out["loss"] == "categorical_crossentropy"
    assert out["metrics"] == {"a": ["acc"], "b": ["mae"]}
    assert out["sample_weight_mode"] is None


@pytest.mark.parametrize(
    "config,named",
    [
        (training({"class_name": "Custom>Lion", "config": {}}), "Lion"),
        (training(adam(weight_decay=0.01)), "weight_decay"),
        (training(adam(use_ema=True)), "use_ema"),
        (
            training(adam(learning_rate={"class_name": "ExponentialDecay", "config": {}})),
            "ExponentialDecay",
        ),
        (training({"class_name": "RMSprop", "config": {"momentum": 0.9}}), "momentum"),
        (
            training(
                adam(), loss={"class_name": "BinaryCrossentropy", "config": {"from_logits": True}}
            ),
            "from_logits",
        ),
        (training(adam(), metrics=[[{"class_name": "AUC", "config": {"name": "auc"}}]]), "AUC"),
    ],
)
def test_tf_keras_only_training_settings_are_named(config, named):
    with pytest.raises(TfKerasConfigError, match=named):
        translate_training_config(config)
    with pytest.raises(TfKerasConfigError, match="compile=False"):
        translate_training_config(config)


def test_models_saved_by_keras_are_not_translated(tmp_path):
    model = keras.models.Sequential([keras.layers.Dense(2, input_shape=(3,))])
    model.compile("sgd", "mse")
    model.save(str(tmp_path / "m.h5"))
    with h5py.File(str(tmp_path / "m.h5"), "r") as f:
        config = f.attrs["model_config"]
    config = config.decode() if isinstance(config, bytes) else str(config)
    import json

    parsed = json.loads(config)
    assert translate_model_config(parsed) == parsed
    again = keras.models.load_model(str(tmp_path / "m.h5"))
    x = np.ones((1, 3), "float32")
    np.testing.assert_allclose(again.predict(x), model.predict(x))
