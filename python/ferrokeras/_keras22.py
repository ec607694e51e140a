"""What Keras 2.2.4 and 2.2.5 need beyond what Keras 2.3.1 needs.

Keras 2.2.x reads HDF5 files through ``keras.utils.io_utils.H5Dict``, which turns arrays of
strings read from attributes into lists only when they are NumPy byte-string arrays, as
h5py 2 returned them; h5py 3 returns object arrays of ``str``, and Keras 2.2.4 then tests
such an array for truth (``if weight_names:``), which NumPy refuses (for an empty
attribute, which h5py reads back as an empty float array, too). ``adapt_saving`` makes
``H5Dict`` return such one-dimensional string (or empty) attributes as lists (their items
keep the ``.decode()`` method that ``_keras2._patch_h5py`` gives them). Keras 2.3.1
accepts either form.

Keras 2.2's ``model_from_yaml`` calls ``yaml.load(text)`` without a loader, which PyYAML
6 refuses; ``adapt_saving`` gives ``keras.engine.saving`` a ``yaml`` whose ``load``
defaults to ``yaml.FullLoader``, the loader Keras 2.3.1 passes.

Keras 2.2.4 also calls ``inspect.getargspec`` (``keras.preprocessing.image``) and Keras
2.2.5 builds ``inspect.ArgSpec`` tuples (``keras.utils.generic_utils.getargspec``), both
of which Python 3.11 removed; ``install_shims`` puts them back, ``getargspec`` built on
``inspect.getfullargspec``.
"""

import collections
import inspect

import numpy as np

ArgSpec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")


def _getargspec(func):
    """``inspect.getargspec`` as Python 3.10 had it: the positional-or-keyword arguments,
    ``*args`` and ``**kwargs`` names and the defaults."""
    spec = inspect.getfullargspec(func)
    if spec.kwonlyargs or spec.annotations:
        raise ValueError(
            "Function has keyword-only parameters or annotations, use inspect.signature() "
            "API which can support them"
        )
    return ArgSpec(spec.args, spec.varargs, spec.varkw, spec.defaults)


def install_shims():
    """Adds ``inspect.getargspec`` and ``inspect.ArgSpec`` where Python no longer has them
    (3.11+)."""
    if not hasattr(inspect, "ArgSpec"):
        inspect.ArgSpec = ArgSpec
    if not hasattr(inspect, "getargspec"):
        inspect.getargspec = _getargspec


def _is_attribute(h5dict, name):
    attrs = getattr(getattr(h5dict, "data", None), "attrs", None)
    try:
        return attrs is not None and name in attrs
    except TypeError:
        return False


class _YamlDefaultLoader:
    """The ``yaml`` module, with ``load`` defaulting to ``yaml.FullLoader``."""

    def __init__(self, yaml):
        self._yaml = yaml

    def __getattr__(self, name):
        return getattr(self._yaml, name)

    def load(self, stream, Loader=None):  # noqa: N803 (PyYAML's argument name)
        return self._yaml.load(stream, Loader=Loader or self._yaml.FullLoader)


def adapt_saving(saving):
    """Adapts ``keras.engine.saving`` (applied right after that module is imported): the
    ``H5Dict`` class it uses, and its ``yaml``."""
    yaml = getattr(saving, "yaml", None)
    if yaml is not None and not isinstance(yaml, _YamlDefaultLoader):
        saving.yaml = _YamlDefaultLoader(yaml)
    h5dict = getattr(saving, "H5Dict", None) or getattr(saving, "h5dict", None)  # 2.2.4
    if not isinstance(h5dict, type) or getattr(h5dict.__getitem__, "_ferrokeras_lists", False):
        return
    getitem = h5dict.__getitem__

    def __getitem__(self, attr):
        value = getitem(self, attr)
        if (
            isinstance(value, np.ndarray)
            and value.ndim == 1
            and _is_attribute(self, attr)
            and (value.size == 0 or all(isinstance(v, (str, bytes)) for v in value))
        ):
            return value.tolist()
        return value

    __getitem__._ferrokeras_lists = True
    h5dict.__getitem__ = __getitem__
