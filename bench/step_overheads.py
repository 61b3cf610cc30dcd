r"""Where a train step's time goes besides its kernels, at 1 or 2 processes.

The throughput benchmark compares whole loops; this takes apart the two
costs a loop adds to the step's kernels, on the throughput workload
(bench/workload.py: the CPU preset's cnn, batch 128 per process, random
images), so that what one loop could still gain over another is known:

  calling  the engine's `TrainStep` called from Python once a step, as
           engine/train.py does (it reads the step's status, and so waits
           for it), against the same traced step run --steps times in one
           tf.function (one call and one read for all of them, as Orbit's
           steps_per_loop or Keras' steps_per_execution do)
  reducing a grouped allreduce of the model's gradients (one tensor per
           trainable variable, and the step's two flags), and of the flags
           alone: what the collective costs, and how much of that is its
           latency rather than the bytes. Each runs --steps times in one
           tf.function, so no Python is timed.

Each is timed over --rounds rounds, the order alternating from round to
round. Launch it the way the engine is launched:

  .venv/bin/python -m bench.step_overheads                     # 1 process
  .venv/bin/horovodrun --gloo -np 2 .venv/bin/python -m bench.step_overheads
"""
import statistics
import time

from absl import app
from absl import flags
import horovod.tensorflow as hvd
import numpy as np
import keras
import tensorflow as tf

from bench import workload
from engine import distributed
from engine.compute import step as steps

flags.DEFINE_integer("batch_size", 128, "Images per step and process.")
flags.DEFINE_integer("steps", 20, "Steps (or allreduces) per timing.")
flags.DEFINE_integer("rounds", 6, "Rounds over everything timed.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  world = distributed.init()
  info = workload.load("synthetic").info
  rng = np.random.default_rng(world.rank)
  images = tf.constant(rng.normal(size=(FLAGS.batch_size,
                                        *info.image_shape)), tf.float32)
  labels = tf.constant(rng.integers(0, info.num_classes, FLAGS.batch_size),
                       tf.int64)
  model = workload.build_model(info)
  train_step = steps.TrainStep(
      model=model,
      optimizer=keras.optimizers.Adam(workload.BASE_LR * world.size))
  no_stop = tf.constant(0.0)
  # The step's own Python function, to trace into a loop of our own.
  traced_step = train_step._train_step  # pylint: disable=protected-access

  @tf.function
  def steps_in_graph(count):
    status = tf.constant(0)
    for _ in tf.range(count):
      status += traced_step(images, labels, no_stop)["status"]
    return status

  def called_from_python():
    for _ in range(FLAGS.steps):
      train_step(images, labels)

  gradients = [tf.ones_like(v) for v in model.trainable_variables]
  flags_only = [tf.zeros([2])]  # as the step's stop and non-finite shares
  timed = {
      "step, called from Python": called_from_python,
      "step, in one tf.function": lambda: int(steps_in_graph(FLAGS.steps)),
      "allreduce, gradients and flags": _allreduces(gradients + flags_only),
      "allreduce, flags alone": _allreduces(flags_only),
  }
  for run in timed.values():  # tracing, first allocations
    run()
  milliseconds = {name: [] for name in timed}
  for round_ in range(FLAGS.rounds):
    for name in list(timed)[::-1 if round_ % 2 else 1]:
      # Every process starts each timing together.
      hvd.allreduce(tf.constant(0.0), name="start_together")
      start = time.perf_counter()
      timed[name]()
      milliseconds[name].append(
          (time.perf_counter() - start) / FLAGS.steps * 1000)
  if world.rank == 0:
    _report(milliseconds, world, model)


def _allreduces(tensors):
  """A function that runs FLAGS.steps grouped allreduces of `tensors`, one
  after the other, in one tf.function."""

  @tf.function
  def reduce(count):
    carried = tf.constant(0.0)
    for _ in tf.range(count):
      # Each depends on the last, as each step's does on the one before.
      reduced = hvd.grouped_allreduce([t + carried for t in tensors],
                                      op=hvd.Average)
      carried = reduced[-1][0]
    return carried

  return lambda: float(reduce(FLAGS.steps))


def _report(milliseconds, world, model) -> None:
  parameters = sum(v.shape.num_elements() for v in model.trainable_variables)
  print(f"{workload.MODEL} (filters {workload.FILTERS}, {parameters} "
        f"parameters, {4 * parameters / 1e6:.1f} MB of float32 gradients), "
        f"batch {FLAGS.batch_size}, {world.size} process(es), "
        f"{world.intra_op_threads} intra-op thread(s) each; {FLAGS.steps} "
        f"per timing, {FLAGS.rounds} rounds\n")
  print("| what | ms each, median | by round |\n|---|---|---|")
  for name, values in milliseconds.items():
    print(f"| {name} | {statistics.median(values):.2f} | "
          f"{' '.join(f'{v:.1f}' for v in values)} |")
  called = statistics.median(milliseconds["step, called from Python"])
  looped = statistics.median(milliseconds["step, in one tf.function"])
  print(f"\ncalling each step from Python: {called / looped - 1:+.1%} "
        "against one call for all")


if __name__ == "__main__":
  app.run(main)
