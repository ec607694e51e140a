"""Data-parallel training of an MLP on scikit-learn's digits with ferrokeras.distributed,
written as a horovod.keras script (the only change is the import):

    mpiexec -n 2 python examples/distributed_digits.py
    mpiexec -n 2 python examples/distributed_digits.py --fp16   # float16 gradients on the wire
    python examples/distributed_digits.py          # one process works too

Every rank trains on its own shard of the training set; the gradients are averaged over
the ranks every step; rank 0 prints the progress, saves the checkpoint and evaluates.
Reaches about 95% test accuracy in a few seconds.
"""

import argparse
import os
import tempfile

os.environ.setdefault("KERAS_BACKEND", "ferrokeras.backend")

import ferrokeras.distributed as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras.layers import Dense, Dropout  # noqa: E402
from keras.models import Sequential  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def main(epochs=12, batch_size=32, checkpoint=None, fp16=False):
    hvd.init()
    np.random.seed(hvd.rank())  # dropout masks differ per rank, as they would on one rank
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = keras.utils.to_categorical(digits.target, 10)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=digits.target
    )
    # Each rank its share, all the same length: the same number of steps everywhere.
    x_shard, y_shard = hvd.shard(x_train, y_train)

    model = Sequential(
        [
            Dense(128, activation="relu", input_shape=(64,)),
            Dropout(0.2),
            Dense(64, activation="relu"),
            Dense(10, activation="softmax"),
        ]
    )
    # The batch is batch_size per rank, batch_size * size in all: scale the learning
    # rate with it, and warm it up over the first epochs.
    # With --fp16 the gradients cross the wire as float16 (half the bytes).
    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    opt = hvd.DistributedOptimizer(
        keras.optimizers.Adam(lr=1e-3 * hvd.size()), compression=compression
    )
    model.compile(optimizer=opt, loss="categorical_crossentropy", metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=2, verbose=1),
    ]
    if hvd.rank() == 0 and checkpoint:
        # Only rank 0 writes checkpoints: every rank holds the same weights.
        callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint))
    model.fit(
        x_shard,
        y_shard,
        batch_size=batch_size,
        epochs=epochs,
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )
    if hvd.rank() == 0:
        loss, acc = model.evaluate(x_test, y_test, verbose=0)
        print(f"ranks: {hvd.size()}, samples per rank: {len(x_shard)}")
        print(f"test loss {loss:.4f}")
        print(f"test accuracy {acc:.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--checkpoint",
        default=os.path.join(tempfile.gettempdir(), "distributed_digits.h5"),
        help="where rank 0 saves the model after every epoch ('' for nowhere)",
    )
    parser.add_argument(
        "--fp16", action="store_true", help="compress the gradients to float16 on the wire"
    )
    args = parser.parse_args()
    main(args.epochs, args.batch_size, args.checkpoint, args.fp16)
