"""models/pointwise.py: Keras' pointwise convolutions, computed as matrix
products in any model, compute what Keras' own convolution computes, and
stay Keras' own layers to everything else."""
import numpy as np
import pytest
import keras
import tensorflow as tf

from models import pointwise
from tests import fixtures


def op_types(function, *args) -> set:
  graph = tf.function(function).get_concrete_function(*args).graph
  return {op.type for op in graph.get_operations()}


def trained(layer, x):
  """The layer's outputs and the gradients of a fixed weighting of them,
  for the inputs and the layer's weights."""
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x, training=True)
    loss = tf.reduce_sum(y * tf.random.stateless_normal(y.shape, (1, 2)))
  return [y, *tape.gradient(loss, [x, *layer.trainable_weights])]


@pytest.mark.parametrize("layer_class, options, shape", [
    (keras.layers.Conv2D, dict(), (4, 6, 5, 3)),
    (keras.layers.Conv2D, dict(padding="same", use_bias=False,
                               activation="relu"), (2, 5, 8, 4)),
    (keras.layers.Conv3D, dict(), (2, 5, 4, 6, 3)),
], ids=["images", "same_relu_no_bias", "volumes"])
def test_computes_what_keras_convolution_computes(layer_class, options,
                                                  shape):
  ours, theirs = layer_class(8, 1, **options), layer_class(8, 1, **options)
  for layer in (ours, theirs):
    layer.build(shape)
  for mine, their in zip(ours.weights, theirs.weights):
    their.assign(mine + 0.1)  # a bias that is not zero
    mine.assign(their)
  assert pointwise.use(ours) == 1
  x = tf.random.stateless_normal(shape, (3, 4))
  for mine, their in zip(trained(ours, x), trained(theirs, x)):
    np.testing.assert_allclose(mine, their, rtol=1e-5, atol=1e-5)
  convolution = "Conv3D" if layer_class is keras.layers.Conv3D else "Conv2D"
  ops = op_types(ours, x)
  assert "MatMul" in ops and convolution not in ops
  assert convolution in op_types(theirs, x)


class OwnConvolution(keras.layers.Conv2D):
  def convolution_op(self, inputs, kernel):
    return super().convolution_op(inputs, kernel * 2.0)


@pytest.mark.parametrize("layer", [
    keras.layers.Conv2D(8, 3), keras.layers.Conv2D(8, 1, strides=2),
    keras.layers.Conv3D(8, 1, strides=(1, 1, 2)),
    keras.layers.Conv2D(8, 1, groups=2),
    keras.layers.Conv2D(8, 1, data_format="channels_first"),
    keras.layers.Conv2D(8, 1, dtype="mixed_bfloat16"),
    keras.layers.Conv1D(8, 1), OwnConvolution(8, 1),
], ids=["3x3", "strided", "strided_volumes", "groups", "channels_first",
        "bfloat16", "conv1d", "own_convolution"])
def test_the_layers_it_does_not_serve_keep_keras_convolution(layer):
  assert pointwise.use(layer) == 0
  assert pointwise.served(layer) == 0


class Holding(keras.layers.Layer):
  """A user's layer holding its convolutions in a list."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.convs = [keras.layers.Conv2D(6, 1), keras.layers.Conv2D(6, 3)]

  def call(self, x):
    return self.convs[1](self.convs[0](x))


def network() -> keras.Model:
  inputs = keras.Input((9, 9, 3))
  nested = keras.Sequential([keras.layers.Conv2D(4, 1),
                             keras.layers.Conv2D(4, 1, strides=2),
                             keras.layers.ReLU()])
  x = Holding()(nested(inputs))
  x = keras.layers.Conv2D(5, 1)(x)
  return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))


def test_serves_nested_models_and_a_users_layers_and_exports_keras_own(
    tmp_path):
  """The nested model's, the user's layer's and the model's own pointwise
  convolutions, not the strided one nor the 3x3; the .keras export is
  Keras' layers, which compute what the served ones do."""
  ours = network()
  images = tf.random.stateless_normal((2, 9, 9, 3), (5, 6))
  before = ours(images)
  assert pointwise.use(ours) == 3
  assert pointwise.served(ours) == 3
  np.testing.assert_allclose(ours(images), before, rtol=1e-5, atol=1e-6)
  ours.save(tmp_path / "model.keras")
  loaded = keras.models.load_model(
      tmp_path / "model.keras", custom_objects={"Holding": Holding})
  assert pointwise.served(loaded) == 0
  np.testing.assert_allclose(loaded(images), before, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("option", ["auto", "off"])
def test_the_engine_serves_its_models_unless_told_off(option, tmp_path):
  """--pointwise_matmul: the ResNet the engine builds takes its bottlenecks'
  unstrided pointwise convolutions as products (no GPU here), or, off,
  Keras' own."""
  from engine import build  # pylint: disable=import-outside-toplevel
  config = fixtures.train_config(
      data=dict(dir=fixtures.write_fashion_mnist(str(tmp_path), 20, 10)),
      model=dict(name="resnet_small"),
      performance=dict(pointwise_matmul=option))
  _, _, _, model, _ = build.data_task_and_model(config, "none")
  pointwise_convs = [layer for layer in model.layers
                     if isinstance(layer, keras.layers.Conv2D)
                     and layer.kernel_size == (1, 1)
                     and layer.strides == (1, 1)]
  assert len(pointwise_convs) > 8
  assert pointwise.served(model) == (
      len(pointwise_convs) if option == "auto" else 0)
