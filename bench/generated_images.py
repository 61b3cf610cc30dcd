"""Generated 32x32x3 images of 10 classes, for the input benchmarks."""
import os

import numpy as np

SHAPE, CLASSES = (32, 32, 3), 10


def images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Noise with a bright band per class: learnable, and compressing about
  as badly as photographs do."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, CLASSES, count)
  pixels = rng.integers(0, 100, (count, *SHAPE), dtype=np.uint8)
  rows = SHAPE[0] // CLASSES
  for label in range(CLASSES):
    pixels[labels == label, label * rows:(label + 1) * rows] += 150
  return pixels, labels


def write_folder(path: str, count: int, extension: str) -> None:
  """`count` training and count/10 validation images in class folders."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  for split, (pixels, labels) in (("train", images(count, 0)),
                                  ("validation", images(count // 10, 1))):
    for label in range(CLASSES):
      os.makedirs(os.path.join(path, split, f"c{label}"), exist_ok=True)
    for i, (image, label) in enumerate(zip(pixels, labels)):
      Image.fromarray(image).save(
          os.path.join(path, split, f"c{label}", f"{i:06d}.{extension}"))
