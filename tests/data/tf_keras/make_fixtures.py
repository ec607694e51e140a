"""Writes the tf.keras fixtures of ``tests/keras/test_tf_keras_models.py``.

Each model below is built with tf.keras 2.x (the ``tf_keras`` package, Keras 2 for
TensorFlow >= 2.16; ``tensorflow.keras`` on older TensorFlow), saved to ``<name>.h5`` with
``model.save``, and its predictions on a fixed input are stored in ``expected.npz`` as
``<name>/x0``, ``<name>/x1``, ... (inputs) and ``<name>/y0``, ... (outputs). For the
compiled models that take a training step in the test (``TRAIN_STEP``), the batch and the
predictions after one ``train_on_batch`` on it are stored as ``<name>/train_x0``,
``<name>/train_y0`` and ``<name>/after0``. The models in ``TO_JSON`` are also written as
``<name>.json`` by ``model.to_json()``.

It also writes ``ctc_beam_search.npz`` for ``tests/test_ctc.py``: TensorFlow's beam search
decoding of random inputs. Case ``i`` stores ``i/y`` (softmax outputs, batch x time x
classes), ``i/lens``, ``i/beam`` (beam width, top paths), ``i/d0``, ``i/d1``, ... (the
decoded labellings, padded with -1) and ``i/lp`` (their log-probabilities), from
``keras.backend.ctc_decode``.

The tests need no TensorFlow; this script does. It runs where TensorFlow is installed:

    python -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu tf-keras h5py
    /tmp/tfvenv/bin/python tests/data/tf_keras/make_fixtures.py
"""

import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import tf_keras as keras
except ImportError:  # TensorFlow < 2.16 ships Keras 2 as tensorflow.keras
    from tensorflow import keras

import tensorflow as tf

L = keras.layers
HERE = os.path.dirname(os.path.abspath(__file__))


def mlp():
    """Sequential MLP with Dropout and BatchNormalization, Adam state after a few steps."""
    m = keras.Sequential(
        [
            L.Dense(16, activation="relu", input_shape=(8,)),
            L.BatchNormalization(),
            L.Dropout(0.25),
            L.Dense(4, activation="softmax"),
        ]
    )
    m.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    return m, [(32, 8)]


def mlp_step():
    """Functional MLP (no Dropout, so a training step is deterministic), Adam state."""
    x = L.Input((6,))
    h = L.Dense(12, activation="tanh")(x)
    h = L.Dense(12, activation="relu", kernel_regularizer=keras.regularizers.l2(1e-3))(h)
    y = L.Dense(3)(h)
    m = keras.Model(x, y)
    m.compile(keras.optimizers.Adam(learning_rate=0.01), "mse", metrics=["mae"])
    return m, [(16, 6)]


def sgd_step():
    """Sequential regression with SGD + momentum (legacy optimizer), Nesterov."""
    m = keras.Sequential([L.Dense(5, activation="sigmoid", input_shape=(4,)), L.Dense(2)])
    opt = keras.optimizers.legacy.SGD(learning_rate=0.05, momentum=0.9, nesterov=True)
    m.compile(opt, "mean_absolute_error")
    return m, [(16, 4)]


def cnn2d():
    """2-D convolutions of every kind, pooling, BatchNormalization; RMSprop state."""
    x = L.Input((12, 12, 3))
    h = L.Conv2D(6, 3, padding="same", activation="relu")(x)
    h = L.BatchNormalization(momentum=0.9)(h)
    h = L.MaxPooling2D(2)(h)
    h = L.SeparableConv2D(8, 3, padding="same", depth_multiplier=2)(h)
    h = L.DepthwiseConv2D(3, padding="valid", depth_multiplier=1, activation="elu")(h)
    h = L.Conv2DTranspose(5, 3, strides=2, padding="same")(h)
    h = L.Conv2D(4, 3, strides=2, dilation_rate=1, use_bias=False)(h)
    h = L.AveragePooling2D(2, padding="same")(h)
    a = L.GlobalAveragePooling2D()(h)
    b = L.GlobalMaxPooling2D()(h)
    y = L.Dense(3, activation="softmax")(L.Concatenate()([a, b]))
    m = keras.Model(x, y)
    m.compile("rmsprop", "categorical_crossentropy")
    return m, [(4, 12, 12, 3)]


def conv1d():
    """1-D convolutions (causal and dilated), separable, pooling; uncompiled."""
    m = keras.Sequential(
        [
            L.Conv1D(6, 3, padding="causal", dilation_rate=2, input_shape=(20, 3)),
            L.Activation("relu"),
            L.MaxPooling1D(2),
            L.SeparableConv1D(5, 3, padding="same"),
            L.AveragePooling1D(2),
            L.Conv1D(4, 2, strides=2),
            L.GlobalMaxPooling1D(),
            L.Dense(2),
        ]
    )
    return m, [(4, 20, 3)]


def conv1d_extra():
    """tf.keras's Conv1DTranspose and DepthwiseConv1D (ferrokeras provides them to Keras 2)."""
    m = keras.Sequential(
        [
            L.Conv1DTranspose(4, 3, strides=2, padding="same", input_shape=(9, 3)),
            L.DepthwiseConv1D(3, depth_multiplier=2, padding="same", dilation_rate=2),
            L.Conv1DTranspose(
                3, 4, strides=3, padding="valid", output_padding=1, activation="tanh"
            ),
            L.DepthwiseConv1D(2, strides=2, activation="relu"),
            L.Flatten(),
            L.Dense(2),
        ]
    )
    return m, [(3, 9, 3)]


def activations():
    """tf.keras's swish, gelu and mish (ferrokeras provides them to Keras 2)."""
    m = keras.Sequential(
        [
            L.Dense(8, activation="swish", input_shape=(5,)),
            L.Dense(8, activation="gelu"),
            L.Dense(8, activation="mish"),
            L.Dense(8),
            L.Activation("gelu"),
            L.Dense(2),
        ]
    )
    return m, [(6, 5)]


def conv3d():
    """3-D convolution, its transpose and 3-D pooling; uncompiled."""
    m = keras.Sequential(
        [
            L.Conv3D(4, 3, padding="same", activation="relu", input_shape=(6, 6, 6, 2)),
            L.MaxPooling3D(2),
            L.Conv3DTranspose(3, 2, strides=2, padding="valid"),
            L.AveragePooling3D(2),
            L.GlobalAveragePooling3D(),
            L.Dense(2),
        ]
    )
    return m, [(3, 6, 6, 6, 2)]


def rnn():
    """Embedding, LSTM, GRU (both reset_after settings), SimpleRNN, Bidirectional,
    TimeDistributed; Adam state."""
    tokens = L.Input((10,), dtype="int32")
    e = L.Embedding(30, 8)(tokens)
    s = L.LSTM(6, return_sequences=True)(e)
    s = L.GRU(5, return_sequences=True, reset_after=True)(s)
    s = L.Bidirectional(L.LSTM(4, return_sequences=True), merge_mode="concat")(s)
    s = L.TimeDistributed(L.Dense(3, activation="tanh"))(s)
    a = L.GRU(4, reset_after=False)(s)
    b = L.SimpleRNN(4, go_backwards=True)(s)
    c = L.Bidirectional(L.GRU(2), merge_mode="sum")(e)
    y = L.Dense(2)(L.Concatenate()([a, b, c]))
    m = keras.Model(tokens, y)
    m.compile("adam", "mse")
    return m, [("int", 4, 10, 30)]


def merge():
    """Two inputs, two outputs: the merge layers, Activation, Reshape, Flatten, Permute."""
    x1 = L.Input((6,), name="left")
    x2 = L.Input((6,), name="right")
    a = L.Dense(6)(x1)
    b = L.Dense(6)(x2)
    merged = [
        L.Add()([a, b]),
        L.Subtract()([a, b]),
        L.Multiply()([a, b]),
        L.Average()([a, b]),
        L.Maximum()([a, b]),
        L.Minimum()([a, b]),
    ]
    h = L.Concatenate(axis=-1)(merged)
    h = L.Activation("tanh")(h)
    h = L.Reshape((4, 9))(h)
    h = L.Permute((2, 1))(h)
    h = L.Flatten()(h)
    out1 = L.Dense(3, name="out_a")(h)
    out2 = L.Dot(axes=1, normalize=True, name="out_b")([a, b])
    m = keras.Model([x1, x2], [out1, out2])
    return m, [(5, 6), (5, 6)]


def nested():
    """A Sequential model inside a functional one; Nadam state."""
    inner = keras.Sequential(
        [L.Dense(5, activation="relu", input_shape=(3,)), L.Dense(4)], name="inner"
    )
    x = L.Input((3,))
    y = L.Dense(2, activation="sigmoid")(inner(x))
    m = keras.Model(x, y)
    m.compile(keras.optimizers.Nadam(learning_rate=0.01), "binary_crossentropy")
    return m, [(8, 3)]


def adagrad():
    """Adagrad (its accumulators) on a small Conv1D model."""
    m = keras.Sequential([L.Conv1D(3, 2, input_shape=(6, 2)), L.Flatten(), L.Dense(1)])
    m.compile(keras.optimizers.Adagrad(learning_rate=0.05), "mse")
    return m, [(8, 6, 2)]


def zoo():
    """The other layers Keras 2.3.1 also has: padding, cropping, upsampling, the advanced
    activations, the noise layers, locally connected layers, RepeatVector, Masking, Lambda,
    ConvLSTM2D, ActivityRegularization, Softmax; uncompiled."""
    x = L.Input((8, 8, 3))
    a = L.ZeroPadding2D(1)(x)
    a = L.Cropping2D(((1, 0), (0, 1)))(a)
    a = L.UpSampling2D(2)(a)
    a = L.Conv2D(4, 3, strides=2)(a)
    a = L.LeakyReLU(0.2)(a)
    a = L.PReLU(alpha_initializer=keras.initializers.Constant(0.25))(a)
    a = L.ELU()(a)
    a = L.ReLU(max_value=3.0)(a)
    a = L.SpatialDropout2D(0.1)(a)
    a = L.GaussianNoise(0.1)(a)
    a = L.GaussianDropout(0.1)(a)
    a = L.AlphaDropout(0.1)(a)
    a = L.LocallyConnected2D(2, 2)(a)
    a = L.Dense(6)(L.Flatten()(a))
    b = L.Reshape((8, 24))(x)
    b = L.ZeroPadding1D(1)(b)
    b = L.Cropping1D(1)(b)
    b = L.UpSampling1D(2)(b)
    b = L.LocallyConnected1D(3, 2)(b)
    b = L.Dense(6)(L.GlobalAveragePooling1D()(b))
    c = L.Dense(4)(L.Flatten()(x))
    c = L.RepeatVector(3)(c)
    c = L.Masking(0.0)(c)
    c = L.Lambda(lambda t: t * 2.0 - 0.5)(c)
    c = L.ConvLSTM2D(2, 1, return_sequences=True)(L.Reshape((3, 2, 2, 1))(c))
    c = L.ActivityRegularization(l1=0.01)(L.Flatten()(c))
    c = L.Dense(6)(L.Softmax()(c))
    y = L.Dense(3)(L.Concatenate()([a, b, c]))
    return keras.Model(x, y), [(4, 8, 8, 3)]


def optimizer_model(name, make_optimizer):
    """A small regression model compiled with one optimizer (its state and one more step
    are checked)."""

    def build():
        m = keras.Sequential([L.Dense(4, activation="tanh", input_shape=(3,)), L.Dense(2)])
        m.compile(make_optimizer(), "mse")
        return m, [(16, 3)]

    build.__name__ = "opt_" + name
    return build


OPT, LEGACY = keras.optimizers, keras.optimizers.legacy
OPTIMIZERS = [
    optimizer_model("sgd", lambda: OPT.SGD(0.1)),
    optimizer_model("adamax", lambda: OPT.Adamax(0.01)),
    optimizer_model("adadelta", lambda: OPT.Adadelta(1.0)),
    optimizer_model("legacy_adam_amsgrad", lambda: LEGACY.Adam(0.01, amsgrad=True)),
    optimizer_model("legacy_rmsprop", lambda: LEGACY.RMSprop(0.01)),
    optimizer_model("legacy_nadam", lambda: LEGACY.Nadam(0.01)),
    optimizer_model("legacy_adagrad", lambda: LEGACY.Adagrad(0.1)),
    optimizer_model("legacy_adadelta", lambda: LEGACY.Adadelta(1.0)),
    optimizer_model("legacy_adamax", lambda: LEGACY.Adamax(0.01)),
]


# Models made of what Keras 2.3.1 lacks: loading them must fail with an error naming it.
def bad_layer():
    """LayerNormalization is tf.keras-only (Keras 2.3.1 has no such layer)."""
    m = keras.Sequential([L.Dense(4, input_shape=(3,)), L.LayerNormalization()])
    return m, None


def bad_argument():
    """Conv2D(groups=2): grouped convolutions are a tf.keras-only argument."""
    m = keras.Sequential([L.Conv2D(4, 3, groups=2, input_shape=(8, 8, 4))])
    return m, None


MODELS = [
    mlp,
    mlp_step,
    sgd_step,
    cnn2d,
    conv1d,
    conv1d_extra,
    activations,
    conv3d,
    rnn,
    merge,
    nested,
    adagrad,
    zoo,
    *OPTIMIZERS,
    bad_layer,
    bad_argument,
]
TRAIN_STEP = {"mlp_step", "sgd_step", "cnn2d", "rnn", "nested", "adagrad"}
TRAIN_STEP |= {b.__name__ for b in OPTIMIZERS}
TO_JSON = {"merge", "conv1d_extra"}  # also written as <name>.json (model.to_json())


def make_inputs(rng, specs):
    xs = []
    for spec in specs:
        if spec[0] == "int":
            *shape, high = spec[1:]
            xs.append(rng.integers(0, high, size=tuple(shape)).astype("int32"))
        else:
            xs.append(rng.standard_normal(spec).astype("float32"))
    return xs


def one(arrays):
    return arrays[0] if len(arrays) == 1 else arrays


def make_targets(rng, model, xs):
    """Random targets for the model's outputs and loss, for a batch of inputs `xs`."""
    ys = []
    for o in model.outputs:
        y = rng.standard_normal((len(xs[0]),) + tuple(o.shape[1:])).astype("float32")
        if model.loss == "categorical_crossentropy":
            y = np.eye(y.shape[-1], dtype="float32")[np.argmax(y, -1)]
        elif model.loss == "binary_crossentropy":
            y = (y > 0).astype("float32")
        ys.append(y)
    return ys


def ctc_beam_search():
    K = keras.backend
    out = {}
    for i in range(24):
        rng = np.random.default_rng(1000 + i)
        b, t, c = 3, int(rng.integers(4, 24)), int(rng.integers(3, 10))
        z = rng.standard_normal((b, t, c)) * rng.uniform(0.5, 3)
        y = (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).astype(np.float32)
        lens = rng.integers(1, t + 1, size=b).astype(np.int32)
        lens[0] = t
        width = int(rng.integers(1, 20))
        top = int(rng.integers(1, min(width, 3) + 1))
        d, lp = K.ctc_decode(
            K.constant(y),
            K.constant(lens, dtype="int32"),
            greedy=False,
            beam_width=width,
            top_paths=top,
        )
        out[f"{i}/y"], out[f"{i}/lens"] = y, lens
        out[f"{i}/beam"] = np.array([width, top])
        for k, dk in enumerate(d):
            out[f"{i}/d{k}"] = np.asarray(dk)
        out[f"{i}/lp"] = np.asarray(lp)
    np.savez_compressed(os.path.join(HERE, "ctc_beam_search.npz"), **out)


def main():
    ctc_beam_search()
    tf.random.set_seed(0)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    arrays = {}
    for build in MODELS:
        name = build.__name__
        model, specs = build()
        if specs is not None:
            if model.optimizer is not None:
                # Some optimizer state to carry over: a few steps on random targets.
                xs = make_inputs(rng, specs)
                ys = make_targets(rng, model, xs)
                model.fit(one(xs), one(ys), epochs=3, batch_size=8, verbose=0)
            xs = make_inputs(rng, specs)
            ys = model.predict(one(xs), verbose=0)
            ys = ys if isinstance(ys, list) else [ys]
            for i, x in enumerate(xs):
                arrays[f"{name}/x{i}"] = x
            for i, y in enumerate(ys):
                arrays[f"{name}/y{i}"] = y
        model.save(os.path.join(HERE, name + ".h5"))
        if name in TO_JSON:
            with open(os.path.join(HERE, name + ".json"), "w") as f:
                f.write(model.to_json())
        if name in TRAIN_STEP:
            tx = make_inputs(rng, specs)
            ty = make_targets(rng, model, tx)
            model.train_on_batch(one(tx), one(ty))
            after = model.predict(one(xs), verbose=0)
            after = after if isinstance(after, list) else [after]
            for i, x in enumerate(tx):
                arrays[f"{name}/train_x{i}"] = x
            for i, y in enumerate(ty):
                arrays[f"{name}/train_y{i}"] = y
            for i, y in enumerate(after):
                arrays[f"{name}/after{i}"] = y
        print(f"{name}.h5: {os.path.getsize(os.path.join(HERE, name + '.h5'))} bytes")
    np.savez_compressed(os.path.join(HERE, "expected.npz"), **arrays)
    version = getattr(keras, "__version__", "of TensorFlow")
    print(f"tf.keras {version}, TensorFlow {tf.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
