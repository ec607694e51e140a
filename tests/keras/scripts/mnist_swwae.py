# mnist_swwae: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras import backend as K
from keras.layers import (
    Activation,
    BatchNormalization,
    Conv2D,
    Input,
    Lambda,
    MaxPooling2D,
    UpSampling2D,
    add,
)
from keras.models import Model


def convresblock(x, nfeats=8, ksize=3, nskipped=2, elu=True):
    y0 = Conv2D(nfeats, ksize, padding="same")(x)
    y = y0
    for i in range(nskipped):
        y = BatchNormalization(axis=3)(y)
        y = Activation("elu")(y) if elu else Activation("relu")(y)
        y = Conv2D(nfeats, ksize, padding="same")(y)
    return add([y0, y])


def getwhere(x):
    y_prepool, y_postpool = x
    return K.gradients(K.sum(y_postpool), y_prepool)


x_train = np.random.rand(64, 16, 16, 1).astype("float32")
img_input = Input(shape=(16, 16, 1))
pool_sizes = [2, 2]
feats = [8, 8]
y = Conv2D(8, 3, padding="same")(img_input)
wheres = []
for i in range(2):
    y_prepool = convresblock(y, nfeats=feats[i])
    y = MaxPooling2D(pool_size=2)(y_prepool)
    wheres.append(Lambda(getwhere, output_shape=lambda x: x[0])([y_prepool, y]))
for i in range(1, -1, -1):
    y = UpSampling2D(size=2)(y)
    y = Lambda(lambda x: x[0] * x[1])([y, wheres[i]])
    y = convresblock(y, nfeats=feats[i])
y = Conv2D(1, 1, padding="same", activation="linear")(y)
model = Model(img_input, y)
model.compile("adam", "mse")
h = model.fit(x_train, x_train, batch_size=32, epochs=3, verbose=2)
print(h.history["loss"])
assert h.history["loss"][-1] < h.history["loss"][0], h.history
