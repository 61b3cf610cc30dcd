"""What every data set loader returns: `Splits`, the engine's contract.

A loader (built in, or a user's `--dataset=package.module:function`) returns
`Splits(train, test, info)`. Each split is a `Source`, one of five kinds
(engine/datasets/sources.py, image_folder.py, record_files.py), and each
kind knows how it is read, for training and for evaluation;
`train_stream` and `eval_batches` (sources.py) ask any of them for batches
the same way, and normalize what they give:

* `Examples`: arrays in memory (small data sets).
* `ArrayRows`: arrays on disk, read a batch of rows at a time (.npy, .npz,
  HDF5; engine/datasets/arrays.py), so no rank holds the whole data set.
* `ImageFiles`: one image file per example, decoded as it is read
  (engine/datasets/image_folder.py).
* `ImageRecords`, `FeatureRecords`: TFRecord files, streamed file by
  file: ImageNet's layout of encoded images, or declared features such
  as CosmoFlow's volumes.

`DatasetInfo` says what the model, the task and the export need to know:
the image shape and dtype, the labels' shape and dtype, the classes and
their names, and the training set's per-channel statistics that normalize
every image.

What a source is asked for training: who reads (`Shard`), which epochs
(`Epochs`) and how their examples are augmented (`Augmentation`).
"""
import abc
import dataclasses
import enum
from typing import Optional

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from engine.core.errors import UserError


class LabelKind(str, enum.Enum):
  """What a data set's labels are, and what a task learns from
  (Task.labels): decided once, by the loader, and carried in DatasetInfo,
  so that what reads labels asks their kind instead of guessing it from
  shapes. A str, so a task may name it ("targets")."""
  CLASSES = "classes"  # a class id per image, an integer
  TARGETS = "targets"  # float values per image, [k]
  MASKS = "masks"  # a class id per pixel, [H, W] integers as the image
  OTHER = "other"  # any other: read as given, for a user's own task

  @classmethod
  def of(cls, name) -> Optional["LabelKind"]:
    """A task's `labels` as a kind; None for "any" (or None)."""
    if name in (None, "any"):
      return None
    try:
      return cls(name)
    except ValueError:
      raise UserError(f"Task.labels = {name!r}: give one of "
                      f"{', '.join(kind.value for kind in cls)} or any "
                      "(docs/your-task.md)") from None

  @classmethod
  def of_labels(cls, label_shape, label_dtype: str,
                image_shape) -> "LabelKind":
    """The kind of labels of this shape and dtype, for a loader that does
    not say (a user's)."""
    shape, integer = tuple(label_shape), tf.as_dtype(label_dtype).is_integer
    if integer and not shape:
      return cls.CLASSES
    if integer and shape == tuple(image_shape[:2]):
      return cls.MASKS
    if not integer and len(shape) == 1:
      return cls.TARGETS
    return cls.OTHER


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
  # What the labels are; None: decided here from their shape and dtype
  # (LabelKind.of_labels), for a loader that does not say.
  label_kind: Optional[LabelKind] = None

  def __post_init__(self):
    if self.label_kind is None:
      object.__setattr__(self, "label_kind", LabelKind.of_labels(
          self.label_shape, self.label_dtype, self.image_shape))

  def transformed(self, values: tf.Tensor) -> tf.Tensor:
    """Stored values (float32), transformed as `transform` says; in Keras'
    ops, so that the exported `.keras` file's input holds it too
    (Task.normalization)."""
    return keras.ops.log1p(values) if self.transform == "log1p" else values

  def normalized(self, images: tf.Tensor) -> tf.Tensor:
    """Featurewise standardization with the training set's channel
    statistics, of the stored values transformed as `transform` says
    (log(1 + x) of CosmoFlow's counts)."""
    # As large as an example where the batch's shape is known: the same
    # arithmetic without broadcasting along the innermost axis of a few
    # channels, which is slow (for CosmoFlow's volumes, half the cost:
    # bench/RESULTS.md, "CosmoFlow's step").
    mean = np.asarray(self.mean, np.float32)
    std = np.asarray(self.std, np.float32)
    if tuple(images.shape[1:]) == tuple(self.image_shape):
      mean = np.broadcast_to(mean, self.image_shape)
      std = np.broadcast_to(std, self.image_shape)
    mean, std = tf.constant(mean), tf.constant(std)
    return (self.transformed(tf.cast(images, tf.float32)) - mean) / std

  def labels_are_masks(self) -> bool:
    """Whether a label is an image's mask, [H, W] as the image: flipped and
    shifted with it."""
    return self.label_kind == LabelKind.MASKS

  def has_targets(self) -> bool:
    """Whether the labels are float targets, which have statistics of
    their own (label_mean, label_std)."""
    return self.label_kind == LabelKind.TARGETS

  def classes(self) -> tuple[str, ...]:
    """The name of each class, in label order."""
    return self.class_names or tuple(str(i) for i in range(self.num_classes))


@dataclasses.dataclass(frozen=True)
class Shard:
  """This process's share of a split: rank `rank` of `world_size`."""
  rank: int
  world_size: int


@dataclasses.dataclass(frozen=True)
class Epochs:
  """What each training epoch is, on every rank: `steps` batches of
  `batch_size`, in an order drawn from `seed`."""
  batch_size: int
  steps: int
  seed: int


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """How training augments its examples (the --random_* flags, as the
  task's targets allow, and --progressive_resizing): what training
  examples become. Images are flipped left and right and shifted by up to
  `shift` of their size (sources.py: `augment`); volumes flipped along
  each spatial axis and, with `transpose`, their axes put in a random
  order (`augment_volumes`). `resizing`, ((side, last epoch), ...), makes
  the images of the first epochs smaller (`train_stream`)."""
  flip: bool = False
  shift: float = 0.0
  transpose: bool = False
  resizing: tuple = ()

  @classmethod
  def requested(cls, data_config, task=None, *,
                resizing: bool = True) -> "Augmentation":
    """What a run's data flags (config.DataConfig) ask for, for `task`'s
    targets; without `resizing`, at the images' own size (a measurement's
    batches).

    Flips, shifts and transposes move the images and not a label: right
    for a task whose targets do not change with them or that moves them
    too (`Task.augmentation_keeps_targets`); for any other, a position
    or an angle would be learned wrong, so their defaults are off and a
    flag that asks for one anyway is warned about (`_warn_moving`).
    Without a task (a benchmark's batches), as the flags say."""
    flip, shift = data_config.random_flip, data_config.random_shift
    transpose = data_config.random_transpose
    if task is not None and not task.augmentation_keeps_targets:
      given = data_config.given_augmentation
      flip = flip and "random_flip" in given
      shift = shift if "random_shift" in given else 0.0
      transpose = transpose and "random_transpose" in given
      _warn_moving(type(task).__name__, flip=flip, shift=shift,
                   transpose=transpose)
    return cls(flip=flip, shift=shift, transpose=transpose,
               resizing=data_config.progressive_resizing if resizing else ())

  def check(self, image_shape) -> None:
    """A UserError if these examples cannot be augmented so."""
    volumes = len(image_shape) == 4
    if self.transpose and not (volumes and len(set(image_shape[:3])) == 1):
      raise UserError(
          "--random_transpose puts a volume's three axes in a random order: "
          "for cubic volumes (DxDxDxC); these examples are "
          f"{'x'.join(map(str, image_shape))}")


def _warn_moving(task: str, *, flip: bool, shift: float,
                 transpose: bool) -> None:
  """One line saying what the flags given do to targets that stay put."""
  moving = [name for name, on in (("--random_flip", flip),
                                  ("--random_shift", shift),
                                  ("--random_transpose", transpose)) if on]
  if moving:
    logging.warning(
        "%s move%s the training images of %s and not its targets, which "
        "it does not say are kept (Task.augmentation_keeps_targets): a "
        "target that moves with the image, a position or an angle, is "
        "learned wrong", " and ".join(moving),
        "" if len(moving) > 1 else "s", task)


class Source(abc.ABC):
  """One split's examples, and how they are read.

  Training reads one stream for the whole run, epoch after epoch, each
  rank its own share, `epochs.steps` batches an epoch on every rank (an
  allreduce waits for all ranks: one rank with an extra batch would hang
  the job). A batch is a pure function of (seed, epoch, step, rank), so a
  run is reproducible, every epoch differs, no two ranks augment alike,
  and a run resumed mid-epoch gets the very batches it would have had.
  Evaluation reads every example exactly once across ranks.
  """
  # Whether engine/datasets/staging.py can copy the files this rank reads to
  # node-local storage: only a kind that splits whole files across ranks.
  stageable = False
  # Whether train_stream and eval_batches normalize its batches with the
  # DatasetInfo's statistics: every kind but a fit script's tf.data
  # pipeline, which the model is given as it yields it (pipelines.py).
  normalizes = True

  @abc.abstractmethod
  def train_batches(self, info: DatasetInfo, *, shard: Shard, epochs: Epochs,
                    augmentation: Augmentation, first_epoch: int,
                    first_step: int) -> tf.data.Dataset:
    """This rank's training batches from `first_step` of `first_epoch` on,
    augmented, as stored: (images, labels). `train_stream` normalizes
    them (sources.py), whatever the kind."""

  @abc.abstractmethod
  def eval_batches(self, info: DatasetInfo, *, shard: Shard,
                   batch_size: int) -> tf.data.Dataset:
    """This rank's share of the split, (images, labels) as stored: no
    padding and no repetition, so the last batch may be short and ranks
    may hold unequal shares."""


@dataclasses.dataclass(frozen=True)
class Splits:
  train: Source
  test: Source
  info: DatasetInfo
