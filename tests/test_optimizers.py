import numpy as np
import pytest
import tensorflow as tf

import models
from engine import distributed
from engine import optimizers, schedules
from engine.errors import UserError


@pytest.fixture(scope="module", autouse=True)
def horovod():
  distributed.start_horovod()


@pytest.mark.parametrize("name, rate", [
    ("sgd", 0.05), ("adam", 0.003), ("novograd", 0.01), ("lamb", 0.03)])
def test_every_optimizer_trains_a_tiny_model(name, rate):
  from engine import step as steps  # pylint: disable=import-outside-toplevel
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
