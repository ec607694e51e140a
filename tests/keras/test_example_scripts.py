"""Programs in the style of the Keras 2.3.1 examples (``examples/*.py`` of the Keras
repository), shortened and on random data, run unmodified on ferrokeras. Each script
ends with its own checks (the loss falls, outputs match a NumPy formula, gradients match
finite differences); here each is run in-process, with a fresh Keras session."""

import os
import runpy

import numpy as np
import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
NAMES = sorted(f[:-3] for f in os.listdir(SCRIPTS) if f.endswith(".py"))


@pytest.mark.parametrize("name", NAMES)
def test_example_script_runs(name, tmp_path, monkeypatch):
    pytest.importorskip("scipy")
    monkeypatch.chdir(tmp_path)
    np.random.seed(0)
    runpy.run_path(os.path.join(SCRIPTS, name + ".py"), run_name="__main__")
