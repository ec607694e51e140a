# improved_wgan: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
from functools import partial

import numpy as np
from keras import backend as K
from keras.layers import (
    BatchNormalization,
    Conv2D,
    Conv2DTranspose,
    Dense,
    Flatten,
    Input,
    LeakyReLU,
    Reshape,
)
from keras.layers.merge import _Merge
from keras.models import Model, Sequential
from keras.optimizers import Adam

BATCH_SIZE = 16
GRADIENT_PENALTY_WEIGHT = 10


def wasserstein_loss(y_true, y_pred):
    return K.mean(y_true * y_pred)


def gradient_penalty_loss(y_true, y_pred, averaged_samples, gradient_penalty_weight):
    gradients = K.gradients(y_pred, averaged_samples)[0]
    gradients_sqr = K.square(gradients)
    gradients_sqr_sum = K.sum(gradients_sqr, axis=np.arange(1, len(gradients_sqr.shape)))
    gradient_l2_norm = K.sqrt(gradients_sqr_sum)
    gradient_penalty = gradient_penalty_weight * K.square(1 - gradient_l2_norm)
    return K.mean(gradient_penalty)


def make_generator():
    model = Sequential()
    model.add(Dense(64, input_dim=10))
    model.add(LeakyReLU())
    model.add(Dense(8 * 4 * 4))
    model.add(BatchNormalization())
    model.add(LeakyReLU())
    model.add(Reshape((4, 4, 8)))
    model.add(Conv2DTranspose(8, (5, 5), strides=2, padding="same"))
    model.add(BatchNormalization(axis=-1))
    model.add(LeakyReLU())
    model.add(Conv2D(1, (5, 5), padding="same", activation="tanh"))
    return model


def make_discriminator():
    model = Sequential()
    model.add(Conv2D(8, (5, 5), padding="same", input_shape=(8, 8, 1)))
    model.add(LeakyReLU())
    model.add(Conv2D(8, (5, 5), kernel_initializer="he_normal", strides=[2, 2]))
    model.add(LeakyReLU())
    model.add(Flatten())
    model.add(Dense(16, kernel_initializer="he_normal"))
    model.add(LeakyReLU())
    model.add(Dense(1, kernel_initializer="he_normal"))
    return model


class RandomWeightedAverage(_Merge):
    def _merge_function(self, inputs):
        weights = K.random_uniform((BATCH_SIZE, 1, 1, 1))
        return (weights * inputs[0]) + ((1 - weights) * inputs[1])


X_train = np.random.rand(64, 8, 8, 1).astype("float32") * 2 - 1
generator = make_generator()
discriminator = make_discriminator()
for layer in discriminator.layers:
    layer.trainable = False
discriminator.trainable = False
generator_input = Input(shape=(10,))
generator_layers = generator(generator_input)
discriminator_layers_for_generator = discriminator(generator_layers)
generator_model = Model(inputs=[generator_input], outputs=[discriminator_layers_for_generator])
generator_model.compile(optimizer=Adam(0.0001, beta_1=0.5, beta_2=0.9), loss=wasserstein_loss)
for layer in discriminator.layers:
    layer.trainable = True
for layer in generator.layers:
    layer.trainable = False
discriminator.trainable = True
generator.trainable = False
real_samples = Input(shape=X_train.shape[1:])
generator_input_for_discriminator = Input(shape=(10,))
generated_samples_for_discriminator = generator(generator_input_for_discriminator)
discriminator_output_from_generator = discriminator(generated_samples_for_discriminator)
discriminator_output_from_real_samples = discriminator(real_samples)
averaged_samples = RandomWeightedAverage()([real_samples, generated_samples_for_discriminator])
averaged_samples_out = discriminator(averaged_samples)
partial_gp_loss = partial(
    gradient_penalty_loss,
    averaged_samples=averaged_samples,
    gradient_penalty_weight=GRADIENT_PENALTY_WEIGHT,
)
partial_gp_loss.__name__ = "gradient_penalty"
discriminator_model = Model(
    inputs=[real_samples, generator_input_for_discriminator],
    outputs=[
        discriminator_output_from_real_samples,
        discriminator_output_from_generator,
        averaged_samples_out,
    ],
)
discriminator_model.compile(
    optimizer=Adam(0.0001, beta_1=0.5, beta_2=0.9),
    loss=[wasserstein_loss, wasserstein_loss, partial_gp_loss],
)
positive_y = np.ones((BATCH_SIZE, 1), dtype=np.float32)
negative_y = -positive_y
dummy_y = np.zeros((BATCH_SIZE, 1), dtype=np.float32)
for epoch in range(2):
    np.random.shuffle(X_train)
    for i in range(X_train.shape[0] // BATCH_SIZE):
        image_batch = X_train[i * BATCH_SIZE : (i + 1) * BATCH_SIZE]
        noise = np.random.rand(BATCH_SIZE, 10).astype(np.float32)
        dl = discriminator_model.train_on_batch(
            [image_batch, noise], [positive_y, negative_y, dummy_y]
        )
    gl = generator_model.train_on_batch(np.random.rand(BATCH_SIZE, 10), positive_y)
    print(epoch, dl, gl)
    assert np.isfinite(dl).all() and np.isfinite(gl)
