r"""Evaluates a run's checkpoint on its test set, on one process or N.

  .venv/bin/python -m engine.evaluate --model_dir=runs/fashion_mnist_fast
  horovodrun --gloo -np 2 .venv/bin/python -m engine.evaluate \
      --model_dir=runs/fashion_mnist_fast --checkpoint=best

The run's own flags (model_dir/flags.txt, or flags.latest.txt after a
resume) say which model and data set; flags given here override them (a new
--data_dir, a larger --batch_size). Rank 0 restores the checkpoint and
broadcasts the weights; each rank evaluates its shard of the test set and
the figures are reduced exactly, as during training.
"""
import functools
import sys

from absl import app
from absl import flags
import numpy as np

from engine import build
from engine import cli
from engine import distributed
from engine.compute import ema
from engine.compute import eval_step as eval_steps
from engine.core import run_files
from engine.core.config import TrainConfig
from engine.core.errors import UserError
from engine.datasets import Shard
from engine import datasets
from engine.records import checkpoint
from engine.records import report
from engine.tasks.classification import Classification
from engine.tasks.classification import per_class_accuracy
from flags import config_from_flags
from flags import given_flags

FLAGS = flags.FLAGS
PROGRAM = "engine.evaluate"  # what its error lines start with
flags.DEFINE_string("checkpoint", "latest",
                    "Which checkpoint: latest, best, or a checkpoint prefix "
                    "(model_dir/checkpoints/ckpt-N).")


def evaluate(config: TrainConfig, which: str):
  """Returns (checkpoint path, metrics.Result, and for classification the
  per-class accuracy and class names, else None) on every rank."""
  world, _, _, splits, task, model, _, config = build.prepare(
      config, measure_auto=False)
  # The run evaluated with its weights' average: so does this.
  weight_average = ema.maybe_average(model, config.optimization.ema_decay)
  model_dir = config.training.model_dir

  def restore():
    checkpoints = checkpoint.Checkpoints(
        model_dir, model=model, optimizer=None, keep=1,
        identity=checkpoint.identity(model, splits.info),
        weight_average=weight_average)
    path = {"latest": (checkpoints.existing() or [None])[-1],
            "best": checkpoints.best_path}.get(which, which)
    if not path:
      raise UserError(f"--model_dir={model_dir}: no {which} "
                      "checkpoint in checkpoints/")
    checkpoints.restore(path)
    return path

  path = distributed.on_chief(restore if distributed.is_chief() else None,
                              name="evaluate_restore")
  distributed.broadcast_from_chief(model.variables
                                   + ema.variables(weight_average))
  eval_step = build.eval_step(config, task, model)
  with ema.averaged(weight_average):
    result = eval_steps.evaluate(eval_step, datasets.eval_batches(
        splits.test, splits.info, shard=Shard(world.rank, world.size),
        batch_size=config.training.batch_size))
  if not isinstance(task, Classification):
    return path, result, None
  return path, result, (per_class_accuracy(result.sums["confusion"]),
                        splits.info.classes())


def main(argv):
  try:
    cli.refuse_arguments(argv)
    if not FLAGS.model_dir:
      raise UserError("--model_dir is required: the run to evaluate")
    # Re-read the flags: the run's own first, then this command line's.
    run_flags = run_files.latest_flags_file(FLAGS.model_dir)
    if not run_flags:
      raise UserError(f"--model_dir={FLAGS.model_dir}: no "
                      f"{run_files.FLAGS_FILE}; is it a model_dir written "
                      "by engine.train?")
    given = sys.argv[1:]
    # The flags the user set are this command line's: the run's own were
    # checked when it trained, and its flags.txt gives them all.
    set_here = given_flags()
    FLAGS.unparse_flags()
    cli.parse_flags([sys.argv[0], f"--flagfile={run_flags}", *given],
                    program=PROGRAM)
    path, result, classes = evaluate(
        config_from_flags().replace(given=set_here), FLAGS.checkpoint)
  except UserError as e:
    cli.exit_with_error(str(e), e.exit_code, program=PROGRAM)
  if distributed.is_chief():
    print(f"{path}: {report.in_words(result.figures, details=True)} "
          f"({result.examples} examples)")
    if not classes:
      return
    per_class, names = classes
    width = max(len(name) for name in names)
    for name, accuracy in zip(names, per_class):
      shown = "no examples" if np.isnan(accuracy) else f"{accuracy:.4f}"
      print(f"  {name:<{width}}  {shown}")


if __name__ == "__main__":
  app.run(main, flags_parser=functools.partial(cli.parse_flags,
                                              program=PROGRAM))
