"""What every data set loader returns."""
import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  name: str
  image_shape: tuple[int, int, int]  # height, width, channels
  num_classes: int
  num_train: int
  num_test: int
  mean: tuple[float, ...]  # per channel, of the training images, in [0, 255]
  std: tuple[float, ...]
  # How a shifted image's uncovered border is filled: "nearest" repeats the
  # edge (the Horovod lab's Fashion-MNIST), "constant" fills zeros (CIFAR's
  # pad-and-crop).
  shift_fill: str = "nearest"


@dataclasses.dataclass(frozen=True)
class Examples:
  """One split in memory: uint8 images [N, H, W, C], int64 labels [N]."""
  images: np.ndarray
  labels: np.ndarray


@dataclasses.dataclass(frozen=True)
class RecordFiles:
  """One split as TFRecord files of encoded images, read file by file.

  Each record holds `image/encoded` (JPEG or PNG bytes) and
  `image/class/label` (int64), the layout of ImageNet's TFRecords.
  """
  files: tuple[str, ...]
  label_offset: int  # subtracted from stored labels (1 for 1-based labels)


@dataclasses.dataclass(frozen=True)
class Splits:
  train: Examples | RecordFiles
  test: Examples | RecordFiles
  info: DatasetInfo
