"""What every data set loader returns: `Splits`, the engine's contract.

A loader (built in, or a user's `--dataset=package.module:function`) returns
`Splits(train, test, info)`. Each split is one of four sources, and the
input pipeline (engine/data.py) shards, shuffles, augments and batches any
of them the same way:

* `Examples`: arrays in memory (small data sets).
* `ArrayRows`: arrays on disk, read a batch of rows at a time (.npy, .npz,
  HDF5; engine/datasets/arrays.py), so no rank holds the whole data set.
* `ImageFiles`: one image file per example, decoded as it is read
  (engine/datasets/image_folder.py).
* `RecordFiles`: TFRecord files of encoded images, streamed file by file.

`DatasetInfo` says what the model, the task and the export need to know:
the image shape and dtype, the labels' shape and dtype, the classes and
their names, and the training set's per-channel statistics that normalize
every image.
"""
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

# The classes' names, one a line in label order: written into a run's
# model_dir, and beside TFRecords by engine.tools.to_tfrecords.
CLASSES_FILE = "classes.txt"


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  name: str
  # Height, width, channels; volumes: depth, height, width, channels.
  image_shape: tuple[int, ...]
  num_classes: int
  num_train: int
  num_test: int
  # Per channel, of the training images, on their stored scale (0-255 for
  # uint8 images).
  mean: tuple[float, ...]
  std: tuple[float, ...]
  # How a shifted image's uncovered border is filled: "nearest" repeats the
  # edge (the Horovod lab's Fashion-MNIST), "constant" fills zeros (CIFAR's
  # pad-and-crop).
  shift_fill: str = "nearest"
  # The classes' names, in label order; empty: the labels' numbers.
  class_names: tuple[str, ...] = ()
  # How images are stored, and so what the exported model takes.
  image_dtype: str = "uint8"
  # One example's label: () for a class id; (k,) for k float targets.
  label_shape: tuple[int, ...] = ()
  label_dtype: str = "int64"
  # Float targets' mean and std each, of the training set (regression).
  label_mean: tuple[float, ...] = ()
  label_std: tuple[float, ...] = ()
  # What stored values become before normalization, and what `mean` and
  # `std` were measured on: "" (themselves) or "log1p", log(1 + x), for
  # counts spanning orders of magnitude (CosmoFlow's particle counts).
  transform: str = ""

  def transformed(self, values: tf.Tensor) -> tf.Tensor:
    """Stored values (float32), transformed as `transform` says."""
    return tf.math.log1p(values) if self.transform == "log1p" else values

  def normalized(self, images: tf.Tensor) -> tf.Tensor:
    """Featurewise standardization with the training set's channel
    statistics, of the stored values transformed as `transform` says
    (log(1 + x) of CosmoFlow's counts)."""
    mean = tf.constant(self.mean, tf.float32)
    std = tf.constant(self.std, tf.float32)
    return (self.transformed(tf.cast(images, tf.float32)) - mean) / std

  def labels_are_masks(self) -> bool:
    """Whether a label is an image's mask, [H, W] as the image: flipped and
    shifted with it."""
    return tuple(self.label_shape) == tuple(self.image_shape[:2])

  def classes(self) -> tuple[str, ...]:
    """The name of each class, in label order."""
    return self.class_names or tuple(str(i) for i in range(self.num_classes))


@dataclasses.dataclass(frozen=True)
class Examples:
  """One split in memory: uint8 or float32 images [N, H, W, C], int64
  labels [N]."""
  images: np.ndarray
  labels: np.ndarray


@dataclasses.dataclass(frozen=True)
class ArrayRows:
  """One split in an array on disk, read by rows as batches need them.

  `images` is anything with `.shape`, `.dtype` and `read(rows)` returning
  those rows (sorted, increasing) as an array [len(rows), H, W, C]; labels
  (small) are in memory, int64 [N].
  """
  images: Any
  labels: np.ndarray


@dataclasses.dataclass(frozen=True)
class ImageFiles:
  """One split as image files (JPEG, PNG, BMP, GIF), one example each.

  Decoded to `channels` channels and resized to the image shape as they
  are read; labels are int64 [N], in the order of `paths`, or for
  segmentation the paths of their masks (PNG files, decoded as read).
  """
  paths: tuple[str, ...]
  labels: np.ndarray
  channels: int


@dataclasses.dataclass(frozen=True)
class RecordFiles:
  """One split as TFRecord files, read file by file.

  Without `features`, each record holds `image/encoded` (JPEG or PNG
  bytes) and `image/class/label` (int64), the layout of ImageNet's
  TFRecords; with them, the declared input and label fields
  (engine/datasets/record_features.py), such as CosmoFlow's volumes.
  """
  files: tuple[str, ...]
  label_offset: int = 0  # subtracted from stored labels (1 for 1-based)
  features: Any = None   # a record_features.FeatureSpec
  compression: str = ""  # TensorFlow's compression_type: "", GZIP, ZLIB


Source = Examples | ArrayRows | ImageFiles | RecordFiles


@dataclasses.dataclass(frozen=True)
class Splits:
  train: Source
  test: Source
  info: DatasetInfo
