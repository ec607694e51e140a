"""Sums of buffers over the ranks of one machine through an MPI-3 shared-memory window.

Where every rank runs on the same machine, the gradient average sums its buffers here
instead of with ``MPI_Allreduce``. Each buffer is cut into one share per rank; rank ``r``
sums the ``r``-th share of every buffer. The window that all ranks map
(``MPI_Win_allocate_shared``) holds one slot per rank and one for the sums, each laid
out as the buffers are:

1. each rank copies into its slot the shares the other ranks sum (not its own);
2. barrier; rank ``r`` adds the other ranks' copies of share ``r`` to its own buffer's
   share ``r`` in place, in rank order, and copies the sum into the sums' slot;
3. barrier; each rank copies the other ranks' shares of the sums' slot into its buffer.

A rank's slot is only read between the two barriers and the sums' slot only after the
second, so a rank that goes on to the next piece cannot overwrite what another still
reads.

Each rank moves its buffers' bytes once out (less its own share) and once back (less its
own share), with no system call in between; MPICH's ``Allreduce`` moves the same bytes
with single-copy system calls (``process_vm_readv``) and protocol work of its own
(``docs/distributed.md`` has the figures).

Every share is summed by one rank, in rank order, and every rank reads that sum, so the
ranks' results are equal bit for bit, as they are with ``Allreduce``. Buffers larger than
a slot go through it in pieces (two barriers per slot's worth).
"""

import os

import numpy as np

# Bytes of one rank's slot; the window holds size + 1 slots (one per rank and the
# sums). A slot only grows to what the largest gradient layout needs.
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
        if self.size == 1:
            return
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

    def _shares(self, n):
        """(rank, lo, hi) of each rank's share of `n` elements."""
        size = self.size
        return [(k, n * k // size, n * (k + 1) // size) for k in range(size)]

    def _run(self, batch):
        """One slot's worth: copy out the others' shares, barrier, sum this rank's share
        in place and publish it, barrier, copy the others' sums back."""
        r = self.rank
        for a, start, n, off in batch:
            mine = self._view(r, off, a.dtype, n)
            part = a[start : start + n]
            for k, lo, hi in self._shares(n):
                # Ranks 0 and 1 build their share's sum in place over their own
                # values (they are the first two terms); a later rank's own values
                # would be overwritten before their turn, so they go through the slot.
                if k != r or r >= 2:
                    mine[lo:hi] = part[lo:hi]
        self._barrier()
        for a, start, n, off in batch:
            _, lo, hi = self._shares(n)[r]
            if hi == lo:
                continue
            own = a[start + lo : start + hi]
            terms = [
                own if k == r and r < 2 else self._view(k, off, a.dtype, n)[lo:hi]
                for k in range(self.size)
            ]
            np.add(terms[0], terms[1], out=own)
            for t in terms[2:]:
                own += t
            self._view(self.size, off, a.dtype, n)[lo:hi] = own
        self._barrier()
        for a, start, n, off in batch:
            part = a[start : start + n]
            for k, lo, hi in self._shares(n):
                if k != r:
                    part[lo:hi] = self._view(self.size, off, a.dtype, n)[lo:hi]

    def _barrier(self):
        # Sync orders this rank's loads and stores against the barrier (MPI-3's separate
        # memory model).
        self.win.Sync()
        self.comm.Barrier()
        self.win.Sync()
