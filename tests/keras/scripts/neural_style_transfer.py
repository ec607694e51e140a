# neural_style_transfer: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras import backend as K
from keras.layers import AveragePooling2D, Conv2D, Input
from keras.models import Model
from scipy.optimize import fmin_l_bfgs_b

img_nrows, img_ncols = 24, 24
base_image = K.variable(np.random.rand(1, img_nrows, img_ncols, 3).astype("float32"))
style_reference_image = K.variable(np.random.rand(1, img_nrows, img_ncols, 3).astype("float32"))
combination_image = K.placeholder((1, img_nrows, img_ncols, 3))
input_tensor = K.concatenate([base_image, style_reference_image, combination_image], axis=0)
inp = Input(tensor=input_tensor)
x = Conv2D(8, 3, padding="same", activation="relu", name="block1_conv1")(inp)
x = AveragePooling2D()(x)
x = Conv2D(8, 3, padding="same", activation="relu", name="block2_conv1")(x)
model = Model(inp, x)
outputs_dict = dict([(layer.name, layer.output) for layer in model.layers])


def gram_matrix(x):
    assert K.ndim(x) == 3
    features = K.batch_flatten(K.permute_dimensions(x, (2, 0, 1)))
    gram = K.dot(features, K.transpose(features))
    return gram


def style_loss(style, combination):
    S = gram_matrix(style)
    C = gram_matrix(combination)
    channels = 3
    size = img_nrows * img_ncols
    return K.sum(K.square(S - C)) / (4.0 * (channels**2) * (size**2))


def content_loss(base, combination):
    return K.sum(K.square(combination - base))


def total_variation_loss(x):
    a = K.square(x[:, : img_nrows - 1, : img_ncols - 1, :] - x[:, 1:, : img_ncols - 1, :])
    b = K.square(x[:, : img_nrows - 1, : img_ncols - 1, :] - x[:, : img_nrows - 1, 1:, :])
    return K.sum(K.pow(a + b, 1.25))


loss = K.variable(0.0)
layer_features = outputs_dict["block2_conv1"]
loss = loss + 0.025 * content_loss(layer_features[0, :, :, :], layer_features[2, :, :, :])
for layer_name in ["block1_conv1", "block2_conv1"]:
    lf = outputs_dict[layer_name]
    loss = loss + (1.0 / 2) * style_loss(lf[1, :, :, :], lf[2, :, :, :])
loss = loss + 1.0 * total_variation_loss(combination_image)
grads = K.gradients(loss, combination_image)
outputs = [loss]
if isinstance(grads, (list, tuple)):
    outputs += grads
else:
    outputs.append(grads)
f_outputs = K.function([combination_image], outputs)


def eval_loss_and_grads(x):
    x = x.reshape((1, img_nrows, img_ncols, 3))
    outs = f_outputs([x])
    loss_value = outs[0]
    grad_values = np.array(outs[1:]).flatten().astype("float64")
    return loss_value, grad_values


x = np.random.rand(1, img_nrows, img_ncols, 3) * 255
losses = []
for i in range(3):
    x, min_val, info = fmin_l_bfgs_b(
        lambda v: eval_loss_and_grads(v)[0],
        x.flatten(),
        fprime=lambda v: eval_loss_and_grads(v)[1],
        maxfun=10,
    )
    print("Current loss value:", min_val)
    losses.append(min_val)
assert losses[-1] < losses[0] and all(np.isfinite(losses)), losses
# The gradient K.gradients gives matches central differences of the loss.
x0 = np.random.rand(1, img_nrows, img_ncols, 3) * 255
l, g = eval_loss_and_grads(x0)
for i in [0, 100, 777, 1500]:
    e = np.zeros(x0.size)
    e[i] = 0.5
    fd = (eval_loss_and_grads(x0.flatten() + e)[0] - eval_loss_and_grads(x0.flatten() - e)[0]) / 1.0
    assert abs(fd - g[i]) <= 2e-2 * max(1.0, abs(g[i])) + 1e-6 * abs(l), (i, fd, g[i], l)
