"""Random images and labels of any shape and class count, for benchmarks.

Generated in memory at start-up from a fixed seed, so a benchmark measures
the model, the step and the collectives with no file I/O or decoding; the
same input pipeline as real in-memory data sets carries them to the step.
"""
import numpy as np

from engine.datasets.splits import DatasetInfo, Examples, Splits
from engine.errors import UserError


DEFAULT_TRAIN_EXAMPLES = 10000
DEFAULT_TEST_EXAMPLES = 1000


def load(*, synthetic_image_shape, synthetic_classes: int,
         train_examples: int, test_examples: int) -> Splits:
  """Examples counts of 0 mean the defaults above."""
  image_shape = tuple(int(d) for d in synthetic_image_shape)
  if len(image_shape) != 3 or min(image_shape) < 1:
    raise UserError("--synthetic_image_shape="
                    f"{','.join(map(str, image_shape))}: give "
                    "height,width,channels, e.g. 32,32,3")
  num_classes = synthetic_classes
  num_train = train_examples or DEFAULT_TRAIN_EXAMPLES
  num_test = test_examples or DEFAULT_TEST_EXAMPLES
  rng = np.random.default_rng(0)

  def split(num):
    return Examples(
        rng.integers(0, 256, (num, *image_shape), dtype=np.uint8),
        rng.integers(0, num_classes, num).astype(np.int64))

  train, test = split(num_train), split(num_test)
  channels = image_shape[-1]
  # The statistics of uniform bytes, not measured: nothing to learn here.
  info = DatasetInfo(name="synthetic", image_shape=image_shape,
                     num_classes=num_classes, num_train=num_train,
                     num_test=num_test, mean=(127.5,) * channels,
                     std=(73.9,) * channels)
  return Splits(train=train, test=test, info=info)
