"""A small convolutional network on scikit-learn's bundled digits (8x8 images, 10
classes), written as any Keras 2.3.1 program, running on ferrokeras. `make demo` runs it.

    KERAS_BACKEND=ferrokeras.backend python examples/digits_cnn.py

(the script sets KERAS_BACKEND itself when it is unset). No download: the data set ships
with scikit-learn. Set FERROKERAS_DEVICE to choose the device (default: auto).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ferrokeras.backend")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras.layers import Conv2D, Dense, Dropout, Flatten, MaxPooling2D  # noqa: E402
from keras.models import Sequential  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def main(epochs=30, batch_size=32):
    np.random.seed(0)
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]  # 1797 x 8 x 8 x 1
    y = keras.utils.to_categorical(digits.target, 10)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=digits.target
    )

    model = Sequential(
        [
            Conv2D(16, (3, 3), padding="same", activation="relu", input_shape=(8, 8, 1)),
            Conv2D(32, (3, 3), activation="relu"),
            MaxPooling2D((2, 2)),
            Dropout(0.25),
            Flatten(),
            Dense(64, activation="relu"),
            Dropout(0.3),
            Dense(10, activation="softmax"),
        ]
    )
    model.summary()
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=epochs,
        validation_split=0.1,
        verbose=1,
        callbacks=[
            keras.callbacks.EarlyStopping(monitor="val_loss", patience=6, restore_best_weights=True)
        ],
    )
    loss, acc = model.evaluate(x_test, y_test, verbose=0)
    import ferrokeras

    print(f"backend: {keras.backend.backend()}, device: {ferrokeras.device()}")
    print(f"test loss {loss:.4f}, test accuracy {acc:.4f}")
    return acc


if __name__ == "__main__":
    main()
