"""Fixtures and hooks of the ferrokeras test suite.

The suite runs on whatever device ``FERROKERAS_DEVICE`` selects (``make test`` runs it
once per available device), so no test is parametrised over devices.

Helpers live in ordinary modules of this folder (on ``sys.path`` through the ``pythonpath``
setting of pytest in pyproject.toml): the NumPy oracles in ``reference.py``, the
finite-difference gradient check and its companions in ``gradcheck.py``, the API table
reader in ``api_table.py``.

Any test may import Keras (the docstring examples of ``ferrokeras.distributed`` do), and
Keras picks its backend once, when first imported: so the backend is ferrokeras for the
whole session, with a throw-away ``KERAS_HOME`` so that Keras does not write
``~/.keras/keras.json``.
"""

import os
import tempfile

os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="ferrokeras-keras-home-"))

import ferrokeras  # noqa: E402  (after the Keras settings above)
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from ferrokeras import backend as K  # noqa: E402


def pytest_report_header(config):
    device = getattr(ferrokeras, "device", None)
    if device is None:
        return "ferrokeras device: (ferrokeras.device() not available)"
    try:
        name = device()
        info = [d for d in ferrokeras.devices() if d["device"] == name]
        if info and name != "cpu":
            name = "{} ({}, {}, {})".format(
                name, info[0]["name"], info[0]["backend"], info[0]["type"]
            )
        return f"ferrokeras device: {name}"
    except Exception as exc:  # the header must never break collection
        return f"ferrokeras device: <error: {exc!r}>"


GPUS = [d for d in ferrokeras.devices() if d["device"] != "cpu"]
REQUIRE_GPU = os.environ.get("FERROKERAS_REQUIRE_GPU", "") not in ("", "0")


@pytest.fixture
def gpu():
    """Runs the test on the first GPU adapter, restoring the previous device after; skips it
    where there is none, unless FERROKERAS_REQUIRE_GPU=1 (CI), which makes that a failure."""
    if not GPUS:
        if REQUIRE_GPU:
            pytest.fail("FERROKERAS_REQUIRE_GPU=1 but wgpu found no GPU adapter")
        pytest.skip("no GPU adapter on this machine")
    before = ferrokeras.device()
    name = ferrokeras.set_device("gpu")
    assert name.startswith("gpu:")
    yield name
    ferrokeras.set_device(before)


@pytest.fixture
def rng():
    """A seeded NumPy Generator, fresh for every test."""
    return np.random.default_rng(20240521)


@pytest.fixture(autouse=True, scope="session")
def _no_leaked_feeds():
    """No test of the suite leaves a feed read in place held past its call
    (`_core.borrowed_feeds`, test_feeds_in_place.py)."""
    yield
    from ferrokeras import _core

    borrowed, leaked = _core.borrowed_feeds()
    assert leaked == 0, (
        f"{leaked} of {borrowed} feeds read in place were still held when their call ended"
    )


@pytest.fixture(autouse=True)
def _restore_config():
    """Put the global backend configuration back after every test."""
    saved = (K.floatx(), K.epsilon(), K.image_data_format())
    yield
    K.set_floatx(saved[0])
    K.set_epsilon(saved[1])
    K.set_image_data_format(saved[2])
