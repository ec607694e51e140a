"""An LSTM reading scikit-learn's bundled digits row by row (a sequence of 8 rows of 8
pixels each), written as any Keras 2.3.1 program, running on ferrokeras.

    KERAS_BACKEND=ferrokeras.backend python examples/lstm_digits.py

(the script sets KERAS_BACKEND itself when it is unset). No download: the data set ships
with scikit-learn.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ferrokeras.backend")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras.layers import LSTM, Dense  # noqa: E402
from keras.models import Sequential  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def main(epochs=40, batch_size=32):
    np.random.seed(0)
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")  # 1797 x 8 timesteps x 8 features
    y = digits.target
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=y
    )

    model = Sequential(
        [
            LSTM(64, input_shape=(8, 8)),
            Dense(10, activation="softmax"),
        ]
    )
    model.summary()
    model.compile(
        optimizer=keras.optimizers.Adam(lr=3e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=epochs,
        validation_split=0.1,
        verbose=2,
        callbacks=[
            keras.callbacks.EarlyStopping(monitor="val_loss", patience=6, restore_best_weights=True)
        ],
    )
    loss, acc = model.evaluate(x_test, y_test, verbose=0)
    print(f"backend: {keras.backend.backend()}")
    print(f"test loss {loss:.4f}, test accuracy {acc:.4f}")
    return acc


if __name__ == "__main__":
    main()
