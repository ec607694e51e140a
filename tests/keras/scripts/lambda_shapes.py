# lambda_shapes: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras import backend as K
from keras.layers import Dense, Lambda
from keras.models import Sequential

m = Sequential([Lambda(lambda x: K.mean(x, axis=1), input_shape=(5, 8)), Dense(3)])
m.summary()
m.compile("adam", "mse")
m.fit(np.random.rand(16, 5, 8), np.random.rand(16, 3), verbose=2)
m2 = Sequential([Lambda(lambda x: K.concatenate([x, x], axis=-1), input_shape=(4,)), Dense(2)])
m2.summary()
assert m2.output_shape == (None, 2) and m.layers[0].output_shape == (None, 8)
