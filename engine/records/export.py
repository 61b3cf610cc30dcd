"""SavedModels for inference: images in; what the task serves out (for
classification: logits, probabilities, class ids and class names).

The exported signature takes images as stored (uint8, or float32 for float
arrays; the training image shape) and applies the training set's
normalization itself, so a user of the SavedModel needs nothing from this
engine to use it correctly. Nor from the user's own model code: a
SavedModel holds the traced graph, and `tf.saved_model.load` restores it
without the Python classes that built it.

An export is written beside its place and moved there when complete, so a
failed one (a full disk) leaves the previous export, not half of a new one.
"""
import contextlib
import os

from absl import logging
import tensorflow as tf

from engine.compute import ema
from engine.core.errors import first_line
from engine.records import storage
from engine.tasks import Task


def save(model: tf.keras.Model, task: Task, path: str) -> None:
  """The serving function and the variables it reads, as a SavedModel.

  The Keras model itself is not saved, only captured by the function: its
  own SavedModel serialization traces every layer's call again, which took
  25 s of a MobileNetV2's export, and a user of the signature needs none
  of it.
  """
  serve = task.serving(model)

  module = tf.Module()
  module.model_variables = list(model.variables)
  module.serve = serve
  # TensorFlow narrates a SavedModel's assets at INFO and WARNING; none of
  # it is actionable here.
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  partial = path + ".partial"
  try:
    with storage.writing("SavedModel", path,
                         storage.size_of(model.variables)):
      tf.saved_model.save(module, partial,
                          signatures={"serving_default": serve})
      storage.remove(path)
      os.rename(partial, path)
  finally:
    storage.remove(partial)
    logging.set_verbosity(verbosity)


def save_checkpoint(model: tf.keras.Model, checkpoint_path: str,
                    task: Task, path: str,
                    weight_average=None) -> None:
  """Exports the weights of `checkpoint_path` through `model`, whose own
  weights are put back afterwards; with `weight_average` (an
  ema.WeightAverage), the checkpoint's average of the weights.

  Restoring into the model itself rather than a clone works for every
  model, also subclassed ones and custom layers that Keras cannot clone.
  Raises UnreadableCheckpoint if the checkpoint is damaged.
  """
  average = {"weight_average": weight_average} if weight_average else {}
  with _values_restored_after(model.variables
                              + ema.variables(weight_average)):
    try:
      tf.train.Checkpoint(model=model, **average).restore(
          checkpoint_path).expect_partial()
    except (tf.errors.OpError, ValueError, IndexError) as e:
      raise UnreadableCheckpoint(f"{checkpoint_path} is unreadable "
                                 f"({first_line(e)})"
                                 ) from None
    with ema.averaged(weight_average):
      save(model, task, path)


class UnreadableCheckpoint(Exception):
  """A checkpoint damaged since it was written: not exported."""


@contextlib.contextmanager
def _values_restored_after(variables: list):
  values = [v.numpy() for v in variables]
  try:
    yield
  finally:
    for variable, value in zip(variables, values):
      variable.assign(value)
