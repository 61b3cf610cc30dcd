"""Your own arrays: an .npz, a directory of .npy files, or an HDF5 file.

The names are those of `keras.datasets.*.load_data()`: `x_train`, `y_train`,
`x_test`, `y_test` (`--array_keys` renames them), and optionally
`class_names`. Images are uint8 or float, N x H x W x C, or N x H x W for
one channel; labels are integers from 0, or for a task that learns targets
(--task=regression) floats, N or N x K (`class_names` then names the K
targets), or for segmentation masks, N x H x W integers (a class per
pixel).

Nothing is loaded whole. Labels (small) are read at start-up and checked;
images stay on disk and the input pipeline reads the rows of each batch
(engine/datasets/array_files.py reads each format by rows). The page
cache, not the process, holds what was read, so a rank's memory does not
grow with the data set (bench/RESULTS.md's history, "Peak memory per
rank does not grow").

`from_arrays` builds the same splits from arrays a script already holds.
"""
import os
from typing import Optional

import numpy as np

from engine.core.errors import UserError
from engine.datasets import array_files, statistics
from engine.datasets.sources import ArrayRows, Examples
from engine.datasets.splits import DatasetInfo, LabelKind, Splits

KEYS = ("x_train", "y_train", "x_test", "y_test")
CLASS_NAMES_KEY = "class_names"
# Rows read at start-up for the normalization statistics: a seeded sample
# of the training images, the same on every rank and every rerun.
STATS_SAMPLE = 4096


def load(*, data_dir: str, array_keys: list, normalization=None,
         labels: Optional[LabelKind] = LabelKind.CLASSES) -> Splits:
  """The splits of the arrays at `data_dir`; `normalization` is (mean, std)
  to use rather than the sample's. `labels`: what the task learns from
  (engine/tasks: classes, targets, masks, or any, which reads float labels
  that are not whole numbers, or several a row, as targets)."""
  if not data_dir:
    raise UserError("--dataset=arrays needs --data_dir=PATH: "
                    f"{array_files.FORMATS}")
  keys = _renamed_keys(array_keys)
  store = array_files.open_arrays(data_dir)
  missing = [keys[k] for k in KEYS if keys[k] not in store]
  if missing:
    raise UserError(f"{data_dir}: no {', '.join(missing)} (it holds "
                    f"{', '.join(sorted(store)) or 'nothing'}); rename with "
                    "--array_keys=x_train=NAME,...")
  class_names = store[CLASS_NAMES_KEY].names() if (
      CLASS_NAMES_KEY in store) else ()
  return _splits(
      *(store[keys[k]] for k in KEYS), source=data_dir,
      names=[keys[k] for k in KEYS], class_names=class_names,
      normalization=normalization, labels=labels)


def from_arrays(x_train, y_train, x_test, y_test, *, class_names=(),
                name: str = "arrays", normalization=None,
                labels: Optional[LabelKind] = None) -> Splits:
  """Splits from numpy arrays in memory, checked as files are: for a
  script's `dataset=` (engine.train.run)."""
  arrays = [array_files.InMemory(np.asarray(a))
            for a in (x_train, y_train, x_test, y_test)]
  return _splits(*arrays, source=name, names=list(KEYS),
                 class_names=tuple(class_names), normalization=normalization,
                 labels=labels)


def _renamed_keys(array_keys) -> dict[str, str]:
  keys = {k: k for k in KEYS}
  for item in array_keys or ():
    standard, _, stored = item.partition("=")
    if standard not in KEYS or not stored:
      raise UserError(f"--array_keys={','.join(array_keys)}: give "
                      "STANDARD=STORED pairs, STANDARD one of "
                      f"{', '.join(KEYS)} (e.g. x_train=images)")
    keys[standard] = stored
  return keys


# Checking, and the splits.

class _Images:
  """A split's images as the pipeline reads them: N x H x W x C rows of
  uint8 or float32, whatever they are stored as."""

  def __init__(self, stored):
    self._stored = stored
    self.dtype = np.dtype(np.uint8 if stored.dtype == np.uint8
                          else np.float32)
    self.shape = (*stored.shape, 1)[:4] if len(stored.shape) == 3 else tuple(
        stored.shape)

  def read(self, rows) -> np.ndarray:
    return self._stored.read(rows).astype(self.dtype, copy=False).reshape(
        len(rows), *self.shape[1:])


def _splits(x_train, y_train, x_test, y_test, *, source: str,
            names: list[str], class_names: tuple, normalization,
            labels: str) -> Splits:
  train_images = _checked_images(x_train, names[0])
  test_images = _checked_images(x_test, names[2])
  if train_images.shape[1:] != test_images.shape[1:]:
    raise UserError(f"{source}: {names[0]} images are "
                    f"{'x'.join(map(str, train_images.shape[1:]))} but "
                    f"{names[2]} images are "
                    f"{'x'.join(map(str, test_images.shape[1:]))}")
  if not train_images.shape[0]:
    raise UserError(f"{x_train.label or names[0]}: holds no images")
  if labels == LabelKind.TARGETS or (labels is None
                                     and _are_targets(y_train)):
    train_labels, test_labels, label_info = _targets(
        y_train, y_test, x_train.shape[0], x_test.shape[0], source=source,
        names=names)
  elif labels == LabelKind.MASKS:
    train_labels, test_labels, label_info = _masks(
        y_train, y_test, train_images.shape, test_images.shape,
        names=names, class_names=class_names)
  else:
    train_labels, test_labels, label_info = _classes(
        y_train, y_test, x_train.shape[0], x_test.shape[0], names=names,
        class_names=class_names)
  mean, std = normalization or _sample_statistics(
      train_images, x_train.label or names[0])
  info = DatasetInfo(
      name=os.path.basename(source.rstrip("/")) or "arrays",
      image_shape=train_images.shape[1:], num_train=len(train_labels),
      num_test=len(test_labels), mean=tuple(mean), std=tuple(std),
      class_names=class_names, image_dtype=train_images.dtype.name,
      **label_info)
  return Splits(train=_source(x_train, train_images, train_labels),
                test=_source(x_test, test_images, test_labels), info=info)


def _classes(y_train, y_test, num_train: int, num_test: int, *,
             names: list[str], class_names: tuple):
  """Class ids, checked against each other and the class names: (train,
  test, DatasetInfo's fields for them)."""
  train_labels = _checked_labels(y_train, names[1], num_train, names[0])
  test_labels = _checked_labels(y_test, names[3], num_test, names[2])
  num_classes = len(class_names) or int(train_labels.max(initial=0)) + 1
  if not class_names and num_classes > max(len(train_labels), 2):
    # A damaged label file, most likely: a model (and confusion matrix) of
    # that many classes could exhaust memory.
    raise UserError(f"{y_train.label or names[1]}: labels go up to "
                    f"{num_classes - 1}, more classes than the "
                    f"{len(train_labels)} training images; labels are class "
                    "ids 0..N-1 (give class_names to declare N classes)")
  for labels, array, name in ((train_labels, y_train, names[1]),
                              (test_labels, y_test, names[3])):
    if labels.size and labels.max() >= num_classes:
      reason = (f"{len(class_names)} class names" if class_names else
                f"{names[1]}'s labels go up to {num_classes - 1}")
      raise UserError(f"{array.label or name}: label {labels.max()} is out "
                      f"of range ({reason})")
  return train_labels, test_labels, dict(num_classes=num_classes,
                                         label_kind=LabelKind.CLASSES)


def _targets(y_train, y_test, num_train: int, num_test: int, *,
             source: str, names: list[str]):
  """Float targets N x K, as many a row in both splits: (train, test,
  DatasetInfo's fields for them)."""
  train_targets = _checked_targets(y_train, names[1], num_train, names[0])
  test_targets = _checked_targets(y_test, names[3], num_test, names[2])
  if train_targets.shape[1] != test_targets.shape[1]:
    raise UserError(f"{source}: {train_targets.shape[1]} targets a row in "
                    f"{names[1]}, {test_targets.shape[1]} in {names[3]}")
  return train_targets, test_targets, dict(
      num_classes=0, label_shape=train_targets.shape[1:],
      label_dtype="float32", label_kind=LabelKind.TARGETS)


def _masks(y_train, y_test, train_shape: tuple, test_shape: tuple, *,
           names: list[str], class_names: tuple):
  """A class per pixel, N x H x W as the images: (train, test,
  DatasetInfo's fields for them)."""
  train_masks = _checked_masks(y_train, names[1], train_shape, names[0])
  test_masks = _checked_masks(y_test, names[3], test_shape, names[2])
  return train_masks, test_masks, dict(
      num_classes=len(class_names) or int(train_masks.max(initial=0)) + 1,
      label_shape=train_masks.shape[1:], label_dtype=train_masks.dtype.name,
      label_kind=LabelKind.MASKS)


def _source(stored, images: _Images, labels: np.ndarray):
  if isinstance(stored, array_files.InMemory):
    return Examples(images.read(np.arange(images.shape[0])), labels)
  return ArrayRows(images, labels)


def _checked_images(array, name: str) -> _Images:
  label = array.label or name
  if len(array.shape) not in (3, 4) or 0 in array.shape[1:]:
    raise UserError(f"{label}: images of shape {list(array.shape)}; give "
                    "N x H x W x C, or N x H x W for one channel")
  if not (array.dtype == np.uint8 or np.issubdtype(array.dtype, np.floating)):
    raise UserError(f"{label}: images of type {array.dtype}; give uint8 or "
                    "float images")
  return _Images(array)


def _are_targets(array) -> bool:
  """Labels that are no class ids: several a row, or floats that are not
  whole numbers."""
  if len(array.shape) == 2 and array.shape[1] > 1:
    return True
  values = array.all()
  return (np.issubdtype(values.dtype, np.floating)
          and not np.all(np.mod(values, 1) == 0))


def _checked_targets(array, name: str, num_images: int,
                     images_name: str) -> np.ndarray:
  """Float targets, N x K (N, one a row, becomes N x 1)."""
  label = array.label or name
  if len(array.shape) not in (1, 2) or 0 in array.shape[1:]:
    raise UserError(f"{label}: targets of shape {list(array.shape)}; give "
                    "N x K float targets, or N for one a row")
  values = array.all()
  if not (np.issubdtype(values.dtype, np.floating)
          or np.issubdtype(values.dtype, np.integer)):
    raise UserError(f"{label}: targets of type {values.dtype}; give numbers")
  values = values.astype(np.float32).reshape(len(values), -1)
  if len(values) != num_images:
    raise UserError(f"{label}: {len(values)} targets for {num_images} "
                    f"images in {images_name}; give one row per image")
  finite = np.isfinite(values).all(axis=1)
  if not finite.all():
    raise UserError(f"{label}: row {np.flatnonzero(~finite)[0]} has NaN or "
                    "infinite targets; replace or drop it")
  return values


def _checked_masks(array, name: str, images_shape: tuple,
                   images_name: str) -> np.ndarray:
  """Integer masks N x H x W, one per image, as uint8 (or int32 for more
  than 256 classes)."""
  label = array.label or name
  num, height, width = images_shape[:3]
  if tuple(array.shape) != (num, height, width):
    raise UserError(f"{label}: masks of shape {list(array.shape)} for "
                    f"{num} images of {height}x{width} in {images_name}; "
                    f"give [{num}, {height}, {width}], a class per pixel")
  values = array.all()
  if not np.issubdtype(values.dtype, np.integer):
    raise UserError(f"{label}: masks of type {values.dtype}; give integer "
                    "class ids")
  if values.size and values.min() < 0:
    raise UserError(f"{label}: mask value {values.min()} is out of range; "
                    "masks are class ids from 0")
  return values.astype(np.uint8 if values.max(initial=0) < 256
                       else np.int32)


def _checked_labels(array, name: str, num_images: int,
                    images_name: str) -> np.ndarray:
  label = array.label or name
  if len(array.shape) == 2 and array.shape[1] == 1:
    values = array.all()[:, 0]  # a column, as some savers write labels
  elif len(array.shape) == 1:
    values = array.all()
  else:
    raise UserError(f"{label}: labels of shape {list(array.shape)}; give one "
                    "integer label per image (N)")
  if len(values) != num_images:
    raise UserError(f"{label}: {len(values)} labels for {num_images} images "
                    f"in {images_name}; give one label per image")
  if not np.issubdtype(values.dtype, np.integer):
    if not (np.issubdtype(values.dtype, np.floating)
            and np.all(np.mod(values, 1) == 0)):
      raise UserError(f"{label}: labels of type {values.dtype} that are not "
                      "whole numbers; give integer class ids")
  values = values.astype(np.int64)
  if values.size and values.min() < 0:
    raise UserError(f"{label}: label {values.min()} is out of range; labels "
                    "are class ids from 0")
  return values


def _sample_statistics(images: _Images, label: str) -> tuple[tuple, tuple]:
  """Per-channel mean and std of a seeded sample of the training images;
  `label` names them in errors."""
  count = images.shape[0]
  rows = np.sort(np.random.default_rng(0).choice(
      count, min(count, STATS_SAMPLE), replace=False))
  pixels = images.read(rows).astype(np.float64)
  finite = np.isfinite(pixels).reshape(len(rows), -1).all(axis=1)
  if not finite.all():
    raise UserError(f"{label}: image {rows[~finite][0]} has NaN or infinite "
                    "pixel values; replace or drop it")
  return statistics.channel_statistics(pixels)
