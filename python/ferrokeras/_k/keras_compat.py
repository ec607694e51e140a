"""What Keras 2.3.1 needs from a backend beyond the documented ``K`` API.

Keras 2.3.1 loads ``KERAS_BACKEND=ferrokeras.backend`` as an "external backend": it imports
the module, checks that it has ``placeholder``, ``variable`` and ``function``, and copies
every entry of its namespace into ``keras.backend``. Its engine, layers, optimizers and
metrics then also call a few functions that its TensorFlow and Theano backends have but the
backend documentation does not list (``name_scope``, ``control_dependencies``, ``size``,
``slice``, ``separable_conv1d``, ...). They live here.

Importing this module (which ``ferrokeras.backend`` does) also applies the shims that let
the unmodified Keras 2.3.1 package import and run on Python 3.10+ and NumPy 2 (see
``_install_shims``).
"""

import builtins as _b
import collections
import collections.abc
import contextlib
import sys

import numpy as np

from .. import _core
from .. import tensor as _tensor
from ..tensor import Variable, wrap
from . import variables as _variables
from .common import _t

# ======================================================================= import shims


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
            from .. import backend as FK

            shapes = input_shape if isinstance(input_shape, list) else [input_shape]
            dtypes = getattr(self, "_ferrokeras_dtypes", None)
            if dtypes is None or len(dtypes) != len(shapes):
                dtypes = [None] * len(shapes)
            try:
                xs = [FK.placeholder(shape=s, dtype=d) for s, d in zip(shapes, dtypes)]
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


class _AfterImport:
    """Calls ``fn(module)`` right after the module ``fullname`` is first executed."""

    def __init__(self, fullname, fn):
        self.fullname, self.fn = fullname, fn

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        import importlib.util

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


_install_shims()


# ======================================================================= joining keras.backend

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


def _join_keras(kb, lb):
    """Makes Keras 2.3.1, once it has chosen ``ferrokeras.backend``, share our configuration
    and see all of our ``K`` names.

    ``kb`` is the ``keras.backend`` package (possibly still initialising), ``lb`` its
    ``load_backend`` module. Keras's settings (read from ``keras.json`` before the backend
    is loaded) are copied into ferrokeras's, and Keras's config functions are pointed at
    ferrokeras's, so ``keras.backend.set_floatx('float64')`` changes both. For an external
    backend, ``keras.backend`` re-exports only a fixed list of names; the documented ones it
    leaves out (``clear_session``, ``manual_variable_initialization``, ...) are added. h5py 3
    is adapted for Keras's model loading (``_patch_h5py``), and ``Lambda`` infers output
    shapes as under TensorFlow (``_patch_lambda``).
    """
    if getattr(lb, "_BACKEND", None) != "ferrokeras.backend":
        return
    _patch_h5py()
    _after_import("keras.layers.core", _patch_lambda)
    from .. import _keras22, _keras_tf_h5

    _keras22.install_shims()
    _after_import("keras.engine.saving", _keras_tf_h5.install)
    from .. import backend as FK
    from .. import config

    common = sys.modules.get("keras.backend.common")
    if common is not None:
        config.set_floatx(common.floatx())
        config.set_epsilon(common.epsilon())
        config.set_image_data_format(common.image_data_format())
    for name in _CONFIG_NAMES:
        fn = getattr(FK, name, None) or getattr(config, name)
        setattr(lb, name, fn)
        setattr(kb, name, fn)
    names = dict(vars(FK))
    names.update((n, globals()[n]) for n in __all__)  # ours, when FK is still importing us
    for name, value in names.items():
        if not name.startswith("_") and callable(value) and not hasattr(kb, name):
            setattr(kb, name, value)


def _join_loaded(kb):
    """``_join_keras`` for a program that imported ferrokeras before Keras: run once
    ``keras.backend`` has been executed (and has loaded its backend)."""
    # Keras 2.2.4 has no `load_backend` module: `keras.backend` loads the backend itself.
    _join_keras(kb, sys.modules.get("keras.backend.load_backend") or kb)


# ======================================================================= graph context


@contextlib.contextmanager
def name_scope(name):
    """A context manager that prefixes the names of variables created inside it.

    Keras builds each layer inside ``name_scope(layer.name)``, so a layer's weights are
    named ``'dense_1/kernel'``, as under Keras's Theano and TensorFlow backends (weight
    names must be unique within a layer when a model is saved to HDF5).

    Arguments:
        name: String, the scope name.

    Example:
        >>> from ferrokeras import backend as K
        >>> with K.name_scope('block'):
        ...     v = K.variable(1.0, name='w')
        >>> v.name
        'block/w'
    """
    if not isinstance(name, str):
        raise TypeError(f"name_scope: name must be a string, got {type(name).__name__}")
    _tensor._NAME_SCOPE.append(name)
    try:
        yield name
    finally:
        _tensor._NAME_SCOPE.pop()


def _updates_in(ops):
    if ops is None:
        return
    if isinstance(ops, (list, tuple)):
        if len(ops) == 2 and isinstance(ops[0], Variable) and not isinstance(ops[1], (list, tuple)):
            from .variables import update

            yield update(ops[0], ops[1])
            return
        for op in ops:
            yield from _updates_in(op)
        return
    if getattr(ops, "_target", None) is not None:
        yield ops


@contextlib.contextmanager
def control_dependencies(control_inputs):
    """A context manager inside which values read from variables see the updates in
    ``control_inputs`` applied, as with ``tf.control_dependencies``.

    Keras's stateful metrics build their result (``total / count``) inside
    ``control_dependencies(update_ops)``: the value a training step reports then includes
    that step's batch. ferrokeras graphs are pure (a ``function`` computes every output and
    update from the values before the call), so here a variable that an update in
    ``control_inputs`` assigns reads, inside the block, as the value assigned; the update
    itself still has to be passed to ``function`` to take effect. Outside the block the
    variable reads as usual. Other entries (tensors, ``None``) impose no ordering on a pure
    graph and are ignored.

    Arguments:
        control_inputs: List of update ops (``K.update(...)``, ``K.update_add(...)``,
            ``(variable, new_value)`` pairs) or tensors; ``None`` is allowed.

    Example:
        >>> from ferrokeras import backend as K
        >>> total = K.variable(1.0)
        >>> op = K.update_add(total, 2.0)
        >>> with K.control_dependencies([op]):
        ...     result = total * 10
        >>> f = K.function([], [result], updates=[op])
        >>> f([])[0], K.get_value(total)
        (array(30., dtype=float32), array(3., dtype=float32))
    """
    saved = []
    for op in _updates_in(control_inputs):
        var = op._target
        saved.append((var, var._core))
        var._core = op._core
    try:
        yield
    finally:
        for var, core in reversed(saved):
            var._core = core


# ======================================================================= shape helpers


def size(x, name=None):
    """Returns the number of elements of a tensor, as a scalar int32 tensor.

    Arguments:
        x: Tensor or variable.
        name: Optional name for the result.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.size(K.zeros((2, 3))))
        array(6, dtype=int32)
    """
    x = _t(x)
    return wrap(_core.reduce("prod", _core.shape_of(x._core), [0], False), name=name)


def int_shape(x):
    """Returns the shape of a tensor or array as a tuple of ints or ``None`` entries.

    For a tensor on which Keras has recorded a shape (``_keras_shape``, set by every layer
    from its ``compute_output_shape``), each dimension the graph does not know statically
    is taken from that record, as Keras's TensorFlow and Theano backends read it: a
    ``Reshape((3, -1))`` of a ``(None, 2, 3)`` input is ``(None, 3, 2)``, where the graph
    alone knows ``(None, 3, None)``. Dimensions the graph knows win, so a ``Lambda`` layer
    without ``output_shape`` still reports its true shape.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.placeholder(shape=(2, 4, 5)))
        (2, 4, 5)
    """
    static = _variables.int_shape(x)
    keras_shape = getattr(x, "_keras_shape", None)
    if keras_shape is None or static is None or len(keras_shape) != len(static):
        return static
    return tuple(
        s if s is not None else (None if k is None else int(k)) for s, k in zip(static, keras_shape)
    )


def get_variable_shape(x):
    """Returns the shape of a variable, as a tuple of ints (legacy Keras name for
    ``int_shape``).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.get_variable_shape(K.zeros((2, 3)))
        (2, 3)
    """
    return tuple(_t(x).shape)


# ======================================================================= not yet implemented

# Every name Keras 2.3.1's ``keras/backend/__init__.py`` imports from its backend (less the
# ones it takes from ``keras.backend.common``): all must exist or ``import keras`` fails.
_KERAS_IMPORTS = (
    "abs all any arange argmax argmin batch_dot batch_flatten batch_get_value "
    "batch_normalization batch_set_value bias_add binary_crossentropy cast "
    "categorical_crossentropy clear_session clip concatenate constant control_dependencies "
    "conv1d conv2d conv2d_transpose conv3d conv3d_transpose cos count_params ctc_batch_cost "
    "ctc_decode ctc_label_dense_to_sparse cumprod cumsum depthwise_conv2d dot dropout dtype "
    "elu equal eval exp expand_dims eye flatten foldl foldr function gather get_uid "
    "get_value get_variable_shape gradients greater greater_equal hard_sigmoid identity "
    "in_test_phase in_top_k in_train_phase int_shape is_keras_tensor is_placeholder "
    "is_sparse is_tensor is_variable l2_normalize learning_phase less less_equal "
    "local_conv1d local_conv2d log logsumexp map_fn max maximum mean min minimum "
    "moving_average_update name_scope ndim normalize_batch_in_training not_equal "
    "one_hot ones ones_like permute_dimensions placeholder pool2d pool3d pow "
    "print_tensor prod random_binomial random_normal random_normal_variable random_uniform "
    "random_uniform_variable relu repeat repeat_elements reset_uids reshape "
    "resize_images resize_volumes reverse rnn round separable_conv1d separable_conv2d "
    "set_learning_phase set_value shape sigmoid sign sin size slice softmax softplus "
    "softsign sparse_categorical_crossentropy spatial_2d_padding spatial_3d_padding sqrt "
    "square squeeze stack std stop_gradient sum switch tanh temporal_padding tile to_dense "
    "transpose truncated_normal update update_add update_sub var variable zeros zeros_like"
).split()


def _not_implemented(name):
    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"K.{name} is not implemented in ferrokeras yet; Keras layers that need it cannot run"
        )

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = f"Not implemented yet: calling ``K.{name}`` raises ``NotImplementedError``."
    stub._ferrokeras_missing = True
    return stub


def _missing():
    """Lists the ``K`` names Keras 2.3.1 imports that ferrokeras does not implement yet.

    They exist as stubs raising ``NotImplementedError``, so that ``import keras`` works
    while they are being written.
    """
    from .. import backend as FK

    ns = vars(FK)
    return sorted(
        n for n in _KERAS_IMPORTS if n not in ns or getattr(ns[n], "_ferrokeras_missing", False)
    )


def _provided():
    """The names the other ``ferrokeras._k`` families, ``config`` and ``tensor`` export."""
    import importlib
    import pkgutil

    from .. import config, tensor

    have = set(dir(config)) | set(dir(tensor)) | set(globals())
    for info in pkgutil.iter_modules(sys.modules[__package__].__path__):
        if info.name not in ("keras_compat", "common"):
            mod = importlib.import_module(f"{__package__}.{info.name}")
            have |= set(getattr(mod, "__all__", ()))
    return have


def _stubs():
    have = _provided()
    return {n: _not_implemented(n) for n in _KERAS_IMPORTS if n not in have}


globals().update(_stubs())

__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]


def _hook_keras():
    kb = sys.modules.get("keras.backend")
    lb = sys.modules.get("keras.backend.load_backend")
    if kb is not None and lb is not None:
        # Keras is importing us right now (KERAS_BACKEND or keras.json): join it now.
        _join_keras(kb, lb)
    elif kb is not None and getattr(kb, "_BACKEND", None) is not None:
        # Keras 2.2.4 loads its backend in `keras/backend/__init__.py` itself.
        _join_keras(kb, kb)
    elif kb is None:
        _after_import("keras.backend", _join_loaded)


_hook_keras()
