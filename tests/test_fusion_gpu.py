"""Sums and means folded into the GPU's fused elementwise kernel that computes their input.

On the GPU a `sum`, `mean` or gradient `sum_to` of a fused group's member runs in the
group's generated kernel: over leading axes (bias gradients, batch-norm statistics) a
workgroup takes a block of columns, its threads splitting the rows; over trailing axes
(row sums and means) a workgroup takes whole rows; the threads' partial sums meet in a
tree in workgroup memory, and a member read by nothing but its sums is never written
out. Shapes that do not suit that kernel (a middle axis, sums of one member over
different axis blocks, members whose runtime shapes differ, more buffers than the adapter
binds) run the group and each reduction as kernels of their own.

Every test switches to a GPU explicitly and back, so the file runs the same in the cpu
and the gpu pass of `make test`; without a GPU adapter it is skipped, unless
FERROKERAS_REQUIRE_GPU=1. Results are compared with NumPy in float64 and with the CPU
device's; gradients with central finite differences of a float64 NumPy forward.
"""

import ferrokeras
import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import numeric_grad


def close(got, want, rtol=2e-5):
    want = np.asarray(want, dtype="float64")
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def on_both(f, feeds):
    """`f`'s results and launches on the GPU (the current device), and its results on
    the CPU device, which must agree within float32 tolerance."""
    gpu_out = f(feeds)
    launches = f.dispatches
    ferrokeras.set_device("cpu")
    try:
        cpu_out = f(feeds)
    finally:
        ferrokeras.set_device("gpu")
    for g, c in zip(gpu_out, cpu_out):
        close(g, c, rtol=1e-4)
    return gpu_out, launches


def f64(*xs):
    return [x.astype("float64") for x in xs]


@pytest.mark.parametrize("rows", [1, 7, 300, 2000])
@pytest.mark.parametrize("cols", [1, 3, 17, 300])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_leading_fold(gpu, rng, rows, cols, op):
    # [rows, cols] -> [cols]: a workgroup per block of columns, its threads taking rows.
    xv = rng.standard_normal((rows, cols)).astype("float32")
    yv = rng.standard_normal((rows, cols)).astype("float32")
    x, y = K.placeholder(shape=(None, cols)), K.placeholder(shape=(None, cols))
    f = K.function([x, y], [getattr(K, op)(K.exp(x * 0.5) * y - x, axis=0)])
    (out,), launches = on_both(f, [xv, yv])
    xd, yd = f64(xv, yv)
    close(out, getattr(np, op)(np.exp(xd * 0.5) * yd - xd, axis=0))
    assert launches == 1


@pytest.mark.parametrize("rows", [1, 7, 1000])
@pytest.mark.parametrize("width", [1, 7, 256, 3000])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_trailing_fold(gpu, rng, rows, width, op):
    # [rows, width] -> [rows]: a workgroup per row (or per block of short rows).
    xv = rng.standard_normal((rows, width)).astype("float32")
    x = K.placeholder(shape=(None, width))
    f = K.function([x], [getattr(K, op)(K.square(x) - x, axis=-1)])
    (out,), launches = on_both(f, [xv])
    xd = xv.astype("float64")
    close(out, getattr(np, op)(xd * xd - xd, axis=-1))
    assert launches == 1


@pytest.mark.parametrize(
    "shape,axis,keepdims",
    [
        ((16, 8, 8, 32), [0, 1, 2], True),  # batch-norm statistics
        ((50, 40, 3), [1, 2], True),  # rows of a 3-D tensor
        ((9, 10, 11), None, False),  # everything: one row
        ((), None, False),  # a scalar (an empty parameter tail before the fold layout)
        ((1, 20, 1, 30), [0, 1], False),  # size-1 dims on either side
        ((20, 1, 30, 1), [2, 3], False),
    ],
)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_fold_over_axis_blocks(gpu, rng, shape, axis, keepdims, op):
    xv = rng.standard_normal(shape).astype("float32")
    x = K.placeholder(shape=shape)
    red = getattr(K, op)(K.tanh(x) * 3.0 + 1.0, axis=axis, keepdims=keepdims)
    f = K.function([x], [red])
    (out,), launches = on_both(f, [xv])
    ax = tuple(axis) if isinstance(axis, list) else axis
    close(out, getattr(np, op)(np.tanh(xv.astype("float64")) * 3 + 1, axis=ax, keepdims=keepdims))
    assert launches == 1


@pytest.mark.parametrize(
    "shape,axis", [((5000, 17), 0), ((5000, 300), 0), ((64, 8, 8, 32), [0, 1, 2])]
)
def test_long_reductions_over_few_outputs_run_apart(gpu, rng, shape, axis):
    # More than 128 elements a thread of the folding kernel: the group and a reduction
    # of its own, which spreads the long sums over the device.
    xv = rng.standard_normal(shape).astype("float32")
    x = K.placeholder(shape=shape)
    f = K.function([x], [K.mean(K.tanh(x) * 3.0 + 1.0, axis=axis)])
    (out,), launches = on_both(f, [xv])
    ax = tuple(axis) if isinstance(axis, list) else axis
    close(out, np.mean(np.tanh(xv.astype("float64")) * 3 + 1, axis=ax))
    assert launches == 2


def test_more_rows_than_workgroups_in_one_grid_dimension(gpu, rng):
    # 65600 rows of 256: one workgroup per row, more than 65535 of them (a 2-D grid).
    xv = rng.standard_normal((65600, 256)).astype("float32")
    x = K.placeholder(shape=(None, 256))
    f = K.function([x], [K.mean(x * 2.0 + 1.0, axis=-1)])
    (out,) = f([xv])
    close(out, (xv.astype("float64") * 2 + 1).mean(-1))
    assert f.dispatches == 1


def test_several_folds_and_a_returned_member(gpu, rng):
    # One group (h * e first among the results, so the plan places it before the sums of
    # h and e, and it joins both branches): h returned, e and h * e hidden, three folds
    # over the leading axis.
    xv = rng.standard_normal((129, 24)).astype("float32")
    x = K.placeholder(shape=(None, 24))
    h = K.tanh(x) * 2.0
    e = K.exp(-K.abs(x))
    f = K.function([x], [K.sum(h * e, axis=0), h, K.sum(h, axis=0), K.mean(e, axis=0)])
    (p, h_out, s, m), launches = on_both(f, [xv])
    hd = np.tanh(xv.astype("float64")) * 2
    ed = np.exp(-np.abs(xv.astype("float64")))
    close(h_out, hd)
    close(s, hd.sum(0))
    close(m, ed.mean(0))
    close(p, (hd * ed).sum(0))
    assert launches == 1


def test_hidden_member_is_not_written(gpu, rng):
    # relu(x) * w is read by its sum only: the kernel computes it and adds it up.
    xv = rng.standard_normal((40, 33)).astype("float32")
    wv = rng.standard_normal((40, 33)).astype("float32")
    x, w = K.placeholder(shape=(None, 33)), K.placeholder(shape=(None, 33))
    f = K.function([x, w], [K.sum(K.relu(x) * w, axis=-1), K.sum(K.relu(x) * w, axis=-1) * 2.0])
    (s, s2), launches = on_both(f, [xv, wv])
    ref = (np.maximum(xv.astype("float64"), 0) * wv).sum(-1)
    close(s, ref)
    close(s2, ref * 2)
    # The group with its fold, then the product by 2 (a group of another shape).
    assert launches == 2


def test_same_values_on_every_call(gpu, rng):
    # The tree's fixed order: repeated calls give identical bits.
    xv = rng.standard_normal((3000, 40)).astype("float32")
    x = K.placeholder(shape=(None, 40))
    f = K.function([x], [K.sum(x * 1.5, axis=0), K.sum(x * 1.5, axis=-1)])
    first = f([xv])
    for _ in range(3):
        for a, b in zip(first, f([xv])):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_small_and_empty_batches(gpu, rng, n):
    xv = rng.standard_normal((n, 5, 4)).astype("float32")
    x = K.placeholder(shape=(None, 5, 4))
    f = K.function([x], [K.sum(K.square(x), axis=[0, 1]), K.mean(K.abs(x) + 1.0, axis=-1)])
    s, m = f([xv])
    xd = xv.astype("float64")
    close(s, (xd**2).sum((0, 1)))
    assert m.shape == (n, 5)
    if n:
        close(m, (np.abs(xd) + 1).mean(-1))


def test_middle_axis_falls_back(gpu, rng):
    # Neither a leading nor a trailing block: the group writes its hidden member, then
    # the reduction runs as its own kernel.
    xv = rng.standard_normal((9, 10, 11)).astype("float32")
    x = K.placeholder(shape=(9, 10, 11))
    f = K.function([x], [K.sum(K.exp(x * 0.5) - x, axis=1)])
    (out,), launches = on_both(f, [xv])
    xd = xv.astype("float64")
    close(out, (np.exp(xd * 0.5) - xd).sum(1))
    assert launches == 2


def test_mixed_fold_kinds_fall_back(gpu, rng):
    # Sums of one member over the leading and over the trailing axis: the group and two
    # reductions.
    xv = rng.standard_normal((37, 21)).astype("float32")
    x = K.placeholder(shape=(None, 21))
    t = K.sigmoid(x) * 4.0
    f = K.function([x], [K.sum(t, axis=0), K.mean(t, axis=-1)])
    (cols, rows), launches = on_both(f, [xv])
    td = 4.0 / (1.0 + np.exp(-xv.astype("float64")))
    close(cols, td.sum(0))
    close(rows, td.mean(-1))
    assert launches == 3


def test_member_shapes_differing_at_run_time_fall_back(gpu, rng):
    # u and w share the static shape (None, 3); with a of one row u is (1, 3) and w is
    # (4, 3): the group runs member by member and the sums on their own.
    a = K.placeholder(shape=(None, 3))
    b = K.placeholder(shape=(None, 3))
    u = a * 2.0
    w = u + b
    f = K.function([a, b], [K.sum(w, axis=0), K.sum(u, axis=-1)])
    for rows in (1, 4):
        av = rng.standard_normal((rows, 3)).astype("float32")
        bv = rng.standard_normal((4, 3)).astype("float32")
        (s, r), _ = on_both(f, [av, bv])
        close(s, (av.astype("float64") * 2 + bv).sum(0))
        close(r, (av.astype("float64") * 2).sum(-1))


def test_many_inputs_beyond_the_buffer_limit(gpu, rng):
    # Seven inputs, an output and four folds bind more storage buffers than a kernel
    # may on many adapters: the kernel checks the limit and falls back where needed.
    xs = [K.placeholder(shape=(None, 6)) for _ in range(7)]
    vs = [rng.standard_normal((50, 6)).astype("float32") for _ in range(7)]
    t = xs[0]
    for x in xs[1:]:
        t = t * 0.5 + x
    e = K.exp(-K.abs(t))
    outs = [t, K.sum(t, axis=0), K.mean(e, axis=0), K.sum(t * e, axis=0), K.sum(t - e, axis=0)]
    f = K.function(xs, outs)
    got, _ = on_both(f, vs)
    td = vs[0].astype("float64")
    for v in vs[1:]:
        td = td * 0.5 + v
    ed = np.exp(-np.abs(td))
    for g, want in zip(got, [td, td.sum(0), ed.mean(0), (td * ed).sum(0), (td - ed).sum(0)]):
        close(g, want)


def numeric(fn, arrays, index, eps=1e-3):
    """Central finite differences of the float64 scalar `fn(*arrays)` w.r.t. `arrays[index]`."""
    base = [a.astype("float64").copy() for a in arrays]
    flat = base[index].reshape(-1)
    grad = np.zeros(flat.size)
    for k in range(flat.size):
        orig = flat[k]
        flat[k] = orig + eps
        plus = fn(*base)
        flat[k] = orig - eps
        minus = fn(*base)
        flat[k] = orig
        grad[k] = (plus - minus) / (2 * eps)
    return grad.reshape(base[index].shape)


def test_bias_gradient_matches_finite_differences(gpu, rng):
    # The Dense bias gradient sum_to(dy * relu'(z)) folds into the activation gradient's
    # group.
    xv = rng.standard_normal((13, 6)).astype("float32")
    wv = rng.standard_normal((6, 5)).astype("float32")
    bv = rng.standard_normal(5).astype("float32")
    pv = rng.uniform(0.5, 1.5, (13, 5)).astype("float32")
    x = K.placeholder(shape=(None, 6))
    w, b = K.variable(wv), K.variable(bv)
    loss = K.sum(K.tanh(K.dot(x, w) + b) * K.constant(pv))
    gw, gb = K.gradients(loss, [w, b])
    f = K.function([x], [gw, gb])
    (gwv, gbv), _ = on_both(f, [xv])

    def fwd(x_, w_, b_):
        return float(np.sum(np.tanh(x_ @ w_ + b_) * pv))

    close(gbv, numeric(fwd, [xv, wv, bv], 2), rtol=1e-3)
    close(gwv, numeric(fwd, [xv, wv, bv], 1), rtol=1e-3)


def test_batch_norm_statistics_and_gradients(gpu, rng):
    """Keras' batch-norm training path: mean, variance, normalised output and the
    gradients w.r.t. x, gamma and beta (several folds in a group, hidden members),
    against NumPy and finite differences."""
    shape = (6, 3, 3, 4)
    xv = (rng.standard_normal(shape) * 2 + 1).astype("float32")
    pv = rng.uniform(0.5, 1.5, shape).astype("float32")
    gv = rng.uniform(0.5, 1.5, 4).astype("float32")
    bv = rng.standard_normal(4).astype("float32")
    x = K.placeholder(shape=(None,) + shape[1:])
    gamma, beta = K.variable(gv), K.variable(bv)
    normed, mean, var = K.normalize_batch_in_training(x, gamma, beta, [0, 1, 2], epsilon=1e-3)
    loss = K.sum(K.tanh(normed) * K.constant(pv))
    gx, gg, gb = K.gradients(loss, [x, gamma, beta])
    f = K.function([x], [normed, mean, var, gx, gg, gb])
    (n_out, m_out, v_out, gxv, ggv, gbv), _ = on_both(f, [xv])

    def fwd_parts(x_, g_, b_):
        m = x_.mean((0, 1, 2))
        v = ((x_ - m) ** 2).mean((0, 1, 2))
        return m, v, (x_ - m) / np.sqrt(v + 1e-3) * g_ + b_

    def fwd(x_, g_, b_):
        return float(np.sum(np.tanh(fwd_parts(x_, g_, b_)[2]) * pv))

    m, v, n = fwd_parts(*f64(xv, gv, bv))
    close(m_out, m)
    close(v_out, v)
    close(n_out, n, rtol=1e-4)
    close(gxv, numeric(fwd, [xv, gv, bv], 0), rtol=1e-3)
    close(ggv, numeric(fwd, [xv, gv, bv], 1), rtol=1e-3)
    close(gbv, numeric(fwd, [xv, gv, bv], 2), rtol=1e-3)


def test_a_training_step_matches_the_cpu(gpu, rng):
    # A Dense + BatchNormalization step (the statistics, the bias and batch-norm
    # gradients and the loss mean fold): the loss and updated weights match the CPU's.
    keras = pytest.importorskip("keras")
    from keras import layers

    model = keras.models.Sequential(
        [
            layers.Dense(16, input_shape=(8,)),
            layers.BatchNormalization(),
            layers.Activation("relu"),
            layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile("sgd", "categorical_crossentropy")
    xv = rng.standard_normal((32, 8)).astype("float32")
    yv = np.eye(3, dtype="float32")[rng.integers(0, 3, 32)]
    before = [w.copy() for w in model.get_weights()]
    loss_gpu = model.train_on_batch(xv, yv)
    after_gpu = model.get_weights()
    model.set_weights(before)
    ferrokeras.set_device("cpu")
    try:
        loss_cpu = model.train_on_batch(xv, yv)
        after_cpu = model.get_weights()
    finally:
        ferrokeras.set_device("gpu")
    close(loss_gpu, loss_cpu, rtol=1e-4)
    for a, c in zip(after_gpu, after_cpu):
        close(a, c, rtol=1e-4)


# Strided operands: a slice that is not one run of elements (columns of a matrix, a
# strided or a middle-axis slice) read by generated kernels only is no kernel of its own:
# each kernel reads it from the buffer it is a slice of, through strides and an offset in
# its parameters; a slice's gradient read by generated kernels only is read as its
# gradient inside a block, zero outside it. Anything else reading them writes them out.


def _col_slices(z, specs):
    return [z[:, a:b] for a, b in specs]


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_column_slices_are_read_in_place(gpu, rng, rows):
    # Columns 3:10, 11:18 and 20:27 of a product of width 29: offsets and widths of no
    # convenient size. One product and one fused kernel, no slice kernel.
    xv = rng.standard_normal((rows, 6)).astype("float32")
    wv = rng.standard_normal((6, 29)).astype("float32")
    x, w = K.placeholder(shape=(None, 6)), K.placeholder(shape=(6, 29))
    a, b, c = _col_slices(K.dot(x, w), [(3, 10), (11, 18), (20, 27)])
    f = K.function([x, w], [K.sigmoid(a) * K.tanh(b) + c])
    (out,), launches = on_both(f, [xv, wv])
    z = xv.astype("float64") @ wv.astype("float64")
    sig = 1 / (1 + np.exp(-z[:, 3:10]))
    close(out, sig * np.tanh(z[:, 11:18]) + z[:, 20:27])
    assert launches == 2, launches


def test_strided_middle_axis_and_broadcast_slices(gpu, rng):
    # A step-3 slice of columns, a slice of a middle axis, and a one-row slice broadcast
    # over the rows of another operand.
    xv = rng.standard_normal((4, 5, 23)).astype("float32")
    yv = rng.standard_normal((4, 7)).astype("float32")
    vv = rng.standard_normal((3, 19)).astype("float32")
    x = K.placeholder(shape=(None, 5, 23))
    y, v = K.placeholder(shape=(None, 7)), K.placeholder(shape=(3, 19))
    x2, v2 = K.exp(x * 0.25), v * 3.0
    s1 = x2[:, 1:4, 2:23:3]  # [B, 3, 7]
    s2 = x2[:, 2, 5:12]  # [B, 7]
    s3 = v2[1:2, 9:16]  # [1, 7]
    f = K.function([x, y, v], [s1 * K.expand_dims(s2 * y + s3, 1)])
    (out,), launches = on_both(f, [xv, yv, vv])
    x64, v64 = np.exp(xv.astype("float64") * 0.25), vv.astype("float64") * 3
    want = x64[:, 1:4, 2:23:3] * (x64[:, 2, 5:12] * yv + v64[1:2, 9:16])[:, None, :]
    close(out, want)


def test_a_slice_read_by_a_product_is_written_out(gpu, rng):
    # A column slice read by a generated kernel and by a product: written out once, for
    # the product, and both read the same values.
    xv = rng.standard_normal((5, 13)).astype("float32")
    wv = rng.standard_normal((5, 4)).astype("float32")
    x, w = K.placeholder(shape=(None, 13)), K.placeholder(shape=(5, 4))
    s = (x * 2.0)[:, 3:8]
    f = K.function([x, w], [K.dot(s, w), K.tanh(s)])
    (p, t), _ = on_both(f, [xv, wv])
    s64 = xv.astype("float64")[:, 3:8] * 2
    close(p, s64 @ wv.astype("float64"))
    close(t, np.tanh(s64))


def _np_slices_loss(xv, wv):
    z = xv @ wv
    a, b, c = z[:, 3:10], z[:, 5:12], z[:, 20:27]
    return (np.tanh(a) * b + np.exp(c * 0.1) * a).sum()


def test_gradients_of_overlapping_slices(gpu, rng):
    # Overlapping column slices: their gradients (zeros but a block) add up in generated
    # kernels that read each through its block, then feed the product's gradients.
    xv = rng.standard_normal((6, 5)).astype("float32")
    wv = (rng.standard_normal((5, 29)) * 0.5).astype("float32")
    x, w = K.placeholder(shape=(None, 5)), K.placeholder(shape=(5, 29))
    z = K.dot(x, w)
    a, b, c = z[:, 3:10], z[:, 5:12], z[:, 20:27]
    loss = K.sum(K.tanh(a) * b + K.exp(c * 0.1) * a)
    f = K.function([x, w], K.gradients(loss, [x, w]))
    (gx, gw), _ = on_both(f, [xv, wv])
    x64, w64 = f64(xv, wv)
    close(gx, numeric_grad(lambda a: _np_slices_loss(a[0], w64), [x64], 0, 1e-6), rtol=1e-3)
    close(gw, numeric_grad(lambda a: _np_slices_loss(x64, a[0]), [w64], 0, 1e-6), rtol=1e-3)


def test_slice_gradients_of_a_middle_axis(gpu, rng):
    # Gradients of slices of a middle axis (one of them also of the last axis, read
    # through a broadcast), added up as blocks of the input's shape.
    xv = rng.standard_normal((3, 6, 5)).astype("float32")
    x = K.placeholder(shape=(None, 6, 5))
    y = K.exp(x * 0.3)
    s1, s2 = y[:, 1:4, :], y[:, 2:3, 1:4]
    loss = K.sum(s1 * s1) + K.sum(K.sin(s2) * K.ones((1, 4, 3)))
    f = K.function([x], K.gradients(loss, [x]))
    (gx,), _ = on_both(f, [xv])

    def np_loss(v):
        y = np.exp(v * 0.3)
        return (y[:, 1:4, :] ** 2).sum() + 4 * np.sin(y[:, 2:3, 1:4]).sum()

    close(gx, numeric_grad(lambda a: np_loss(a[0]), [xv], 0, 1e-6), rtol=1e-3)


@pytest.mark.parametrize("axis", [-1, 1])
def test_concatenation_pieces_are_written_in_place(gpu, rng, axis):
    # Pieces of widths 5, 7 and 3 (along the last axis, or a middle one), each computed
    # by a generated kernel read by the concatenation alone: each kernel writes its block
    # of the concatenation's buffer through strides, and no kernel copies the pieces.
    ax = 2 if axis == -1 else 1
    phs, vals, pieces, want = [], [], [], []
    for k, w in enumerate([5, 7, 3]):
        shape = [4, 3, 6]
        shape[ax] = w
        v = rng.standard_normal(shape).astype("float32")
        p = K.placeholder(shape=(None,) + tuple(shape[1:]))
        phs.append(p)
        vals.append(v)
        pieces.append(K.tanh(p * (k + 1.0)) + 0.5)
        want.append(np.tanh(v.astype("float64") * (k + 1.0)) + 0.5)
    cat = K.concatenate(pieces, axis=axis)
    f = K.function(phs, [cat * 2.0, K.sum(cat, axis=0)])
    (out, total), launches = on_both(f, vals)
    want = np.concatenate(want, axis=axis)
    close(out, want * 2)
    close(total, want.sum(axis=0))
    # One kernel per piece, one for `cat * 2` and the sum: no copy kernel.
    assert launches <= 5, launches


def test_pieces_of_two_concatenations_are_written_into_both(gpu, rng):
    # Pieces of widths 5 and 7 read by two concatenations (as a GRU's gate gradients
    # are): each kernel writes its piece into its blocks of both buffers, and neither
    # concatenation copies it.
    phs, vals, pieces, want = [], [], [], []
    for k, w in enumerate([5, 7, 3]):
        v = rng.standard_normal((4, w)).astype("float32")
        p = K.placeholder(shape=(None, w))
        phs.append(p)
        vals.append(v)
        pieces.append(K.sigmoid(p * (k + 1.0)))
        want.append(1 / (1 + np.exp(-v.astype("float64") * (k + 1.0))))
    wide = K.concatenate(pieces, axis=-1)
    narrow = K.concatenate(pieces[:2], axis=-1)
    f = K.function(phs, [wide * 2.0, narrow - 1.0])
    (a, b), launches = on_both(f, vals)
    close(a, np.concatenate(want, axis=-1) * 2)
    close(b, np.concatenate(want[:2], axis=-1) - 1)
    # One kernel per piece and one per result: no copy kernel.
    assert launches <= 5, launches
