"""CTC loss, its gradient and decoding, against brute-force enumeration of alignments.

The reference enumerates every path of length T over C classes (small T and C), collapses
repeats and removes blanks (the last class), and sums the probabilities of the paths that
give the label: the definition of the CTC likelihood (Graves et al., 2006).
"""

import itertools
from pathlib import Path

import numpy as np
import pytest
from ferrokeras import backend as K


def collapse(path, blank):
    out, prev = [], None
    for p in path:
        if p != prev and p != blank:
            out.append(p)
        prev = p
    return out


def brute_force_loss(probs, label):
    T, C = probs.shape
    total = 0.0
    for path in itertools.product(range(C), repeat=T):
        if collapse(path, C - 1) == list(label):
            total += np.prod([probs[t, k] for t, k in enumerate(path)])
    return -np.log(total)


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture
def batch(rng):
    B, T, C = 3, 5, 4
    y_pred = softmax(rng.normal(size=(B, T, C)))
    labels = np.array([[0, 1, 1], [2, 0, 0], [1, 0, 2]])
    label_len = np.array([[3], [1], [2]])
    input_len = np.array([[5], [4], [5]])
    return y_pred, labels, input_len, label_len


def test_loss_matches_brute_force(batch):
    y_pred, labels, il, ll = batch
    loss = K.eval(
        K.ctc_batch_cost(
            K.constant(labels), K.constant(y_pred, dtype="float64"), K.constant(il), K.constant(ll)
        )
    )
    assert loss.shape == (3, 1)
    eps = K.epsilon()
    for i in range(3):
        # Keras feeds log(y_pred + eps) to a loss that applies softmax: renormalised probabilities
        p = (y_pred[i] + eps) / (y_pred[i] + eps).sum(-1, keepdims=True)
        want = brute_force_loss(p[: il[i, 0]], labels[i, : ll[i, 0]])
        np.testing.assert_allclose(loss[i, 0], want, rtol=1e-10)


def test_batch_size_one_and_placeholders(batch):
    y_pred, labels, il, ll = batch
    yp = K.placeholder(shape=(None, None, 4), dtype="float64")
    yt = K.placeholder(shape=(None, None))
    i_l = K.placeholder(shape=(None, 1), dtype="int32")
    l_l = K.placeholder(shape=(None, 1), dtype="int32")
    f = K.function([yt, yp, i_l, l_l], [K.ctc_batch_cost(yt, yp, i_l, l_l)])
    one = f([labels[:1], y_pred[:1], il[:1], ll[:1]])[0]
    full = f([labels, y_pred, il, ll])[0]
    np.testing.assert_allclose(one[0], full[0], rtol=1e-12)


def test_gradient_matches_finite_differences(batch):
    y_pred, labels, il, ll = batch
    logits0 = np.log(y_pred)
    z = K.placeholder(shape=logits0.shape, dtype="float64")
    loss = K.sum(K.ctc_batch_cost(K.constant(labels), K.softmax(z), K.constant(il), K.constant(ll)))
    f = K.function([z], [loss, K.gradients(loss, [z])[0]])
    _, g = f([logits0])
    num = np.zeros_like(logits0)
    eps = 1e-6
    for idx in np.ndindex(*logits0.shape):
        d = np.zeros_like(logits0)
        d[idx] = eps
        num[idx] = (f([logits0 + d])[0] - f([logits0 - d])[0]) / (2 * eps)
    np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-8)
    # steps past a sample's input length get no gradient
    assert np.all(g[1, 4] == 0)


def test_labels_longer_than_input_raise(batch):
    y_pred, labels, il, ll = batch
    with pytest.raises(ValueError, match="longer than the input"):
        K.eval(
            K.ctc_batch_cost(
                K.constant(labels), K.constant(y_pred), K.constant([[2], [4], [5]]), K.constant(ll)
            )
        )
    with pytest.raises(ValueError, match="label"):
        K.eval(
            K.ctc_batch_cost(
                K.constant([[7, 0, 0]] * 3), K.constant(y_pred), K.constant(il), K.constant(ll)
            )
        )
    with pytest.raises(ValueError):
        K.ctc_batch_cost(K.constant(labels), K.constant(y_pred[0]), K.constant(il), K.constant(ll))


def test_a_label_whose_repeats_do_not_fit_has_infinite_loss_and_no_gradient(batch):
    # [0, 1, 1] fits 3 steps but needs a blank between the 1s: no path, as TF (loss +inf,
    # gradient 0); the other samples are unaffected.
    y_pred, labels, il, ll = batch
    short = np.array([[3], [4], [5]])
    z = K.placeholder(shape=y_pred.shape, dtype="float64")
    cost = K.ctc_batch_cost(K.constant(labels), K.softmax(z), K.constant(short), K.constant(ll))
    f = K.function([z], [cost, K.gradients(K.sum(cost[1:]), [z])[0], K.gradients(cost[0], [z])[0]])
    loss, g_rest, g_first = f([np.log(y_pred)])
    assert loss[0, 0] == np.inf
    eps = K.epsilon()
    for i in (1, 2):
        p = (y_pred[i] + eps) / (y_pred[i] + eps).sum(-1, keepdims=True)
        want = brute_force_loss(p[: short[i, 0]], labels[i, : ll[i, 0]])
        np.testing.assert_allclose(loss[i, 0], want, rtol=1e-10)
    assert np.all(g_first == 0) and np.all(np.isfinite(g_rest)) and np.any(g_rest[1:] != 0)


def test_greedy_decode(rng):
    p = np.array(
        [
            [[0.1, 0.8, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.8, 0.1, 0.1]],
            [[0.1, 0.1, 0.8], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.7, 0.2, 0.1]],
        ]
    )
    decoded, log_prob = K.ctc_decode(K.constant(p, dtype="float64"), K.constant([4, 3]))
    d = K.eval(decoded[0])
    # sample 0: 1 1 _ 0 -> [1, 0]; sample 1 (3 steps): _ 0 _ -> [0], padded with -1
    np.testing.assert_array_equal(d, [[1, 0], [0, -1]])
    want = [
        -np.log(np.array([0.8, 0.8, 0.8, 0.8]) + K.epsilon()).sum(),
        -np.log(np.array([0.8, 0.7, 0.8]) + K.epsilon()).sum(),
    ]
    # TensorFlow reports the negative sum of the best log-probabilities
    np.testing.assert_allclose(K.eval(log_prob)[:, 0], np.array(want), rtol=1e-10)


def brute_force_best(probs, top):
    T, C = probs.shape
    scores = {}
    for path in itertools.product(range(C), repeat=T):
        lab = tuple(collapse(path, C - 1))
        scores[lab] = scores.get(lab, 0.0) + np.prod([probs[t, k] for t, k in enumerate(path)])
    return sorted(scores.items(), key=lambda kv: -kv[1])[:top]


def test_beam_search_finds_the_most_probable_labelings(rng):
    B, T, C = 2, 4, 3
    p = softmax(rng.normal(size=(B, T, C)) * 2)
    decoded, log_prob = K.ctc_decode(
        K.constant(p, dtype="float64"), K.constant([T, T]), greedy=False, beam_width=20, top_paths=3
    )
    assert len(decoded) == 3
    lp = K.eval(log_prob)
    for i in range(B):
        want = brute_force_best(
            (p[i] + K.epsilon()) / (p[i] + K.epsilon()).sum(-1, keepdims=True), 3
        )
        for k, (lab, pr) in enumerate(want):
            row = K.eval(decoded[k])[i]
            # TensorFlow's decoder merges a path's repeated labels (`merge_repeated`)
            assert tuple(row[row >= 0]) == tuple(k for k, _ in itertools.groupby(lab))
            np.testing.assert_allclose(lp[i, k], np.log(pr), rtol=1e-8)


def test_beam_search_merges_repeated_labels_as_tensorflow():
    # The best labelling is [1, 1] (a blank between the two 1s); TensorFlow's beam search
    # decoder (merge_repeated=True, as Keras's backends call it) returns [1] with the
    # log-probability of [1, 1]; the second path is [1] itself.
    p = np.array([[[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]])
    decoded, log_prob = K.ctc_decode(
        K.constant(p), K.constant([4]), greedy=False, beam_width=10, top_paths=2
    )
    assert [K.eval(d).tolist() for d in decoded] == [[[1]], [[1]]]
    labels = [((1, 1), 0), ((1,), 1)]
    for lab, k in labels:
        cost = K.ctc_batch_cost(
            K.constant([lab]), K.constant(p), K.constant([[4]]), K.constant([[len(lab)]])
        )
        np.testing.assert_allclose(K.eval(log_prob)[0, k], -K.eval(cost)[0, 0], rtol=1e-5)


def test_beam_search_decodes_as_tensorflow():
    # TF's decoder keeps an entry's probability only while it stays in the beam, so its
    # paths and scores depart from an exact prefix search once entries fall out; 24 random
    # cases recorded from tf_keras 2.21 (tests/data/tf_keras/make_fixtures.py).
    data = np.load(Path(__file__).parent / "data" / "tf_keras" / "ctc_beam_search.npz")
    cases = sorted({k.split("/")[0] for k in data.files}, key=int)
    assert len(cases) == 24
    for i in cases:
        width, top = (int(v) for v in data[f"{i}/beam"])
        decoded, log_prob = K.ctc_decode(
            K.constant(data[f"{i}/y"]),
            K.constant(data[f"{i}/lens"], dtype="int32"),
            greedy=False,
            beam_width=width,
            top_paths=top,
        )
        for k in range(top):
            got, want = K.eval(decoded[k]), data[f"{i}/d{k}"]
            w = got.shape[1]  # TF 2 pads to the input's length, Keras 2.3.1 to the longest path
            assert w <= want.shape[1] and np.all(want[:, w:] == -1), (i, k)
            np.testing.assert_array_equal(got, want[:, :w], err_msg=f"case {i}, path {k}")
        np.testing.assert_allclose(K.eval(log_prob), data[f"{i}/lp"], rtol=1e-5, atol=1e-5)


def test_decode_bad_arguments():
    p = K.constant(np.full((1, 3, 3), 1 / 3))
    with pytest.raises(ValueError, match="top_paths"):
        K.ctc_decode(p, K.constant([3]), greedy=False, beam_width=2, top_paths=3)
    with pytest.raises(ValueError):
        K.ctc_decode(K.constant(np.ones((3, 3))), K.constant([3]))


def test_dense_to_sparse():
    st = K.ctc_label_dense_to_sparse(
        K.constant([[1, 2, 0], [3, 0, 0]], dtype="int32"), K.constant([2, 1], dtype="int32")
    )
    np.testing.assert_array_equal(K.eval(st.indices), [[0, 0], [0, 1], [1, 0]])
    np.testing.assert_array_equal(K.eval(st.values), [1, 2, 3])
    np.testing.assert_array_equal(K.eval(st.dense_shape), [2, 3])
    np.testing.assert_array_equal(K.eval(K.to_dense(st)), [[1, 2, 0], [3, 0, 0]])


def test_labels_at_or_past_the_blank_end_the_label(batch):
    # As in TensorFlow (and Keras's image_ocr example, which trains on a label that is just
    # the blank): a label >= the blank class ends the sample's label sequence.
    y_pred, labels, il, ll = batch
    blank = y_pred.shape[-1] - 1
    padded = np.array([[0, 1, blank], [2, blank, blank], [blank, 5, 9]])
    got = K.eval(
        K.ctc_batch_cost(
            K.constant(padded),
            K.constant(y_pred, dtype="float64"),
            K.constant(il),
            K.constant([[3], [3], [3]]),
        )
    )
    want = K.eval(
        K.ctc_batch_cost(
            K.constant(np.array([[0, 1, 0], [2, 0, 0], [0, 0, 0]])),
            K.constant(y_pred, dtype="float64"),
            K.constant(il),
            K.constant([[2], [1], [0]]),
        )
    )
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # The empty label: every step emits the blank.
    eps = K.epsilon()
    p = (y_pred[2] + eps) / (y_pred[2] + eps).sum(-1, keepdims=True)
    np.testing.assert_allclose(got[2, 0], -np.sum(np.log(p[:, blank])), rtol=1e-10)
    # Its gradient is finite.
    z = K.placeholder(shape=y_pred.shape, dtype="float64")
    loss = K.sum(
        K.ctc_batch_cost(K.constant(padded), K.softmax(z), K.constant(il), K.constant([[3]] * 3))
    )
    g = K.function([z], [K.gradients(loss, [z])[0]])([np.log(y_pred)])[0]
    assert np.all(np.isfinite(g))


def test_a_label_after_the_end_of_label_raises(batch):
    y_pred, labels, il, ll = batch
    blank = y_pred.shape[-1] - 1
    msg = f"label 1 of sample 0 follows the end-of-label value {blank}"
    with pytest.raises(ValueError, match=msg):
        K.eval(
            K.ctc_batch_cost(
                K.constant(np.array([[0, blank, 1]] * 3)),
                K.constant(y_pred),
                K.constant(il),
                K.constant([[3]] * 3),
            )
        )
    with pytest.raises(ValueError, match="label -1 of sample 0 is negative"):
        K.eval(
            K.ctc_batch_cost(
                K.constant(np.array([[-1, 0, 0]] * 3)),
                K.constant(y_pred),
                K.constant(il),
                K.constant(ll),
            )
        )
