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


class LearningRateScheduleCallback(Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch``
    up to (not including) ``end_epoch``, as Horovod's callback of that name.

    Arguments:
        initial_lr: The base learning rate; defaults to the optimizer's learning rate when
            training starts.
        multiplier: A number, or a function of the epoch (fractional when ``staircase``
            is False) returning the factor.
        start_epoch, end_epoch: The epochs it acts on (``end_epoch=None``: to the end).
        staircase: True: set once at the start of each epoch; False: at every batch, with
            the fractional epoch ``epoch + batch / steps_per_epoch``.
        momentum_correction: Scale an optimizer's ``momentum`` by new_lr / old_lr for the
            batch where the rate changes (Goyal et al., 2017), as Horovod does.
        steps_per_epoch: Batches per epoch; read from ``fit``'s parameters when None.
    """

    def __init__(
        self,
        initial_lr=None,
        multiplier=1.0,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=True,
        steps_per_epoch=None,
    ):
        super().__init__()
        self.initial_lr = initial_lr
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            factor = float(multiplier)
            self.multiplier = lambda epoch: factor
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self._restore_momentum = None

    def _lr_variable(self):
        opt = self.model.optimizer
        lr = getattr(opt, "learning_rate", None)
        if lr is None:
            lr = getattr(opt, "lr", None)
        if lr is None:
            raise ValueError(f"{type(self).__name__}: the optimizer has no learning rate")
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
            f"{type(self).__name__}: cannot tell the steps per epoch; pass steps_per_epoch"
        )

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, new):
        lr = self._lr_variable()
        old = float(K.get_value(lr))
        K.set_value(lr, new)
        opt = self.model.optimizer
        if self.momentum_correction and hasattr(opt, "momentum") and old > 0 and new != old:
            self._restore_momentum = float(K.get_value(opt.momentum))
            K.set_value(opt.momentum, self._restore_momentum * new / old)

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = float(K.get_value(self._lr_variable()))

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if not self._active(self.current_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._set(self.initial_lr * self.multiplier(self.current_epoch))
        else:
            epoch = self.current_epoch + batch / self._steps()
            self._set(self.initial_lr * self.multiplier(epoch))

    def on_batch_end(self, batch, logs=None):
        if self._restore_momentum is not None:
            K.set_value(self.model.optimizer.momentum, self._restore_momentum)
            self._restore_momentum = None


class LearningRateWarmupCallback(LearningRateScheduleCallback):
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
    + 1) / size``; at the start of epoch ``warmup_epochs`` it is set to ``initial_lr``.
    """

    def __init__(
        self,
        initial_lr=None,
        warmup_epochs=5,
        momentum_correction=True,
        steps_per_epoch=None,
        verbose=0,
    ):
        if warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be positive, got {warmup_epochs!r}")
        super().__init__(
            initial_lr=initial_lr,
            multiplier=self._warmup,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose
        self._done = False

    def _warmup(self, epoch):
        size = require().size
        return (epoch * (size - 1) / self.warmup_epochs + 1.0) / size

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        if epoch >= self.warmup_epochs and not self._done:
            K.set_value(self._lr_variable(), self.initial_lr)
            self._done = True
            if self.verbose and require().rank == 0:
                lr = self.initial_lr
                print(f"\nEpoch {epoch + 1}: finished the learning-rate warm-up, lr={lr:.6g}")


__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateWarmupCallback",
    "LearningRateScheduleCallback",
]
