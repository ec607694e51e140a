"""Sums of buffers over the ranks of one machine through an MPI-3 shared-memory window.

Where every rank runs on the same machine, the gradient average sums its buffers here
instead of with ``MPI_Allreduce``: each rank copies its buffers into its slot of a window
that all ranks map (``MPI_Win_allocate_shared``), rank ``r`` adds the ranks' copies of the
``r``-th share of every buffer into the window's result slot, and every rank copies the
result back into its own buffers. Three passes over the bytes and two barriers, with no
system call in between; MPICH's ``Allreduce`` moves the same bytes with single-copy
system calls (``process_vm_readv``) and protocol work of its own, several times slower
for a few MiB (``docs/distributed.md`` has the figures).

Every rank adds the shares in rank order and reads the same result, so the ranks' sums
are equal bit for bit, as they are with ``Allreduce``. Buffers larger than a slot go
through it in pieces (two barriers per slot's worth).
"""

import os

import numpy as np

# Bytes of one rank's slot; the window holds size + 1 slots (one per rank and the
# result). A slot only grows to what the largest gradient layout needs.
_DEFAULT_SLOT_BYTES = 32 << 20
# Pieces start on cache-line boundaries: no two ranks write the same line.
_ALIGN = 64
# dtypes summed in the window (others go through MPI_Allreduce).
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def slot_limit():
    """Largest slot, from ``FERROKERAS_DIST_SHM_BYTES`` (0 turns the window off)."""
    env = os.environ.get("FERROKERAS_DIST_SHM_BYTES", "").strip()
    if not env:
        return _DEFAULT_SLOT_BYTES
    try:
        n = int(env)
    except ValueError:
        raise ValueError(f"FERROKERAS_DIST_SHM_BYTES must be an integer, got {env!r}") from None
    if n != 0 and n < _ALIGN:
        raise ValueError(f"FERROKERAS_DIST_SHM_BYTES must be 0 (off) or at least {_ALIGN}, got {n}")
    return n


def _round_up(n):
    return -(-n // _ALIGN) * _ALIGN


class ShmSum:
    """The window of one communicator whose ranks share a machine."""

    def __init__(self, MPI, comm):
        self.MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.win = None
        self.slot = 0  # bytes per slot
        self.slots = None  # (size + 1, slot) uint8 view of the window

    def _ensure(self, need):
        """Makes the slots at least `need` bytes (collective: every rank asks for the same
        size, which depends only on the agreed layout)."""
        if need <= self.slot:
            return
        self.free()
        MPI = self.MPI
        total = (self.size + 1) * need
        self.win = MPI.Win.Allocate_shared(total if self.rank == 0 else 0, 1, comm=self.comm)
        buf, _ = self.win.Shared_query(0)
        self.slots = np.ndarray((self.size + 1, need), np.uint8, buffer=buf)
        self.slot = need
        # Passive-target epoch for the window's lifetime: Sync orders this rank's loads
        # and stores against the barriers (MPI-3's separate memory model).
        self.win.Lock_all(MPI.MODE_NOCHECK)

    def free(self):
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
        self.win, self.slots, self.slot = None, None, 0

    def sum_in_place(self, arrays, limit):
        """Replaces each of `arrays` (1-D, C-contiguous, writable, dtype in DTYPES) by its
        sum over the ranks; slots of at most `limit` bytes."""
        need = sum(_round_up(a.nbytes) for a in arrays)
        self._ensure(min(max(need, _ALIGN), _round_up(limit)))
        cap = self.slot
        batch, used = [], 0
        for a in arrays:
            item = a.itemsize
            start = 0
            while start < a.size:
                room = (cap - used) // item
                if room == 0:
                    self._run(batch)
                    batch, used = [], 0
                    continue
                take = min(room, a.size - start)
                batch.append((a, start, take, used))
                used = _round_up(used + take * item)
                start += take
        if batch:
            self._run(batch)

    def _view(self, k, off, dtype, n):
        return self.slots[k, off : off + n * dtype.itemsize].view(dtype)

    def _run(self, batch):
        """One slot's worth: copy out, barrier, add this rank's shares, barrier, copy back."""
        r, size = self.rank, self.size
        for a, start, n, off in batch:
            self._view(r, off, a.dtype, n)[...] = a[start : start + n]
        self.win.Sync()
        self.comm.Barrier()
        self.win.Sync()
        for a, _, n, off in batch:
            lo, hi = n * r // size, n * (r + 1) // size
            if hi == lo:
                continue
            out = self._view(size, off, a.dtype, n)[lo:hi]
            np.add(
                self._view(0, off, a.dtype, n)[lo:hi],
                self._view(1, off, a.dtype, n)[lo:hi],
                out=out,
            )
            for k in range(2, size):
                out += self._view(k, off, a.dtype, n)[lo:hi]
        self.win.Sync()
        self.comm.Barrier()
        self.win.Sync()
        for a, start, n, off in batch:
            a[start : start + n] = self._view(size, off, a.dtype, n)
