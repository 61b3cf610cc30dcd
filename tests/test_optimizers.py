import os

import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import distributed
from engine.compute import optimizers, schedules, weight_decay
from engine.core.errors import UserError
import models
from tests import fixtures


@pytest.fixture(scope="module", autouse=True)
def horovod():
  distributed.start_horovod()


@pytest.mark.parametrize("name, rate", [
    ("sgd", 0.05), ("adam", 0.003), ("adamw", 0.003), ("novograd", 0.01),
    ("lamb", 0.03)])
def test_every_optimizer_trains_a_tiny_model(name, rate):
  from engine.compute import step as steps  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  model = models.build("cnn", input_shape=(8, 8, 1), num_classes=3,
                       filters=4, weight_decay=1e-4)
  schedule = schedules.WarmupThenDecay(
      base_lr=rate, scaling="none", warmup_epochs=0, decay="constant",
      epochs=1)
  schedule.set_world(world_size=1, steps_per_epoch=1)
  optimizer = optimizers.build(name, learning_rate=schedule, momentum=0.9,
                               nesterov=False)
  train_step = steps.TrainStep(model=model, optimizer=optimizer)
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 3, 48)
  images = rng.normal(size=(48, 8, 8, 1)).astype("float32")
  images[np.arange(48), labels, :, 0] += 3.0  # a learnable class band
  losses = []
  for _ in range(30):
    train_step.totals.reset()
    fixtures.one_step(train_step, tf.constant(images), tf.constant(labels))
    losses.append(train_step.totals.result().loss)
  assert losses[-1] < 0.5 * losses[0], losses
  assert train_step.traces == 1
  assert int(optimizer.iterations.numpy()) == 30
  assert len(optimizers.state(optimizer)) > 1  # step counter and slots


def test_adamw_decays_the_weights_itself_decoupled_from_the_gradient():
  variable = tf.Variable([1.0, -2.0])
  optimizer = optimizers.build("adamw", learning_rate=0.1, momentum=0.9,
                               nesterov=False, weight_decay=0.5)
  # A zero gradient: Adam's step is 0, the decay lr * weight_decay * w.
  optimizer.apply_gradients([(tf.zeros(2), variable)])
  np.testing.assert_allclose(variable.numpy(), [0.95, -1.9], rtol=1e-6)
  # Under adamw the models add no L2 term; the others leave decay to it.
  for name, model_decay in (("adamw", 0.0), ("sgd", 5e-4), ("adam", 5e-4)):
    config = fixtures.train_config(optimization=dict(optimizer=name),
                                   model=dict(params=dict(
                                       fixtures.train_config().model.params,
                                       weight_decay=5e-4)))
    assert weight_decay.model_params(config)["weight_decay"] == model_decay


def test_unknown_optimizer():
  with pytest.raises(UserError, match="--optimizer=rmsprop2 is unknown"):
    optimizers.build("rmsprop2", learning_rate=0.1, momentum=0.0,
                     nesterov=False)


# Our NovoGrad and Keras' LAMB, against the engine's tf_keras optimizers and
# by hand.

# Each optimizer's variables after each of the steps below, as the engine's
# last tf_keras revision (2650be9) computed them, and tensorflow-addons
# 0.23.0's NovoGrad and LAMB beside (equal to ours there, to the bit): keys
# "<case>/<step>/<variable>", cases sgd, sgd_nesterov, adam, novograd,
# lamb, addons_novograd, addons_lamb. Recorded on tf_keras 2.21.0 and
# TensorFlow 2.21.0, which Keras 3 replaced.
TF_KERAS_STEPS = os.path.join(os.path.dirname(__file__), "data",
                              "optimizer_steps_tf_keras.npz")


def _decaying_schedule():
  """A rate that changes at every step, so that where the learning rate
  enters the update shows."""
  return keras.optimizers.schedules.ExponentialDecay(
      0.05, decay_steps=1, decay_rate=0.6)


def _variables():
  """A kernel and a zero bias (LAMB's trust ratio is 1 for a zero norm)."""
  rng = np.random.default_rng(1)
  return [tf.Variable(rng.normal(size=(3, 3, 2, 4)).astype("float32")),
          tf.Variable(np.zeros(4, "float32"))]


def _gradients(steps):
  """Each step's gradients for `_variables`, of different scales."""
  rng = np.random.default_rng(2)
  return [[tf.constant(scale * rng.normal(size=shape).astype("float32"))
           for scale, shape in ((1.0, (3, 3, 2, 4)), (0.01, (4,)))]
          for _ in range(steps)]


def _run(optimizer, variables, gradients):
  """The variables' values after each step."""
  values = []
  for step_gradients in gradients:
    optimizer.apply_gradients(zip(step_gradients, variables))
    values.append([v.numpy() for v in variables])
  return values


def _assert_steps_close(actual, expected, message, **tolerance):
  """`actual` and `expected`: `_run`'s values, step by step."""
  assert len(actual) == len(expected)
  for step, (actual_values, expected_values) in enumerate(
      zip(actual, expected), start=1):
    for actual_value, expected_value in zip(actual_values, expected_values,
                                            strict=True):
      np.testing.assert_allclose(actual_value, expected_value,
                                 err_msg=f"{message}, step {step}",
                                 **tolerance)


def _assert_same_steps_to_the_bit(ours, keras_own):
  """Two optimizers' 5 steps on `_variables`, equal to the bit."""
  for step, (our_values, keras_values) in enumerate(zip(
      _run(ours, _variables(), _gradients(5)),
      _run(keras_own, _variables(), _gradients(5)), strict=True), start=1):
    for our_value, keras_value in zip(our_values, keras_values, strict=True):
      np.testing.assert_array_equal(our_value, keras_value,
                                    err_msg=f"step {step}")


def _kernels_a_step(optimizer) -> list[str]:
  """The op types of `optimizer`'s traced update of `_variables`."""
  variables = _variables()
  optimizer.build(variables)
  update = tf.function(lambda gradients: optimizer.apply_gradients(
      zip(gradients, variables)))
  return [op.type for op in update.get_concrete_function(
      _gradients(1)[0]).graph.get_operations()]


@pytest.mark.parametrize("case, name, nesterov", [
    ("sgd", "sgd", False), ("sgd_nesterov", "sgd", True),
    ("adam", "adam", False), ("novograd", "novograd", False),
    ("lamb", "lamb", False), ("addons_novograd", "novograd", False),
    ("addons_lamb", "lamb", False)])
def test_same_steps_as_the_tf_keras_engine_and_tensorflow_addons(
    case, name, nesterov):
  recorded = np.load(TF_KERAS_STEPS)
  steps = 5
  theirs = [[recorded[f"{case}/{step}/{i}"] for i in range(2)]
            for step in range(steps)]
  ours = _run(optimizers.build(name, learning_rate=_decaying_schedule(),
                               momentum=0.9, nesterov=nesterov),
              _variables(), _gradients(steps))
  # Keras' Lamb takes 1 - beta in float64 before its cast, where addons
  # took it in float32 (1 - float32(0.9) is 0.1 * (1 + 2.4e-7), and
  # 1 - float32(0.999) 0.001 * (1 - 1.3e-5)): nearer the exact update, by
  # up to 1e-5 of it.
  rtol = 2e-5 if name == "lamb" else 1e-6
  # Adam's kernel takes 1 - beta_2 in float32 (1 - float32(0.999) is 0.001
  # * (1 - 1.3e-5)), where both Kerases take it in Python's float: a step
  # moves by up to 1.3e-5 of itself, here 1.4e-6 after 5 of lr <= 0.05
  # (to the bit at the betas in float32: the test below).
  atol = 2e-6 if name == "adam" else 1e-7
  _assert_steps_close(ours, theirs, case, rtol=rtol, atol=atol)
  # The steps moved the weights: equal results are not both of nothing.
  assert not np.allclose(ours[-1][0], _variables()[0].numpy(), atol=1e-3)


@pytest.mark.parametrize("momentum, nesterov, kernel", [
    (0.9, False, "ResourceApplyKerasMomentum"),
    (0.9, True, "ResourceApplyKerasMomentum"),
    (0.0, False, "ResourceApplyGradientDescent")])
def test_sgd_is_keras_sgd_to_the_bit_in_one_kernel_a_variable(
    momentum, nesterov, kernel):
  ours = optimizers.build("sgd", learning_rate=_decaying_schedule(),
                          momentum=momentum, nesterov=nesterov)
  keras_own = keras.optimizers.SGD(_decaying_schedule(), momentum=momentum,
                                   nesterov=nesterov)
  _assert_same_steps_to_the_bit(ours, keras_own)
  assert _kernels_a_step(optimizers.build(
      "sgd", learning_rate=0.1, momentum=momentum,
      nesterov=nesterov)).count(kernel) == len(_variables())


@pytest.mark.parametrize("name, weight_decay", [("adam", 0.0),
                                                 ("adamw", 0.04)])
def test_adam_is_keras_adam_to_the_bit_in_one_kernel_a_variable(
    name, weight_decay):
  """At the betas rounded to float32, which the kernel computes in."""
  ours = optimizers.build(name, learning_rate=_decaying_schedule(),
                          momentum=0.9, nesterov=False,
                          weight_decay=weight_decay)
  betas = dict(beta_1=float(np.float32(0.9)),
               beta_2=float(np.float32(0.999)))
  keras_own = (keras.optimizers.AdamW(_decaying_schedule(),
                                      weight_decay=weight_decay, **betas)
               if name == "adamw" else
               keras.optimizers.Adam(_decaying_schedule(), **betas))
  _assert_same_steps_to_the_bit(ours, keras_own)
  assert _kernels_a_step(optimizers.build(
      name, learning_rate=0.1, momentum=0.9,
      nesterov=False)).count("ResourceApplyAdam") == len(_variables())


def test_novograd_by_hand():
  """Two steps: v starts at the first gradient's squared norm, and the
  learning rate enters the momentum with each gradient."""
  variables = _variables()
  g1, g2 = ([g.numpy().astype("float64") for g in step]
            for step in _gradients(2))
  w = [v.numpy().astype("float64") for v in variables]
  optimizer = optimizers.NovoGrad(_decaying_schedule())
  _run(optimizer, variables, _gradients(2))
  lr1, lr2 = 0.05, 0.05 * 0.6
  for i, variable in enumerate(variables):
    v1 = np.sum(g1[i] ** 2)
    m1 = -lr1 * g1[i] / (np.sqrt(v1) + 1e-7)
    v2 = 0.999 * v1 + 0.001 * np.sum(g2[i] ** 2)
    m2 = 0.9 * m1 - lr2 * g2[i] / (np.sqrt(v2) + 1e-7)
    np.testing.assert_allclose(variable.numpy(), w[i] + m1 + m2, rtol=1e-5,
                               atol=1e-7)
  # One scalar second moment per variable, after the step counter.
  assert [tuple(v.shape) for v in optimizers.state(optimizer)] == [
      (), (3, 3, 2, 4), (4,), (), ()]


def test_lamb_by_hand():
  """Two steps: Adam's bias-corrected step, scaled by ||w|| / ||step||, or
  by 1 for the zero bias."""
  variables = _variables()
  g1, g2 = ([g.numpy().astype("float64") for g in step]
            for step in _gradients(2))
  optimizer = optimizers.build("lamb", learning_rate=_decaying_schedule(),
                               momentum=0.9, nesterov=False)
  w = [v.numpy().astype("float64") for v in variables]
  _run(optimizer, variables, _gradients(2))
  for i, variable in enumerate(variables):
    weights, m, v = w[i], 0.0, 0.0
    for t, (g, lr) in enumerate(((g1[i], 0.05), (g2[i], 0.05 * 0.6)),
                                start=1):
      m = 0.9 * m + 0.1 * g
      v = 0.999 * v + 0.001 * g ** 2
      step = (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-6)
      norm = np.linalg.norm(weights)
      ratio = norm / np.linalg.norm(step) if norm > 0 else 1.0
      weights = weights - lr * ratio * step
    np.testing.assert_allclose(variable.numpy(), weights, rtol=1e-5,
                               atol=1e-7)
  # The first step moves the kernel by lr * ||w|| exactly, whatever g is.
  kernel = _variables()[0]
  before = kernel.numpy()
  optimizers.build("lamb", learning_rate=0.05, momentum=0.9,
                   nesterov=False).apply_gradients(
                       [(_gradients(1)[0][0], kernel)])
  np.testing.assert_allclose(np.linalg.norm(kernel.numpy() - before),
                             0.05 * np.linalg.norm(before), rtol=1e-5)


@pytest.mark.parametrize("name", ["novograd", "lamb", "adam"])
def test_checkpoint_restores_slots(name, tmp_path):
  def build():
    variables = _variables()
    optimizer = optimizers.build(name, learning_rate=_decaying_schedule(),
                                 momentum=0.9, nesterov=False)
    optimizers.build_state(optimizer, variables)
    return variables, optimizer, tf.train.Checkpoint(variables=variables,
                                                     optimizer=optimizer)

  gradients = _gradients(3)
  variables, optimizer, checkpoint = build()
  _run(optimizer, variables, gradients[:2])
  path = checkpoint.save(str(tmp_path / "ckpt"))
  restored_variables, restored, restored_checkpoint = build()
  restored_checkpoint.restore(path).assert_consumed()
  saved_state = optimizers.state(optimizer)
  assert int(saved_state[0].numpy()) == 2  # the step counter comes first
  for saved, loaded in zip(saved_state, optimizers.state(restored),
                           strict=True):
    np.testing.assert_array_equal(saved.numpy(), loaded.numpy())
  # and the next step is the same as without the checkpoint
  _assert_steps_close(_run(restored, restored_variables, gradients[2:]),
                      _run(optimizer, variables, gradients[2:]),
                      f"{name} restored", rtol=0, atol=0)


@pytest.mark.parametrize("name", ["novograd", "lamb", "adam"])
@pytest.mark.parametrize("xla", [False, True])
def test_steps_in_a_tf_function(name, xla):
  gradients = _gradients(3)
  eager = _run(optimizers.build(name, learning_rate=_decaying_schedule(),
                                momentum=0.9, nesterov=False),
               _variables(), gradients)
  variables = _variables()
  optimizer = optimizers.build(name, learning_rate=_decaying_schedule(),
                               momentum=0.9, nesterov=False)
  optimizers.build_state(optimizer, variables)
  traces = []

  # Compiled with the step as --xla compiles it, on the CPU too.
  @tf.function(jit_compile=xla)
  def step(step_gradients):
    traces.append(1)
    optimizer.apply_gradients(zip(step_gradients, variables))

  in_function = []
  for step_gradients in gradients:
    step(step_gradients)
    in_function.append([v.numpy() for v in variables])
  assert len(traces) == 1
  assert int(optimizer.iterations.numpy()) == 3
  _assert_steps_close(in_function, eager, f"{name} in a tf.function",
                      rtol=1e-5, atol=1e-7)


