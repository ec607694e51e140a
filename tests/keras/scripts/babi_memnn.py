# babi_memnn: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras.layers import LSTM, Activation, Dense, Dropout, Input, Permute, add, concatenate, dot
from keras.layers.embeddings import Embedding
from keras.models import Model, Sequential

vocab_size = 22
story_maxlen = 20
query_maxlen = 5
N = 200
inputs_train = np.random.randint(0, vocab_size, (N, story_maxlen))
queries_train = np.random.randint(0, vocab_size, (N, query_maxlen))
answers_train = np.random.randint(0, vocab_size, N)
input_sequence = Input((story_maxlen,))
question = Input((query_maxlen,))
input_encoder_m = Sequential()
input_encoder_m.add(Embedding(input_dim=vocab_size, output_dim=64))
input_encoder_m.add(Dropout(0.3))
input_encoder_c = Sequential()
input_encoder_c.add(Embedding(input_dim=vocab_size, output_dim=query_maxlen))
input_encoder_c.add(Dropout(0.3))
question_encoder = Sequential()
question_encoder.add(Embedding(input_dim=vocab_size, output_dim=64, input_length=query_maxlen))
question_encoder.add(Dropout(0.3))
input_encoded_m = input_encoder_m(input_sequence)
input_encoded_c = input_encoder_c(input_sequence)
question_encoded = question_encoder(question)
match = dot([input_encoded_m, question_encoded], axes=(2, 2))
match = Activation("softmax")(match)
response = add([match, input_encoded_c])
response = Permute((2, 1))(response)
answer = concatenate([response, question_encoded])
answer = LSTM(32)(answer)
answer = Dropout(0.3)(answer)
answer = Dense(vocab_size)(answer)
answer = Activation("softmax")(answer)
model = Model([input_sequence, question], answer)
model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
h = model.fit(
    [inputs_train, queries_train],
    answers_train,
    batch_size=32,
    epochs=2,
    validation_data=([inputs_train, queries_train], answers_train),
    verbose=2,
)
assert np.isfinite(h.history["loss"]).all()
p = model.predict([inputs_train[:3], queries_train[:3]])
np.testing.assert_allclose(p.sum(1), 1, rtol=1e-5)
