"""A Horovod-style Keras 2.3.1 training script, run by tests/test_distributed.py both
under `mpiexec -n 2` and as one plain process; the test compares what they save.

    python train_keras.py OUT_PREFIX

Each rank writes OUT_PREFIX.rank<r>.npz: the final weights of an SGD model (momentum and
clipnorm: clipping applies to the averaged gradient), of an Adam model and of the same
Adam model with its gradients compressed to float16 on the wire, the epoch metrics as
MetricAverageCallback leaves them, and how many gradient collectives ran. Rank 0 also
saves the Adam models to OUT_PREFIX.h5 and OUT_PREFIX.fp16.h5 and loads them back with
plain Keras.
"""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "ferrokeras.backend")

import ferrokeras.distributed as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from ferrokeras import backend as K  # noqa: E402

GLOBAL_BATCH = 16
EPOCHS = 3

hvd.init()
prefix = sys.argv[1]
rng = np.random.RandomState(0)
x = rng.rand(96, 20).astype("float32")
y = keras.utils.to_categorical(rng.randint(0, 3, size=96), 3)
x_shard, y_shard = hvd.shard(x, y)
batch = GLOBAL_BATCH // hvd.size()


def build():
    model = keras.models.Sequential(
        [
            keras.layers.Dense(16, activation="tanh", input_shape=(20,)),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    # Rank 0 (and the single process) start from the same weights; the other ranks start
    # elsewhere, and BroadcastGlobalVariablesCallback must fix that.
    init = np.random.RandomState(1 + 100 * hvd.rank())
    model.set_weights([init.normal(0, 0.5, w.shape).astype("float32") for w in model.weights])
    return model


def save_and_load(model, path):
    """Rank 0 saves `model`; plain Keras loads it back, weights and optimizer state."""
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is keras.optimizers.Adam, type(loaded.optimizer)
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    return loaded


out = {}
for name, make, compression in [
    ("sgd", lambda: keras.optimizers.SGD(lr=0.2, momentum=0.9, clipnorm=0.3), None),
    ("adam", lambda: keras.optimizers.Adam(lr=0.01), hvd.Compression.none),
    ("adam_fp16", lambda: keras.optimizers.Adam(lr=0.01), hvd.Compression.fp16),
]:
    model = build()
    if compression is None:
        opt = hvd.DistributedOptimizer(make())
    else:
        opt = hvd.DistributedOptimizer(make(), compression=compression)
    assert type(opt).__name__ == type(make()).__name__
    model.compile(optimizer=opt, loss="categorical_crossentropy", metrics=["accuracy"])
    before = hvd._comm.S.counts.get("gradient allreduce", 0)
    hist = model.fit(
        x_shard,
        y_shard,
        batch_size=batch,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
        ],
    )
    out[f"{name}_collectives"] = hvd._comm.S.counts.get("gradient allreduce", 0) - before
    out[f"{name}_steps"] = EPOCHS * (len(x_shard) // batch)
    out[f"{name}_host_nodes"] = model.train_function._f.host_nodes
    out[f"{name}_submits"] = model.train_function._f.submits
    for i, w in enumerate(model.get_weights()):
        out[f"{name}_w{i}"] = w
    for k, v in hist.history.items():
        out[f"{name}_{k}"] = np.array(v)
    if name == "adam_fp16" and hvd.rank() == 0:
        loaded = save_and_load(model, prefix + ".fp16.h5")
        out["fp16_loaded_iterations"] = K.get_value(loaded.optimizer.iterations)
    if name == "adam":
        adam_model = model


class RecordLR(keras.callbacks.Callback):
    def on_batch_begin(self, batch, logs=None):
        lrs.append(float(K.get_value(self.model.optimizer.lr)))
        moms.append(float(K.get_value(self.model.optimizer.momentum)))


# Learning-rate warm-up over 2 epochs of 3 steps each, then the full rate.
lrs, moms = [], []
warm_model = build()
warm_model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(lr=0.1, momentum=0.5)), "mse")
warm = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=2),
    RecordLR(),
]
x_few, y_few = x_shard[: 3 * batch], y_shard[: 3 * batch]
warm_model.fit(x_few, y_few, batch_size=batch, epochs=3, callbacks=warm, verbose=0)
out["warmup_lr"], out["warmup_momentum"] = np.array(lrs), np.array(moms)
out["momentum_after"] = K.get_value(warm_model.optimizer.momentum)

# Then a staircase schedule on epochs 1 and 2: 0.1 * 0.5 ** epoch.
lrs.clear()
sched = hvd.callbacks.LearningRateScheduleCallback(
    multiplier=lambda epoch: 0.5**epoch, start_epoch=1, end_epoch=3
)
warm_model.fit(x_few, y_few, batch_size=batch, epochs=4, callbacks=[sched, RecordLR()], verbose=0)
out["schedule_lr"] = np.array(lrs)

if hvd.rank() == 0:
    loaded = save_and_load(adam_model, prefix + ".h5")
    # The optimizer state comes back too.
    out["loaded_iterations"] = K.get_value(loaded.optimizer.iterations)

# Every rank resumes from rank 0's checkpoint with hvd.load_model: a distributed
# optimizer of the saved class, with its state, and training goes on in step.
hvd.allreduce(np.zeros(1), name="checkpoint written")
resumed = hvd.load_model(prefix + ".h5")
assert type(resumed.optimizer).__name__ == "Adam" and resumed.optimizer._ferrokeras_distributed
out["resumed_iterations"] = K.get_value(resumed.optimizer.iterations)
before = hvd._comm.S.counts.get("gradient allreduce", 0)
resumed.fit(x_shard, y_shard, batch_size=batch, epochs=1, shuffle=False, verbose=0)
out["resumed_collectives"] = hvd._comm.S.counts.get("gradient allreduce", 0) - before
out["resumed_w0"] = resumed.get_weights()[0]

np.savez(f"{prefix}.rank{hvd.rank()}.npz", **out)
print(f"TRAINED {hvd.rank()} of {hvd.size()}", flush=True)
