"""Run by tests/test_fit_ranks.py as engine.train's --dataset, --model and
--callbacks functions, under `horovodrun -np 2`: a fit script's parts given
by flags alone. At the run's end every rank writes its weights and Keras'
own evaluate of them on the whole validation set into $TFDATA_OUT."""
import json
import os

import keras
import numpy as np
import tensorflow as tf


def _examples(count, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(count, 6)).astype("float32")
  return x, (x[:, 0] + x[:, 1] > 0).astype("int64")


def validation():
  # 100 examples in batches of 32: a short last batch, and 2 ranks.
  return tf.data.Dataset.from_tensor_slices(_examples(100, 1)).batch(32)


def datasets():
  train = tf.data.Dataset.from_tensor_slices(_examples(256, 0)).shuffle(
      256, seed=2).batch(16)
  return train, validation()


def classifier(input_shape):
  # Each rank its own initial weights: the engine's broadcast makes them one.
  keras.utils.set_random_seed(int(os.environ.get("HOROVOD_RANK", "0")))
  model = keras.Sequential([keras.Input(input_shape),
                            keras.layers.Dense(8, activation="relu"),
                            keras.layers.Dense(2)])
  model.compile(optimizer=keras.optimizers.Adam(1e-2),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True), metrics=["accuracy"])
  return model


class Saved(keras.callbacks.Callback):
  """On every rank (it writes no file of the run's)."""

  def on_train_end(self, logs=None):
    rank = os.environ.get("HOROVOD_RANK", "0")
    out = os.environ["TFDATA_OUT"]
    np.savez(os.path.join(out, f"rank{rank}.npz"), *self.model.get_weights())
    loss, accuracy = self.model.evaluate(validation(), verbose=0)
    with open(os.path.join(out, f"evaluated{rank}.json"), "w") as f:
      json.dump({"loss": loss, "accuracy": accuracy}, f)


def callbacks():
  return [Saved()]
