"""Fault cases, run under `mpiexec -n 2` by tests/test_distributed.py:

python faults.py mismatch    rank 1's model has a wider layer; both ranks catch the
                             MismatchError and print it, then exit normally
python faults.py window      rank 1 turns the shared-memory window off
                             (FERROKERAS_DIST_SHM_BYTES=0); caught as for mismatch
python faults.py raise       rank 1 raises in the middle of training; the job must end
                             with its error printed by both ranks
python faults.py outofdata   rank 1 has half the data; when it finishes, both fail
"""

import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "ferrokeras.backend")

import ferrokeras.distributed as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

hvd.init()
case = sys.argv[1]
rank = hvd.rank()
rng = np.random.RandomState(0)
x = rng.rand(64, 8).astype("float32")
y = rng.rand(64, 1).astype("float32")
width = 6 if case == "mismatch" and rank == 1 else 4
if case == "window" and rank == 1:
    os.environ["FERROKERAS_DIST_SHM_BYTES"] = "0"
model = keras.models.Sequential(
    [keras.layers.Dense(width, activation="relu", input_shape=(8,)), keras.layers.Dense(1)]
)
model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(lr=0.01)), "mse")


class RaiseAt(keras.callbacks.Callback):
    def on_batch_end(self, batch, logs=None):
        if case == "raise" and rank == 1 and batch == 2:
            raise ValueError("deliberate failure on rank 1 at batch 2")


if case in ("mismatch", "window"):
    try:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    except hvd.MismatchError as e:
        print(f"CAUGHT rank {rank}: {e}", flush=True)
    sys.exit(0)

if case == "timeout" and rank == 1:
    time.sleep(30)
if case == "outofdata" and rank == 1:
    x, y = x[:32], y[:32]
model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[RaiseAt()])
print(f"FINISHED rank {rank}", flush=True)
