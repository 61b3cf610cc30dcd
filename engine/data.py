"""Input pipeline: shard, shuffle, batch, augment, normalize, prefetch.

The same for every data set (see `engine/datasets`), with four kinds of
source: examples held in memory (`Examples`), arrays on disk read by rows
(`ArrayRows`), image files decoded as read (`ImageFiles`), and TFRecord
files streamed from disk (`RecordFiles`: ImageNet's encoded images, or
the arrays of declared features, such as CosmoFlow's volumes). Examples
are images [H, W, C] or volumes [D, H, W, C], augmented as each kind
allows (engine/augmentation.py). Three properties matter more than speed
here:

* Every rank runs the same number of steps each epoch. Horovod's allreduce
  waits for all ranks, so one rank with an extra batch would hang the job.
  `steps_per_epoch` is fixed from the global batch, and a rank whose shard
  is too short for it starts another pass over its shard.
* Ranks see disjoint data. Rank r keeps examples r, r + N, r + 2N, ...,
  the selection `tf.data.Dataset.shard(N, r)` makes, and shuffles only
  those (for arrays on disk and image files, it reads only those); from
  TFRecord files, rank r reads files r, r + N, ...
* An epoch's batches depend only on (seed, epoch, rank, size): shuffles are
  stateless permutations keyed by (seed, epoch), and augmentation uses
  stateless random ops keyed by epoch, step and rank. A run is reproducible,
  every epoch differs from the last, no two ranks augment alike, and a run
  can start at any epoch.

Training reads one stream for the whole run, epoch after epoch, through one
iterator: prefetching carries on across epoch ends, and no iterator is torn
down between epochs. Except for TFRecords, batches are gathered by index (a
vectorized copy per batch in memory, a read of the batch's rows on disk, or
a parallel decode of the batch's files) rather than through a shuffle
buffer filled one example at a time, so a resumed run skips to its step
without reading what it skips.
"""
import math
import os

import numpy as np
import tensorflow as tf

from engine.augmentation import augment, augment_volumes
from engine.datasets import (ArrayRows, DatasetInfo, Examples, ImageFiles,
                             RecordFiles, Source, image_folder,
                             record_features)
from engine.errors import UserError

# Fixed parallelism rather than tf.data's autotuning: our per-batch work (a
# gather, a flip, a shift) runs at about 45k images/s on one thread, so one
# batch in flight and two ready keep the step fed. Autotuning bought nothing
# and cost a lot: its background optimizer competes with training for the
# cores, and an iterator's teardown waits for it (measured: 1.5-6 s at each
# epoch end and at exit on 2 processes sharing 2 cores).
PARALLEL_BATCHES = 2
PREFETCH_BATCHES = 2
# TFRecord streams: files read at once, and records shuffled through a
# buffer (serialized, before decoding: about 110 KB each for ImageNet).
PARALLEL_FILES = 4
RECORD_SHUFFLE_BUFFER = 4096
# Declared features' records may be large (a 128^3 x 4 int16 volume is
# 16 MB): their buffer holds at most this many bytes.
RECORD_SHUFFLE_BYTES = 64 << 20


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


def train_batches(source: Source, info: DatasetInfo, *,
                  rank: int, world_size: int, batch_size: int, steps: int,
                  seed: int, first_epoch: int, flip: bool, shift: float,
                  transpose: bool = False, resizing: tuple = (),
                  first_step: int = 0) -> tf.data.Dataset:
  """This rank's training batches from `first_epoch` on, `steps` per epoch.

  Normalized float32 images (or volumes) and their labels (int64 class
  ids, float targets, or masks flipped and shifted with their images), one
  stream for the whole run. Images are flipped left and right and shifted;
  volumes flipped along each spatial axis and, with `transpose`, their axes
  put in a random order (`augment_volumes`).
  With `resizing`, ((side, last epoch), ...), the images of the first
  epochs are made smaller (`_resized`).
  A run resumed mid-epoch starts at `first_step` of `first_epoch`, with the
  very batches an uninterrupted run would have had there.
  """
  augmented = _augmentation(info, rank=rank, world_size=world_size,
                            flip=flip, shift=shift, transpose=transpose)
  if isinstance(source, RecordFiles) and source.features:
    batches = _declared_train_batches(
        source, rank=rank, world_size=world_size, batch_size=batch_size,
        steps=steps, seed=seed, first_epoch=first_epoch,
        first_step=first_step,
        records_per_file=info.num_train / len(source.files)).map(
            augmented, num_parallel_calls=PARALLEL_BATCHES)
  elif isinstance(source, RecordFiles):
    batches = _record_train_batches(
        source, info, rank=rank, world_size=world_size, batch_size=batch_size,
        steps=steps, seed=seed, first_epoch=first_epoch, first_step=first_step,
        flip=flip)
  else:
    batches = _indexed_train_batches(
        source, info, rank=rank, world_size=world_size, batch_size=batch_size,
        steps=steps, seed=seed, first_epoch=first_epoch,
        first_step=first_step, augmented=augmented)
  if resizing:
    batches = _resized(batches, resizing, steps=steps,
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


def eval_batches(source: Source, info: DatasetInfo, *,
                 rank: int, world_size: int,
                 batch_size: int) -> tf.data.Dataset:
  """This rank's share of the whole split, each example exactly once.

  No padding and no repetition: the last batch may be short, and ranks may
  hold more examples than others. Figures are reduced as sums and counts, so
  the result is exactly the whole split's.
  """
  if isinstance(source, RecordFiles) and source.features:
    files = tf.data.Dataset.from_tensor_slices(
        list(rank_files(source, rank, world_size)))
    batches = _declared_records(files, source).map(
        source.features.decode,
        num_parallel_calls=_decode_parallelism()).batch(batch_size)
  elif isinstance(source, RecordFiles):
    files = rank_files(source, rank, world_size)
    examples = _records(tf.data.Dataset.from_tensor_slices(list(files))).map(
        lambda record: _decode_eval(record, info, source.label_offset),
        num_parallel_calls=_decode_parallelism())
    batches = examples.batch(batch_size)
  elif isinstance(source, ImageFiles):
    batches = tf.data.Dataset.from_tensor_slices(
        (list(source.paths), source.labels)).shard(world_size, rank).map(
            lambda path, label: (image_folder.decode(path, info.image_shape),
                                 _decoded_label(label, info)),
            num_parallel_calls=_decode_parallelism()).batch(batch_size)
  elif isinstance(source, ArrayRows):
    read = _row_reader(source, info)
    batches = tf.data.Dataset.range(rank, len(source.labels), world_size
                                    ).batch(batch_size).map(read)
  else:
    batches = tf.data.Dataset.from_tensor_slices(
        (source.images, source.labels)).shard(world_size, rank).batch(
            batch_size)
  batches = batches.map(
      lambda images, labels: (info.normalized(images), labels),
      num_parallel_calls=PARALLEL_BATCHES)
  return _without_autotune(batches.prefetch(PREFETCH_BATCHES))


def _indexed_train_batches(source: Examples | ArrayRows | ImageFiles,
                           info: DatasetInfo, *, rank: int, world_size: int,
                           batch_size: int, steps: int, seed: int,
                           first_epoch: int, first_step: int,
                           augmented) -> tf.data.Dataset:
  """Batches of examples chosen by index: each epoch a stateless shuffle of
  this rank's indices, cut into `steps` batches; then each batch's
  examples are read (`_row_reader`, or decoded file by file) and
  `augmented` (which normalizes them too)."""
  shard = tf.range(rank, len(source.labels), world_size, dtype=tf.int64)
  per_epoch = steps * batch_size
  passes = math.ceil(per_epoch / len(shard))
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

  indices = (tf.data.Dataset.counter(first_epoch)
             .flat_map(epoch_indices)
             .skip(first_step))  # indices only: skipping costs nothing
  if isinstance(source, ImageFiles):
    return _decoded_batches(indices, source, info, batch_size).map(
        augmented, num_parallel_calls=PARALLEL_BATCHES)
  read = _row_reader(source, info)
  return indices.map(
      lambda key, step, rows: augmented(key, step, *read(rows)),
      num_parallel_calls=PARALLEL_BATCHES)


def _augmentation(info: DatasetInfo, *, rank: int, world_size: int,
                  flip: bool, shift: float, transpose: bool):
  """The function from an epoch's key, a step and its batch to the batch
  augmented and normalized: the draws keyed by (epoch, step, rank)."""
  volumes = len(info.image_shape) == 4
  if transpose and not (volumes and len(set(info.image_shape[:3])) == 1):
    raise UserError(
        "--random_transpose puts a volume's three axes in a random order: "
        "for cubic volumes (DxDxDxC); these examples are "
        f"{'x'.join(map(str, info.image_shape))}")

  def augmented(epoch_key, step, images, labels):
    key = tf.random.experimental.stateless_fold_in(
        epoch_key, step * world_size + rank)
    if volumes:
      return info.normalized(augment_volumes(
          images, key, flip=flip, transpose=transpose)), labels
    batch = augment(images, key, flip=flip, shift=shift,
                    fill=info.shift_fill)
    if info.labels_are_masks():  # moved as its image is: the same key
      labels = augment(labels[..., None], key, flip=flip, shift=shift,
                       fill=info.shift_fill)[..., 0]
    return info.normalized(batch), labels

  return augmented


def _row_reader(source: Examples | ArrayRows, info: DatasetInfo):
  """A function from a batch's indices to its (images, labels)."""
  labels = tf.constant(source.labels)
  if isinstance(source, Examples):
    images = tf.constant(source.images)
    return lambda rows: (tf.gather(images, rows), tf.gather(labels, rows))
  dtype = tf.as_dtype(source.images.dtype)

  def read(rows: np.ndarray) -> np.ndarray:
    # Readers take increasing rows; a batch may hold one twice (a shard
    # shorter than an epoch is read in several passes).
    unique, inverse = np.unique(rows, return_inverse=True)
    return source.images.read(unique)[inverse]

  def reader(rows):
    images = tf.numpy_function(read, [rows], dtype, stateful=False)
    images.set_shape([None, *info.image_shape])
    return images, tf.gather(labels, rows)

  return reader


def _decoded_batches(indices: tf.data.Dataset, source: ImageFiles,
                     info: DatasetInfo, batch_size: int) -> tf.data.Dataset:
  """Each batch's files decoded in parallel, one example per call, and
  batched again with their batch's (key, step)."""
  paths = tf.constant(list(source.paths))
  labels = tf.constant(source.labels)

  def per_example(key, step, rows):
    count = tf.shape(rows)[0]
    return (tf.tile(key[None], [count, 1]), tf.fill([count], step), rows)

  def decoded(key, step, row):
    return (key, step, image_folder.decode(tf.gather(paths, row),
                                           info.image_shape),
            _decoded_label(tf.gather(labels, row), info))

  return (indices.map(per_example).unbatch()
          .map(decoded, num_parallel_calls=_decode_parallelism())
          .batch(batch_size, drop_remainder=True)
          .map(lambda keys, steps, images, labels:
               (keys[0], steps[0], images, labels)))


def _decoded_label(label: tf.Tensor, info: DatasetInfo) -> tf.Tensor:
  """An image file's label: its class id, or its mask's file decoded."""
  if info.labels_are_masks():
    return image_folder.decode_mask(label, info.image_shape[:2])
  return label


def _record_train_batches(source: RecordFiles, info: DatasetInfo, *,
                          rank: int, world_size: int, batch_size: int,
                          steps: int, seed: int, first_epoch: int,
                          first_step: int, flip: bool) -> tf.data.Dataset:
  """Training batches streamed from this rank's TFRecord files.

  Files, not examples, are split across ranks (rank r reads files r, r + N,
  ...), so each rank opens only its own files. Each epoch reads them in an
  order permuted by (seed, epoch), several at a time (interleave), through a
  shuffle buffer of records. A rank whose files run out before `steps`
  batches starts another pass over them, so every rank runs `steps` steps.
  """
  files = tf.constant(rank_files(source, rank, world_size))
  root_key = tf.constant([seed, 1], tf.int64)

  def epoch_batches(epoch):
    key = tf.random.experimental.stateless_fold_in(root_key, epoch)

    def one_pass(index):
      # Shuffled within the pass, so a pass reads every record once.
      order = tf.random.experimental.stateless_shuffle(
          files, tf.random.experimental.stateless_fold_in(key, index))
      return (_records(tf.data.Dataset.from_tensor_slices(order))
              .shuffle(RECORD_SHUFFLE_BUFFER, seed=seed))

    records = tf.data.Dataset.counter().flat_map(one_pass).enumerate()
    examples = records.map(
        lambda index, record: _decode_train(
            record, info, source.label_offset, flip=flip,
            key=tf.random.experimental.stateless_fold_in(key, index)),
        num_parallel_calls=_decode_parallelism())
    return examples.batch(batch_size, drop_remainder=True).take(steps)

  return (tf.data.Dataset.counter(first_epoch).flat_map(epoch_batches)
          .skip(first_step)  # a stream: the skipped records are still read
          .map(lambda images, labels: (info.normalized(images), labels),
               num_parallel_calls=PARALLEL_BATCHES))


def _declared_train_batches(source: RecordFiles, *, rank: int,
                            world_size: int, batch_size: int, steps: int,
                            seed: int, first_epoch: int, first_step: int,
                            records_per_file: float) -> tf.data.Dataset:
  """(epoch key, step, inputs, labels) of each training batch streamed
  from this rank's files of declared features, as stored.

  As `_record_train_batches`, each epoch reads this rank's files in an
  order permuted by (seed, epoch), several at a time, and a rank whose
  files run out starts another pass. Records are then shuffled within
  windows of at most RECORD_SHUFFLE_BYTES, whatever their size, each
  window by its own stateless draw, so every pass of every epoch differs.
  One-sample files (CosmoFlow's) are shuffled by their order alone, and no
  window holds their records: memory does not grow with the data.
  """
  files = tf.constant(rank_files(source, rank, world_size))
  root_key = tf.constant([seed, 1], tf.int64)
  window = min(RECORD_SHUFFLE_BUFFER, RECORD_SHUFFLE_BYTES // max(
      1, source.features.input.size() * tf.as_dtype(
          source.features.input.dtype).size))

  def epoch_batches(epoch):
    key = tf.random.experimental.stateless_fold_in(root_key, epoch)

    def one_pass(index):
      pass_key = tf.random.experimental.stateless_fold_in(key, index)
      order = tf.random.experimental.stateless_shuffle(files, pass_key)
      records = _declared_records(tf.data.Dataset.from_tensor_slices(order),
                                  source)
      if records_per_file <= 1 or window <= 1:
        return records
      return _shuffled_in_windows(records, window, pass_key)

    examples = tf.data.Dataset.counter().flat_map(one_pass).map(
        source.features.decode, num_parallel_calls=_decode_parallelism())
    return (examples.batch(batch_size, drop_remainder=True).take(steps)
            .enumerate().map(lambda step, batch: (key, step, *batch)))

  return (tf.data.Dataset.counter(first_epoch).flat_map(epoch_batches)
          .skip(first_step))  # a stream: the skipped records are still read


def _shuffled_in_windows(records: tf.data.Dataset, size: int,
                         key: tf.Tensor) -> tf.data.Dataset:
  """The records, `size` at a time, each window in an order drawn from
  (key, window)."""
  def permuted(index, window):
    order = tf.random.experimental.stateless_shuffle(
        tf.range(tf.shape(window[0])[0]),
        tf.random.experimental.stateless_fold_in(key, index))
    return tf.data.Dataset.from_tensor_slices(
        tuple(tf.gather(part, order) for part in window))

  return records.batch(size).enumerate().flat_map(permuted)


def _declared_records(files: tf.data.Dataset,
                      source: RecordFiles) -> tf.data.Dataset:
  """(file, index, record) of the files' records, several files at once."""
  return files.interleave(
      lambda file: record_features.records(file, source.compression),
      cycle_length=PARALLEL_FILES, num_parallel_calls=PARALLEL_FILES,
      deterministic=True)


def rank_files(source: RecordFiles, rank: int,
                world_size: int) -> tuple[str, ...]:
  if len(source.files) < world_size:
    raise UserError(
        f"{len(source.files)} TFRecord files cannot be split across "
        f"{world_size} processes ({source.files[0]}, ...): write the data in "
        "at least as many files as processes")
  return source.files[rank::world_size]


def _records(files: tf.data.Dataset) -> tf.data.Dataset:
  return files.interleave(tf.data.TFRecordDataset,
                          cycle_length=PARALLEL_FILES,
                          num_parallel_calls=PARALLEL_FILES,
                          deterministic=True)


_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def _parse(record, label_offset: int):
  features = tf.io.parse_single_example(record, _FEATURES)
  image = tf.io.decode_image(features["image/encoded"], channels=3,
                             expand_animations=False)
  return image, features["image/class/label"] - label_offset


def _decode_train(record, info: DatasetInfo, label_offset: int, *,
                  flip: bool, key):
  """A random crop of 8-100% of the area, resized, maybe flipped (Inception)."""
  image, label = _parse(record, label_offset)
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
      seed=key, min_object_covered=0.1, aspect_ratio_range=(0.75, 1.33),
      area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  image = tf.image.resize(tf.slice(image, begin, size), info.image_shape[:2])
  if flip:
    image = tf.image.stateless_random_flip_left_right(
        image, tf.random.experimental.stateless_fold_in(key, 1))
  return image, label


def _decode_eval(record, info: DatasetInfo, label_offset: int):
  """The central 87.5% of the image, resized (the usual ImageNet eval)."""
  image, label = _parse(record, label_offset)
  image = tf.image.resize(tf.image.central_crop(image, 0.875),
                          info.image_shape[:2])
  return image, label


def _decode_parallelism() -> int:
  """Decoding runs on the cores this process may use (after binding)."""
  return len(os.sched_getaffinity(0))
