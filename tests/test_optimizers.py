import numpy as np
import pytest
import tensorflow as tf

from bench import addons
from engine import distributed
from engine.compute import optimizers, schedules
from engine.core.errors import UserError
import models


@pytest.fixture(scope="module", autouse=True)
def horovod():
  distributed.start_horovod()


@pytest.mark.parametrize("name, rate", [
    ("sgd", 0.05), ("adam", 0.003), ("novograd", 0.01), ("lamb", 0.03)])
def test_every_optimizer_trains_a_tiny_model(name, rate):
  from engine.compute import step as steps  # pylint: disable=import-outside-toplevel
  tf.keras.utils.set_random_seed(0)
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
    train_step(tf.constant(images), tf.constant(labels))
    losses.append(train_step.totals.result().loss)
  assert losses[-1] < 0.5 * losses[0], losses
  assert train_step.traces == 1
  assert int(optimizer.iterations.numpy()) == 30
  assert len(optimizers.state(optimizer)) > 1  # step counter and slots


def test_unknown_optimizer():
  with pytest.raises(UserError, match="--optimizer=rmsprop2 is unknown"):
    optimizers.build("rmsprop2", learning_rate=0.1, momentum=0.0,
                     nesterov=False)


# Our NovoGrad and LAMB, against tensorflow-addons' and by hand.

def _addons_optimizers():
  found = addons.optimizers()
  if found is None:
    pytest.skip("tensorflow-addons is not installed (requirements-no-deps.txt "
                "installs it on Python 3.11 only, where it has wheels)")
  return found


def _decaying_schedule():
  """A rate that changes at every step, so that where the learning rate
  enters the update shows."""
  return tf.keras.optimizers.schedules.ExponentialDecay(
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


@pytest.mark.parametrize("name, addons_name", [("novograd", "NovoGrad"),
                                               ("lamb", "LAMB")])
def test_same_steps_as_tensorflow_addons(name, addons_name):
  addons = _addons_optimizers()
  gradients = _gradients(5)
  ours = _run(optimizers.build(name, learning_rate=_decaying_schedule(),
                               momentum=0.9, nesterov=False),
              _variables(), gradients)
  theirs = _run(getattr(addons, addons_name)(_decaying_schedule()),
                _variables(), gradients)
  _assert_steps_close(ours, theirs, name, rtol=1e-6, atol=1e-7)
  # The steps moved the weights: equal results are not both of nothing.
  assert not np.allclose(ours[-1][0], _variables()[0].numpy(), atol=1e-3)


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
  optimizer = optimizers.LAMB(_decaying_schedule())
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
  optimizers.LAMB(0.05).apply_gradients([(_gradients(1)[0][0], kernel)])
  np.testing.assert_allclose(np.linalg.norm(kernel.numpy() - before),
                             0.05 * np.linalg.norm(before), rtol=1e-5)


@pytest.mark.parametrize("name", ["novograd", "lamb"])
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


@pytest.mark.parametrize("name", ["novograd", "lamb"])
@pytest.mark.parametrize("xla", [False, True])
def test_steps_in_a_tf_function(name, xla):
  gradients = _gradients(3)
  eager = _run(optimizers.build(name, learning_rate=_decaying_schedule(),
                                momentum=0.9, nesterov=False),
               _variables(), gradients)
  variables = _variables()
  optimizer = optimizers.build(name, learning_rate=_decaying_schedule(),
                               momentum=0.9, nesterov=False, xla=xla)
  # Keras compiles an optimizer's update on GPUs only; forced here, so
  # that the compiled update runs on the CPU too.
  optimizer.jit_compile = xla
  optimizers.build_state(optimizer, variables)
  traces = []

  @tf.function
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


@pytest.mark.parametrize("name", ["novograd", "lamb"])
def test_horovod_rebuilds_ours_from_their_config(name):
  """hvd.DistributedOptimizer (bench/keras_recipe.py) makes a new optimizer
  of our class from our config."""
  # pylint: disable-next=import-outside-toplevel
  import horovod.tensorflow.keras as hvd  # imports Keras 3: this test only
  optimizer = optimizers.build(name, learning_rate=0.01, momentum=0.9,
                               nesterov=False)
  rebuilt = hvd.DistributedOptimizer(optimizer)
  assert isinstance(rebuilt, type(optimizer))
  assert float(rebuilt.learning_rate.numpy()) == pytest.approx(0.01)
  assert rebuilt.get_config() == optimizer.get_config()
  assert rebuilt.weight_decay is None  # Keras' decoupled decay stays off
