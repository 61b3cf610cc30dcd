"""Input pipeline: shard, shuffle, batch, augment, normalize, prefetch.

The same for every in-memory data set (see `engine/datasets`). Three
properties matter more than speed here:

* Every rank runs the same number of steps each epoch. Horovod's allreduce
  waits for all ranks, so one rank with an extra batch would hang the job.
  `steps_per_epoch` is fixed from the global batch, and a rank whose shard
  is too short for it (only with --steps_per_epoch above one pass over the
  data) starts another pass over its shard.
* Ranks see disjoint examples: rank r keeps examples r, r + N, r + 2N, ...,
  the selection `tf.data.Dataset.shard(N, r)` makes, and shuffles only those.
* An epoch's batches depend only on (seed, epoch, rank, size): the shuffle is
  a stateless permutation keyed by (seed, epoch), and augmentation uses
  stateless random ops keyed by epoch, step and rank. A run is reproducible,
  every epoch differs from the last, no two ranks augment alike, and a run
  can start at any epoch.

Training reads one stream for the whole run, epoch after epoch, through one
iterator: prefetching carries on across epoch ends, and no iterator is torn
down between epochs. Batches are gathered by index
from the in-memory arrays, a vectorized copy per batch rather than a shuffle
buffer filled one example at a time.
"""
import math

import tensorflow as tf

from engine.datasets import DatasetInfo, Examples
from engine.errors import UserError

# Fixed parallelism rather than tf.data's autotuning: our per-batch work (a
# gather, a flip, a shift) runs at about 45k images/s on one thread, so one
# batch in flight and two ready keep the step fed. Autotuning bought nothing
# and cost a lot: its background optimizer competes with training for the
# cores, and an iterator's teardown waits for it (measured: 1.5-6 s at each
# epoch end and at exit on 2 processes sharing 2 cores).
PARALLEL_BATCHES = 2
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


def train_batches(examples: Examples, info: DatasetInfo, *, rank: int,
                  world_size: int, batch_size: int, steps: int, seed: int,
                  first_epoch: int, flip: bool,
                  shift: float) -> tf.data.Dataset:
  """This rank's training batches from `first_epoch` on, `steps` per epoch."""
  shard = tf.range(rank, len(examples.labels), world_size, dtype=tf.int64)
  per_epoch = steps * batch_size
  passes = math.ceil(per_epoch / len(shard))
  images = tf.constant(examples.images)
  labels = tf.constant(examples.labels)
  root_key = tf.constant([seed, 0], tf.int64)

  def epoch_indices(epoch):
    key = tf.random.experimental.stateless_fold_in(root_key, epoch)
    order = tf.concat([
        tf.random.experimental.stateless_shuffle(
            shard, tf.random.experimental.stateless_fold_in(key, p))
        for p in range(passes)], axis=0)
    batches = tf.reshape(order[:per_epoch], [steps, batch_size])
    return tf.data.Dataset.from_tensor_slices(batches).enumerate().map(
        lambda step, indices: (key, step, indices))

  def load(epoch_key, step, indices):
    key = tf.random.experimental.stateless_fold_in(
        epoch_key, step * world_size + rank)
    batch = augment(tf.gather(images, indices), key, flip=flip, shift=shift)
    return normalize(batch, info), tf.gather(labels, indices)

  return _without_autotune(tf.data.Dataset.counter(first_epoch)
                           .flat_map(epoch_indices)
                           .map(load, num_parallel_calls=PARALLEL_BATCHES)
                           .prefetch(PREFETCH_BATCHES))


def eval_batches(examples: Examples, info: DatasetInfo, *, rank: int,
                 world_size: int, batch_size: int) -> tf.data.Dataset:
  """This rank's share of the whole split, each example exactly once.

  No padding and no repetition: the last batch may be short, and ranks may
  hold one example more than others. Figures are reduced as sums and counts,
  so the result is exactly the whole split's.
  """
  return _without_autotune(
      tf.data.Dataset.from_tensor_slices((examples.images, examples.labels))
      .shard(world_size, rank)
      .batch(batch_size)
      .map(lambda images, labels: (normalize(images, info), labels),
           num_parallel_calls=PARALLEL_BATCHES)
      .prefetch(PREFETCH_BATCHES))


def augment(images: tf.Tensor, key: tf.Tensor, *, flip: bool,
            shift: float) -> tf.Tensor:
  """Random horizontal flips and shifts of a uint8 batch, as the Horovod lab.

  The lab's ImageDataGenerator shifted by up to `shift` of the width and
  height and filled the border with the nearest pixel; we shift by whole
  pixels, the same transform without interpolation blur. One image transform
  op for the whole batch is far cheaper than a per-example map.
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
        interpolation="NEAREST", fill_mode="NEAREST")
  return images


def normalize(images: tf.Tensor, info: DatasetInfo) -> tf.Tensor:
  """Featurewise standardization with the training set's channel statistics."""
  mean = tf.constant(info.mean, tf.float32)
  std = tf.constant(info.std, tf.float32)
  return (tf.cast(images, tf.float32) - mean) / std
