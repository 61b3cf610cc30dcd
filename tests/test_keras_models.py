"""A model file written as Keras 3's guides write it (`import keras`, no
engine import), and a `keras.applications` network, under `horovodrun -np
2`: trained, resumed by the same command with more epochs, and exported
as a SavedModel and a .keras file that load in a process without the
engine."""
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from tests import fixtures
from tests import timeouts

# Keras' own guides' idioms: a layer of one's own, registered so that a
# saved model finds it again; the functional API; a kernel regularizer;
# BatchNormalization; the logits in float32.
GUIDE_MODEL = '''
import keras


@keras.saving.register_keras_serializable(package="guide")
class Residual(keras.layers.Layer):
  """x + conv(x): a layer of its own, with its own weights and config."""

  def __init__(self, filters, **kwargs):
    super().__init__(**kwargs)
    self.filters = filters
    self.conv = keras.layers.Conv2D(filters, 3, padding="same")
    self.norm = keras.layers.BatchNormalization()

  def call(self, x, training=False):
    return x + keras.ops.relu(self.norm(self.conv(x), training=training))

  def get_config(self):
    return dict(super().get_config(), filters=self.filters)


def build(input_shape, num_classes, weight_decay=0.0):
  inputs = keras.Input(shape=input_shape)
  x = keras.layers.Conv2D(
      8, 3, padding="same", activation="relu",
      kernel_regularizer=keras.regularizers.L2(1e-4))(inputs)
  x = Residual(8)(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  outputs = keras.layers.Dense(num_classes, dtype="float32")(x)
  return keras.Model(inputs, outputs, name="guide_model")
'''

# Loads each export in a process that imports neither the engine nor (for
# the SavedModel) the model's file: classifies two blank images, and the
# test split's images as stored, whose mean cross-entropy and accuracy
# through the SavedModel are the run's own validation figures only if the
# export holds the weights the run evaluated.
LOAD_EXPORTS = """
import json, sys
import numpy as np
import tensorflow as tf
import keras
code_dir, export_dir, test_split = sys.argv[1:]
saved = tf.saved_model.load(export_dir).signatures["serving_default"]
spec = saved.structured_input_signature[1]["images"]
served = saved(images=tf.zeros([2, *spec.shape[1:]], spec.dtype))
test = np.load(test_split)
images = test["images"].reshape(-1, *spec.shape[1:])
logits = saved(images=tf.constant(images, spec.dtype))["logits"]
loss = keras.losses.sparse_categorical_crossentropy(
    test["labels"], logits, from_logits=True)
if code_dir:  # the model's own layers: its module imported, as Keras needs
  sys.path.insert(0, code_dir)
  import guide_model  # noqa: F401
model = keras.saving.load_model(export_dir + ".keras")
outputs = model(np.zeros((2, *spec.shape[1:]), "float32"))
assert "engine" not in sys.modules
print(json.dumps({"class_names": [n.decode() for n in
                                  served["class_names"].numpy()],
                  "keras_outputs": list(outputs.shape),
                  "model": model.name,
                  "loss": float(np.mean(loss)),
                  "accuracy": float(np.mean(
                      np.argmax(logits, -1) == test["labels"]))}))
"""
# The test split the fixture writes (fixtures.write_fashion_mnist).
TEST_IMAGES, TEST_SEED = 51, 1


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      301, TEST_IMAGES)


@pytest.fixture(scope="module")
def test_split(tmp_path_factory):
  """The fixture's test split as stored, for the exports to classify."""
  images, labels = fixtures.learnable_images(TEST_IMAGES, (28, 28), 10,
                                             TEST_SEED)
  path = tmp_path_factory.mktemp("test_split") / "test.npz"
  np.savez(path, images=images, labels=labels.astype(np.int64))
  return str(path)


def train_twice(data_dir, model_dir, model, *flags):
  """The same command, run for 1 epoch, then again for 2: (first, second)
  runs' stderr, and the epochs' records after the first."""
  outputs = []
  for epochs in (1, 2):
    result = fixtures.launch(
        ["-m", "engine.train", f"--data_dir={data_dir}", f"--model={model}",
         f"--epochs={epochs}", "--batch_size=8", f"--model_dir={model_dir}",
         "--progress=none", *flags], processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs.append(result.stderr)
    if epochs == 1:
      after_first = records_of(model_dir)
  return (*outputs, after_first)


def records_of(model_dir):
  return [json.loads(line) for line in
          (model_dir / "metrics.jsonl").read_text().splitlines()]


def epochs_of(model_dir):
  return [record["epoch"] for record in records_of(model_dir)]


def assert_resumed_at_epoch_2(model_dir, second, after_first):
  """The second command resumed at epoch 2's start and trained epoch 2
  alone (its own log, which a resume cannot rewrite, reports no epoch 1),
  and epoch 1's record is the first command's."""
  assert f"resuming {model_dir} at epoch 2, step 0" in second
  assert re.search(r"epoch 2/2 +train loss", second)
  assert not re.search(r"epoch 1/2 +train loss", second)
  assert [r["epoch"] for r in after_first] == [1]
  assert records_of(model_dir)[0] == after_first[0]
  assert epochs_of(model_dir) == [1, 2]


def assert_predicts_as_trained(loaded, record):
  """The export's figures on the test split are the run's validation
  figures of that epoch: its weights are the trained ones (a fresh
  model's would not give them: a barely trained model's 2.3096 against
  an export of zeros' 2.3026, ln 10). Within rounding: the run evaluated
  in batches, the export at once (here they agreed to 1e-7)."""
  assert loaded["loss"] == pytest.approx(record["val_loss"], rel=1e-5), (
      loaded, record)
  assert abs(loaded["accuracy"] - record["val_accuracy"]) <= (
      1.01 / TEST_IMAGES), (loaded, record)


def load_exports(code_dir, export_dir, test_split):
  result = subprocess.run(
      [fixtures.PYTHON, "-c", LOAD_EXPORTS, code_dir, str(export_dir),
       test_split],
      cwd="/", capture_output=True, text=True, timeout=timeouts.bound(300),
      env={"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "2",
           "KERAS_BACKEND": "tensorflow"})
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout)


def test_a_model_file_as_keras_guides_write_it(data_dir, test_split,
                                               tmp_path):
  code_dir = tmp_path / "code"
  code_dir.mkdir()
  (code_dir / "guide_model.py").write_text(GUIDE_MODEL)
  model_dir = tmp_path / "run"
  first, second, after_first = train_twice(
      data_dir, model_dir, f"{code_dir}/guide_model.py:build",
      "--steps_per_epoch=4")
  assert "model guide_model:" in first
  assert "batch norms trained through TensorFlow's fused kernel: 1 " in first
  assert_resumed_at_epoch_2(model_dir, second, after_first)
  records = records_of(model_dir)
  best = max(records, key=lambda record: record["val_accuracy"])
  for which, record in (("final", records[-1]), ("best", best)):
    loaded = load_exports(str(code_dir), model_dir / "export" / which,
                          test_split)
    assert loaded["model"] == "guide_model"
    assert loaded["keras_outputs"] == [2, 10]
    assert len(loaded["class_names"]) == 2
    # best/: the first epoch of the best accuracy (a later tie does not
    # replace it), as max() picks it.
    assert_predicts_as_trained(loaded, record)


@pytest.fixture(scope="module")
def mobilenet_run(data_dir, tmp_path_factory):
  """examples/keras_applications.py's MobileNetV2, trained by one command
  for 1 epoch and again for 2: (the run's model_dir, a copy of it after the
  first command, both commands' stderr). Two tests read it, as
  docs/your-model.md's example and as a keras.applications network resumed and
  exported: one MobileNetV2 run serves both (its export alone takes most
  of a minute)."""
  model_dir = tmp_path_factory.mktemp("mobilenet") / "run"
  first_dir = model_dir.parent / "after_the_first_command"
  outputs = []
  for epochs in (1, 2):
    result = fixtures.launch(
        ["-m", "engine.train", f"--data_dir={data_dir}",
         "--model=examples/keras_applications.py:mobilenet_v2",
         "--dropout=0.2", f"--epochs={epochs}", "--steps_per_epoch=2",
         "--batch_size=8", f"--model_dir={model_dir}"], processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs.append(result.stderr)
    if epochs == 1:
      shutil.copytree(model_dir, first_dir)
  return model_dir, first_dir, outputs


def test_a_keras_applications_model_from_its_own_file(mobilenet_run):
  _, model_dir, (stderr, _) = mobilenet_run
  assert "model mobilenet_v2:" in stderr
  assert "batch norms trained through TensorFlow's fused kernel: 52 " in stderr
  assert "threads per process, oneDNN kernels" in stderr
  assert epochs_of(model_dir) == [1]
  assert (model_dir / "export" / "final" / "saved_model.pb").exists()


def test_a_keras_applications_network(mobilenet_run, test_split):
  model_dir, first_dir, (_, second) = mobilenet_run
  assert_resumed_at_epoch_2(model_dir, second, records_of(first_dir))
  loaded = load_exports("", model_dir / "export" / "final", test_split)
  assert loaded["model"] == "mobilenet_v2"
  assert loaded["keras_outputs"] == [2, 10]
  assert_predicts_as_trained(loaded, records_of(model_dir)[-1])
