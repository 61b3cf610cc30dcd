"""A split's batches, from the loader's examples to the batches the step
takes: each kind of source reads itself for training and for evaluation
(what every kind guarantees: `Source`, in splits.py), and here, once for
every kind, its batches are normalized, resized and prefetched
(`train_stream`, `eval_batches`).

Examples held in memory (`Examples`), arrays on disk (`ArrayRows`), both
read a batch of rows at a time (`RowsSource`), and image files
(`ImageFiles`, in image_folder.py) are read by index. Rank r keeps
examples r, r + N, r + 2N, ..., the selection `tf.data.Dataset.shard(N, r)`
makes, and each epoch cuts a stateless shuffle of them into batches; only
then are a batch's examples read (a vectorized gather in memory, a read of
the batch's rows on disk, or a parallel decode of the batch's files), so a
resumed run skips to its step without reading what it skips.

TFRecord files (`ImageRecords` and `FeatureRecords`, in record_files.py)
are streamed: files, not examples, are split across ranks.

Either way one stream runs epoch after epoch (`stream`), each epoch's
draws made from its key, (seed, epoch), and a rank whose share is too short
for an epoch's steps reads it again in another pass, so every rank runs the
same number of steps. Batches are augmented with stateless draws keyed by
(epoch, step, rank) (`batch_augmentation`). Every kind gives its batches
as stored; `_normalized` normalizes them, all kinds alike, the one place
any batch is. Three properties matter more than speed, and every kind
keeps them:

* Every rank runs the same number of steps each epoch. Horovod's allreduce
  waits for all ranks, so one rank with an extra batch would hang the job.
  `steps_per_epoch` is fixed from the global batch, and a rank whose shard
  is too short for it starts another pass over its shard.
* Ranks see disjoint data: rank r's examples, or its files.
* An epoch's batches depend only on (seed, epoch, rank, size): shuffles are
  stateless permutations keyed by (seed, epoch), and augmentation uses
  stateless random ops keyed by epoch, step and rank. A run is reproducible,
  every epoch differs from the last, no two ranks augment alike, and a run
  can start at any epoch, and at any step of it.

Training reads one stream for the whole run, epoch after epoch, through one
iterator: prefetching carries on across epoch ends, and no iterator is torn
down between epochs.
"""
import abc
import dataclasses
import itertools
import math
import os
from typing import Any

import numpy as np
import tensorflow as tf

from engine.core.errors import UserError
from engine.datasets.splits import (Augmentation, DatasetInfo, Epochs, Shard,
                                    Source)

# Batches augmented (or read) at once: our per-batch work (a gather, a
# flip, a shift) runs at about 45k images/s on one thread, so one batch in
# flight and two ready (PREFETCH_BATCHES) keep the step fed.
PARALLEL_BATCHES = 2

# Fixed parallelism rather than tf.data's autotuning: one batch in flight
# and two ready keep the step fed (PARALLEL_BATCHES). Autotuning
# bought nothing and cost a lot: its background optimizer competes with
# training for the cores, and an iterator's teardown waits for it
# (measured: 1.5-6 s at each epoch end and at exit on 2 processes sharing
# 2 cores).
PREFETCH_BATCHES = 2


def _without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


def steps_per_epoch(*, num_train: int, batch_size: int, world_size: int,
                    requested: int) -> int:
  """`requested` if set, else as many global batches as the data holds."""
  if requested:
    return requested
  global_batch = batch_size * world_size
  steps = num_train // global_batch
  if steps == 0:
    raise UserError(
        f"--batch_size={batch_size} on {world_size} processes is a global "
        f"batch of {global_batch}, more than the {num_train} training "
        "examples; lower --batch_size")
  return steps


def train_stream(source: Source, info: DatasetInfo, *, shard: Shard,
                 epochs: Epochs, augmentation: Augmentation,
                 first_epoch: int = 0, first_step: int = 0) -> tf.data.Dataset:
  """This rank's training batches from `first_epoch` on, `epochs.steps`
  per epoch.

  Normalized float32 images (or volumes) and their labels (int64 class
  ids, float targets, or masks flipped and shifted with their images), one
  stream for the whole run, augmented as `augmentation` says; with its
  `resizing`, the images of the first epochs are made smaller (`_resized`).
  A run resumed mid-epoch starts at `first_step` of `first_epoch`, with the
  very batches an uninterrupted run would have had there.
  """
  augmentation.check(info.image_shape)
  batches = _normalized(source, info, source.train_batches(
      info, shard=shard, epochs=epochs, augmentation=augmentation,
      first_epoch=first_epoch, first_step=first_step))
  if augmentation.resizing:
    batches = _resized(batches, augmentation.resizing, steps=epochs.steps,
                       first_epoch=first_epoch, first_step=first_step)
  return _without_autotune(batches.prefetch(PREFETCH_BATCHES))


def _resized(batches: tf.data.Dataset, resizing: tuple, *, steps: int,
             first_epoch: int, first_step: int) -> tf.data.Dataset:
  """Progressive resizing (fast.ai's; Touvron et al. 2019, "Fixing the
  train-test resolution discrepancy"): each batch of an epoch up to a
  stage's last epoch (1-based) resized to that stage's side, later ones
  as they are. The epoch follows from the batch's place in the stream, so
  a resumed run resizes exactly as the run it continues. Area-weighted
  (antialiased) so that a small image is the large one seen from further
  away, not a sample of its pixels."""
  last_epochs = tf.constant([last for _, last in resizing], tf.int64)
  sides = tf.constant([side for side, _ in resizing], tf.int32)

  def resized(index, batch):
    images, labels = batch
    epoch = first_epoch + (first_step + index) // steps  # 0-based
    stage = tf.searchsorted(last_epochs, [epoch], side="right")[0]
    return tf.cond(
        stage < len(resizing),
        lambda: tf.image.resize(images, [sides[stage], sides[stage]],
                                antialias=True),
        lambda: images), labels

  return batches.enumerate().map(resized,
                                 num_parallel_calls=PARALLEL_BATCHES)


def eval_batches(source: Source, info: DatasetInfo, *, shard: Shard,
                 batch_size: int) -> tf.data.Dataset:
  """This rank's share of the whole split, each example exactly once,
  normalized.

  No padding and no repetition: the last batch may be short, and ranks may
  hold more examples than others. Figures are reduced as sums and counts, so
  the result is exactly the whole split's.
  """
  batches = _normalized(source, info, source.eval_batches(
      info, shard=shard, batch_size=batch_size))
  return _without_autotune(batches.prefetch(PREFETCH_BATCHES))


def _normalized(source: Source, info: DatasetInfo,
                batches: tf.data.Dataset) -> tf.data.Dataset:
  """Batches as stored, normalized as the model receives them
  (DatasetInfo.normalized): the one place any batch is, unless its kind
  leaves them as they are (`Source.normalizes`). Training's after their
  augmentation, which moves stored values (a shift fills its border with a
  stored value, or zero) and before progressive resizing, which averages
  normalized ones."""
  if not source.normalizes:
    return batches
  return batches.map(lambda images, labels: (info.normalized(images), labels),
                     num_parallel_calls=PARALLEL_BATCHES)


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


# Augmentation: random flips and shifts of images, flips and axis orders of
# volumes. Every draw is stateless, keyed by (seed, epoch, step, rank) by the
# source that reads the batch (`batch_augmentation`), so a run's batches are
# reproducible, every epoch differs, no two ranks augment alike, and a
# resumed run gets the very batches it would have had. Images are
# transformed a whole batch at a time with a few ops, cheaper than a
# per-example map; volumes one by one, each copied once or twice, cheaper
# than whole-batch copies of every flip (`augment_volumes`).

# A volume's three axes, in each of their orders.
_AXIS_ORDERS = tuple(itertools.permutations(range(3)))


def augment(images: tf.Tensor, key: tf.Tensor, *, flip: bool, shift: float,
            fill: str = "nearest") -> tf.Tensor:
  """Random horizontal flips and shifts of a uint8 batch, as the Horovod lab.

  The lab's ImageDataGenerator shifted by up to `shift` of the width and
  height and filled the border with the nearest pixel; we shift by whole
  pixels, the same transform without interpolation blur. With
  `fill="constant"` the border is zeros: CIFAR's pad-4-and-crop is a shift
  of up to 4/32 = 0.125. One image transform op for the whole batch is far
  cheaper than a per-example map.
  """
  batch = tf.shape(images)[0]
  flip_key = tf.random.experimental.stateless_fold_in(key, 0)
  shift_key = tf.random.experimental.stateless_fold_in(key, 1)
  if flip:
    flipped = tf.random.stateless_uniform([batch], flip_key) < 0.5
    images = tf.where(flipped[:, None, None, None],
                      tf.reverse(images, axis=[2]), images)
  height, width = images.shape[1], images.shape[2]
  max_dy, max_dx = round(shift * height), round(shift * width)
  if max_dx or max_dy:
    offsets = tf.random.stateless_uniform(
        [batch, 2], shift_key, minval=-1.0, maxval=1.0)
    offsets = tf.round(offsets * tf.constant([max_dx, max_dy], tf.float32))
    ones, zeros = tf.ones([batch, 1]), tf.zeros([batch, 1])
    # Each output pixel (x, y) samples the input at (x + dx, y + dy).
    transforms = tf.concat([ones, zeros, offsets[:, :1], zeros, ones,
                            offsets[:, 1:], zeros, zeros], axis=1)
    images = tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms,
        output_shape=tf.constant([height, width]), fill_value=0.0,
        interpolation="NEAREST", fill_mode=fill.upper())
  return images


def augment_volumes(volumes: tf.Tensor, key: tf.Tensor, *, flip: bool,
                    transpose: bool) -> tf.Tensor:
  """Random flips of a batch of volumes [B, D, H, W, C] along each spatial
  axis and, with `transpose`, a random order of the three axes, each
  example its own: the symmetries of a box of matter (CosmoFlow's
  augmentation), which change no physical parameter.

  Example by example: each volume reversed along its flipped axes at once,
  then transposed, a copy each. Flipping the whole batch along each axis
  and selecting (tf.where) made the same volumes at five times the cost,
  more than a CosmoFlow step's (bench/RESULTS.md, "CosmoFlow's step")."""
  if not (flip or transpose):
    return volumes
  count = tf.shape(volumes)[0]
  flips = tf.zeros([3, count], tf.bool)
  if flip:
    flips = tf.random.stateless_uniform(
        [3, count], tf.random.experimental.stateless_fold_in(key, 0)) < 0.5
  orders = tf.zeros([count], tf.int32)  # _AXIS_ORDERS[0]: as stored
  if transpose:
    orders = tf.random.stateless_uniform(
        [count], tf.random.experimental.stateless_fold_in(key, 1),
        maxval=len(_AXIS_ORDERS), dtype=tf.int32)
  permutations = tf.constant([order + (3,) for order in _AXIS_ORDERS])

  def augmented(example):
    volume, flipped, order = example
    volume = tf.reverse(volume, tf.boolean_mask(tf.range(3), flipped))
    return tf.transpose(volume, tf.gather(permutations, order))

  return tf.map_fn(augmented, (volumes, tf.transpose(flips), orders),
                   fn_output_signature=volumes.dtype)


def decode_parallelism() -> int:
  """Decoding runs on the cores this process may use (after binding)."""
  return len(os.sched_getaffinity(0))


# Read by index.

def indices(num_examples: int, *, shard: Shard, epochs: Epochs,
            first_epoch: int, first_step: int) -> tf.data.Dataset:
  """(epoch key, step, rows) of this rank's training batches, examples
  chosen by index: rank r's are r, r + N, r + 2N, ...; each epoch a
  stateless shuffle of them (several passes over them if they are fewer
  than the epoch takes), cut into `steps` batches."""
  rows = tf.range(shard.rank, num_examples, shard.world_size, dtype=tf.int64)
  per_epoch = epochs.steps * epochs.batch_size
  passes = math.ceil(per_epoch / len(rows))

  def epoch_rows(key):
    order = tf.concat([
        tf.random.experimental.stateless_shuffle(
            rows, tf.random.experimental.stateless_fold_in(key, p))
        for p in range(passes)], axis=0)
    return tf.data.Dataset.from_tensor_slices(
        tf.reshape(order[:per_epoch], [epochs.steps, epochs.batch_size]))

  return stream(epochs, epoch_rows, first_epoch=first_epoch,
                first_step=first_step,
                key_space=0)  # indices: skipping them costs nothing


def eval_rows(num_examples: int, shard: Shard) -> tf.data.Dataset:
  """This rank's share of a split's examples, each once."""
  return tf.data.Dataset.range(shard.rank, num_examples, shard.world_size)


class RowsSource(Source):
  """A split read a batch of rows at a time, by index: its examples in
  memory (`Examples`) or its arrays on disk (`ArrayRows`). Sharded,
  shuffled, batched and augmented alike; only a batch's reading differs
  (`read_rows`). `labels`, in memory, count the examples."""

  def train_batches(self, info: DatasetInfo, *, shard: Shard, epochs: Epochs,
                    augmentation: Augmentation, first_epoch: int,
                    first_step: int) -> tf.data.Dataset:
    """Each batch's rows (`indices`) read in one call, then augmented."""
    read = self.read_rows(info)
    augmented = batch_augmentation(info, shard, augmentation)
    return indices(
        len(self.labels), shard=shard, epochs=epochs, first_epoch=first_epoch,
        first_step=first_step).map(
            lambda key, step, rows: augmented(key, step, *read(rows)),
            num_parallel_calls=PARALLEL_BATCHES)

  def eval_batches(self, info: DatasetInfo, *, shard: Shard,
                   batch_size: int) -> tf.data.Dataset:
    return eval_rows(len(self.labels), shard).batch(batch_size).map(
        self.read_rows(info))

  @abc.abstractmethod
  def read_rows(self, info: DatasetInfo):
    """The function from a batch's row indices to its (images, labels), as
    stored."""


@dataclasses.dataclass(frozen=True)
class Examples(RowsSource):
  """One split in memory: uint8 or float32 images [N, H, W, C], int64
  labels [N]; a batch's examples read in one vectorized gather."""
  images: np.ndarray
  labels: np.ndarray

  def read_rows(self, info: DatasetInfo):
    del info  # the arrays hold all it needs
    images, labels = tf.constant(self.images), tf.constant(self.labels)
    return lambda rows: (tf.gather(images, rows), tf.gather(labels, rows))


@dataclasses.dataclass(frozen=True)
class ArrayRows(RowsSource):
  """One split in an array on disk, read by rows as batches need them.

  `images` is anything with `.shape`, `.dtype` and `read(rows)` returning
  those rows (sorted, increasing) as an array [len(rows), H, W, C]; labels
  (small) are in memory, int64 [N]. A kind of its own beside Examples,
  not one of them: engine/tools/to_tfrecords.py tells arrays in memory
  from arrays on disk by their kind.
  """
  images: Any
  labels: np.ndarray

  def read_rows(self, info: DatasetInfo):
    """A batch's images read from disk, its labels gathered in memory."""
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
