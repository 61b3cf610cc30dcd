"""Per-channel statistics: the mean and std that normalize every image (and
every float target), computed here for every loader.

Two ways, one result: values held in memory (`channel_statistics`), in two
passes over them as numpy computes a mean and a std; values streamed from
files a block at a time (`Moments`), as sums and sums of squares, so no
sample is held whole. uint8 images too large to copy as floats, CIFAR-10's
1.2 GB, are summed exactly as integers (`exact_channel_statistics`). A
channel whose values are all alike gets a std of 1, so that normalizing it
gives zeros rather than NaN.
"""
import math

import numpy as np

Statistics = tuple[tuple[float, ...], tuple[float, ...]]


def channel_statistics(values: np.ndarray) -> Statistics:
  """The mean and std of each channel (the last axis) of `values`, over
  every other axis."""
  values = np.asarray(values, np.float64)
  axes = tuple(range(values.ndim - 1))
  return _statistics(values.mean(axis=axes), values.std(axis=axes))


def exact_channel_statistics(images: np.ndarray) -> Statistics:
  """Per-channel mean and std of uint8 images, exact and without a copy.

  A float64 copy of CIFAR-10's training set would take 1.2 GB. Instead
  numpy sums each channel's strided view and its squares into uint64, in
  small buffered chunks; the sums are exact, and so is the variance's
  numerator computed from them with Python integers.
  """
  means, stds = [], []
  for channel in images.reshape(-1, images.shape[-1]).T:
    count = len(channel)
    total = int(channel.sum(dtype=np.uint64))
    squares = int(np.einsum("i,i->", channel, channel, dtype=np.uint64))
    means.append(total / count)
    stds.append(math.sqrt(count * squares - total**2) / count)
  return _statistics(means, stds)


class Moments:
  """Per channel (column), the mean and std of rows added a block at a
  time."""

  def __init__(self):
    self._count, self._sum, self._squares = 0, 0.0, 0.0

  def add(self, rows: np.ndarray) -> None:
    rows = rows.astype(np.float64)
    self._count += len(rows)
    self._sum = self._sum + rows.sum(axis=0)
    self._squares = self._squares + np.square(rows).sum(axis=0)

  def result(self) -> Statistics:
    mean = self._sum / self._count
    return _statistics(mean, np.sqrt(np.maximum(
        self._squares / self._count - mean ** 2, 0)))


def _statistics(means, stds) -> Statistics:
  return (tuple(float(m) for m in means),
          tuple(float(s) if s > 0 else 1.0 for s in stds))
