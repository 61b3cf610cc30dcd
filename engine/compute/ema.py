"""An exponential moving average of the weights (--ema_decay).

The weights at the end of a step are one noisy point of a trajectory; their
moving average is a smoother estimate of where it is heading, and often
evaluates better than the weights themselves, most of all while the rate is
still high (Polyak and Juditsky 1992; Page 2018's fast ResNets). The train
step updates the average after each applied update; evaluation, the best
checkpoint's choice and the exports use it, and checkpoints keep it.

The decay is ramped in as TensorFlow's ExponentialMovingAverage does with
`num_updates`: min(decay, (1 + t) / (10 + t)) at update t, so the average
follows the fast early changes instead of remembering the initial weights.
BatchNorm's moving statistics are averages already and are used as they are.
"""
import contextlib
from typing import Optional

import keras
import tensorflow as tf


class WeightAverage(tf.Module):
  """The average of `model`'s trainable weights, as variables: `variables`
  (the averages and the count of updates) are what checkpoints keep and
  ranks share."""

  def __init__(self, model: keras.Model, decay: float):
    super().__init__(name="weight_average")
    self.decay = decay
    weights = model.trainable_variables
    # A function, not an attribute: the model's own weights are not part of
    # this module's variables or checkpoint.
    self._weights = lambda: weights
    self.averages = [tf.Variable(w, trainable=False) for w in weights]
    self.updates = tf.Variable(0, dtype=tf.int64, trainable=False)

  def update(self) -> None:
    """One step of the average; meant for the step's tf.function."""
    t = tf.cast(self.updates, tf.float32)
    decay = tf.minimum(self.decay, (1.0 + t) / (10.0 + t))
    for average, weight in zip(self.averages, self._weights()):
      average.assign(decay * average + (1.0 - decay)
                     * tf.cast(weight, average.dtype))
    self.updates.assign_add(1)

  def reset(self) -> None:
    """The average of a run that had none so far: the weights themselves."""
    for average, weight in zip(self.averages, self._weights()):
      average.assign(weight)
    self.updates.assign(0)

  @contextlib.contextmanager
  def applied(self):
    """The model holds the averaged weights inside the context, its own
    after it."""
    own = [w.numpy() for w in self._weights()]
    for weight, average in zip(self._weights(), self.averages):
      weight.assign(average)
    try:
      yield
    finally:
      for weight, value in zip(self._weights(), own):
        weight.assign(value)


def maybe_average(model: keras.Model,
                  decay: float) -> Optional[WeightAverage]:
  """The average a run with --ema_decay=`decay` keeps of `model`'s weights;
  None at 0, which keeps none. Training and engine.evaluate both build it,
  so a checkpoint written by one restores in the other."""
  return WeightAverage(model, decay) if decay else None


def averaged(weight_average: Optional[WeightAverage]):
  """`weight_average.applied()`; the model as it is without an average."""
  return weight_average.applied() if weight_average else \
      contextlib.nullcontext()


def variables(weight_average: Optional[WeightAverage]) -> list:
  """What a checkpoint and every rank keep of `weight_average`, if any."""
  return list(weight_average.variables) if weight_average else []
