# conv_filter_visualization: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras import backend as K
from keras.layers import Conv2D, MaxPooling2D
from keras.models import Sequential

model = Sequential(
    [
        Conv2D(8, 3, activation="relu", input_shape=(32, 32, 3), name="c1"),
        MaxPooling2D(),
        Conv2D(16, 3, activation="relu", name="c2"),
    ]
)
layer_dict = dict([(layer.name, layer) for layer in model.layers])
input_img = model.input


def normalize(x):
    return x / (K.sqrt(K.mean(K.square(x))) + K.epsilon())


layer_output = layer_dict["c2"].output
for filter_index in range(3):
    loss = K.mean(layer_output[:, :, :, filter_index])
    grads = K.gradients(loss, input_img)[0]
    grads = normalize(grads)
    iterate = K.function([input_img], [loss, grads])
    input_img_data = np.random.random((1, 32, 32, 3)) * 20 + 128.0
    for i in range(5):
        loss_value, grads_value = iterate([input_img_data])
        input_img_data += grads_value * 1.0
    print(filter_index, loss_value)
assert np.isfinite(input_img_data).all() and np.isfinite(loss_value)
# The normalised gradient has unit RMS wherever it is not zero.
g = iterate([np.random.random((1, 32, 32, 3)) * 20 + 128.0])[1]
rms = np.sqrt(np.mean(g**2))
assert rms == 0 or abs(rms - 1) < 1e-3, rms
