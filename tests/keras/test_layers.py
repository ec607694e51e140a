"""The Keras 2.3.1 layers, each in a small model: forward values against NumPy (computed
from the layer's own weights), then a few training steps and an HDF5 round trip.

One table drives it (CONTRIBUTING.md, "How the code reads"): a case is the layer, its input shape, an input
generator and, where the formula is short, a NumPy reference of the forward pass.
"""

import keras
import numpy as np
import pytest
from keras import layers as L
from keras.models import Model, Sequential, load_model

rng = np.random.RandomState(7)


def floats(*shape):
    return lambda n: rng.uniform(-1, 1, size=(n,) + shape).astype("float32")


def ints(high, *shape):
    return lambda n: rng.randint(0, high, size=(n,) + shape).astype("int32")


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def hard_sigmoid(x):
    return np.clip(0.2 * x + 0.5, 0, 1)


# The default recurrent_activation of LSTM and GRU: hard_sigmoid up to Keras 2.2.5, sigmoid
# from Keras 2.3.0.
gate = sigmoid if tuple(map(int, keras.__version__.split(".")[:2])) >= (2, 3) else hard_sigmoid


def patches(x, k):
    """Valid, stride-1 patches of a channels-last array: (b, *out, *k, c)."""
    nd = len(k)
    out = [x.shape[1 + i] - k[i] + 1 for i in range(nd)]
    p = np.empty((x.shape[0],) + tuple(out) + tuple(k) + (x.shape[-1],), dtype=np.float64)
    for idx in np.ndindex(*k):
        sl = tuple(slice(idx[i], idx[i] + out[i]) for i in range(nd))
        p[(slice(None),) + (slice(None),) * nd + idx] = x[(slice(None),) + sl]
    return p


def conv(x, w, b, nd):
    ks = w.shape[:nd]
    p = patches(x, ks)
    y = np.tensordot(p, w, axes=(list(range(1 + nd, 2 + 2 * nd)), list(range(nd + 1))))
    return y + b


def depthwise(x, dw, nd):
    ks = dw.shape[:nd]
    p = patches(x, ks)  # (b, *out, *k, c)
    # Each channel c with its own filters: c is kept (not summed), then (c, m) flattened.
    y = np.einsum(
        p,
        [0] + list(range(1, nd + 1)) + list(range(10, 10 + nd)) + [20],
        dw,
        list(range(10, 10 + nd)) + [20, 21],
        [0] + list(range(1, nd + 1)) + [20, 21],
    )
    return y.reshape(y.shape[:-2] + (-1,))


def pool(x, size, op):
    b, *sp, c = x.shape
    nd = len(size)
    shape = [b]
    for d, s in zip(sp, size):
        shape += [d // s, s]
    y = x[(slice(None),) + tuple(slice(0, (d // s) * s) for d, s in zip(sp, size))].reshape(
        shape + [c]
    )
    return op(y, axis=tuple(2 + 2 * i for i in range(nd)))


def simple_rnn(x, W, U, b):
    h = np.zeros((x.shape[0], U.shape[0]))
    for t in range(x.shape[1]):
        h = np.tanh(x[:, t] @ W + h @ U + b)
    return h


def lstm_seq(x, W, U, b, h=None, c=None):
    n = U.shape[0]
    h = np.zeros((x.shape[0], n)) if h is None else h
    c = np.zeros((x.shape[0], n)) if c is None else c
    hs = []
    for t in range(x.shape[1]):
        z = x[:, t] @ W + h @ U + b
        i, f, g, o = (
            gate(z[:, :n]),
            gate(z[:, n : 2 * n]),
            np.tanh(z[:, 2 * n : 3 * n]),
            gate(z[:, 3 * n :]),
        )
        c = f * c + i * g
        h = o * np.tanh(c)
        hs.append(h)
    return np.stack(hs, 1), h, c


def gru(x, W, U, b):
    n = U.shape[0]
    h = np.zeros((x.shape[0], n))
    for t in range(x.shape[1]):
        xz = x[:, t] @ W + b
        z = gate(xz[:, :n] + h @ U[:, :n])
        r = gate(xz[:, n : 2 * n] + h @ U[:, n : 2 * n])
        hh = np.tanh(xz[:, 2 * n :] + (r * h) @ U[:, 2 * n :])
        h = z * h + (1 - z) * hh
    return h


def local1d(x, w, b, k):
    p = patches(x, (k,))  # (b, out, k, c)
    p = p.reshape(p.shape[0], p.shape[1], -1)
    return np.einsum("bti,tif->btf", p, w) + b


CASES = [
    # name, layer factory, input shape, input generator, NumPy reference (x, weights) or None
    (
        "Dense",
        lambda: L.Dense(3, activation="tanh"),
        (5,),
        floats(5),
        lambda x, w: np.tanh(x @ w[0] + w[1]),
    ),
    (
        "Activation",
        lambda: L.Activation("softplus"),
        (4,),
        floats(4),
        lambda x, w: np.log1p(np.exp(x)),
    ),
    ("Dropout", lambda: L.Dropout(0.5), (4,), floats(4), lambda x, w: x),
    ("SpatialDropout1D", lambda: L.SpatialDropout1D(0.5), (3, 4), floats(3, 4), lambda x, w: x),
    ("GaussianNoise", lambda: L.GaussianNoise(0.5), (4,), floats(4), lambda x, w: x),
    ("Flatten", lambda: L.Flatten(), (2, 3), floats(2, 3), lambda x, w: x.reshape(len(x), -1)),
    (
        "Reshape",
        lambda: L.Reshape((3, -1)),
        (2, 3),
        floats(2, 3),
        lambda x, w: x.reshape(len(x), 3, 2),
    ),
    ("Permute", lambda: L.Permute((2, 1)), (2, 3), floats(2, 3), lambda x, w: x.transpose(0, 2, 1)),
    (
        "RepeatVector",
        lambda: L.RepeatVector(3),
        (4,),
        floats(4),
        lambda x, w: np.repeat(x[:, None], 3, 1),
    ),
    ("Lambda", lambda: L.Lambda(lambda t: t**2 + 1), (4,), floats(4), lambda x, w: x**2 + 1),
    (
        "Embedding",
        lambda: L.Embedding(10, 3, input_length=4),
        (4,),
        ints(10, 4),
        lambda x, w: w[0][x],
    ),
    ("Conv1D", lambda: L.Conv1D(4, 3), (7, 2), floats(7, 2), lambda x, w: conv(x, w[0], w[1], 1)),
    (
        "Conv1D_causal_dilated",
        lambda: L.Conv1D(2, 2, padding="causal", dilation_rate=2),
        (6, 2),
        floats(6, 2),
        None,
    ),
    (
        "Conv2D",
        lambda: L.Conv2D(3, (2, 3), activation="relu"),
        (5, 6, 2),
        floats(5, 6, 2),
        lambda x, w: np.maximum(conv(x, w[0], w[1], 2), 0),
    ),
    (
        "Conv2D_same_strided",
        lambda: L.Conv2D(3, 3, strides=2, padding="same"),
        (6, 6, 2),
        floats(6, 6, 2),
        None,
    ),
    (
        "Conv3D",
        lambda: L.Conv3D(2, 2),
        (3, 4, 4, 1),
        floats(3, 4, 4, 1),
        lambda x, w: conv(x, w[0], w[1], 3),
    ),
    (
        "Conv2DTranspose",
        lambda: L.Conv2DTranspose(2, 3, strides=2),
        (3, 3, 2),
        floats(3, 3, 2),
        None,
    ),
    (
        "SeparableConv1D",
        lambda: L.SeparableConv1D(3, 3, depth_multiplier=2),
        (7, 2),
        floats(7, 2),
        lambda x, w: depthwise(x, w[0], 1) @ w[1][0] + w[2],
    ),
    (
        "SeparableConv2D",
        lambda: L.SeparableConv2D(3, 2),
        (4, 5, 2),
        floats(4, 5, 2),
        lambda x, w: depthwise(x, w[0], 2) @ w[1][0, 0] + w[2],
    ),
    (
        "DepthwiseConv2D",
        lambda: L.DepthwiseConv2D(2, depth_multiplier=2),
        (4, 5, 3),
        floats(4, 5, 3),
        lambda x, w: depthwise(x, w[0], 2) + w[1],
    ),
    (
        "MaxPooling1D",
        lambda: L.MaxPooling1D(2),
        (6, 3),
        floats(6, 3),
        lambda x, w: pool(x, (2,), np.max),
    ),
    (
        "AveragePooling1D",
        lambda: L.AveragePooling1D(3),
        (6, 3),
        floats(6, 3),
        lambda x, w: pool(x, (3,), np.mean),
    ),
    (
        "MaxPooling2D",
        lambda: L.MaxPooling2D((2, 2)),
        (4, 6, 2),
        floats(4, 6, 2),
        lambda x, w: pool(x, (2, 2), np.max),
    ),
    (
        "AveragePooling2D",
        lambda: L.AveragePooling2D((2, 3)),
        (4, 6, 2),
        floats(4, 6, 2),
        lambda x, w: pool(x, (2, 3), np.mean),
    ),
    (
        "MaxPooling2D_same",
        lambda: L.MaxPooling2D(2, padding="same"),
        (5, 5, 1),
        floats(5, 5, 1),
        None,
    ),
    (
        "MaxPooling3D",
        lambda: L.MaxPooling3D(2),
        (4, 4, 4, 1),
        floats(4, 4, 4, 1),
        lambda x, w: pool(x, (2, 2, 2), np.max),
    ),
    (
        "AveragePooling3D",
        lambda: L.AveragePooling3D(2),
        (4, 4, 4, 1),
        floats(4, 4, 4, 1),
        lambda x, w: pool(x, (2, 2, 2), np.mean),
    ),
    (
        "GlobalMaxPooling1D",
        lambda: L.GlobalMaxPooling1D(),
        (5, 3),
        floats(5, 3),
        lambda x, w: x.max(1),
    ),
    (
        "GlobalAveragePooling1D",
        lambda: L.GlobalAveragePooling1D(),
        (5, 3),
        floats(5, 3),
        lambda x, w: x.mean(1),
    ),
    (
        "GlobalMaxPooling2D",
        lambda: L.GlobalMaxPooling2D(),
        (3, 4, 2),
        floats(3, 4, 2),
        lambda x, w: x.max((1, 2)),
    ),
    (
        "GlobalAveragePooling2D",
        lambda: L.GlobalAveragePooling2D(),
        (3, 4, 2),
        floats(3, 4, 2),
        lambda x, w: x.mean((1, 2)),
    ),
    (
        "UpSampling1D",
        lambda: L.UpSampling1D(2),
        (3, 2),
        floats(3, 2),
        lambda x, w: np.repeat(x, 2, 1),
    ),
    (
        "UpSampling2D",
        lambda: L.UpSampling2D((2, 3)),
        (2, 3, 1),
        floats(2, 3, 1),
        lambda x, w: np.repeat(np.repeat(x, 2, 1), 3, 2),
    ),
    (
        "UpSampling3D",
        lambda: L.UpSampling3D(2),
        (2, 2, 2, 1),
        floats(2, 2, 2, 1),
        lambda x, w: np.repeat(np.repeat(np.repeat(x, 2, 1), 2, 2), 2, 3),
    ),
    (
        "ZeroPadding1D",
        lambda: L.ZeroPadding1D((1, 2)),
        (3, 2),
        floats(3, 2),
        lambda x, w: np.pad(x, ((0, 0), (1, 2), (0, 0))),
    ),
    (
        "ZeroPadding2D",
        lambda: L.ZeroPadding2D(((1, 0), (2, 1))),
        (2, 3, 1),
        floats(2, 3, 1),
        lambda x, w: np.pad(x, ((0, 0), (1, 0), (2, 1), (0, 0))),
    ),
    (
        "ZeroPadding3D",
        lambda: L.ZeroPadding3D(1),
        (2, 2, 2, 1),
        floats(2, 2, 2, 1),
        lambda x, w: np.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0))),
    ),
    ("Cropping1D", lambda: L.Cropping1D((1, 2)), (6, 2), floats(6, 2), lambda x, w: x[:, 1:-2]),
    (
        "Cropping2D",
        lambda: L.Cropping2D(((1, 0), (1, 2))),
        (4, 5, 1),
        floats(4, 5, 1),
        lambda x, w: x[:, 1:, 1:-2],
    ),
    (
        "Cropping3D",
        lambda: L.Cropping3D(1),
        (3, 3, 3, 1),
        floats(3, 3, 3, 1),
        lambda x, w: x[:, 1:-1, 1:-1, 1:-1],
    ),
    (
        "BatchNormalization",
        lambda: L.BatchNormalization(),
        (4,),
        floats(4),
        lambda x, w: (x - w[2]) / np.sqrt(w[3] + 1e-3) * w[0] + w[1],
    ),
    ("SimpleRNN", lambda: L.SimpleRNN(3), (4, 2), floats(4, 2), lambda x, w: simple_rnn(x, *w)),
    ("GRU", lambda: L.GRU(3), (4, 2), floats(4, 2), lambda x, w: gru(x, *w)),
    ("LSTM", lambda: L.LSTM(3), (4, 2), floats(4, 2), lambda x, w: lstm_seq(x, *w)[1]),
    (
        "LSTM_return_sequences",
        lambda: L.LSTM(3, return_sequences=True),
        (4, 2),
        floats(4, 2),
        lambda x, w: lstm_seq(x, *w)[0],
    ),
    (
        "LSTM_go_backwards",
        lambda: L.LSTM(3, go_backwards=True),
        (4, 2),
        floats(4, 2),
        lambda x, w: lstm_seq(x[:, ::-1], *w)[1],
    ),
    (
        "LSTM_unroll",
        lambda: L.LSTM(3, unroll=True),
        (4, 2),
        floats(4, 2),
        lambda x, w: lstm_seq(x, *w)[1],
    ),
    (
        "Bidirectional_LSTM",
        lambda: L.Bidirectional(L.LSTM(3)),
        (4, 2),
        floats(4, 2),
        lambda x, w: np.concatenate([lstm_seq(x, *w[:3])[1], lstm_seq(x[:, ::-1], *w[3:])[1]], -1),
    ),
    ("ConvLSTM2D", lambda: L.ConvLSTM2D(2, 2), (3, 4, 4, 1), floats(3, 4, 4, 1), None),
    (
        "TimeDistributed_Dense",
        lambda: L.TimeDistributed(L.Dense(2)),
        (3, 4),
        floats(3, 4),
        lambda x, w: x @ w[0] + w[1],
    ),
    (
        "LocallyConnected1D",
        lambda: L.LocallyConnected1D(2, 2),
        (5, 3),
        floats(5, 3),
        lambda x, w: local1d(x, w[0], w[1], 2),
    ),
    ("LocallyConnected2D", lambda: L.LocallyConnected2D(2, 2), (3, 4, 1), floats(3, 4, 1), None),
    (
        "LeakyReLU",
        lambda: L.LeakyReLU(0.2),
        (4,),
        floats(4),
        lambda x, w: np.where(x > 0, x, 0.2 * x),
    ),
    (
        "PReLU",
        lambda: L.PReLU(alpha_initializer=keras.initializers.Constant(0.3)),
        (4,),
        floats(4),
        lambda x, w: np.where(x > 0, x, w[0] * x),
    ),
    (
        "ELU",
        lambda: L.ELU(0.7),
        (4,),
        floats(4),
        lambda x, w: np.where(x > 0, x, 0.7 * (np.exp(x) - 1)),
    ),
    (
        "ThresholdedReLU",
        lambda: L.ThresholdedReLU(0.3),
        (4,),
        floats(4),
        lambda x, w: np.where(x > 0.3, x, 0),
    ),
    (
        "Softmax",
        lambda: L.Softmax(),
        (4,),
        floats(4),
        lambda x, w: np.exp(x) / np.exp(x).sum(-1, keepdims=True),
    ),
    (
        "ReLU",
        lambda: L.ReLU(max_value=0.5, negative_slope=0.1),
        (4,),
        floats(4),
        lambda x, w: np.minimum(np.where(x > 0, x, 0.1 * x), 0.5),
    ),
]

IDS = [c[0] for c in CASES]


def one_layer_model(make, shape):
    layer = make()
    inp = L.Input(shape, dtype="int32" if isinstance(layer, L.Embedding) else "float32")
    return Model(inp, layer(inp)), layer


@pytest.mark.parametrize(
    "name,make,shape,gen,ref",
    [c for c in CASES if c[4] is not None],
    ids=[c[0] for c in CASES if c[4] is not None],
)
def test_forward_matches_numpy(name, make, shape, gen, ref):
    model, layer = one_layer_model(make, shape)
    weights = layer.get_weights()
    if name == "BatchNormalization":  # non-trivial moving statistics
        weights = [
            rng.uniform(0.5, 2, 4),
            rng.uniform(-1, 1, 4),
            rng.uniform(-1, 1, 4),
            rng.uniform(0.5, 2, 4),
        ]
        layer.set_weights(weights)
    x = gen(6)
    got = model.predict(x)
    want = ref(
        x.astype("float64") if x.dtype.kind == "f" else x,
        [np.asarray(w, "float64") for w in weights],
    )
    assert got.shape == want.shape == (6,) + model.output_shape[1:]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,make,shape,gen,ref", CASES, ids=IDS)
def test_trains_and_round_trips(name, make, shape, gen, ref, tmp_path):
    model, layer = one_layer_model(make, shape)
    out = model.output
    if len(model.output_shape) > 2:
        out = L.Flatten()(out)
    model = Model(model.input, L.Dense(1)(out))
    model.compile("adam", "mse")
    x = gen(32)
    y = rng.uniform(-1, 1, size=(32, 1)).astype("float32")
    hist = model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    assert np.all(np.isfinite(hist.history["loss"]))
    path = str(tmp_path / "m.h5")
    model.save(path)
    custom = {"<lambda>": None}
    loaded = load_model(path, custom_objects=custom)
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-5, atol=1e-6)


def test_batch_normalization_training_updates_moving_stats():
    model = Sequential([L.BatchNormalization(input_shape=(3,), momentum=0.5)])
    model.compile("sgd", "mse")
    x = rng.normal(2.0, 3.0, size=(64, 3)).astype("float32")
    model.fit(x, x, batch_size=64, epochs=1, verbose=0)
    gamma, beta, mm, mv = model.layers[0].get_weights()
    np.testing.assert_allclose(mm, 0.5 * x.mean(0), rtol=1e-4)
    # Keras uses the unbiased batch variance for the moving average.
    np.testing.assert_allclose(mv, 0.5 + 0.5 * x.var(0, ddof=1), rtol=1e-4)


MERGES = [
    ("add", L.add, lambda a, b: a + b),
    ("subtract", L.subtract, lambda a, b: a - b),
    ("multiply", L.multiply, lambda a, b: a * b),
    ("average", L.average, lambda a, b: (a + b) / 2),
    ("maximum", L.maximum, np.maximum),
    ("minimum", L.minimum, np.minimum),
    ("concatenate", L.concatenate, lambda a, b: np.concatenate([a, b], -1)),
    ("dot", lambda ts: L.dot(ts, axes=-1), lambda a, b: (a * b).sum(-1, keepdims=True)),
    (
        "dot_normalize",
        lambda ts: L.dot(ts, axes=1, normalize=True),
        lambda a, b: (
            (a * b).sum(-1, keepdims=True)
            / np.linalg.norm(a, axis=-1, keepdims=True)
            / np.linalg.norm(b, axis=-1, keepdims=True)
        ),
    ),
]


@pytest.mark.parametrize("name,merge,ref", MERGES, ids=[m[0] for m in MERGES])
def test_merge_layers(name, merge, ref):
    a, b = L.Input((4,)), L.Input((4,))
    model = Model([a, b], merge([a, b]))
    xa, xb = floats(4)(5), floats(4)(5)
    np.testing.assert_allclose(model.predict([xa, xb]), ref(xa, xb), rtol=1e-5, atol=1e-6)


def test_masking_skips_padded_steps():
    """Masked (all-zero) trailing steps leave the LSTM state as it was."""
    x = floats(5, 2)(4)
    x[:, 3:] = 0.0
    inp = L.Input((5, 2))
    lstm = L.LSTM(3)
    model = Model(inp, lstm(L.Masking(0.0)(inp)))
    np.testing.assert_allclose(
        model.predict(x),
        lstm_seq(x[:, :3].astype("float64"), *lstm.get_weights())[1],
        rtol=1e-4,
        atol=1e-5,
    )


def test_embedding_mask_zero_feeds_rnn():
    model = Sequential([L.Embedding(10, 4, mask_zero=True, input_length=5), L.GRU(3)])
    x = np.array([[1, 2, 3, 0, 0], [4, 5, 0, 0, 0]])
    emb = model.layers[0].get_weights()[0].astype("float64")
    w = [np.asarray(v, "float64") for v in model.layers[1].get_weights()]
    got = model.predict(x)
    np.testing.assert_allclose(got[0], gru(emb[x[:1, :3]], *w)[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], gru(emb[x[1:, :2]], *w)[0], rtol=1e-4, atol=1e-5)


def test_stateful_lstm_carries_state_between_batches():
    x = floats(6, 2)(2)
    model = Sequential([L.LSTM(3, stateful=True, batch_input_shape=(2, 3, 2))])
    w = [np.asarray(v, "float64") for v in model.layers[0].get_weights()]
    first = model.predict(x[:, :3], batch_size=2)
    second = model.predict(x[:, 3:], batch_size=2)
    _, h_full, _ = lstm_seq(x.astype("float64"), *w)
    np.testing.assert_allclose(
        first, lstm_seq(x[:, :3].astype("float64"), *w)[1], rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(second, h_full, rtol=1e-4, atol=1e-5)
    model.reset_states()
    np.testing.assert_allclose(model.predict(x[:, :3], batch_size=2), first, rtol=1e-5, atol=1e-6)


def test_lstm_returns_state_and_takes_initial_state():
    inp = L.Input((4, 2))
    out, h, c = L.LSTM(3, return_state=True)(inp)
    dec = L.LSTM(3, return_sequences=True)
    seq = dec(inp, initial_state=[h, c])
    model = Model(inp, [out, h, c, seq])
    x = floats(4, 2)(3)
    o, hv, cv, s = model.predict(x)
    np.testing.assert_allclose(o, hv)
    wd = [np.asarray(v, "float64") for v in dec.get_weights()]
    np.testing.assert_allclose(
        s, lstm_seq(x.astype("float64"), *wd, h=hv, c=cv)[0], rtol=1e-4, atol=1e-5
    )


def test_rnn_dropout_trains():
    model = Sequential(
        [L.LSTM(4, dropout=0.2, recurrent_dropout=0.2, input_shape=(5, 3)), L.Dense(1)]
    )
    model.compile("adam", "mse")
    h = model.fit(floats(5, 3)(16), np.ones((16, 1)), epochs=2, verbose=0)
    assert np.all(np.isfinite(h.history["loss"]))


def test_shapes_known_to_keras_or_to_the_graph():
    inp = L.Input((2, 3))
    r = L.Reshape((3, -1))(inp)
    assert keras.backend.int_shape(r) == (None, 3, 2)  # from Keras's record
    lam = L.Lambda(lambda t: t[:, :1])(inp)  # no output_shape: Keras assumes (None, 2, 3)
    assert keras.backend.int_shape(lam) == (None, 1, 3)  # the graph knows better
    model = Model(inp, L.Dense(2)(L.Flatten()(L.concatenate([lam, lam], axis=1))))
    assert model.predict(np.ones((4, 2, 3))).shape == (4, 2)
