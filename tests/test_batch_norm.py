"""models/batch_norm.py: Keras 3's batch normalization, trained through
TensorFlow's fused kernel in any model, computes what Keras' own layer
computes, and stays Keras' own layer to everything else."""
import functools
import os
import subprocess

import numpy as np
import pytest
import keras
import tensorflow as tf

from engine.compute import precision
from models import batch_norm
from tests import fixtures
from tests import timeouts


def pair(shape, **options):
  """Keras' layer fused and Keras' layer as it is, with the same weights,
  built for `shape`."""
  ours = keras.layers.BatchNormalization(**options)
  theirs = keras.layers.BatchNormalization(**options)
  assert batch_norm.fuse(ours) == 1
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


def op_types(function, *args) -> list:
  graph = tf.function(function).get_concrete_function(*args).graph
  return [op.type for op in graph.get_operations()]


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
  assert "FusedBatchNormV3" in op_types(lambda x: ours(x, training=True), x)
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
  with precision.policy("bfloat16"):
    ours = keras.layers.BatchNormalization()
    batch_norm.fuse(ours)
    ours.build((8, 6, 5, 3))
  theirs = keras.layers.BatchNormalization()
  theirs.build((8, 6, 5, 3))
  x = tf.constant(np.random.default_rng(1).normal(2.0, 3.0, (8, 6, 5, 3)),
                  tf.float32)
  assert "FusedBatchNormV3" in op_types(
      lambda x: ours(x, training=True), tf.cast(x, tf.bfloat16))
  y = ours(tf.cast(x, tf.bfloat16), training=True)
  assert y.dtype == tf.bfloat16
  np.testing.assert_allclose(tf.cast(y, tf.float32),
                             theirs(x, training=True), atol=0.05)
  np.testing.assert_allclose(ours.moving_mean, theirs.moving_mean,
                             rtol=0.01)


@pytest.mark.parametrize("case", ["mask", "channels_first", "frozen",
                                  "dense"])
def test_keras_computes_what_the_kernel_would_not(case):
  """A mask, another axis, a frozen layer (inference's computation in
  training, as Keras 3 does) and features that are no image: Keras' own
  graph, and its figures."""
  shape = (4, 3, 6, 5) if case != "dense" else (8, 5)
  ours, theirs = pair(shape, **({"axis": 1} if case == "channels_first"
                                else {}))
  if case == "frozen":
    ours.trainable = theirs.trainable = False
  x = tf.constant(np.random.default_rng(1).normal(2.0, 3.0, shape),
                  tf.float32)
  mask = (tf.constant(np.arange(np.prod(shape[:-1])).reshape(shape[:-1]) % 3
                      > 0) if case == "mask" else None)
  assert "FusedBatchNormV3" not in op_types(
      lambda x: ours(x, training=True, mask=mask), x)
  np.testing.assert_allclose(ours(x, training=True, mask=mask),
                             theirs(x, training=True, mask=mask), rtol=1e-6)
  for got, wanted in zip(ours.non_trainable_weights,
                         theirs.non_trainable_weights, strict=True):
    np.testing.assert_array_equal(got, wanted)


class OwnComputation(keras.layers.BatchNormalization):
  """A user's subclass with a call of its own."""

  def call(self, inputs, training=None, mask=None):
    return super().call(inputs, training=training, mask=mask) * 2.0


def test_a_layer_keras_would_compute_otherwise_is_left_alone():
  inputs = keras.Input((6, 5, 3))
  x = keras.layers.BatchNormalization(renorm=True)(inputs)
  x = keras.layers.BatchNormalization(synchronized=True)(x)
  x = OwnComputation()(x)
  model = keras.Model(inputs, keras.layers.BatchNormalization()(x))
  assert batch_norm.fuse(model) == 1
  assert batch_norm.fused(model) == 1
  assert op_types(lambda x: model(x, training=True),
                  tf.zeros((2, 6, 5, 3))).count("FusedBatchNormV3") == 1


# A user's layer, x + relu(norm(conv(x))): BatchNormalization inside it.
# Its source is also run by the process that loads the `.keras` export
# (LOAD_KERAS), which imports no module of the engine's or of the tests'.
RESIDUAL = """
@keras.saving.register_keras_serializable(package="tests")
class Residual(keras.layers.Layer):

  def __init__(self, filters, **kwargs):
    super().__init__(**kwargs)
    self.filters = filters
    self.conv = keras.layers.Conv2D(filters, 3, padding="same")
    self.norm = keras.layers.BatchNormalization(momentum=0.9)

  def call(self, x, training=False):
    return x + keras.ops.relu(self.norm(self.conv(x), training=training))

  def get_config(self):
    return dict(super().get_config(), filters=self.filters)
"""
exec(RESIDUAL)  # pylint: disable=exec-used


class Subclassed(keras.Model):
  """A subclassed model, one of its normalizations inside a layer of the
  user's."""

  def __init__(self):
    super().__init__(name="subclassed")
    self.stem = keras.layers.Conv2D(8, 3, padding="same")
    self.block = Residual(8)
    self.norm = keras.layers.BatchNormalization()
    self.logits = keras.layers.Dense(10)

  def call(self, x, training=False):
    x = self.norm(self.block(self.stem(x), training=training),
                  training=training)
    return self.logits(keras.ops.mean(x, axis=(1, 2)))


def functional():
  inputs = keras.Input((12, 12, 3))
  x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
  x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
  x = Residual(8)(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  return keras.Model(inputs, keras.layers.Dense(10)(x), name="functional")


def applications():
  backbone = keras.applications.MobileNetV2(
      input_shape=(64, 64, 3), alpha=0.35, include_top=False, weights=None,
      pooling="avg")
  inputs = keras.Input((64, 64, 3))
  return keras.Model(inputs, keras.layers.Dense(10)(backbone(inputs)),
                     name="applications")


# Each model's builder, input shape, batch norms and the tolerance of its
# gradients: MobileNetV2's ReLU6 clips at 0 and 6, where a rounding's
# difference in a normalized value flips whether an activation passes a
# gradient (its logits agree within 4e-5, its gradients within 1-2%).
MODELS = {"functional": (functional, (12, 12, 3), 2, 1e-3),
          "subclassed": (Subclassed, (12, 12, 3), 2, 1e-3),
          "applications": (applications, (64, 64, 3), 52, 5e-2)}


def twins(name):
  """The model fused and the same model (same weights) as Keras built it,
  and a batch for it."""
  build, shape = MODELS[name][:2]
  built = []
  for _ in range(2):
    keras.utils.set_random_seed(0)
    model = build()
    model(tf.zeros((1, *shape)))
    built.append(model)
  images = tf.constant(np.random.default_rng(0).normal(
      size=(8, *shape)), tf.float32)
  return *built, images


@pytest.mark.parametrize("name", list(MODELS))
def test_a_users_model_trains_through_the_fused_kernel(name):
  """Each of the model's batch norms is a FusedBatchNormV3 in its training
  graph; three steps of SGD give what Keras' own layers give: outputs,
  gradients and moving statistics."""
  ours, theirs, images = twins(name)
  norms, tolerance = MODELS[name][2:]
  assert batch_norm.fuse(ours) == norms
  assert batch_norm.fused(ours) == norms and batch_norm.fused(theirs) == 0
  labels = tf.constant(np.arange(8) % 10)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def step(model, optimizer):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      value = loss(labels, logits)
    gradients = tape.gradient(value, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return logits, gradients

  assert op_types(lambda x: ours(x, training=True),
                  images).count("FusedBatchNormV3") == norms
  assert "FusedBatchNormV3" not in op_types(
      lambda x: theirs(x, training=True), images)
  steps = [tf.function(functools.partial(step, model,
                                         keras.optimizers.SGD(0.01)))
           for model in (ours, theirs)]
  for _ in range(3):
    # Each step from the same weights: a rounding's difference grows to
    # MobileNetV2's whole logits in one step of SGD (measured with Keras'
    # layers on both sides, one side's weights moved by a millionth).
    for mine, their in zip(ours.trainable_variables,
                           theirs.trainable_variables, strict=True):
      their.assign(mine)
    (logits, gradients), (expected, expected_gradients) = (
        steps[0](), steps[1]())
    assert_close(logits, expected)
    for got, wanted in zip(gradients, expected_gradients, strict=True):
      assert_close(got, wanted, tolerance)
  moving = [(got, wanted) for got, wanted in zip(
      ours.non_trainable_variables, theirs.non_trainable_variables,
      strict=True) if "moving" in got.path]
  assert len(moving) == 2 * norms
  for got, wanted in moving:
    assert_close(got, wanted)
  assert_close(ours(images, training=False), theirs(images, training=False))


def assert_close(got, wanted, tolerance=1e-3):
  """Within float32's rounding through a deep network: the difference's
  norm a `tolerance` of the value's (sums in another order, through 52
  normalizations, differ by more than any one element's tolerance would
  admit), or rounding's noise where the value is zero (a bias before a
  normalization)."""
  got, wanted = np.asarray(got), np.asarray(wanted)
  assert (np.linalg.norm(got - wanted)
          <= tolerance * np.linalg.norm(wanted) + 1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_checkpoints_restore_into_the_unmodified_model(name, tmp_path):
  ours, theirs, images = twins(name)
  batch_norm.fuse(ours)
  ours(images, training=True)  # moving statistics and all moved
  path = tf.train.Checkpoint(model=ours).save(str(tmp_path / "ckpt"))
  tf.train.Checkpoint(model=theirs).restore(path).assert_consumed()
  for got, wanted in zip(theirs.variables, ours.variables, strict=True):
    np.testing.assert_array_equal(got, wanted)


# Loads a .keras file in a process that never imported the engine (nor
# this test's module: the user's layer is registered again, as a user's
# module would register it), and prints its predictions.
LOAD_KERAS = """
import sys
import numpy as np
import keras
assert keras.backend.backend() == "tensorflow"
""" + RESIDUAL + """
model = keras.saving.load_model(sys.argv[1])
assert not [m for m in sys.modules if m.split(".")[0] in ("engine", "models")]
norms = [l for l in model._flatten_layers()
         if type(l) is keras.layers.BatchNormalization]
print(len(norms))
np.save(sys.argv[2], model(np.load(sys.argv[3]), training=False))
"""


def test_the_keras_export_is_keras_own_layers(tmp_path):
  ours = functional()
  assert batch_norm.fuse(ours) == 2
  images = np.random.default_rng(0).normal(size=(4, 12, 12, 3)).astype(
      "float32")
  ours(images, training=True)
  ours.save(tmp_path / "model.keras")
  np.save(tmp_path / "images.npy", images)
  result = subprocess.run(
      [fixtures.PYTHON, "-c", LOAD_KERAS, str(tmp_path / "model.keras"),
       str(tmp_path / "out.npy"), str(tmp_path / "images.npy")],
      cwd="/", capture_output=True, text=True, timeout=timeouts.bound(120),
      env={"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "2",
           "KERAS_BACKEND": "tensorflow"})
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == ["2"]
  np.testing.assert_allclose(np.load(tmp_path / "out.npy"),
                             ours(images, training=False), rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize("option", ["auto", "off"])
def test_the_engine_fuses_a_users_model_unless_told_off(option, tmp_path):
  """--fused_batch_norm: the model the engine builds from a user's file
  (Keras' layers, no engine import) trains its batch norm through the
  fused kernel, or, off, through Keras' own operations."""
  from engine import build  # pylint: disable=import-outside-toplevel
  code_dir = tmp_path / "code"
  code_dir.mkdir()
  fixtures.write_user_code(str(code_dir))
  config = fixtures.train_config(
      data=dict(dir=fixtures.write_fashion_mnist(str(tmp_path), 20, 10)),
      model=dict(name=f"{code_dir}/users_model.py:build_subclassed"),
      performance=dict(fused_batch_norm=option))
  _, _, _, model, _ = build.data_task_and_model(config, "none")
  assert batch_norm.fused(model) == (1 if option == "auto" else 0)
  ops = op_types(lambda x: model(x, training=True), tf.zeros((2, 28, 28, 1)))
  assert ("FusedBatchNormV3" in ops) == (option == "auto")
