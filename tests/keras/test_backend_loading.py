"""Keras 2.3.1 loads ferrokeras as its backend, and finds every ``K`` name it uses."""

import json
import os
import re
import subprocess
import sys

import ferrokeras.backend as FK
import keras
import numpy as np
import pytest
from keras import backend as K


def test_keras_reports_the_backend_module():
    assert K.backend() == "ferrokeras.backend"
    assert K.variable is FK.variable
    assert K.function is FK.function


def _run_isolated(code, env):
    full = dict(os.environ)
    full.pop("KERAS_BACKEND", None)
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_backend_chosen_in_keras_json(tmp_path):
    (tmp_path / "keras.json").write_text(
        json.dumps(
            {
                "backend": "ferrokeras.backend",
                "floatx": "float32",
                "epsilon": 1e-07,
                "image_data_format": "channels_last",
            }
        )
    )
    code = "import keras; print(keras.backend.backend(), keras.backend.variable.__module__)"
    assert (
        _run_isolated(code, {"KERAS_HOME": str(tmp_path)})
        == "ferrokeras.backend ferrokeras._k.variables"
    )


def test_backend_chosen_by_environment_variable(tmp_path):
    code = "import keras; print(keras.backend.backend())"
    env = {"KERAS_HOME": str(tmp_path), "KERAS_BACKEND": "ferrokeras.backend"}
    assert _run_isolated(code, env) == "ferrokeras.backend"
    # Keras writes a default keras.json into a fresh KERAS_HOME; ours must not break that.
    assert (tmp_path / "keras.json").exists()


def test_python_and_numpy_shims():
    import collections
    import collections.abc

    assert collections.Iterable is collections.abc.Iterable
    assert collections.Mapping is collections.abc.Mapping
    assert np.Inf == np.inf


def _names_keras_calls():
    """Every `K.<name>` in Keras's own sources, less its TF/Theano/CNTK-only branches."""
    root = os.path.dirname(keras.__file__)
    names = set()
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) == "backend":
            continue
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(dirpath, f), encoding="utf8") as fh:
                    names.update(re.findall(r"\bK\.([A-Za-z_]\w*)", fh.read()))
    # Only reached under another backend (`K.backend() == 'tensorflow'` / 'theano' branches,
    # TensorBoard's session), in a docstring, or in a TimeDistributed branch for tensors
    # without a static rank (which no backend defines: a Keras bug).
    return names - {
        "tensorflow_backend",
        "get_session",
        "set_session",
        "pattern_broadcast",
        "in_training_phase",
        "compute_output_shape",
    }


def _names_keras_imports():
    """Every name ``keras/backend/__init__.py`` imports from the loaded backend: a missing
    one makes ``import keras`` fail."""
    path = os.path.join(os.path.dirname(keras.__file__), "backend", "__init__.py")
    with open(path, encoding="utf8") as fh:
        return set(re.findall(r"^from \.load_backend import (\w+)", fh.read(), re.M))


def test_every_name_keras_uses_exists():
    imports = _names_keras_imports()
    # Keras 2.2.4 takes every name the backend has; from 2.2.5 it imports a fixed list.
    if keras.__version__ != "2.2.4":
        assert len(imports) > 100, "keras/backend/__init__.py no longer reads as expected"
    missing = sorted(n for n in _names_keras_calls() | imports if not hasattr(K, n))
    assert missing == []
    documented = set(FK.__all__)
    assert sorted(n for n in imports if not hasattr(FK, n)) == []
    assert documented >= {n for n in imports if n in vars(FK) and not n.startswith("_")}


def test_importing_the_backend_alone_changes_no_other_module():
    code = (
        "import collections, numpy as np, sys\n"
        "import ferrokeras.backend\n"
        "assert not hasattr(collections, 'Iterable'), 'collections patched'\n"
        "assert 'Inf' not in vars(np), 'numpy patched'\n"
        "assert 'keras' not in sys.modules and 'h5py' not in sys.modules\n"
        "print('ok')\n"
    )
    assert _run_isolated(code, {}) == "ok"


def test_tensor_attributes_keras_reads():
    x = K.placeholder(shape=(None, 3), name="x_in")
    assert x.name == "x_in"
    assert K.int_shape(x) == (None, 3)
    assert x._keras_shape == (None, 3)
    assert x.get_shape().as_list() == [None, 3]
    assert tuple(x.shape) == (None, 3)
    assert x.dtype == "float32"
    assert K.dtype(x) == "float32"
    x._keras_history = ("layer", 0, 0)
    x._uses_learning_phase = True
    assert x._keras_history == ("layer", 0, 0)
    assert {x: 1}[x] == 1  # tensors are dict keys by identity


def test_name_scope_prefixes_variable_names():
    with K.name_scope("outer"):
        with K.name_scope("inner"):
            v = K.variable(np.zeros(2), name="w")
        u = K.variable(1.0, name="u")
    w = K.variable(1.0, name="plain")
    assert (v.name, u.name, w.name) == ("outer/inner/w", "outer/u", "plain")


def test_control_dependencies_reads_updated_values():
    total = K.variable(0.0)
    count = K.variable(0.0)
    x = K.placeholder(shape=(None,))
    ops = [K.update_add(total, K.sum(x)), K.update_add(count, K.cast(K.size(x), "float32"))]
    with K.control_dependencies(ops):
        mean = K.identity(total / count)
    outside = total / count
    f = K.function([x], [mean, outside], updates=ops)
    m1, o1 = f([np.array([1.0, 3.0])])
    assert float(m1) == 2.0 and np.isnan(o1)
    m2, o2 = f([np.array([8.0])])
    assert float(m2) == 4.0 and float(o2) == 2.0
    assert float(K.get_value(total)) == 12.0 and float(K.get_value(count)) == 3.0


def test_size_and_slice():
    x = K.constant(np.arange(24, dtype="float32").reshape(2, 3, 4))
    assert int(K.eval(K.size(x))) == 24
    ph = K.placeholder(shape=(None, 5))
    assert int(K.function([ph], [K.size(ph)])([np.zeros((3, 5))])[0]) == 15
    np.testing.assert_array_equal(K.eval(K.slice(x, (1, 0, 2), (1, -1, 2))), K.eval(x)[1:2, :, 2:4])
    with pytest.raises(ValueError, match="start has 2 entries"):
        K.slice(x, (0, 0), (1, 1))
    with pytest.raises(TypeError):
        K.slice(x, (0, 0, 0.5), (1, 1, 1))


def test_get_variable_shape():
    assert K.get_variable_shape(K.zeros((2, 5))) == (2, 5)


def test_keras_and_ferrokeras_share_floatx():
    """`keras.backend.set_floatx` is ferrokeras's: a float64 model is float64 throughout."""
    saved = K.floatx()
    try:
        K.set_floatx("float64")
        assert FK.floatx() == "float64"
        model = keras.models.Sequential(
            [keras.layers.Dense(2, input_shape=(3,), activation="tanh")]
        )
        model.compile(keras.optimizers.Adam(), "mse")
        assert all(w.dtype == "float64" for w in model.weights)
        model.train_on_batch(np.ones((4, 3)), np.zeros((4, 2)))
        assert model.predict(np.ones((1, 3))).dtype == np.float64
    finally:
        K.set_floatx(saved)
    assert FK.floatx() == saved


def test_clear_session_and_documented_extras_are_on_keras_backend():
    assert K.clear_session is FK.clear_session
    assert K.manual_variable_initialization is FK.manual_variable_initialization
