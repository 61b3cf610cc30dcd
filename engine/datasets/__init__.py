"""Data sets by name: each loader returns its splits and what the model needs.

A loader returns raw examples, uint8 images and int64 labels in a fixed
order, and the statistics to normalize them; sharding, shuffling,
augmentation and batching are the input pipeline's job (`engine/data.py`), the
same for every data set.
"""
from typing import Callable

from engine.datasets import fashion_mnist
from engine.datasets.splits import DatasetInfo, Examples, Splits  # noqa: F401
from engine.errors import UserError


_LOADERS: dict[str, Callable[[str], Splits]] = {
    "fashion_mnist": fashion_mnist.load,
}


def names() -> list[str]:
  return sorted(_LOADERS)


def load(name: str, data_dir: str) -> Splits:
  """The splits of data set `name`, read from `data_dir` ('' = its default)."""
  if name not in _LOADERS:
    raise UserError(f"--dataset={name} is unknown; choose one of "
                    f"{', '.join(names())}")
  return _LOADERS[name](data_dir)
