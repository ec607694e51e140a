"""Cross-check of the convolution and pooling functions against TensorFlow's own ops
(`tf.nn.*`, in benches/.venvs/tf) on the same inputs: the semantics a NumPy reference
cannot settle by itself (TF's `same` split, depthwise channel order, transposed-convolution
padding, `avg` pooling over the in-bounds elements only). Run by `make bench-conv`:

    python benches/check_conv_vs_tf.py
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
mode = sys.argv[1] if len(sys.argv) > 1 else "driver"
if mode == "driver":
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fk.npz")
        subprocess.run([sys.executable, __file__, "fk", path], check=True)
        r = subprocess.run(
            [
                os.path.join(
                    os.environ.get("FERROKERAS_BENCH_VENVS", os.path.join(HERE, ".venvs")),
                    "tf",
                    "bin",
                    "python",
                ),
                __file__,
                "tf",
                path,
            ],
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
            capture_output=True,
            text=True,
        )
        print(r.stdout, end="")
        if r.returncode != 0 or "MISMATCH" in r.stdout:
            print(r.stderr[-2000:])
            sys.exit(1)
    sys.exit(0)
path = sys.argv[2]
rng = np.random.default_rng(1)
x4 = rng.standard_normal((2, 9, 8, 3)).astype(np.float32)
x5 = rng.standard_normal((2, 5, 6, 7, 3)).astype(np.float32)
x3 = rng.standard_normal((2, 11, 3)).astype(np.float32)
k4 = rng.standard_normal((3, 2, 3, 4)).astype(np.float32)
dk = rng.standard_normal((3, 3, 3, 2)).astype(np.float32)
pk = rng.standard_normal((1, 1, 6, 5)).astype(np.float32)
kt = rng.standard_normal((3, 3, 5, 3)).astype(np.float32)
k5 = rng.standard_normal((2, 3, 2, 3, 4)).astype(np.float32)
k3 = rng.standard_normal((3, 3, 4)).astype(np.float32)
xw = rng.standard_normal((2, 9, 10, 32)).astype(np.float32)
kw = rng.standard_normal((3, 3, 32, 24)).astype(np.float32)
cases = {}
if mode == "fk":
    from ferrokeras import backend as K

    C = K.constant
    cases["conv2d same s2"] = K.conv2d(C(x4), C(k4), strides=2, padding="same")
    cases["conv2d same d2"] = K.conv2d(C(x4), C(k4), padding="same", dilation_rate=2)
    cases["conv2d 3x3 32->24 same"] = K.conv2d(C(xw), C(kw), padding="same")
    cases["conv1d causal d2"] = K.conv1d(C(x3), C(k3), padding="causal", dilation_rate=2)
    cases["conv1d same s3"] = K.conv1d(C(x3), C(k3), padding="same", strides=3)
    cases["conv3d same s(2,1,2)"] = K.conv3d(C(x5), C(k5), strides=(2, 1, 2), padding="same")
    cases["depthwise same s2"] = K.depthwise_conv2d(C(x4), C(dk), strides=2, padding="same")
    cases["separable same"] = K.separable_conv2d(C(x4), C(dk), C(pk), padding="same")
    cases["conv2d_transpose same s2"] = K.conv2d_transpose(
        C(x4), C(kt), (2, 18, 15, 5), strides=2, padding="same"
    )
    cases["conv2d_transpose valid s2"] = K.conv2d_transpose(
        C(x4), C(kt), (2, 19, 17, 5), strides=2, padding="valid"
    )
    cases["avg pool same 3x3 s2"] = K.pool2d(C(x4), (3, 3), (2, 2), "same", pool_mode="avg")
    cases["max pool same 3x3 s2"] = K.pool2d(C(x4), (3, 3), (2, 2), "same", pool_mode="max")
    cases["avg pool3d same"] = K.pool3d(C(x5), (2, 3, 2), (2, 2, 2), "same", pool_mode="avg")
    np.savez(path, **{k: K.eval(v) for k, v in cases.items()})
else:
    import tensorflow as tf

    ref = np.load(path)
    cases["conv2d same s2"] = tf.nn.conv2d(x4, k4, 2, "SAME")
    cases["conv2d same d2"] = tf.nn.conv2d(x4, k4, 1, "SAME", dilations=2)
    cases["conv2d 3x3 32->24 same"] = tf.nn.conv2d(xw, kw, 1, "SAME")
    cases["conv1d causal d2"] = tf.nn.conv1d(
        np.pad(x3, [(0, 0), (4, 0), (0, 0)]), k3, 1, "VALID", dilations=2
    )
    cases["conv1d same s3"] = tf.nn.conv1d(x3, k3, 3, "SAME")
    cases["conv3d same s(2,1,2)"] = tf.nn.conv3d(x5, k5, [1, 2, 1, 2, 1], "SAME")
    cases["depthwise same s2"] = tf.nn.depthwise_conv2d(x4, dk, [1, 2, 2, 1], "SAME")
    cases["separable same"] = tf.nn.separable_conv2d(x4, dk, pk, [1, 1, 1, 1], "SAME")
    cases["conv2d_transpose same s2"] = tf.nn.conv2d_transpose(x4, kt, (2, 18, 15, 5), 2, "SAME")
    cases["conv2d_transpose valid s2"] = tf.nn.conv2d_transpose(x4, kt, (2, 19, 17, 5), 2, "VALID")
    cases["avg pool same 3x3 s2"] = tf.nn.avg_pool2d(x4, 3, 2, "SAME")
    cases["max pool same 3x3 s2"] = tf.nn.max_pool2d(x4, 3, 2, "SAME")
    cases["avg pool3d same"] = tf.nn.avg_pool3d(x5, (2, 3, 2), 2, "SAME")
    for k, v in cases.items():
        v = v.numpy()
        print(
            f"{k:28} shape {str(v.shape):18} "
            f"max abs diff vs ferrokeras {np.max(np.abs(v - ref[k])):.2e}",
            "OK"
            if v.shape == ref[k].shape and np.allclose(v, ref[k], rtol=1e-4, atol=1e-4)
            else "MISMATCH",
        )
