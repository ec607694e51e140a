"""Loading ``.h5`` models saved by tf.keras 2.x with Keras 2.2/2.3 on ferrokeras.

tf.keras 2.x writes the same HDF5 layout as Keras 2.3.1 (``model_config``,
``training_config``, ``model_weights``, ``optimizer_weights``), and its weights load
unchanged, but its configs use names and arguments that Keras 2.3.1's parser does not
know: ``Functional`` for ``Model``, ``InputLayer(ragged=..., optional=...)``,
``Conv2D(groups=...)``, ``GlobalAveragePooling2D(keepdims=...)``, ``LSTM(time_major=...)``,
initializers such as ``GlorotUniform``, regularizers ``L2``, ``"module"`` and
``"registered_name"`` keys, the ``Custom>Adam`` optimizers of TensorFlow 2.11+ and their
slot variables, metrics as ``MeanMetricWrapper`` objects.

``install(saving)`` wraps ``keras.engine.saving._deserialize_model`` (which
``keras.models.load_model`` calls) so that these configs are translated into Keras 2
configs before Keras reads them. The translation only rewrites what Keras 2 cannot read;
a config that Keras 2 wrote itself passes unchanged. tf.keras arguments at the value that
means "as in Keras 2" (``groups=1``, ``ragged=False``, ...) are dropped; at any other value,
and for a tf.keras-only layer, optimizer, loss or metric, loading raises
``TfKerasConfigError`` naming it. The optimizer state (``optimizer_weights``) is mapped
onto the Keras 2 optimizer's slots by slot name where the optimizers correspond.
"""

import copy
import inspect
import json
import re
import warnings

import numpy as np

from . import _keras22

__all__ = ["TfKerasConfigError", "translate_model_config", "translate_training_config"]


class TfKerasConfigError(ValueError):
    """A model saved by tf.keras uses a layer, argument, optimizer, loss or metric that
    Keras 2 does not have."""


# Keys tf.keras adds next to "class_name"/"config" in every serialized object.
_META_KEYS = ("module", "registered_name", "build_config", "compile_config", "shared_object_id")

# Layer arguments tf.keras has and Keras 2 lacks, with the values that mean "as in Keras 2":
# a config holding one of these values loses the argument, any other value is an error.
_TF_ONLY_ARGS = {
    "ragged": (False,),
    "optional": (False,),
    "groups": (1,),
    "keepdims": (False,),
    "time_major": (False,),
    "synchronized": (False,),
    # Fixes the random draws of GaussianNoise, GaussianDropout, AlphaDropout, ... in
    # training; Keras 2 draws them unseeded. Dropped whatever its value.
    "seed": None,
    # LocallyConnected1D/2D's weight layouts 2 and 3 are tf.keras's; 1 is Keras 2's.
    "implementation": (1,),
    # Arguments Keras 2 has on other layers only.
    "sparse": (False,),  # Embedding
    "dilation_rate": ((1, 1, 1), 1),  # Conv3DTranspose
}

_INITIALIZERS = {
    "GlorotUniform": "glorot_uniform",
    "GlorotNormal": "glorot_normal",
    "HeUniform": "he_uniform",
    "HeNormal": "he_normal",
    "LecunUniform": "lecun_uniform",
    "LecunNormal": "lecun_normal",
}


def _layer_error(layer, cls, what):
    name = layer.get("config", {}).get("name") or layer.get("name")
    return TfKerasConfigError(
        f"layer {name!r} ({cls}) of this tf.keras model {what}; Keras 2 has no equivalent, so "
        "ferrokeras cannot load it (rebuild the model without it in tf.keras, or pass a "
        "replacement class in custom_objects)"
    )


def _strip_meta(obj):
    """Removes tf.keras's ``module``/``registered_name`` keys from every serialized object."""
    if isinstance(obj, dict):
        out = {k: _strip_meta(v) for k, v in obj.items()}
        if "class_name" in out:
            for key in _META_KEYS:
                out.pop(key, None)
        return out
    if isinstance(obj, list):
        return [_strip_meta(v) for v in obj]
    return obj


def _dtype(value, layer):
    """tf.keras's dtype policies ({"class_name": "Policy", ...}) become dtype names."""
    if isinstance(value, dict):
        name = value.get("config", {}).get("name")
        if name not in ("float16", "float32", "float64", "int32", "int64", "bool", None):
            raise _layer_error(layer, layer.get("class_name"), f"uses the dtype policy {name!r}")
        return name
    return value


def _initializer(value):
    if not isinstance(value, dict) or "class_name" not in value:
        return value
    cls, cfg = value["class_name"], dict(value.get("config") or {})
    if cls in _INITIALIZERS:
        return {"class_name": _INITIALIZERS[cls], "config": {"seed": cfg.get("seed")}}
    if cls == "VarianceScaling" and cfg.get("distribution") in (
        "truncated_normal",
        "untruncated_normal",
    ):
        # Keras 2's "normal" is a truncated normal of the same variance.
        cfg["distribution"] = "normal"
    return {"class_name": cls, "config": cfg}


def _regularizer(value):
    if not isinstance(value, dict) or "class_name" not in value:
        return value
    cls, cfg = value["class_name"], value.get("config") or {}
    if cls in ("L1", "L2", "L1L2"):
        return {
            "class_name": "L1L2",
            "config": {"l1": float(cfg.get("l1", 0.0)), "l2": float(cfg.get("l2", 0.0))},
        }
    return value


def _same(a, b):
    norm = lambda v: list(v) if isinstance(v, (list, tuple)) else v
    return norm(a) == norm(b)


def _known_layer_classes(custom_objects):
    from keras import layers
    from keras.utils.generic_utils import get_custom_objects

    known = {n: getattr(layers, n) for n in dir(layers) if inspect.isclass(getattr(layers, n))}
    known.update(get_custom_objects())
    known.update(custom_objects or {})
    return known


# Keys _translate_layer handles after the argument check.
_CHECKED_BELOW = {
    ("Bidirectional", "backward_layer"),
    ("Lambda", "module"),
    ("Lambda", "output_shape_module"),
}

# Config keys that a layer's own ``from_config`` takes out before calling ``__init__``.
_FROM_CONFIG_KEYS = {
    "Lambda": {"function_type", "output_shape_type"},
}


def _accepted_args(cls):
    """Every argument name that ``cls(**config)`` accepts (the ``__init__`` arguments along
    the class hierarchy, as Keras layers pass ``**kwargs`` up to ``Layer``)."""
    names = {"input_shape", "batch_input_shape", "batch_size", "dtype", "name", "trainable"}
    names |= {"weights", "input_dtype"} | _FROM_CONFIG_KEYS.get(cls.__name__, set())
    for klass in inspect.getmro(cls):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        names |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return names


def _translate_layer(layer, known):
    layer = _strip_meta(layer)
    cls = layer.get("class_name")
    if cls in ("Functional", "Model", "Sequential"):
        return _translate_model(layer, known)
    if cls not in known:
        raise TfKerasConfigError(
            f"layer {layer.get('config', {}).get('name')!r} is a tf.keras {cls}, a layer "
            "Keras 2 does not have, so ferrokeras cannot load it (pass an implementation in "
            "custom_objects, or rebuild the model without it in tf.keras)"
        )
    cfg = dict(layer.get("config") or {})
    klass = known[cls]
    builtin = inspect.isclass(klass) and klass.__module__.startswith("keras.")
    unknown = []
    if builtin:
        # Custom classes may take any keyword; only Keras's own layers are checked.
        accepted = _accepted_args(klass)
        for key in list(cfg):
            if key in accepted or (cls, key) in _CHECKED_BELOW:
                continue
            if key not in _TF_ONLY_ARGS:
                unknown.append(key)
            elif _TF_ONLY_ARGS[key] is not None and not any(
                _same(cfg[key], ok) for ok in _TF_ONLY_ARGS[key]
            ):
                raise _layer_error(
                    layer, cls, f"sets the tf.keras-only argument {key}={cfg[key]!r}"
                )
            else:
                del cfg[key]
    if "dtype" in cfg:
        cfg["dtype"] = _dtype(cfg["dtype"], layer)
    for key in list(cfg):
        if key.endswith("_initializer"):
            cfg[key] = _initializer(cfg[key])
        elif key.endswith("_regularizer"):
            cfg[key] = _regularizer(cfg[key])
    if cls == "Lambda":
        # tf.keras looks the function's globals up in the module it was defined in; Keras 2
        # in its own and in custom_objects.
        cfg.pop("module", None)
        cfg.pop("output_shape_module", None)
    if cls == "BatchNormalization" and isinstance(cfg.get("axis"), list):
        if len(cfg["axis"]) != 1:
            raise _layer_error(layer, cls, f"normalizes over several axes {cfg['axis']}")
        cfg["axis"] = cfg["axis"][0]
    if cls in ("Bidirectional", "TimeDistributed") and isinstance(cfg.get("layer"), dict):
        inner = cfg["layer"]
        cfg["layer"] = _translate_layer(inner, known)
        backward = cfg.pop("backward_layer", None)
        if backward is not None:
            b = _strip_meta(backward)
            f_cfg = dict(inner.get("config", {}))
            b_cfg = dict(b.get("config", {}))
            for c in (f_cfg, b_cfg):
                c.pop("name", None)
                c.pop("go_backwards", None)
            if b.get("class_name") != inner.get("class_name") or b_cfg != f_cfg:
                raise _layer_error(layer, cls, "has a backward_layer that differs from its layer")
    if unknown:
        raise _layer_error(layer, cls, "sets the tf.keras-only argument(s) " + ", ".join(unknown))
    out = dict(layer)
    out["config"] = cfg
    return out


def _io_list(value):
    # tf.keras writes a single input or output as one [name, node, tensor] triple.
    if isinstance(value, list) and len(value) == 3 and isinstance(value[0], str):
        return [value]
    return value


def _translate_model(model, known):
    model = _strip_meta(model)
    cls = model.get("class_name")
    cfg = copy.copy(model.get("config"))
    if cls == "Sequential":
        layers = cfg["layers"] if isinstance(cfg, dict) else cfg
        layers = [_translate_layer(lay, known) for lay in layers]
        if layers and layers[0]["class_name"] == "InputLayer" and len(layers) > 1:
            # Keras 2's Sequential takes its input shape from the first layer's config.
            inp = layers[0]["config"]
            first = dict(layers[1]["config"])
            first.setdefault("batch_input_shape", inp.get("batch_input_shape"))
            if inp.get("dtype") is not None:
                first.setdefault("dtype", inp["dtype"])
            layers = [dict(layers[1], config=first)] + layers[2:]
        if isinstance(cfg, dict):
            cfg = dict(cfg, layers=layers)
            cfg.pop("trainable", None)
        else:
            cfg = layers
        return {"class_name": "Sequential", "config": cfg}
    cfg = dict(cfg)
    cfg.pop("trainable", None)
    layers = []
    for lay in cfg["layers"]:
        nodes = lay.get("inbound_nodes", [])
        if any(isinstance(n, dict) for n in nodes):
            raise TfKerasConfigError(
                "this model was saved by Keras 3 (its inbound nodes are dicts); ferrokeras "
                "loads Keras 2 and tf.keras 2.x models"
            )
        new = _translate_layer(lay, known)
        for key in ("name", "inbound_nodes"):
            if key in lay:
                new[key] = lay[key]
        layers.append(new)
    cfg["layers"] = layers
    cfg["input_layers"] = _io_list(cfg["input_layers"])
    cfg["output_layers"] = _io_list(cfg["output_layers"])
    return {"class_name": "Model", "config": cfg}


def translate_model_config(config, custom_objects=None):
    """Returns the Keras 2 form of a tf.keras 2.x model config (the parsed JSON of an
    ``.h5`` file's ``model_config``: ``{"class_name": ..., "config": ...}``). A Keras 2
    config is returned unchanged.

    Raises:
        TfKerasConfigError: for a layer or layer argument Keras 2 does not have.
    """
    return _translate_model(config, _known_layer_classes(custom_objects))


# ======================================================================= training config

_TF_ONLY_OPTIMIZER_ARGS = {
    # argument: values that mean "as in Keras 2"
    "weight_decay": (None, 0, 0.0),
    "global_clipnorm": (None,),
    "use_ema": (False,),
    "centered": (False,),
    "initial_accumulator_value": None,  # only the start value of slots loaded from the file
    "ema_momentum": None,
    "ema_overwrite_frequency": None,
    "jit_compile": None,
    "is_legacy_optimizer": None,
    "name": None,
    "clipnorm": (None,),  # dropped when None, kept otherwise (Keras 2 has it)
    "clipvalue": (None,),
}
_KEPT_WHEN_SET = ("clipnorm", "clipvalue")


def _optimizer(config):
    from keras import optimizers

    cls = config["class_name"]
    cls = cls.split(">", 1)[1] if cls.startswith("Custom>") else cls
    target = getattr(optimizers, cls, None)
    if not (inspect.isclass(target) and issubclass(target, optimizers.Optimizer)) or cls in (
        "Optimizer",
        "TFOptimizer",
    ):
        raise TfKerasConfigError(
            f"the model was compiled with the tf.keras optimizer {cls}, which Keras 2 does not "
            "have; load it with compile=False and compile it again"
        )
    cfg = dict(config.get("config") or {})
    if cls == "Nadam" and cfg.get("is_legacy_optimizer") is False:
        warnings.warn(
            "The model was compiled with the Nadam of TensorFlow 2.11+, which warms its "
            "momentum up as 0.96**t; Keras 2's Nadam (and tf.keras's legacy one) as "
            "0.96**(0.004 t). The model is compiled with Keras 2's Nadam and the saved state: "
            "further training follows Keras 2's schedule.",
            stacklevel=2,
        )
    for key, ok in _TF_ONLY_OPTIMIZER_ARGS.items():
        if key not in cfg:
            continue
        if key in _KEPT_WHEN_SET and cfg[key] is not None:
            continue
        if ok is not None and cfg[key] not in ok:
            raise TfKerasConfigError(
                f"the model's optimizer {cls} sets {key}={cfg[key]!r}, which Keras 2's {cls} "
                "does not have; load it with compile=False and compile it again"
            )
        del cfg[key]
    if cls == "RMSprop" and cfg.get("momentum", 0.0) not in (0, 0.0):
        raise TfKerasConfigError(
            f"the model's optimizer RMSprop sets momentum={cfg['momentum']!r}, which Keras 2's "
            "RMSprop does not have; load it with compile=False and compile it again"
        )
    cfg.pop("momentum", None) if cls == "RMSprop" else None
    if cls == "Nadam" and "decay" in cfg:
        # tf.keras's legacy Nadam keeps Keras 2's schedule_decay (0.004) as "decay".
        cfg["schedule_decay"] = cfg.pop("decay")
    lr = cfg.pop("learning_rate", cfg.pop("lr", None))
    if isinstance(lr, dict):
        raise TfKerasConfigError(
            f"the model's optimizer uses the learning-rate schedule {lr.get('class_name')}, "
            "which Keras 2 does not have; load it with compile=False and compile it again"
        )
    if lr is not None:
        params = inspect.signature(target.__init__).parameters
        cfg["learning_rate" if "learning_rate" in params else "lr"] = lr
    return {"class_name": cls, "config": cfg}


_LOSS_DEFAULTS = {
    "from_logits": False,
    "label_smoothing": 0,
    "axis": -1,
    "reduction": ("auto", "sum_over_batch_size"),
    "name": None,
    "ignore_class": None,
    "delta": 1.0,
}


# tf.keras loss classes whose Keras 2 function is not their name in snake case.
_LOSS_FUNCTIONS = {
    "KLDivergence": "kullback_leibler_divergence",
    "LogCosh": "logcosh",
    "Huber": "huber_loss",
    "CosineSimilarity": "cosine_proximity",  # both -sum(l2_normalize(t) * l2_normalize(p))
}


def _snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _loss(value):
    from keras import losses

    if isinstance(value, list):
        return [_loss(v) for v in value]
    if isinstance(value, dict) and "class_name" not in value:
        return {k: _loss(v) for k, v in value.items()}
    if not isinstance(value, dict):
        return value
    cls, cfg = value["class_name"], value.get("config") or {}
    fn = _LOSS_FUNCTIONS.get(cls) or _snake(cls)
    for key, default in _LOSS_DEFAULTS.items():
        if key == "name" or key not in cfg:
            continue
        defaults = default if isinstance(default, tuple) else (default,)
        if cfg[key] not in defaults:
            raise TfKerasConfigError(
                f"the model's loss {cls} sets {key}={cfg[key]!r}, which ferrokeras cannot "
                "carry over; load it with compile=False and compile it again"
            )
    unknown = sorted(set(cfg) - set(_LOSS_DEFAULTS))
    if unknown or not callable(getattr(losses, fn, None)):
        raise TfKerasConfigError(
            f"the model's loss {cls} ({', '.join(unknown) or 'no Keras 2 equivalent'}) cannot "
            "be carried over; load it with compile=False and compile it again"
        )
    return fn


_METRIC_NAMES = ("accuracy", "acc", "crossentropy", "ce")


def _metric(value):
    from keras import metrics

    if not isinstance(value, dict):
        return value
    cls, cfg = value.get("class_name"), value.get("config") or {}
    if cls == "MeanMetricWrapper":
        name, fn = cfg.get("name"), cfg.get("fn")
        if name in _METRIC_NAMES:
            return name
        if isinstance(fn, str) and callable(getattr(metrics, fn, None)):
            return fn
        raise TfKerasConfigError(
            f"the model's metric {name!r} ({fn}) has no Keras 2 equivalent; load it with "
            "compile=False and compile it again"
        )
    fn = _snake(cls or "")
    if callable(getattr(metrics, fn, None)) and set(cfg) <= {"name", "dtype"}:
        return fn
    raise TfKerasConfigError(
        f"the model's metric {cls} has no Keras 2 equivalent; load it with compile=False "
        "and compile it again"
    )


def _metrics(value, output_names):
    if value is None:
        return None
    if isinstance(value, dict):
        return {
            k: [_metric(m) for m in (v if isinstance(v, list) else [v])] for k, v in value.items()
        }
    if isinstance(value, list) and any(isinstance(m, list) for m in value):
        # tf.keras writes one list per output.
        per_output = [[_metric(m) for m in (v if isinstance(v, list) else [v])] for v in value]
        if len(per_output) == 1:
            return per_output[0]
        if output_names is not None and len(output_names) == len(per_output):
            return dict(zip(output_names, per_output))
        return per_output
    return [_metric(m) for m in value]


def translate_training_config(config, output_names=None):
    """Returns the Keras 2 form of a tf.keras 2.x ``training_config`` (parsed JSON).

    ``output_names`` (the model's output layer names) lets per-output metric lists become
    a dict. Raises ``TfKerasConfigError`` for an optimizer, learning-rate schedule, loss or
    metric Keras 2 does not have.
    """
    config = _strip_meta(dict(config))
    config["optimizer_config"] = _optimizer(config["optimizer_config"])
    config["loss"] = _loss(config.get("loss"))
    config["metrics"] = _metrics(config.get("metrics"), output_names)
    config["weighted_metrics"] = _metrics(config.get("weighted_metrics"), output_names)
    config.setdefault("sample_weight_mode", None)
    config.setdefault("loss_weights", None)
    return config


# ======================================================================= optimizer state

# For each Keras 2 optimizer, its per-parameter slot groups in the order of its `weights`,
# each with the names tf.keras gives that slot (new optimizers / legacy optimizers).
_SLOTS = {
    "SGD": [("momentum", "m")],
    "Adam": [("m",), ("v",), ("vhat", "v_hat", "velocity_hat")],
    "RMSprop": [("rms", "velocity")],
    "Adagrad": [("accumulator",)],
    "Adadelta": [("accum_grad", "accumulated_grad"), ("accum_var", "accumulated_delta_var")],
    "Adamax": [("m",), ("v", "u")],
    "Nadam": [("m",), ("v",)],
}
_STEP_NAMES = ("iter", "iteration", "iterations")
_NEW_SLOT_NAMES = {s for groups in _SLOTS.values() for g in groups for s in g}


def _slot_of(name):
    """(slot, variable path) of a tf.keras optimizer weight name, or ("step", None)."""
    parts = name.split(":")[0].split("/")
    if parts[-1] in _STEP_NAMES:
        return "step", None
    if parts[-1] in ("momentum_cache", "u_product"):
        return "schedule", None
    if len(parts) >= 3 and parts[1] in _NEW_SLOT_NAMES:  # Adam/m/dense/kernel
        return parts[1], "/".join(parts[2:])
    return parts[-1], "/".join(parts[1:-1])  # Adam/dense/kernel/m


def _load_optimizer_state(model, names, values):
    """Sets the compiled model's optimizer slots from tf.keras's ``optimizer_weights``.
    Returns the reason when the state does not map (the optimizer then starts fresh)."""
    from keras import backend as K

    opt = model.optimizer
    groups = _SLOTS.get(type(opt).__name__)
    if groups is None:
        return f"no slot mapping for the optimizer {type(opt).__name__}"
    model._make_train_function()
    params = getattr(model, "_collected_trainable_weights", model.trainable_weights)
    weights = opt.weights
    n = len(params)
    lead = len(weights) - len(groups) * n
    if lead < 0 or lead > 2:
        return f"{len(weights)} optimizer variables for {n} parameters"
    by_slot = {}
    step = schedule = None
    for name, value in zip(names, values):
        slot, _ = _slot_of(name)
        if slot == "step":
            step = value
        elif slot == "schedule":
            schedule = value
        else:
            by_slot.setdefault(slot, []).append(value)
    pairs = []
    if step is not None:
        # Keras 2.2's RMSprop, Adagrad and Adadelta keep `iterations` out of `weights`.
        it = weights[0] if lead >= 1 else getattr(opt, "iterations", None)
        if it is not None:
            pairs.append((it, np.asarray(step).reshape(K.int_shape(it))))
    if schedule is not None:
        # Keras 2.2's Nadam keeps m_schedule out of `weights`.
        ms = weights[1] if lead == 2 else getattr(opt, "m_schedule", None)
        if ms is not None:
            pairs.append((ms, np.asarray(schedule).reshape(K.int_shape(ms))))
    unknown = set(by_slot) - {s for slot_names in groups for s in slot_names}
    if unknown:
        return f"slots {sorted(unknown)} have no counterpart in Keras 2's {type(opt).__name__}"
    for g, slot_names in enumerate(groups):
        found = [by_slot[s] for s in slot_names if s in by_slot]
        targets = weights[lead + g * n : lead + (g + 1) * n]
        if not found:
            # A slot tf.keras does not create here (SGD without momentum, Adam without
            # AMSGrad): Keras 2's stays at zero, which is what tf.keras's update uses.
            continue
        found = found[0]
        if len(found) != n:
            return f"{len(found)} {slot_names[0]} slots in the file for {n} parameters"
        for var, value in zip(targets, found):
            if K.int_shape(var) != tuple(np.shape(value)):
                return f"slot shape {np.shape(value)} for a variable of shape {K.int_shape(var)}"
            pairs.append((var, np.asarray(value)))
    K.batch_set_value(pairs)
    return None


# ======================================================================= the load_model hook


class _TranslatedFile:
    """What ``_deserialize_model`` reads, with tf.keras configs translated and the
    optimizer state held back (it is set after compiling, by slot name)."""

    def __init__(self, h5dict, custom_objects):
        self._h5 = h5dict
        self._custom_objects = custom_objects
        self.output_names = None

    def _json(self, key):
        raw = self._h5[key] if key == "model_config" else self._h5.get(key)
        if raw is None:
            return None
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))

    def __getitem__(self, key):
        if key == "model_config":
            config = self._json(key)
            if config is None:
                return None
            config = translate_model_config(config, self._custom_objects)
            if config["class_name"] == "Model":
                self.output_names = [o[0] for o in config["config"]["output_layers"]]
            return json.dumps(config).encode("utf-8")
        return self._h5[key]

    def get(self, key, default=None):
        if key == "training_config":
            config = self._json(key)
            if config is None:
                return default
            return json.dumps(translate_training_config(config, self.output_names)).encode()
        return self._h5.get(key, default)

    def __contains__(self, key):
        if key == "optimizer_weights":
            return False
        return key in self._h5

    def optimizer_state(self):
        if "optimizer_weights" not in self._h5:
            return None
        group = self._h5["optimizer_weights"]
        names = [
            n.decode("utf8") if isinstance(n, bytes) else str(n) for n in group["weight_names"]
        ]
        return names, [np.asarray(group[n]) for n in names]


def _is_tf_keras_version(version):
    """Whether a ``keras_version`` is tf.keras's: 2.4 or newer (Keras 2 itself ended at
    2.3.1), or ``*-tf`` (TensorFlow 1.x and 2.0-2.3)."""
    version = version.decode("utf8") if isinstance(version, bytes) else str(version or "")
    m = re.match(r"(\d+)\.(\d+)", version)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (2, 4) or version.endswith("-tf")


def _is_tf_keras(h5dict):
    try:
        return "keras_version" in h5dict and _is_tf_keras_version(h5dict["keras_version"])
    except Exception:
        return False


def install(saving):
    """Wraps ``saving._deserialize_model`` (``keras.engine.saving``) so that
    ``keras.models.load_model`` reads ``.h5`` files written by tf.keras 2.x, and
    ``saving.model_from_json`` so that ``keras.models.model_from_json`` reads tf.keras's
    ``model.to_json()``; also applies
    the Keras 2.2 adaptations of that module (``_keras22.adapt_saving``)."""
    _keras22.adapt_saving(saving)
    original = getattr(saving, "_deserialize_model", None)
    if original is None or getattr(original, "_ferrokeras_tf_keras", False):
        return

    def _deserialize_model(h5dict, custom_objects=None, compile=True):
        custom_objects = dict(extra_objects(), **(custom_objects or {}))
        if not _is_tf_keras(h5dict):
            return original(h5dict, custom_objects, compile)
        view = _TranslatedFile(h5dict, custom_objects)
        model = original(view, custom_objects, compile)
        state = view.optimizer_state() if compile and model.optimizer is not None else None
        if state is not None:
            reason = _load_optimizer_state(model, *state)
            if reason is not None:
                warnings.warn(
                    f"The optimizer state saved by tf.keras was not loaded ({reason}); the "
                    "optimizer starts fresh.",
                    stacklevel=3,
                )
        return model

    _deserialize_model._ferrokeras_tf_keras = True
    _deserialize_model.__doc__ = original.__doc__
    saving._deserialize_model = _deserialize_model

    from_json = getattr(saving, "model_from_json", None)
    if from_json is not None:

        def model_from_json(json_string, custom_objects=None):
            custom_objects = dict(extra_objects(), **(custom_objects or {}))
            config = json.loads(json_string)
            if isinstance(config, dict) and _is_tf_keras_version(config.get("keras_version")):
                json_string = json.dumps(translate_model_config(config, custom_objects))
            return from_json(json_string, custom_objects=custom_objects)

        model_from_json.__doc__ = from_json.__doc__
        # keras.models imports it from keras.engine.saving after this runs.
        saving.model_from_json = model_from_json


# ======================================================================= tf.keras-only layers

_EXTRA_OBJECTS = {}


def extra_objects():
    """Keras 2 implementations of tf.keras layers and activations that Keras 2 lacks: the
    layers ``Conv1DTranspose`` and ``DepthwiseConv1D`` (same arguments and weight layouts
    as tf.keras's), the activations ``swish``, ``gelu`` and ``mish``. ``load_model`` and
    ``model_from_json`` find them by name unless ``custom_objects`` supplies its own."""
    if _EXTRA_OBJECTS:
        return dict(_EXTRA_OBJECTS)
    from keras import activations, constraints, initializers, regularizers
    from keras import backend as K
    from keras.engine.base_layer import InputSpec, Layer
    from keras.utils import conv_utils

    def one(value, name):
        value = conv_utils.normalize_tuple(value, 1, name)
        return value[0]

    class _Conv1DBase(Layer):
        def _setup(self, kernel_size, strides, padding, data_format, dilation_rate, activation):
            self.kernel_size = one(kernel_size, "kernel_size")
            self.strides = one(strides, "strides")
            self.padding = conv_utils.normalize_padding(padding)
            self.data_format = K.normalize_data_format(data_format)
            self.dilation_rate = one(dilation_rate, "dilation_rate")
            self.activation = activations.get(activation)
            self.input_spec = InputSpec(ndim=3)
            self._channel_axis = 1 if self.data_format == "channels_first" else -1
            self._steps_axis = 2 if self.data_format == "channels_first" else 1

        def _as_2d(self, x):
            # (batch, steps, channels) -> (batch, 1, steps, channels), or channels first.
            return K.expand_dims(x, 1 if self.data_format == "channels_last" else 2)

        def _from_2d(self, y):
            return K.squeeze(y, 1 if self.data_format == "channels_last" else 2)

        def _finish(self, y):
            if self.use_bias:
                y = K.bias_add(y, self.bias, data_format=self.data_format)
            return self.activation(y) if self.activation is not None else y

        def _base_config(self):
            return {
                "kernel_size": (self.kernel_size,),
                "strides": (self.strides,),
                "padding": self.padding,
                "data_format": self.data_format,
                "dilation_rate": (self.dilation_rate,),
                "activation": activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "bias_initializer": initializers.serialize(self.bias_initializer),
                "bias_regularizer": regularizers.serialize(self.bias_regularizer),
                "activity_regularizer": regularizers.serialize(self.activity_regularizer),
                "bias_constraint": constraints.serialize(self.bias_constraint),
            }

        def _out_shape(self, input_shape, channels, length):
            if self.data_format == "channels_first":
                return (input_shape[0], channels, length)
            return (input_shape[0], length, channels)

    class Conv1DTranspose(_Conv1DBase):
        """Transposed 1-D convolution, as tf.keras's ``Conv1DTranspose`` (kernel of shape
        ``(kernel_size, filters, input_channels)``), computed with ``K.conv2d_transpose``."""

        def __init__(
            self,
            filters,
            kernel_size,
            strides=1,
            padding="valid",
            output_padding=None,
            data_format=None,
            dilation_rate=1,
            groups=1,
            activation=None,
            use_bias=True,
            kernel_initializer="glorot_uniform",
            bias_initializer="zeros",
            kernel_regularizer=None,
            bias_regularizer=None,
            activity_regularizer=None,
            kernel_constraint=None,
            bias_constraint=None,
            **kwargs,
        ):
            if groups != 1:
                raise ValueError(f"Conv1DTranspose: groups={groups!r} is not supported")
            super().__init__(**kwargs)
            self.activity_regularizer = regularizers.get(activity_regularizer)
            self.filters = int(filters)
            self._setup(kernel_size, strides, padding, data_format, dilation_rate, activation)
            if self.padding == "causal":
                raise ValueError("Conv1DTranspose: padding='causal' is not supported")
            self.output_padding = None if output_padding is None else one(output_padding, "op")
            self.use_bias = use_bias
            self.kernel_initializer = initializers.get(kernel_initializer)
            self.bias_initializer = initializers.get(bias_initializer)
            self.kernel_regularizer = regularizers.get(kernel_regularizer)
            self.bias_regularizer = regularizers.get(bias_regularizer)
            self.kernel_constraint = constraints.get(kernel_constraint)
            self.bias_constraint = constraints.get(bias_constraint)

        def build(self, input_shape):
            channels = input_shape[self._channel_axis]
            if channels is None:
                raise ValueError("Conv1DTranspose: the channel dimension must be known")
            self.kernel = self.add_weight(
                shape=(self.kernel_size, self.filters, channels),
                initializer=self.kernel_initializer,
                name="kernel",
                regularizer=self.kernel_regularizer,
                constraint=self.kernel_constraint,
            )
            self.bias = None
            if self.use_bias:
                self.bias = self.add_weight(
                    shape=(self.filters,),
                    initializer=self.bias_initializer,
                    name="bias",
                    regularizer=self.bias_regularizer,
                    constraint=self.bias_constraint,
                )
            self.input_spec = InputSpec(ndim=3, axes={self._channel_axis: channels})
            self.built = True

        def _length(self, steps):
            return conv_utils.deconv_length(
                steps,
                self.strides,
                self.kernel_size,
                self.padding,
                self.output_padding,
                self.dilation_rate,
            )

        def call(self, inputs):
            shape = K.shape(inputs)
            length = self._length(shape[self._steps_axis])
            out = (
                (shape[0], self.filters, 1, length)
                if self.data_format == "channels_first"
                else (shape[0], 1, length, self.filters)
            )
            y = K.conv2d_transpose(
                self._as_2d(inputs),
                K.expand_dims(self.kernel, 0),
                out,
                strides=(1, self.strides),
                padding=self.padding,
                data_format=self.data_format,
                dilation_rate=(1, self.dilation_rate),
            )
            return self._finish(self._from_2d(y))

        def compute_output_shape(self, input_shape):
            steps = input_shape[self._steps_axis]
            length = None if steps is None else self._length(steps)
            return self._out_shape(input_shape, self.filters, length)

        def get_config(self):
            config = dict(super().get_config(), **self._base_config())
            config.update(
                filters=self.filters,
                output_padding=None if self.output_padding is None else (self.output_padding,),
                kernel_initializer=initializers.serialize(self.kernel_initializer),
                kernel_regularizer=regularizers.serialize(self.kernel_regularizer),
                kernel_constraint=constraints.serialize(self.kernel_constraint),
            )
            return config

    class DepthwiseConv1D(_Conv1DBase):
        """Depthwise 1-D convolution, as tf.keras's ``DepthwiseConv1D`` (kernel of shape
        ``(kernel_size, input_channels, depth_multiplier)``), computed with
        ``K.depthwise_conv2d``."""

        def __init__(
            self,
            kernel_size,
            strides=1,
            padding="valid",
            depth_multiplier=1,
            data_format=None,
            dilation_rate=1,
            activation=None,
            use_bias=True,
            depthwise_initializer="glorot_uniform",
            bias_initializer="zeros",
            depthwise_regularizer=None,
            bias_regularizer=None,
            activity_regularizer=None,
            depthwise_constraint=None,
            bias_constraint=None,
            groups=None,
            **kwargs,
        ):
            super().__init__(**kwargs)
            self.activity_regularizer = regularizers.get(activity_regularizer)
            self._setup(kernel_size, strides, padding, data_format, dilation_rate, activation)
            if self.padding == "causal":
                raise ValueError("DepthwiseConv1D: padding='causal' is not supported")
            self.depth_multiplier = int(depth_multiplier)
            self.use_bias = use_bias
            self.depthwise_initializer = initializers.get(depthwise_initializer)
            self.bias_initializer = initializers.get(bias_initializer)
            self.depthwise_regularizer = regularizers.get(depthwise_regularizer)
            self.bias_regularizer = regularizers.get(bias_regularizer)
            self.depthwise_constraint = constraints.get(depthwise_constraint)
            self.bias_constraint = constraints.get(bias_constraint)

        def build(self, input_shape):
            channels = input_shape[self._channel_axis]
            if channels is None:
                raise ValueError("DepthwiseConv1D: the channel dimension must be known")
            self.depthwise_kernel = self.add_weight(
                shape=(self.kernel_size, channels, self.depth_multiplier),
                initializer=self.depthwise_initializer,
                name="depthwise_kernel",
                regularizer=self.depthwise_regularizer,
                constraint=self.depthwise_constraint,
            )
            self.bias = None
            if self.use_bias:
                self.bias = self.add_weight(
                    shape=(channels * self.depth_multiplier,),
                    initializer=self.bias_initializer,
                    name="bias",
                    regularizer=self.bias_regularizer,
                    constraint=self.bias_constraint,
                )
            self.input_spec = InputSpec(ndim=3, axes={self._channel_axis: channels})
            self.built = True

        def call(self, inputs):
            y = K.depthwise_conv2d(
                self._as_2d(inputs),
                K.expand_dims(self.depthwise_kernel, 0),
                strides=(1, self.strides),
                padding=self.padding,
                data_format=self.data_format,
                dilation_rate=(1, self.dilation_rate),
            )
            return self._finish(self._from_2d(y))

        def compute_output_shape(self, input_shape):
            steps = input_shape[self._steps_axis]
            length = conv_utils.conv_output_length(
                steps, self.kernel_size, self.padding, self.strides, self.dilation_rate
            )
            channels = input_shape[self._channel_axis] * self.depth_multiplier
            return self._out_shape(input_shape, channels, length)

        def get_config(self):
            config = dict(super().get_config(), **self._base_config())
            config.update(
                depth_multiplier=self.depth_multiplier,
                depthwise_initializer=initializers.serialize(self.depthwise_initializer),
                depthwise_regularizer=regularizers.serialize(self.depthwise_regularizer),
                depthwise_constraint=constraints.serialize(self.depthwise_constraint),
            )
            return config

    def swish(x):
        """``x * sigmoid(x)``, tf.keras's ``swish`` (``silu``)."""
        return x * K.sigmoid(x)

    def mish(x):
        """``x * tanh(softplus(x))``, tf.keras's ``mish``."""
        return x * K.tanh(K.softplus(x))

    def gelu(x, approximate=False):
        """tf.keras's ``gelu``: ``0.5 x (1 + erf(x / sqrt(2)))``, or with
        ``approximate=True`` ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``. The
        error function is Abramowitz and Stegun's 7.1.26 (absolute error under 1.5e-7)."""
        if approximate:
            return 0.5 * x * (1.0 + K.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
        z = K.abs(x) * 0.7071067811865476
        t = 1.0 / (1.0 + 0.3275911 * z)
        poly = t * (
            0.254829592
            + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
        )
        erf_abs = 1.0 - poly * K.exp(-z * z)
        return 0.5 * x * (1.0 + K.sign(x) * erf_abs)

    _EXTRA_OBJECTS.update(
        Conv1DTranspose=Conv1DTranspose,
        DepthwiseConv1D=DepthwiseConv1D,
        swish=swish,
        mish=mish,
        gelu=gelu,
    )
    return dict(_EXTRA_OBJECTS)
