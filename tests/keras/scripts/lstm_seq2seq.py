# lstm_seq2seq: in the style of the Keras 2.3.1 example of that name, shortened, on random data.
import numpy as np
from keras.layers import LSTM, Dense, Input
from keras.models import Model

num_encoder_tokens = 12
num_decoder_tokens = 14
latent_dim = 16
N = 128
enc = np.eye(num_encoder_tokens)[np.random.randint(0, 12, (N, 9))].astype("float32")
dec = np.eye(num_decoder_tokens)[np.random.randint(0, 14, (N, 7))].astype("float32")
tgt = np.roll(dec, -1, axis=1)
encoder_inputs = Input(shape=(None, num_encoder_tokens))
encoder = LSTM(latent_dim, return_state=True)
encoder_outputs, state_h, state_c = encoder(encoder_inputs)
encoder_states = [state_h, state_c]
decoder_inputs = Input(shape=(None, num_decoder_tokens))
decoder_lstm = LSTM(latent_dim, return_sequences=True, return_state=True)
decoder_outputs, _, _ = decoder_lstm(decoder_inputs, initial_state=encoder_states)
decoder_dense = Dense(num_decoder_tokens, activation="softmax")
decoder_outputs = decoder_dense(decoder_outputs)
model = Model([encoder_inputs, decoder_inputs], decoder_outputs)
model.compile(optimizer="rmsprop", loss="categorical_crossentropy", metrics=["accuracy"])
model.fit([enc, dec], tgt, batch_size=32, epochs=2, validation_split=0.2, verbose=2)
encoder_model = Model(encoder_inputs, encoder_states)
decoder_state_input_h = Input(shape=(latent_dim,))
decoder_state_input_c = Input(shape=(latent_dim,))
decoder_states_inputs = [decoder_state_input_h, decoder_state_input_c]
decoder_outputs, state_h, state_c = decoder_lstm(
    decoder_inputs, initial_state=decoder_states_inputs
)
decoder_states = [state_h, state_c]
decoder_outputs = decoder_dense(decoder_outputs)
decoder_model = Model([decoder_inputs] + decoder_states_inputs, [decoder_outputs] + decoder_states)
states_value = encoder_model.predict(enc[:1])
target_seq = np.zeros((1, 1, num_decoder_tokens))
target_seq[0, 0, 0] = 1.0
out = []
for _ in range(5):
    output_tokens, h, c = decoder_model.predict([target_seq] + states_value)
    idx = np.argmax(output_tokens[0, -1, :])
    out.append(idx)
    target_seq = np.zeros((1, 1, num_decoder_tokens))
    target_seq[0, 0, idx] = 1.0
    states_value = [h, c]
print(out)
assert len(out) == 5 and all(0 <= i < num_decoder_tokens for i in out)
assert h.shape == (1, latent_dim) and c.shape == (1, latent_dim)
