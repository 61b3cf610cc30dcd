"""Regression: float targets per image, one or several.

The model predicts standardized targets (each target minus its training
mean, over its training std, the statistics recorded in model_dir as the
images' are), so the loss weighs targets of different units alike and a
model's usual initialization fits; or, with --standardize_targets=false,
the targets as stored, when they are already scaled to the model's output
range (CosmoFlow's). Every figure is reported in the
targets' own units: MAE, RMSE and R², overall (the mean over targets)
and, for several targets, per target as `mae/<target>` (named by the data
set's class_names), from sums of errors, squared errors, targets and
squared targets.
"""
import numpy as np
import keras
import tensorflow as tf

from engine.core.errors import UserError
from engine.datasets import LabelKind
from engine.tasks.task import Task

LOSSES = ("mse", "mae", "huber")


class Regression(Task):
  """Float32 targets [batch, k]; float32 outputs [batch, k]."""

  best_metric = "mae:min"
  labels = LabelKind.TARGETS

  @property
  def augmentation_keeps_targets(self) -> bool:
    """Volumes' targets are kept: parameters of a box of matter, which its
    flips and axis orders change none of (CosmoFlow's). An image's targets
    may be a position or an angle, which a flip or a shift changes."""
    return len(self.info.image_shape) == 4

  def __init__(self, info, *, loss: str = "",
               standardize_targets: bool = True):
    """`loss` (--loss): mse (the default), mae or huber (quadratic within
    one std of the target, linear beyond). `standardize_targets=False`:
    the model predicts the targets as stored (already in its outputs'
    range, as CosmoFlow's in [-1, 1] for its tanh outputs)."""
    super().__init__(info)
    self.loss_name = loss or "mse"
    if self.loss_name not in LOSSES:
      raise UserError(f"--loss={loss}: the regression task's losses are "
                      f"{', '.join(LOSSES)}")
    (self.targets,) = info.label_shape
    standardized = standardize_targets and info.label_mean
    self._mean = tf.constant(
        info.label_mean if standardized else [0.0] * self.targets, tf.float32)
    self._std = tf.constant(
        info.label_std if standardized else [1.0] * self.targets, tf.float32)

  def output_shape(self):
    return (self.targets,)

  def loss(self, labels, outputs):
    error = outputs - self.standardized(labels)
    if self.loss_name == "mae":
      each = tf.abs(error)
    elif self.loss_name == "huber":
      each = keras.losses.huber(error[..., None], 0.0)
    else:
      each = tf.square(error)
    return tf.reduce_mean(each, axis=-1)

  def standardized(self, labels):
    """Targets as the model predicts them."""
    return (labels - self._mean) / self._std

  def predictions(self, outputs):
    """In the targets' units."""
    return outputs * self._std + self._mean

  def sums(self):
    k = (self.targets,)
    return {"loss": (), "absolute_error": k, "squared_error": k,
            "target": k, "squared_target": k}

  def batch_sums(self, labels, outputs, loss):
    labels = tf.cast(labels, tf.float64)
    error = tf.cast(self.predictions(outputs), tf.float64) - labels
    return {"loss": tf.reduce_sum(tf.cast(loss, tf.float64)),
            "absolute_error": tf.reduce_sum(tf.abs(error), axis=0),
            "squared_error": tf.reduce_sum(tf.square(error), axis=0),
            "target": tf.reduce_sum(labels, axis=0),
            "squared_target": tf.reduce_sum(tf.square(labels), axis=0)}

  def figures(self, sums):
    n = max(float(sums["examples"]), 1.0)
    mae = sums["absolute_error"] / n
    mse = sums["squared_error"] / n
    # The targets' variance about their mean over the same examples.
    variance = sums["squared_target"] / n - np.square(sums["target"] / n)
    with np.errstate(divide="ignore", invalid="ignore"):
      r2 = np.where(variance > 0, 1.0 - mse / variance, np.nan)
    figures = {"loss": float(sums["loss"]) / n, "mae": float(mae.mean()),
               "rmse": float(np.sqrt(mse.mean())), "r2": _defined(r2.mean())}
    if self.targets > 1:
      for name, *each in zip(self._target_names(), mae, np.sqrt(mse), r2):
        figures.update({f"{figure}/{name}": _defined(value) for figure, value
                        in zip(("mae", "rmse", "r2"), each)})
    return figures

  def _target_names(self) -> tuple:
    names = self.info.class_names
    return names if len(names) == self.targets else tuple(
        map(str, range(self.targets)))

  def serve(self, outputs):
    return {"predictions": self.predictions(outputs)}


def _defined(value) -> float | None:
  """None for a figure that is undefined (R² of a constant target)."""
  return None if np.isnan(value) else float(value)
