# layer_zoo: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import keras
import numpy as np
from keras import regularizers
from keras.callbacks import (
    CSVLogger,
    EarlyStopping,
    LearningRateScheduler,
    ReduceLROnPlateau,
    TerminateOnNaN,
)
from keras.layers import *
from keras.models import Model, Sequential
from keras.preprocessing.image import ImageDataGenerator

x = np.random.rand(128, 16, 16, 3).astype("float32")
y = keras.utils.to_categorical(np.random.randint(0, 10, 128), 10)
inp = Input((16, 16, 3))
h = Conv2D(8, 3, padding="same", kernel_regularizer=regularizers.l2(1e-4))(inp)
h = BatchNormalization()(h)
h = Activation("relu")(h)
s = SeparableConv2D(8, 3, padding="same")(h)
d = DepthwiseConv2D(3, padding="same")(h)
h = add([s, d, h])
h = AveragePooling2D()(h)
h = ZeroPadding2D(1)(h)
h = Cropping2D(1)(h)
h = SpatialDropout2D(0.1)(h)
h = Conv2D(8, 3, dilation_rate=2, padding="same")(h)
h = GlobalAveragePooling2D()(h)
out = Dense(10, activation="softmax")(h)
m = Model(inp, out)
m.compile(
    keras.optimizers.Adam(lr=1e-3),
    "categorical_crossentropy",
    metrics=["accuracy", "top_k_categorical_accuracy"],
)
dg = ImageDataGenerator(width_shift_range=0.1, horizontal_flip=True, rotation_range=10)
dg.fit(x)
m.fit_generator(
    dg.flow(x, y, batch_size=32),
    steps_per_epoch=4,
    epochs=3,
    verbose=2,
    callbacks=[
        ReduceLROnPlateau(monitor="loss", patience=1),
        LearningRateScheduler(lambda e: 1e-3 * 0.9**e),
        EarlyStopping(monitor="loss", patience=5),
        TerminateOnNaN(),
        CSVLogger("log.csv"),
    ],
    validation_data=(x, y),
)
print(m.evaluate_generator(dg.flow(x, y, batch_size=32), steps=2))
# 3d + convlstm + stateful
v = np.random.rand(8, 4, 8, 8, 2).astype("float32")
m3 = Sequential(
    [
        ConvLSTM2D(4, 3, padding="same", return_sequences=True, input_shape=(4, 8, 8, 2)),
        BatchNormalization(),
        Conv3D(1, 3, padding="same", activation="sigmoid"),
    ]
)
m3.compile("adadelta", "binary_crossentropy")
m3.fit(v, v[..., :1], batch_size=4, epochs=1, verbose=2)
m4 = Sequential(
    [
        Conv3D(4, 3, input_shape=(6, 6, 6, 1)),
        MaxPooling3D(),
        UpSampling3D(),
        Conv3DTranspose(2, 3),
        Flatten(),
        Dense(1),
    ]
)
m4.compile("sgd", "mse")
m4.fit(np.random.rand(4, 6, 6, 6, 1), np.random.rand(4, 1), verbose=2)
st = Sequential(
    [
        LSTM(8, batch_input_shape=(4, 5, 3), stateful=True, return_sequences=True),
        SimpleRNN(4, stateful=True),
        Dense(1),
    ]
)
st.compile("adam", "mse")
for _ in range(2):
    st.train_on_batch(np.random.rand(4, 5, 3), np.random.rand(4, 1))
st.reset_states()
print(st.predict(np.random.rand(4, 5, 3), batch_size=4).shape)
e = Sequential(
    [
        Embedding(50, 8, input_length=6, mask_zero=True),
        GRU(8, reset_after=True, return_sequences=True),
        TimeDistributed(Dense(3)),
        LSTM(2),
        Dense(1),
    ]
)
e.compile("nadam", "mse")
e.fit(np.random.randint(0, 50, (16, 6)), np.random.rand(16, 1), verbose=2)
lc = Sequential([LocallyConnected2D(2, 3, input_shape=(6, 6, 1)), Flatten(), Dense(1)])
lc.compile("adamax", "mse")
lc.fit(np.random.rand(4, 6, 6, 1), np.random.rand(4, 1), verbose=2)
p = Sequential(
    [
        PReLU(input_shape=(4,)),
        ELU(),
        ThresholdedReLU(0.1),
        Softmax(),
        GaussianNoise(0.1),
        GaussianDropout(0.1),
        AlphaDropout(0.1),
        ActivityRegularization(0.01, 0.01),
        Dense(2),
        Lambda(lambda t: keras.backend.clip(t, -1, 1)),
    ]
)
p.compile("adagrad", "hinge")
p.fit(np.random.rand(8, 4), np.random.rand(8, 2), verbose=2)
print("ok")
