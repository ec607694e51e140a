"""Collectives on NumPy arrays, the same as graph ops (host-callback nodes), and the
packed gradient average that DistributedOptimizer puts in a training step."""

import gc
import os
import time

import numpy as np

from .. import _core
from .. import backend as K
from .._k.common import _t
from ..tensor import LIVE_VARIABLES, Tensor, wrap
from ._comm import S, agree, require, shared_memory
from ._shm import DTYPES as SHM_DTYPES
from ._shm import slot_limit as shm_slot_limit
from .compression import NoneCompressor
from .compression import check as _check_compression

Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
_OPS = (Average, Sum, Min, Max)

# mpi4py passes counts as C ints to MPI libraries without large-count support.
_MAX_COUNT = 2**31 - 1
# Largest buffer a GPU kernel may bind on many adapters (WebGPU's default limit).
_GPU_CHUNK_BYTES = 128 << 20
# float16 on the wire (Compression.fp16) is summed after an Allgather up to this many
# ranks (each rank receives (size - 1) * 2 bytes per value, no more than a float32
# Allreduce's 2 * (size - 1) / size * 4 until 4 ranks), and by an Allreduce with a
# user-defined float16 sum beyond: MPICH's own float16 sum (MPI_FLOAT16_T / MPI_SUM)
# is correct but converts element by element (~19 ms for 1.3 MB here, against 0.25 ms
# for the Allgather).
_FP16_GATHER_MAX_RANKS = 3
# Without a size limit (the CPU), a gradient of at least this many bytes is summed in
# its own buffer, lent by the runtime as it is, instead of being copied into the packed
# one: a copy of 256 KiB costs about what one more rendezvous of the ranks does
# (~15 us) when each rank has a core of its own.
_OWN_BUFFER_BYTES = 256 << 10


def _mpi_op(op):
    MPI = require().MPI
    return {Average: MPI.SUM, Sum: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX}[op]


def _resolve_op(op, average, fn):
    if op is not None and average is not None:
        raise ValueError(f"{fn}: give either op or average, not both")
    if op is None:
        op = Sum if average is False else Average
    if op not in _OPS:
        raise ValueError(f"{fn}: op must be one of {', '.join(_OPS)}, got {op!r}")
    return op


def _as_numeric(value, fn):
    arr = np.array(value, order="C", copy=True)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{fn}: expected a numeric array, got dtype {arr.dtype}")
    return arr


def _layout(arr):
    return f"{arr.dtype.name}{list(arr.shape)}"


def _f16_sum(inbuf, outbuf, datatype):
    """The user-defined MPI sum of float16 buffers (each addition rounded to float16)."""
    del datatype
    out = np.frombuffer(outbuf, np.float16)
    np.add(np.frombuffer(inbuf, np.float16), out, out=out)


_F16_SUM = []  # the MPI.Op, created on first use


def _f16_sum_op():
    if not _F16_SUM:
        _F16_SUM.append(require().MPI.Op.Create(_f16_sum, commute=True))
    return _F16_SUM[0]


def _reduce_f16_in_place(arr, op):
    """Sums (averages) the float16 `arr` over the ranks with float16 on the wire: up to
    _FP16_GATHER_MAX_RANKS ranks gathered and added in float32 in rank order (then
    rounded once), beyond by an Allreduce with the float16 sum."""
    s = require()
    flat = arr.reshape(-1)
    if s.size <= _FP16_GATHER_MAX_RANKS:
        rows = np.empty((s.size, flat.size), np.float16)
        s.comm.Allgather(flat, rows)
        total = rows.astype(np.float32).sum(axis=0)
        if op == Average:
            total /= s.size
        flat[...] = total
        return arr
    for start in range(0, flat.size, _MAX_COUNT):
        s.comm.Allreduce(s.MPI.IN_PLACE, flat[start : start + _MAX_COUNT], op=_f16_sum_op())
    if op == Average:
        flat[...] = flat.astype(np.float32) / s.size
    return arr


def _reduce_in_place(arr, op, wire16=False):
    """Allreduces `arr` (C-contiguous, writable) in place, in chunks of at most 2**31-1
    elements. float16 is reduced in float32, or with `wire16` (Compression.fp16) as
    float16 by _reduce_f16_in_place."""
    s = require()
    if s.size == 1:
        return arr
    if wire16 and arr.dtype == np.float16 and op in (Sum, Average):
        return _reduce_f16_in_place(arr, op)
    work = arr.astype(np.float32) if arr.dtype == np.float16 else arr
    flat = work.reshape(-1)
    for start in range(0, flat.size, _MAX_COUNT):
        s.comm.Allreduce(s.MPI.IN_PLACE, flat[start : start + _MAX_COUNT], op=_mpi_op(op))
    if op == Average:
        np.divide(work, s.size, out=work)
    if work is not arr:
        arr[...] = work
    return arr


def _np_allreduce(arr, op, name, wire16=False):
    require()
    if op == Average and arr.dtype.kind != "f":
        raise TypeError(
            f"allreduce: averaging needs a float array, got {arr.dtype}; use op=hvd.Sum"
        )
    if arr.dtype.kind == "b":
        raise TypeError("allreduce: bool arrays cannot be reduced; cast them to int32")
    s_name = name or "unnamed"
    agree("allreduce", f"{s_name} {op} {_layout(arr)}")
    return _reduce_in_place(arr, op, wire16)


def _np_allgather(arr, name):
    s = require()
    if arr.ndim == 0:
        arr = arr.reshape(1)
    agree(
        "allgather",
        f"{name or 'unnamed'} {arr.dtype.name}[*, {list(arr.shape[1:])}]",
        f"{name or 'unnamed'} {_layout(arr)}",
    )
    if s.size == 1:
        return arr.copy()
    rows = s.comm.allgather(arr.shape[0])
    out = np.empty((sum(rows),) + arr.shape[1:], dtype=arr.dtype)
    row_bytes = arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
    counts = [r * row_bytes for r in rows]
    s.comm.Allgatherv(arr.view(np.uint8).reshape(-1), [out.view(np.uint8).reshape(-1), counts])
    return out


def _np_broadcast(arr, root_rank, name):
    s = require()
    _check_root(root_rank)
    agree("broadcast", f"{name or 'unnamed'} root {root_rank} {_layout(arr)}")
    if s.size > 1 and arr.size:
        s.comm.Bcast(arr.view(np.uint8).reshape(-1), root=root_rank)
    return arr


def _check_root(root_rank):
    s = require()
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < s.size:
        raise ValueError(f"root_rank must be a rank in [0, {s.size}), got {root_rank!r}")


# ---------------------------------------------------------------- graph ops


class _Collective:
    """The runner of a host-callback node: ``call`` runs the collective on this rank's
    value, ``vjp`` the collective of its gradient (every rank runs both in the same order)."""

    def __init__(self, kind, op=None, name=None, root_rank=None, wire16=False):
        self.kind = kind
        self.op = op
        self.name = name
        self.root_rank = root_rank
        self.wire16 = wire16  # float16 values cross the wire as float16

    def call(self, arrays):
        (x,) = arrays
        x = np.ascontiguousarray(x)
        if self.kind == "allreduce":
            return [_np_allreduce(x, self.op, self.name, self.wire16)]
        if self.kind == "allgather":
            return [_np_allgather(x, self.name)]
        return [_np_broadcast(x, self.root_rank, self.name)]

    def vjp(self, arrays, grads):
        (x,) = arrays
        (g,) = grads
        g = np.array(g, dtype=x.dtype, order="C", copy=True)
        grad_name = f"{self.name or 'unnamed'}/grad"
        if self.kind == "allreduce":
            if self.op in (Min, Max):
                raise TypeError(f"allreduce with op={self.op!r} has no gradient")
            return [_np_allreduce(g, self.op, grad_name, self.wire16)]
        g = _np_allreduce(g, Sum, grad_name)
        if self.kind == "broadcast":
            return [g if require().rank == self.root_rank else np.zeros_like(g)]
        # allgather: this rank's rows of the summed gradient.
        s = require()
        rows = x.shape[0] if x.ndim else 1
        offsets = np.cumsum([0] + s.comm.allgather(rows))
        mine = g[offsets[s.rank] : offsets[s.rank + 1]]
        return [mine.reshape(x.shape)]


def _host(kind, x, shape, label, **kw):
    x = _t(x)
    res = _core.host_call(label, _Collective(kind, **kw), [x._core], [(shape, x.dtype)])
    return wrap(res[0])


def _is_symbolic(x):
    return isinstance(x, Tensor)


def allreduce(value, average=None, name=None, op=None, compression=None):
    """Reduces ``value`` over all ranks; every rank gets the result.

    Arguments:
        value: A ferrokeras tensor (builds a graph op, run when the graph runs) or a NumPy
            array / number (reduced now).
        average: True (default) for the mean over ranks, False for the sum; the older
            spelling of ``op``.
        name: A name; ranks must use the same one at the same collective.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Min`` or ``hvd.Max``.
        compression: ``hvd.Compression.none`` (default, exact) or
            ``hvd.Compression.fp16`` (float values cross the wire as float16; the result
            has ``value``'s dtype and float16's precision).

    Returns:
        A tensor of ``value``'s shape, or a NumPy array. The graph op is differentiable
        for Average and Sum: its gradient is the same reduction of the incoming gradient.
    """
    op = _resolve_op(op, average, "allreduce")
    compression = _check_compression(compression, "allreduce")
    # float16 from a compressor crosses the wire as float16; float16 values themselves,
    # uncompressed, are reduced in float32.
    wire16 = compression is not NoneCompressor
    require()
    if _is_symbolic(value):
        if op == Average and not value.dtype.startswith("float"):
            raise TypeError(
                f"allreduce: averaging needs a float tensor, got {value.dtype}; use op=hvd.Sum"
            )
        wire, ctx = compression.compress(value)
        out = _host(
            "allreduce", wire, list(wire.shape), "allreduce", op=op, name=name, wire16=wire16
        )
        return compression.decompress(out, ctx)
    wire, ctx = compression.compress(_as_numeric(value, "allreduce"))
    wire = np.array(wire, order="C", copy=True)
    return compression.decompress(_np_allreduce(wire, op, name, wire16), ctx)


def allgather(value, name=None):
    """Concatenates every rank's ``value`` along the first axis, in rank order.

    The first dimension may differ between ranks; the others and the dtype must agree.
    Tensors give a graph op (differentiable: each rank gets the rows of the summed
    gradient that came from its own value), arrays are gathered now.
    """
    require()
    if _is_symbolic(value):
        shape = list(value.shape)
        if not shape:
            raise ValueError("allgather: the tensor needs at least one dimension")
        return _host("allgather", value, [None] + shape[1:], "allgather", name=name)
    return _np_allgather(_as_numeric(value, "allgather"), name)


def broadcast(value, root_rank, name=None):
    """Every rank gets ``root_rank``'s ``value`` (each rank passes a value of the same
    shape and dtype). Tensors give a graph op whose gradient is the sum of the ranks'
    gradients on ``root_rank`` and zero elsewhere; arrays are broadcast now."""
    _check_root(root_rank)
    if _is_symbolic(value):
        return _host(
            "broadcast", value, list(value.shape), "broadcast", root_rank=root_rank, name=name
        )
    return _np_broadcast(np.array(value, order="C", copy=True), root_rank, name)


def broadcast_variables(variables, root_rank):
    """Sets every variable in ``variables`` to its value on ``root_rank`` (one ``Bcast``
    per dtype). The ranks must pass variables of the same shapes and dtypes, in the
    same order; otherwise every rank raises ``MismatchError`` naming them."""
    s = require()
    _check_root(root_rank)
    variables = list(variables)
    layout = ", ".join(f"{v.dtype}{list(v.shape)}" for v in variables)
    detail = ", ".join(f"{v.name} {v.dtype}{list(v.shape)}" for v in variables)
    agree("broadcast of variables", f"root {root_rank}: {layout}", f"{len(variables)}: {detail}")
    if s.size == 1 or not variables:
        return
    values = [np.asarray(v.get_value()) for v in variables]
    by_dtype = {}
    for i, a in enumerate(values):
        by_dtype.setdefault(a.dtype.str, []).append(i)
    new = [None] * len(values)
    for _, idx in sorted(by_dtype.items()):
        buf = np.concatenate([values[i].reshape(-1) for i in idx])
        if buf.size:
            s.comm.Bcast(buf.view(np.uint8), root=root_rank)
        off = 0
        for i in idx:
            n = values[i].size
            new[i] = buf[off : off + n].reshape(values[i].shape)
            off += n
    for v, a in zip(variables, new):
        v.set_value(a)


def broadcast_global_variables(root_rank):
    """Sets every live ferrokeras variable (all models' weights, optimizer state, ...) to
    its value on ``root_rank``, in creation order. Every rank must have created the same
    variables (the same script does)."""
    gc.collect()  # what is still alive must not depend on when each rank last collected
    broadcast_variables([v for _, v in sorted(LIVE_VARIABLES.items())], root_rank)


# ---------------------------------------------------------------- packed gradient average


def chunk_bytes():
    """Largest buffer the gradient average hands to one Allreduce: 128 MiB on a GPU (or
    ``FERROKERAS_GPU_MAX_BINDING`` when smaller), unlimited on the CPU, unless
    ``FERROKERAS_DIST_CHUNK_BYTES`` says otherwise."""
    env = os.environ.get("FERROKERAS_DIST_CHUNK_BYTES", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(
                f"FERROKERAS_DIST_CHUNK_BYTES must be an integer, got {env!r}"
            ) from None
        if n < 8:
            raise ValueError(f"FERROKERAS_DIST_CHUNK_BYTES must be at least 8, got {n}")
        return n
    if _core.device() == "cpu":
        return None
    limit = _GPU_CHUNK_BYTES
    cap = os.environ.get("FERROKERAS_GPU_MAX_BINDING", "").strip()
    if cap.isdigit():
        limit = min(limit, int(cap))
    return limit


class _GradientAverage:
    """Runner of the one node that sums a training step's gradients over the ranks.

    Its inputs are the packed buffers, lent by the runtime as writable arrays (the
    concatenation's own buffer, which nothing else reads: no copy), summed in place.
    Its results are the same buffers, or, with ``split`` (a list per buffer of
    ``(offset, size, shape)``), the summed gradients one by one: NumPy views of the
    buffers, which the runtime reads in place (no copy, where the node's inputs come
    from the CPU executor's own buffers; from a GPU they come as downloads).

    With ``gather`` (float16 on the wire, few ranks) the buffers are not summed but
    gathered: every result comes as ``size`` copies, one per rank in rank order (a buffer
    of ``size`` times the input's length, or each gradient ``size`` times), which the
    graph adds after decompressing them."""

    def __init__(self, layout, detail, split=None, gather=False):
        self.layout = layout
        self.detail = detail
        self.split = split
        self.gather = gather

    def _sum(self, arrays, wire16=True):
        t0 = time.perf_counter()
        # The window's slot size is part of what the ranks agree on: ranks that would
        # size (hence allocate) the window differently raise instead of waiting.
        limit = shm_slot_limit()
        agree(
            "gradient allreduce",
            f"{self.layout}; window slots {limit}",
            f"{self.detail}; FERROKERAS_DIST_SHM_BYTES={limit}",
        )
        t1 = time.perf_counter()
        out = []
        shm = None if self.gather else shared_memory()
        in_window = []
        for a in arrays:
            a = np.ascontiguousarray(a)
            if self.gather:
                rows = np.empty((S.size, a.size), a.dtype)
                S.comm.Allgather(a.reshape(-1), rows)
                out.append(rows.reshape(-1))
                continue
            if not a.flags.writeable:
                a = a.copy()
            a = a.reshape(-1)
            if shm is not None and a.dtype in SHM_DTYPES:
                in_window.append(a)  # summed below, all buffers together
                out.append(a)
            else:
                out.append(_reduce_in_place(a, Sum, wire16).reshape(-1))
        if in_window:
            shm.sum_in_place(in_window, limit)
            S.stats["window_bytes"] += sum(a.nbytes for a in in_window)
        st = S.stats
        st["steps"] += 1
        st["wait_s"] += t1 - t0
        st["allreduce_s"] += time.perf_counter() - t1
        st["bytes"] += sum(a.nbytes for a in arrays)
        st["buffers"] += len(out)
        return out

    def call(self, arrays):
        out = self._sum(arrays)
        if self.split is None:
            return out
        copies = S.size if self.gather else 1
        res = []
        for a, buf, pieces in zip(arrays, out, self.split):
            total = a.size
            buf = buf.reshape(-1)
            for off, n, shape in pieces:
                for k in range(copies):
                    start = k * total + off
                    res.append(buf[start : start + n].reshape(shape))
        return res

    def vjp(self, arrays, grads):
        # The sum over ranks is linear and self-adjoint: its gradient is the sum of the
        # incoming gradients (packed like the inputs when the results are split). Of the
        # gather, this rank's copy of the gradients summed over the ranks.
        copies = S.size if self.gather else 1
        packed = []
        if self.split is not None:
            k = 0
            for a, pieces in zip(arrays, self.split):
                rows = np.empty((copies, a.size), np.float32 if self.gather else a.dtype)
                for off, n, _ in pieces:
                    for c in range(copies):
                        rows[c, off : off + n] = np.asarray(grads[k]).reshape(-1)
                        k += 1
                packed.append(rows)
        else:
            for a, g in zip(arrays, grads):
                packed.append(np.asarray(g).reshape(copies, a.size))
        if not self.gather:
            packed = [np.array(p.reshape(-1), order="C", copy=True) for p in packed]
            summed = self._sum(packed, wire16=False)
            return [o.reshape(a.shape) for o, a in zip(summed, arrays)]
        out = []
        for a, rows in zip(arrays, packed):
            rows = np.array(rows, np.float32, order="C", copy=True)
            _reduce_in_place(rows, Sum)
            out.append(rows[S.rank].astype(a.dtype).reshape(a.shape))
        return out


def _static_size(shape):
    if any(d is None for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64))


def allreduce_gradients(grads, names=None, op=Average, compression=None):
    """Averages (``op=hvd.Average``) or sums (``hvd.Sum``) ``grads`` (tensors) over all
    ranks with one graph node.

    The gradients are compressed (``compression``: ``hvd.Compression.none``, the default,
    or ``hvd.Compression.fp16``, a cast in the graph), flattened and concatenated into one
    buffer per dtype (split into chunks of at most :func:`chunk_bytes` where a size limit
    demands; without one, gradients of 256 KiB or more keep buffers of their own, no
    copy), one host node sums all buffers with one in-place ``Allreduce`` each, and
    the results are sliced, reshaped and decompressed; the average's ``1 / size`` is a
    product in the graph, which fuses with whatever reads the gradient next (the
    optimizer's update). float16 buffers from a compressor are gathered instead on up to
    three ranks (one ``Allgather`` each) and added in the graph after decompressing:
    MPICH has no fast float16 sum. On the first call and on every later one the node
    checks that all ranks have the same gradient layout. With one rank the gradients are
    returned as they are.
    """
    s = require()
    if op not in (Average, Sum):
        raise ValueError(f"allreduce_gradients: op must be hvd.Average or hvd.Sum, got {op!r}")
    compression = _check_compression(compression, "allreduce_gradients")
    grads = list(grads)
    if s.size == 1 or not grads:
        return grads
    names = list(names) if names is not None else [f"gradient {i}" for i in range(len(grads))]
    originals = grads
    compressed = [compression.compress(g) for g in grads]
    grads = [c for c, _ in compressed]
    wire16 = compression is not NoneCompressor and any(g.dtype == "float16" for g in grads)
    gather = wire16 and s.size <= _FP16_GATHER_MAX_RANKS
    copies = s.size if gather else 1
    limit_bytes = chunk_bytes()
    shapes = [tuple(g.shape) for g in grads]
    sizes = [_static_size(sh) for sh in shapes]
    # Chunks of pieces (grad index, start, stop), per dtype in first-seen order.
    chunks = []
    dtypes = []
    for g in grads:
        if g.dtype not in dtypes:
            dtypes.append(g.dtype)
    for dt in dtypes:
        limit = None
        if limit_bytes is not None:
            # A gathered chunk comes back `copies` times as long.
            limit = max(1, limit_bytes // (np.dtype(dt).itemsize * copies))
        current, used = [], 0
        for i, g in enumerate(grads):
            if g.dtype != dt or sizes[i] == 0:
                continue
            n = sizes[i]
            if n is None:  # a shape known only at run time: a buffer of its own
                chunks.append((dt, [(i, 0, None)]))
                continue
            if limit is None:
                if n * np.dtype(dt).itemsize >= _OWN_BUFFER_BYTES:
                    chunks.append((dt, [(i, 0, n)]))  # sent from its own buffer
                else:
                    current.append((i, 0, n))
                continue
            start = 0
            while start < n:
                if used == limit:
                    chunks.append((dt, current))
                    current, used = [], 0
                take = min(n - start, limit - used)
                current.append((i, start, start + take))
                used += take
                start += take
        if current:
            chunks.append((dt, current))
    flats = {i: K.reshape(g, (-1,)) for i, g in enumerate(grads) if sizes[i] != 0}
    inputs, specs = [], []
    for dt, pieces in chunks:
        parts = []
        for i, a, b in pieces:
            whole = a == 0 and (b is None or b == sizes[i])
            parts.append(flats[i] if whole else flats[i][a:b])
        if len(pieces) == 1 and pieces[0][1:] == (0, sizes[pieces[0][0]]):
            buf = grads[pieces[0][0]]  # the gradient's own buffer, lent as it is
        else:
            buf = parts[0] if len(parts) == 1 else K.concatenate(parts, axis=0)
        total = None if any(b is None for _, _, b in pieces) else sum(b - a for _, a, b in pieces)
        inputs.append(buf)
        specs.append(([None if total is None else total * copies], dt))
    layout = "; ".join(f"{g.dtype}{list(sh)}" for g, sh in zip(grads, shapes))
    detail = f"{len(grads)} gradients: " + ", ".join(
        f"{n} {g.dtype}{list(sh)}" for n, g, sh in zip(names, grads, shapes)
    )
    runner = _GradientAverage(f"{len(chunks)} buffers; {layout}", detail, gather=gather)
    # On the CPU (no size limit) the node hands back each gradient by itself; on a GPU
    # one buffer each way (one download, one upload) and slices in the graph.
    split = limit_bytes is None and all(b is not None for _, pieces in chunks for _, _, b in pieces)
    if split:
        runner.split = []
        specs = []
        for dt, pieces in chunks:
            off, mine = 0, []
            for i, a, b in pieces:
                mine.append((off, b - a, shapes[i]))
                specs.extend([(list(shapes[i]), dt)] * copies)
                off += b - a
            runner.split.append(mine)
    res = _core.host_call("gradient_allreduce", runner, [b._core for b in inputs], specs)
    outs = [wrap(r) for r in res]
    # The pieces of each gradient, each as `copies` tensors (one per rank when gathered).
    parts_of = {}
    if split:
        k = 0
        for _, pieces in chunks:
            for i, _, _ in pieces:
                parts_of[i] = [outs[k : k + copies]]
                k += copies
    else:
        for (_, pieces), out in zip(chunks, outs):
            rows = K.reshape(out, (copies, -1)) if gather else None
            off = 0
            for i, a, b in pieces:
                if b is None or len(pieces) == 1:
                    whole = [rows[k] for k in range(copies)] if gather else [out]
                    parts_of.setdefault(i, []).append(whole)
                    continue
                n = b - a
                if gather:
                    parts = [rows[k][off : off + n] for k in range(copies)]
                else:
                    parts = [out[off : off + n]]
                parts_of.setdefault(i, []).append(parts)
                off += n
    result = []
    for i, (g, (_, ctx)) in enumerate(zip(grads, compressed)):
        if sizes[i] == 0:
            result.append(originals[i])
            continue
        pieces = []
        for copies_of_piece in parts_of[i]:
            summed = compression.decompress(copies_of_piece[0], ctx)
            for c in copies_of_piece[1:]:
                summed = summed + compression.decompress(c, ctx)
            pieces.append(summed)
        flat = (
            pieces[0]
            if len(pieces) == 1
            else K.concatenate([K.reshape(p, (-1,)) for p in pieces], axis=0)
        )
        shape = shapes[i] if sizes[i] is not None else K.shape(g)
        g_sum = K.reshape(flat, shape)
        dtype = originals[i].dtype
        result.append(g_sum * K.constant(1.0 / s.size, dtype=dtype) if op == Average else g_sum)
    return result
