"""engine/core/compat.py: each private TensorFlow or Keras API the engine
touches, used as the engine uses it. A TensorFlow or Keras that moves one
fails here, in one place, before it fails a run."""
import keras
import tensorflow as tf

from engine.core import compat


def test_onednn_is_reported_as_the_engine_asked():
  # engine/__init__.py asks for oneDNN's kernels (tests/conftest.py
  # imports it first): tests/test_cpu_kernels.py covers the other cases.
  assert compat.onednn_enabled() is True


def test_xla_is_told_apart_while_a_function_is_traced():
  seen = []

  def traced(x):
    seen.append(compat.in_xla_context())
    return x + 1

  tf.function(traced)(tf.constant(1.0))
  tf.function(traced, jit_compile=True)(tf.constant(1.0))
  assert seen == [False, True]
  assert compat.in_xla_context() is False  # eagerly


def test_the_layers_within_a_model_are_found_at_any_depth():
  class Block(keras.layers.Layer):  # a user's layer holding layers
    def __init__(self):
      super().__init__()
      self.norm = keras.layers.BatchNormalization()

    def call(self, x):
      return self.norm(x)

  inputs = keras.Input((4,))
  inner = keras.Sequential([keras.layers.Dense(4), Block()])
  model = keras.Model(inputs, keras.layers.Dense(2)(inner(inputs)))
  found = compat.layers_within(model)
  assert model in found and inner in found
  assert sum(isinstance(l, keras.layers.BatchNormalization)
             for l in found) == 1
  assert sum(isinstance(l, keras.layers.Dense) for l in found) == 2


def test_the_layer_computing_a_functional_output_is_found():
  inputs = keras.Input((4,))
  head = keras.layers.Dense(2, name="head")
  model = keras.Model(inputs, head(keras.layers.Dense(3)(inputs)))
  assert compat.layer_computing(model.outputs[0]) is head
