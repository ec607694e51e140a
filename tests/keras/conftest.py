"""Keras 2.3.1 integration tests: unmodified Keras programs run on ``ferrokeras.backend``.

Keras picks its backend once, when it is first imported, so this file sets
``KERAS_BACKEND`` (and a throw-away ``KERAS_HOME``, so that Keras does not write
``~/.keras/keras.json``) before anything imports it. The tests run under Keras 2.3.1
(``pip install "ferrokeras[keras]"``), 2.2.5 and 2.2.4 (``make test`` runs them in
``.venv-keras225`` and ``.venv-keras224`` too), and are skipped as a whole without Keras.
"""

import os
import tempfile

import numpy as np
import pytest

os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="ferrokeras-keras-home-"))

try:
    import keras
except ImportError:  # Keras is an optional dependency: nothing here to run without it.
    keras = None
if keras is None or getattr(keras, "__version__", None) not in (
    "2.2.4",
    "2.2.5",
    "2.3.1",
):  # tests/keras itself imports as `keras` without Keras installed
    collect_ignore_glob = ["test_*.py"]
elif keras.__version__ < "2.3":
    # Loss and metric classes (`keras.losses.MeanSquaredError`, ...) are new in Keras 2.3.
    collect_ignore = ["test_losses_metrics.py"]


@pytest.fixture(autouse=True)
def _fresh_session():
    """Each test starts with fresh layer names and an unfixed learning phase."""
    keras.backend.clear_session()
    yield
    keras.backend.clear_session()


@pytest.fixture
def xor_data():
    """A small, learnable two-class problem: 8 features, label = whether their sum > 4."""
    rng = np.random.RandomState(0)
    x = rng.rand(256, 8).astype("float32")
    y = (x.sum(axis=1) > 4.0).astype("int32")
    return x, y
