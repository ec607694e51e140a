# imdb_variants: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras.layers import (
    LSTM,
    Activation,
    Bidirectional,
    Conv1D,
    Dense,
    Dropout,
    Embedding,
    GlobalAveragePooling1D,
    GlobalMaxPooling1D,
    MaxPooling1D,
)
from keras.models import Sequential
from keras.preprocessing import sequence

max_features = 500
maxlen = 40
N = 256
x = sequence.pad_sequences(
    [list(np.random.randint(1, max_features, np.random.randint(5, 60))) for _ in range(N)],
    maxlen=maxlen,
)
y = np.random.randint(0, 2, N)
model = Sequential()
model.add(Embedding(max_features, 16, input_length=maxlen))
model.add(Dropout(0.2))
model.add(Conv1D(32, 3, padding="valid", activation="relu", strides=1))
model.add(GlobalMaxPooling1D())
model.add(Dense(32))
model.add(Dropout(0.2))
model.add(Activation("relu"))
model.add(Dense(1))
model.add(Activation("sigmoid"))
model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=2, validation_data=(x, y), verbose=2)
m2 = Sequential(
    [
        Embedding(max_features, 16, input_length=maxlen),
        GlobalAveragePooling1D(),
        Dense(1, activation="sigmoid"),
    ]
)
m2.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
m2.fit(x, y, batch_size=32, epochs=1, verbose=2)
m3 = Sequential(
    [
        Embedding(max_features, 16, input_length=maxlen),
        Bidirectional(LSTM(8)),
        Dropout(0.5),
        Dense(1, activation="sigmoid"),
    ]
)
m3.compile("adam", "binary_crossentropy", metrics=["accuracy"])
m3.fit(x, y, batch_size=32, epochs=1, validation_data=[x, y], verbose=2)
m4 = Sequential(
    [
        Embedding(max_features, 16, input_length=maxlen),
        Dropout(0.25),
        Conv1D(16, 5, activation="relu"),
        MaxPooling1D(pool_size=4),
        LSTM(8),
        Dense(1),
        Activation("sigmoid"),
    ]
)
m4.compile("adam", "binary_crossentropy", metrics=["accuracy"])
m4.fit(x, y, batch_size=32, epochs=1, verbose=2)
for mm in (model, m2, m3, m4):
    p = mm.predict(x[:4])
    assert p.shape == (4, 1) and ((p > 0) & (p < 1)).all()
