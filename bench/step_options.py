r"""Train-step time of the engine's precision and XLA options on this host.

The measurement behind the defaults in flags/performance.py (float32, no
XLA on CPUs) and the warnings engine/train.py gives when a CPU run asks for
float16 or XLA. One process, all cores, random data; each option's
`engine.step.TrainStep` is warmed up, then timed, in rounds that alternate
the options so drifting machine speed affects them alike.

  .venv/bin/python -m bench.step_options            # cnn, batch 128
  .venv/bin/python -m bench.step_options --model=wrn --batch_size=32

float16 on a CPU without float16 arithmetic is tens of times slower; its
few steps take a minute or more.
"""
import statistics
import time

from absl import app
from absl import flags
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from engine import distributed
from engine import precision
from engine import step as steps
import models

flags.DEFINE_enum("model", "cnn", ["cnn", "wrn"], "cnn: the CPU preset's "
                  "(filters 32); wrn: WRN-16-2.")
flags.DEFINE_integer("batch_size", 128, "Images per step.")
flags.DEFINE_integer("steps", 10, "Timed steps per option per round.")
flags.DEFINE_integer("rounds", 3, "Rounds over all options.")
FLAGS = flags.FLAGS

OPTIONS = {  # name: (mixed precision, XLA)
    "float32": ("none", False),
    "bfloat16": ("bfloat16", False),
    "float16": ("float16", False),
    "float32 + XLA": ("none", True),
}
SLOW_STEPS = 2  # float16 on CPU: enough to see it


def train_step(mode: str, xla: bool) -> steps.TrainStep:
  params = {"cnn": dict(filters=32), "wrn": dict(depth=16, width=2)}
  precision.set_policy(mode)
  tf.keras.utils.set_random_seed(0)
  model = models.build(FLAGS.model, input_shape=(28, 28, 1), num_classes=10,
                       **params[FLAGS.model])
  precision.set_policy("none")
  optimizer = precision.with_loss_scaling(tf.keras.optimizers.Adam(1e-3),
                                          mode)
  return steps.TrainStep(model=model, optimizer=optimizer, xla=xla)


def main(argv):
  del argv
  distributed.init()  # one process: the engine's threads for all cores
  rng = np.random.default_rng(0)
  images = tf.constant(rng.normal(size=(FLAGS.batch_size, 28, 28, 1)),
                       tf.float32)
  labels = tf.constant(rng.integers(0, 10, FLAGS.batch_size), tf.int64)
  runs = {name: train_step(*option) for name, option in OPTIONS.items()}
  for run in runs.values():
    for _ in range(2):  # tracing, XLA compilation, first allocations
      run(images, labels)
  times = {name: [] for name in runs}
  for _ in range(FLAGS.rounds):
    for name, run in runs.items():
      count = SLOW_STEPS if name == "float16" else FLAGS.steps
      start = time.perf_counter()
      for _ in range(count):
        run(images, labels)
      times[name].append((time.perf_counter() - start) / count * 1000)
  base = statistics.median(times["float32"])
  print(f"{FLAGS.model}, batch {FLAGS.batch_size}, 1 process on "
        f"{distributed.available_cores()} cores, {hvd.size()} rank")
  print("| option | ms/step (median) | rounds | vs float32 |")
  print("|---|---|---|---|")
  for name, values in times.items():
    median = statistics.median(values)
    print(f"| {name} | {median:.1f} | "
          f"{' '.join(f'{v:.1f}' for v in values)} | "
          f"{base / median:.2f}x speed |")


if __name__ == "__main__":
  app.run(main)
