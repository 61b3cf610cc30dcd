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


@dataclasses.dataclass(frozen=True)
class Examples:
  """One split in memory: uint8 images [N, H, W, C], int64 labels [N]."""
  images: np.ndarray
  labels: np.ndarray


@dataclasses.dataclass(frozen=True)
class Splits:
  train: Examples
  test: Examples
  info: DatasetInfo
