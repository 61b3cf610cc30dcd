"""Sharded TFRecord files: data sets too large for memory.

Files named train-* (or the files of a train/ directory) hold the training
split, validation-* or test-* (or validation/, test/) the evaluation split.
Nothing is read into memory here; the input pipeline splits the files
across ranks and streams them. Two layouts:

* ImageNet's (as TensorFlow's build_imagenet_data.py writes them): each
  record has `image/encoded` (JPEG or PNG bytes) and `image/class/label`
  (int64).
* Declared features (--tfrecord_features, or features.txt beside the
  files; engine/datasets/record_features.py): arrays of any shape, such
  as CosmoFlow's int16 volumes and float targets, GZIP or ZLIB-compressed.

A `classes.txt` beside them (one name per line, in label order, as
engine.tools.to_tfrecords writes) gives the classes' names and number, in
place of --num_classes, or the names of a regression's targets.
"""
import dataclasses
import glob
import os

import tensorflow as tf

from engine.core.errors import UserError
from engine.core.run_files import CLASSES_FILE
from engine.datasets import record_features
from engine.datasets.record_files import FeatureRecords, ImageRecords
from engine.datasets.splits import DatasetInfo, Splits

# ImageNet's per-channel statistics (0-255 scale), the usual choice for
# natural images when computing the data set's own would mean a full pass.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
TRAIN_PREFIXES = ("train",)
TEST_PREFIXES = ("validation", "test")


def load(*, data_dir: str, image_size: int, num_classes: int,
         label_offset: int, train_examples: int, test_examples: int,
         tfrecord_features: str = "", tfrecord_compression: str = "auto",
         log_transform: bool = False, cache_records: bool = False,
         normalization=None) -> Splits:
  """Example counts of 0 are counted by reading the files once (records
  of declared features are checked against the spec then).
  `normalization` is (mean, std) to use rather than ImageNet's, or than
  those measured on a sample of declared features' inputs.
  `cache_records`: each rank's training and test records of declared
  features decoded once and held in memory
  (engine/datasets/record_files.py)."""
  if not data_dir:
    raise UserError("--dataset=tfrecord needs --data_dir=DIR holding train-* "
                    "and validation-* TFRecord files")
  if not os.path.isdir(data_dir):
    raise UserError(f"--data_dir={data_dir}: no such directory")
  train = _files(data_dir, TRAIN_PREFIXES)
  test = _files(data_dir, TEST_PREFIXES)
  class_names = _class_names(data_dir)
  spec = record_features.spec_of(data_dir, tfrecord_features)
  if spec:
    return _declared(spec, train, test, class_names=class_names,
                     num_classes=num_classes, train_examples=train_examples,
                     test_examples=test_examples,
                     compression=record_features.compression_of(
                         train, tfrecord_compression),
                     transform="log1p" if log_transform else "",
                     normalization=normalization, cache=cache_records)
  if cache_records:
    raise UserError("--cache_records: for TFRecords of declared features "
                    "(--tfrecord_features, features.txt), not ImageNet's "
                    "layout of encoded images")
  if log_transform:
    raise UserError("--log_transform: for TFRecords of declared features "
                    "(--tfrecord_features, features.txt), not ImageNet's "
                    "layout of encoded images")
  mean, std = normalization or (IMAGENET_MEAN, IMAGENET_STD)
  info = DatasetInfo(
      name="tfrecord", image_shape=(image_size, image_size, 3),
      num_classes=len(class_names) or num_classes,
      num_train=train_examples or _count(train),
      num_test=test_examples or _count(test), mean=mean, std=std,
      class_names=class_names)
  return Splits(train=ImageRecords(train, label_offset=label_offset),
                test=ImageRecords(test, label_offset=label_offset),
                info=info)


def _declared(spec: record_features.FeatureSpec, train, test, *,
              class_names, num_classes: int, train_examples: int,
              test_examples: int, compression: str, transform: str,
              normalization, cache: bool) -> Splits:
  """The splits of records of declared features; the inputs' statistics
  (and float targets') measured on a sample of the training records."""
  label = spec.label
  targets = not label.raw and label.dtype == "float32"
  info = DatasetInfo(
      name="tfrecord", image_shape=spec.input.shape,
      num_classes=0 if targets else len(class_names) or num_classes,
      num_train=train_examples or record_features.check_and_count(
          train, spec, compression),
      num_test=test_examples or record_features.check_and_count(
          test, spec, compression),
      mean=(), std=(), class_names=class_names, image_dtype=spec.input.dtype,
      label_shape=label.shape, label_dtype=label.dtype, transform=transform)
  if normalization and not targets:
    statistics = dict(zip(("mean", "std"), normalization))
  else:
    statistics = record_features.sample_statistics(train, spec, compression,
                                            info.transformed)
  return Splits(
      train=FeatureRecords(train, compression, features=spec, cache=cache),
      test=FeatureRecords(test, compression, features=spec,
                          cache_evaluation=cache),
      info=dataclasses.replace(info, **statistics))


def _files(data_dir: str, prefixes) -> tuple[str, ...]:
  """The split's files: PREFIX-* in data_dir, or those in PREFIX/."""
  for prefix in prefixes:
    files = sorted(glob.glob(os.path.join(data_dir, prefix + "-*")))
    for path in files:
      if os.path.isdir(path):
        raise UserError(f"{path}: a directory among the {prefix}-* TFRecord "
                        "files; move it out of --data_dir")
    folder = os.path.join(data_dir, prefix)
    if not files and os.path.isdir(folder):
      files = sorted(path for path in glob.glob(os.path.join(folder, "*"))
                     if os.path.isfile(path))
    if files:
      return tuple(files)
  names = " or ".join(p + "-*" for p in prefixes)
  folders = " or ".join(p + "/" for p in prefixes)
  raise UserError(f"--data_dir={data_dir}: no {names} TFRecord files (nor "
                  f"files in {folders})")


def _class_names(data_dir: str) -> tuple[str, ...]:
  path = os.path.join(data_dir, CLASSES_FILE)
  if not os.path.exists(path):
    return ()
  try:
    with open(path) as f:
      return tuple(line.rstrip("\n") for line in f if line.strip())
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"{path}: unreadable ({e}); it gives the classes' names, "
                    "one a line in label order (UTF-8 text)") from None


def _count(files) -> int:
  count = 0
  for path in files:
    try:
      count += sum(1 for _ in tf.data.TFRecordDataset(path))
    except tf.errors.DataLossError:
      raise UserError(f"{path}: truncated or corrupt TFRecord file") from None
  return count
