"""--weight_decay on any model (engine/compute/weight_decay.py): the L2
term the built-ins add themselves, given by the engine to a model whose
builder declares no weight_decay, in the compiled step and in a task's own
step; a model's own regularizers refused beside it; AdamW's decay its
own."""
import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import build
from engine import distributed
from engine import tasks
from engine.compute import precision
from engine.compute import weight_decay
from engine.core.errors import UserError
from engine.datasets import DatasetInfo
import models
from tests import fixtures

INFO = DatasetInfo(name="small", image_shape=(8, 8, 1), num_classes=3,
                   num_train=10, num_test=5, mean=(0.0,), std=(1.0,))

# A user's model, as Keras' guides write one: no regularizers, and no
# weight_decay in the builder's signature.
USER_MODEL = """
import keras

def build(input_shape, num_classes):
  inputs = keras.Input(input_shape)
  x = keras.layers.Conv2D(4, 3, activation="relu"__CONV__)(inputs)
  x = keras.layers.BatchNormalization()(x)
  x = keras.layers.SeparableConv2D(4, 3, activation="relu")(x)
  x = keras.layers.Flatten()(x)
  return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
"""


@pytest.fixture(scope="module", autouse=True)
def horovod():
  distributed.start_horovod()  # one process: allreduce is the identity


def user_model(tmp_path, conv_options="", signature="", name="my_model"):
  """--model=<name>.py:build of USER_MODEL, with `conv_options` given to
  its Conv2D and `signature` added to build's parameters."""
  path = tmp_path / f"{name}.py"
  path.write_text(USER_MODEL.replace("__CONV__", conv_options)
                  .replace("num_classes):", f"num_classes{signature}):"))
  return f"{path}:build"


def config_of(model_name, decay, task="classification", **optimization):
  defaults = fixtures.train_config()
  return fixtures.train_config(
      model=dict(name=model_name,
                 params=dict(defaults.model.params, weight_decay=decay)),
      optimization=dict(dict(optimizer="sgd"), **optimization),
      task=dict(name=task))


def batch():
  rng = np.random.default_rng(0)
  return (tf.constant(rng.normal(size=(16, 8, 8, 1)), tf.float32),
          tf.constant(rng.integers(0, 3, 16)))


def built(config, mode="none"):
  """The task's model for `config`, as engine.build builds it, and the
  train step that trains it (at a learning rate of 0.05)."""
  with precision.policy(mode):
    keras.utils.set_random_seed(0)
    task = tasks.build(config.task.name, INFO)
    model = task.build_model(lambda shape: models.build(
        config.model.name, input_shape=INFO.image_shape,
        num_classes=shape[-1], output_shape=shape,
        **weight_decay.model_params(config)))
    tasks.check(task, config.task.name, model, INFO.image_shape)
    return model, build.optimizer_and_step(config, mode, "none", task, model,
                                           learning_rate=0.05)[1]


def kernel_norm(config, steps=5, mode="none") -> float:
  """The norm of the model's kernels after `steps` steps on one batch."""
  model, step = built(config, mode)
  images, labels = batch()
  for _ in range(steps):
    fixtures.one_step(step, images, labels)
  return float(np.sqrt(sum(np.sum(np.square(v.numpy()))
                           for v in weight_decay.kernels(model))))


@pytest.mark.parametrize("mode", ["none", "bfloat16"])
def test_weight_decay_shrinks_the_kernels_of_a_model_without_regularizers(
    tmp_path, mode):
  spec = user_model(tmp_path)
  without, with_decay = (kernel_norm(config_of(spec, decay), mode=mode)
                         for decay in (0.0, 0.5))
  # Five steps of SGD (momentum 0.9) at 0.05 with 2 * 0.5 * w added to
  # every kernel's gradient take a good part of the kernels away.
  assert with_decay < 0.9 * without, (with_decay, without)


def test_the_engines_term_is_the_one_the_builtins_add(tmp_path):
  config = config_of(user_model(tmp_path), 1e-3)
  model, _ = built(config)
  kernels = weight_decay.kernels(model)
  # The convolutions' and the Dense's kernels, the separable one's two;
  # no bias, no BatchNorm scale or offset.
  assert sorted(v.name for v in kernels) == [
      "depthwise_kernel", "kernel", "kernel", "pointwise_kernel"]
  np.testing.assert_allclose(
      float(tf.add_n(model.losses)),
      1e-3 * sum(np.sum(np.square(v.numpy())) for v in kernels), rtol=1e-5)
  assert weight_decay.described(model, config) == (
      "weight decay 0.001: an L2 term on 4 kernels (given by the engine)")


def test_a_builtins_own_term_is_left_alone_not_doubled():
  config = config_of("cnn", 1e-3, momentum=0.0)
  model, step = built(config)
  kernels = weight_decay.kernels(model)
  assert len(model.losses) == len(kernels) == 4
  np.testing.assert_allclose(
      float(tf.add_n(model.losses)),
      1e-3 * sum(np.sum(np.square(v.numpy())) for v in kernels), rtol=1e-5)
  assert weight_decay.described(model, config) == (
      "weight decay 0.001: an L2 term on 4 kernels (the model's own "
      "regularizers: cnn's)")
  # The step's update: the gradient of the cross-entropy and the term, once.
  images, labels = batch()
  before = [v.numpy() for v in model.trainable_variables]
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(step.task.loss(labels, model(images, training=True)))
    loss += 1e-3 * tf.add_n([tf.reduce_sum(tf.square(v)) for v in kernels])
  expected = tape.gradient(loss, model.trainable_variables)
  fixtures.one_step(step, images, labels)
  for old, new, gradient in zip(before, model.trainable_variables, expected):
    np.testing.assert_allclose(old - new.numpy(), 0.05 * gradient.numpy(),
                               rtol=1e-4, atol=1e-7)


def test_a_models_own_regularizers_beside_weight_decay_are_refused(tmp_path):
  regularized = ", kernel_regularizer=keras.regularizers.L1(0.01)"
  with pytest.raises(UserError, match=r"^--weight_decay=0.0005: the model's "
                     r"layers carry regularizers of their own \(conv2d\w*/"
                     r"kernel\), and --model=.*my_model.py:build declares no "
                     "weight_decay; declare it to apply --weight_decay "
                     "yourself, or leave --weight_decay at 0$"):
    built(config_of(user_model(tmp_path, regularized), 5e-4))
  # Declared, they are its way of applying it; the kernels it left get ours.
  spec = user_model(tmp_path, regularized, ", weight_decay=0.0",
                    name="declared")
  model, _ = built(config_of(spec, 5e-4))
  assert weight_decay.described(model, config_of(spec, 5e-4)) == (
      f"weight decay 0.0005: an L2 term on 4 kernels ({spec}'s own "
      "regularizers on 1, the engine's on 3)")


def test_adamw_decays_the_weights_itself_with_no_l2_term(tmp_path):
  for spec in (user_model(tmp_path), "cnn"):
    config = config_of(spec, 5e-4, optimizer="adamw")
    model, step = built(config)
    assert not model.losses
    assert step.optimizer.weight_decay == 5e-4
    assert weight_decay.described(model, config) == (
        "weight decay 0.0005: adamw's decoupled decay, no L2 term")


def test_a_tasks_own_step_decays_its_models_kernels():
  """TinyDCGAN builds its own two models, without regularizers; its step
  adds the kernels' L2 gradients to the gradients it averages."""
  without, with_decay = (
      kernel_norm(config_of("cnn", decay,
                            task="tests/workers/tiny_gan.py:TinyDCGAN"))
      for decay in (0.0, 0.5))
  assert with_decay < 0.9 * without, (with_decay, without)
