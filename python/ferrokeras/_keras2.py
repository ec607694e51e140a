"""Keras 2 integration: what lets the unmodified Keras 2.3.1 package run on ferrokeras.

Keras 2.3.1 loads ``KERAS_BACKEND=ferrokeras.backend`` as an "external backend": it imports
the module, checks that it has ``placeholder``, ``variable`` and ``function``, and copies
its namespace into ``keras.backend``. ``attach`` (called by ``ferrokeras.backend``) then
joins the two, and only then, once Keras has chosen ferrokeras, are these applied:

- the aliases Keras 2.3.1 needs on Python 3.10+ and NumPy 2 (``_install_shims``);
- h5py 3 string attributes readable as Keras expects (``_patch_h5py``);
- ``Lambda`` output shapes inferred as under TensorFlow (``_patch_lambda``);
- ``keras.callbacks.TensorBoard`` is ferrokeras's when TensorFlow is absent;
- what Keras 2.2.4/2.2.5 also need (``_keras22``), and ``load_model``/``model_from_json``
  reading models saved by tf.keras 2.x (``_keras_tf_h5``);
- one configuration (floatx, epsilon, image data format) for Keras and ferrokeras, and
  every documented ``K`` name visible in ``keras.backend`` (``_join_keras``).

Importing ``ferrokeras.backend`` without Keras changes no other module.
"""

import builtins as _b
import collections
import collections.abc
import importlib.util
import sys

import numpy as np

from . import _keras22, _keras_tf_h5, config
from ._k.variables import int_shape, placeholder


def _install_shims():
    """Makes the unmodified Keras 2.3.1 package importable and runnable on new Pythons.

    - Python 3.10 removed the ABC aliases from ``collections``; Keras 2.3.1 does
      ``from collections import Iterable`` (callbacks) and ``isinstance(x, collections.Mapping)``
      (training utilities). They are put back as aliases of ``collections.abc``.
    - NumPy 2 removed ``np.Inf`` (used by EarlyStopping, ModelCheckpoint,
      ReduceLROnPlateau), ``np.string_`` (HDF5 loading) and ``np.unicode_``
      (``pad_sequences``); they are put back as aliases of ``np.inf``, ``np.bytes_`` and
      ``np.str_``.

    Only names that are missing are added, and only as aliases of the objects that replaced
    them, so code that does not use them sees no difference.
    """
    for name in (
        "Iterable",
        "Mapping",
        "MutableMapping",
        "Sequence",
        "MutableSequence",
        "Container",
        "Callable",
        "Set",
        "MutableSet",
        "Hashable",
        "Sized",
        "Iterator",
        "Generator",
    ):
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))
    for name, value in (
        ("Inf", np.inf),
        ("NaN", np.nan),
        ("string_", np.bytes_),
        ("unicode_", np.str_),
    ):
        try:
            getattr(np, name)
        except AttributeError:
            setattr(np, name, value)


class _DecodableStr(str):
    """A ``str`` that also answers ``.decode()`` (with itself), for code written against
    h5py 2, where string attributes read back as ``bytes``."""

    __slots__ = ()

    def decode(self, encoding="utf-8", errors="strict"):
        return str(self)


def _patch_h5py():
    """h5py 3 reads string attributes back as ``str``, where h5py 2 gave ``bytes``; Keras
    2.3.1 calls ``.decode('utf8')`` on them when it loads a model or weights (and h5py 2
    has no wheels for Python 3.10+). Scalar string attributes are therefore returned as a
    ``str`` subclass with a ``decode`` method, and arrays of strings as object arrays of
    it; everything else is unchanged."""
    try:
        import h5py
    except ImportError:
        return
    manager = getattr(h5py, "AttributeManager", None)
    if manager is None or getattr(manager.__getitem__, "_ferrokeras_decodable", False):
        return
    getitem = manager.__getitem__

    def __getitem__(self, name):
        value = getitem(self, name)
        if type(value) is str:
            return _DecodableStr(value)
        if (
            isinstance(value, np.ndarray)
            and value.dtype == object
            and value.size
            and type(value.flat[0]) is str
        ):
            out = np.empty(value.shape, dtype=object)
            out.flat[:] = [_DecodableStr(v) if type(v) is str else v for v in value.flat]
            return out
        return value

    __getitem__._ferrokeras_decodable = True
    manager.__getitem__ = __getitem__


def _patch_lambda(core):
    """Keras 2.3.1's ``Lambda`` without ``output_shape`` infers its output shape only on
    the TensorFlow and CNTK backends (by calling the function on placeholders); on any
    other backend it assumes the input shape, so ``Lambda(lambda x: K.concatenate([x, x]))``
    followed by a ``Dense`` layer fails to build. ferrokeras's graph knows shapes as
    TensorFlow's does, so the TensorFlow branch is taken: the function is applied to
    placeholders of the input shapes and their static shapes are returned. Should that
    fail (a function meant for integer inputs, say), Keras's own rule applies."""
    lam = getattr(core, "Lambda", None)
    if lam is None or getattr(lam.compute_output_shape, "_ferrokeras_infers", False):
        return
    original, call = lam.compute_output_shape, lam.call

    def record_dtypes(self, inputs, mask=None):
        # The placeholders below take the dtypes of the last real inputs (int indices
        # for a one_hot, say); Keras calls `call` before `compute_output_shape`.
        xs = inputs if isinstance(inputs, list) else [inputs]
        self._ferrokeras_dtypes = [getattr(x, "dtype", None) for x in xs]
        return call(self, inputs, mask)

    def compute_output_shape(self, input_shape):
        if self._output_shape is None:
            shapes = input_shape if isinstance(input_shape, list) else [input_shape]
            dtypes = getattr(self, "_ferrokeras_dtypes", None)
            if dtypes is None or len(dtypes) != len(shapes):
                dtypes = [None] * len(shapes)
            try:
                xs = [placeholder(shape=s, dtype=d) for s, d in zip(shapes, dtypes)]
                x = self.call(xs if isinstance(input_shape, list) else xs[0])
            except Exception:
                return original(self, input_shape)
            if isinstance(x, list):
                return [int_shape(e) for e in x]
            return int_shape(x)
        return original(self, input_shape)

    compute_output_shape._ferrokeras_infers = True
    lam.compute_output_shape = compute_output_shape
    lam.call = record_dtypes


def _patch_callbacks(callbacks):
    """Keras 2.3.1's ``keras.callbacks.TensorBoard`` imports TensorFlow and raises without
    it. When TensorFlow is not installed, ``callbacks.TensorBoard`` becomes
    ``ferrokeras.callbacks.TensorBoard``, which writes event files with the ``tensorboard``
    package alone; with TensorFlow installed Keras's own is kept."""
    try:
        has_tf = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        has_tf = False
    if has_tf:
        return
    # Imported here, once Keras runs on ferrokeras: it is the one module that needs the
    # tensorboard package.
    from .callbacks import TensorBoard

    callbacks.TensorBoard = TensorBoard


class _AfterImport:
    """Calls ``fn(module)`` right after the module ``fullname`` is first executed."""

    def __init__(self, fullname, fn):
        self.fullname, self.fn = fullname, fn

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then(module):
            exec_module(module)
            self.fn(module)

        spec.loader.exec_module = exec_then
        return spec


def _after_import(fullname, fn):
    """Runs ``fn`` on module ``fullname`` now if it is imported, else once it is."""
    module = sys.modules.get(fullname)
    if module is not None:
        fn(module)
    elif not _b.any(isinstance(f, _AfterImport) and f.fullname == fullname for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(fullname, fn))


# Keras keeps its own copy of these settings in `keras.backend.common` and hands that to
# every layer; ferrokeras's `K` functions read theirs. Under Keras, both must be one state.
_CONFIG_NAMES = (
    "floatx",
    "set_floatx",
    "epsilon",
    "set_epsilon",
    "image_data_format",
    "set_image_data_format",
    "normalize_data_format",
    "cast_to_floatx",
)


def _join_keras(kb, lb, backend):
    """Makes Keras 2.3.1, once it has chosen ``ferrokeras.backend``, share our configuration
    and see all of our ``K`` names.

    ``kb`` is the ``keras.backend`` package (possibly still initialising), ``lb`` its
    ``load_backend`` module, ``backend`` the ``ferrokeras.backend`` module. Keras's settings (read from ``keras.json`` before the backend
    is loaded) are copied into ferrokeras's, and Keras's config functions are pointed at
    ferrokeras's, so ``keras.backend.set_floatx('float64')`` changes both. For an external
    backend, ``keras.backend`` re-exports only a fixed list of names; the documented ones it
    leaves out (``clear_session``, ``manual_variable_initialization``, ...) are added. h5py 3
    is adapted for Keras's model loading (``_patch_h5py``), and ``Lambda`` infers output
    shapes as under TensorFlow (``_patch_lambda``).
    """
    if getattr(lb, "_BACKEND", None) != "ferrokeras.backend":
        return
    _install_shims()
    _patch_h5py()
    _after_import("keras.layers.core", _patch_lambda)
    _after_import("keras.callbacks", _patch_callbacks)
    _keras22.install_shims()
    _after_import("keras.engine.saving", _keras_tf_h5.install)
    common = sys.modules.get("keras.backend.common")
    if common is not None:
        config.set_floatx(common.floatx())
        config.set_epsilon(common.epsilon())
        config.set_image_data_format(common.image_data_format())
    for name in _CONFIG_NAMES:
        fn = getattr(backend, name, None) or getattr(config, name)
        setattr(lb, name, fn)
        setattr(kb, name, fn)
    for name in backend.__all__:
        if not hasattr(kb, name):
            setattr(kb, name, getattr(backend, name))


def _join_loaded(kb):
    """``_join_keras`` for a program that imported ferrokeras before Keras: run once
    ``keras.backend`` has been executed (and has loaded its backend)."""
    # Keras 2.2.4 has no `load_backend` module: `keras.backend` loads the backend itself.
    lb = sys.modules.get("keras.backend.load_backend") or kb
    backend = sys.modules.get("ferrokeras.backend")
    if backend is not None:
        _join_keras(kb, lb, backend)


def attach(backend):
    """Joins Keras when it loads ``backend`` (the ``ferrokeras.backend`` module) as its
    backend: at once if Keras is importing it now, else when ``keras.backend`` is first
    imported. Called once, at the end of ``ferrokeras.backend``.

    Nothing outside ferrokeras changes unless Keras chooses ferrokeras: until then the
    only trace is an import hook in ``sys.meta_path`` that waits for ``keras.backend``.
    """
    kb = sys.modules.get("keras.backend")
    lb = sys.modules.get("keras.backend.load_backend")
    if kb is not None and lb is not None:
        # Keras is importing us right now (KERAS_BACKEND or keras.json): join it now.
        _join_keras(kb, lb, backend)
    elif kb is not None and getattr(kb, "_BACKEND", None) is not None:
        # Keras 2.2.4 loads its backend in `keras/backend/__init__.py` itself.
        _join_keras(kb, kb, backend)
    elif kb is None:
        _after_import("keras.backend", _join_loaded)
