# variational_autoencoder: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
# variational_autoencoder.py (Keras 2.3.1 examples), on random data
import numpy as np
from keras import backend as K
from keras.layers import Dense, Input, Lambda
from keras.losses import binary_crossentropy
from keras.models import Model


def sampling(args):
    z_mean, z_log_var = args
    batch = K.shape(z_mean)[0]
    dim = K.int_shape(z_mean)[1]
    epsilon = K.random_normal(shape=(batch, dim))
    return z_mean + K.exp(0.5 * z_log_var) * epsilon


original_dim = 64
intermediate_dim = 32
latent_dim = 2
x_train = (np.random.rand(512, original_dim) > 0.5).astype("float32")
inputs = Input(shape=(original_dim,), name="encoder_input")
x = Dense(intermediate_dim, activation="relu")(inputs)
z_mean = Dense(latent_dim, name="z_mean")(x)
z_log_var = Dense(latent_dim, name="z_log_var")(x)
z = Lambda(sampling, output_shape=(latent_dim,), name="z")([z_mean, z_log_var])
encoder = Model(inputs, [z_mean, z_log_var, z], name="encoder")
latent_inputs = Input(shape=(latent_dim,), name="z_sampling")
x = Dense(intermediate_dim, activation="relu")(latent_inputs)
outputs = Dense(original_dim, activation="sigmoid")(x)
decoder = Model(latent_inputs, outputs, name="decoder")
outputs = decoder(encoder(inputs)[2])
vae = Model(inputs, outputs, name="vae_mlp")
reconstruction_loss = binary_crossentropy(inputs, outputs) * original_dim
kl_loss = 1 + z_log_var - K.square(z_mean) - K.exp(z_log_var)
kl_loss = K.sum(kl_loss, axis=-1) * -0.5
vae_loss = K.mean(reconstruction_loss + kl_loss)
vae.add_loss(vae_loss)
vae.compile(optimizer="adam")
vae.summary()
h = vae.fit(x_train, epochs=3, batch_size=64, validation_data=(x_train, None), verbose=2)
print(h.history)
zm, _, _ = encoder.predict(x_train, batch_size=64)
print(zm.shape)
assert h.history["loss"][-1] < h.history["loss"][0], h.history
assert zm.shape == (512, 2) and np.isfinite(zm).all()
