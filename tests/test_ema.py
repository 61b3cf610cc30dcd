"""--ema_decay: the weights' moving average (engine/compute/ema.py), in the step,
the checkpoints, evaluation and engine.evaluate."""
import re

import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import distributed
from engine.compute import ema
from engine.compute import precision
from engine.compute import step as steps
from engine.records import checkpoint
import models
from tests import fixtures

IDENTITY = "model cnn_4 on test data"


@pytest.fixture(scope="module", autouse=True)
def horovod():
  distributed.start_horovod()


def tiny_model(seed=0):
  keras.utils.set_random_seed(seed)
  return models.build("cnn", input_shape=(8, 8, 1), num_classes=3, filters=4)


def test_the_average_follows_the_weights_with_a_ramped_decay():
  model = tiny_model()
  average = ema.WeightAverage(model, decay=0.9)
  weight, mean = model.trainable_variables[0], average.averages[0]
  start = weight.numpy()
  weight.assign(start + 1.0)
  average.update()  # t=0: min(0.9, 1/10)
  np.testing.assert_allclose(mean.numpy(), start + 0.9, rtol=1e-6)
  weight.assign(start + 2.0)
  for t in range(1, 100):
    average.update()
  # Ramped up to 0.9 long ago: close to the weights, not equal.
  assert 0 < (weight.numpy() - mean.numpy()).max() < 1e-3
  assert int(average.updates.numpy()) == 100


def test_applied_swaps_the_average_in_and_the_weights_back():
  model = tiny_model()
  average = ema.WeightAverage(model, decay=0.5)
  own = [w.numpy() for w in model.trainable_variables]
  for w in average.averages:
    w.assign(tf.zeros_like(w))
  with ema.averaged(average):
    assert all((w.numpy() == 0).all() for w in model.trainable_variables)
  for w, value in zip(model.trainable_variables, own):
    np.testing.assert_array_equal(w.numpy(), value)


def test_the_step_updates_the_average_after_each_update():
  model = tiny_model()
  average = ema.WeightAverage(model, decay=0.99)
  initial = model.trainable_variables[0].numpy()
  step = steps.TrainStep(model=model, optimizer=keras.optimizers.SGD(0.5),
                         weight_average=average)
  images = tf.random.stateless_normal((4, 8, 8, 1), seed=(1, 2))
  fixtures.one_step(step, images, tf.constant([0, 1, 2, 0], tf.int64))
  assert int(average.updates.numpy()) == 1
  updated = model.trainable_variables[0].numpy()
  assert not np.allclose(updated, initial)
  # The first update's decay is ramped down to 1/10.
  np.testing.assert_allclose(average.averages[0].numpy(),
                             0.1 * initial + 0.9 * updated, rtol=1e-5)


def test_a_step_the_float16_loss_scaler_skips_leaves_the_average_alone():
  # The average counts updates applied (ema.py): a skipped step would
  # otherwise pull it towards the weights it did not change, and ramp
  # its decay on.
  with precision.policy("float16"):
    model = tiny_model()
  average = ema.WeightAverage(model, decay=0.99)
  step = steps.TrainStep(model=model, optimizer=precision.with_loss_scaling(
      keras.optimizers.SGD(0.5), "float16"), weight_average=average)
  images = tf.random.stateless_normal((4, 8, 8, 1), seed=(1, 2))
  labels = tf.constant([0, 1, 2, 0], tf.int64)
  fixtures.one_step(step, images, labels)
  before = [v.numpy() for v in average.variables]
  fixtures.one_step(step, images * np.nan, labels)  # skipped by the loss scaler
  assert step.skipped_steps == 1
  assert int(average.updates.numpy()) == 1
  for old, variable in zip(before, average.variables):
    np.testing.assert_array_equal(old, variable.numpy())


def test_checkpoints_keep_the_average_and_ones_without_start_it(tmp_path):
  # Without one: a run resumed with an --ema_decay it did not start with.
  model = tiny_model(seed=1)
  optimizer = keras.optimizers.SGD(0.1)
  optimizer.build(model.trainable_variables)
  average = ema.WeightAverage(model, decay=0.9)
  for w in average.averages:
    w.assign(tf.fill(w.shape, 0.25))
  checkpoint.Checkpoints(str(tmp_path / "with"), model=model,
                         optimizer=optimizer, keep=1, identity=IDENTITY,
                         weight_average=average).save(
                             checkpoint.Position(1, 0, 8, 1), 3)
  checkpoint.Checkpoints(str(tmp_path / "without"), model=model,
                         optimizer=optimizer, keep=1, identity=IDENTITY).save(
                             checkpoint.Position(1, 0, 8, 1), 3)
  other = tiny_model(seed=2)
  restored = ema.WeightAverage(other, decay=0.9)
  # (Keras 3's optimizer tracks the variables it was built on: the other
  # model's own)
  optimizer = keras.optimizers.SGD(0.1)
  optimizer.build(other.trainable_variables)
  for run in ("with", "without"):
    checkpoint.Checkpoints(str(tmp_path / run), model=other,
                           optimizer=optimizer, keep=1, identity=IDENTITY,
                           weight_average=restored).restore_latest_readable()
    expected = ([np.full(w.shape, 0.25) for w in restored.averages]
                if run == "with" else  # a run that had no average: the weights
                [w.numpy() for w in model.trainable_variables])
    for w, value in zip(restored.averages, expected):
      np.testing.assert_allclose(w.numpy(), value)


def test_a_run_evaluates_with_the_average_as_engine_evaluate_does(tmp_path):
  data_dir = fixtures.write_fashion_mnist(str(tmp_path / "fm"), 301, 51)
  model_dir = tmp_path / "run"
  trained = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}",
       f"--model_dir={model_dir}", "--epochs=1", "--batch_size=16",
       "--filters=4", "--ema_decay=0.95", "--progress=none"])
  assert trained.returncode == 0, trained.stderr[-3000:]
  final = re.search(r"final test loss (\S+),", trained.stderr).group(1)

  def evaluated(*flags):
    result = fixtures.launch(["-m", "engine.evaluate",
                              f"--model_dir={model_dir}", *flags])
    assert result.returncode == 0, result.stderr[-3000:]
    return re.search(r"test loss (\S+),", result.stdout).group(1)

  assert evaluated() == final
  assert evaluated("--ema_decay=0") != final  # the weights themselves
