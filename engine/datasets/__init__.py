"""Data sets by name: each loader returns its splits and what the model needs.

A loader returns raw examples, images and int64 labels, and the statistics
to normalize them. Sharding, shuffling, augmentation and batching are done
by each split's source, whose kind knows how it is read, and normalized,
resized and prefetched once for all kinds (engine/datasets/sources.py:
`train_stream`, `eval_batches`); a run's training stream is set up from
its flags in one place (engine/datasets/training_stream.py). The built-in formats: the original files of Fashion-MNIST and
CIFAR-10 (in memory), TFRecords and image folders (streamed), arrays on
disk (read by rows), synthetic images. A user's own loader,
`--dataset=package.module:function`, returns the same `Splits`
(engine/datasets/splits.py), or its own tf.data datasets, trained as a
fit script's (engine/datasets/pipelines.py, engine/given.py). Loaders declare the options they take in
their signatures and receive only those (engine/core/registry.py).
"""
import dataclasses
import inspect
import os
from typing import Optional

import numpy as np

from engine.datasets import (arrays, cifar10, fashion_mnist, image_folder,
                             pipelines, statistics, synthetic, tfrecord)
# The loaders' contract, and arrays a script holds, for users' own code.
from engine.datasets.arrays import from_arrays  # noqa: F401
from engine.datasets.record_files import (  # noqa: F401
    FeatureRecords, ImageRecords, RecordFiles)
from engine.datasets.image_folder import ImageFiles  # noqa: F401
from engine.datasets.sources import ArrayRows, Examples  # noqa: F401
# A split's batches, for training and for evaluation.
from engine.datasets.sources import (  # noqa: F401
    eval_batches, steps_per_epoch, train_stream)
from engine.datasets.splits import (  # noqa: F401
    Augmentation, DatasetInfo, Epochs, LabelKind, Shard, Source, Splits)
from engine.datasets.training_stream import TrainingStream  # noqa: F401
from engine.core import run_files
from engine.core.errors import UserError
from engine.core.registry import Registry

_DATASETS = Registry("dataset", {
    "arrays": arrays.load,
    "cifar10": cifar10.load,
    "fashion_mnist": fashion_mnist.load,
    "image_folder": image_folder.load,
    "synthetic": synthetic.load,
    "tfrecord": tfrecord.load,
})
names = _DATASETS.names
is_known = _DATASETS.is_known
takes = _DATASETS.takes
not_taken = _DATASETS.not_taken


# What --image_size=0 and --num_classes=0 stand for: ImageNet's, but for
# synthetic data, whose images are generated in memory.
_DEFAULT_SIZES = dict(image_size=224, num_classes=1000)
_DEFAULT_SIZES_OF = {"synthetic": dict(
    image_size=synthetic.DEFAULT_IMAGE_SIZE,
    num_classes=synthetic.DEFAULT_NUM_CLASSES)}


def load(name: str, *args, model_dir: str = "",
         normalization: Optional[tuple] = None, **params
         ) -> Splits | pipelines.Datasets:
  """The splits of data set `name` (or a user's `module:function`); of a
  user's function returning tf.data datasets, those (pipelines.Datasets).

  A run's normalization statistics are those recorded in its model_dir at
  its first start, so a resume and engine.evaluate normalize exactly as
  training did; otherwise `normalization` (from flags), or the loader's own
  (loaders that sample their statistics take `normalization` to skip it).
  So are float targets' (a regression's): each target's mean and std over
  the training set, recorded, or the loader's (measured on a sample of
  streamed records), or computed here.
  """
  normalization = recorded_normalization(model_dir) or normalization
  _refuse_unread_counts(name, params)
  if "labels" in params:  # what the task learns from: a kind, or any
    params["labels"] = LabelKind.of(params["labels"])
  for key, default in _DEFAULT_SIZES_OF.get(name, _DEFAULT_SIZES).items():
    if params.get(key) == 0:
      params[key] = default
  splits = _DATASETS.build(name, *args, normalization=normalization,
                           **params)
  given = pipelines.Datasets.returned(splits, name)
  if given:  # the user's tf.data pipelines, given to the model as they are
    return given
  if not isinstance(splits, Splits):
    raise UserError(f"--dataset={name} returned a {type(splits).__name__}; "
                    "a data set function returns engine.datasets.Splits "
                    "(docs/your-data.md), or (train, validation) tf.data "
                    "datasets (docs/from-fit.md)")
  if normalization:  # also for loaders that compute their own
    splits = dataclasses.replace(splits, info=dataclasses.replace(
        splits.info, mean=tuple(normalization[0]),
        std=tuple(normalization[1])))
  info = splits.info
  _check_transform(model_dir, info)
  if info.has_targets():  # those recorded, the loader's, or computed here
    target_statistics = recorded_target_statistics(model_dir) or (
        {} if info.label_mean else _target_statistics(splits.train.labels))
    splits = dataclasses.replace(splits, info=dataclasses.replace(
        info, **target_statistics))
    info = splits.info
  if not len(info.mean) == len(info.std) == info.image_shape[-1]:
    raise UserError(f"normalization statistics of {len(info.mean)} and "
                    f"{len(info.std)} values for images of "
                    f"{info.image_shape[-1]} channels; give one mean and one "
                    "std per channel (--image_mean, --image_std)")
  return splits


def _refuse_unread_counts(name: str, params: dict) -> None:
  """--train_examples and --test_examples reach only loaders that take
  them (tfrecord: its records' count; synthetic: how many to make); for
  any other, one line rather than a flag silently dropped."""
  taken = inspect.signature(_DATASETS.builder(name)).parameters
  if any(p.kind == p.VAR_KEYWORD for p in taken.values()):
    return
  for flag in ("train_examples", "test_examples"):
    if params.get(flag) and flag not in taken:
      raise UserError(
          f"--{flag}={params[flag]}: --dataset={name} counts its own "
          "examples and takes no count (the flag is for tfrecord, the "
          "count of its records, and synthetic, how many to make); drop it")


def record(model_dir: str, info: DatasetInfo) -> None:
  """Writes classes.txt and the normalization statistics (the images', and
  float targets') into model_dir."""
  run_files.write_classes(model_dir, info.classes())
  statistics = {"mean": list(info.mean), "std": list(info.std)}
  if info.transform:  # what the statistics were measured on
    statistics.update(transform=info.transform)
  if info.has_targets():
    statistics.update(target_mean=list(info.label_mean),
                      target_std=list(info.label_std))
  run_files.write_normalization(model_dir, statistics)


def _check_transform(model_dir: str, info: DatasetInfo) -> None:
  """The run's statistics were measured on values transformed as now."""
  recorded = run_files.read_normalization(model_dir)
  if recorded and recorded["transform"] != info.transform:
    raise UserError(
        f"{os.path.join(model_dir, run_files.NORMALIZATION_FILE)}: this run "
        f"normalizes {recorded['transform'] or 'untransformed'} values, and "
        f"this start would read {info.transform or 'untransformed'} ones "
        "(--log_transform): give the flag as the run started")


def _target_statistics(labels: np.ndarray) -> dict:
  """Each target's mean and std over the training set (std 1 for a
  constant target)."""
  mean, std = statistics.channel_statistics(
      np.asarray(labels).reshape(len(labels), -1))
  return dict(label_mean=mean, label_std=std)


def recorded_target_statistics(model_dir: str) -> Optional[dict]:
  """Float targets' statistics recorded in model_dir, if any."""
  recorded = run_files.read_normalization(model_dir)
  if not recorded or "target_mean" not in recorded:
    return None
  return dict(label_mean=tuple(recorded["target_mean"]),
              label_std=tuple(recorded["target_std"]))


def recorded_normalization(model_dir: str) -> Optional[tuple]:
  recorded = run_files.read_normalization(model_dir)
  return recorded and (recorded["mean"], recorded["std"])
