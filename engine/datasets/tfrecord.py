"""Sharded TFRecord files of encoded images: data sets too large for memory.

The layout of ImageNet's TFRecords (as TensorFlow's build_imagenet_data.py
writes them): files named train-* hold the training split, validation-* (or
test-*) the evaluation split; each record has `image/encoded` (JPEG or PNG
bytes) and `image/class/label` (int64). Nothing is read into memory here; the
input pipeline splits the files across ranks and streams them. A
`classes.txt` beside them (one name per line, in label order, as
engine.tools.to_tfrecords writes) gives the classes' names and number,
in place of --num_classes.
"""
import glob
import os

import tensorflow as tf

from engine.datasets.splits import (CLASSES_FILE, DatasetInfo, RecordFiles,
                                    Splits)
from engine.errors import UserError

# ImageNet's per-channel statistics (0-255 scale), the usual choice for
# natural images when computing the data set's own would mean a full pass.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
TRAIN_PREFIXES = ("train",)
TEST_PREFIXES = ("validation", "test")


def load(*, data_dir: str, image_size: int, num_classes: int,
         label_offset: int, train_examples: int, test_examples: int,
         normalization=None) -> Splits:
  """Example counts of 0 are counted by reading the files once.
  `normalization` is (mean, std) to use rather than ImageNet's."""
  if not data_dir:
    raise UserError("--dataset=tfrecord needs --data_dir=DIR holding train-* "
                    "and validation-* TFRecord files")
  if not os.path.isdir(data_dir):
    raise UserError(f"--data_dir={data_dir}: no such directory")
  train = _files(data_dir, TRAIN_PREFIXES)
  test = _files(data_dir, TEST_PREFIXES)
  class_names = _class_names(data_dir)
  mean, std = normalization or (IMAGENET_MEAN, IMAGENET_STD)
  info = DatasetInfo(
      name="tfrecord", image_shape=(image_size, image_size, 3),
      num_classes=len(class_names) or num_classes,
      num_train=train_examples or _count(train),
      num_test=test_examples or _count(test), mean=mean, std=std,
      class_names=class_names)
  return Splits(train=RecordFiles(train, label_offset),
                test=RecordFiles(test, label_offset),
                info=info)


def _files(data_dir: str, prefixes) -> tuple[str, ...]:
  for prefix in prefixes:
    files = sorted(glob.glob(os.path.join(data_dir, prefix + "-*")))
    for path in files:
      if os.path.isdir(path):
        raise UserError(f"{path}: a directory among the {prefix}-* TFRecord "
                        "files; move it out of --data_dir")
    if files:
      return tuple(files)
  names = " or ".join(p + "-*" for p in prefixes)
  raise UserError(f"--data_dir={data_dir}: no {names} TFRecord files")


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
