"""keras.callbacks.TensorBoard on ferrokeras without TensorFlow: the event files it writes
are read back with TensorBoard's own ``EventAccumulator`` and checked against the values
training produced (History, the weights, a gradient computed separately)."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import ferrokeras.callbacks
import keras
import numpy as np
import pytest
from ferrokeras import backend as K
from keras.layers import Conv2D, Dense, Dropout, Flatten

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator as ea  # noqa: E402

HAS_TF = importlib.util.find_spec("tensorflow") is not None
# The name Keras logs `metrics=["accuracy"]` under: "acc" up to Keras 2.2.5, then "accuracy".
ACC = "accuracy" if tuple(map(int, keras.__version__.split(".")[:2])) >= (2, 3) else "acc"


def _read(log_dir):
    acc = ea.EventAccumulator(
        str(log_dir),
        size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.IMAGES: 0, ea.GRAPH: 1},
    )
    acc.Reload()
    return acc


def _data(n=48, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 6, 6, 1).astype("float32")
    y = np.eye(3, dtype="float32")[rng.randint(0, 3, n)]
    return x, y


def _model():
    model = keras.models.Sequential(
        [
            Conv2D(2, 3, activation="relu", input_shape=(6, 6, 1)),
            Flatten(),
            Dropout(0.3),
            Dense(3, activation="softmax"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.05, decay=0.01), "categorical_crossentropy", ["accuracy"])
    return model


def test_keras_tensorboard_is_ferrokeras_without_tensorflow():
    if HAS_TF:
        assert keras.callbacks.TensorBoard is not ferrokeras.callbacks.TensorBoard
    else:
        assert keras.callbacks.TensorBoard is ferrokeras.callbacks.TensorBoard


def test_fit_writes_scalars_histograms_images_and_graph(tmp_path):
    model = _model()
    x, y = _data()
    xv, yv = _data(20, seed=1)
    cb = ferrokeras.callbacks.TensorBoard(
        str(tmp_path), histogram_freq=1, batch_size=8, write_grads=True, write_images=True
    )
    hist = model.fit(
        x, y, batch_size=16, epochs=3, validation_data=(xv, yv), callbacks=[cb], verbose=0
    )
    acc = _read(tmp_path)
    tags = acc.Tags()

    # Scalars: the epoch logs, step = epoch, equal to what History recorded.
    for name in ("loss", ACC, "val_loss", f"val_{ACC}"):
        events = acc.Scalars(name)
        assert [e.step for e in events] == [0, 1, 2]
        np.testing.assert_allclose([e.value for e in events], hist.history[name], rtol=1e-6)
    # Learning rate with decay: lr / (1 + decay * iterations), 3 steps per epoch.
    lrs = [e.value for e in acc.Scalars("lr")]
    np.testing.assert_allclose(lrs, [0.05 / (1 + 0.01 * 3 * (e + 1)) for e in range(3)], rtol=1e-6)

    # Weight histograms: one per epoch; the last one describes the final weights.
    for w in model.weights:
        tag = w.name.replace(":", "_")
        events = acc.Histograms(tag)
        assert [e.step for e in events] == [0, 1, 2]
        h = events[-1].histogram_value
        value = K.get_value(w).astype(np.float64)
        assert h.num == value.size
        np.testing.assert_allclose(
            [h.min, h.max, h.sum], [value.min(), value.max(), value.sum()], rtol=1e-6, atol=1e-9
        )
        np.testing.assert_allclose(h.sum_squares, (value**2).sum(), rtol=1e-6)
        assert sum(h.bucket) == value.size

    # Activations over the validation set, in inference mode (dropout off).
    dense = model.layers[-1]
    probs = model.predict(xv)
    h = acc.Histograms(f"{dense.name}_out")[-1].histogram_value
    assert h.num == probs.size
    np.testing.assert_allclose(
        [h.sum, h.min, h.max], [probs.sum(), probs.min(), probs.max()], rtol=1e-5
    )
    flat = acc.Histograms(f"{model.layers[1].name}_out")[-1].histogram_value
    drop = acc.Histograms(f"{model.layers[2].name}_out")[-1].histogram_value
    assert drop.sum == pytest.approx(flat.sum, rel=1e-6)  # dropout is off

    # Gradients: averaged over the validation batches of 8 = the gradient of the mean loss
    # over the whole validation set, computed here in one call.
    weights = model.trainable_weights
    grads = K.gradients(model.total_loss, weights)
    feeds = model._feed_inputs + model._feed_targets + model._feed_sample_weights
    f = K.function(feeds + [K.learning_phase()], grads)
    expected = f([xv, yv, np.ones(len(xv), "float32"), 0])
    for w, g in zip(weights, expected):
        h = acc.Histograms(w.name.replace(":", "_") + "_grad")[-1].histogram_value
        assert h.num == g.size
        g = g.astype(np.float64)
        np.testing.assert_allclose([h.min, h.max], [g.min(), g.max()], rtol=1e-4, atol=1e-8)
        np.testing.assert_allclose(h.sum_squares, (g**2).sum(), rtol=1e-4)

    # Images: Keras's layout (a dense kernel wider than tall, up to 3 conv channels).
    conv, dense = model.layers[0], model.layers[-1]
    kernel = acc.Images(f"{dense.name}/kernel/image")[-1]
    assert (kernel.height, kernel.width) == (3, 32)
    assert kernel.encoded_image_string.startswith(b"\x89PNG")
    assert len(acc.Images(f"{conv.name}/kernel/image/0")) == 3
    assert "images" in tags and len(tags["images"]) == 5

    # The graph: one node per layer (the input layer too), chained.
    graph = acc.Graph()
    nodes = {n.name: n for n in graph.node}
    names = [layer.name for layer in model.layers]
    assert set(names) <= set(nodes)
    for a, b in zip(names, names[1:]):
        assert list(nodes[b].input) == [a]
        assert nodes[b].op == type(model.get_layer(b)).__name__
    shape = nodes[names[0]].attr["_output_shapes"].list.shape[0]
    assert [d.size for d in shape.dim] == [-1, 4, 4, 2]
    assert cb.writer is None  # closed at the end of training


def test_functional_graph_has_every_edge(tmp_path):
    a = keras.layers.Input((4,), name="a")
    b = keras.layers.Input((4,), name="b")
    d = Dense(3, name="d")(a)
    c = keras.layers.Concatenate(name="c")([d, b])
    model = keras.models.Model([a, b], Dense(1, name="out")(c))
    model.compile("sgd", "mse")
    cb = ferrokeras.callbacks.TensorBoard(str(tmp_path))
    model.fit(
        [np.ones((4, 4)), np.ones((4, 4))], np.ones((4, 1)), epochs=1, callbacks=[cb], verbose=0
    )
    nodes = {n.name: n for n in _read(tmp_path).Graph().node}
    assert list(nodes["d"].input) == ["a"]
    assert list(nodes["c"].input) == ["d", "b"]
    assert list(nodes["out"].input) == ["c"]
    assert nodes["c"].op == "Concatenate"
    assert [d.size for d in nodes["c"].attr["_output_shapes"].list.shape[0].dim] == [-1, 7]


@pytest.mark.parametrize("update_freq,steps", [("batch", [16, 32, 48, 64]), (32, [32, 64])])
def test_update_freq_writes_batch_logs_by_samples_seen(tmp_path, update_freq, steps):
    model = _model()
    x, y = _data(32)
    cb = ferrokeras.callbacks.TensorBoard(str(tmp_path), update_freq=update_freq)
    model.fit(x, y, batch_size=16, epochs=2, callbacks=[cb], verbose=0)
    events = _read(tmp_path).Scalars("loss")
    # Batch logs at every write, and each epoch's logs at the samples seen by its end.
    batch_steps = sorted({e.step for e in events})
    assert batch_steps == steps
    assert len(events) == len(steps) + 2


def test_weight_histograms_without_validation_data(tmp_path):
    model = _model()
    x, y = _data(16)
    cb = ferrokeras.callbacks.TensorBoard(str(tmp_path), histogram_freq=2, write_grads=True)
    with pytest.warns(UserWarning, match="write_grads needs validation data"):
        model.fit(x, y, epochs=3, callbacks=[cb], verbose=0)
    hists = _read(tmp_path).Tags()["histograms"]
    assert sorted(hists) == sorted(w.name.replace(":", "_") for w in model.weights)
    assert [e.step for e in _read(tmp_path).Histograms(hists[0])] == [0, 2]


def test_arguments_that_need_tensorflow_or_are_wrong_raise(tmp_path):
    with pytest.raises(ValueError, match="embedding projector.*TensorFlow"):
        ferrokeras.callbacks.TensorBoard(str(tmp_path), embeddings_freq=1)
    with pytest.raises(ValueError, match="update_freq"):
        ferrokeras.callbacks.TensorBoard(str(tmp_path), update_freq="sometimes")
    with pytest.raises(ValueError, match="histogram_freq"):
        ferrokeras.callbacks.TensorBoard(str(tmp_path), histogram_freq=-1)
    with pytest.raises(ValueError, match="batch_size"):
        ferrokeras.callbacks.TensorBoard(str(tmp_path), batch_size=0)
    with pytest.raises(TypeError, match="log_dir"):
        ferrokeras.callbacks.TensorBoard(3)


def test_missing_tensorboard_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)
    with pytest.raises(ImportError, match=r"ferrokeras\[tensorboard\]"):
        ferrokeras.callbacks.TensorBoard(str(tmp_path))


SCRIPT = """
import os
os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
import numpy as np
import keras
from keras.callbacks import TensorBoard
from keras.layers import Dense

x = np.random.rand(64, 5).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 2.5).astype("float32")
model = keras.models.Sequential([Dense(8, activation="relu", input_shape=(5,)),
                                 Dense(1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=2, batch_size=16, validation_split=0.25, verbose=0,
          callbacks=[TensorBoard(log_dir=LOG_DIR, histogram_freq=1)])
print(type(model).__module__, TensorBoard.__module__)
"""


@pytest.mark.skipif(HAS_TF, reason="with TensorFlow installed Keras uses its own TensorBoard")
def test_unmodified_keras_script_in_a_fresh_process(tmp_path):
    script = tmp_path / "train.py"
    log_dir = tmp_path / "logs"
    script.write_text(f"LOG_DIR = {str(log_dir)!r}\n" + textwrap.dedent(SCRIPT))
    env = dict(os.environ, KERAS_HOME=str(tmp_path / "keras_home"))
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "ferrokeras.callbacks" in out.stdout
    acc = _read(log_dir)
    tags = acc.Tags()
    assert {"loss", "val_loss", ACC, f"val_{ACC}", "lr"} <= set(tags["scalars"])
    assert {"dense_1/kernel", "dense_1_out", "dense_2_out"} <= set(tags["histograms"])
    assert tags["graph"]
    assert [e.step for e in acc.Histograms("dense_2_out")] == [0, 1]


@pytest.mark.skipif(HAS_TF, reason="with TensorFlow installed Keras uses its own TensorBoard")
def test_digits_tensorboard_example(tmp_path):
    pytest.importorskip("sklearn")
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "digits_tensorboard.py")
    spec = importlib.util.spec_from_file_location("digits_tensorboard", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(str(tmp_path), epochs=4) >= 0.85
    tags = _read(tmp_path).Tags()
    assert {"loss", "val_loss", "lr"} <= set(tags["scalars"])
    assert "dense_1/kernel_grad" in tags["histograms"] and tags["images"] and tags["graph"]


def test_nested_model_is_a_scope_with_its_layers(tmp_path):
    # A base network shared by two inputs (as in Keras's mnist_siamese example).
    base = keras.models.Sequential(
        [Dense(4, activation="relu", input_shape=(3,), name="hidden"), Dense(2, name="embed")],
        name="base",
    )
    a = keras.layers.Input((3,), name="a")
    b = keras.layers.Input((3,), name="b")
    merged = keras.layers.Subtract(name="diff")([base(a), base(b)])
    model = keras.models.Model([a, b], Dense(1, name="score")(merged))
    model.compile("sgd", "mse")
    cb = ferrokeras.callbacks.TensorBoard(str(tmp_path))
    model.fit([np.ones((4, 3))] * 2, np.ones((4, 1)), epochs=1, callbacks=[cb], verbose=0)
    nodes = {n.name: n for n in _read(tmp_path).Graph().node}
    assert "base" not in nodes
    base_input = base._input_layers[0].name
    assert sorted(nodes[f"base/{base_input}"].input) == ["a", "b"]
    assert list(nodes["base/hidden"].input) == [f"base/{base_input}"]
    assert list(nodes["base/embed"].input) == ["base/hidden"]
    assert list(nodes["diff"].input) == ["base/embed"]
    assert list(nodes["score"].input) == ["diff"]
    assert nodes["base/embed"].op == "Dense"
    assert nodes["base/hidden"].attr["weights"].list.s[0].startswith(b"hidden/kernel")


def test_driven_by_hand_with_train_on_batch(tmp_path):
    # The pattern of GAN scripts: set_model, on_epoch_end with their own logs, on_train_end.
    model = _model()
    x, y = _data(16)
    cb = ferrokeras.callbacks.TensorBoard(str(tmp_path), histogram_freq=1)
    cb.set_model(model)
    losses = []
    for step in range(3):
        loss, _ = model.train_on_batch(x, y)
        losses.append(loss)
        cb.on_epoch_end(step, {"g_loss": loss})
    cb.on_train_end(None)
    acc = _read(tmp_path)
    np.testing.assert_allclose([e.value for e in acc.Scalars("g_loss")], losses, rtol=1e-6)
    assert [e.step for e in acc.Scalars("lr")] == [0, 1, 2]
    kernel = model.layers[-1].weights[0]
    assert [e.step for e in acc.Histograms(kernel.name)] == [0, 1, 2]
