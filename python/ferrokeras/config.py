"""Global configuration: float type, fuzz factor, image data format, uid counters, and the
one ``FERROKERAS_*`` environment variable the Python layer reads
(``FERROKERAS_COMPILE_PROGRESS``, see ``compile_progress_after``; the Rust core reads the
others, in ``src/base/config.rs``; ``docs/env_vars.md`` lists them all).

Defaults follow Keras; ``~/.keras/keras.json`` is read when present (as Keras does), and
``KERAS_FLOATX`` / ``KERAS_EPSILON`` environment variables are not consulted.
"""

import json
import os
from collections import defaultdict

_FLOATX = "float32"
_EPSILON = 1e-7
_IMAGE_DATA_FORMAT = "channels_last"
_UIDS = defaultdict(int)
_MANUAL_VAR_INIT = False

_FLOAT_TYPES = ("float16", "float32", "float64")
_DATA_FORMATS = ("channels_first", "channels_last")


def _load_keras_json():
    global _FLOATX, _EPSILON, _IMAGE_DATA_FORMAT
    base = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    path = os.path.join(base, "keras.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return
    if cfg.get("floatx") in _FLOAT_TYPES:
        _FLOATX = cfg["floatx"]
    if isinstance(cfg.get("epsilon"), (int, float)):
        _EPSILON = float(cfg["epsilon"])
    if cfg.get("image_data_format") in _DATA_FORMATS:
        _IMAGE_DATA_FORMAT = cfg["image_data_format"]


_load_keras_json()


def floatx():
    """Returns the default float type, as a string.

    Returns:
        String, the current default float type: ``'float16'``, ``'float32'`` or ``'float64'``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.floatx()
        'float32'
    """
    return _FLOATX


def set_floatx(floatx):
    """Sets the default float type.

    Arguments:
        floatx: String, ``'float16'``, ``'float32'``, or ``'float64'``.

    Raises:
        ValueError: for any other value.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.set_floatx('float64'); K.floatx()
        'float64'
        >>> K.set_floatx('float32')
    """
    global _FLOATX
    if floatx not in _FLOAT_TYPES:
        raise ValueError(
            f"set_floatx: unknown floatx type {floatx!r}, expected one of {_FLOAT_TYPES}"
        )
    _FLOATX = str(floatx)


def epsilon():
    """Returns the fuzz factor used in numeric expressions (default ``1e-7``).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.epsilon()
        1e-07
    """
    return _EPSILON


def set_epsilon(e):
    """Sets the fuzz factor used in numeric expressions.

    Arguments:
        e: float, the new epsilon value.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.set_epsilon(1e-5); K.epsilon()
        1e-05
        >>> K.set_epsilon(1e-7)
    """
    global _EPSILON
    try:
        _EPSILON = float(e)
    except (TypeError, ValueError):
        raise ValueError(f"set_epsilon: expected a number, got {e!r}") from None


def image_data_format():
    """Returns the default image data format convention, ``'channels_first'`` or ``'channels_last'``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.image_data_format()
        'channels_last'
    """
    return _IMAGE_DATA_FORMAT


def set_image_data_format(data_format):
    """Sets the value of the data format convention.

    Arguments:
        data_format: ``'channels_first'`` or ``'channels_last'``.

    Raises:
        ValueError: for any other value.
    """
    global _IMAGE_DATA_FORMAT
    if data_format not in _DATA_FORMATS:
        raise ValueError(
            f"set_image_data_format: unknown data_format {data_format!r}, expected one of {_DATA_FORMATS}"
        )
    _IMAGE_DATA_FORMAT = str(data_format)


def normalize_data_format(value):
    """Returns ``value`` checked, or the default data format when ``value`` is None."""
    if value is None:
        return _IMAGE_DATA_FORMAT
    v = str(value).lower()
    if v not in _DATA_FORMATS:
        raise ValueError(f"unknown data_format {value!r}, expected one of {_DATA_FORMATS}")
    return v


def get_uid(prefix=""):
    """Associates a string prefix with an integer counter and returns the next value.

    Arguments:
        prefix: String prefix to index.

    Returns:
        Unique integer ID, starting at 1 for each prefix.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.reset_uids(); K.get_uid('dense'), K.get_uid('dense')
        (1, 2)
    """
    _UIDS[prefix] += 1
    return _UIDS[prefix]


def reset_uids():
    """Resets the graph identifiers (every prefix starts again at 1)."""
    _UIDS.clear()


def manual_variable_initialization(value):
    """Sets the manual variable initialization flag.

    Variables in ferrokeras hold their value from creation, so the flag is only recorded
    (Keras code reads it back); it never leaves a variable uninitialised.

    Arguments:
        value: Python boolean.
    """
    global _MANUAL_VAR_INIT
    _MANUAL_VAR_INIT = bool(value)


def compile_progress_after():
    """Seconds a ``K.function`` compile may take before it is reported on stderr, or None
    for never, from ``FERROKERAS_COMPILE_PROGRESS``: unset or empty, 2; ``0``, never; else
    a finite number of seconds. Read at each compile, so a change takes effect at the next.

    Raises:
        ValueError: naming the variable, for a value that is not a finite number >= 0.
    """
    env = os.environ.get("FERROKERAS_COMPILE_PROGRESS", "").strip()
    if not env:
        return 2.0
    try:
        seconds = float(env)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(
            "FERROKERAS_COMPILE_PROGRESS must be 0 (no compile progress) or a number of "
            f"seconds after which a compile is reported, got {env!r}"
        )
    return None if seconds == 0 else seconds
