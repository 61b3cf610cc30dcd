r"""What the non-finite checks cost a train step that has nothing non-finite.

The engine's TrainStep now checks the loss on every rank (one more number in
the stop flag's fused allreduce), the averaged gradients (one pass over
them), and applies the update under a condition. This times it against the
TrainStep of a revision before the checks, loaded from git into the same
processes, on the same model, batch and data: alternating rounds, so
drifting machine speed affects both alike.

  horovodrun -np 2 .venv/bin/python -m bench.nonfinite_check
  horovodrun -np 2 .venv/bin/python -m bench.nonfinite_check --model=wrn \
      --steps=8 --rounds=4

Rank 0 prints every round's ms/step for both, and the medians' ratio.
"""
import importlib.util
import os
import statistics
import subprocess
import tempfile
import time

from absl import app
from absl import flags
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from engine import distributed
from engine import step as steps
import models

flags.DEFINE_string("base", "b038fed", "Revision whose engine/step.py is "
                    "the step before the checks.")
flags.DEFINE_enum("model", "cnn", ["cnn", "wrn"], "cnn: the CPU preset's "
                  "(filters 32); wrn: WRN-16-2.")
flags.DEFINE_integer("batch_size", 128, "Images per process per step.")
flags.DEFINE_integer("steps", 20, "Timed steps per variant per round.")
flags.DEFINE_integer("rounds", 5, "Rounds over both variants.")
FLAGS = flags.FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def base_step_module():
  """engine/step.py at --base, as a module of its own."""
  source = subprocess.run(["git", "show", f"{FLAGS.base}:engine/step.py"],
                          cwd=REPO, check=True, capture_output=True,
                          text=True).stdout
  path = os.path.join(tempfile.mkdtemp(), "base_step.py")
  with open(path, "w") as f:
    f.write(source)
  spec = importlib.util.spec_from_file_location("base_step", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def train_step(module):
  params = {"cnn": dict(filters=32), "wrn": dict(depth=16, width=2)}
  tf.keras.utils.set_random_seed(0)
  model = models.build(FLAGS.model, input_shape=(28, 28, 1), num_classes=10,
                       **params[FLAGS.model])
  step = module.TrainStep(model=model,
                          optimizer=tf.keras.optimizers.SGD(0.01, 0.9))
  distributed.broadcast_from_chief(model.variables)
  return step


def main(argv):
  del argv
  distributed.init()
  rng = np.random.default_rng(hvd.rank())
  images = tf.constant(rng.normal(size=(FLAGS.batch_size, 28, 28, 1)),
                       tf.float32)
  labels = tf.constant(rng.integers(0, 10, FLAGS.batch_size), tf.int64)
  variants = {"before the checks": train_step(base_step_module()),
              "with the checks": train_step(steps)}
  for run in variants.values():
    for _ in range(3):  # tracing, first allocations
      run(images, labels)
  times = {name: [] for name in variants}
  for _ in range(FLAGS.rounds):
    for name, run in variants.items():
      start = time.perf_counter()
      for _ in range(FLAGS.steps):
        run(images, labels)
      times[name].append((time.perf_counter() - start) / FLAGS.steps * 1000)
  if not distributed.is_chief():
    return
  print(f"{FLAGS.model}, batch {FLAGS.batch_size} per process, "
        f"{hvd.size()} processes, {FLAGS.steps} steps x {FLAGS.rounds} "
        f"rounds; base {FLAGS.base}")
  print("| step | ms/step (median) | every round |")
  print("|---|---|---|")
  for name, values in times.items():
    print(f"| {name} | {statistics.median(values):.1f} | "
          f"{' '.join(f'{v:.1f}' for v in values)} |")
  before, after = (statistics.median(v) for v in times.values())
  print(f"with / before: {after / before:.3f}")


if __name__ == "__main__":
  app.run(main)
