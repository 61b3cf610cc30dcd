"""models/batch_norm.py: Keras 3's batch normalization, trained through
TensorFlow's fused kernel, computes what Keras' own layer computes."""
import numpy as np
import pytest
import keras
import tensorflow as tf

from engine.compute import precision
from models import batch_norm


def pair(shape, **options):
  """Keras' layer and ours, with the same weights, built for `shape`."""
  ours = batch_norm.BatchNormalization(**options)
  theirs = keras.layers.BatchNormalization(**options)
  for layer in (ours, theirs):
    layer.build(shape)
  rng = np.random.default_rng(0)
  for mine, their in zip(ours.weights, theirs.weights):
    value = rng.uniform(0.5, 1.5, mine.shape).astype("float32")
    mine.assign(value)
    their.assign(value)
  return ours, theirs


def trained(layer, x):
  """The layer's training outputs and the gradients of a loss of them, for
  the inputs and the layer's weights."""
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x, training=True)
    loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2 * tf.range(
        y.shape[-1], dtype=tf.float32))
  return y, tape.gradient(loss, [x, *layer.trainable_weights])


@pytest.mark.parametrize("shape", [(8, 6, 5, 3), (4, 3, 4, 5, 2)],
                         ids=["images", "volumes"])
@pytest.mark.parametrize("options", [dict(), dict(momentum=0.9,
                                                  epsilon=1e-5),
                                     dict(center=False, scale=False)],
                         ids=["defaults", "resnet", "no_affine"])
def test_trains_as_keras_batch_normalization(shape, options):
  ours, theirs = pair(shape, **options)
  x = tf.constant(np.random.default_rng(1).normal(2.0, 3.0, shape),
                  tf.float32)
  graph = tf.function(lambda x: ours(x, training=True)).get_concrete_function(
      x).graph
  assert "FusedBatchNormV3" in {op.type for op in graph.get_operations()}
  (y, gradients), (expected, expected_gradients) = (
      trained(ours, x), trained(theirs, x))
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
  for got, wanted in zip(gradients, expected_gradients, strict=True):
    np.testing.assert_allclose(got, wanted, rtol=1e-4, atol=1e-4)
  # The moving averages, of the biased variance as Keras 3 keeps it.
  for got, wanted in zip(ours.non_trainable_weights,
                         theirs.non_trainable_weights, strict=True):
    assert not np.allclose(got, 1.0)  # moved
    np.testing.assert_allclose(got, wanted, rtol=1e-5, atol=1e-6)
  # Inference is Keras' own computation, of those averages.
  np.testing.assert_allclose(ours(x, training=False),
                             theirs(x, training=False), rtol=1e-5, atol=1e-5)


def test_bfloat16_trains_close_to_float32():
  precision.set_policy("bfloat16")
  try:
    ours = batch_norm.BatchNormalization()
    ours.build((8, 6, 5, 3))
  finally:
    precision.set_policy("none")
  theirs = keras.layers.BatchNormalization()
  theirs.build((8, 6, 5, 3))
  x = tf.constant(np.random.default_rng(1).normal(2.0, 3.0, (8, 6, 5, 3)),
                  tf.float32)
  y = ours(tf.cast(x, tf.bfloat16), training=True)
  assert y.dtype == tf.bfloat16
  np.testing.assert_allclose(tf.cast(y, tf.float32),
                             theirs(x, training=True), atol=0.05)
  np.testing.assert_allclose(ours.moving_mean, theirs.moving_mean,
                             rtol=0.01)


def test_saves_as_a_batch_normalization(tmp_path):
  inputs = keras.Input((6, 5, 3))
  model = keras.Model(inputs, batch_norm.BatchNormalization(
      momentum=0.9)(inputs))
  path = str(tmp_path / "m.keras")
  model.save(path)
  loaded = keras.saving.load_model(path)
  layer = loaded.layers[-1]
  assert type(layer) is batch_norm.BatchNormalization
  assert layer.get_config() == model.layers[-1].get_config()
