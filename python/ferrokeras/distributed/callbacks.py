"""Keras 2.3.1 callbacks for data-parallel training, named as in ``horovod.keras``.

Put them first in the callback list: ``MetricAverageCallback`` must run before callbacks
that read the epoch's metrics (ModelCheckpoint, EarlyStopping, ReduceLROnPlateau, ...).
"""

import numpy as np
from keras.callbacks import Callback

from .. import backend as K
from ._comm import require
from ._ops import Average, _np_allreduce, broadcast_variables


class BroadcastGlobalVariablesCallback(Callback):
    """At the start of training, sets the model's weights and the optimizer's state on
    every rank to those of ``root_rank``, so that all ranks start from the same point
    (whatever their random initialisation or the weights each loaded).

    Arguments:
        root_rank: The rank whose values everyone takes.
        device: Unused; accepted for scripts written for ``horovod.keras``.
    """

    def __init__(self, root_rank, device=""):
        super().__init__()
        del device
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        require()
        variables = list(self.model.weights)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            seen = {id(v) for v in variables}
            variables += [v for v in optimizer.weights if id(v) not in seen]
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(Callback):
    """At the end of every epoch, replaces each metric in ``logs`` (loss, accuracy,
    validation metrics, ...) by its average over all ranks. With equal shards this is
    the metric of the whole data set."""

    def __init__(self, device=""):
        super().__init__()
        del device

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        require()
        keys = sorted(
            k for k, v in logs.items() if isinstance(v, (int, float, np.number, np.ndarray))
        )
        values = np.array([float(np.mean(logs[k])) for k in keys], dtype=np.float64)
        averaged = _np_allreduce(values, Average, "metrics " + ",".join(keys))
        for k, v in zip(keys, averaged):
            logs[k] = float(v)


class LearningRateWarmupCallback(Callback):
    """Raises the learning rate gradually from ``initial_lr / size`` to ``initial_lr``
    over the first ``warmup_epochs`` epochs, batch by batch (Goyal et al., "Accurate,
    Large Minibatch SGD", 2017): large learning rates scaled with the number of ranks
    destabilise the first steps otherwise.

    Arguments:
        initial_lr: The learning rate after warm-up (already scaled by ``hvd.size()``);
            defaults to the optimizer's learning rate when training starts.
        warmup_epochs: Epochs of warm-up.
        momentum_correction: Scale an optimizer's ``momentum`` by the change of learning
            rate for the batch where it changes, as Horovod does.
        steps_per_epoch: Batches per epoch; read from ``fit``'s parameters when None.
        verbose: 1 prints a line when warm-up ends (rank 0 only).

    The rate at (fractional) epoch ``e`` is ``initial_lr * (e * (size - 1) / warmup_epochs
    + 1) / size``; from epoch ``warmup_epochs`` on it is ``initial_lr``.
    """

    def __init__(
        self,
        initial_lr=None,
        warmup_epochs=5,
        momentum_correction=True,
        steps_per_epoch=None,
        verbose=0,
    ):
        super().__init__()
        if warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be positive, got {warmup_epochs!r}")
        self.initial_lr = initial_lr
        self.warmup_epochs = warmup_epochs
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0
        self._restore_momentum = None
        self._done = False

    def _lr_variable(self):
        opt = self.model.optimizer
        lr = getattr(opt, "learning_rate", None)
        if lr is None:
            lr = getattr(opt, "lr", None)
        if lr is None:
            raise ValueError("LearningRateWarmupCallback: the optimizer has no learning rate")
        return lr

    def _steps(self):
        if self.steps_per_epoch:
            return self.steps_per_epoch
        p = self.params or {}
        if p.get("steps"):
            return p["steps"]
        if p.get("samples") and p.get("batch_size"):
            return int(np.ceil(p["samples"] / p["batch_size"]))
        raise ValueError(
            "LearningRateWarmupCallback: cannot tell the steps per epoch; pass steps_per_epoch"
        )

    def multiplier(self, epoch):
        """The factor on ``initial_lr`` at fractional epoch ``epoch``."""
        size = require().size
        if epoch >= self.warmup_epochs:
            return 1.0
        return (epoch * (size - 1) / self.warmup_epochs + 1.0) / size

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = float(K.get_value(self._lr_variable()))

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if epoch >= self.warmup_epochs and not self._done:
            K.set_value(self._lr_variable(), self.initial_lr)
            self._done = True
            if self.verbose and require().rank == 0:
                lr = self.initial_lr
                print(f"\nEpoch {epoch + 1}: finished the learning-rate warm-up, lr={lr:.6g}")

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch >= self.warmup_epochs:
            return
        lr = self._lr_variable()
        old = float(K.get_value(lr))
        new = self.initial_lr * self.multiplier(self.current_epoch + batch / self._steps())
        K.set_value(lr, new)
        opt = self.model.optimizer
        if self.momentum_correction and hasattr(opt, "momentum") and old > 0 and new != old:
            m = opt.momentum
            self._restore_momentum = float(K.get_value(m))
            K.set_value(m, self._restore_momentum * new / old)

    def on_batch_end(self, batch, logs=None):
        if self._restore_momentum is not None:
            K.set_value(self.model.optimizer.momentum, self._restore_momentum)
            self._restore_momentum = None


__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateWarmupCallback",
]
