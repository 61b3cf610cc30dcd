"""SavedModels for inference: images in; what the task serves out (for
classification: logits, probabilities, class ids and class names); and
beside each, the Keras model as a `.keras` file.

The exported signature takes images as stored (uint8, or float32 for float
arrays; the training image shape) and applies the training set's
normalization itself, so a user of the SavedModel needs nothing from this
engine to use it correctly. Nor from the user's own model code: a
SavedModel holds the traced graph, and `tf.saved_model.load` restores it
without the Python classes that built it.

The `.keras` file is the model as Keras saves it (`model.save`), for
`keras.saving.load_model`: to fine-tune it, or to call it in Keras. It is
the trained model behind the task's normalization (Task.normalization, the
one the SavedModel's signature applies), so it too takes images as stored,
and `predict` on them gives the model's outputs as the run's evaluation
does, without normalization.json read by hand. The normalization is
Keras' built-in layers and ops: the file needs no engine to load. A model
with layers of the user's own loads where their classes are importable
and registered (`keras.saving.register_keras_serializable`). A model
Keras cannot save that way (a subclassed model or layer without
`get_config`) gets the SavedModel alone, and a warning that says why.

An export is written beside its place and moved there when complete, so a
failed one (a full disk) leaves the previous export, not half of a new one.
"""
import os

from absl import logging
import keras
import tensorflow as tf

from engine.core.errors import first_line
from engine.records import storage
from engine.tasks import Task


KERAS_SUFFIX = ".keras"


def save(model: keras.Model, task: Task, path: str) -> None:
  """The serving function and the variables it reads, as a SavedModel at
  `path`; the Keras model at `path` + ".keras" (above).

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
  _save_keras(model, task, path + KERAS_SUFFIX)


def _save_keras(model: keras.Model, task: Task, path: str) -> None:
  """`model` behind `task.normalization()`, saved at `path`: written
  beside and moved into place; a model Keras cannot serialize is a
  warning, and an older file of it goes (it would no longer be the model
  exported beside it)."""
  partial = path.removesuffix(KERAS_SUFFIX) + ".partial" + KERAS_SUFFIX
  try:
    with storage.writing("Keras model", path,
                         storage.size_of(model.variables)):
      try:
        normalization = task.normalization()
        keras.Model(normalization.input, model(normalization.output),
                    name=model.name).save(partial)
      except (NotImplementedError, TypeError, ValueError) as e:
        storage.remove(path)
        logging.warning("%s: not written, Keras cannot save this model "
                        "(%s: %s); the SavedModel beside it serves it",
                        path, type(e).__name__, first_line(e))
        return
      os.replace(partial, path)
  finally:
    storage.remove(partial)
