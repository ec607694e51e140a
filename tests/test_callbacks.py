"""ferrokeras.callbacks pieces that need no Keras: the streaming histogram the TensorBoard
callback writes, checked against a direct count of the values in each bucket."""

import bisect

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from ferrokeras.callbacks import _BUCKET_LIMITS, Histogram  # noqa: E402


def _edges(proto):
    """(lower, upper, count) of each bucket: a bucket holds lower <= v < upper."""
    lowers = [-np.inf] + list(proto.bucket_limit[:-1])
    return list(zip(lowers, proto.bucket_limit, proto.bucket))


def test_bucket_limits_are_tensorflows():
    pos = _BUCKET_LIMITS[_BUCKET_LIMITS > 0]
    assert pos[0] == 1e-12 and pos[-1] == np.finfo(np.float64).max
    np.testing.assert_allclose(pos[1:-1] / pos[:-2], 1.1)
    assert pos[-2] < 1e20 <= pos[-2] * 1.1
    np.testing.assert_array_equal(_BUCKET_LIMITS[_BUCKET_LIMITS < 0], -pos[::-1])
    assert (_BUCKET_LIMITS == 0).sum() == 1


def test_counts_match_a_direct_count_over_batches():
    rng = np.random.RandomState(0)
    batches = [rng.randn(100) * 3, np.zeros(7), rng.rand(4, 5) * 1e-3, np.array([1e6, -2.5])]
    h = Histogram()
    for b in batches:
        h.add(b.astype(np.float32))
    values = np.concatenate([b.astype(np.float32).astype(np.float64).ravel() for b in batches])
    p = h.proto()
    assert (p.num, p.min, p.max) == (values.size, values.min(), values.max())
    np.testing.assert_allclose([p.sum, p.sum_squares], [values.sum(), (values**2).sum()])
    assert sum(p.bucket) == values.size
    limits = list(_BUCKET_LIMITS)
    for lower, upper, count in _edges(p):
        assert count == np.sum((values >= lower) & (values < upper))
    # Each value's own bucket (first limit above it) is not merged away.
    for v in values:
        limit = limits[bisect.bisect_right(limits, v)]
        assert limit in p.bucket_limit
    # Runs of empty buckets are merged: no two empty buckets in a row.
    empty = [c == 0 for c in p.bucket]
    assert not any(a and b for a, b in zip(empty, empty[1:]))


def test_nonfinite_values_are_counted_out():
    h = Histogram()
    h.add(np.array([1.0, np.nan, np.inf, -np.inf, 2.0]))
    p = h.proto()
    assert (h.dropped, p.num, p.min, p.max, p.sum) == (3, 2, 1.0, 2.0, 3.0)


def test_empty_histogram():
    p = Histogram().proto()
    assert p.num == 0 and len(p.bucket) == 0


def test_docstring_examples_run():
    import doctest

    import ferrokeras.callbacks

    result = doctest.testmod(ferrokeras.callbacks)
    assert result.failed == 0 and result.attempted >= 3


def test_weight_images_are_scaled_as_tensorflow_scales_float_images():
    import io

    from ferrokeras.callbacks import _png, _weight_images
    from PIL import Image

    def pixels(a):
        data, shape = _png(np.array(a, dtype=np.float32))
        img = np.asarray(Image.open(io.BytesIO(data)))
        assert img.shape == shape
        return img.tolist()

    assert pixels([[0.0, 1.0, 2.0]]) == [[0, 128, 255]]
    assert pixels([[-2.0, 0.0, 1.0]]) == [[1, 128, 192]]
    assert pixels([[0.0, 0.0]]) == [[0, 0]]
    # Keras's layouts: a kernel wider than tall, conv channels first, a bias as a column.
    assert [i.shape for i in _weight_images(np.zeros((5, 2)), True)] == [(2, 5)]
    assert [i.shape for i in _weight_images(np.zeros((3, 3, 1, 4)), True)] == [(3, 3)] * 4
    assert [i.shape for i in _weight_images(np.zeros(6), True)] == [(6, 1)]
    assert _weight_images(np.zeros((3, 3, 2, 4)), True) == []
