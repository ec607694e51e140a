"""Data-parallel training on MPI with the API of ``horovod.keras``.

Run the same script on N processes (``mpiexec -n N python train.py``); each trains on its
own shard of the data and every training step averages the gradients over all of them::

    import ferrokeras.distributed as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr=1e-3 * hvd.size()))
    model.compile(optimizer=opt, loss=..., metrics=[...])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=2)]
    x_shard, y_shard = hvd.shard(x, y)
    model.fit(x_shard, y_shard, callbacks=callbacks, verbose=int(hvd.rank() == 0))

The transport is MPI through mpi4py (``pip install "ferrokeras[mpi]"``). See
``docs/distributed.md``.
"""

import numpy as np

from . import _comm
from ._comm import DistributedError, MismatchError, RankFailedError
from ._ops import (
    Average,
    Max,
    Min,
    Sum,
    allgather,
    allreduce,
    allreduce_gradients,
    broadcast,
    broadcast_global_variables,
    broadcast_variables,
)
from .compression import Compression, Compressor
from .optimizer import DistributedOptimizer, load_model


def init(comm=None):
    """Initialises ferrokeras.distributed: MPI (through mpi4py) on ``comm`` (an mpi4py
    communicator, default ``MPI.COMM_WORLD``). Call it once, before anything else here.

    It also installs the fault handling: an uncaught exception on one rank is printed
    there and on every other rank, and ends the job (``MPI_Abort``) instead of leaving the
    others waiting; a rank whose script ends while others are still in a collective makes
    them all raise :class:`MismatchError`.
    """
    _comm.init(comm)


def shutdown():
    """Checks that every rank shuts down and frees the communicators (optional: the end
    of the script does the same check)."""
    _comm.shutdown()


def is_initialized():
    """Whether :func:`init` has been called (and not :func:`shutdown`)."""
    return _comm.S.comm is not None


def rank():
    """This process's rank, 0 .. size() - 1."""
    return _comm.require().rank


def size():
    """The number of processes."""
    return _comm.require().size


def local_rank():
    """This process's rank among the processes of its machine."""
    return _comm.require().local_rank


def local_size():
    """The number of processes on this machine."""
    return _comm.require().local_size


def stats(reset=False):
    """Counters of the gradient average on this rank since ``init`` (or the last reset).

    Returns a dict: ``steps`` (gradient averages run), ``wait_s`` (seconds spent waiting
    for every rank to reach the average: the agreement check plus load imbalance),
    ``allreduce_s`` (seconds in the sum itself: ``MPI_Allreduce``, or the shared-memory
    window where every rank runs on one machine), ``bytes`` and ``buffers`` (reduced per
    rank), ``window_bytes`` (of those bytes, the ones summed through the shared-memory
    window). ``reset=True`` zeroes them after reading.
    """
    out = dict(_comm.require().stats)
    if reset:
        _comm.reset_stats()
    return out


def mpi_threads_supported():
    """Whether the MPI library was initialised with MPI_THREAD_MULTIPLE."""
    MPI = _comm.require().MPI
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def shard(*arrays, rank=None, size=None, drop_remainder=True):
    """This rank's share of ``arrays`` (NumPy arrays or lists of equal length).

    Rank ``r`` of ``n`` gets the samples ``r, r + n, r + 2n, ...``: the i-th batches of all
    ranks together are the i-th batch of one process that trains with a batch ``n`` times
    as large on the unsharded data. With ``drop_remainder`` (the default) the last
    ``len % n`` samples are dropped so that every rank has the same number of samples,
    hence the same number of steps per epoch (a rank that ran out of steps while others
    still train would make them all fail); without it the first ``len % n`` ranks get one
    sample more.

    Arguments:
        *arrays: One or more arrays with the same first dimension.
        rank, size: Default to this process's ``rank()`` and ``size()``.
        drop_remainder: See above.

    Returns:
        One array, or a tuple of arrays when several were given.
    """
    if not arrays:
        raise ValueError("shard: give at least one array")
    if rank is None:
        rank = _comm.require().rank
    if size is None:
        size = _comm.require().size
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"shard: size must be a positive integer, got {size!r}")
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < size:
        raise ValueError(f"shard: rank must be in [0, {size}), got {rank!r}")
    arrays = [np.asarray(a) for a in arrays]
    if any(a.ndim == 0 for a in arrays):
        raise ValueError("shard: every array needs a first dimension to shard along")
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError(
            "shard: the arrays differ in length: " + ", ".join(str(len(a)) for a in arrays)
        )
    end = n - n % size if drop_remainder else n
    out = tuple(a[rank:end:size] for a in arrays)
    return out[0] if len(out) == 1 else out


def __getattr__(name):
    # `callbacks` imports Keras, so it loads on first use: KERAS_BACKEND may be set after
    # this package is imported.
    if name == "callbacks":
        import importlib

        return importlib.import_module(".callbacks", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "mpi_threads_supported",
    "stats",
    "allreduce",
    "allgather",
    "broadcast",
    "broadcast_variables",
    "broadcast_global_variables",
    "allreduce_gradients",
    "shard",
    "DistributedOptimizer",
    "load_model",
    "Compression",
    "Compressor",
    "DistributedError",
    "MismatchError",
    "RankFailedError",
    "Average",
    "Sum",
    "Min",
    "Max",
]
