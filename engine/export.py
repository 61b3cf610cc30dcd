"""SavedModels for inference: uint8 images in, logits, probabilities, class.

The exported signature takes images as stored (uint8, the training image
shape) and applies the training set's normalization itself, so a user of the
SavedModel needs nothing from this engine to use it correctly.
"""
from absl import logging
import tensorflow as tf

from engine import data
from engine.datasets import DatasetInfo

EXPORT_DIR = "export"


class _Serving(tf.Module):

  def __init__(self, model: tf.keras.Model, info: DatasetInfo):
    super().__init__()
    self.model = model
    self._info = info
    self.serve = tf.function(self._serve, input_signature=[
        tf.TensorSpec([None, *info.image_shape], tf.uint8, name="images")])

  def _serve(self, images):
    logits = self.model(data.normalize(images, self._info), training=False)
    return {"logits": logits, "probabilities": tf.nn.softmax(logits),
            "classes": tf.argmax(logits, axis=-1)}


def save(model: tf.keras.Model, info: DatasetInfo, path: str) -> None:
  module = _Serving(model, info)
  # TensorFlow narrates a SavedModel's assets and untraced Keras internals
  # at INFO and WARNING; none of it is actionable here.
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    tf.saved_model.save(module, path,
                        signatures={"serving_default": module.serve})
  finally:
    logging.set_verbosity(verbosity)


def save_checkpoint(model: tf.keras.Model, checkpoint_path: str,
                    info: DatasetInfo, path: str) -> None:
  """Exports the weights of `checkpoint_path` into a copy of `model`."""
  copy = tf.keras.models.clone_model(model)
  tf.train.Checkpoint(model=copy).restore(checkpoint_path).expect_partial()
  save(copy, info, path)
