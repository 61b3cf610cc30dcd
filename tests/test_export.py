"""engine/records/export.py: a SavedModel and, beside it, the Keras model
as a .keras file; a model Keras cannot save that way gets the SavedModel
alone and a warning."""
import numpy as np
import keras
import tensorflow as tf

from engine.datasets import DatasetInfo
from engine.records import export
from engine.tasks.classification import Classification

INFO = DatasetInfo(name="shapes", image_shape=(8, 8, 1), num_classes=3,
                   num_train=10, num_test=5, mean=(100.0,), std=(50.0,))


def functional():
  keras.utils.set_random_seed(0)
  inputs = keras.Input((8, 8, 1))
  x = keras.layers.Conv2D(4, 3)(inputs)
  outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x))
  return keras.Model(inputs, outputs)


class Unsaveable(keras.Model):
  """A subclassed model whose constructor takes what Keras cannot put in a
  config, and no get_config of its own."""

  def __init__(self, layer):
    super().__init__()
    self.inner = layer
    self.logits = keras.layers.Dense(3)

  def call(self, x):
    return self.logits(keras.ops.mean(self.inner(x), axis=(1, 2)))


def test_the_keras_file_predicts_as_the_model_and_the_saved_model(tmp_path):
  model = functional()
  path = str(tmp_path / "final")
  export.save(model, Classification(INFO), path)
  images = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 1))
  normalized = (images.astype("float32") - 100.0) / 50.0
  loaded = keras.saving.load_model(path + ".keras")
  np.testing.assert_allclose(loaded(normalized), model(normalized),
                             rtol=1e-6)
  served = tf.saved_model.load(path).signatures["serving_default"](
      images=tf.constant(images, tf.uint8))
  np.testing.assert_allclose(served["logits"], model(normalized), rtol=1e-5)


def test_a_model_keras_cannot_save_gets_the_saved_model_alone(tmp_path,
                                                              caplog):
  path = str(tmp_path / "final")
  (tmp_path / "final.keras").write_text("an older export")
  model = Unsaveable(keras.layers.Conv2D(4, 3))
  model(tf.zeros((1, 8, 8, 1)))
  with caplog.at_level("WARNING"):
    export.save(model, Classification(INFO), path)
  assert tf.saved_model.contains_saved_model(path)
  assert not (tmp_path / "final.keras").exists()  # not the model beside it
  assert not list(tmp_path.glob("*.partial*"))
  assert f"{path}.keras: not written, Keras cannot save this model" in \
      caplog.text
