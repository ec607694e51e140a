"""ferrokeras: a Keras-2 backend engine with a Rust core.

Use it as ``from ferrokeras import backend as K``, or under Keras 2.3.1 with
``KERAS_BACKEND=ferrokeras.backend``.
"""

from . import _core

__version__ = "0.1.0"


def device():
    """Returns the name of the device graphs run on (``'cpu'`` until the GPU backend lands)."""
    return _core.device()


def devices():
    """Lists the devices ferrokeras can run on, as dicts with ``name``, ``backend`` and ``type``."""
    return [{"name": "cpu", "backend": "host", "type": "cpu"}]


def __getattr__(name):
    # `ferrokeras.py_function` is `ferrokeras.backend.py_function`, imported on first use.
    if name == "py_function":
        from .backend import py_function

        return py_function
    raise AttributeError(f"module 'ferrokeras' has no attribute {name!r}")


__all__ = ["device", "devices", "py_function", "__version__"]
