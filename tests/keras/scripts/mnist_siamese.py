# mnist_siamese: in the style of the Keras 2.3.1 example of that name, shortened, on random data.

import numpy as np
from keras import backend as K
from keras.layers import Dense, Dropout, Flatten, Input, Lambda
from keras.models import Model
from keras.optimizers import RMSprop


def euclidean_distance(vects):
    x, y = vects
    sum_square = K.sum(K.square(x - y), axis=1, keepdims=True)
    return K.sqrt(K.maximum(sum_square, K.epsilon()))


def eucl_dist_output_shape(shapes):
    shape1, shape2 = shapes
    return (shape1[0], 1)


def contrastive_loss(y_true, y_pred):
    margin = 1
    square_pred = K.square(y_pred)
    margin_square = K.square(K.maximum(margin - y_pred, 0))
    return K.mean(y_true * square_pred + (1 - y_true) * margin_square)


def accuracy(y_true, y_pred):
    return K.mean(K.equal(y_true, K.cast(y_pred < 0.5, y_true.dtype)))


def create_base_network(input_shape):
    input = Input(shape=input_shape)
    x = Flatten()(input)
    x = Dense(32, activation="relu")(x)
    x = Dropout(0.1)(x)
    x = Dense(32, activation="relu")(x)
    return Model(input, x)


input_shape = (8, 8)
pa = np.random.rand(400, 2, 8, 8).astype("float32")
y = np.random.randint(0, 2, 400).astype("float32")
base_network = create_base_network(input_shape)
input_a = Input(shape=input_shape)
input_b = Input(shape=input_shape)
processed_a = base_network(input_a)
processed_b = base_network(input_b)
distance = Lambda(euclidean_distance, output_shape=eucl_dist_output_shape)(
    [processed_a, processed_b]
)
model = Model([input_a, input_b], distance)
rms = RMSprop()
model.compile(loss=contrastive_loss, optimizer=rms, metrics=[accuracy])
model.fit(
    [pa[:, 0], pa[:, 1]],
    y,
    batch_size=128,
    epochs=2,
    validation_data=([pa[:, 0], pa[:, 1]], y),
    verbose=2,
)
print(model.predict([pa[:, 0], pa[:, 1]])[:3])
d = model.predict([pa[:, 0], pa[:, 1]])
ea = base_network.predict(pa[:, 0])
eb = base_network.predict(pa[:, 1])
ref = np.sqrt(np.maximum(((ea - eb) ** 2).sum(1, keepdims=True), 1e-7))
np.testing.assert_allclose(d, ref, rtol=1e-4, atol=1e-5)
