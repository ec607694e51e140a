"""Writes ``ctc_beam_search.npz``: TensorFlow's beam search decoding of random inputs,
which ``tests/test_ctc.py`` compares ``K.ctc_decode(greedy=False)`` with.

Case ``i`` stores ``i/y`` (softmax outputs, batch x time x classes), ``i/lens``,
``i/beam`` (beam width, top paths), ``i/d0``, ``i/d1``, ... (the decoded labellings,
padded with -1) and ``i/lp`` (their log-probabilities), from
``tf_keras.backend.ctc_decode``. It runs where TensorFlow is installed:

    /tmp/tfvenv/bin/python tests/data/tf_keras/make_ctc_fixtures.py
"""

import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import tf_keras as keras
except ImportError:  # TensorFlow < 2.16 ships Keras 2 as tensorflow.keras
    from tensorflow import keras

K = keras.backend
HERE = os.path.dirname(os.path.abspath(__file__))


def main():
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


if __name__ == "__main__":
    main()
