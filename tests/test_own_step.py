"""A model's own train_step (Keras' GAN and custom-step guides) trained
through the engine's TaskTrainStep: engine/tasks/own_step.py."""
import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import distributed
from engine.compute import optimizers
from engine.compute import step as steps
from engine.compute import task_step
from engine.core.errors import UserError
from engine.tasks import own_step
from tests import fixtures

ops = keras.ops
LATENT = 3
FEATURES = 4


class GAN(keras.Model):
  """Keras' guide GAN (dcgan_overriding_train_step), on Dense models."""

  def __init__(self):
    super().__init__()
    self.discriminator = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(1)])
    self.generator = keras.Sequential(
        [keras.Input((LATENT,)), keras.layers.Dense(FEATURES)])
    self.seed_generator = keras.random.SeedGenerator(1337)

  def compile(self, d_optimizer, g_optimizer, loss_fn):
    super().compile()  # an rmsprop `optimizer` the step never applies
    self.d_optimizer = d_optimizer
    self.g_optimizer = g_optimizer
    self.loss_fn = loss_fn
    self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
    self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

  @property
  def metrics(self):
    return [self.d_loss_tracker, self.g_loss_tracker]

  def train_step(self, real_images):
    batch_size = ops.shape(real_images)[0]
    latent = keras.random.normal((batch_size, LATENT),
                                 seed=self.seed_generator)
    combined = ops.concatenate([self.generator(latent), real_images], 0)
    labels = ops.concatenate([ops.ones((batch_size, 1)),
                              ops.zeros((batch_size, 1))], 0)
    with tf.GradientTape() as tape:
      d_loss = self.loss_fn(labels, self.discriminator(combined))
    grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
    self.d_optimizer.apply_gradients(
        zip(grads, self.discriminator.trainable_weights))
    latent = keras.random.normal((batch_size, LATENT),
                                 seed=self.seed_generator)
    with tf.GradientTape() as tape:
      g_loss = self.loss_fn(ops.zeros((batch_size, 1)),
                            self.discriminator(self.generator(latent)))
    grads = tape.gradient(g_loss, self.generator.trainable_weights)
    self.g_optimizer.apply_gradients(
        zip(grads, self.generator.trainable_weights))
    self.d_loss_tracker.update_state(d_loss)
    self.g_loss_tracker.update_state(g_loss)
    return {"d_loss": self.d_loss_tracker.result(),
            "g_loss": self.g_loss_tracker.result()}


class WeightedMAE(keras.Model):
  """A custom-loss step (Keras' "Customizing fit()" guide): its own loss,
  `self.optimizer.apply(grads, self.trainable_variables)`, a tracker
  named `loss`, and a test_step of its own."""

  def __init__(self):
    super().__init__()
    self.dense = keras.layers.Dense(1)
    self.loss_tracker = keras.metrics.Mean(name="loss")

  def call(self, x):
    return self.dense(x)[:, 0]

  @property
  def metrics(self):
    return [self.loss_tracker]

  def weighted_loss(self, data):
    x, y, sample_weight = data
    return ops.mean(ops.abs(self(x) - y) * sample_weight)

  def train_step(self, data):
    with tf.GradientTape() as tape:
      loss = self.weighted_loss(data)
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    self.loss_tracker.update_state(loss)
    return {"loss": self.loss_tracker.result()}

  def test_step(self, data):
    self.loss_tracker.update_state(self.weighted_loss(data))
    return {"loss": self.loss_tracker.result()}


def gan(learning_rate=0.1):
  keras.utils.set_random_seed(0)
  model = GAN()
  model.compile(keras.optimizers.SGD(learning_rate),
                keras.optimizers.SGD(learning_rate),
                keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def weighted_mae(learning_rate=0.1):
  keras.utils.set_random_seed(0)
  model = WeightedMAE()
  model(tf.zeros((1, FEATURES)))
  model.compile(keras.optimizers.SGD(learning_rate))
  return model


def step_of(model, parts, y_dtype=tf.float32):
  distributed.start_horovod()
  task = own_step.OwnStep.of(
      model, x_spec=tf.TensorSpec([None, FEATURES], tf.float32),
      y_spec=tf.TensorSpec([None], y_dtype), parts=parts)
  several = optimizers.Several({name: getattr(model, name)
                                for name in task.optimizers})
  return task, task_step.TaskTrainStep(model=model, optimizer=several,
                                       task=task)


def batch(seed, size=6):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(size, FEATURES)).astype(np.float32)
  y = rng.normal(size=size).astype(np.float32)
  weights = rng.uniform(0.5, 1.5, size).astype(np.float32)
  return tf.constant(x), (tf.constant(y), tf.constant(weights))


def test_keras_guide_gan_trains_both_models_with_their_own_optimizers():
  model = gan()
  task, step = step_of(model, parts=1)
  # The compile() default rmsprop, never applied, is left out.
  assert task.optimizers == ("d_optimizer", "g_optimizer")
  before = [v.numpy().copy() for v in model.trainable_variables]
  for seed in range(2):
    x, (y, _) = batch(seed)  # x alone: y the pipeline's dummy labels
    assert fixtures.one_step(step, x, y).stop_agreed is False
  assert step.traces == 1
  assert all(not np.array_equal(old, new.numpy())
             for old, new in zip(before, model.trainable_variables))
  assert [int(model.d_optimizer.iterations),
          int(model.g_optimizer.iterations),
          int(model.optimizer.iterations)] == [2, 2, 0]
  result = step.totals.result()
  assert result.examples == 12
  assert set(result.figures) == {"d_loss", "g_loss"}
  assert all(np.isfinite(value) for value in result.figures.values())


def test_the_optimizers_apply_the_engines_reduced_gradients_then_unwrap():
  model = weighted_mae(learning_rate=0.1)
  _, step = step_of(model, parts=3)
  reduced = step._reduce.gradients  # pylint: disable=protected-access
  calls = []
  def halved(gradients):
    # As if a second rank's gradients were all zero: their average.
    calls.append(len(gradients))
    return [g / 2 for g in reduced(gradients)]
  step._reduce.gradients = halved  # pylint: disable=protected-access
  x, (y, weights) = batch(0)
  variables = model.trainable_variables
  with tf.GradientTape() as tape:
    loss = model.weighted_loss((x, y, weights))
  expected = [v.numpy() - 0.1 * g.numpy() / 2
              for v, g in zip(variables, tape.gradient(loss, variables))]
  fixtures.one_step(step, x, (y, weights))
  assert calls == [len(variables)]
  for variable, want in zip(variables, expected):
    np.testing.assert_allclose(variable.numpy(), want, rtol=1e-6)
  assert "apply" not in vars(model.optimizer)  # the wrapper is gone


def test_on_one_process_the_steps_are_keras_own_train_steps():
  # The engine's reduction alone is the identity: Keras' own train_step
  # on a copy takes the same steps.
  model = weighted_mae(learning_rate=0.1)
  _, step = step_of(model, parts=3)
  keras_own = weighted_mae(learning_rate=0.1)
  keras_own.set_weights(model.get_weights())
  for seed in (1, 2):
    x, (y, weights) = batch(seed)
    fixtures.one_step(step, x, (y, weights))
    keras_own.train_on_batch(x, y, sample_weight=weights)
  for ours, theirs in zip(model.get_weights(), keras_own.get_weights()):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_a_trackers_figure_is_the_epochs_not_the_running_states():
  model = weighted_mae(learning_rate=0.0)  # the weights stay
  task, step = step_of(model, parts=3)
  losses = []
  for seed, size in ((0, 6), (1, 2)):
    x, (y, weights) = batch(seed, size)
    losses.append(float(model.weighted_loss((x, y, weights))))
    fixtures.one_step(step, x, (y, weights))
  # Each step's share of the Mean tracker: one update of its batch's loss.
  assert step.totals.result().figures["loss"] == pytest.approx(
      np.mean(losses), rel=1e-6)
  assert task.best_metric == "loss:min"
  # Evaluation: the model's test_step, by the same shares.
  eval_totals = task.sums()
  x, (y, weights) = batch(3)
  sums = task.eval_sums(model, x, (y, weights))
  assert set(sums) == set(eval_totals)
  state = {key: np.asarray(value) for key, value in sums.items()}
  state["examples"] = np.float64(6)
  assert task.figures(state)["loss"] == pytest.approx(
      float(model.weighted_loss((x, y, weights))), rel=1e-6)


def test_a_nonfinite_gradient_is_skipped_and_counted():
  model = weighted_mae()
  _, step = step_of(model, parts=3)
  before = [v.numpy().copy() for v in model.trainable_variables]
  x, labels = batch(0)
  with pytest.raises(steps.NonFinite, match="gradients of the task's step"):
    fixtures.one_step(step, tf.fill(x.shape, np.nan), labels)
  for old, new in zip(before, model.trainable_variables):
    np.testing.assert_array_equal(old, new.numpy())
  assert int(model.optimizer.iterations) == 1


def test_what_the_engine_cannot_honour_is_one_line():
  plain = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
  assert not own_step.overrides_train_step(plain)
  assert own_step.overrides_train_step(gan())
  with pytest.raises(UserError, match="does not override train_step"):
    step_of(plain, parts=2)

  class Idle(WeightedMAE):
    def train_step(self, data):
      self.loss_tracker.update_state(self.weighted_loss(data))
      return {"loss": self.loss_tracker.result()}

  idle = Idle()
  idle(tf.zeros((1, FEATURES)))
  idle.compile(keras.optimizers.SGD())
  with pytest.raises(UserError, match="applies none of its optimizers "
                     r"\(optimizer\)"):
    step_of(idle, parts=3)


class GuideStep(keras.Model):
  """The "Customizing fit()" guide's step: the compiled loss and metrics,
  returned as `{m.name: m.result() for m in self.metrics}`."""

  def __init__(self):
    super().__init__()
    self.dense = keras.layers.Dense(1)

  def call(self, x):
    return self.dense(x)

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = self.compute_loss(y=y, y_pred=y_pred)
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    for metric in self.metrics:
      if metric.name == "loss":
        metric.update_state(loss)
      else:
        metric.update_state(y, y_pred)
    return {m.name: m.result() for m in self.metrics}


def test_the_guides_compiled_metrics_are_figures_of_their_own_names():
  keras.utils.set_random_seed(0)
  model = GuideStep()
  model(tf.zeros((1, FEATURES)))
  model.compile(keras.optimizers.SGD(0.0), loss="mse", metrics=["mae"])
  _, step = step_of(model, parts=2)
  x, (y, _) = batch(0)
  # (x, y): the labels as the pipeline yields them.
  fixtures.one_step(step, x, y)
  errors = model(x)[:, 0].numpy() - y.numpy()
  figures = step.totals.result().figures
  assert figures == pytest.approx({"loss": np.mean(errors ** 2),
                                   "mae": np.mean(np.abs(errors))}, rel=1e-5)
