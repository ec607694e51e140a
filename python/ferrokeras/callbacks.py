"""Keras 2.3.1 callbacks that ferrokeras provides itself.

``TensorBoard`` writes TensorBoard event files without TensorFlow: scalars (loss, metrics,
learning rate), weight, activation and gradient histograms, weight images and the model's
layer graph, through the ``tensorboard`` package's own event writer and protocol buffers
(``pip install "ferrokeras[tensorboard]"``). When Keras 2.3.1 runs on ferrokeras and
TensorFlow is not installed, ``keras.callbacks.TensorBoard`` is this class (Keras's own
needs TensorFlow and raises without it).
"""

import io
import os
import sys
import time
import types
import warnings

import numpy as np

from . import backend as K
from ._profile import profile

_TENSORBOARD_MISSING = (
    "ferrokeras.callbacks.TensorBoard needs the 'tensorboard' package (it writes event "
    'files with it; TensorFlow is not needed): pip install "ferrokeras[tensorboard]"'
)


def _tb():
    """The parts of the ``tensorboard`` package the callback uses (imported on first use;
    later calls find them in ``sys.modules``)."""
    try:
        from tensorboard.compat.proto import (
            attr_value_pb2,
            event_pb2,
            graph_pb2,
            summary_pb2,
            tensor_shape_pb2,
            types_pb2,
        )
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as e:
        raise ImportError(_TENSORBOARD_MISSING) from e
    return types.SimpleNamespace(
        attr_value_pb2=attr_value_pb2,
        event_pb2=event_pb2,
        graph_pb2=graph_pb2,
        summary_pb2=summary_pb2,
        tensor_shape_pb2=tensor_shape_pb2,
        types_pb2=types_pb2,
        EventFileWriter=EventFileWriter,
    )


class Callback:
    """The Keras 2.3.1 callback protocol (``keras.callbacks.Callback``'s methods), so that
    ferrokeras's callbacks need no Keras import of their own. Keras's training loops call
    these methods by name."""

    def __init__(self):
        self.validation_data = None
        self.model = None
        self.params = None

    def set_params(self, params):
        self.params = params

    def set_model(self, model):
        self.model = model

    def on_batch_begin(self, batch, logs=None):
        pass

    def on_batch_end(self, batch, logs=None):
        pass

    def on_epoch_begin(self, epoch, logs=None):
        pass

    def on_epoch_end(self, epoch, logs=None):
        pass

    def on_train_batch_begin(self, batch, logs=None):
        self.on_batch_begin(batch, logs=logs)

    def on_train_batch_end(self, batch, logs=None):
        self.on_batch_end(batch, logs=logs)

    def on_test_batch_begin(self, batch, logs=None):
        pass

    def on_test_batch_end(self, batch, logs=None):
        pass

    def on_predict_batch_begin(self, batch, logs=None):
        pass

    def on_predict_batch_end(self, batch, logs=None):
        pass

    def on_train_begin(self, logs=None):
        pass

    def on_train_end(self, logs=None):
        pass

    def on_test_begin(self, logs=None):
        pass

    def on_test_end(self, logs=None):
        pass

    def on_predict_begin(self, logs=None):
        pass

    def on_predict_end(self, logs=None):
        pass


# ======================================================================= histograms


def _default_bucket_limits():
    """TensorFlow's histogram bucket limits: +-1e-12 growing by 10% up to 1e20, 0, and
    +-DBL_MAX at the ends (``tensorflow/core/lib/histogram/histogram.cc``)."""
    pos = []
    v = 1.0e-12
    while v < 1.0e20:
        pos.append(v)
        v *= 1.1
    pos.append(sys.float_info.max)
    neg = [-x for x in reversed(pos)]
    return np.array(neg + [0.0] + pos)


_BUCKET_LIMITS = _default_bucket_limits()


class Histogram:
    """A histogram of values streamed in batch by batch, in TensorFlow's buckets, encoded
    as TensorBoard's ``HistogramProto``.

    Memory does not grow with the number of values: each ``add`` counts its values into
    fixed buckets (a value falls in the first bucket whose limit exceeds it). NaN and
    infinite values are not counted; ``dropped`` says how many there were.

    Example:
        >>> h = Histogram()
        >>> h.add(np.array([0.5, 1.5, 1.5]))
        >>> p = h.proto()
        >>> (p.num, p.min, p.max, p.sum)
        (3.0, 0.5, 1.5, 3.5)
    """

    def __init__(self):
        self.counts = np.zeros(len(_BUCKET_LIMITS), dtype=np.float64)
        self.num = 0
        self.dropped = 0
        self.min = np.inf
        self.max = -np.inf
        self.sum = 0.0
        self.sum_squares = 0.0

    def add(self, values):
        v = np.asarray(values, dtype=np.float64).ravel()
        finite = np.isfinite(v)
        if not finite.all():
            self.dropped += int(v.size - finite.sum())
            v = v[finite]
        if v.size == 0:
            return
        self.num += v.size
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))
        self.sum += float(v.sum())
        self.sum_squares += float(np.dot(v, v))
        index = np.searchsorted(_BUCKET_LIMITS, v, side="right")
        self.counts += np.bincount(index, minlength=len(_BUCKET_LIMITS))[: len(_BUCKET_LIMITS)]

    def proto(self):
        """The ``HistogramProto``; runs of empty buckets are merged into one, as
        TensorFlow writes them."""
        pb = _tb().summary_pb2.HistogramProto(
            num=float(self.num), sum=self.sum, sum_squares=self.sum_squares
        )
        if self.num == 0:
            return pb
        pb.min, pb.max = self.min, self.max
        limits, buckets = [], []
        i, n = 0, len(self.counts)
        while i < n:
            end, count = _BUCKET_LIMITS[i], self.counts[i]
            i += 1
            if count <= 0:
                while i < n and self.counts[i] <= 0:
                    end, count = _BUCKET_LIMITS[i], self.counts[i]
                    i += 1
            limits.append(float(end))
            buckets.append(float(count))
        pb.bucket_limit.extend(limits)
        pb.bucket.extend(buckets)
        return pb


# ======================================================================= images


def _weight_images(value, channels_last):
    """The images Keras 2.3.1's TensorBoard callback makes of a weight: a 2-D kernel as
    one image (wider than tall), a 3-D kernel (after squeezing) as one image per channel,
    a bias as a column; other ranks give none. Returns a list of 2-D float arrays."""
    w = np.squeeze(np.asarray(value, dtype=np.float64))
    if w.ndim == 2:
        if w.shape[0] > w.shape[1]:
            w = w.T
        return [w]
    if w.ndim == 3:
        if channels_last:
            w = np.transpose(w, (2, 0, 1))
        return list(w)
    if w.ndim == 1:
        return [w.reshape(-1, 1)]
    return []


def _png(image):
    """A grey-scale PNG of a 2-D float array, scaled as TensorFlow's image summaries scale
    float images: non-negative values so that the largest is 255; otherwise 0 at 128 and
    the largest magnitude at 1 or 255. Returns (PNG bytes, (height, width))."""
    from PIL import Image  # a dependency of the tensorboard package

    a = np.nan_to_num(np.asarray(image, dtype=np.float64), posinf=0.0, neginf=0.0)
    if a.min() >= 0:
        top = a.max()
        scaled = a * (255.0 / top) if top > 0 else a
    else:
        scaled = a * (127.0 / np.abs(a).max()) + 128.0
    pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buf, format="PNG")
    return buf.getvalue(), pixels.shape


# ======================================================================= graph


def _dims(shape):
    return [-1 if d is None else int(d) for d in shape]


def _is_model(layer):
    return hasattr(layer, "_network_nodes") and hasattr(layer, "_output_coordinates")


def _layer_attrs(node, layer, tb):
    """The attributes TensorBoard shows for a layer's node."""
    attr_value_pb2, tensor_shape_pb2 = tb.attr_value_pb2, tb.tensor_shape_pb2
    node.attr["keras_class"].s = type(layer).__name__.encode()
    try:
        dtype = np.dtype(getattr(layer, "dtype", None) or K.floatx()).name
        node.attr["dtype"].type = tb.types_pb2.DataType.Value("DT_" + _DTYPE_NAMES[dtype])
    except (KeyError, TypeError):
        pass
    try:
        shapes = layer.output_shape
    except (AttributeError, RuntimeError):  # a layer never called, or shared at several shapes
        shapes = None
    if shapes is not None:
        shapes = shapes if isinstance(shapes, list) else [shapes]
        protos = [
            tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in _dims(s)]
            )
            for s in shapes
            if isinstance(s, tuple)
        ]
        node.attr["_output_shapes"].CopyFrom(
            attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(shape=protos))
        )
    weights = [f"{w.name} {tuple(K.int_shape(w))}".encode() for w in getattr(layer, "weights", [])]
    if weights:
        node.attr["weights"].list.s.extend(weights)


def _add_network(graph, nodes, model, scope, tb):
    """Adds the layers of ``model`` under the name scope ``scope``; returns the node names
    of its outputs (``model.outputs`` order). A nested model is added under its own name
    as a scope: its input layers take the edges into it, its output layers give the edges
    out of it."""
    layers = list(getattr(model, "_layers", None) or model.layers)
    names = {layer.name for layer in layers}
    network_nodes = getattr(model, "_network_nodes", None)
    outputs_of = {
        layer.name: _add_network(graph, nodes, layer, f"{scope}{layer.name}/", tb)
        for layer in layers
        if _is_model(layer)
    }

    def source(layer, tensor_index):
        if layer.name in outputs_of:
            outs = outputs_of[layer.name]
            return outs[tensor_index or 0] if outs else None
        return scope + layer.name if layer.name in names else None

    for layer in layers:
        if layer.name not in outputs_of:
            node = graph.node.add(name=scope + layer.name, op=type(layer).__name__)
            nodes[node.name] = node
            _layer_attrs(node, layer, tb)
        for index, inbound in enumerate(getattr(layer, "_inbound_nodes", [])):
            if network_nodes is not None and f"{layer.name}_ib-{index}" not in network_nodes:
                continue
            srcs = [
                source(src, t)
                for src, t in zip(
                    inbound.inbound_layers,
                    getattr(inbound, "tensor_indices", None) or [0] * len(inbound.inbound_layers),
                )
            ]
            if layer.name in outputs_of:  # into a nested model: to its input layers
                inner = [f"{scope}{layer.name}/{x.name}" for x in layer._input_layers]
                targets = list(zip(inner, srcs))
            else:
                targets = [(scope + layer.name, src) for src in srcs]
            for target, src in targets:
                if src is not None and target in nodes and src not in nodes[target].input:
                    nodes[target].input.append(src)
    return [source(layer, t) for layer, _, t in model._output_coordinates]


def model_graph(model):
    """The layer graph of a Keras model as a TensorBoard ``GraphDef``: one node per layer
    (its op is the layer's class), an edge per connection within the model, and attributes
    TensorBoard shows: the output shapes (also drawn on the edges), dtype, the Keras class
    and the layer's weights with their shapes. A nested model is a name scope holding its
    own layers, which TensorBoard draws as one box that opens."""
    tb = _tb()
    graph = tb.graph_pb2.GraphDef()
    _add_network(graph, {}, model, "", tb)
    return graph


_DTYPE_NAMES = {
    "float16": "HALF",
    "float32": "FLOAT",
    "float64": "DOUBLE",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "bool": "BOOL",
}


# ======================================================================= the callback


def _unique(weights):
    """The weights in order, each once (a weight shared by two layers is listed by both)."""
    seen, out = set(), []
    for w in weights:
        if id(w) not in seen:
            seen.add(id(w))
            out.append(w)
    return out


class TensorBoard(Callback):
    """TensorBoard logging for Keras 2.3.1 models on ferrokeras, without TensorFlow.

    Takes the arguments of Keras 2.3.1's ``keras.callbacks.TensorBoard`` and writes an
    event file in ``log_dir`` that ``tensorboard --logdir <log_dir>`` opens:

    - Scalars: every entry of the epoch's logs (``loss``, metrics, ``val_*``) and the
      optimizer's learning rate (tag ``lr``; with ``decay`` the rate that step used) at
      the end of each epoch; with ``update_freq='batch'`` or an integer N, also the
      batch logs after every batch or every N samples. The step is the epoch with
      ``update_freq='epoch'``, else the number of samples seen, as in Keras.
    - Histograms, every ``histogram_freq`` epochs (step: the epoch): every weight
      (tag: the weight's name, ``:`` written ``_``, e.g. ``dense_1/kernel``); when
      validation data is given to ``fit``, every layer's output over it
      (``<layer>_out``) and, with ``write_grads=True``, the gradient of the loss with
      respect to every trainable weight (``<weight>_grad``), averaged over the validation
      batches of ``batch_size`` samples.
    - Images (``write_images=True``, every ``histogram_freq`` epochs, else at every epoch
      end): kernels and biases as grey-scale images, as Keras draws them.
    - The graph (``write_graph=True``): the model's layers and their connections, with
      output shapes and weights, in TensorBoard's Graphs tab.

    Arguments:
        log_dir: Directory for the event files (created if missing).
        histogram_freq: Epochs between histograms (0: none).
        batch_size: Validation samples per forward pass when computing activation and
            gradient histograms.
        write_graph: Whether to write the layer graph.
        write_grads: Whether to write gradient histograms (needs ``histogram_freq > 0``).
        write_images: Whether to write weights as images.
        embeddings_freq, embeddings_layer_names, embeddings_metadata, embeddings_data:
            TensorBoard's embedding projector reads TensorFlow checkpoints, which
            ferrokeras does not write: ``embeddings_freq > 0`` raises ``ValueError``.
        update_freq: ``'epoch'``, ``'batch'`` or a number of samples between writes.
        profile_batch: Profile this training batch (counted from 1 over the whole ``fit``,
            as TensorFlow's callback counts it) with ``ferrokeras.profile`` and write its
            trace where TensorBoard's profile plugin looks for it,
            ``<log_dir>/plugins/profile/<run>/<host>.trace.json.gz``; 0 (default): none.

    Raises:
        ImportError: the ``tensorboard`` package is not installed.
        ValueError: an argument is out of range, or ``embeddings_freq > 0``.

    Example (an unmodified Keras 2.3.1 script; on ferrokeras without TensorFlow
    ``keras.callbacks.TensorBoard`` is this class)::

        from keras.callbacks import TensorBoard
        model.fit(x, y, epochs=10, validation_split=0.1,
                  callbacks=[TensorBoard(log_dir="logs/run1", histogram_freq=1)])
        # then: tensorboard --logdir logs
    """

    def __init__(
        self,
        log_dir="./logs",
        histogram_freq=0,
        batch_size=32,
        write_graph=True,
        write_grads=False,
        write_images=False,
        embeddings_freq=0,
        embeddings_layer_names=None,
        embeddings_metadata=None,
        embeddings_data=None,
        update_freq="epoch",
        profile_batch=0,
    ):
        super().__init__()
        _tb()  # fail here, not at the end of the first epoch, without the package
        if not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"TensorBoard: log_dir must be a path, got {type(log_dir).__name__}")
        if not isinstance(histogram_freq, (int, np.integer)) or histogram_freq < 0:
            raise ValueError(
                f"TensorBoard: histogram_freq must be an int >= 0, got {histogram_freq!r}"
            )
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"TensorBoard: batch_size must be an int >= 1, got {batch_size!r}")
        if embeddings_freq:
            raise ValueError(
                "TensorBoard: embeddings_freq > 0 needs TensorFlow: TensorBoard's embedding "
                "projector reads TensorFlow checkpoints, which ferrokeras does not write. "
                "Leave embeddings_freq=0 (scalars, histograms, images and the graph work "
                "without TensorFlow)."
            )
        if update_freq == "batch":
            update_freq = 1
        elif update_freq != "epoch":
            if (
                isinstance(update_freq, bool)
                or not isinstance(update_freq, (int, np.integer))
                or update_freq < 1
            ):
                raise ValueError(
                    "TensorBoard: update_freq must be 'epoch', 'batch' or a number of "
                    f"samples >= 1, got {update_freq!r}"
                )
            update_freq = int(update_freq)
        if (
            isinstance(profile_batch, bool)
            or not isinstance(profile_batch, (int, np.integer))
            or profile_batch < 0
        ):
            raise ValueError(
                f"TensorBoard: profile_batch must be an int >= 0 (0: none), got {profile_batch!r}"
            )
        self.log_dir = os.fspath(log_dir)
        self.histogram_freq = int(histogram_freq)
        self.batch_size = int(batch_size)
        self.write_graph = bool(write_graph)
        self.write_grads = bool(write_grads)
        self.write_images = bool(write_images)
        self.embeddings_freq = 0
        self.embeddings_layer_names = embeddings_layer_names
        self.embeddings_metadata = embeddings_metadata or {}
        self.embeddings_data = embeddings_data
        self.update_freq = update_freq
        self.profile_batch = int(profile_batch)
        self._batches = 0
        self._profiling = None
        self.samples_seen = 0
        self.samples_seen_at_last_write = 0
        self.writer = None
        self._probe = None
        self._probe_fns = {}
        self._warned = set()

    # ---------------------------------------------------------------- writing

    def _open(self):
        if self.writer is None:
            os.makedirs(self.log_dir, exist_ok=True)
            self.writer = _tb().EventFileWriter(self.log_dir)
        return self.writer

    def _event(self, step, **fields):
        event = _tb().event_pb2.Event(wall_time=time.time(), step=int(step), **fields)
        self._open().add_event(event)

    def _summary(self, step, values):
        if values:
            self._event(step, summary=_tb().summary_pb2.Summary(value=values))

    def _write_logs(self, logs, index):
        Value = _tb().summary_pb2.Summary.Value
        values = []
        for name, value in logs.items():
            if name in ("batch", "size"):
                continue
            try:
                scalar = float(np.asarray(value).item())
            except (TypeError, ValueError):
                continue  # not a scalar: nothing TensorBoard can chart
            values.append(Value(tag=name, simple_value=scalar))
        self._summary(index, values)
        self._open().flush()

    # ---------------------------------------------------------------- Keras hooks

    def set_model(self, model):
        self.model = model
        self._probe = None
        self._open()
        if self.write_graph:
            self._event(0, graph_def=model_graph(model).SerializeToString())
            self._open().flush()

    def on_train_begin(self, logs=None):
        self._batches = 0
        self._open()

    def on_batch_begin(self, batch, logs=None):
        self._batches += 1
        if self._batches == self.profile_batch:
            self._profiling = profile(None, tensorboard_dir=self.log_dir)
            self._profiling.__enter__()

    def on_batch_end(self, batch, logs=None):
        if self._profiling is not None:
            self._profiling.__exit__(None, None, None)
            self._profiling = None
        if self.update_freq == "epoch":
            return
        logs = logs or {}
        self.samples_seen += int(logs.get("size", 1))
        if self.samples_seen - self.samples_seen_at_last_write >= self.update_freq:
            self._write_logs(logs, self.samples_seen)
            self.samples_seen_at_last_write = self.samples_seen

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if "lr" not in logs:
            lr = self._learning_rate()
            if lr is not None:
                logs["lr"] = lr
        if self.histogram_freq and epoch % self.histogram_freq == 0:
            self._write_histograms(epoch)
        if self.write_images and (self.histogram_freq == 0 or epoch % self.histogram_freq == 0):
            self._write_images(epoch)
        index = epoch if self.update_freq == "epoch" else self.samples_seen
        self._write_logs(logs, index)

    def on_train_end(self, logs=None):
        if self._profiling is not None:
            self._profiling.__exit__(None, None, None)
            self._profiling = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    # ---------------------------------------------------------------- contents

    def _learning_rate(self):
        opt = getattr(self.model, "optimizer", None)
        lr = getattr(opt, "lr", None)
        if lr is None:
            return None
        try:
            value = float(K.get_value(lr))
            if float(getattr(opt, "initial_decay", 0) or 0) > 0:
                decay = float(K.get_value(opt.decay))
                value /= 1.0 + decay * float(K.get_value(opt.iterations))
        except (TypeError, ValueError, AttributeError):
            return None
        return value

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    def _write_histograms(self, epoch):
        hists = {}
        for w in _unique(w for layer in self.model.layers for w in layer.weights):
            hists.setdefault(w.name.replace(":", "_"), Histogram()).add(K.get_value(w))
        if self.validation_data:
            hists.update(self._validation_histograms())
        elif self.write_grads:
            self._warn_once(
                "grads",
                "TensorBoard: write_grads needs validation data (validation_data or "
                "validation_split in fit); only weight histograms are written",
            )
        Value = _tb().summary_pb2.Summary.Value
        values = []
        for tag, h in hists.items():
            if h.dropped:
                self._warn_once(
                    ("nonfinite", tag),
                    f"TensorBoard: {h.dropped} NaN or infinite values of '{tag}' are left "
                    "out of its histogram",
                )
            values.append(Value(tag=tag, histo=h.proto()))
        self._summary(epoch, values)
        self._open().flush()

    def _make_probe(self):
        """A function from the validation feeds to every layer output and (with
        write_grads) the loss's gradients, built once per model."""
        model = self.model
        feeds = (
            list(getattr(model, "_feed_inputs", model.inputs))
            + list(getattr(model, "_feed_targets", []))
            + list(getattr(model, "_feed_sample_weights", []))
        )
        tags, outputs = [], []
        for layer in model.layers:
            try:
                out = layer.output
            except AttributeError:
                continue
            if isinstance(out, list):
                for i, o in enumerate(out):
                    tags.append(f"{layer.name}_out_{i}")
                    outputs.append(o)
            else:
                tags.append(f"{layer.name}_out")
                outputs.append(out)
        n_out = len(outputs)
        grad_tags = []
        if self.write_grads and getattr(model, "total_loss", None) is not None:
            weights = _unique(w for layer in model.layers for w in layer.trainable_weights)
            grads = K.gradients(model.total_loss, weights)
            for w, g in zip(weights, grads):
                if g is not None:
                    grad_tags.append(w.name.replace(":", "_") + "_grad")
                    outputs.append(g)
        self._probe = (feeds, tags, n_out, grad_tags, outputs)
        self._probe_fns = {}

    def _probe_fn(self, with_phase):
        feeds, _, _, _, outputs = self._probe
        if with_phase not in self._probe_fns:
            inputs = feeds + ([K.learning_phase()] if with_phase else [])
            self._probe_fns[with_phase] = K.function(inputs, outputs, verbose=0)
        return self._probe_fns[with_phase]

    def _validation_histograms(self):
        if self._probe is None:
            self._make_probe()
        feeds, tags, n_out, grad_tags, _ = self._probe
        data = list(self.validation_data)
        with_phase = len(data) == len(feeds) + 1
        if len(data) not in (len(feeds), len(feeds) + 1):
            raise ValueError(
                f"TensorBoard: the model takes {len(feeds)} validation arrays (inputs, targets "
                f"and sample weights), got {len(data)}"
            )
        phase = data.pop() if with_phase else None
        fn = self._probe_fn(with_phase)
        hists = {tag: Histogram() for tag in tags}
        grad_sums = [None] * len(grad_tags)
        size = len(data[0])
        for start in range(0, size, self.batch_size):
            batch = [np.asarray(x[start : start + self.batch_size]) for x in data]
            n = len(batch[0])
            results = fn(batch + ([phase] if with_phase else []))
            for tag, value in zip(tags, results[:n_out]):
                hists[tag].add(value)
            for i, g in enumerate(results[n_out:]):
                g = np.asarray(g, dtype=np.float64) * n
                grad_sums[i] = g if grad_sums[i] is None else grad_sums[i] + g
        for tag, g in zip(grad_tags, grad_sums):
            h = hists[tag] = Histogram()
            if g is not None:
                h.add(g / size)
        return hists

    def _write_images(self, epoch):
        summary_pb2 = _tb().summary_pb2
        channels_last = K.image_data_format() == "channels_last"
        values = []
        for w in _unique(w for layer in self.model.layers for w in layer.weights):
            name = w.name.replace(":", "_")
            images = _weight_images(K.get_value(w), channels_last)
            # Keras (tf.summary.image) writes at most three images per weight.
            for i, image in enumerate(images[:3]):
                data, (height, width) = _png(image)
                tag = f"{name}/image" if len(images) == 1 else f"{name}/image/{i}"
                img = summary_pb2.Summary.Image(
                    height=height, width=width, colorspace=1, encoded_image_string=data
                )
                values.append(summary_pb2.Summary.Value(tag=tag, image=img))
        self._summary(epoch, values)
        self._open().flush()


__all__ = ["TensorBoard", "Callback", "Histogram", "model_graph"]
