"""Run under mpiexec by tests/test_distributed.py: the collectives on arrays and as graph
ops, checked against NumPy on every rank. Prints `COLLECTIVES OK <rank>` at the end."""

import os

import ferrokeras.distributed as hvd
import numpy as np
from ferrokeras import backend as K

hvd.init()
r, n = hvd.rank(), hvd.size()
assert 0 <= r < n and n == int(os.environ["EXPECTED_SIZE"]), (r, n)
assert hvd.local_size() == n and hvd.local_rank() == r  # one machine

# allreduce on arrays: exact sums of integers and of floats that add exactly.
ints = np.arange(10, dtype=np.int64) * (r + 1)
np.testing.assert_array_equal(hvd.allreduce(ints, op=hvd.Sum), np.arange(10) * sum(range(1, n + 1)))
np.testing.assert_array_equal(ints, np.arange(10) * (r + 1))  # the input is not changed
f32 = np.full((3, 4), 0.5 * (r + 1), dtype=np.float32)
total = hvd.allreduce(f32, average=False)
assert total.dtype == np.float32
np.testing.assert_array_equal(total, np.full((3, 4), 0.5 * n * (n + 1) / 2, np.float32))
np.testing.assert_allclose(hvd.allreduce(f32), np.full((3, 4), 0.25 * (n + 1)), rtol=1e-7)
np.testing.assert_array_equal(hvd.allreduce(np.array([r, -r]), op=hvd.Max), [n - 1, 0])
np.testing.assert_array_equal(hvd.allreduce(np.array([r, -r]), op=hvd.Min), [0, -(n - 1)])
half = hvd.allreduce(np.full(5, r, np.float16))
assert half.dtype == np.float16
np.testing.assert_allclose(half, (n - 1) / 2)

# allgather with a different first dimension per rank; broadcast from the last rank.
gathered = hvd.allgather(np.full((r + 1, 2), r, dtype=np.int32))
expect = np.concatenate([np.full((k + 1, 2), k, np.int32) for k in range(n)])
np.testing.assert_array_equal(gathered, expect)
np.testing.assert_array_equal(hvd.broadcast(np.full(3, float(r)), n - 1), np.full(3, n - 1.0))

# Graph ops and their gradients (Horovod's rules).
x = K.placeholder(shape=(None, 3))
y = hvd.allreduce(x * 2.0, name="twice")
f = K.function([x], [y, K.gradients(K.sum(y * y), [x])[0]])
yv, gv = f([np.full((2, 3), r + 1, np.float32)])
mean = (n + 1) / 2  # average of 1..n
np.testing.assert_allclose(yv, np.full((2, 3), 2 * mean), rtol=1e-6)
# d/dx_r of sum over ranks of sum(y^2) = mean over ranks of 2y, times 2.
np.testing.assert_allclose(gv, np.full((2, 3), 8 * mean), rtol=1e-6)
s = hvd.allreduce(x, op=hvd.Sum)
np.testing.assert_allclose(
    K.function([x], [K.gradients(K.sum(s), [x])[0]])([np.ones((1, 3), np.float32)])[0], n
)
ga = hvd.allgather(x, name="rows")
gav, ggv = K.function([x], [ga, K.gradients(K.sum(ga * ga), [x])[0]])(
    [np.full((r + 1, 3), r + 1, np.float32)]
)
rows = np.concatenate([np.full((k + 1, 3), k + 1, np.float32) for k in range(n)])
np.testing.assert_array_equal(gav, rows)
np.testing.assert_allclose(ggv, np.full((r + 1, 3), 2 * n * (r + 1)))  # summed over ranks
b = hvd.broadcast(x, 0)
bv, bg = K.function([x], [b, K.gradients(K.sum(b * 3.0), [x])[0]])([np.full((2, 3), r, "float32")])
np.testing.assert_array_equal(bv, np.zeros((2, 3)))
np.testing.assert_array_equal(bg, np.full((2, 3), 3.0 * n if r == 0 else 0.0))

# Variables: broadcast makes every rank's values rank 0's.
w = K.variable(np.full((4, 3), r, np.float32), name="w")
c = K.variable(np.full(2, r * 10, np.int32), name="c")
hvd.broadcast_variables([w, c], 0)
np.testing.assert_array_equal(K.get_value(w), np.zeros((4, 3)))
np.testing.assert_array_equal(K.get_value(c), np.zeros(2))
v = K.variable(np.full(3, r + 7.0, np.float32))
hvd.broadcast_global_variables(n - 1)
np.testing.assert_array_equal(K.get_value(v), np.full(3, n + 6.0))

# The packed gradient average: one node, any chunking, the same result.
rng = np.random.RandomState(r)
grads_in = [
    K.placeholder(shape=(5, 7)),
    K.placeholder(shape=(13,)),
    K.placeholder(shape=(2, 3, 4)),
    K.placeholder(shape=(1,), dtype="float64"),
]
values = [rng.rand(*[d for d in t.shape]).astype(t.dtype) for t in grads_in]
expected = [hvd.allreduce(v) for v in values]


def check_vjp(outs, rtol):
    # Differentiable as the average is: d/dx of the ranks' sum(out * (rank + 1)) is the
    # mean of 1..n on every rank.
    loss = sum(K.cast(K.sum(o * K.constant(r + 1.0, dtype=o.dtype)), "float32") for o in outs)
    for gv in K.function(grads_in, K.gradients(loss, grads_in))(values):
        np.testing.assert_allclose(gv, np.full(gv.shape, (n + 1) / 2), rtol=rtol)


CASES = [
    # (FERROKERAS_DIST_CHUNK_BYTES, own-buffer threshold, FERROKERAS_DIST_SHM_BYTES)
    ("", 1 << 18, ""),
    ("", 64, ""),
    ("40", 64, ""),
    ("8", 1 << 18, ""),
    # Slots of 64 bytes: every buffer crosses slots, pieces of two dtypes share one.
    ("", 64, "64"),
    ("40", 1 << 18, "64"),
    # The window off: every buffer through MPI_Allreduce.
    ("", 64, "0"),
]
for limit, own, shm in CASES:
    # `own`: gradients of this many bytes or more are summed in their own buffers
    # (without a size limit): here none, or the two largest.
    hvd._ops._OWN_BUFFER_BYTES = own
    os.environ["FERROKERAS_DIST_CHUNK_BYTES"] = limit
    os.environ["FERROKERAS_DIST_SHM_BYTES"] = shm
    before = hvd._comm.S.counts.get("gradient allreduce", 0)
    outs = hvd.allreduce_gradients(grads_in)
    window = hvd.stats()["window_bytes"]
    got = K.function(grads_in, outs)(values)
    # On one machine every buffer is summed through the shared-memory window, unless
    # FERROKERAS_DIST_SHM_BYTES=0.
    in_window = hvd.stats()["window_bytes"] - window
    assert in_window == (0 if shm == "0" else sum(v.nbytes for v in values)), in_window
    assert hvd._comm.S.counts["gradient allreduce"] == before + 1, "one collective node"
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-6)
    # Every rank holds the same sums, bit for bit.
    for g in got:
        np.testing.assert_array_equal(hvd.broadcast(g, 0), g)
    check_vjp(outs, 1e-6)
os.environ.pop("FERROKERAS_DIST_CHUNK_BYTES")
os.environ.pop("FERROKERAS_DIST_SHM_BYTES")
# With the window: the sum of float32 values whose additions round, against the exact
# float64 sum of the same values, on a buffer larger than a slot.
os.environ["FERROKERAS_DIST_SHM_BYTES"] = "4096"
big = K.placeholder(shape=(3000,))
vals32 = np.random.RandomState(20 + r).uniform(-1, 1, 3000).astype(np.float32)
(summed,) = K.function([big], hvd.allreduce_gradients([big], op=hvd.Sum))([vals32])
exact64 = hvd.allreduce(vals32.astype(np.float64), op=hvd.Sum)
np.testing.assert_allclose(summed, exact64, rtol=0, atol=n * 2e-7)
np.testing.assert_array_equal(hvd.broadcast(summed, 0), summed)
os.environ.pop("FERROKERAS_DIST_SHM_BYTES")
try:
    os.environ["FERROKERAS_DIST_SHM_BYTES"] = "12"
    K.function([big], hvd.allreduce_gradients([big]))([vals32])
    raise AssertionError("a slot below 64 bytes is refused")
except ValueError as e:
    assert "FERROKERAS_DIST_SHM_BYTES" in str(e), e
finally:
    os.environ.pop("FERROKERAS_DIST_SHM_BYTES")

# Compression.fp16: float16 on the wire, the result in the value's dtype, equal to the
# float32 average within float16's rounding (of each rank's value and of the result).
fp16 = hvd.Compression.fp16
vals = np.random.RandomState(10 + r).uniform(-3, 3, (4, 33)).astype(np.float32)
exact = hvd.allreduce(vals)
tol = dict(rtol=2e-3, atol=2e-3)
for gather_max in (3, 1):  # Allgather and added in float32, or the float16 Allreduce
    hvd._ops._FP16_GATHER_MAX_RANKS = gather_max
    got = hvd.allreduce(vals, compression=fp16)
    assert got.dtype == np.float32 and got.shape == vals.shape
    np.testing.assert_allclose(got, exact, **tol)
    assert not np.array_equal(got, exact)  # float16 precision, not float32's
    np.testing.assert_allclose(hvd.allreduce(vals, op=hvd.Sum, compression=fp16), exact * n, **tol)
    # As a graph op, with its gradient (compressed the same way).
    t = K.placeholder(shape=(4, 33))
    ta = hvd.allreduce(t * 2.0, compression=fp16)
    tv, tg = K.function([t], [ta, K.gradients(K.sum(ta * ta), [t])[0]])([vals])
    assert tv.dtype == np.float32
    np.testing.assert_allclose(tv, 2 * exact, rtol=2e-3, atol=4e-3)
    np.testing.assert_allclose(tg, 8 * exact, rtol=4e-3, atol=2e-2)
    # The packed gradient average, on any chunking, within float16 rounding of the exact.
    for limit, own in (("", 1 << 18), ("", 64), ("40", 64), ("8", 1 << 18)):
        hvd._ops._OWN_BUFFER_BYTES = own
        os.environ["FERROKERAS_DIST_CHUNK_BYTES"] = limit
        outs = hvd.allreduce_gradients(grads_in, compression=fp16)
        got = K.function(grads_in, outs)(values)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=2e-3, atol=2e-3)
        assert any(not np.array_equal(g, e) for g, e in zip(got, expected))
        check_vjp(outs, 1e-3)
    os.environ.pop("FERROKERAS_DIST_CHUNK_BYTES")
hvd._ops._FP16_GATHER_MAX_RANKS = 3
hvd._ops._OWN_BUFFER_BYTES = 1 << 18
try:
    hvd.allreduce(vals, compression="fp16")
    raise AssertionError("a compression that is not a compressor is refused")
except TypeError as e:
    assert "hvd.Compression.fp16" in str(e), e

# Sharding: rank r takes samples r, r + n, ...; equal lengths.
data = np.arange(10 * n + n - 1)
mine = hvd.shard(data)
assert len(mine) == 10 and (mine == np.arange(r, 10 * n, n)).all()
assert len(hvd.shard(data, drop_remainder=False)) == (11 if r < n - 1 else 10)

print(f"COLLECTIVES OK {r}", flush=True)
