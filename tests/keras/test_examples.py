"""The examples in examples/ reach their advertised accuracy on held-out digits."""

import importlib.util
import os

import pytest

pytest.importorskip("sklearn")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_digits_mlp_reaches_95_percent():
    assert load("digits_mlp").main() >= 0.95


def test_digits_cnn_reaches_95_percent():
    assert load("digits_cnn").main(epochs=12) >= 0.95


def test_lstm_digits_learns():
    # A shortened run (the full one reaches about 97%).
    assert load("lstm_digits").main(epochs=8) >= 0.85
