"""The MPI side of ferrokeras.distributed: the communicator, the agreement step that runs
before every collective, and the fault handling that ends a job instead of hanging it.

Every collective first runs ``agree(description)``: a tiny non-blocking ``Iallreduce`` of
a hash of what this rank is about to do (which collective, on which shapes and dtypes).
While it waits, the rank also polls for an error message from another rank. Only when
every rank is at the same collective does the data move, with one blocking MPI call, so:

- ranks at different collectives (different layouts, one rank out of data or exiting
  while the others still train) all raise :class:`MismatchError`, with every rank's
  description in the message;
- an uncaught exception on one rank is printed there, sent to every other rank (which
  raise :class:`RankFailedError` carrying its traceback and print it), and the job is
  aborted with ``MPI_Abort``.
"""

import atexit
import functools
import hashlib
import os
import sys
import time
import traceback

import numpy as np

from ._shm import ShmSum, slot_limit

_ERROR_TAG = 7301
_ACK_TAG = 7302


class DistributedError(RuntimeError):
    """Base class of the errors ferrokeras.distributed raises."""


class MismatchError(DistributedError):
    """The ranks reached different collectives, or the same one with different layouts.
    Every rank raises it, with the same message."""


class RankFailedError(DistributedError):
    """Another rank raised an exception; ``rank`` is that rank, ``remote_traceback`` its
    traceback as text."""

    def __init__(self, rank, remote_traceback):
        self.rank = rank
        self.remote_traceback = remote_traceback
        super().__init__(
            f"rank {rank} failed, so this rank stops too. Its error:\n{remote_traceback.rstrip()}"
        )


for _cls in (DistributedError, MismatchError, RankFailedError):
    _cls.__module__ = "ferrokeras.distributed"


class _State:
    MPI = None
    comm = None  # collectives
    err_comm = None  # error messages and their acknowledgements
    local_comm = None
    shm = None  # the gradient average's shared-memory window (_shm.ShmSum), made on first use
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    counts = {}  # collective kind -> how many this rank ran (named in error messages)
    stats = None  # the gradient average's counters (ferrokeras.distributed.stats)
    previous_hook = None
    shutting_down = False
    failed = False


S = _State()


def _env_float(name, default):
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None


def _grace():
    """Seconds a failing rank waits for the others to print its error before aborting."""
    return _env_float("FERROKERAS_DIST_ABORT_GRACE", 3.0)


def init(comm=None):
    """Initialises MPI (through mpi4py) for ferrokeras.distributed. Idempotent."""
    if S.comm is not None:
        return
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(
            "ferrokeras.distributed needs mpi4py and an MPI library: "
            'pip install "ferrokeras[mpi]" (mpi4py and mpich), or Debian\'s python3-mpi4py'
        ) from e
    base = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(base, MPI.Comm):
        raise TypeError(f"init: comm must be an mpi4py communicator, got {type(base).__name__}")
    S.MPI = MPI
    S.comm = base.Dup()
    S.err_comm = base.Dup()
    S.local_comm = base.Split_type(MPI.COMM_TYPE_SHARED, key=base.Get_rank())
    S.rank = S.comm.Get_rank()
    S.size = S.comm.Get_size()
    S.local_rank = S.local_comm.Get_rank()
    S.local_size = S.local_comm.Get_size()
    S.counts = {}
    reset_stats()
    S.previous_hook = sys.excepthook
    sys.excepthook = _excepthook
    atexit.register(_at_exit)


def reset_stats():
    S.stats = {
        "steps": 0,
        "wait_s": 0.0,
        "allreduce_s": 0.0,
        "bytes": 0,
        "buffers": 0,
        "window_bytes": 0,
    }


def shared_memory():
    """The shared-memory window that sums the gradient average's buffers, or None where
    the ranks span machines, there is one rank, or ``FERROKERAS_DIST_SHM_BYTES=0``. Every
    rank gets the same answer; the first call is collective (it duplicates the machine's
    communicator)."""
    s = require()
    if s.size == 1 or s.local_size != s.size or slot_limit() == 0:
        return None
    if s.shm is None:
        s.shm = ShmSum(s.MPI, s.local_comm.Dup())
    return s.shm


def require():
    if S.comm is None:
        raise ValueError("ferrokeras.distributed is not initialised: call hvd.init() first")
    return S


@functools.lru_cache(maxsize=64)  # the gradient average checks the same layout every step
def _hash(description):
    digest = hashlib.blake2b(description.encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


def _poll_errors():
    """Raises RankFailedError when another rank has sent its error."""
    MPI = S.MPI
    status = MPI.Status()
    if S.err_comm.Iprobe(source=MPI.ANY_SOURCE, tag=_ERROR_TAG, status=status):
        source = status.Get_source()
        text = S.err_comm.recv(source=source, tag=_ERROR_TAG)
        raise RankFailedError(source, text)


def _wait(request, what):
    """Waits for a non-blocking request, polling for other ranks' errors meanwhile."""
    timeout = _env_float("FERROKERAS_DIST_TIMEOUT", 0.0)
    warn_after = _env_float("FERROKERAS_DIST_STALL_WARNING", 60.0)
    start = time.monotonic()
    warned = False
    spins = 0
    while not request.Test():
        spins += 1
        if spins % 64 == 0:
            _poll_errors()
        if spins < 2000:
            continue
        waited = time.monotonic() - start
        if timeout > 0 and waited > timeout:
            raise DistributedError(
                f"rank {S.rank}: waited {waited:.0f} s at {what}; some rank never reached it "
                f"(FERROKERAS_DIST_TIMEOUT={timeout:g})"
            )
        if not warned and warn_after > 0 and waited > warn_after:
            warned = True
            print(
                f"ferrokeras.distributed: rank {S.rank} has waited {waited:.0f} s at {what}; "
                "some rank has not reached it yet",
                file=sys.stderr,
                flush=True,
            )
        # Give the core to whatever else wants it (another rank still computing), but
        # stay runnable: a rank that sleeps here holds up the others in the Allreduce
        # that follows. Only long waits (a rank evaluating, saving) sleep.
        if waited < 0.2:
            os.sched_yield()
        else:
            time.sleep(0.001)
    _poll_errors()


def agree(kind, layout, detail=None):
    """Checks that every rank is at the same collective with the same layout.

    ``kind`` names the collective (``"gradient allreduce"``), ``layout`` is a string that
    must be equal on every rank (shapes, dtypes, root, ...), ``detail`` what to print about
    this rank when they differ (defaults to ``layout``). Raises MismatchError on every rank
    when they differ.
    """
    s = require()
    n = s.counts.get(kind, 0) + 1
    s.counts[kind] = n
    if s.size == 1:
        return
    h = _hash(f"{kind}\n{layout}")
    buf = np.array([h, -h], dtype=np.int64)
    _wait(s.comm.Iallreduce(s.MPI.IN_PLACE, buf, op=s.MPI.MAX), kind)
    if buf[0] == -buf[1]:
        return
    mine = (kind, f"{kind} #{n}: {detail if detail is not None else layout}")
    everyone = s.comm.allgather(mine)
    lines = [f"  rank {r}: {d}" for r, (_, d) in enumerate(everyone)]
    kinds = {k for k, _ in everyone}
    if "exit" in kinds and len(kinds) > 1:
        ended = [str(r) for r, (k, _) in enumerate(everyone) if k == "exit"]
        lines.append(
            f"rank(s) {', '.join(ended)} reached the end of the script while the others "
            "still wait at a collective: a rank ran out of data? hvd.shard() gives every "
            "rank the same number of samples, hence of steps"
        )
    raise MismatchError(
        "the ranks are at different collectives or disagree on their layout "
        "(every rank must run the same collectives on data of the same shapes):\n"
        + "\n".join(lines)
    )


def _send_error(text):
    """Sends `text` to every other rank and waits (up to the grace period) until they
    acknowledge that they have printed it."""
    comm = S.err_comm
    others = [r for r in range(S.size) if r != S.rank]
    sends = [comm.isend(text, dest=r, tag=_ERROR_TAG) for r in others]
    acks = [comm.irecv(source=r, tag=_ACK_TAG) for r in others]
    deadline = time.monotonic() + _grace()
    pending = list(acks)
    while pending and time.monotonic() < deadline:
        pending = [a for a in pending if not a.test()[0]]
        time.sleep(0.001)
    del sends


def _abort(code=1):
    sys.stdout.flush()
    sys.stderr.flush()
    S.comm.Abort(code)


def _report(prefix, exc_type, exc, tb):
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write(f"ferrokeras.distributed: rank {S.rank} of {S.size}: {prefix}\n{text}")
    sys.stderr.flush()
    return text


def _handle_failure(exc_type, exc, tb):
    """What an uncaught exception does on a rank: print it, make the others print it, abort."""
    if S.failed:
        _abort()
    S.failed = True
    if isinstance(exc, RankFailedError):
        _report("stopping because another rank failed", exc_type, exc, tb)
        S.err_comm.send(S.rank, dest=exc.rank, tag=_ACK_TAG)
        # The failing rank aborts the job once every rank has printed its error.
        time.sleep(_grace() + 2.0)
    elif isinstance(exc, MismatchError):
        _report("the ranks disagree", exc_type, exc, tb)
        # Every rank raised the same error: wait (briefly) until all have printed it.
        req = S.err_comm.Ibarrier()
        deadline = time.monotonic() + _grace()
        while not req.Test() and time.monotonic() < deadline:
            time.sleep(0.001)
    elif isinstance(exc, KeyboardInterrupt):
        # mpiexec passes Ctrl-C to every rank: nobody would wait for the others' reports.
        _report("interrupted, aborting the job", exc_type, exc, tb)
    else:
        text = _report("uncaught exception, aborting the job", exc_type, exc, tb)
        if S.size > 1:
            _send_error(text)
    _abort()


def _excepthook(exc_type, exc, tb):
    if S.comm is None or S.size == 1:
        (S.previous_hook or sys.__excepthook__)(exc_type, exc, tb)
        return
    try:
        _handle_failure(exc_type, exc, tb)
    finally:
        _abort()


def _at_exit():
    """A rank whose script ends checks that every other rank ends too, so that a rank that
    runs out of data while the others still train fails them instead of leaving them
    waiting forever."""
    if S.comm is None or S.failed or S.shutting_down:
        return
    S.shutting_down = True
    try:
        agree("exit", "the script is ending (interpreter exit)")
    except BaseException as e:  # noqa: B036 - any failure here must end the job
        _handle_failure(type(e), e, e.__traceback__)


def shutdown():
    """Checks that every rank is shutting down, then frees the communicators. Later
    collectives need ``init()`` again."""
    if S.comm is None:
        return
    agree("shutdown", "hvd.shutdown()")
    S.shutting_down = True
    if S.shm is not None:
        S.shm.free()
        S.shm.comm.Free()
        S.shm = None
    for c in (S.comm, S.err_comm, S.local_comm):
        c.Free()
    S.comm = S.err_comm = S.local_comm = None
    if sys.excepthook is _excepthook:
        sys.excepthook = S.previous_hook
    atexit.unregister(_at_exit)
    S.shutting_down = False
