"""A small convolutional net (--model=tests/workers/slowed_model.py:
conv_net) whose forward pass sleeps SLOWED_MS milliseconds on the rank
SLOWED_RANK names: one rank slowed on purpose, whose step report must name
it (test_multiprocess.py)."""
import os
import time

import keras
from keras import layers
import tensorflow as tf


class Sleep(layers.Layer):
  """Passes its input on after `seconds` asleep on the host."""

  def __init__(self, seconds: float, **options):
    super().__init__(**options)
    self.seconds = seconds

  def call(self, inputs):
    # After the input, as a layer's work is: the step's clock starts then.
    slept = tf.py_function(lambda _: time.sleep(self.seconds) or 0.0,
                           [inputs[0, 0, 0, 0]], tf.float32)
    with tf.control_dependencies([slept]):
      return tf.identity(inputs)


def conv_net(input_shape, num_classes):
  rank = os.environ.get("HOROVOD_RANK", "0")
  slowed = rank == os.environ.get("SLOWED_RANK")
  inputs = x = keras.Input(input_shape)
  if slowed:
    x = Sleep(float(os.environ["SLOWED_MS"]) / 1e3)(x)
  x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
  x = layers.GlobalAveragePooling2D()(x)
  logits = layers.Dense(num_classes, dtype="float32")(x)
  return keras.Model(inputs, logits, name="slowed_conv_net")
