"""The kinds of source, each reading itself for training and for
evaluation (what every kind guarantees: `Source`, in splits.py).

Examples held in memory (`Examples`), arrays on disk (`ArrayRows`) and
image files (`ImageFiles`) are read by index. Rank r keeps examples r,
r + N, r + 2N, ..., the selection `tf.data.Dataset.shard(N, r)` makes, and
each epoch cuts a stateless shuffle of them into batches; only then are a
batch's examples read (a vectorized gather in memory, a read of the
batch's rows on disk, or a parallel decode of the batch's files), so a
resumed run skips to its step without reading what it skips.

TFRecord files (`ImageRecords` and `FeatureRecords`, in record_files.py)
are streamed: files, not examples, are split across ranks.

Either way one stream runs epoch after epoch (`stream`), each epoch's
draws made from its key, (seed, epoch), and a rank whose share is too short
for an epoch's steps reads it again in another pass, so every rank runs the
same number of steps. Batches are augmented with stateless draws keyed by
(epoch, step, rank) (`batch_augmentation`). Every kind gives its batches
as stored; the input pipeline normalizes them, all kinds alike
(engine/input/data.py).
"""
import abc
import dataclasses
import math
import os
from typing import Any

import numpy as np
import tensorflow as tf

from engine.datasets.augmentation import Augmentation, augment, augment_volumes
from engine.datasets.splits import DatasetInfo, Epochs, Shard, Source

# Batches augmented (or read) at once: our per-batch work (a gather, a
# flip, a shift) runs at about 45k images/s on one thread, so one batch in
# flight and two ready (engine/input/data.py) keep the step fed.
PARALLEL_BATCHES = 2


def stream(epochs: Epochs, epoch_batches, *, first_epoch: int,
           first_step: int, key_space: int) -> tf.data.Dataset:
  """(epoch key, step, batch) of every training batch from `first_step` of
  `first_epoch` on: `epoch_batches(key)` gives an epoch's batches, each
  draw made from the epoch's key, (seed, key_space, epoch). One stream for
  the whole run, so prefetching carries on across epoch ends and no
  iterator is torn down between epochs. `key_space` keeps the draws of the
  two ways of reading apart: 0 by index, 1 streamed records."""
  root_key = tf.constant([epochs.seed, key_space], tf.int64)

  def epoch(number):
    key = tf.random.experimental.stateless_fold_in(root_key, number)
    return epoch_batches(key).enumerate().map(
        lambda step, batch: (key, step, batch))

  return tf.data.Dataset.counter(first_epoch).flat_map(epoch).skip(first_step)


def batch_augmentation(info: DatasetInfo, shard: Shard,
                       augmentation: Augmentation):
  """The function from an epoch's key, a step and its batch to the batch
  augmented, still as stored: the draws keyed by (epoch, step, rank)."""
  volumes = len(info.image_shape) == 4

  def augmented(epoch_key, step, images, labels):
    key = tf.random.experimental.stateless_fold_in(
        epoch_key, step * shard.world_size + shard.rank)
    if volumes:
      return augment_volumes(images, key, flip=augmentation.flip,
                             transpose=augmentation.transpose), labels
    batch = augment(images, key, flip=augmentation.flip,
                    shift=augmentation.shift, fill=info.shift_fill)
    if info.labels_are_masks():  # moved as its image is: the same key
      labels = augment(labels[..., None], key, flip=augmentation.flip,
                       shift=augmentation.shift, fill=info.shift_fill)[..., 0]
    return batch, labels

  return augmented


def decode_parallelism() -> int:
  """Decoding runs on the cores this process may use (after binding)."""
  return len(os.sched_getaffinity(0))


# Read by index.

class _ByIndex(Source):
  """Examples chosen by index (`labels` holds one per example): rank r's
  are r, r + N, r + 2N, ..."""

  def train_batches(self, info: DatasetInfo, *, shard: Shard, epochs: Epochs,
                    augmentation: Augmentation, first_epoch: int,
                    first_step: int) -> tf.data.Dataset:
    """Each epoch a stateless shuffle of this rank's indices (several
    passes over them if they are fewer than the epoch takes), cut into
    `steps` batches; then each batch's examples are read and augmented."""
    rows = tf.range(shard.rank, len(self.labels), shard.world_size,
                    dtype=tf.int64)
    per_epoch = epochs.steps * epochs.batch_size
    passes = math.ceil(per_epoch / len(rows))

    def epoch_rows(key):
      order = tf.concat([
          tf.random.experimental.stateless_shuffle(
              rows, tf.random.experimental.stateless_fold_in(key, p))
          for p in range(passes)], axis=0)
      return tf.data.Dataset.from_tensor_slices(
          tf.reshape(order[:per_epoch], [epochs.steps, epochs.batch_size]))

    indices = stream(epochs, epoch_rows, first_epoch=first_epoch,
                     first_step=first_step,
                     key_space=0)  # indices: skipping them costs nothing
    return self._read_training(
        indices, info, batch_augmentation(info, shard, augmentation),
        epochs.batch_size)

  def eval_batches(self, info: DatasetInfo, *, shard: Shard,
                   batch_size: int) -> tf.data.Dataset:
    return self._read_eval(
        tf.data.Dataset.range(shard.rank, len(self.labels), shard.world_size),
        info, batch_size)

  @abc.abstractmethod
  def _read_training(self, indices: tf.data.Dataset, info: DatasetInfo,
                     augmented, batch_size: int) -> tf.data.Dataset:
    """The batches of `indices`' (epoch key, step, rows), read and
    `augmented`."""

  @abc.abstractmethod
  def _read_eval(self, rows: tf.data.Dataset, info: DatasetInfo,
                 batch_size: int) -> tf.data.Dataset:
    """The examples of `rows`, in batches of `batch_size`."""


class _ByRows(_ByIndex):
  """Examples read a batch at a time, by `_reader`: one vectorized op for
  the whole batch."""

  def _read_training(self, indices: tf.data.Dataset, info: DatasetInfo,
                     augmented, batch_size: int) -> tf.data.Dataset:
    read = self._reader(info)
    return indices.map(
        lambda key, step, rows: augmented(key, step, *read(rows)),
        num_parallel_calls=PARALLEL_BATCHES)

  def _read_eval(self, rows: tf.data.Dataset, info: DatasetInfo,
                 batch_size: int) -> tf.data.Dataset:
    return rows.batch(batch_size).map(self._reader(info))

  @abc.abstractmethod
  def _reader(self, info: DatasetInfo):
    """A function from a batch's indices to its (images, labels)."""


@dataclasses.dataclass(frozen=True)
class Examples(_ByRows):
  """One split in memory: uint8 or float32 images [N, H, W, C], int64
  labels [N]."""
  images: np.ndarray
  labels: np.ndarray

  def _reader(self, info: DatasetInfo):
    images, labels = tf.constant(self.images), tf.constant(self.labels)
    return lambda rows: (tf.gather(images, rows), tf.gather(labels, rows))


@dataclasses.dataclass(frozen=True)
class ArrayRows(_ByRows):
  """One split in an array on disk, read by rows as batches need them.

  `images` is anything with `.shape`, `.dtype` and `read(rows)` returning
  those rows (sorted, increasing) as an array [len(rows), H, W, C]; labels
  (small) are in memory, int64 [N].
  """
  images: Any
  labels: np.ndarray

  def _reader(self, info: DatasetInfo):
    labels = tf.constant(self.labels)
    dtype = tf.as_dtype(self.images.dtype)

    def read(rows: np.ndarray) -> np.ndarray:
      # Readers take increasing rows; a batch may hold one twice (a shard
      # shorter than an epoch is read in several passes).
      unique, inverse = np.unique(rows, return_inverse=True)
      return self.images.read(unique)[inverse]

    def reader(rows):
      images = tf.numpy_function(read, [rows], dtype, stateful=False)
      images.set_shape([None, *info.image_shape])
      return images, tf.gather(labels, rows)

    return reader


@dataclasses.dataclass(frozen=True)
class ImageFiles(_ByIndex):
  """One split as image files (JPEG, PNG, BMP, GIF), one example each.

  Decoded to the image shape's channels and resized to its size as they
  are read; labels are int64 [N], in the order of `paths`, or for
  segmentation the paths of their masks (PNG files, decoded as read).
  """
  paths: tuple[str, ...]
  labels: np.ndarray

  def _read_training(self, indices: tf.data.Dataset, info: DatasetInfo,
                     augmented, batch_size: int) -> tf.data.Dataset:
    """Each batch's files decoded in parallel, one example per call, and
    batched again with their batch's (key, step)."""
    example = self._example(info)

    def per_example(key, step, rows):
      count = tf.shape(rows)[0]
      return (tf.tile(key[None], [count, 1]), tf.fill([count], step), rows)

    return (indices.map(per_example).unbatch()
            .map(lambda key, step, row: (key, step, *example(row)),
                 num_parallel_calls=decode_parallelism())
            .batch(batch_size, drop_remainder=True)
            .map(lambda keys, steps, images, labels:
                 augmented(keys[0], steps[0], images, labels),
                 num_parallel_calls=PARALLEL_BATCHES))

  def _read_eval(self, rows: tf.data.Dataset, info: DatasetInfo,
                 batch_size: int) -> tf.data.Dataset:
    return rows.map(self._example(info),
                    num_parallel_calls=decode_parallelism()).batch(batch_size)

  def _example(self, info: DatasetInfo):
    """A function from an example's index to its image and label decoded:
    the label's class id, or its mask's file."""
    paths = tf.constant(list(self.paths))
    labels = tf.constant(self.labels)

    def example(row):
      label = tf.gather(labels, row)
      if info.labels_are_masks():
        label = decode_mask(label, info.image_shape[:2])
      return decode(tf.gather(paths, row), info.image_shape), label

    return example


def decode(path: tf.Tensor, image_shape) -> tf.Tensor:
  """An image file as float32 [H, W, C] on the 0-255 scale, resized.

  Any of the four formats, with 1 to 4 channels: alpha is dropped, and
  grayscale and color are converted to the image shape's channels.
  """
  height, width, channels = image_shape
  image = tf.io.decode_image(tf.io.read_file(path), expand_animations=False)
  have = tf.shape(image)[-1]
  image = tf.cond(have >= 3, lambda: image[..., :3], lambda: image[..., :1])
  if channels == 3:
    image = tf.cond(tf.shape(image)[-1] == 1,
                    lambda: tf.tile(image, [1, 1, 3]), lambda: image)
  else:
    image = tf.cond(tf.shape(image)[-1] == 3,
                    lambda: tf.image.rgb_to_grayscale(image), lambda: image)
  image = tf.image.resize(image, [height, width])
  return tf.ensure_shape(image, image_shape)


def decode_mask(path: tf.Tensor, size) -> tf.Tensor:
  """A mask PNG as uint8 class ids [H, W], resized to `size` (nearest)."""
  mask = tf.io.decode_png(tf.io.read_file(path), channels=1)
  mask = tf.image.resize(mask, size, method="nearest")
  return tf.ensure_shape(tf.cast(mask[..., 0], tf.uint8), size)
