# antirectifier: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import keras
import numpy as np
from keras import backend as K
from keras import layers
from keras.models import Sequential


class Antirectifier(layers.Layer):
    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        assert len(shape) == 2
        shape[-1] *= 2
        return tuple(shape)

    def call(self, inputs):
        inputs -= K.mean(inputs, axis=1, keepdims=True)
        inputs = K.l2_normalize(inputs, axis=1)
        pos = K.relu(inputs)
        neg = K.relu(-inputs)
        return K.concatenate([pos, neg], axis=1)


x = np.random.rand(600, 64).astype("float32")
y = keras.utils.to_categorical(np.random.randint(0, 10, 600), 10)
model = Sequential()
model.add(layers.Dense(64, input_shape=(64,)))
model.add(Antirectifier())
model.add(layers.Dropout(0.1))
model.add(layers.Dense(10))
model.add(layers.Activation("softmax"))
model.compile(loss="categorical_crossentropy", optimizer="rmsprop", metrics=["accuracy"])
model.fit(x, y, batch_size=128, epochs=2, verbose=2, validation_data=(x, y))
p = model.predict(x[:5])
np.testing.assert_allclose(p.sum(1), 1, rtol=1e-5)
