r"""Train-step speed under TensorFlow's two sets of CPU kernels.

The measurement behind `TF_ENABLE_ONEDNN_OPTS=1` in engine/__init__.py
(BUILD.md, "CPU kernels: oneDNN"). TensorFlow reads that variable once per
process, so each measurement is a fresh process (this module with
--kernels) that times the engine's `TrainStep` of a ResNet-9 on random
images with one process's threads for all cores. Runs alternate the kernels
round by round, so drifting machine speed affects both alike; every run is
printed.

  .venv/bin/python -m bench.cpu_kernels               # widths 8 and 16
  .venv/bin/python -m bench.cpu_kernels --rounds=3 --filters=8
"""
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
KERNELS = {"eigen": "0", "onednn": "1"}  # name: TF_ENABLE_ONEDNN_OPTS
flags.DEFINE_list("filters", ["8", "16"], "ResNet-9 stem widths to time.")
flags.DEFINE_integer("batch_size", 256, "Images per step.")
flags.DEFINE_integer("steps", 12, "Timed steps per run.")
flags.DEFINE_integer("rounds", 2, "Runs of each kernel set per width.")
flags.DEFINE_enum("kernels", None, list(KERNELS),
                  "Worker mode: time one width under the kernels the "
                  "environment chose, print images/s.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.kernels:
    print(f"{_images_per_second(int(FLAGS.filters[0])):.0f}")
    return
  for filters in FLAGS.filters:
    rates = {name: [] for name in KERNELS}
    for _ in range(FLAGS.rounds):
      for name, setting in KERNELS.items():
        rates[name].append(_run(name, setting, filters))
    print(f"resnet9 width {filters}, batch {FLAGS.batch_size}: " + "; ".join(
        f"{name} {', '.join(f'{r:.0f}' for r in runs)} img/s"
        for name, runs in rates.items()) +
          f"; oneDNN / Eigen, medians: "
          f"{statistics.median(rates['onednn']) / statistics.median(rates['eigen']):.2f}",
          flush=True)


def _run(name: str, setting: str, filters: str) -> float:
  env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting,
             TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, "-m", "bench.cpu_kernels", f"--kernels={name}",
       f"--filters={filters}", f"--batch_size={FLAGS.batch_size}",
       f"--steps={FLAGS.steps}"],
      env=env, capture_output=True, text=True, check=True)
  return float(result.stdout.split()[-1])


def _images_per_second(filters: int) -> float:
  # Imported here: the parent process has no use for TensorFlow.
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  from engine import distributed  # pylint: disable=import-outside-toplevel
  from engine import step as steps  # pylint: disable=import-outside-toplevel
  import models  # pylint: disable=import-outside-toplevel

  distributed.init()
  tf.keras.utils.set_random_seed(0)
  model = models.build("resnet9", input_shape=(28, 28, 1), num_classes=10,
                       filters=filters, weight_decay=5e-4)
  step = steps.TrainStep(model=model, optimizer=tf.keras.optimizers.SGD(
      0.1, momentum=0.9, nesterov=True))
  rng = np.random.default_rng(0)
  images = tf.constant(rng.normal(size=(FLAGS.batch_size, 28, 28, 1)),
                       tf.float32)
  labels = tf.constant(rng.integers(0, 10, FLAGS.batch_size), tf.int64)
  for _ in range(3):
    step(images, labels)
  start = time.perf_counter()
  for _ in range(FLAGS.steps):
    step(images, labels)
  return FLAGS.steps * FLAGS.batch_size / (time.perf_counter() - start)


if __name__ == "__main__":
  app.run(main)
