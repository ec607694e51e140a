"""ferrokeras: a Keras-2 backend engine with a Rust core.

Use it as ``from ferrokeras import backend as K``, or under Keras 2.3.1 with
``KERAS_BACKEND=ferrokeras.backend``.

Devices: graphs run on the CPU or on a GPU through wgpu (Vulkan, Metal, DX12). The
device comes from ``FERROKERAS_DEVICE`` (``auto``, ``cpu``, ``gpu``, ``gpu:N``) or
``set_device``; see the README's "Devices" section.
"""

import random

import numpy as np

from . import _core
from ._profile import ProfileSummary, profile, profile_summary

__version__ = "0.1.0"

DeviceError = _core.DeviceError


def device():
    """Returns the device later calls run on: ``'cpu'`` or ``'gpu:N'``.

    Example:
        >>> import ferrokeras
        >>> ferrokeras.device() in ('cpu',) or ferrokeras.device().startswith('gpu:')
        True
    """
    return _core.device()


def set_device(name):
    """Selects the device for later calls and returns its name.

    Arguments:
        name: ``'auto'`` (a hardware GPU if wgpu finds one, else the CPU), ``'cpu'``,
            ``'gpu'`` (the first GPU adapter, software ones included) or ``'gpu:N'``
            (adapter N of ``devices()``).

    Raises:
        ValueError: `name` is not a device name.
        DeviceError: there is no such GPU adapter, or it cannot be opened.

    Variables keep their values across switches (a value resident on one GPU is copied
    through the host when another device reads it).
    """
    return _core.set_device(name)


def devices():
    """Lists the devices ferrokeras can run on.

    Returns:
        A list of dicts with ``device`` (the name ``set_device`` takes), ``name``,
        ``backend`` (``host``, ``Vulkan``, ``Metal``, ``Dx12`` or ``Gl``), ``type``
        (``cpu``, ``discrete``, ``integrated``, ``virtual`` or ``other``) and ``software``
        (True for software rasterisers such as Mesa llvmpipe, which ``auto`` skips).
        The CPU comes first.
    """
    out = [{"device": "cpu", "name": "cpu", "backend": "host", "type": "cpu", "software": False}]
    for index, name, backend, kind, software in _core.gpu_adapters():
        out.append(
            {
                "device": "gpu:%d" % index,
                "name": name,
                "backend": backend,
                "type": kind,
                "software": software,
            }
        )
    return out


def set_random_seed(seed):
    """Seeds every generator a ferrokeras program draws from: NumPy's global generator (from
    which unseeded random ops take their seeds when they are built, and which Keras uses to
    shuffle) and Python's ``random`` module.

    Arguments:
        seed: A non-negative integer below ``2 ** 32``.

    Raises:
        TypeError: if ``seed`` is not an integer. ValueError: if it is out of range.

    Example:
        >>> import ferrokeras
        >>> from ferrokeras import backend as K
        >>> ferrokeras.set_random_seed(3); a = K.eval(K.random_uniform((2,)))
        >>> ferrokeras.set_random_seed(3); b = K.eval(K.random_uniform((2,)))
        >>> bool((a == b).all())
        True
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"set_random_seed: seed must be an int, got {seed!r}")
    seed = int(seed)
    if not 0 <= seed < 2**32:
        raise ValueError(f"set_random_seed: seed must be in [0, 2**32), got {seed}")
    random.seed(seed)
    np.random.seed(seed)


def __getattr__(name):
    # `ferrokeras.py_function` is `ferrokeras.backend.py_function`, imported on first use.
    if name == "py_function":
        from .backend import py_function

        return py_function
    raise AttributeError(f"module 'ferrokeras' has no attribute {name!r}")


__all__ = [
    "device",
    "set_device",
    "devices",
    "set_random_seed",
    "DeviceError",
    "py_function",
    "profile",
    "profile_summary",
    "ProfileSummary",
    "__version__",
]
