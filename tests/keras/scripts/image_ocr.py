# image_ocr: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras import backend as K
from keras.layers import Activation, Conv2D, Dense, Input, Lambda, MaxPooling2D, Reshape
from keras.layers.merge import add, concatenate
from keras.layers.recurrent import GRU
from keras.models import Model
from keras.optimizers import SGD


def ctc_lambda_func(args):
    y_pred, labels, input_length, label_length = args
    y_pred = y_pred[:, 2:, :]
    return K.ctc_batch_cost(labels, y_pred, input_length, label_length)


img_w, img_h = 64, 32
conv_filters = 8
kernel_size = (3, 3)
pool_size = 2
time_dense_size = 16
rnn_size = 16
n_labels = 10
absolute_max_string_len = 4
minibatch = 16
input_shape = (img_w, img_h, 1)
act = "relu"
input_data = Input(name="the_input", shape=input_shape, dtype="float32")
inner = Conv2D(
    conv_filters,
    kernel_size,
    padding="same",
    activation=act,
    kernel_initializer="he_normal",
    name="conv1",
)(input_data)
inner = MaxPooling2D(pool_size=(pool_size, pool_size), name="max1")(inner)
inner = Conv2D(
    conv_filters,
    kernel_size,
    padding="same",
    activation=act,
    kernel_initializer="he_normal",
    name="conv2",
)(inner)
inner = MaxPooling2D(pool_size=(pool_size, pool_size), name="max2")(inner)
conv_to_rnn_dims = (img_w // (pool_size**2), (img_h // (pool_size**2)) * conv_filters)
inner = Reshape(target_shape=conv_to_rnn_dims, name="reshape")(inner)
inner = Dense(time_dense_size, activation=act, name="dense1")(inner)
gru_1 = GRU(rnn_size, return_sequences=True, kernel_initializer="he_normal", name="gru1")(inner)
gru_1b = GRU(
    rnn_size,
    return_sequences=True,
    go_backwards=True,
    kernel_initializer="he_normal",
    name="gru1_b",
)(inner)
gru1_merged = add([gru_1, gru_1b])
gru_2 = GRU(rnn_size, return_sequences=True, kernel_initializer="he_normal", name="gru2")(
    gru1_merged
)
gru_2b = GRU(
    rnn_size,
    return_sequences=True,
    go_backwards=True,
    kernel_initializer="he_normal",
    name="gru2_b",
)(gru1_merged)
inner = Dense(n_labels + 1, kernel_initializer="he_normal", name="dense2")(
    concatenate([gru_2, gru_2b])
)
y_pred = Activation("softmax", name="softmax")(inner)
Model(inputs=input_data, outputs=y_pred).summary()
labels = Input(name="the_labels", shape=[absolute_max_string_len], dtype="float32")
input_length = Input(name="input_length", shape=[1], dtype="int64")
label_length = Input(name="label_length", shape=[1], dtype="int64")
loss_out = Lambda(ctc_lambda_func, output_shape=(1,), name="ctc")(
    [y_pred, labels, input_length, label_length]
)
sgd = SGD(lr=0.02, decay=1e-6, momentum=0.9, nesterov=True, clipnorm=5)
model = Model(inputs=[input_data, labels, input_length, label_length], outputs=loss_out)
model.compile(loss={"ctc": lambda y_true, y_pred: y_pred}, optimizer=sgd)
test_func = K.function([input_data], [y_pred])
N = 64
X = np.random.rand(N, img_w, img_h, 1).astype("float32")
L = np.random.randint(0, n_labels, (N, absolute_max_string_len)).astype("float32")
il = np.full((N, 1), img_w // 4 - 2)
ll = np.random.randint(1, absolute_max_string_len + 1, (N, 1))
inputs = {"the_input": X, "the_labels": L, "input_length": il, "label_length": ll}
outputs = {"ctc": np.zeros([N])}
h = model.fit(inputs, outputs, batch_size=minibatch, epochs=3, verbose=2)
out = test_func([X[:4]])[0]
ret = []
for j in range(out.shape[0]):
    out_best = list(np.argmax(out[j, 2:], 1))
    ret.append(out_best)
print(ret[0])
dec = K.ctc_decode(out, np.full(4, out.shape[1]), greedy=False, beam_width=5)[0][0]
print(K.get_value(dec))
assert h.history["loss"][-1] < h.history["loss"][0], h.history
d = K.get_value(dec)
assert (
    d.shape[0] == 4 and d.dtype == np.int64 and ((d == -1) | ((d >= 0) & (d < n_labels + 1))).all()
)
