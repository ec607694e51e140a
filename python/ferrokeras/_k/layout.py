"""Shape and layout: repetition, tiling, flattening, padding, stacking, one-hot, reversal,
gathering, slicing and image/volume resizing.

Everything here is a composite of movement primitives (reshape, broadcast_to, pad, slice,
concat, reverse, gather), so gradients come from their rules. Dimensions that are unknown
when the graph is built are read at run time (``_dims``), so these work on placeholders
with ``None`` entries.
"""

import builtins as _b

import numpy as np

from .. import _core
from ..tensor import Tensor, wrap
from .common import _INTS, _axis, _data_format, _dtype, _int, _known_shape, _t
from .linalg import _reshape
from .shapes import _count, _dims, _prod, _shape_tensor
from .variables import _static_shape, _tensor_or_variable, cast, variable

_FLOATS = ("float16", "float32", "float64")


# ---------------------------------------------------------------- argument helpers


def _factor(f, what):
    v = _int(f, what)
    if v < 1:
        raise ValueError(f"{what} must be a positive integer, got {v}")
    return v


def _rank(x, r, fn):
    if x.ndim != r:
        raise ValueError(f"{fn}: expected a {r}-D tensor, got shape {tuple(x.shape)}")


def _slice_axis(x, axis, start, stop):
    spec = [(None, None, 1)] * x.ndim
    spec[axis] = (start, stop, 1)
    return wrap(_core.slice(x._core, spec))


def _merge_axes(y, axis, dims, factor):
    """Reshape ``y`` (``dims`` with an extra axis of ``factor`` after ``axis``) back, merged."""
    return _reshape(y, dims[:axis] + [dims[axis] * factor] + dims[axis + 1 :])


# ---------------------------------------------------------------- repetition and tiling


def repeat_elements(x, rep, axis):
    """Repeats the elements of a tensor along an axis, like ``np.repeat``.

    If ``x`` has shape ``(s1, s2, s3)`` and ``axis`` is ``1``, the output has shape
    ``(s1, s2 * rep, s3)``.

    Arguments:
        x: Tensor or variable.
        rep: Python integer (>= 0), number of times to repeat.
        axis: Axis along which to repeat.

    Returns:
        A tensor.

    Raises:
        ValueError: if ``axis`` is out of range or ``rep`` is negative.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.repeat_elements(K.constant([[1, 2], [3, 4]]), 2, axis=1))
        array([[1., 1., 2., 2.],
               [3., 3., 4., 4.]], dtype=float32)
    """
    x = _t(x)
    axis = _axis(axis, x.ndim, "repeat_elements")
    rep = _count(rep, "repeat_elements: rep")
    d = _dims(x)
    y = wrap(_core.expand_dims(x._core, [axis + 1]))
    y = wrap(_core.broadcast_to(y._core, _shape_tensor(d[: axis + 1] + [rep] + d[axis + 1 :])))
    y = _merge_axes(y, axis, d, rep)
    # The static shape Keras's backends record on the result, also where the graph knows
    # only part of it (an axis of unknown size, a repeat count given as a tensor).
    known = list(_known_shape(x))
    if known[axis] is not None:
        known[axis] = known[axis] * rep if not isinstance(rep, Tensor) else None
    y._keras_shape = tuple(known)
    return y


def repeat(x, n):
    """Repeats a 2D tensor: ``(samples, dim)`` becomes ``(samples, n, dim)``.

    Arguments:
        x: 2-D tensor or variable.
        n: Python integer (or scalar int tensor), number of times to repeat.

    Returns:
        A tensor of shape ``(samples, n, dim)``.

    Raises:
        ValueError: if ``x`` is not 2-D or ``n`` is negative.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.repeat(K.constant([[1, 2]]), 3))
        array([[[1., 2.],
                [1., 2.],
                [1., 2.]]], dtype=float32)
    """
    x = _t(x)
    _rank(x, 2, "repeat")
    n = _count(n, "repeat: n")
    d = _dims(x)
    y = wrap(_core.expand_dims(x._core, [1]))
    return wrap(_core.broadcast_to(y._core, _shape_tensor([d[0], n, d[1]])))


def tile(x, n):
    """Creates a tensor by tiling ``x`` by ``n``, like ``np.tile``.

    Arguments:
        x: A tensor or variable.
        n: An int, a list of ints (or scalar int tensors), or a 1-D int tensor: the number
            of copies along each axis. A shorter list is padded with leading 1s, as in
            Keras 2.3.1.

    Returns:
        A tiled tensor.

    Raises:
        ValueError: if ``n`` has more entries than ``x`` has axes, or a negative entry.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.tile(K.constant([[1, 2]]), (2, 2)))
        array([[1., 2., 1., 2.],
               [1., 2., 1., 2.]], dtype=float32)
    """
    x = _t(x)
    if isinstance(n, Tensor):
        if n.ndim == 0:
            n = [n]
        elif n.ndim == 1 and n.shape[0] is not None:
            n = [n[i] for i in range(n.shape[0])]
        else:
            raise ValueError(
                f"tile: n must be a scalar or a 1-D tensor of static length, got shape {tuple(n.shape)}"
            )
    elif isinstance(n, (int, np.integer)):
        n = [n]
    elif isinstance(n, (list, tuple, np.ndarray)):
        n = list(n)
    else:
        raise TypeError(f"tile: n must be an int or a list of ints, got {type(n).__name__}")
    n = [_count(k, "tile: n entry") for k in n]
    if len(n) > x.ndim:
        raise ValueError(
            f"tile: n has {len(n)} entries for a tensor of rank {x.ndim}; expected at most {x.ndim}"
        )
    n = [1] * (x.ndim - len(n)) + n
    if _b.all(isinstance(k, int) and k == 1 for k in n):
        return wrap(x._core)
    d = _dims(x)
    y = wrap(_core.expand_dims(x._core, list(range(0, 2 * x.ndim, 2))))
    inter = [v for pair in zip(n, d) for v in pair]
    y = wrap(_core.broadcast_to(y._core, _shape_tensor(inter)))
    return _reshape(y, [k * di for k, di in zip(n, d)])


# ---------------------------------------------------------------- ranges and one-hot


def _is_number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
        v, (bool, np.bool_)
    )


def arange(start, stop=None, step=1, dtype="int32"):
    """Creates a 1D tensor containing a sequence of numbers.

    As in Theano's ``arange``: if only one argument is given, it is the ``stop`` argument
    (a negative ``stop`` gives an empty sequence). Arguments may be Python numbers or
    scalar tensors (e.g. ``K.shape(x)[1]``); the length is then computed at run time.

    Arguments:
        start: Start value (or stop, when ``stop`` is None).
        stop: Stop value (exclusive).
        step: Difference between two successive values; must not be zero.
        dtype: Dtype of the result, ``'int32'`` by default as documented; the sequence is
            computed in the arguments' type (float when any is a float) and then cast.
            TensorFlow departs from that default: it skips the cast when ``dtype`` is
            ``'int32'``, so float arguments give a float32 result there.

    Returns:
        A 1-D tensor.

    Raises:
        ValueError: if ``step`` is zero. TypeError: for non-numeric arguments.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.arange(5))
        array([0, 1, 2, 3, 4], dtype=int32)
        >>> K.eval(K.arange(1, 2, 0.25, dtype='float32'))
        array([1.  , 1.25, 1.5 , 1.75], dtype=float32)
    """
    dtype = _dtype(dtype)
    if dtype == "bool":
        raise TypeError("arange: dtype must be a numeric type, got 'bool'")
    names = ("start", "stop", "step")
    args = (start, stop, step)
    for nm, a in zip(names, args):
        if a is None and nm == "stop":
            continue
        if isinstance(a, Tensor):
            if a.ndim != 0 or a.dtype == "bool":
                raise TypeError(
                    f"arange: {nm} must be a number or a scalar numeric tensor, got a {a.dtype} tensor of shape {tuple(a.shape)}"
                )
        elif not _is_number(a):
            raise TypeError(f"arange: {nm} must be a number or a scalar tensor, got {a!r}")
    if not isinstance(step, Tensor) and step == 0:
        raise ValueError("arange: step must not be zero")
    if not _b.any(isinstance(a, Tensor) for a in args):
        if stop is None:
            start, stop = 0, _b.max(start, 0)
        if _b.all(isinstance(a, (int, np.integer)) for a in (start, stop, step)):
            vals = np.arange(int(start), int(stop), int(step), dtype=np.int64)
        else:
            n = _b.max(int(np.ceil((float(stop) - float(start)) / float(step))), 0)
            vals = float(start) + np.arange(n, dtype=np.float64) * float(step)
        return wrap(_core.constant(np.ascontiguousarray(vals.astype(dtype))))
    return _arange_dynamic(start, stop, step, dtype)


def eye(size, dtype=None, name=None):
    """Instantiate an identity matrix variable; ``size`` is an int or a ``(rows, cols)`` tuple.

    Sizes may be scalar int tensors (``K.shape(x)[0]``); when one is known only at run
    time the result is a tensor, not a variable, as for ``zeros``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.eye(2))
        array([[1., 0.],
               [0., 1.]], dtype=float32)
    """
    dtype = _dtype(dtype)
    if isinstance(size, (list, tuple)):
        if len(size) != 2:
            raise ValueError(f"eye: size must be an int or a (rows, cols) pair, got {size!r}")
        n, m = size
    else:
        n = m = size
    if isinstance(n, Tensor) or isinstance(m, Tensor):
        for what, d in (("rows", n), ("cols", m)):
            if isinstance(d, Tensor) and (d.ndim != 0 or d.dtype not in _INTS):
                raise TypeError(f"eye: {what} must be an int or a scalar int tensor, got {d!r}")
        t = cast(
            wrap(_core.binary("equal", arange(n)[:, None]._core, arange(m)[None, :]._core)), dtype
        )
        return _tensor_or_variable(t, dtype, name)
    n, m = _static_shape((n, m), "eye")
    return variable(np.eye(n, m, dtype=dtype), dtype=dtype, name=name)


def _arange_dynamic(start, stop, step, dtype):
    is_float = _b.any(
        (isinstance(a, Tensor) and a.dtype in _FLOATS) or isinstance(a, (float, np.floating))
        for a in (start, stop, step)
    )
    ct = "float64" if is_float else "int32"

    def conv(a):
        a = _t(np.asarray(a, dtype=ct)) if not isinstance(a, Tensor) else a
        return a if a.dtype == ct else cast(a, ct)

    s, st = conv(start), conv(step)
    if stop is None:
        e = wrap(_core.binary("maximum", s._core, _t(np.zeros((), ct))._core))
        s = _t(np.zeros((), ct))
    else:
        e = conv(stop)
    if is_float:
        n = cast(wrap(_core.unary("ceil", ((e - s) / st)._core)), "int32")
    else:
        n = -((s - e) // st)  # ceil((e - s) / st) in integers, for either sign of step
    n = wrap(_core.binary("maximum", n._core, _t(np.zeros((), "int32"))._core))
    ones = wrap(_core.broadcast_to(_t(np.ones((), ct))._core, _shape_tensor([n])))
    iota = wrap(_core.scan("cumsum", ones._core, 0, True, False))
    out = s + iota * st
    return out if out.dtype == dtype else cast(out, dtype)


def one_hot(indices, num_classes):
    """Computes the one-hot representation of an integer tensor.

    Arguments:
        indices: nD integer tensor of shape ``(batch_size, dim1, ..., dim(n-1))``.
        num_classes: Integer (or scalar int tensor), number of classes to consider.

    Returns:
        (n + 1)D float32 one-hot representation of the input, with shape
        ``(batch_size, dim1, ..., dim(n-1), num_classes)``. An index outside
        ``[0, num_classes)`` gives a row of zeros, as in TensorFlow.

    Raises:
        TypeError: if ``indices`` is not an integer tensor.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.one_hot(K.constant([0, 2], dtype='int32'), 3))
        array([[1., 0., 0.],
               [0., 0., 1.]], dtype=float32)
    """
    indices = _int_tensor(indices, "one_hot: indices")
    return cast(_one_hot_mask(indices, _count(num_classes, "one_hot: num_classes")), "float32")


def _one_hot_mask(indices, n):
    """Bool tensor ``indices[..., None] == arange(n)``: all False for an index out of range."""
    classes = arange(n, dtype=indices.dtype)
    return wrap(
        _core.binary("equal", _core.expand_dims(indices._core, [indices.ndim]), classes._core)
    )


def _int_tensor(v, what):
    if isinstance(v, Tensor):
        if v.dtype not in _INTS:
            raise TypeError(f"{what} must be an integer tensor, got dtype {v.dtype}")
        return v
    arr = np.asarray(v)
    if arr.size == 0 and arr.dtype.kind == "f":
        arr = arr.astype(np.int32)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got {arr.dtype} values")
    return _t(
        arr.astype(np.int64)
        if arr.dtype.itemsize > 4 or arr.dtype.kind == "u"
        else arr.astype(np.int32)
    )


# ---------------------------------------------------------------- flattening and squeezing


def flatten(x):
    """Flattens a tensor into 1-D.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.flatten(K.constant([[1, 2], [3, 4]])))
        array([1., 2., 3., 4.], dtype=float32)
    """
    return _reshape(_t(x), [-1])


def batch_flatten(x):
    """Turns an nD tensor into a 2D tensor with the same 0th dimension (flattens each sample).

    Raises:
        ValueError: if ``x`` is a scalar.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.batch_flatten(K.placeholder(shape=(None, 2, 3))))
        (None, 6)
    """
    x = _t(x)
    if x.ndim < 1:
        raise ValueError("batch_flatten: x must have at least one axis, got a scalar")
    rest = x.shape[1:]
    if _b.all(d is not None for d in rest):
        m = int(np.prod(rest, dtype=np.int64))
        if m > 0:
            return _reshape(x, [-1, m])
    d = _dims(x)
    return _reshape(x, [d[0], _prod(d[1:])])


def squeeze(x, axis):
    """Removes a 1-dimension from the tensor at index ``axis``.

    Raises:
        ValueError: if ``axis`` is out of range or that dimension is not 1.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.squeeze(K.placeholder(shape=(2, 1, 3)), 1))
        (2, 3)
    """
    x = _t(x)
    a = _axis(axis, x.ndim, "squeeze")
    if x.shape[a] is not None and x.shape[a] != 1:
        raise ValueError(
            f"squeeze: cannot squeeze axis {axis} of shape {tuple(x.shape)}; its dimension must be 1"
        )
    return wrap(_core.squeeze(x._core, [a]))


# ---------------------------------------------------------------- padding


def _pad_pair(p, fn, what):
    if not isinstance(p, (tuple, list)) or len(p) != 2:
        raise ValueError(
            f"{fn}: {what} must be a pair of non-negative ints (before, after), got {p!r}"
        )
    # As in TensorFlow (whose pad packs the list), an entry may be a scalar int tensor.
    a, b = (_count(v, f"{fn}: {what} entry") for v in p)
    return (a, b)


def _pad_pairs(padding, n, fn):
    if not isinstance(padding, (tuple, list)) or len(padding) != n:
        raise ValueError(f"{fn}: padding must be a tuple of {n} pairs of ints, got {padding!r}")
    return [_pad_pair(p, fn, f"padding[{i}]") for i, p in enumerate(padding)]


def _spatial_pad(x, pairs, data_format, fn):
    x = _t(x)
    r = len(pairs) + 2
    _rank(x, r, fn)
    df = _data_format(data_format, fn)
    pads = [(0, 0)] + pairs + [(0, 0)] if df == "channels_last" else [(0, 0), (0, 0)] + pairs
    static = [p if not _b.any(isinstance(v, Tensor) for v in p) else (0, 0) for p in pads]
    out = wrap(_core.pad(x._core, static, 0.0))
    for axis, p in enumerate(pads):
        if p is not static[axis]:
            # Sizes known only at run time: zeros of that size concatenated on each side.
            d = _dims(out)
            zeros = [
                wrap(
                    _core.broadcast_to(
                        _t(np.zeros((), x.dtype))._core,
                        _shape_tensor(d[:axis] + [v] + d[axis + 1 :]),
                    )
                )
                for v in p
            ]
            out = wrap(_core.concat([zeros[0]._core, out._core, zeros[1]._core], axis))
    return out


def temporal_padding(x, padding=(1, 1)):
    """Pads the middle dimension of a 3D tensor with zeros.

    Arguments:
        x: 3-D tensor or variable.
        padding: Tuple of 2 non-negative integers (or scalar int tensors), how many zeros
            to add at the start and end of dim 1.

    Returns:
        A padded 3D tensor.

    Raises:
        ValueError: if ``x`` is not 3-D or ``padding`` is not a pair of non-negative ints.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.temporal_padding(K.placeholder(shape=(2, 3, 4)), (1, 2)))
        (2, 6, 4)
    """
    return _spatial_pad(
        x, [_pad_pair(padding, "temporal_padding", "padding")], "channels_last", "temporal_padding"
    )


def spatial_2d_padding(x, padding=((1, 1), (1, 1)), data_format=None):
    """Pads the 2nd and 3rd dimensions of a 4D tensor with zeros.

    Arguments:
        x: 4-D tensor or variable.
        padding: Tuple of 2 tuples, ``((top, bottom), (left, right))``, of non-negative
            ints (or scalar int tensors).
        data_format: ``"channels_last"`` or ``"channels_first"`` (default:
            ``image_data_format()``). With ``channels_first`` the padded axes are 2 and 3.

    Returns:
        A padded 4D tensor.

    Raises:
        ValueError: if ``data_format`` is neither ``"channels_last"`` nor
            ``"channels_first"``, ``x`` is not 4-D, or ``padding`` is malformed.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.spatial_2d_padding(K.placeholder(shape=(1, 2, 3, 4)), ((1, 0), (2, 2))))
        (1, 3, 7, 4)
    """
    return _spatial_pad(
        x, _pad_pairs(padding, 2, "spatial_2d_padding"), data_format, "spatial_2d_padding"
    )


def spatial_3d_padding(x, padding=((1, 1), (1, 1), (1, 1)), data_format=None):
    """Pads a 5D tensor with zeros along the depth, height and width dimensions.

    Pads these dimensions with respectively ``padding[0]``, ``padding[1]`` and
    ``padding[2]`` zeros left and right. With ``channels_last`` the 2nd, 3rd and 4th
    dimensions are padded; with ``channels_first`` the 3rd, 4th and 5th.

    Arguments:
        x: 5-D tensor or variable.
        padding: Tuple of 3 tuples of 2 non-negative ints (or scalar int tensors).
        data_format: ``"channels_last"`` or ``"channels_first"`` (default:
            ``image_data_format()``).

    Returns:
        A padded 5D tensor.

    Raises:
        ValueError: if ``data_format`` is neither ``"channels_last"`` nor
            ``"channels_first"``, ``x`` is not 5-D, or ``padding`` is malformed.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.spatial_3d_padding(K.placeholder(shape=(1, 2, 2, 2, 3))))
        (1, 4, 4, 4, 3)
    """
    return _spatial_pad(
        x, _pad_pairs(padding, 3, "spatial_3d_padding"), data_format, "spatial_3d_padding"
    )


# ---------------------------------------------------------------- stack, reverse, gather, slice


def stack(x, axis=0):
    """Stacks a list of rank ``R`` tensors into a rank ``R + 1`` tensor.

    Arguments:
        x: List of tensors of the same shape and dtype.
        axis: Axis along which to perform stacking (``-(R+1) <= axis <= R``).

    Returns:
        A tensor.

    Raises:
        ValueError: for an empty list, tensors of different shapes, or an axis out of range.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.stack([K.constant([1, 2]), K.constant([3, 4])], axis=1))
        array([[1., 3.],
               [2., 4.]], dtype=float32)
    """
    if isinstance(x, Tensor) or not isinstance(x, (list, tuple)):
        raise TypeError(f"stack: x must be a list of tensors, got {type(x).__name__}")
    if not x:
        raise ValueError("stack: x must be a non-empty list of tensors")
    like = next((t for t in x if isinstance(t, Tensor)), None)
    ts = [_t(t, like=like) for t in x]
    s0 = ts[0].shape
    for t in ts[1:]:
        if t.ndim != len(s0) or _b.any(
            a is not None and b is not None and a != b for a, b in zip(t.shape, s0)
        ):
            raise ValueError(
                f"stack: all tensors must have the same shape, got {tuple(s0)} and {tuple(t.shape)}"
            )
    a = _axis(axis, len(s0) + 1, "stack")
    return wrap(_core.concat([_core.expand_dims(t._core, [a]) for t in ts], a))


def reverse(x, axes):
    """Reverses a tensor along the specified axes.

    Arguments:
        x: Tensor to reverse.
        axes: Integer or iterable of integers, the axes to reverse.

    Returns:
        A tensor.

    Raises:
        ValueError: if an axis is out of range or repeated.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.reverse(K.constant([[1, 2], [3, 4]]), [0, 1]))
        array([[4., 3.],
               [2., 1.]], dtype=float32)
    """
    x = _t(x)
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        axes = [axes]
    elif not isinstance(axes, (list, tuple, np.ndarray)):
        raise TypeError(
            f"reverse: axes must be an int or a list of ints, got {type(axes).__name__}"
        )
    norm = [_axis(a, x.ndim, "reverse", "axes entry") for a in axes]
    if len(set(norm)) != len(norm):
        raise ValueError(f"reverse: axes {list(axes)} name the same axis twice")
    if not norm:
        return wrap(x._core)
    return wrap(_core.reverse(x._core, norm))


def gather(reference, indices):
    """Retrieves the elements of indices ``indices`` in the tensor ``reference`` (along
    its first axis, like ``reference[indices]`` in NumPy).

    Arguments:
        reference: A tensor.
        indices: An integer tensor (or list/array) of indices into axis 0.

    Returns:
        A tensor of same type as ``reference``, of shape
        ``indices.shape + reference.shape[1:]``. Its gradient with respect to
        ``reference`` adds up the rows that were gathered more than once.

    Raises:
        TypeError: for non-integer indices. ValueError: for an index out of range (at
            build time when both are static, otherwise when the graph runs).

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.gather(K.constant([[1, 2], [3, 4], [5, 6]]), [2, 0]))
        array([[5., 6.],
               [1., 2.]], dtype=float32)
    """
    reference = _t(reference)
    if reference.ndim == 0:
        raise ValueError("gather: reference must have at least one axis, got a scalar")
    static = not isinstance(indices, Tensor)
    idx = _int_tensor(indices, "gather: indices")
    n = reference.shape[0]
    if static and n is not None:
        arr = np.asarray(indices)
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            raise ValueError(
                f"gather: indices must be in [0, {n}) for a reference of shape {tuple(reference.shape)}, got {arr.min()}..{arr.max()}"
            )
    return wrap(_core.gather(reference._core, idx._core, 0))


def slice(x, start, size):
    """Extracts a slice from a tensor, as ``tf.slice``.

    Arguments:
        x: Input tensor.
        start: List of ints (or scalar int tensors, or a 1-D int tensor): the start index
            along each axis.
        size: List of ints (same forms): the length along each axis; ``-1`` takes all
            remaining elements.

    Returns:
        A tensor of shape ``size`` (with ``-1`` entries resolved).

    Raises:
        ValueError: if ``start`` and ``size`` do not have one entry per axis of ``x``, or
            a static slice falls outside ``x``.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.eval(K.slice(K.constant([[1, 2, 3], [4, 5, 6]]), (0, 1), (2, -1)))
        array([[2., 3.],
               [5., 6.]], dtype=float32)
    """
    x = _t(x)
    start, size = _index_list(start, "slice: start"), _index_list(size, "slice: size")
    if not (x.ndim == len(start) == len(size)):
        raise ValueError(
            f"slice: the dimension and the size of indices should match: x has rank {x.ndim}, start has {len(start)} entries and size {len(size)}"
        )
    spec, dynamic = [], []
    for i, (s, z, d) in enumerate(zip(start, size, x.shape)):
        if isinstance(s, Tensor) or isinstance(z, Tensor):
            spec.append((None, None, 1))
            dynamic.append(i)
            continue
        if s < 0 or z < -1:
            raise ValueError(
                f"slice: start must be >= 0 and size >= -1, got start {s} and size {z} for axis {i}"
            )
        if d is not None and (s > d or (z != -1 and s + z > d)):
            raise ValueError(
                f"slice: start {s} with size {z} is out of range for axis {i} of size {d}"
            )
        spec.append((s, None if z == -1 else s + z, 1))
    out = wrap(_core.slice(x._core, spec)) if _b.any(sp != (None, None, 1) for sp in spec) else x
    if dynamic:
        d = _dims(x)
        for i in dynamic:
            s, z = start[i], size[i]
            stop = d[i] if (not isinstance(z, Tensor) and z == -1) else s + z
            out = wrap(_core.gather(out._core, arange(s, stop)._core, i))
    return out


def _index_list(v, what):
    if isinstance(v, Tensor):
        if v.ndim != 1 or v.shape[0] is None or v.dtype not in _INTS:
            raise TypeError(
                f"{what} must be a list of ints or a 1-D int tensor of static length, got {v!r}"
            )
        return [cast(v[i], "int32") if v.dtype != "int32" else v[i] for i in range(v.shape[0])]
    if isinstance(v, (int, np.integer)):
        v = [v]
    if not isinstance(v, (list, tuple, np.ndarray)):
        raise TypeError(f"{what} must be a list of ints, got {type(v).__name__}")
    return [
        _count(e, what + " entry") if isinstance(e, Tensor) else _int(e, what + " entry") for e in v
    ]


# ---------------------------------------------------------------- resizing


def _linear_upsample(x, axis, f):
    """Linear interpolation by an integer factor along ``axis``, with TensorFlow 2's
    half-pixel centres: output ``i`` samples input coordinate ``(i + 0.5) / f - 0.5``,
    clamped at the edges. Output ``k * f + r`` mixes inputs ``k`` and a neighbour with
    weights that depend on ``r`` only, so each phase ``r`` is two shifted slices."""
    d = _dims(x)
    xp = wrap(
        _core.concat(
            [_slice_axis(x, axis, 0, 1)._core, x._core, _slice_axis(x, axis, -1, None)._core], axis
        )
    )
    prev, cur, nxt = (
        _slice_axis(xp, axis, 0, -2),
        _slice_axis(xp, axis, 1, -1),
        _slice_axis(xp, axis, 2, None),
    )
    phases = []
    for r in range(f):
        off = (r + 0.5) / f - 0.5
        if off == 0:
            p = cur
        elif off > 0:
            p = cur * (1.0 - off) + nxt * off
        else:
            p = prev * (-off) + cur * (1.0 + off)
        phases.append(_core.expand_dims(p._core, [axis + 1]))
    return _merge_axes(wrap(_core.concat(phases, axis + 1)), axis, d, f)


def _resize(x, factors, interpolation, fn):
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(
            f"{fn}: interpolation should be one of 'nearest' or 'bilinear', got {interpolation!r}"
        )
    if interpolation == "bilinear" and x.dtype not in _FLOATS:
        x = cast(x, "float32")  # as tf.image.resize, which returns float32 for other inputs
    for axis, f in factors:
        if f == 1:
            continue
        x = (
            repeat_elements(x, f, axis)
            if interpolation == "nearest"
            else _linear_upsample(x, axis, f)
        )
    return x


def resize_images(x, height_factor, width_factor, data_format, interpolation="nearest"):
    """Resizes the images contained in a 4D tensor by integer factors.

    Arguments:
        x: 4-D tensor or variable to resize.
        height_factor: Positive integer.
        width_factor: Positive integer.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        interpolation: ``"nearest"`` (each pixel repeated) or ``"bilinear"`` (TensorFlow
            2's ``tf.image.resize``: half-pixel centres, edges clamped).

    Returns:
        A tensor.

    Raises:
        ValueError: if ``data_format`` is neither ``"channels_last"`` nor
            ``"channels_first"``, a factor is not a positive integer, ``x`` is not 4-D, or
            ``interpolation`` is unknown.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.constant([[[[1.], [2.]]]])            # shape (1, 1, 2, 1)
        >>> K.eval(K.resize_images(x, 1, 2, 'channels_last'))[0, 0, :, 0]
        array([1., 1., 2., 2.], dtype=float32)
        >>> K.eval(K.resize_images(x, 1, 2, 'channels_last', 'bilinear'))[0, 0, :, 0]
        array([1.  , 1.25, 1.75, 2.  ], dtype=float32)
    """
    x = _t(x)
    df = _data_format(data_format, "resize_images", allow_none=False)
    _rank(x, 4, "resize_images")
    hf = _factor(height_factor, "resize_images: height_factor")
    wf = _factor(width_factor, "resize_images: width_factor")
    axes = (2, 3) if df == "channels_first" else (1, 2)
    return _resize(x, zip(axes, (hf, wf)), interpolation, "resize_images")


def resize_volumes(
    x, depth_factor, height_factor, width_factor, data_format, interpolation="nearest"
):
    """Resizes the volume contained in a 5D tensor by integer factors.

    Arguments:
        x: 5-D tensor or variable to resize.
        depth_factor: Positive integer.
        height_factor: Positive integer.
        width_factor: Positive integer.
        data_format: string, ``"channels_last"`` or ``"channels_first"``.
        interpolation: ``"nearest"`` (the Keras behaviour) or ``"bilinear"``
            (separable linear interpolation along the three axes, with the half-pixel
            centres of ``resize_images``).

    Returns:
        A tensor.

    Raises:
        ValueError: if ``data_format`` is neither ``"channels_last"`` nor
            ``"channels_first"``, a factor is not a positive integer, or ``x`` is not 5-D.

    Example:
        >>> from ferrokeras import backend as K
        >>> K.int_shape(K.resize_volumes(K.placeholder(shape=(1, 2, 2, 2, 3)), 2, 3, 1, 'channels_last'))
        (1, 4, 6, 2, 3)
    """
    x = _t(x)
    df = _data_format(data_format, "resize_volumes", allow_none=False)
    _rank(x, 5, "resize_volumes")
    fs = [
        _factor(depth_factor, "resize_volumes: depth_factor"),
        _factor(height_factor, "resize_volumes: height_factor"),
        _factor(width_factor, "resize_volumes: width_factor"),
    ]
    axes = (2, 3, 4) if df == "channels_first" else (1, 2, 3)
    return _resize(x, zip(axes, fs), interpolation, "resize_volumes")


__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
