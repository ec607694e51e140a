"""Shape and layout functions against NumPy.

Table-driven (CONTRIBUTING.md, "How the code reads"): one record per case names the K call, its NumPy
reference, the input shapes and whether it is differentiable. Each record drives
  - the forward test, float32 and float64, with placeholders of static shape and with
    placeholders whose every dimension is unknown (``None``) so that the run-time shape
    paths are exercised too;
  - the gradient test against central finite differences in float64.
References are written from the documented (NumPy / TF) semantics, never from ferrokeras.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import assert_mentions, check_grad, run, tolerances
from reference import np_pad, np_resize

FLOATS = ("float32", "float64")


# ---- records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    name: str
    k: Callable  # K tensors -> K tensor
    ref: Callable  # float64 arrays -> array
    shapes: tuple[tuple, ...]  # one input shape per argument
    grad: bool = True
    dynamic: bool = True  # also run with every placeholder dimension unknown

    def __repr__(self):
        return self.name


def img_axes(fmt, n):
    return tuple(range(2, 2 + n)) if fmt == "channels_first" else tuple(range(1, 1 + n))


RESIZE_RECS = (
    [
        Rec(
            f"resize_images_{interp}_{fmt}_{hf}x{wf}",
            (
                lambda hf, wf, fmt, interp: (
                    lambda x: K.resize_images(x, hf, wf, fmt, interpolation=interp)
                )
            )(hf, wf, fmt, interp),
            (
                lambda hf, wf, fmt, interp: (
                    lambda x: np_resize(x, img_axes(fmt, 2), (hf, wf), interp)
                )
            )(hf, wf, fmt, interp),
            ((2, 3, 4, 2),),
        )
        for interp in ("nearest", "bilinear")
        for fmt in ("channels_last", "channels_first")
        for hf, wf in ((2, 3), (1, 2))
    ]
    + [
        Rec(
            f"resize_volumes_{interp}_{fmt}",
            (lambda fmt, interp: lambda x: K.resize_volumes(x, 2, 1, 3, fmt, interpolation=interp))(
                fmt, interp
            ),
            (lambda fmt, interp: lambda x: np_resize(x, img_axes(fmt, 3), (2, 1, 3), interp))(
                fmt, interp
            ),
            ((1, 2, 2, 3, 2),),
        )
        for interp in ("nearest", "bilinear")
        for fmt in ("channels_last", "channels_first")
    ]
    + [
        Rec(
            "resize_volumes_default_positional",
            lambda x: K.resize_volumes(x, 1, 2, 2, "channels_last"),
            lambda x: np_resize(x, (1, 2, 3), (1, 2, 2), "nearest"),
            ((1, 2, 2, 2, 1),),
        ),
    ]
)

PAD_RECS = (
    [
        Rec(
            "temporal_padding_default",
            K.temporal_padding,
            lambda x: np_pad(x, [(1, 1)], False),
            ((2, 3, 2),),
        ),
        Rec(
            "temporal_padding_2_0",
            lambda x: K.temporal_padding(x, (2, 0)),
            lambda x: np_pad(x, [(2, 0)], False),
            ((2, 3, 2),),
        ),
        Rec(
            "spatial_2d_padding_default",
            K.spatial_2d_padding,
            lambda x: np_pad(x, [(1, 1), (1, 1)], False),
            ((1, 2, 3, 2),),
        ),
    ]
    + [
        Rec(
            f"spatial_2d_padding_{fmt}",
            (lambda fmt: lambda x: K.spatial_2d_padding(x, ((0, 2), (1, 0)), data_format=fmt))(fmt),
            (lambda fmt: lambda x: np_pad(x, [(0, 2), (1, 0)], fmt == "channels_first"))(fmt),
            ((1, 2, 3, 2),),
        )
        for fmt in ("channels_last", "channels_first")
    ]
    + [
        Rec(
            f"spatial_3d_padding_{fmt}",
            (
                lambda fmt: (
                    lambda x: K.spatial_3d_padding(x, ((1, 0), (0, 2), (1, 1)), data_format=fmt)
                )
            )(fmt),
            (lambda fmt: lambda x: np_pad(x, [(1, 0), (0, 2), (1, 1)], fmt == "channels_first"))(
                fmt
            ),
            ((1, 2, 2, 3, 2),),
        )
        for fmt in ("channels_last", "channels_first")
    ]
    + [
        Rec(
            "spatial_3d_padding_default",
            K.spatial_3d_padding,
            lambda x: np_pad(x, [(1, 1)] * 3, False),
            ((1, 2, 1, 2, 1),),
        ),
    ]
)

RECS = (
    [
        Rec(
            "repeat_elements_axis0",
            lambda x: K.repeat_elements(x, 3, axis=0),
            lambda x: np.repeat(x, 3, axis=0),
            ((2, 3),),
        ),
        Rec(
            "repeat_elements_axis1",
            lambda x: K.repeat_elements(x, 2, 1),
            lambda x: np.repeat(x, 2, axis=1),
            ((2, 3, 2),),
        ),
        Rec(
            "repeat_elements_axis_minus1",
            lambda x: K.repeat_elements(x, 2, -1),
            lambda x: np.repeat(x, 2, axis=-1),
            ((2, 3),),
        ),
        Rec(
            "repeat",
            lambda x: K.repeat(x, 3),
            lambda x: np.repeat(x[:, None, :], 3, axis=1),
            ((2, 4),),
        ),
        Rec("tile_list", lambda x: K.tile(x, [2, 3]), lambda x: np.tile(x, (2, 3)), ((2, 3),)),
        Rec("tile_int", lambda x: K.tile(x, 3), lambda x: np.tile(x, 3), ((4,),)),
        Rec(
            "tile_short_list_pads_leading_ones",
            lambda x: K.tile(x, [2]),
            lambda x: np.tile(x, (1, 2)),
            ((2, 3),),
        ),
        Rec(
            "tile_3d", lambda x: K.tile(x, (1, 2, 2)), lambda x: np.tile(x, (1, 2, 2)), ((2, 1, 3),)
        ),
        Rec("flatten", K.flatten, lambda x: x.reshape(-1), ((2, 3, 2),)),
        Rec("batch_flatten", K.batch_flatten, lambda x: x.reshape(x.shape[0], -1), ((2, 3, 2),)),
        Rec("batch_flatten_2d", K.batch_flatten, lambda x: x.reshape(x.shape[0], -1), ((3, 4),)),
        Rec("expand_dims_default", K.expand_dims, lambda x: np.expand_dims(x, -1), ((2, 3),)),
        Rec(
            "expand_dims_0",
            lambda x: K.expand_dims(x, 0),
            lambda x: np.expand_dims(x, 0),
            ((2, 3),),
        ),
        Rec(
            "squeeze",
            lambda x: K.squeeze(x, 1),
            lambda x: np.squeeze(x, 1),
            ((2, 1, 3),),
            dynamic=False,
        ),
        Rec(
            "squeeze_minus1",
            lambda x: K.squeeze(x, -1),
            lambda x: np.squeeze(x, -1),
            ((2, 3, 1),),
            dynamic=False,
        ),
        Rec(
            "reshape_minus1",
            lambda x: K.reshape(x, (-1, 6)),
            lambda x: x.reshape(-1, 6),
            ((2, 3, 2),),
        ),
        Rec(
            "reshape_minus1_middle",
            lambda x: K.reshape(x, (3, -1, 2)),
            lambda x: x.reshape(3, -1, 2),
            ((2, 3, 2),),
        ),
        Rec(
            "reshape_with_shape_tensor_entry",
            lambda x: K.reshape(x, (K.shape(x)[0], -1)),
            lambda x: x.reshape(x.shape[0], -1),
            ((2, 3, 2),),
        ),
        Rec(
            "permute_dimensions",
            lambda x: K.permute_dimensions(x, (2, 0, 1)),
            lambda x: np.transpose(x, (2, 0, 1)),
            ((2, 3, 4),),
        ),
        Rec(
            "concatenate_axis_minus1",
            lambda x, y: K.concatenate([x, y]),
            lambda x, y: np.concatenate([x, y], -1),
            ((2, 3), (2, 2)),
        ),
        Rec(
            "concatenate_axis0",
            lambda x, y: K.concatenate([x, y], axis=0),
            lambda x, y: np.concatenate([x, y], 0),
            ((2, 3), (1, 3)),
        ),
        Rec(
            "stack_axis0",
            lambda x, y: K.stack([x, y]),
            lambda x, y: np.stack([x, y]),
            ((2, 3), (2, 3)),
        ),
        Rec(
            "stack_axis_minus1",
            lambda x, y: K.stack([x, y], axis=-1),
            lambda x, y: np.stack([x, y], axis=-1),
            ((2, 3), (2, 3)),
        ),
        Rec(
            "stack_axis1_three",
            lambda x, y, z: K.stack([x, y, z], 1),
            lambda x, y, z: np.stack([x, y, z], 1),
            ((2, 3), (2, 3), (2, 3)),
        ),
        Rec("reverse_int", lambda x: K.reverse(x, 1), lambda x: np.flip(x, 1), ((2, 3, 2),)),
        Rec(
            "reverse_list",
            lambda x: K.reverse(x, [0, -1]),
            lambda x: np.flip(x, (0, 2)),
            ((2, 3, 2),),
        ),
        Rec(
            "reverse_tuple_all", lambda x: K.reverse(x, (0, 1)), lambda x: x[::-1, ::-1], ((3, 2),)
        ),
        Rec("gather_list", lambda x: K.gather(x, [2, 0, 2]), lambda x: x[[2, 0, 2]], ((3, 2),)),
        Rec(
            "gather_2d_indices",
            lambda x: K.gather(x, K.constant([[1, 0], [1, 1]], dtype="int32")),
            lambda x: x[np.array([[1, 0], [1, 1]])],
            ((2, 3),),
        ),
        Rec(
            "gather_int64_indices",
            lambda x: K.gather(x, np.array([3, 1], dtype=np.int64)),
            lambda x: x[[3, 1]],
            ((4,),),
        ),
        Rec("slice", lambda x: K.slice(x, (0, 1), (2, 2)), lambda x: x[0:2, 1:3], ((3, 4),)),
        Rec(
            "slice_minus1_size",
            lambda x: K.slice(x, [1, 0, 1], [-1, 2, -1]),
            lambda x: x[1:, 0:2, 1:],
            ((3, 2, 3),),
        ),
    ]
    + PAD_RECS
    + RESIZE_RECS
)


@pytest.mark.parametrize("mode", ("static", "dynamic"))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rec", RECS, ids=repr)
def test_forward(rec, dtype, mode, rng):
    if mode == "dynamic" and not rec.dynamic:
        pytest.skip("needs a static dimension")
    arrays = [rng.normal(size=s).astype(dtype) for s in rec.shapes]
    phs = [
        K.placeholder(shape=s if mode == "static" else (None,) * len(s), dtype=dtype)
        for s in rec.shapes
    ]
    out = rec.k(*phs)
    ref = np.asarray(rec.ref(*[a.astype(np.float64) for a in arrays]))
    shape = K.int_shape(out)
    if mode == "static":
        assert shape == ref.shape
    else:
        assert len(shape) == ref.ndim and all(d is None or d == r for d, r in zip(shape, ref.shape))
    value = run(phs, [out], arrays)[0]
    assert value.dtype == np.dtype(dtype) and value.shape == ref.shape
    rtol, atol = tolerances(dtype, 1e-6, 1e-6)
    np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("rec", [r for r in RECS if r.grad], ids=repr)
def test_gradient(rec, rng):
    check_grad(rec.k, [rng.normal(size=s) for s in rec.shapes])


def test_gradient_with_unknown_dims(rng):
    # The run-time shape paths (reshape to K.shape, broadcast_to) differentiate too.
    x = K.placeholder(ndim=3, dtype="float64")
    a = rng.normal(size=(2, 3, 2))
    for build, ref_grad in [
        (lambda t: K.repeat_elements(t, 2, 1), lambda: np.full(a.shape, 2.0)),
        (lambda t: K.tile(t, (2, 1, 3)), lambda: np.full(a.shape, 6.0)),
        (
            lambda t: K.resize_images(K.expand_dims(t, -1), 2, 2, "channels_last", "bilinear"),
            lambda: np.full(a.shape, 4.0),
        ),
        (K.batch_flatten, lambda: np.ones(a.shape)),
    ]:
        g = K.gradients(K.sum(build(x)), [x])[0]
        np.testing.assert_allclose(run([x], [g], [a])[0], ref_grad(), rtol=1e-12)


# ---- arange: every argument form --------------------------------------------------------------

ARANGE_CASES = [
    # (args, kwargs, NumPy reference): Theano/TF convention, one argument is `stop`.
    ((5,), {}, np.arange(5, dtype=np.int32)),
    ((0,), {}, np.arange(0, dtype=np.int32)),
    ((-3,), {}, np.arange(0, dtype=np.int32)),  # negative stop: empty, as TF
    ((2, 9), {}, np.arange(2, 9, dtype=np.int32)),
    ((2, 9, 3), {}, np.arange(2, 9, 3, dtype=np.int32)),
    ((9, 2, -2), {}, np.arange(9, 2, -2, dtype=np.int32)),
    ((2, 9), {"step": 2}, np.arange(2, 9, 2, dtype=np.int32)),
    ((5,), {"step": 2}, np.arange(0, 5, 2, dtype=np.int32)),
    ((3, 1), {}, np.arange(3, 1, dtype=np.int32)),  # empty
    ((4,), {"dtype": "float32"}, np.arange(4, dtype=np.float32)),
    ((4,), {"dtype": "int64"}, np.arange(4, dtype=np.int64)),
    ((0.5, 3.0, 0.5), {"dtype": "float64"}, np.arange(0.5, 3.0, 0.5)),
    ((1, 2, 0.25), {"dtype": "float32"}, np.arange(1, 2, 0.25, dtype=np.float32)),
    ((0, 2, 0.5), {}, np.arange(0, 2, 0.5).astype(np.int32)),  # float range, cast to int32
    ((2.5,), {"dtype": "float32"}, np.arange(2.5, dtype=np.float32)),
    ((np.int64(3),), {}, np.arange(3, dtype=np.int32)),
]


@pytest.mark.parametrize("args,kwargs,ref", ARANGE_CASES, ids=str)
def test_arange(args, kwargs, ref):
    out = K.arange(*args, **kwargs)
    assert K.dtype(out) == ref.dtype.name
    value = K.eval(out)
    assert value.dtype == ref.dtype
    np.testing.assert_array_equal(value, ref)


@pytest.mark.parametrize("args,kwargs,ref", [c for c in ARANGE_CASES if c[0][0] != 0.5], ids=str)
def test_arange_with_tensor_arguments(args, kwargs, ref):
    # The same forms with every argument fed at run time as a scalar placeholder.
    names = ("start", "stop", "step")
    given = dict(zip(names, args), **kwargs)
    dtype = given.pop("dtype", "int32")
    phs, feeds, call = [], [], {}
    for name in names:
        if name not in given:
            continue
        v = given[name]
        kind = "float32" if isinstance(v, float) else "int32"
        ph = K.placeholder(shape=(), dtype=kind)
        phs.append(ph)
        feeds.append(np.asarray(v, dtype=kind))
        call[name] = ph
    out = K.arange(call.pop("start"), **call, dtype=dtype)
    value = run(phs, [out], feeds)[0]
    assert value.dtype == ref.dtype
    np.testing.assert_array_equal(value, ref)


def test_arange_of_a_runtime_dimension(rng):
    x = K.placeholder(shape=(None, 3))
    out = K.arange(K.shape(x)[0])
    for n in (1, 4):
        np.testing.assert_array_equal(run([x], [out], [np.zeros((n, 3))])[0], np.arange(n))


# ---- one_hot ------------------------------------------------------------------------------------


@pytest.mark.parametrize("idx_dtype", ("int32", "int64"))
@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 1, 2)], ids=str)
def test_one_hot(shape, idx_dtype, rng):
    # TF one_hot: float32 result, a row of zeros for an index outside [0, num_classes).
    idx = rng.integers(-1, 5, size=shape).astype(idx_dtype)
    ph = K.placeholder(shape=shape, dtype=idx_dtype)
    out = K.one_hot(ph, 4)
    assert K.int_shape(out) == shape + (4,)
    value = run([ph], [out], [idx])[0]
    ref = (idx[..., None] == np.arange(4)).astype(np.float32)
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, ref)


def test_one_hot_with_unknown_batch():
    ph = K.placeholder(shape=(None,), dtype="int32")
    out = K.one_hot(ph, 3)
    assert K.int_shape(out) == (None, 3)
    np.testing.assert_array_equal(run([ph], [out], [np.array([2, 0])])[0], [[0, 0, 1], [1, 0, 0]])


# ---- slice with run-time starts -------------------------------------------------------------


def test_slice_with_tensor_start_and_size(rng):
    # tf.slice accepts tensors for start and size.
    a = rng.normal(size=(4, 5))
    x = K.placeholder(shape=(None, 5), dtype="float64")
    start = K.placeholder(shape=(), dtype="int32")
    out = K.slice(x, [start, 1], [K.shape(x)[0] - start, -1])
    value = run([x, start], [out], [a, np.int32(1)])[0]
    np.testing.assert_array_equal(value, a[1:, 1:])
    g = K.gradients(K.sum(out), [x])[0]
    ref = np.zeros_like(a)
    ref[1:, 1:] = 1
    np.testing.assert_array_equal(run([x, start], [g], [a, np.int32(1)])[0], ref)


# ---- integer and variable inputs ------------------------------------------------------------------


def test_layout_on_int_tensors():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    x = K.constant(a, dtype="int32")
    checks = [
        (K.repeat_elements(x, 2, 0), np.repeat(a, 2, 0)),
        (K.tile(x, (2, 1)), np.tile(a, (2, 1))),
        (K.reverse(x, 0), a[::-1]),
        (K.gather(x, [1]), a[[1]]),
        (K.stack([x, x], 1), np.stack([a, a], 1)),
        (
            K.temporal_padding(K.expand_dims(x), (1, 1)),
            np.pad(a[..., None], [(0, 0), (1, 1), (0, 0)]),
        ),
        (
            K.resize_images(K.reshape(x, (1, 2, 3, 1)), 2, 1, "channels_last"),
            np.repeat(a.reshape(1, 2, 3, 1), 2, 1),
        ),
    ]
    for t, ref in checks:
        v = K.eval(t)
        assert v.dtype == np.int32
        np.testing.assert_array_equal(v, ref)


def test_bilinear_resize_of_ints_is_float32():
    # tf.image.resize returns float32 for integer images.
    a = np.arange(4, dtype=np.int32).reshape(1, 2, 2, 1)
    out = K.resize_images(K.constant(a, dtype="int32"), 2, 2, "channels_last", "bilinear")
    assert K.dtype(out) == "float32"
    np.testing.assert_allclose(
        K.eval(out), np_resize(a.astype(np.float64), (1, 2), (2, 2), "bilinear"), rtol=1e-6
    )


def test_variables_and_constants_as_inputs(rng):
    a = rng.normal(size=(2, 3))
    v = K.variable(a)
    np.testing.assert_allclose(K.eval(K.repeat(v, 2)), np.repeat(a[:, None], 2, 1), rtol=1e-6)
    np.testing.assert_allclose(
        K.eval(K.batch_flatten(K.constant(a[None]))), a.reshape(1, -1), rtol=1e-6
    )


def test_batch_flatten_and_flatten_static_shapes():
    assert K.int_shape(K.batch_flatten(K.placeholder(shape=(None, 2, 3)))) == (None, 6)
    assert K.int_shape(K.flatten(K.placeholder(shape=(2, 3)))) == (6,)
    assert K.int_shape(K.repeat(K.placeholder(shape=(None, 4)), 3)) == (None, 3, 4)
    assert K.int_shape(
        K.resize_images(K.placeholder(shape=(None, 2, 3, 5)), 2, 3, "channels_last")
    ) == (None, 4, 9, 5)


# ---- bad input --------------------------------------------------------------------------------------


def _ph(*shape):
    return K.placeholder(shape=shape)


BAD = [
    ("repeat_elements_axis", lambda: K.repeat_elements(_ph(2, 3), 2, axis=2), ("axis",)),
    ("repeat_elements_negative_rep", lambda: K.repeat_elements(_ph(2, 3), -1, 0), ("rep",)),
    ("repeat_elements_float_rep", lambda: K.repeat_elements(_ph(2, 3), 1.5, 0), ("rep",)),
    ("repeat_not_2d", lambda: K.repeat(_ph(2, 3, 4), 2), ("2-d",)),
    ("tile_too_long", lambda: K.tile(_ph(2, 3), (1, 2, 3)), ("n",)),
    ("tile_negative", lambda: K.tile(_ph(2, 3), (1, -2)), ("n",)),
    ("tile_bad_type", lambda: K.tile(_ph(2, 3), "ab"), ("n",)),
    ("arange_step_zero", lambda: K.arange(0, 5, 0), ("step",)),
    ("arange_bad_start", lambda: K.arange("a"), ("start",)),
    ("arange_bad_dtype", lambda: K.arange(3, dtype="bool"), ("dtype",)),
    ("arange_tensor_not_scalar", lambda: K.arange(K.constant([1, 2], dtype="int32")), ("start",)),
    ("squeeze_not_one", lambda: K.squeeze(_ph(2, 3), 1), ("squeeze", "dimension")),
    ("squeeze_axis_range", lambda: K.squeeze(_ph(2, 1), 2), ("axis",)),
    ("batch_flatten_scalar", lambda: K.batch_flatten(K.constant(1.0)), ("batch_flatten", "scalar")),
    ("temporal_padding_rank", lambda: K.temporal_padding(_ph(2, 3), (1, 1)), ("3-d",)),
    ("temporal_padding_triple", lambda: K.temporal_padding(_ph(2, 3, 4), (1, 1, 1)), ("padding",)),
    ("temporal_padding_negative", lambda: K.temporal_padding(_ph(2, 3, 4), (1, -1)), ("padding",)),
    (
        "spatial_2d_padding_shape",
        lambda: K.spatial_2d_padding(_ph(1, 2, 2, 1), ((1, 1),)),
        ("padding",),
    ),
    (
        "spatial_2d_padding_pair",
        lambda: K.spatial_2d_padding(_ph(1, 2, 2, 1), ((1, 1), (1,))),
        ("padding",),
    ),
    (
        "spatial_2d_padding_format",
        lambda: K.spatial_2d_padding(_ph(1, 2, 2, 1), data_format="NHWC"),
        ("data_format",),
    ),
    ("spatial_2d_padding_rank", lambda: K.spatial_2d_padding(_ph(2, 2, 1)), ("4-d",)),
    (
        "spatial_3d_padding_format",
        lambda: K.spatial_3d_padding(_ph(1, 2, 2, 2, 1), data_format="x"),
        ("data_format",),
    ),
    ("spatial_3d_padding_rank", lambda: K.spatial_3d_padding(_ph(1, 2, 2, 1)), ("5-d",)),
    ("stack_empty", lambda: K.stack([]), ("stack", "empty")),
    ("stack_not_list", lambda: K.stack(_ph(2, 3)), ("list",)),
    ("stack_shapes", lambda: K.stack([_ph(2, 3), _ph(3, 2)]), ("shape",)),
    ("stack_axis", lambda: K.stack([_ph(2, 3), _ph(2, 3)], axis=3), ("axis",)),
    ("one_hot_float_indices", lambda: K.one_hot(_ph(3), 4), ("indices",)),
    (
        "one_hot_negative_classes",
        lambda: K.one_hot(K.constant([1], dtype="int32"), -1),
        ("num_classes",),
    ),
    ("reverse_axis", lambda: K.reverse(_ph(2, 3), 2), ("axes",)),
    ("reverse_duplicate", lambda: K.reverse(_ph(2, 3), [1, -1]), ("axes", "twice")),
    ("reverse_bad_type", lambda: K.reverse(_ph(2, 3), "0"), ("axes",)),
    ("gather_float_indices", lambda: K.gather(_ph(3, 2), [0.5]), ("indices",)),
    ("gather_out_of_range", lambda: K.gather(_ph(3, 2), [3]), ("indices", "range")),
    ("gather_negative", lambda: K.gather(_ph(3, 2), [-1]), ("indices", "range")),
    ("gather_scalar", lambda: K.gather(K.constant(1.0), [0]), ("reference",)),
    ("slice_length", lambda: K.slice(_ph(2, 3), (0,), (1,)), ("dimension", "size")),
    (
        "resize_images_format",
        lambda: K.resize_images(_ph(1, 2, 2, 1), 2, 2, None),
        ("data_format",),
    ),
    (
        "resize_images_format_str",
        lambda: K.resize_images(_ph(1, 2, 2, 1), 2, 2, "NCHW"),
        ("data_format",),
    ),
    (
        "resize_images_factor",
        lambda: K.resize_images(_ph(1, 2, 2, 1), 0, 2, "channels_last"),
        ("height_factor",),
    ),
    (
        "resize_images_float_factor",
        lambda: K.resize_images(_ph(1, 2, 2, 1), 2, 1.5, "channels_last"),
        ("width_factor",),
    ),
    ("resize_images_rank", lambda: K.resize_images(_ph(2, 2, 1), 2, 2, "channels_last"), ("4-d",)),
    (
        "resize_images_interpolation",
        lambda: K.resize_images(_ph(1, 2, 2, 1), 2, 2, "channels_last", interpolation="cubic"),
        ("interpolation",),
    ),
    (
        "resize_volumes_format",
        lambda: K.resize_volumes(_ph(1, 2, 2, 2, 1), 2, 2, 2, "x"),
        ("data_format",),
    ),
    (
        "resize_volumes_factor",
        lambda: K.resize_volumes(_ph(1, 2, 2, 2, 1), 2, -2, 2, "channels_last"),
        ("height_factor",),
    ),
    ("reshape_float_entry", lambda: K.reshape(_ph(2, 3), (2.5, -1)), ("shape",)),
    ("reshape_two_minus1", lambda: K.reshape(_ph(2, 3), (-1, -1)), ("-1", "reshape")),
    ("reshape_size_mismatch", lambda: K.reshape(_ph(2, 3), (4, 2)), ("reshape",)),
    ("expand_dims_axis", lambda: K.expand_dims(_ph(2, 3), 4), ("axis",)),
    (
        "concatenate_shapes",
        lambda: K.concatenate([_ph(2, 3), _ph(3, 3)], axis=1),
        ("concatenate", "shape"),
    ),
    ("concatenate_not_list", lambda: K.concatenate(_ph(2, 3)), ("list",)),
    ("concatenate_axis", lambda: K.concatenate([_ph(2, 3), _ph(2, 3)], axis=2), ("axis",)),
    ("concatenate_empty", lambda: K.concatenate([]), ("concatenate", "one tensor")),
    (
        "permute_dimensions_not_permutation",
        lambda: K.permute_dimensions(_ph(2, 3), (0, 0)),
        ("pattern",),
    ),
    ("permute_dimensions_length", lambda: K.permute_dimensions(_ph(2, 3), (1,)), ("pattern",)),
    ("permute_dimensions_type", lambda: K.permute_dimensions(_ph(2, 3), 1), ("pattern",)),
]


@pytest.mark.parametrize("name,trigger,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input(name, trigger, words):
    with pytest.raises((ValueError, TypeError)) as excinfo:
        trigger()
    assert_mentions(excinfo, *words)


def test_slice_out_of_bounds_raises():
    # tf.slice raises for a static slice outside the input; it never truncates silently.
    with pytest.raises(ValueError) as excinfo:
        K.slice(_ph(2, 3), (0, 2), (1, 2))
    assert_mentions(excinfo, "range")


def test_gather_out_of_range_at_run_time():
    x = K.placeholder(shape=(3, 2))
    i = K.placeholder(shape=(1,), dtype="int32")
    f = K.function([x, i], [K.gather(x, i)])
    with pytest.raises(ValueError) as excinfo:
        f([np.zeros((3, 2)), np.array([3])])
    assert_mentions(excinfo, "range")
