"""Random images and labels of any shape and class count, for benchmarks.

Generated in memory at start-up from a fixed seed, so a benchmark measures
the model, the step and the collectives with no file I/O or decoding; the
same input pipeline as real in-memory data sets carries them to the step.
"""
import numpy as np

from engine.core.errors import UserError
from engine.datasets.sources import Examples
from engine.datasets.splits import DatasetInfo, Splits


DEFAULT_TRAIN_EXAMPLES = 10000
DEFAULT_TEST_EXAMPLES = 1000


# The sizes --image_size=0 and --num_classes=0 stand for (engine.datasets).
DEFAULT_IMAGE_SIZE = 32
DEFAULT_NUM_CLASSES = 10


def load(*, image_size: int, channels: int, num_classes: int,
         train_examples: int, test_examples: int) -> Splits:
  """Examples counts of 0 mean the defaults above."""
  if image_size < 1 or channels < 1:
    raise UserError(f"--image_size={image_size} --channels={channels}: give "
                    "a positive size and channels, e.g. 32 and 3")
  image_shape = (image_size, image_size, channels)
  num_train = train_examples or DEFAULT_TRAIN_EXAMPLES
  num_test = test_examples or DEFAULT_TEST_EXAMPLES
  rng = np.random.default_rng(0)

  def split(num):
    return Examples(
        rng.integers(0, 256, (num, *image_shape), dtype=np.uint8),
        rng.integers(0, num_classes, num).astype(np.int64))

  train, test = split(num_train), split(num_test)
  # The statistics of uniform bytes, not measured: nothing to learn here.
  info = DatasetInfo(name="synthetic", image_shape=image_shape,
                     num_classes=num_classes, num_train=num_train,
                     num_test=num_test, mean=(127.5,) * channels,
                     std=(73.9,) * channels)
  return Splits(train=train, test=test, info=info)
