"""Small data sets in the real on-disk formats, and launchers for the engine.

Tests never read the real Fashion-MNIST: they write a few hundred examples
in the same idx format, with class-dependent patterns a model can learn.
"""
import glob
import gzip
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
from typing import Optional

import numpy as np

from engine.datasets import cifar10, fashion_mnist
from engine.datasets import Shard
from tests import timeouts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")


def horovodrun(processes: int) -> list[str]:
  """`horovodrun --gloo -np N` with Gloo named: otherwise horovodrun first asks,
  in a process that imports TensorFlow, whether Horovod was built with MPI
  (2 s a launch); this build has Gloo only (BUILD.md)."""
  return [HOROVODRUN, "--gloo", "-np", str(processes)]


def learnable_images(num: int, shape, num_classes: int, seed: int):
  """uint8 images whose class is visible in them (a bright class band)."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, num).astype(np.uint8)
  images = rng.integers(0, 60, (num, *shape)).astype(np.uint8)
  rows = shape[0] // num_classes
  for i, label in enumerate(labels):
    images[i, label * rows:(label + 1) * rows] += 150
  return images, labels


def write_fashion_mnist(directory: str, num_train: int = 601,
                        num_test: int = 101, seed: int = 0) -> str:
  """Writes the four gzipped idx files of a tiny Fashion-MNIST."""
  os.makedirs(directory, exist_ok=True)
  splits = {"train": learnable_images(num_train, (28, 28), 10, seed),
            "test": learnable_images(num_test, (28, 28), 10, seed + 1)}
  for split, (images, labels) in splits.items():
    for kind, array in (("images", images), ("labels", labels)):
      stem = fashion_mnist.FILES[f"{split}_{kind}"]
      with gzip.open(os.path.join(directory, stem + ".gz"), "wb") as f:
        f.write(fashion_mnist.encode_idx(array))
  return directory


def write_cifar10(directory: str, num_per_batch: int = 20, num_test: int = 20,
                  layout: str = "dir", seed: int = 0) -> str:
  """Writes a tiny CIFAR-10 in the python version's format.

  Batch i of (data_batch_1, ..., data_batch_5, test_batch) holds
  `learnable_images(n, (32, 32, 3), 10, seed + i)`, stored as the originals
  are: a protocol-2 pickle of a dict with the same keys, the images as planar
  uint8 rows. `layout` "dir" writes DIRECTORY/cifar-10-batches-py/; "tar"
  writes DIRECTORY/cifar-10-python.tar.gz with the members in reverse order,
  so a reader cannot depend on the archive's order.
  """
  label_names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog",
                 b"frog", b"horse", b"ship", b"truck"]
  files = {"batches.meta": {b"label_names": label_names,
                            b"num_cases_per_batch": num_per_batch,
                            b"num_vis": 32 * 32 * 3}}
  names = (*cifar10.TRAIN_BATCHES, cifar10.TEST_BATCH)
  for i, name in enumerate(names):
    num = num_test if name == cifar10.TEST_BATCH else num_per_batch
    images, labels = learnable_images(num, (32, 32, 3), 10, seed + i)
    files[name] = {
        b"batch_label": name.encode(),
        b"labels": labels.tolist(),
        b"data": images.transpose(0, 3, 1, 2).reshape(num, -1),
        b"filenames": [label_names[label] + b"_s_%06d.png" % j
                       for j, label in enumerate(labels)],
    }
  raw = {name: pickle.dumps(batch, protocol=2) for name, batch in files.items()}
  if layout == "dir":
    batches_dir = os.path.join(directory, cifar10.BATCHES_DIR)
    os.makedirs(batches_dir, exist_ok=True)
    for name, content in raw.items():
      with open(os.path.join(batches_dir, name), "wb") as f:
        f.write(content)
  elif layout == "tar":
    os.makedirs(directory, exist_ok=True)
    with tarfile.open(os.path.join(directory, cifar10.ARCHIVE), "w:gz") as tar:
      folder = tarfile.TarInfo(cifar10.BATCHES_DIR)
      folder.type = tarfile.DIRTYPE
      tar.addfile(folder)
      for name, content in reversed(raw.items()):
        member = tarfile.TarInfo(f"{cifar10.BATCHES_DIR}/{name}")
        member.size = len(content)
        tar.addfile(member, io.BytesIO(content))
  else:
    raise ValueError(f"layout={layout!r}: expected 'dir' or 'tar'")
  return directory


# The flags every engine run a test starts with, before its own: float32.
# --mixed_precision's default, auto, would measure (seconds a launch) on
# hardware with native 16-bit arithmetic, and two runs a test compares
# could choose apart. The tests of auto give it, after these.
ENGINE_FLAGS = ("--mixed_precision=none",)
# The engine's programs that take them.
ENGINE_PROGRAMS = ("engine.train", "engine.find_lr")


def launch(python_args, *, processes: int = 1, timeout: float = 300,
           env: Optional[dict] = None) -> subprocess.CompletedProcess:
  """Runs `python *python_args` directly, or under `horovodrun --gloo -np N`.

  `python_args` is what follows the interpreter: `["-m", "engine.train",
  "--epochs=1"]` or `[script_path, ...]`; `env`, variables to add. The
  engine's programs get ENGINE_FLAGS first. `timeout` is in nominal
  seconds, which a slow or busy machine stretches (tests/timeouts.py).
  """
  command = [PYTHON, *engine_args(python_args)]
  if processes > 1:
    command = [*horovodrun(processes), *command]
  return subprocess.run(command, cwd=REPO, env=engine_env(**(env or {})),
                        text=True, capture_output=True,
                        timeout=timeouts.bound(timeout))


def packages_imported_by(module: str, packages: set[str]) -> list[str]:
  """Which of `packages` (top-level names) importing `module` imports, in a
  process of its own: what a light command (engine.runs) or module
  (engine.core.config) must keep out."""
  result = subprocess.run(
      [PYTHON, "-c", f"import json, sys; import {module}; print(json.dumps("
       f"sorted({{m.split('.')[0] for m in sys.modules}}"
       f" & set({sorted(packages)!r}))))"],
      cwd=REPO, capture_output=True, text=True, timeout=timeouts.bound(60))
  assert result.returncode == 0, result.stderr
  return json.loads(result.stdout)


def engine_args(python_args: list[str]) -> list[str]:
  """`python_args` with ENGINE_FLAGS after the program's name if it is one
  of the engine's (`-m engine.train`), so that its own flags override
  them."""
  if python_args[0] == "-m" and python_args[1] in ENGINE_PROGRAMS:
    return [*python_args[:2], *ENGINE_FLAGS, *python_args[2:]]
  return list(python_args)


def engine_env(**extra: str) -> dict:
  """The environment a launched engine process gets: this checkout on its
  path, TensorFlow's start-up chatter off, and `extra` variables."""
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO, **extra)


def train_config(**changes):
  """The engine's TrainConfig at the flags' defaults and ENGINE_FLAGS, with
  `changes` by section, as TrainConfig.replace takes them:
  `train_config(training=dict(epochs=2), model=dict(name="wrn"))`."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  import flags as engine_flags  # (defines the engine's flags)
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(["tests", *ENGINE_FLAGS])
  return engine_flags.config_from_flags().replace(**changes)


def outputs_and_gradients(network, inputs) -> list:
  """A network's outputs in training on `inputs` (4 a row) and the
  gradients of a fixed weighting of them: what two networks computing one
  function must agree on."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.GradientTape() as tape:
    outputs = network(inputs, training=True)
    loss = tf.reduce_sum(outputs * [1.0, -2.0, 3.0, -4.0])
  return [outputs] + tape.gradient(loss, network.trainable_variables)


def write_tfrecords(directory: str, *, num_files: int = 3,
                    per_file: int = 8, test_files: int = 2,
                    label_offset: int = 0, seed: int = 0) -> str:
  """Sharded TFRecords in ImageNet's layout: train-* and validation-* files.

  Images are 24x20 (not square, not the training size), JPEG in even files
  and PNG in odd ones. Example i of a split has label (i % 10) + offset
  and a class band, so loaders can be checked example by example.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  os.makedirs(directory, exist_ok=True)
  for split, files in (("train", num_files), ("validation", test_files)):
    images, labels = learnable_images(files * per_file, (24, 20, 3), 10,
                                      seed + (split == "validation"))
    for f in range(files):
      path = os.path.join(directory, f"{split}-{f:05d}-of-{files:05d}")
      with tf.io.TFRecordWriter(path) as writer:
        for i in range(f * per_file, (f + 1) * per_file):
          encode = tf.io.encode_png if f % 2 else tf.io.encode_jpeg
          feature = {
              "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
                  value=[encode(images[i]).numpy()])),
              "image/class/label": tf.train.Feature(
                  int64_list=tf.train.Int64List(
                      value=[int(labels[i]) + label_offset])),
          }
          writer.write(tf.train.Example(features=tf.train.Features(
              feature=feature)).SerializeToString())
  return directory


def eval_batches_of_every_rank(source, info, *, world_size: int,
                               batch_size: int):
  """(images, labels) of every evaluation batch of every rank, in turn."""
  from engine import datasets  # pylint: disable=import-outside-toplevel
  for rank in range(world_size):
    yield from datasets.eval_batches(source, info, shard=Shard(rank, world_size),
                                 batch_size=batch_size)


def recorded_processes(out_dir) -> list[dict]:
  """What each process of a tests/workers/recorded_run.py job wrote to
  `out_dir`: its JSON record, with its final weights under "weights"."""
  processes = []
  for path in sorted(glob.glob(os.path.join(str(out_dir), "*.json"))):
    with open(path) as f:
      record = json.load(f)
    weights = np.load(path.replace(".json", ".npz"))
    record["weights"] = [weights[k] for k in weights.files]
    processes.append(record)
  return processes


IMAGE_CLASSES = ("ant", "bee", "cat")


def write_image_folder(directory: str, *, train_counts=(7, 5, 6),
                       validation_counts=(3, 2, 4), shape=(20, 24),
                       seed: int = 0) -> str:
  """An image folder in the layout of Keras' image_dataset_from_directory:
  DIRECTORY/train/<class>/ and, unless `validation_counts` is None,
  DIRECTORY/validation/<class>/.

  Each image shows its class as a bright band (`learnable_images`), in
  grayscale, RGB or RGBA in turn (JPEGs: no RGBA), as PNG and JPEG in
  turn, except that each
  split's first two files of the first class are a BMP and a GIF. Odd
  counts, so ranks get unequal shares.
  """
  from PIL import Image  # pylint: disable=import-outside-toplevel
  splits = {"train": train_counts}
  if validation_counts is not None:
    splits["validation"] = validation_counts
  for s, (split, counts) in enumerate(splits.items()):
    for label, (name, count) in enumerate(zip(IMAGE_CLASSES, counts)):
      folder = os.path.join(directory, split, name)
      os.makedirs(folder, exist_ok=True)
      rng = np.random.default_rng(seed + 10 * s + label)
      images = rng.integers(0, 60, (count, *shape, 3)).astype(np.uint8)
      band = shape[0] // len(IMAGE_CLASSES)
      images[:, label * band:(label + 1) * band] += 150
      for i, pixels in enumerate(images):
        extension = ("png", "jpg")[i % 2]
        mode = ("L", "RGB", "RGBA")[i % 3]
        if extension == "jpg" and mode == "RGBA":  # JPEG has no alpha
          mode = "RGB"
        image = Image.fromarray(pixels).convert(mode)
        if label == 0 and i < 2:
          extension = ("bmp", "gif")[i]
          image = image.convert("RGB" if i == 0 else "P")
        image.save(os.path.join(folder, f"{name}_{i:03d}.{extension}"))
  return directory


def write_arrays(path: str, *, num_train: int = 61, num_test: int = 23,
                 shape=(12, 12), num_classes: int = 4, dtype="uint8",
                 seed: int = 0) -> str:
  """x_train, y_train, x_test, y_test (and class_names) as `path`: an .npz,
  an .h5, or else a directory of .npy files. Images of `shape` (H, W for
  one channel), learnable."""
  arrays = {}
  for split, num, offset in (("train", num_train, 0), ("test", num_test, 1)):
    images, labels = learnable_images(num, shape, num_classes, seed + offset)
    arrays[f"x_{split}"] = (images if dtype == "uint8" else
                            (images / 255.0).astype(dtype))
    arrays[f"y_{split}"] = labels.astype(np.int64)
  arrays["class_names"] = np.array([f"class_{i}" for i in range(num_classes)])
  if path.endswith(".npz"):
    np.savez(path, **arrays)
  elif path.endswith(".h5"):
    import h5py  # pylint: disable=import-outside-toplevel
    with h5py.File(path, "w") as f:
      for name, array in arrays.items():
        f[name] = array.astype("S") if name == "class_names" else array
  else:
    os.makedirs(path, exist_ok=True)
    for name, array in arrays.items():
      np.save(os.path.join(path, name + ".npy"), array)
  return path


def write_regression_arrays(path: str, *, num_train: int = 97,
                            num_test: int = 31, shape=(8, 8),
                            seed: int = 0) -> str:
  """An .npz of uint8 images with two float targets each, which the images
  carry (their brightness, and their top half's, on different scales), and
  the targets' names as class_names."""
  rng = np.random.default_rng(seed)
  arrays = {}
  for split, num in (("train", num_train), ("test", num_test)):
    images = rng.integers(0, 256, (num, *shape)).astype(np.uint8)
    brightness = images.mean(axis=(1, 2)) / 255.0
    top = images[:, :shape[0] // 2].mean(axis=(1, 2)) / 255.0
    arrays[f"x_{split}"] = images
    arrays[f"y_{split}"] = np.stack([10.0 * brightness + 5.0, 100.0 * top],
                                    axis=1).astype(np.float32)
  arrays["class_names"] = np.array(["brightness", "top"])
  np.savez(path, **arrays)
  return path


def write_mask_folder(directory: str, *, counts=(9, 5), size=(12, 12),
                      seed: int = 0) -> str:
  """train/ and validation/, each images/NAME.png (RGB) with
  masks/NAME.png (class ids 0-2, mode L), and classes.txt: a bright square
  (class 1) or a dark one (class 2) on a grey background (class 0)."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  for split, count in zip(("train", "validation"), counts):
    for kind in ("images", "masks"):
      os.makedirs(os.path.join(directory, split, kind), exist_ok=True)
    for i in range(count):
      mask = np.zeros(size, np.uint8)
      top, left = rng.integers(0, size[0] // 2, 2)
      label = 1 + i % 2
      mask[top:top + size[0] // 2, left:left + size[1] // 2] = label
      image = np.full((*size, 3), 128, np.uint8)
      image[mask == 1] = 250
      image[mask == 2] = 10
      Image.fromarray(image).save(
          os.path.join(directory, split, "images", f"{i:03d}.png"))
      Image.fromarray(mask, mode="L").save(
          os.path.join(directory, split, "masks", f"{i:03d}.png"))
  with open(os.path.join(directory, "classes.txt"), "w") as f:
    f.write("background\nbright\ndark\n")
  return directory


# A user's own model, in a file of its own: BatchNorm, dropout, a custom
# layer, a loss of its own (model.losses); and the same as a subclassed
# model, which Keras can neither clone nor describe before it is called.
USER_MODEL_MODULE = '''
import keras
import tensorflow as tf


class Scale(keras.layers.Layer):
  """A custom layer: one learned factor."""

  def build(self, input_shape):
    self.factor = self.add_weight(name="factor", shape=(),
                                  initializer="ones")

  def call(self, x):
    return x * self.factor


def build(input_shape, num_classes, dropout=0.0):
  inputs = keras.Input(input_shape)
  # Its own loss, as Keras 3 adds one (add_loss takes no function there).
  conv = keras.layers.Conv2D(8, 3, padding="same",
                             kernel_regularizer=keras.regularizers.L2(1e-4))
  x = keras.layers.ReLU()(keras.layers.BatchNormalization()(
      conv(inputs)))
  x = Scale()(keras.layers.GlobalAveragePooling2D()(x))
  x = keras.layers.Dropout(dropout)(x)
  logits = keras.layers.Dense(num_classes, dtype="float32")(x)
  return keras.Model(inputs, logits, name="users_model")


class Subclassed(keras.Model):

  def __init__(self, num_classes):
    super().__init__(name="users_subclassed")
    self.conv = keras.layers.Conv2D(8, 3, padding="same")
    self.norm = keras.layers.BatchNormalization()
    self.scale = Scale()
    self.logits = keras.layers.Dense(num_classes, dtype="float32")

  def call(self, images, training=False):
    x = tf.nn.relu(self.norm(self.conv(images), training=training))
    return self.logits(self.scale(tf.reduce_mean(x, axis=[1, 2])))


def build_subclassed(num_classes):
  return Subclassed(num_classes)
'''


# A user's own data set function: their arrays, through from_arrays.
USER_DATA_MODULE = '''
import numpy as np

from engine import datasets


def load(data_dir):
  arrays = np.load(data_dir)
  return datasets.from_arrays(arrays["x_train"], arrays["y_train"],
                              arrays["x_test"], arrays["y_test"],
                              class_names=["w", "x", "y", "z"])
'''


def write_user_code(directory: str) -> str:
  """USER_MODEL_MODULE and USER_DATA_MODULE as DIRECTORY/users_model.py
  and DIRECTORY/users_data.py; returns DIRECTORY."""
  os.makedirs(directory, exist_ok=True)
  for name, source in (("users_model.py", USER_MODEL_MODULE),
                       ("users_data.py", USER_DATA_MODULE)):
    with open(os.path.join(directory, name), "w") as f:
      f.write(source)
  return directory


def step_settings(**changed):
  """What a run does, for a step report (step_advice.Settings): a CPU run
  of one process a host at the flags' defaults, float32, that reads no
  records, but for `changed` (the performance flags' by name)."""
  from engine.records import step_advice  # pylint: disable=import-outside-toplevel
  import dataclasses  # pylint: disable=import-outside-toplevel
  performance = train_config().performance
  performance = dataclasses.replace(performance, **{
      "mixed_precision": "none", "gradient_compression": "none",
      **{name: changed.pop(name) for name in list(changed)
         if hasattr(performance, name)}})
  return step_advice.Settings(**{**dict(
      device="CPU", processes_per_host=1, performance=performance,
      records=False, cache_records=False, image_records=False,
      streams_declared_records=False, stage_dir=False), **changed})


def one_step(train_step, images, labels, stop_requested: bool = False,
             timed: bool = False):
  """One step of `train_step` (engine/compute/step.py) on one batch, which
  it reads from a dataset of that batch alone (TrainStep.start, train);
  the call's steps.Trained."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  train_step.start(tf.data.Dataset.from_tensors((images, labels)))
  return train_step.train(1, stop_requested, timed)
