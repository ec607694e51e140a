"""Watching training in TensorBoard, without TensorFlow: a small CNN on scikit-learn's
bundled digits, written as any Keras 2.3.1 program, with Keras's own
``keras.callbacks.TensorBoard`` (on ferrokeras without TensorFlow it is
``ferrokeras.callbacks.TensorBoard``).

    pip install "ferrokeras[keras,tensorboard]"
    KERAS_BACKEND=ferrokeras.backend python examples/digits_tensorboard.py [LOG_DIR]
    tensorboard --logdir LOG_DIR      # then open http://localhost:6006

(the script sets KERAS_BACKEND itself when it is unset; LOG_DIR defaults to
``logs/digits``). The log directory gets the loss, accuracy and learning rate per epoch and
per 256 samples, weight, activation and gradient histograms every epoch, the kernels as
images and the layer graph.
"""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "ferrokeras.backend")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras.layers import Conv2D, Dense, Dropout, Flatten, MaxPooling2D  # noqa: E402
from keras.models import Sequential  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def main(log_dir="logs/digits", epochs=15, batch_size=32):
    np.random.seed(0)
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32").reshape(-1, 8, 8, 1)
    y = keras.utils.to_categorical(digits.target, 10)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=digits.target
    )
    model = Sequential(
        [
            Conv2D(16, 3, padding="same", activation="relu", input_shape=(8, 8, 1)),
            MaxPooling2D(2),
            Conv2D(32, 3, padding="same", activation="relu"),
            Flatten(),
            Dropout(0.3),
            Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(lr=2e-3, decay=1e-3),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
    )
    tensorboard = keras.callbacks.TensorBoard(
        log_dir=log_dir,
        histogram_freq=1,
        write_grads=True,
        write_images=True,
        update_freq=256,
    )
    model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=epochs,
        validation_split=0.15,
        verbose=2,
        callbacks=[tensorboard],
    )
    loss, acc = model.evaluate(x_test, y_test, verbose=0)
    print(f"TensorBoard callback: {type(tensorboard).__module__}.{type(tensorboard).__name__}")
    print(f"test loss {loss:.4f}, test accuracy {acc:.4f}; logs in {log_dir}")
    return acc


if __name__ == "__main__":
    main(*sys.argv[1:2])
