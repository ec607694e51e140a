"""Per-op profile of a keras.applications training step (or prediction), ferrokeras next to TF.

    .venv/bin/python benches/profile_apps.py                       # ResNet50, both frameworks
    .venv/bin/python benches/profile_apps.py --model mobilenetv2 --markdown
    .venv/bin/python benches/profile_apps.py --frameworks ferrokeras --top 30
    .venv/bin/python benches/profile_apps.py --model mobilenetv2 --predict --batch 32
    .venv/bin/python benches/profile_apps.py --model mobilenetv2 --one-thread
    .venv/bin/python benches/profile_apps.py --model separable --one-thread

`--model` also takes the models of `bench_models.py` (`separable`, `cifar_bn`, ...), each
with its own optimizer, loss and batch (`--batch` overrides it), on random data.

Each framework runs in a process of its own (the venvs of bench_apps.py), builds the model
(`weights=None`, 128x128x3, 10 classes, SGD with momentum, batch 8), trains three warm-up
steps, then records `--steps` steps: ferrokeras with `ferrokeras.profile` (a span per
schedule item on the calling thread; `ferrokeras.profile_summary` prints its top items with
`--top`), TF with `tf.profiler.experimental` (the executor's op events on its `tf_Compute`
threads, read from the XPlane protobuf it writes). Times are per step. With `--predict` the
profiled steps are `predict_on_batch` calls instead (no training steps first; batch
normalisation in inference mode), at `--batch`.

Op kinds: convolutions by kernel size and stride (forward, input gradient, kernel
gradient), batch normalisation, relu, add, pooling, matmul, the optimizer's update, other.
A TF op's layer is the Keras layer named in its node name; a ferrokeras op's is the
convolution layer whose input, kernel and output shapes match its operands. ferrokeras
fuses elementwise work into its neighbours, so its rows are by what a fused group mostly
does: a convolution's span includes its fused epilogue (bias add, the batch-norm mean
folded in); a group holding batch-norm statistics or their gradient counts as batch norm
(with any relu or add fused into it); a group with a relu (or its gradient) and no
statistics as relu. TF fuses too (`_FusedConv2D` holds the bias add, `FusedBatchNormEx`
the relu). The `bn+relu+add` row adds up the three for a like-for-like comparison.

TF runs independent ops on two executor threads at once, so its op times can add up to more
than the step's wall time; both are printed. With `--one-thread` each framework computes on
one thread (`RAYON_NUM_THREADS=1`; TF with one intra- and one inter-op thread), the mode of
`bench_apps.py --one-thread`, so the two columns compare the work of one core each.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import bench_models  # noqa: E402
import numpy as np  # noqa: E402

MARK = "@@RESULT@@"
MODELS = {"resnet50": "ResNet50", "mobilenetv2": "MobileNetV2"}
SIZE, CLASSES = 128, 10
BN_ROWS = ("batch norm", "relu", "add")
# The models of bench_models.py, by name (building the table needs no Keras).
BENCH_MODELS = tuple(bench_models.models(types.SimpleNamespace(layers=None), np))


def conv_layers(keras, model):
    """[(name, label, x shape, kernel shape, y shape)] of the model's convolutions (shapes
    without the batch dim; a depthwise kernel as (kh, kw, c, multiplier))."""
    out = []
    for layer in model.layers:
        kind = type(layer).__name__
        if kind not in ("Conv2D", "DepthwiseConv2D", "SeparableConv2D"):
            continue
        kshape = tuple(int(d) for d in keras.backend.int_shape(layer.weights[0]))
        s = layer.strides[0]
        kh, kw = layer.kernel_size
        label = f"{'depthwise ' if kind != 'Conv2D' else ''}conv {kh}x{kw}/{s}"
        xs = tuple(int(d) for d in layer.input_shape[1:])
        ys = tuple(int(d) for d in layer.output_shape[1:])
        if kind == "SeparableConv2D":
            # A depthwise convolution into `mid`, then a pointwise one into the output.
            mid = ys[:-1] + (kshape[2] * kshape[3],)
            pshape = tuple(int(d) for d in keras.backend.int_shape(layer.weights[1]))
            out.append((layer.name, label, xs, kshape, mid))
            out.append((layer.name, "conv 1x1/1 (separable)", mid, pshape, ys))
        else:
            out.append((layer.name, label, xs, kshape, ys))
    return out


def build(framework, model_key, batch, predict=False, one_thread=False):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if framework == "ferrokeras":
        os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
        import keras
    else:
        import tensorflow as tf
        import tf_keras as keras

        if one_thread:
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
    if model_key in MODELS:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch or 8, SIZE, SIZE, 3)).astype("float32")
        y = np.eye(CLASSES, dtype="float32")[rng.integers(0, CLASSES, batch or 8)]
        model = getattr(keras.applications, MODELS[model_key])(
            weights=None, input_shape=(SIZE, SIZE, 3), classes=CLASSES
        )
        model.compile(
            keras.optimizers.SGD(learning_rate=0.01, momentum=0.9), "categorical_crossentropy"
        )
    else:
        i, o, opt, loss, xs, ys, default_batch = bench_models.models(keras, np)[model_key]()
        model = keras.Model(i, o)
        model.compile(opt, loss)
        x, y = xs[: batch or default_batch], ys[: batch or default_batch]
    if predict:
        step = lambda: model.predict_on_batch(x)  # noqa: E731
    else:
        step = lambda: model.train_on_batch(x, y)  # noqa: E731
    for _ in range(3):
        step()
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    return keras, model, step, statistics.median(walls)


def kind_of_members(names):
    """The op kind of a ferrokeras fused group or op, from its member op names."""
    ms = set(names)
    if ms & {"max_pool", "avg_pool", "pool", "max_pool_grad", "avg_pool_grad", "pool_grad"}:
        return "pooling"
    if ms & {"matmul", "matmul_acc"}:
        return "matmul"
    if ms & {"mean", "rsqrt"} or ("sum_to" in ms and "broadcast_to" in ms):
        return "batch norm"
    if "relu" in ms or {"greater", "select"} <= ms:
        return "relu"
    if ms <= {"add", "add_n"} and ms:
        return "add"
    if "subtract" in ms and ms <= {"multiply", "subtract", "add"}:
        return "optimizer update"  # SGD with momentum: v = m*v - lr*g; w += v
    return "other"


def layer_of(table, ins, out):
    """The label of the convolution layer whose input shapes are `ins` and whose op result
    has shape `out` (any layer with those inputs where the span has no result shape)."""
    if (ins + (out,)) in table:
        return table[ins + (out,)]
    return next((lab for key, lab in table.items() if key[:2] == ins), "conv ?")


def ferrokeras_profile(model_key, batch, steps, top, predict):
    import ferrokeras

    keras, model, step, wall = build("ferrokeras", model_key, batch, predict)
    layers = conv_layers(keras, model)
    # The engine's grouped convolution takes a depthwise kernel (kh, kw, c, m) as
    # (kh, kw, 1, c * m).
    layers += [
        (n, lab, xs, (ks[0], ks[1], 1, ks[2] * ks[3]), ys)
        for n, lab, xs, ks, ys in layers
        if lab.startswith("depthwise")
    ]
    # A ZeroPadding2D before a convolution folds into it: the convolution reads the
    # padding layer's input.
    unpadded = {
        tuple(int(d) for d in layer.output_shape[1:]): tuple(int(d) for d in layer.input_shape[1:])
        for layer in model.layers
        if type(layer).__name__ == "ZeroPadding2D"
    }
    layers += [(n, lab, unpadded[xs], ks, ys) for n, lab, xs, ks, ys in layers if xs in unpadded]
    # Keyed by the input shapes and the result shape of each op: a stride-1 and a stride-2
    # layer can share an input shape and a kernel (MobileNetV2's block_2 and block_3
    # depthwise convolutions).
    fwd = {(xs, ks, ys): lab for _, lab, xs, ks, ys in layers}
    kgrad = {(xs, ys, ks): lab for _, lab, xs, ks, ys in layers}
    igrad = {(ys, ks, xs): lab for _, lab, xs, ks, ys in layers}
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    with ferrokeras.profile(path):
        for _ in range(steps):
            step()
    if top:
        print(f"== ferrokeras.profile_summary (top {top}, {steps} steps)", file=sys.stderr)
        ferrokeras.profile_summary(path, top=top, file=sys.stderr)
    spans = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    rows = defaultdict(float)
    calls = [s for s in spans if s.get("cat") == "call"]
    for s in spans:
        cat = s.get("cat")
        if cat in ("call", "loop", "loop.run", "loop.step"):
            continue
        args = s.get("args", {})
        members = args.get("members") or [s["name"]]
        ins = [tuple(d) for d in args.get("inputs", [])]
        out = tuple(args.get("output", []))
        head = members[0]
        if cat in ("feed", "source", "constant"):
            kind = "other"
        elif s["name"] == "fused update" or (cat == "fused" and "update" in s["name"]):
            kind = "optimizer update"
        elif head == "conv":
            kind = layer_of(fwd, (ins[0][1:], ins[1]), out[1:]) + " fwd"
        elif head == "conv_transpose":
            kind = layer_of(igrad, (ins[0][1:], ins[1]), out[1:]) + " input grad"
        elif head == "conv_kernel_grad":
            kind = layer_of(kgrad, (ins[0][1:], ins[1][1:]), out) + " kernel grad"
        else:
            kind = kind_of_members(members)
        rows[kind] += float(s.get("dur", 0.0)) / 1e3 / steps
    call_ms = sum(float(c["dur"]) for c in calls) / 1e3 / steps
    return rows, wall * 1e3, call_ms


def tf_profile(model_key, batch, steps, predict, one_thread):
    import tensorflow as tf

    keras, model, step, wall = build("tf", model_key, batch, predict, one_thread)
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    # A layer's labels: two for a separable convolution (its depthwise and pointwise ops).
    layers = defaultdict(list)
    for name, lab, *_ in conv_layers(keras, model):
        layers[name].append(lab)
    all_layers = {layer.name for layer in model.layers}
    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir)
    for _ in range(steps):
        step()
    tf.profiler.experimental.stop()
    files = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
    space = xplane_pb2.XSpace()
    with open(files[-1], "rb") as f:
        space.ParseFromString(f.read())
    rows = defaultdict(float)
    conv_kind = {
        "conv2d": " fwd",
        "conv2dbackpropinput": " input grad",
        "conv2dbackpropfilter": " kernel grad",
        "depthwiseconv2dnative": " fwd",
        "depthwiseconv2dnativebackpropinput": " input grad",
        "depthwiseconv2dnativebackpropfilter": " kernel grad",
    }
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for e in line.events:
                name = plane.event_metadata[e.metadata_id].name
                if ":" not in name or name.endswith("::"):
                    continue
                node, op = name.rsplit(":", 1)
                if not node or "ExecutorState" in node or "Threadpool" in node:
                    continue
                parts = node.split("/")
                layer = next((p for p in parts if p in all_layers), None)
                base = op.replace("_MklNative", "").replace("_Mkl", "").replace("_", "").lower()
                if base.startswith("fusedconv2d"):
                    base = "conv2d"
                kind = "other"
                for key, suffix in sorted(conv_kind.items(), key=lambda kv: -len(kv[0])):
                    if base.startswith(key) and layer in layers:
                        depthwise = key.startswith("depthwise")
                        labs = [
                            lab for lab in layers[layer] if lab.startswith("depthwise") == depthwise
                        ]
                        kind = (labs or layers[layer])[0] + suffix
                        break
                else:
                    if "batchnorm" in base:
                        kind = "batch norm"
                    elif base.startswith("relu"):
                        kind = "relu"
                    elif base in ("addv2", "addn", "add") and not parts[0].startswith("SGD"):
                        kind = "add"
                    elif "pool" in base or (base == "mean" and layer) or base == "tile":
                        kind = "pooling"
                    elif "matmul" in base or base.startswith("biasadd"):
                        kind = "matmul"
                    elif parts[0] in ("SGD", "sgd") or "assign" in base or "apply" in base:
                        kind = "optimizer update"
                rows[kind] += e.duration_ps / 1e9 / steps
    return rows, wall * 1e3, None


def worker(framework, model_key, batch, steps, top, predict, one_thread):
    if framework == "ferrokeras":
        rows, wall, call = ferrokeras_profile(model_key, batch, steps, top, predict)
    else:
        rows, wall, call = tf_profile(model_key, batch, steps, predict, one_thread)
    return {"rows": dict(rows), "wall_ms": wall, "call_ms": call}


def order_key(kind):
    if kind.startswith(("conv", "depthwise")):
        return (0, kind)
    rest = ["batch norm", "relu", "add", "pooling", "matmul", "optimizer update", "other"]
    return (1, rest.index(kind) if kind in rest else len(rest), kind)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", metavar="FRAMEWORK", help=argparse.SUPPRESS)
    p.add_argument(
        "--model",
        default="resnet50",
        choices=sorted(MODELS) + sorted(BENCH_MODELS),
        help="a keras.applications model or a model of bench_models.py",
    )
    p.add_argument("--frameworks", default="ferrokeras,tf")
    p.add_argument(
        "--batch", type=int, default=0, help="batch size (default: 8, or bench_models.py's)"
    )
    p.add_argument("--steps", type=int, default=3, help="profiled steps (times are per step)")
    p.add_argument("--top", type=int, default=0, help="also print ferrokeras' top N items")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument(
        "--predict", action="store_true", help="profile predict_on_batch instead of training"
    )
    p.add_argument(
        "--one-thread",
        action="store_true",
        help="one compute thread per framework (RAYON_NUM_THREADS=1; TF one intra-/inter-op)",
    )
    a = p.parse_args()
    if a.worker:
        res = worker(a.worker, a.model, a.batch, a.steps, a.top, a.predict, a.one_thread)
        print(MARK, json.dumps(res), flush=True)
        return

    from bench_keras import python_for, worker_env

    results = {}
    for fw in [f for f in a.frameworks.split(",") if f]:
        env = worker_env(fw)
        if fw == "ferrokeras":
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")])
            )
        cmd = [str(python_for(fw)), str(Path(__file__).resolve()), "--worker", fw]
        cmd += ["--model", a.model, "--batch", str(a.batch), "--steps", str(a.steps)]
        cmd += ["--top", str(a.top)] + (["--predict"] if a.predict else [])
        if a.one_thread:
            env["RAYON_NUM_THREADS"] = "1"
            cmd.append("--one-thread")
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if a.top and fw == "ferrokeras":
            print("\n".join(ln for ln in proc.stderr.splitlines() if "Warning" not in ln))
        got = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
        if not got:
            print(f"{fw} failed:\n{proc.stderr[-2000:]}")
            continue
        results[fw] = json.loads(got[-1][len(MARK) :])
    fws = list(results)
    kinds = sorted({k for r in results.values() for k in r["rows"]}, key=order_key)
    head = ["op kind"] + [f"{fw} ms" for fw in fws]
    if len(fws) == 2:
        head.append(f"{fws[0]} / {fws[1]}")
    table = [head]

    def line(label, vals):
        row = [label] + [f"{v:.1f}" for v in vals]
        if len(vals) == 2:
            row.append(f"{vals[0] / vals[1]:.2f}" if vals[1] > 0.05 else "")
        table.append(row)

    for k in kinds:
        line(k, [results[fw]["rows"].get(k, 0.0) for fw in fws])
    conv = lambda fw: sum(  # noqa: E731
        v for k, v in results[fw]["rows"].items() if k.startswith(("conv", "depthwise"))
    )
    line("all convolutions", [conv(fw) for fw in fws])
    line("bn+relu+add", [sum(results[fw]["rows"].get(k, 0.0) for k in BN_ROWS) for fw in fws])
    line("all ops", [sum(results[fw]["rows"].values()) for fw in fws])
    line("step wall (median of 3 unprofiled)", [results[fw]["wall_ms"] for fw in fws])
    what = "predict_on_batch call" if a.predict else "training step"
    threads = ", one thread each" if a.one_thread else ""
    batch = a.batch or (8 if a.model in MODELS else "of bench_models.py")
    print(f"{a.model}, batch {batch}, ms per {what} ({a.steps} profiled steps{threads})")
    if a.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        print("\n".join("| " + " | ".join(r) + " |" for r in table[1:]))
    else:
        widths = [max(len(r[i]) for r in table) for i in range(len(head))]
        for r in table:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


if __name__ == "__main__":
    main()
