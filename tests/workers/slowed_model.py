"""A small convolutional net (--model=tests/workers/slowed_model.py:
conv_net), or the CPU recipe's CNN (`recipe_cnn`, gradients of its size
for a link to carry: docs/performance.md's report), whose forward pass
sleeps on the ranks the environment names: ranks or a whole host slowed
on purpose, whose step report must name them (test_multiprocess.py,
test_multihost.py).

  SLOWED_RANK, SLOWED_MS    the process of this rank sleeps SLOWED_MS ms
  SLOWED_EVERY              in every this-many-th training forward pass
                            (default 1: every one), counted from the first
  SLOWED_HOST, SLOWED_HOST_MS  every process on this host (its hostname)
                            sleeps SLOWED_HOST_MS ms in every one
"""
import os
import socket
import time

import keras
from keras import layers
import tensorflow as tf

import models


class Sleep(layers.Layer):
  """Passes its input on after `seconds` asleep on the host, in every
  `every`-th training pass."""

  def __init__(self, seconds: float, every: int = 1, **options):
    super().__init__(**options)
    self.seconds = seconds
    self.every = every
    self.passes = 0

  def _sleep(self, _):
    self.passes += 1
    if (self.passes - 1) % self.every == 0:
      time.sleep(self.seconds)
    return 0.0

  def call(self, inputs, training=None):
    if not training:
      return inputs
    # After the input, as a layer's work is: the step's clock starts then.
    slept = tf.py_function(self._sleep, [inputs[0, 0, 0, 0]], tf.float32)
    with tf.control_dependencies([slept]):
      return tf.identity(inputs)


def _delays() -> list[tuple[float, int]]:
  """(seconds, every) of each sleep this process takes."""
  delays = []
  if os.environ.get("HOROVOD_RANK", "0") == os.environ.get("SLOWED_RANK"):
    delays.append((float(os.environ["SLOWED_MS"]) / 1e3,
                   int(os.environ.get("SLOWED_EVERY", "1"))))
  if socket.gethostname() == os.environ.get("SLOWED_HOST"):
    delays.append((float(os.environ["SLOWED_HOST_MS"]) / 1e3, 1))
  return delays


def conv_net(input_shape, num_classes):
  inputs = x = keras.Input(input_shape)
  for seconds, every in _delays():
    x = Sleep(seconds, every)(x)
  x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
  x = layers.GlobalAveragePooling2D()(x)
  logits = layers.Dense(num_classes, dtype="float32")(x)
  return keras.Model(inputs, logits, name="slowed_conv_net")


def recipe_cnn(input_shape, num_classes):
  inputs = x = keras.Input(input_shape)
  for seconds, every in _delays():
    x = Sleep(seconds, every)(x)
  cnn = models.build("cnn", input_shape=input_shape, num_classes=num_classes,
                     filters=32)
  return keras.Model(inputs, cnn(x), name="slowed_recipe_cnn")
