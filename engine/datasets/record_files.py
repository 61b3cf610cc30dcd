"""TFRecord files as sources: streamed file by file, each rank its own.

Files, not examples, are split across ranks (rank r reads files r, r + N,
...), so each rank opens only its own files, and records are shuffled as
they stream by. Each layout of records (engine/datasets/tfrecord.py) is a
source of its own: ImageNet's encoded images (`ImageRecords`), decoded
with a random crop for training, and declared features (`FeatureRecords`,
engine/datasets/record_features.py), such as CosmoFlow's volumes, decoded
as stored and augmented by the batch. Both give batches as stored;
`train_stream` and `eval_batches` normalize them (sources.py).
"""
import abc
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from engine.core.errors import UserError
from engine.datasets import record_features, sources
from engine.datasets.splits import (Augmentation, DatasetInfo, Epochs, Shard,
                                    Source)

# TFRecord streams: files read at once, and records shuffled through a
# buffer (serialized, before decoding: about 110 KB each for ImageNet).
PARALLEL_FILES = 4
RECORD_SHUFFLE_BUFFER = 4096
# Declared features' records may be large (a 128^3 x 4 int16 volume is
# 16 MB): their buffer holds at most this many bytes.
RECORD_SHUFFLE_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class RecordFiles(Source):
  """One split as TFRecord files, read file by file: what both layouts
  share, the files' split across ranks and the epochs' order of them. Each
  layout is a kind of its own, which says how its records are decoded,
  shuffled and augmented (`ImageRecords`, `FeatureRecords`)."""
  files: tuple[str, ...]
  compression: str = ""  # TensorFlow's compression_type: "", GZIP, ZLIB

  stageable = True  # each rank reads whole files of its own

  def rank_files(self, shard: Shard) -> tuple[str, ...]:
    """The files this rank reads: r, r + N, ..."""
    if len(self.files) < shard.world_size:
      raise UserError(
          f"{len(self.files)} TFRecord files cannot be split across "
          f"{shard.world_size} processes ({self.files[0]}, ...): write the "
          "data in at least as many files as processes")
    return self.files[shard.rank::shard.world_size]

  def train_batches(self, info: DatasetInfo, *, shard: Shard, epochs: Epochs,
                    augmentation: Augmentation, first_epoch: int,
                    first_step: int) -> tf.data.Dataset:
    """Each epoch reads this rank's files in an order permuted by (seed,
    epoch), several at a time (interleave), their records shuffled as the
    layout says. A rank whose files run out before `steps` batches starts
    another pass over them, in another order, so every rank runs `steps`
    steps."""
    rank_files = self.rank_files(shard)
    files = tf.constant(rank_files)
    records = self._reader(rank_files, training=True)

    def epoch_batches(key):
      def one_pass(index):
        # Shuffled within the pass, so a pass reads every record once.
        pass_key = tf.random.experimental.stateless_fold_in(key, index)
        order = tf.random.experimental.stateless_shuffle(files, pass_key)
        return self._shuffled(
            records(tf.data.Dataset.from_tensor_slices(order)), info,
            pass_key=pass_key, seed=epochs.seed)

      examples = self._training_examples(
          tf.data.Dataset.counter().flat_map(one_pass), info, key=key,
          augmentation=augmentation)
      return examples.batch(epochs.batch_size,
                            drop_remainder=True).take(epochs.steps)

    batches = sources.stream(
        epochs, epoch_batches, first_epoch=first_epoch, first_step=first_step,
        key_space=1)  # a stream: the skipped records are still read
    return self._augmented(batches, info, shard=shard,
                           augmentation=augmentation)

  def eval_batches(self, info: DatasetInfo, *, shard: Shard,
                   batch_size: int) -> tf.data.Dataset:
    """The records in the order they are stored, file after file, several
    files at once."""
    rank_files = self.rank_files(shard)
    records = self._reader(rank_files, training=False)(
        tf.data.Dataset.from_tensor_slices(list(rank_files)))
    return self._eval_examples(records, info).batch(batch_size)

  def _records(self, files: tf.data.Dataset) -> tf.data.Dataset:
    """(file, index, record) of the files' records, several files at once."""
    return _interleaved(files, lambda file: record_features.records(
        file, self.compression))

  def _reader(self, rank_files: tuple[str, ...], *, training: bool):
    """The function from a data set of files to their records: by default
    read from the files (`_records`)."""
    del rank_files, training
    return self._records

  @abc.abstractmethod
  def _shuffled(self, records: tf.data.Dataset, info: DatasetInfo, *,
                pass_key, seed: int) -> tf.data.Dataset:
    """A pass's records in a shuffled order."""

  @abc.abstractmethod
  def _training_examples(self, records: tf.data.Dataset, info: DatasetInfo,
                         *, key, augmentation: Augmentation
                         ) -> tf.data.Dataset:
    """An epoch's records decoded for training: (image, label) each."""

  @abc.abstractmethod
  def _augmented(self, batches: tf.data.Dataset, info: DatasetInfo, *,
                 shard: Shard, augmentation: Augmentation) -> tf.data.Dataset:
    """The stream's (epoch key, step, batch) as augmented batches."""

  @abc.abstractmethod
  def _eval_examples(self, records: tf.data.Dataset,
                     info: DatasetInfo) -> tf.data.Dataset:
    """The records decoded for evaluation: (image, label) each."""


@dataclasses.dataclass(frozen=True)
class ImageRecords(RecordFiles):
  """ImageNet's layout (TensorFlow's build_imagenet_data.py): each record
  an encoded image, `image/encoded` (JPEG or PNG bytes), and its class id,
  `image/class/label`. For training, a random crop of each, maybe
  flipped, decoded with its own draw; for evaluation the central one."""
  label_offset: int = 0  # subtracted from stored labels (1 for 1-based)

  _FEATURES = {
      "image/encoded": tf.io.FixedLenFeature([], tf.string),
      "image/class/label": tf.io.FixedLenFeature([], tf.int64),
  }

  def _shuffled(self, records: tf.data.Dataset, info: DatasetInfo, *,
                pass_key, seed: int) -> tf.data.Dataset:
    del info, pass_key  # a buffer of serialized records (small: a JPEG each)
    return records.shuffle(RECORD_SHUFFLE_BUFFER, seed=seed)

  def _training_examples(self, records: tf.data.Dataset, info: DatasetInfo,
                         *, key, augmentation: Augmentation
                         ) -> tf.data.Dataset:
    """Each record decoded with its own draw, keyed by its place in the
    epoch."""
    def example(index, read):
      _, _, record = read  # (file, index in the file, record)
      return self._cropped(
          record, info, flip=augmentation.flip,
          key=tf.random.experimental.stateless_fold_in(key, index))

    return records.enumerate().map(
        example, num_parallel_calls=sources.decode_parallelism())

  def _augmented(self, batches: tf.data.Dataset, info: DatasetInfo, *,
                 shard: Shard, augmentation: Augmentation) -> tf.data.Dataset:
    """Cropped and flipped as decoded: the batches as they are."""
    del info, shard, augmentation
    return batches.map(lambda key, step, batch: batch)

  def _eval_examples(self, records: tf.data.Dataset,
                     info: DatasetInfo) -> tf.data.Dataset:
    """The central 87.5% of each image, resized (the usual ImageNet
    eval)."""
    def example(file, index, record):
      del file, index
      image, label = self._parsed(record)
      return tf.image.resize(tf.image.central_crop(image, 0.875),
                             info.image_shape[:2]), label

    return records.map(example,
                       num_parallel_calls=sources.decode_parallelism())

  def _cropped(self, record, info: DatasetInfo, *, flip: bool, key):
    """A random crop of 8-100% of the area, resized, maybe flipped
    (Inception)."""
    image, label = self._parsed(record)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=key,
        min_object_covered=0.1, aspect_ratio_range=(0.75, 1.33),
        area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    image = tf.image.resize(tf.slice(image, begin, size),
                            info.image_shape[:2])
    if flip:
      image = tf.image.stateless_random_flip_left_right(
          image, tf.random.experimental.stateless_fold_in(key, 1))
    return image, label

  def _parsed(self, record):
    features = tf.io.parse_single_example(record, self._FEATURES)
    image = tf.io.decode_image(features["image/encoded"], channels=3,
                               expand_animations=False)
    return image, features["image/class/label"] - self.label_offset


@dataclasses.dataclass(frozen=True)
class FeatureRecords(RecordFiles):
  """Records of declared features (engine/datasets/record_features.py),
  such as CosmoFlow's volumes: decoded as stored, and their batches
  augmented as those read by index are.

  With `cache` (--cache_records), this rank's training records are decoded
  once, at the start of training, and held in memory; with
  `cache_evaluation`, the test split's, at its first evaluation, so an
  evaluation after the first reads no file. A rank holds each shard it
  evaluates: its own, and on rank 0 the whole split where a task draws
  pictures of its first examples.
  """
  features: Any = None  # a record_features.FeatureSpec
  cache: bool = False
  cache_evaluation: bool = False
  # The test split's records held, by the files of the shard that asked.
  _held: dict = dataclasses.field(default_factory=dict, init=False,
                                  repr=False, compare=False)

  def _reader(self, rank_files: tuple[str, ...], *, training: bool):
    if training and self.cache:
      return _Decoded(rank_files, self.features, self.compression).records
    if not training and self.cache_evaluation:
      if rank_files not in self._held:
        self._held[rank_files] = _Decoded(rank_files, self.features,
                                          self.compression)
      return self._held[rank_files].records
    return self._records

  def _shuffled(self, records: tf.data.Dataset, info: DatasetInfo, *,
                pass_key, seed: int) -> tf.data.Dataset:
    """Shuffled within windows of at most RECORD_SHUFFLE_BYTES, whatever
    the records' size, each window by its own stateless draw, so every
    pass of every epoch differs. One-sample files (CosmoFlow's) are
    shuffled by their order alone, and no window holds their records:
    memory does not grow with the data."""
    del seed  # every draw is the pass's
    window = min(RECORD_SHUFFLE_BUFFER, RECORD_SHUFFLE_BYTES // max(
        1, self.features.input.size()
        * tf.as_dtype(self.features.input.dtype).size))
    if info.num_train / len(self.files) <= 1 or window <= 1:
      return records
    return _shuffled_in_windows(records, window, pass_key)

  def _training_examples(self, records: tf.data.Dataset, info: DatasetInfo,
                         *, key, augmentation: Augmentation
                         ) -> tf.data.Dataset:
    del info, key, augmentation  # the batches are augmented
    return self._examples(records, held=self.cache)

  def _augmented(self, batches: tf.data.Dataset, info: DatasetInfo, *,
                 shard: Shard, augmentation: Augmentation) -> tf.data.Dataset:
    augmented = sources.batch_augmentation(info, shard, augmentation)
    return batches.map(lambda key, step, batch: augmented(key, step, *batch),
                       num_parallel_calls=sources.PARALLEL_BATCHES)

  def _eval_examples(self, records: tf.data.Dataset,
                     info: DatasetInfo) -> tf.data.Dataset:
    del info
    return self._examples(records, held=self.cache_evaluation)

  def _examples(self, records: tf.data.Dataset, *,
                held: bool) -> tf.data.Dataset:
    """(input, label) of records held decoded (`_Decoded`'s), or of
    serialized ones, decoded here."""
    if held:
      return records.map(lambda file, index, inputs, label: (inputs, label))
    return records.map(self.features.decode,
                       num_parallel_calls=sources.decode_parallelism())


def _interleaved(files: tf.data.Dataset, records) -> tf.data.Dataset:
  """`records(file)` of each file, several files at once, in an order that
  depends on the files' alone."""
  return files.interleave(records, cycle_length=PARALLEL_FILES,
                          num_parallel_calls=PARALLEL_FILES,
                          deterministic=True)


class _Decoded:
  """One rank's records of declared features, decoded (and checked) once
  and held in memory as stored: `records` gives (file, index, input,
  label) in the order the files' own records would come in, so a run
  reads the very batches it would have streamed, without decompressing
  and parsing each epoch."""

  def __init__(self, files, spec, compression: str):
    decoded = tf.data.Dataset.from_tensor_slices(list(files)).flat_map(
        lambda file: record_features.records(file, compression)).map(
            lambda file, index, record: (file, *spec.decode(file, index,
                                                            record)),
            num_parallel_calls=sources.decode_parallelism(),
            deterministic=True)
    inputs, labels, counts = [], [], dict.fromkeys(files, 0)
    for file, values, label in decoded.as_numpy_iterator():
      inputs.append(values)
      labels.append(label)
      counts[file.decode()] += 1
    counts = [counts[file] for file in files]
    starts = np.cumsum([0] + counts[:-1])
    self._files = tf.constant(files)
    self._starts = tf.constant(starts, tf.int64)
    self._counts = tf.constant(counts, tf.int64)
    self._one_a_file = all(count == 1 for count in counts)
    # Variables, not constants: the data sets that read them hold a handle
    # instead of a copy in their graphs.
    self._inputs = tf.Variable(np.stack(inputs), trainable=False)
    self._labels = tf.Variable(np.stack(labels), trainable=False)

  def records(self, files: tf.data.Dataset) -> tf.data.Dataset:
    def at(file):  # the file's place among this rank's
      return tf.argmax(tf.cast(tf.equal(self._files, file), tf.int32))

    def held(file, index):
      row = self._starts[at(file)] + index
      return (file, index, self._inputs.sparse_read(row),
              self._labels.sparse_read(row))

    if self._one_a_file:
      # Interleaved, one-record files give their records in the files'
      # own order: read them so, without a data set for each file, which
      # costs the step's core more (bench/RESULTS.md, "Where the rest of
      # the step went").
      return files.map(lambda file: held(file, tf.constant(0, tf.int64)))

    def of_file(file):
      return tf.data.Dataset.range(self._counts[at(file)]).map(
          lambda index: held(file, index))

    return _interleaved(files, of_file)


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
