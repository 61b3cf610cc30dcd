"""Fashion-MNIST from its original idx files, as Debian's package installs them,
and the idx file format itself, plain or gzipped (`read_idx`).

`apt-get install dataset-fashion-mnist` puts the four gzipped idx files in
DEFAULT_DIR. Nothing is downloaded: a missing directory is an error that says
how to get the files.

An idx file is a 4-byte magic (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the values. We read
only unsigned bytes (type 0x08), the one type these data sets use, and check
the length against the header so a truncated download is caught here rather
than as a shape error deep inside TensorFlow.
"""
import dataclasses
import gzip
import os
import zlib

import numpy as np
import tensorflow as tf

from engine.core.errors import UserError
from engine.datasets import statistics
from engine.datasets.sources import Examples
from engine.datasets.splits import DatasetInfo, LabelKind, Splits

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
NUM_CLASSES = 10
# Of 0-255: a pixel brighter than this is the garment's, in masks().
MASK_THRESHOLD = 25
# The largest turn, in degrees either way, of an image in angles().
MAX_ANGLE = 45.0
# From the data set's README, in label order.
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_UNSIGNED_BYTE = 0x08  # the idx type code of uint8 values


def load(data_dir: str, labels: LabelKind = LabelKind.CLASSES) -> Splits:
  """The data set; with `labels="masks"` (--task=segmentation), each image's
  mask instead of its class (`masks`); with `labels="targets"`
  (--task=regression), each image turned by an angle to tell (`angles`)."""
  data_dir = data_dir or DEFAULT_DIR
  if not os.path.isdir(data_dir):
    hint = ("install it with: apt-get install dataset-fashion-mnist"
            if data_dir == DEFAULT_DIR else
            "pass --data_dir=DIR holding the four Fashion-MNIST idx files")
    raise UserError(f"--data_dir={data_dir}: no such directory; {hint}")
  arrays = {key: read_idx(_find(data_dir, stem)) for key, stem in FILES.items()}
  train_x, train_y = _examples(arrays["train_images"], arrays["train_labels"],
                               data_dir, "train")
  test_x, test_y = _examples(arrays["test_images"], arrays["test_labels"],
                             data_dir, "t10k")
  mean, std = statistics.channel_statistics(train_x)
  info = DatasetInfo(
      name="fashion_mnist", image_shape=train_x.shape[1:],
      num_classes=NUM_CLASSES, num_train=len(train_x), num_test=len(test_x),
      mean=mean, std=std,
      class_names=CLASS_NAMES, label_kind=LabelKind.CLASSES)
  splits = Splits(train=Examples(train_x, train_y),
                  test=Examples(test_x, test_y), info=info)
  if labels == LabelKind.MASKS:
    return masks(splits)
  if labels == LabelKind.TARGETS:
    return angles(splits)
  return splits


def masks(splits: Splits) -> Splits:
  """Fashion-MNIST for segmentation: each pixel of the garment (brighter
  than MASK_THRESHOLD) labelled with the image's class + 1, the background
  0. Masks are uint8, as the images: 47 MB for the training set."""
  def masked(examples: Examples) -> Examples:
    garment = examples.images[..., 0] > MASK_THRESHOLD
    return Examples(examples.images, np.where(
        garment, examples.labels[:, None, None] + 1, 0).astype(np.uint8))

  info = dataclasses.replace(
      splits.info, num_classes=NUM_CLASSES + 1,
      class_names=("background", *CLASS_NAMES),
      label_shape=splits.info.image_shape[:2], label_dtype="uint8",
      label_kind=LabelKind.MASKS)
  return Splits(train=masked(splits.train), test=masked(splits.test),
                info=info)


def angles(splits: Splits) -> Splits:
  """Fashion-MNIST for regression: each image turned about its centre by
  an angle drawn uniformly from +-MAX_ANGLE degrees (from a fixed seed per
  split: the same angles on every rank and rerun), the angle its target.
  The corners come in black, as the background. Flips negate an angle,
  which is why the regression task takes none unless asked."""
  def turned(examples: Examples, seed: int) -> Examples:
    count, height, width, _ = examples.images.shape
    degrees = np.random.default_rng(seed).uniform(-MAX_ANGLE, MAX_ANGLE,
                                                  count)
    theta = np.radians(degrees)
    cos, sin = np.cos(theta), np.sin(theta)
    # Output pixel (x, y) samples the input at R(theta) about the centre.
    cx, cy = (width - 1) / 2, (height - 1) / 2
    transforms = np.stack([cos, -sin, cx - cos * cx + sin * cy,
                           sin, cos, cy - sin * cx - cos * cy,
                           np.zeros(count), np.zeros(count)], axis=1)
    images = tf.raw_ops.ImageProjectiveTransformV3(
        images=examples.images, transforms=transforms.astype(np.float32),
        output_shape=[height, width], fill_value=0.0,
        interpolation="BILINEAR", fill_mode="CONSTANT").numpy()
    return Examples(images, degrees.astype(np.float32)[:, None])

  train, test = turned(splits.train, 0), turned(splits.test, 1)
  mean, std = statistics.channel_statistics(train.images)
  info = dataclasses.replace(
      splits.info, num_classes=0, class_names=("angle",),
      mean=mean, std=std,
      label_shape=(1,), label_dtype="float32", label_kind=LabelKind.TARGETS)
  return Splits(train=train, test=test, info=info)


def _find(data_dir: str, stem: str) -> str:
  for name in (stem + ".gz", stem):
    path = os.path.join(data_dir, name)
    if os.path.exists(path):
      return path
  raise UserError(f"--data_dir={data_dir}: {stem}.gz is missing; the "
                  f"directory must hold {', '.join(FILES.values())} (.gz)")


def _examples(images: np.ndarray, labels: np.ndarray, data_dir: str,
              split: str) -> tuple[np.ndarray, np.ndarray]:
  """Checks one split's arrays agree and shapes them as (N, 28, 28, 1)."""
  if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
    raise UserError(f"--data_dir={data_dir}: {split} images {images.shape} "
                    f"and labels {labels.shape} do not match")
  if labels.size and labels.max() >= NUM_CLASSES:
    raise UserError(f"--data_dir={data_dir}: {split} labels go up to "
                    f"{labels.max()}, Fashion-MNIST has {NUM_CLASSES} classes")
  return images[..., np.newaxis], labels.astype(np.int64)


def read_idx(path: str) -> np.ndarray:
  """Returns the array stored in the idx file at `path` (.gz or not)."""
  try:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
      raw = f.read()
  except FileNotFoundError:
    raise UserError(f"{path}: file not found") from None
  except (OSError, EOFError, zlib.error) as e:
    raise UserError(f"{path}: truncated or corrupt gzip file ({e}); "
                    "replace it with a fresh copy") from None
  return parse_idx(raw, path)


def parse_idx(raw: bytes, path: str = "<bytes>") -> np.ndarray:
  """Decodes the bytes of an idx file; `path` only names it in errors."""
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
    raise UserError(f"{path}: not an idx file (bad magic number)")
  if raw[2] != _UNSIGNED_BYTE:
    raise UserError(f"{path}: idx type 0x{raw[2]:02x} is not supported "
                    "(only unsigned bytes, 0x08)")
  ndim = raw[3]
  header = 4 + 4 * ndim
  if ndim == 0 or len(raw) < header:
    raise UserError(f"{path}: truncated idx header")
  shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, offset=4))
  expected = header + int(np.prod(shape))
  if len(raw) != expected:
    raise UserError(f"{path}: idx header promises {expected} bytes for shape "
                    f"{shape}, file has {len(raw)}; the file is truncated or "
                    "corrupt")
  return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def encode_idx(array: np.ndarray) -> bytes:
  """The idx bytes of a uint8 array: how tests make real-format files."""
  array = np.asarray(array, np.uint8)
  header = bytes([0, 0, _UNSIGNED_BYTE, array.ndim])
  return header + np.array(array.shape, ">u4").tobytes() + array.tobytes()
