r"""NovoGrad and LAMB: ours (engine/compute/optimizers.py) against tensorflow-addons'.

The engine carries its own NovoGrad and LAMB since addons stopped at
TensorFlow 2.15. Ours compute the same numbers (tests/test_optimizers.py);
this says whether they cost more time: one apply_gradients of each on the
variables of the engine's ResNet-9 (--filters wide: 64 is the paper's
width, 6.6 M parameters; the recipes' 8-16 have 16-64 times fewer), with
fixed random gradients and a learning-rate schedule, as the train step
applies them. Addons' optimizers run too where addons is installed
(Python 3.11 only, requirements-no-deps.txt); without it, ours alone.

Each optimizer updates its own copy of the variables, --steps applies in one
tf.function call (a tf.range loop: no Python is timed), with the engine's
threads for one process. The variants are timed over --rounds rounds, the
order reversed every other round.

  .venv/bin/python -m bench.optimizers [--filters=64] [--rounds=6]
"""
import re
import statistics
import subprocess
import time

# First: the engine makes tf.keras tf_keras (engine/__init__.py), which
# must be set before TensorFlow is imported for addons to find tf_keras'
# optimizers under `tensorflow.keras`.
import engine  # pylint: disable=unused-import,wrong-import-order
from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from bench import addons
from engine import distributed
from engine.compute import optimizers
import models

flags.DEFINE_integer("filters", 64, "ResNet-9's width (its stem's filters).")
flags.DEFINE_integer("steps", 20, "apply_gradients calls per timing.")
flags.DEFINE_integer("rounds", 6, "Rounds over every variant.")
FLAGS = flags.FLAGS

_ADDONS_NAMES = {"novograd": "NovoGrad", "lamb": "LAMB"}


def main(argv):
  del argv
  intra, inter = distributed.cpu_threads(distributed.available_cores(), 1)
  tf.config.threading.set_intra_op_parallelism_threads(intra)
  tf.config.threading.set_inter_op_parallelism_threads(inter)
  model = models.build("resnet9", input_shape=(32, 32, 3), num_classes=10,
                       filters=FLAGS.filters)
  rng = np.random.default_rng(0)
  gradients = [tf.constant(0.01 * rng.normal(size=v.shape), v.dtype)
               for v in model.trainable_variables]
  addons = addons.optimizers()
  timed = {}
  for name in _ADDONS_NAMES:
    timed[f"{name}, ours"] = _applies(
        optimizers.build(name, learning_rate=_schedule(), momentum=0.9,
                         nesterov=False), model, gradients)
    if addons is not None:
      timed[f"{name}, addons"] = _applies(
          getattr(addons, _ADDONS_NAMES[name])(_schedule()), model, gradients)
  for run in timed.values():  # tracing, first allocations
    run()
  milliseconds = {name: [] for name in timed}
  for round_ in range(FLAGS.rounds):
    for name in list(timed)[::-1 if round_ % 2 else 1]:
      start = time.perf_counter()
      timed[name]()
      milliseconds[name].append(
          (time.perf_counter() - start) / FLAGS.steps * 1000)
  _report(milliseconds, model, intra, inter)


def _schedule():
  """The engine's rate is always a schedule, evaluated at every apply."""
  return tf.keras.optimizers.schedules.CosineDecay(0.01, decay_steps=10000)


def _applies(optimizer, model, gradients):
  """A function that runs FLAGS.steps applies of `optimizer` on a copy of
  the model's variables, in one tf.function. One apply first, eagerly,
  creates the slots (addons' optimizer makes them at its first step), so
  that the tf.function creates none."""
  variables = [tf.Variable(v) for v in model.trainable_variables]
  optimizer.apply_gradients(zip(gradients, variables))

  @tf.function
  def apply(count):
    for _ in tf.range(count):
      optimizer.apply_gradients(zip(gradients, variables))
    return optimizer.iterations.read_value()

  return lambda: int(apply(FLAGS.steps))


def _report(milliseconds, model, intra, inter) -> None:
  lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
  cpu = re.search(r"^Model name:\s*(.+)$", lscpu, re.MULTILINE)
  with open("/proc/cpuinfo") as f:
    bf16 = "avx512_bf16" in f.read().split()
  parameters = sum(v.shape.num_elements() for v in model.trainable_variables)
  print(f"\n{cpu.group(1).strip() if cpu else 'CPU unknown'} "
        f"({'with' if bf16 else 'without'} AVX512_BF16), "
        f"{distributed.available_cores()} cores, {intra} intra-op and "
        f"{inter} inter-op thread(s); TensorFlow {tf.__version__}\n"
        f"ResNet-9 of width {FLAGS.filters}: "
        f"{len(model.trainable_variables)} variables, {parameters} "
        f"parameters; {FLAGS.steps} applies per timing, {FLAGS.rounds} "
        "rounds\n")
  print("| optimizer | ms per apply, median | by round |\n|---|---|---|")
  for name, values in milliseconds.items():
    print(f"| {name} | {statistics.median(values):.2f} | "
          f"{' '.join(f'{v:.1f}' for v in values)} |")
  for name in _ADDONS_NAMES:
    if f"{name}, addons" in milliseconds:
      ours = statistics.median(milliseconds[f"{name}, ours"])
      theirs = statistics.median(milliseconds[f"{name}, addons"])
      print(f"\n{name}: ours / addons {ours / theirs:.2f}")


if __name__ == "__main__":
  app.run(main)
