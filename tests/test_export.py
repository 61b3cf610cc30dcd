"""engine/records/export.py: a SavedModel and, beside it, the Keras model
as a .keras file, both taking images as stored, the .keras file loadable
without the engine; a model Keras cannot save that way gets the SavedModel
alone and a warning."""
import json

import numpy as np
import keras
import tensorflow as tf

from engine.datasets import DatasetInfo
from engine.records import export
from engine.tasks.classification import Classification
from engine.tasks.reconstruction import Reconstruction
from engine.tasks.regression import Regression
from engine.tasks.segmentation import Segmentation
from tests import fixtures

INFO = DatasetInfo(name="shapes", image_shape=(8, 8, 1), num_classes=3,
                   num_train=10, num_test=5, mean=(100.0,), std=(50.0,))

# Loads each .keras file named in argv[1] (a JSON list) in a process that
# imports Keras, TensorFlow and NumPy alone, and predicts on the images as
# stored beside it (FILE.images.npy), into FILE.predicted.npy.
PREDICT_WITHOUT_THE_ENGINE = """
import json, sys
import numpy as np
import keras
for path in json.loads(sys.argv[1]):
  model = keras.saving.load_model(path)
  np.save(path + ".predicted.npy",
          model.predict(np.load(path + ".images.npy"), verbose=0))
assert not {"engine", "models"} & {name.split(".")[0]
                                   for name in sys.modules}, "imported"
"""


def functional(image_shape=(8, 8, 1), outputs=3, dense=True):
  keras.utils.set_random_seed(0)
  inputs = keras.Input(image_shape)
  convolution = (keras.layers.Conv3D if len(image_shape) == 4
                 else keras.layers.Conv2D)
  x = convolution(4, 3, padding="same")(inputs)
  if not dense:  # an output per pixel
    return keras.Model(inputs, convolution(outputs, 1)(x))
  pooled = (keras.layers.GlobalAveragePooling3D if len(image_shape) == 4
            else keras.layers.GlobalAveragePooling2D)()(x)
  return keras.Model(inputs, keras.layers.Dense(outputs)(pooled))


def predicted_without_the_engine(paths_and_images) -> list[np.ndarray]:
  """What each .keras file predicts on its images (as stored), loaded in a
  process of its own that never imports the engine."""
  paths = [path for path, _ in paths_and_images]
  for path, images in paths_and_images:
    np.save(path + ".images.npy", images)
  ran = fixtures.launch(["-c", PREDICT_WITHOUT_THE_ENGINE,
                         json.dumps(paths)], timeout=120)
  assert ran.returncode == 0, ran.stderr
  return [np.load(path + ".predicted.npy") for path in paths]


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
  images = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 1), np.uint8)
  normalized = (images.astype("float32") - 100.0) / 50.0
  loaded = keras.saving.load_model(path + ".keras")
  # Images as stored, as the SavedModel takes them.
  np.testing.assert_allclose(loaded(images), model(normalized), rtol=1e-5,
                             atol=1e-5)
  served = tf.saved_model.load(path).signatures["serving_default"](
      images=tf.constant(images, tf.uint8))
  np.testing.assert_allclose(served["logits"], model(normalized), rtol=1e-5)
  (elsewhere,) = predicted_without_the_engine([(path + ".keras", images)])
  np.testing.assert_allclose(elsewhere, served["logits"], rtol=1e-5,
                             atol=1e-5)


def test_every_task_s_keras_file_takes_what_its_saved_model_takes(tmp_path):
  """Float volumes with CosmoFlow's log(1 + x) for regression, RGB images
  for segmentation, float images for reconstruction: each .keras file,
  loaded without the engine, predicts on the images as stored the model's
  outputs on them normalized as the run evaluates them, which the task
  serves as its SavedModel does."""
  rng = np.random.default_rng(1)
  volumes = DatasetInfo(
      name="volumes", image_shape=(4, 4, 4, 2), num_classes=0, num_train=10,
      num_test=5, mean=(1.5, 0.5), std=(0.8, 0.3), image_dtype="float32",
      label_shape=(2,), label_dtype="float32", label_mean=(3.0, -1.0),
      label_std=(2.0, 0.5), transform="log1p")
  rgb = DatasetInfo(name="rgb", image_shape=(6, 6, 3), num_classes=4,
                    num_train=10, num_test=5, mean=(120.0, 110.0, 90.0),
                    std=(60.0, 55.0, 50.0), label_shape=(6, 6))
  floats = DatasetInfo(name="floats", image_shape=(6, 6, 1), num_classes=0,
                       num_train=10, num_test=5, mean=(0.4,), std=(0.2,),
                       image_dtype="float32")
  cases = [
      (Regression(volumes), functional((4, 4, 4, 2), 2),
       rng.exponential(5.0, (3, 4, 4, 4, 2)).astype(np.float32)),
      (Segmentation(rgb), functional((6, 6, 3), 4, dense=False),
       rng.integers(0, 256, (3, 6, 6, 3), np.uint8)),
      (Reconstruction(floats), functional((6, 6, 1), 1, dense=False),
       rng.uniform(0, 1, (3, 6, 6, 1)).astype(np.float32)),
  ]
  exported = []
  for task, model, images in cases:
    path = str(tmp_path / task.name)
    export.save(model, task, path)
    exported.append((path + ".keras", images))
  for (task, model, images), predicted in zip(
      cases, predicted_without_the_engine(exported)):
    evaluated = model(task.info.normalized(tf.constant(images)),
                      training=False)
    np.testing.assert_allclose(predicted, evaluated, rtol=1e-5, atol=1e-5)
    served = tf.saved_model.load(str(tmp_path / task.name)).signatures[
        "serving_default"](images=tf.constant(images))
    for name, value in task.serve(tf.constant(predicted)).items():
      np.testing.assert_allclose(served[name], value, rtol=1e-5, atol=1e-5,
                                 err_msg=f"{task.name}: {name}")


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
