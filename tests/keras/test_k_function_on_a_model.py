"""The worked ``K.function`` example of docs/spec/k_function_on_a_keras_model.md, run unchanged."""

import numpy as np

# Verbatim from the seed ("一个简单的栗子"), with `print` kept: it must run as written.
SEED_002 = """
import keras
from keras.models import Model
from keras.layers import Dense,Input
from keras.layers import Dropout
from keras.layers import Activation
import numpy as np
import keras.backend as K


x_val = np.random.random((1,1,20))
print(x_val)

q1 = Input(shape=(None, 20))
dense1 = Dense(64)(q1)
dense1 = Dropout(0.5)(dense1)
act1 = Activation(activation='relu')(dense1)

dense2 = Dense(64, activation='relu')(act1)
dense2 = Dropout(0.4)(dense2)
model = Model([q1], [dense2])
model.summary()

f = K.function([q1], [act1])

out = f([x_val])
print(out)
"""


def test_seed_002_runs_unchanged(capsys):
    ns = {}
    exec(compile(SEED_002, "seed_002", "exec"), ns)
    out = ns["out"]
    assert isinstance(out, list) and len(out) == 1
    assert isinstance(out[0], np.ndarray)
    assert out[0].shape == (1, 1, 64) and out[0].dtype == np.float32
    assert np.all(out[0] >= 0)
    # The learning phase is not fed, so it reads 0 (test): Dropout is off and the result is
    # relu(x @ W + b) with the Dense layer's weights.
    w, b = ns["model"].layers[1].get_weights()
    np.testing.assert_allclose(out[0], np.maximum(ns["x_val"] @ w + b, 0), rtol=1e-5, atol=1e-6)
    printed = capsys.readouterr().out
    assert "Total params: 5,504" in printed and "array(" in printed
