# addition_rnn: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras import layers
from keras.models import Sequential

RNN = layers.LSTM
HIDDEN_SIZE = 32
BATCH_SIZE = 32
LAYERS = 1
MAXLEN = 7
chars = 12
x = np.zeros((640, MAXLEN, chars), dtype=bool)
y = np.zeros((640, 4, chars), dtype=bool)
rng = np.random.RandomState(0)
for i in range(640):
    x[i, np.arange(MAXLEN), rng.randint(0, chars, MAXLEN)] = 1
    y[i, np.arange(4), rng.randint(0, chars, 4)] = 1
model = Sequential()
model.add(RNN(HIDDEN_SIZE, input_shape=(MAXLEN, chars)))
model.add(layers.RepeatVector(4))
for _ in range(LAYERS):
    model.add(RNN(HIDDEN_SIZE, return_sequences=True))
model.add(layers.TimeDistributed(layers.Dense(chars, activation="softmax")))
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
model.summary()
h = model.fit(x, y, batch_size=BATCH_SIZE, epochs=3, validation_split=0.1, verbose=2)
print(model.predict_classes(x[:2], verbose=0))
assert h.history["loss"][-1] < h.history["loss"][0], h.history
