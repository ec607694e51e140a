"""What lets Keras 2.2.4 and 2.2.5 run on Python 3.11, h5py 3 and PyYAML 6
(``ferrokeras._keras22``), checked under whichever Keras runs this suite (2.3.1 in
``.venv``, 2.2.x in ``.venv-keras22x``)."""

import inspect

import keras
import numpy as np
from keras.layers import Dense
from keras.models import Sequential, load_model, model_from_yaml


def test_a_supported_keras_runs_on_ferrokeras():
    assert keras.__version__ in ("2.2.4", "2.2.5", "2.3.1")
    assert keras.backend.backend() == "ferrokeras.backend"


def test_getargspec_and_argspec_are_there():
    def f(a, b=1, *args, **kwargs):
        return a

    spec = inspect.getargspec(f)
    assert spec == inspect.ArgSpec(["a", "b"], "args", "kwargs", (1,))
    assert (spec.args, spec.keywords) == (["a", "b"], "kwargs")


def small_model():
    model = Sequential([Dense(3, input_shape=(2,), activation="tanh"), Dense(1)])
    model.compile("sgd", "mse")
    return model


def test_string_attributes_read_through_h5dict_are_lists(tmp_path):
    from keras.engine import saving

    model = small_model()
    model.save(str(tmp_path / "m.h5"))
    h5dict = getattr(saving, "H5Dict", None) or saving.h5dict
    f = h5dict(str(tmp_path / "m.h5"), mode="r")
    try:
        names = f["model_weights"]["layer_names"]
        assert isinstance(names, list)
        assert [n.decode("utf8") for n in names] == [layer.name for layer in model.layers]
    finally:
        f.close()


def test_save_and_load_model(tmp_path):
    model = small_model()
    model.fit(np.ones((4, 2)), np.zeros((4, 1)), epochs=2, verbose=0)
    model.save(str(tmp_path / "m.h5"))
    again = load_model(str(tmp_path / "m.h5"))
    x = np.random.RandomState(0).rand(5, 2).astype("float32")
    np.testing.assert_allclose(again.predict(x), model.predict(x), rtol=1e-6)
    assert type(again.optimizer).__name__ == "SGD"


def test_model_from_yaml():
    model = small_model()
    again = model_from_yaml(model.to_yaml())
    assert [layer.units for layer in again.layers] == [3, 1]
