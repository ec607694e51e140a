"""ferrokeras.profile: the Chrome trace of a Keras training step read back with json and
checked against the function that ran it (its launch and submit counts, its fused groups,
its loop steps, its callbacks); profile_summary's table; nesting, repeats and bad paths;
the TensorBoard layout, by hand and through the callback's profile_batch."""

import glob
import gzip
import json
import os

import ferrokeras
import ferrokeras.callbacks
import keras
import numpy as np
import pytest
from ferrokeras import backend as K
from keras.layers import LSTM, Dense

GPU = ferrokeras.device().startswith("gpu")
# Spans that stand for no launch of their own: feeds, folded constants, variables.
NO_LAUNCH = {"feed", "constant", "source", "view", "meta.gpu"}


def _spans(path):
    with open(path) as f:
        doc = json.load(f)
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def _inside(span, outer):
    return (
        outer["ts"] - 1e-3 <= span["ts"]
        and span["ts"] + span["dur"] <= outer["ts"] + outer["dur"] + 1e-3
    )


def _calls(spans, name):
    return [s for s in spans if s["cat"] == "call" and s["args"]["function"] == name]


def _items(spans, call):
    """The spans of the call's own plan (not of loop bodies) that ran inside `call`."""
    return [
        s
        for s in spans
        if s["cat"] not in ("call", "loop.run", "loop.step", "gpu.submit")
        and s["args"].get("depth") == 0
        and _inside(s, call)
    ]


def _mlp():
    model = keras.models.Sequential(
        [Dense(16, activation="tanh", input_shape=(8,)), Dense(3, activation="softmax")]
    )
    model.compile(keras.optimizers.Adam(0.01), "categorical_crossentropy", ["accuracy"])
    return model


def _data(n=32, d=8, k=3, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, d).astype("float32"), np.eye(k, dtype="float32")[rng.randint(0, k, n)]


def test_a_training_step_records_every_item_once(tmp_path):
    model = _mlp()
    x, y = _data()
    for _ in range(3):  # the first calls compile and specialise
        model.train_on_batch(x, y)
    path = tmp_path / "step.json"
    with ferrokeras.profile(path):
        model.train_on_batch(x, y)
        model.train_on_batch(x, y)
    f = model.train_function
    spans = _spans(path)
    calls = _calls(spans, "train_function")
    assert len(calls) == 2
    for call in calls:
        assert call["name"] == "K.function train_function"
        assert call["args"]["dispatches"] == f.dispatches
        items = _items(spans, call)
        launches = [s for s in items if s["cat"] not in NO_LAUNCH]
        devices = {s["args"]["device"] for s in items}
        # On a GPU, nodes without a WGSL kernel run on the CPU inside the GPU plan.
        assert "gpu" in devices and devices <= {"cpu", "gpu"} if GPU else devices == {"cpu"}
        if GPU:
            # Every node the GPU executor walked, once; the kernels it recorded add up
            # to the call's launches, and there is a span per submit.
            nodes = [s["args"]["node"] for s in items]
            assert len(nodes) == len(set(nodes))
            assert sum(s["args"]["dispatches"] for s in items) == f.dispatches
            submits = [s for s in spans if s["cat"] == "gpu.submit" and _inside(s, call)]
            assert len(submits) == f._f.submits >= 1
            # Where the device has timestamp queries (Mesa's llvmpipe does), each submit
            # that ran kernels has the GPU's time for them, within the submit's span.
            timed = [s for s in submits if "gpu_us" in s["args"]]
            if timed:
                assert len(timed) == sum(s["args"]["dispatches"] > 0 for s in submits)
                assert all(0 < s["args"]["gpu_us"] <= s["dur"] for s in timed)
            assert any(s["cat"] == "gpu.record" for s in items)
        else:
            # Every item of the CPU schedule, once per call, and one launch each.
            n = items[0]["args"]["items"]
            assert sorted(s["args"]["item"] for s in items) == list(range(n))
            assert len(launches) == f.dispatches
        for s in launches:
            assert isinstance(s["args"]["dtype"], str)
            assert all(isinstance(d, int) for shape in s["args"]["inputs"] for d in shape)
        # A dense layer's product reads the batch and the kernel (on a GPU, in the span of
        # the group its kernel runs as its epilogue, which lists it among the members).
        assert any(
            (s["name"] in ("matmul", "matmul_acc") or "matmul" in s["args"].get("members", []))
            and [32, 8] in s["args"]["inputs"]
            for s in launches
        ), sorted({s["name"] for s in launches})
        # Fused groups list their members (the Adam update chains are long).
        fused = [s for s in launches if "members" in s["args"]]
        assert all(len(s["args"]["members"]) >= 1 for s in fused)
        assert max(len(s["args"]["members"]) for s in fused) >= 4
        assert all(s["name"].startswith("fused") or s["name"] == "matmul_acc" for s in fused)
    threads = {e["args"]["name"] for e in json.load(open(path))["traceEvents"] if e["ph"] == "M"}
    assert "ferrokeras" in threads


def test_a_convolution_span_names_the_convolution_and_its_operands(tmp_path):
    # A convolution whose bias add and relu run on each image as it is written is one
    # span: the convolution comes first among its members, and its inputs are the
    # convolution's operands (the image batch and the kernel), then the group's others.
    x = K.placeholder(shape=(None, 6, 6, 3))
    w, b = K.variable(np.ones((3, 3, 3, 4), "float32")), K.variable(np.ones(4, "float32"))
    f = K.function([x], [K.relu(K.bias_add(K.conv2d(x, w, padding="same"), b))])
    xv = np.ones((2, 6, 6, 3), "float32")
    f([xv])
    path = tmp_path / "conv.json"
    with ferrokeras.profile(path):
        f([xv])
    spans = [s for s in _spans(path) if s["cat"] not in ("call",) + tuple(NO_LAUNCH)]
    convs = [s for s in spans if "conv" in [s["name"]] + s["args"].get("members", [])[:1]]
    assert len(convs) == 1, [(s["name"], s["args"]) for s in spans]
    args = convs[0]["args"]
    assert args["inputs"][:2] == [[2, 6, 6, 3], [3, 3, 3, 4]]
    if "members" in args:
        assert args["members"][0] == "conv" and "relu" in args["members"]


def test_an_rnn_step_records_its_loop_steps(tmp_path):
    model = keras.models.Sequential([LSTM(4, input_shape=(5, 3)), Dense(1)])
    model.compile("sgd", "mse")
    rng = np.random.RandomState(1)
    x, y = rng.rand(6, 5, 3).astype("float32"), rng.rand(6, 1).astype("float32")
    model.train_on_batch(x, y)
    path = tmp_path / "rnn.json"
    with ferrokeras.profile(path):
        model.train_on_batch(x, y)
    spans = _spans(path)
    (call,) = _calls(spans, "train_function")
    runs = [s for s in spans if s["cat"] == "loop.run" and _inside(s, call)]
    # The forward loop and its gradient's backward loop, 5 steps each.
    assert len(runs) == 2
    loops = [s for s in _items(spans, call) if s["cat"] == "loop"]
    assert len(loops) == 2
    for run in runs:
        assert run["args"]["steps"] == 5
        steps = [
            s
            for s in spans
            if s["cat"] == "loop.step" and s["tid"] == run["tid"] and _inside(s, run)
        ]
        assert sorted(s["args"]["step"] for s in steps) == list(range(5))
        # The body's own items run inside the steps, a level deeper.
        body = [
            s
            for s in spans
            if s["args"].get("depth") == run["args"]["depth"]
            and s["cat"] not in ("loop.run", "loop.step")
            and s["tid"] == run["tid"]
            and _inside(s, run)
        ]
        assert body and all(any(_inside(b, st) for st in steps) for b in body)
        assert any(_inside(run, lp) for lp in loops)


def test_a_py_function_is_a_span_inside_its_call(tmp_path):
    x = K.placeholder(shape=(None, 2))

    def double_it(a):
        return a * 2

    y = K.py_function(double_it, [x], "float32")
    f = K.function([x], [y + 1], name="with_callback")
    feed = [np.ones((3, 2), "float32")]
    f(feed)
    path = tmp_path / "cb.json"
    with ferrokeras.profile(path):
        np.testing.assert_array_equal(f(feed)[0], np.full((3, 2), 3.0))
    spans = _spans(path)
    (call,) = _calls(spans, "with_callback")
    (cb,) = [s for s in spans if s["cat"] == "callback"]
    assert cb["name"] == "py_function:double_it"
    assert cb["args"]["inputs"] == [[3, 2]]
    assert _inside(cb, call)


def test_an_unnamed_function_and_a_failed_call(tmp_path):
    x = K.placeholder(shape=(None, 2))
    f = K.function([x], [K.reshape(x, (4,))])
    path = tmp_path / "fail.json"
    with ferrokeras.profile(path):
        f([np.ones((2, 2), "float32")])
        with pytest.raises(ValueError):
            f([np.ones((3, 2), "float32")])
    calls = [s for s in _spans(path) if s["cat"] == "call"]
    assert [c["name"] for c in calls] == ["K.function", "K.function"]
    assert [c["args"]["ok"] for c in calls] == [True, False]


def test_summary_table_adds_up(tmp_path, capsys):
    model = _mlp()
    x, y = _data()
    model.train_on_batch(x, y)
    path = tmp_path / "sum.json"
    with ferrokeras.profile(path):
        for _ in range(3):
            model.train_on_batch(x, y)
    rows = ferrokeras.profile_summary(top=None)
    printed = capsys.readouterr().out
    assert printed.strip() == str(rows)
    assert printed.splitlines()[0].split() == ["op", "calls", "total", "ms", "mean", "us", "%"]
    spans = [s for s in _spans(path) if s["cat"] not in ("call", "loop", "loop.run", "loop.step")]
    assert sum(r[1] for r in rows) == len(spans)
    np.testing.assert_allclose(sum(r[2] for r in rows), rows.total_ms, rtol=1e-9)
    # Own times: spans nested in others on a thread (a GPU plan's CPU node holds the submit
    # that downloads its inputs) count less their children.
    whole = sum(s["dur"] for s in spans) / 1e3
    assert 0 < rows.total_ms <= whole * (1 + 1e-9)
    if not GPU:
        np.testing.assert_allclose(rows.total_ms, whole, rtol=1e-9)
    np.testing.assert_allclose(sum(r[4] for r in rows), 100.0, rtol=1e-9)
    for _, calls, total_ms, mean_us, _ in rows:
        np.testing.assert_allclose(mean_us, total_ms * 1e3 / calls, rtol=1e-9)
    assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    # An explicit path, a few rows, nothing printed.
    top = ferrokeras.profile_summary(path, top=2, file=False)
    assert list(top) == rows[:2] and capsys.readouterr().out == ""


def test_nested_and_repeated_blocks(tmp_path):
    x = K.placeholder(shape=(2,))
    f = K.function([x], [x + 1], name="a")
    g = K.function([x], [x * 2], name="b")
    v = [np.ones(2, "float32")]
    f(v)
    g(v)
    outer, inner = tmp_path / "outer.json", tmp_path / "inner.json"
    with ferrokeras.profile(outer):
        f(v)
        with ferrokeras.profile(inner):
            g(v)
        f(v)
    names = lambda p: [s["args"]["function"] for s in _spans(p) if s["cat"] == "call"]  # noqa: E731
    assert names(outer) == ["a", "b", "a"]
    assert names(inner) == ["b"]
    # Outside a block nothing is recorded; a later block starts empty.
    g(v)
    again = tmp_path / "again.json"
    with ferrokeras.profile(again):
        f(v)
    assert names(again) == ["a"]
    # A block object may be used again after it closed, not while it is open.
    block = ferrokeras.profile(tmp_path / "reuse.json")
    with block:
        with pytest.raises(RuntimeError, match="already open"):
            block.__enter__()
    with block:
        g(v)
    assert names(tmp_path / "reuse.json") == ["b"]


def test_bad_paths_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="cannot create the trace file"):
        with ferrokeras.profile(tmp_path / "missing" / "t.json"):
            pass
    with pytest.raises(IsADirectoryError):
        with ferrokeras.profile(tmp_path):
            pass
    with pytest.raises(TypeError, match="path"):
        ferrokeras.profile(3)
    with pytest.raises(TypeError, match="tensorboard_dir"):
        ferrokeras.profile(None)
    with pytest.raises(ValueError, match="run"):
        ferrokeras.profile(None, tensorboard_dir=tmp_path, run="a/b")
    # A failed start leaves the profiler off: a later block records only its own calls.
    x = K.placeholder(shape=(2,))
    f = K.function([x], [x + 1], name="after")
    f([np.ones(2, "float32")])
    with ferrokeras.profile(tmp_path / "ok.json"):
        f([np.ones(2, "float32")])
    assert len(_calls(_spans(tmp_path / "ok.json"), "after")) == 1
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(ValueError, match="not a Chrome trace"):
        ferrokeras.profile_summary(bad)
    with pytest.raises(FileNotFoundError):
        ferrokeras.profile_summary(tmp_path / "nope.json")


def test_tensorboard_dir_layout(tmp_path):
    x = K.placeholder(shape=(2,))
    f = K.function([x], [x + 1], name="tb")
    with ferrokeras.profile(None, tensorboard_dir=tmp_path, run="run1"):
        f([np.ones(2, "float32")])
    (gz,) = glob.glob(str(tmp_path / "plugins" / "profile" / "run1" / "*.trace.json.gz"))
    with gzip.open(gz, "rt") as fh:
        spans = [e for e in json.load(fh)["traceEvents"] if e["ph"] == "X"]
    assert len(_calls(spans, "tb")) == 1
    # profile_summary reads the gzipped file too, and it is the last one written.
    assert ferrokeras.profile_summary(file=False)[0][1] >= 1


def test_tensorboard_callback_profiles_one_batch(tmp_path):
    pytest.importorskip("tensorboard")
    model = _mlp()
    x, y = _data(64)
    cb = ferrokeras.callbacks.TensorBoard(str(tmp_path), profile_batch=3, write_graph=False)
    model.fit(x, y, batch_size=16, epochs=2, callbacks=[cb], verbose=0)
    traces = glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.trace.json.gz"))
    assert len(traces) == 1
    with gzip.open(traces[0], "rt") as fh:
        spans = [e for e in json.load(fh)["traceEvents"] if e["ph"] == "X"]
    assert len(_calls(spans, "train_function")) == 1
    with pytest.raises(ValueError, match="profile_batch"):
        ferrokeras.callbacks.TensorBoard(str(tmp_path), profile_batch=-1)


def test_off_by_default_records_nothing(tmp_path):
    x = K.placeholder(shape=(2,))
    f = K.function([x], [x + 1], name="quiet")
    f([np.ones(2, "float32")])
    path = tmp_path / "empty.json"
    with ferrokeras.profile(path):
        pass
    assert _spans(path) == []
    assert os.path.getsize(path) > 0


def test_cpu_spans_carry_their_result_shapes(tmp_path):
    """On the CPU each op's span names its result's shape (`args.output`) next to its input
    shapes: a stride-1 and a stride-2 convolution of one input and kernel tell apart by
    it, and a group run after a convolution reports the convolution's result."""
    if GPU:
        pytest.skip("the GPU device's spans record kernels, not schedule items")
    x = K.placeholder(shape=(None, 9, 9, 4))
    w = K.constant(np.ones((3, 3, 4, 8), "float32"))
    one = K.relu(K.conv2d(x, w, padding="same"))
    two = K.conv2d(x, w, strides=(2, 2), padding="same")
    f = K.function([x], [one, K.dot(K.reshape(two, (-1, 8)), K.constant(np.ones((8, 2))))])
    path = str(tmp_path / "trace.json")
    with ferrokeras.profile(path):
        f([np.ones((2, 9, 9, 4), "float32")])
    convs = [s for s in _spans(path) if (s["args"].get("members") or [s["name"]])[0] == "conv"]
    assert sorted(tuple(s["args"]["output"]) for s in convs) == [(2, 5, 5, 8), (2, 9, 9, 8)]
    assert all(s["args"]["inputs"][:2] == [[2, 9, 9, 4], [3, 3, 4, 8]] for s in convs)
    dots = [s for s in _spans(path) if s["name"] in ("matmul", "dot")]
    assert [s["args"]["output"] for s in dots] == [[50, 2]], dots
