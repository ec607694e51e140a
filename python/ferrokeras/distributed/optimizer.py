"""DistributedOptimizer: a Keras 2.3.1 optimizer whose gradients are averaged over all
ranks, with one graph node per training step."""

from .. import backend as K
from ._comm import require
from ._ops import Average, Sum, allreduce_gradients
from .compression import Compression
from .compression import check as check_compression


class _DistributedMethods:
    """The methods the distributed subclass puts over the wrapped optimizer's class."""

    _ferrokeras_distributed = True

    def get_gradients(self, loss, params):
        """The gradients of ``loss`` w.r.t. ``params``, averaged over all ranks (summed when
        the optimizer was made with ``op=hvd.Sum``), then clipped by ``clipnorm`` and
        ``clipvalue``: clipping sees the global gradient, as one process training on the
        whole batch would."""
        from keras.optimizers import clip_norm

        size = require().size
        if self._ferrokeras_op == Average and size > 1:
            # The average's 1/size scales the loss, so that backpropagation carries it
            # at no cost, and the ranks' gradients are then summed.
            loss = loss * K.constant(1.0 / size, dtype=loss.dtype)
        grads = K.gradients(loss, params)
        if any(g is None for g in grads):
            raise ValueError(
                "An operation has `None` for gradient. Please make sure that all of your ops "
                "have a gradient defined (i.e. are differentiable). Common ops without "
                "gradient: K.argmax, K.round, K.eval."
            )
        names = [getattr(p, "name", str(p)) for p in params]
        grads = allreduce_gradients(grads, names, op=Sum, compression=self._ferrokeras_compression)
        if getattr(self, "clipnorm", 0) and self.clipnorm > 0:
            norm = K.sqrt(sum([K.sum(K.square(g)) for g in grads]))
            grads = [clip_norm(g, self.clipnorm, norm) for g in grads]
        if getattr(self, "clipvalue", 0) and self.clipvalue > 0:
            grads = [K.clip(g, -self.clipvalue, self.clipvalue) for g in grads]
        return grads


def DistributedOptimizer(optimizer, name=None, op=Average, compression=Compression.none):
    """Wraps a Keras 2.3.1 optimizer so that every training step averages the gradients
    over all ranks before applying them.

    Arguments:
        optimizer: A ``keras.optimizers.Optimizer`` instance (SGD, Adam, RMSprop, ...).
        name: Unused; accepted for scripts written for ``horovod.keras``.
        op: ``hvd.Average`` (default) or ``hvd.Sum`` of the ranks' gradients.
        compression: ``hvd.Compression.none`` (default: exact) or ``hvd.Compression.fp16``
            (the gradients cross the wire as float16, half the bytes; the update sees
            them in float32 with float16's precision).

    Returns:
        A new optimizer of a subclass of ``optimizer``'s class with the same ``__name__``
        and the same configuration, so that a model saved with it loads without
        ferrokeras.distributed. Its ``get_gradients`` packs all gradients into one buffer
        and sums them with one host node (one ``Allreduce``) per step (for the average, the
        loss is scaled by ``1 / size`` before differentiating); ``clipnorm`` and
        ``clipvalue`` apply to the averaged gradient. Scale the learning rate with the
        number of ranks yourself (``lr * hvd.size()``), as with Horovod.
    """
    del name
    require()
    if op not in (Average, Sum):
        raise ValueError(f"DistributedOptimizer: op must be hvd.Average or hvd.Sum, got {op!r}")
    compression = check_compression(compression, "DistributedOptimizer")
    base = type(optimizer)
    if getattr(base, "_ferrokeras_distributed", False):
        raise ValueError("DistributedOptimizer: this optimizer is already distributed")
    if not (hasattr(base, "get_gradients") and hasattr(optimizer, "get_config")):
        raise TypeError(
            f"DistributedOptimizer wraps a Keras optimizer, got {type(optimizer).__name__}"
        )
    cls = distributed_class(base, op, compression)
    return cls.from_config(optimizer.get_config())


def distributed_class(base, op=Average, compression=Compression.none):
    """The subclass of the optimizer class ``base`` that DistributedOptimizer instantiates:
    same ``__name__``, ``__module__`` and configuration, gradients averaged over ranks
    (compressed by ``compression`` on the wire)."""
    methods = {
        k: v
        for k, v in vars(_DistributedMethods).items()
        if k not in ("__dict__", "__weakref__", "__doc__")
    }
    methods["__module__"] = base.__module__
    methods["__doc__"] = base.__doc__
    methods["_ferrokeras_op"] = op
    methods["_ferrokeras_compression"] = compression
    return type(base.__name__, (base,), methods)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None):
    """Loads a Keras model saved by ``model.save`` with its optimizer made distributed,
    its state (iterations, moments) restored: to resume training on every rank.

    Arguments:
        filepath: The HDF5 file.
        custom_optimizers: Optimizer classes of your own that the file may name.
        custom_objects: As for ``keras.models.load_model``.
        compression: The optimizer's ``compression`` (``hvd.Compression.none`` by default).
    """
    import inspect

    import keras

    require()
    compression = check_compression(compression, "load_model")
    classes = [
        c
        for c in vars(keras.optimizers).values()
        if inspect.isclass(c) and issubclass(c, keras.optimizers.Optimizer)
    ]
    objects = {}
    for c in classes + list(custom_optimizers or []):
        # keras.optimizers.deserialize looks built-in names up in lower case.
        objects[c.__name__] = objects[c.__name__.lower()] = distributed_class(
            c, compression=compression
        )
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)
