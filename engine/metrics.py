"""Loss and accuracy kept as sums and counts, reduced exactly across ranks.

Each rank accumulates, inside the compiled step, the sum of per-example
losses, the number of correct predictions and the number of examples. Only
when a figure is read are the three sums added across ranks, once. Means of
per-rank means would be wrong whenever ranks hold different numbers of
examples (the last eval batch, uneven shards), and a per-step allreduce of
metrics would cost a collective on every step for figures read once an epoch.
"""
import dataclasses

import numpy as np
import tensorflow as tf

from engine import distributed


@dataclasses.dataclass(frozen=True)
class Result:
  loss: float       # mean cross-entropy per example (no weight-decay term)
  accuracy: float
  examples: int

  @classmethod
  def of(cls, sums: np.ndarray) -> "Result":
    """From (loss sum, correct predictions, examples)."""
    loss_sum, correct, examples = sums
    count = max(examples, 1.0)
    return cls(loss=loss_sum / count, accuracy=correct / count,
               examples=int(examples))


class Totals:
  """This rank's running sums; `result()` gives the figure over all ranks."""

  def __init__(self, name: str):
    self._name = name
    self._sums = tf.Variable(tf.zeros([3], tf.float64), trainable=False,
                             name=name)

  def update(self, per_example_loss: tf.Tensor, logits: tf.Tensor,
             labels: tf.Tensor) -> None:
    """Adds one batch; meant to run inside the step's tf.function."""
    predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    correct = tf.reduce_sum(tf.cast(predictions == labels, tf.float64))
    self._sums.assign_add(tf.stack([
        tf.reduce_sum(tf.cast(per_example_loss, tf.float64)), correct,
        tf.cast(tf.size(labels), tf.float64)]))

  def reset(self) -> None:
    self._sums.assign(tf.zeros([3], tf.float64))

  def local_sums(self) -> np.ndarray:
    """(loss sum, correct, examples) of this rank; no collective."""
    return self._sums.numpy()

  def sums(self) -> np.ndarray:
    """(loss sum, correct, examples) over every rank. A collective: call on
    all ranks."""
    return distributed.sum_across_ranks(self._sums.numpy(), name=self._name)

  def result(self) -> Result:
    """The figure over every rank's examples. A collective, as `sums`."""
    return Result.of(self.sums())


class StepWindow:
  """One rank's figures over the steps since it was last read, within an
  epoch: differences of the epoch's running sums (Totals) and step seconds
  (profiling.EpochTimes). For summaries within an epoch at no cost to the
  step: no collective, and the sums are read after a step whose result
  the host has read already."""

  def __init__(self):
    self.start_epoch(0)

  def start_epoch(self, first_step: int) -> None:
    self._sums, self._step_seconds, self._step = np.zeros(3), 0.0, first_step

  def read(self, step: int, sums: np.ndarray, step_seconds: float) -> dict:
    """Loss, accuracy and seconds per step over steps after the last read
    up to `step` (of the epoch), given the running figures at `step`."""
    (loss_sum, correct, examples), steps = sums - self._sums, step - self._step
    figures = dict(loss=loss_sum / max(examples, 1.0),
                   accuracy=correct / max(examples, 1.0),
                   step_seconds=(step_seconds - self._step_seconds)
                   / max(steps, 1))
    self._sums, self._step_seconds, self._step = sums, step_seconds, step
    return figures


class Confusion:
  """This rank's confusion matrix, counts[true class, predicted class];
  `counts()` sums it over all ranks (a collective, as `Totals.sums`)."""

  def __init__(self, name: str, num_classes: int):
    self._name = name
    self._num_classes = num_classes
    self._counts = tf.Variable(
        tf.zeros([num_classes, num_classes], tf.float64), trainable=False,
        name=name)

  def update(self, logits: tf.Tensor, labels: tf.Tensor) -> None:
    """Adds one batch; meant to run inside the step's tf.function."""
    predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    self._counts.assign_add(tf.math.confusion_matrix(
        labels, predictions, self._num_classes, dtype=tf.float64))

  def reset(self) -> None:
    self._counts.assign(tf.zeros_like(self._counts))

  def counts(self) -> np.ndarray:
    return distributed.sum_across_ranks(self._counts.numpy(),
                                        name=self._name)


def per_class_accuracy(counts: np.ndarray) -> np.ndarray:
  """Each class's share of its examples predicted right (nan: none)."""
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.diag(counts) / counts.sum(axis=1)
