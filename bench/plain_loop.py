r"""The floor: a plain tf.GradientTape loop on one process, no Horovod at all.

The engine at 1 process against this loop is what Horovod and the engine's
loop cost when there is nothing to average. Only the loop differs: the loop
reads the engine's own input pipeline (engine.datasets.train_stream, which
imports no Horovod) and applies the engine's optimizer (engine.compute.optimizers)
in a compiled step of the same math (workload.train_step).

  .venv/bin/python -m bench.plain_loop --dataset=synthetic \
    --intra_op_threads=2 --inter_op_threads=1 --records=/tmp/plain.jsonl

Threads: the orchestrator passes what `engine.distributed.cpu_threads`
gives one process, since that module imports Horovod and so cannot be
imported here. The engine's core binding needs no counterpart: binding the
only process to its share of the cores binds it to all of them.
"""
import sys

from absl import app
from absl import flags

from bench import epochs
from bench import workload
from engine.datasets import Augmentation, Epochs, Shard
from engine import datasets

FLAGS = flags.FLAGS
workload.define_worker_flags()
flags.DEFINE_integer("intra_op_threads", None, "Intra-op threads.",
                     lower_bound=1, required=True)
flags.DEFINE_integer("inter_op_threads", None, "Inter-op threads.",
                     lower_bound=1, required=True)


def main(argv):
  del argv
  if "horovod" in sys.modules:
    raise SystemExit("plain_loop: something imported Horovod; this loop "
                     "must run without it")
  workload.use_threads(FLAGS.intra_op_threads, FLAGS.inter_op_threads)
  splits = workload.load(FLAGS.dataset)
  info = splits.info
  model = workload.build_model(info)
  step = workload.train_step(model)
  batches = iter(datasets.train_stream(
      splits.train, info, shard=Shard(0, 1),
      epochs=Epochs(batch_size=FLAGS.batch_size, steps=FLAGS.steps_per_epoch,
                    seed=workload.SEED),
      augmentation=Augmentation()))
  timer = epochs.EpochTimer(
      FLAGS.records, images_per_epoch=FLAGS.steps_per_epoch * FLAGS.batch_size,
      world_size=1, intra_op_threads=FLAGS.intra_op_threads,
      inter_op_threads=FLAGS.inter_op_threads, chief=True)
  for epoch in range(1, FLAGS.epochs + 1):
    timer.start()
    for _ in range(FLAGS.steps_per_epoch):
      loss = step(*next(batches))
    loss.numpy()  # the epoch's last step has finished before the clock stops
    timer.end(epoch)


if __name__ == "__main__":
  app.run(main)
