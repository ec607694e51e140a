"""The Keras FAQ's recipe for reproducible results, ``np.random.seed(n)`` before building
and training a model, gives bitwise-identical weights run after run: unseeded random ops
(initializers, dropout) draw their seeds from NumPy's global generator when they are built.
Each run is a fresh Python process, as a user's script would be."""

import hashlib
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    {seed_call}
    import keras
    from keras.layers import Conv1D, Dense, Dropout, Flatten, GRU
    from keras.models import Sequential

    x = np.random.rand(96, 8, 3).astype("float32")
    y = (x.sum(axis=(1, 2)) > 12).astype("float32")
    model = Sequential([
        Conv1D(4, 3, activation="relu", input_shape=(8, 3)),
        GRU(5, return_sequences=True, dropout=0.2, recurrent_dropout=0.2),
        Flatten(),
        Dropout(0.5),
        Dense(1, activation="sigmoid", kernel_initializer="glorot_normal"),
    ])
    model.compile("adam", "binary_crossentropy")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=True, verbose=0)
    weights = model.get_weights()
    np.savez(sys.argv[1], *weights)
    """
)


def _run(tmp_path, name, seed_call, env=None):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(seed_call=seed_call))
    out = tmp_path / f"{name}.npz"
    run_env = dict(os.environ, KERAS_BACKEND="ferrokeras.backend", **(env or {}))
    subprocess.run(
        [sys.executable, str(script), str(out)],
        check=True,
        env=run_env,
        cwd=tmp_path,
        timeout=300,
        capture_output=True,
    )
    with open(out, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_numpy_seed_gives_identical_weights(tmp_path):
    seeded = "np.random.seed(1)"
    first = _run(tmp_path, "a", seeded)
    assert _run(tmp_path, "b", seeded) == first
    assert _run(tmp_path, "c", "np.random.seed(2)") != first


def test_set_random_seed_gives_identical_weights(tmp_path):
    seeded = "import ferrokeras; ferrokeras.set_random_seed(7)"
    assert _run(tmp_path, "a", seeded) == _run(tmp_path, "b", seeded)
