"""Small data sets in the real on-disk formats, and launchers for the engine.

Tests never read the real Fashion-MNIST: they write a few hundred examples
in the same idx format, with class-dependent patterns a model can learn.
"""
import gzip
import os
import subprocess
import sys

import numpy as np

from engine.datasets import fashion_mnist, idx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")


def learnable_images(num: int, shape, num_classes: int, seed: int):
  """uint8 images whose class is visible in them (a bright class band)."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, num).astype(np.uint8)
  images = rng.integers(0, 60, (num, *shape)).astype(np.uint8)
  rows = shape[0] // num_classes
  for i, label in enumerate(labels):
    images[i, label * rows:(label + 1) * rows] += 150
  return images, labels


def write_fashion_mnist(directory: str, num_train: int = 601,
                        num_test: int = 101, seed: int = 0) -> str:
  """Writes the four gzipped idx files of a tiny Fashion-MNIST."""
  os.makedirs(directory, exist_ok=True)
  splits = {"train": learnable_images(num_train, (28, 28), 10, seed),
            "test": learnable_images(num_test, (28, 28), 10, seed + 1)}
  for split, (images, labels) in splits.items():
    for kind, array in (("images", images), ("labels", labels)):
      stem = fashion_mnist.FILES[f"{split}_{kind}"]
      with gzip.open(os.path.join(directory, stem + ".gz"), "wb") as f:
        f.write(idx.encode(array))
  return directory


def launch(python_args, *, processes: int = 1,
           timeout: int = 300) -> subprocess.CompletedProcess:
  """Runs `python *python_args` directly, or under `horovodrun -np N`.

  `python_args` is what follows the interpreter: `["-m", "engine.train",
  "--epochs=1"]` or `[script_path, ...]`.
  """
  command = [PYTHON, *python_args]
  if processes > 1:
    command = [HOROVODRUN, "-np", str(processes), *command]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
  return subprocess.run(command, cwd=REPO, env=env, text=True,
                        capture_output=True, timeout=timeout)
