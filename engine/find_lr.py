r"""A learning-rate range test: which --base_lr to train a model with.

  horovodrun --gloo -np 2 .venv/bin/python -m engine.find_lr \
      --flagfile=flags/RECIPE.cfg [--min_lr=1e-5] [--max_lr=10] \
      [--range_steps=100] [--plot=lr_range.png]

Trains the recipe's model from its initial weights, with its data, batch,
optimizer and processes, for --range_steps steps while the learning rate
rises exponentially, one value per step, from --min_lr to --max_lr (Smith
2017, "Cyclical learning rates for training neural networks"; fast.ai's
lr_find). The loss falls once the rate is large enough to make progress and
climbs, then diverges, once it is too large; the range test stops there (the
smoothed loss at 4x its lowest, or a non-finite step). A good rate sits
below the lowest point: the suggestion is a tenth of the rate at the lowest
smoothed loss, given as the --base_lr (per process) that --lr_scaling turns
into it on this many processes.

Nothing is written to a model_dir. Rank 0 prints the suggestion and writes
the plot of loss against rate (log scale), and the figures beside it as
CSV (`lr_range.csv`).
"""
import functools
import os

from absl import app
from absl import flags
from absl import logging
import numpy as np
import keras
import tensorflow as tf

from engine import build
from engine import cli
from engine import distributed
from engine.compute import metrics
from engine.compute import schedules
from engine.compute import step as steps
from engine.core.config import TrainConfig
from engine.core.errors import UserError
from engine.core.errors import WriteFailed
from engine import datasets
from flags import config_from_flags

FLAGS = flags.FLAGS
flags.DEFINE_float("min_lr", 1e-5, "The range test's first rate (the rate "
                   "applied, on all processes together).", lower_bound=0.0)
flags.DEFINE_float("max_lr", 10.0, "The range test's last rate.",
                   lower_bound=0.0)
flags.DEFINE_integer("range_steps", 100, "Steps from --min_lr to --max_lr.",
                     lower_bound=2)
flags.DEFINE_string("plot", "lr_range.png", "The PNG of loss against rate; "
                    "the figures go beside it as .csv.")

# The loss is smoothed with this exponential moving average (bias-corrected)
# before it is compared: single batches are noisy.
SMOOTHING = 0.9
# The test stops once the smoothed loss exceeds this many times its lowest.
DIVERGED = 4.0


class ExponentialRange(keras.optimizers.schedules.LearningRateSchedule):
  """min_lr at step 0 to max_lr at step `steps` - 1, by a constant factor
  per step."""

  def __init__(self, min_lr: float, max_lr: float, steps: int):
    super().__init__()
    self.min_lr, self.max_lr, self.steps = min_lr, max_lr, steps

  def __call__(self, step):
    fraction = tf.cast(step, tf.float32) / (self.steps - 1)
    return self.min_lr * tf.pow(self.max_lr / self.min_lr, fraction)

  def get_config(self):
    return dict(min_lr=self.min_lr, max_lr=self.max_lr, steps=self.steps)


def smoothed(losses: list[float]) -> list[float]:
  """The exponential moving average of `losses`, bias-corrected (as Adam's
  moments), so its first values are not pulled towards 0."""
  average, result = 0.0, []
  for count, loss in enumerate(losses, start=1):
    average = SMOOTHING * average + (1 - SMOOTHING) * loss
    result.append(average / (1 - SMOOTHING ** count))
  return result


def suggested_rate(rates: list[float], losses: list[float]) -> float:
  """A tenth of the rate at the lowest smoothed loss."""
  return rates[int(np.argmin(smoothed(losses)))] / 10


def range_test(config: TrainConfig, *, min_lr: float,
               max_lr: float, range_steps: int) -> tuple[list, list, int]:
  """Runs the test on every rank; returns the rates and rank 0's losses of
  the steps taken, and the number of processes."""
  if not 0 < min_lr < max_lr:
    raise UserError(f"--min_lr={min_lr:g} and --max_lr={max_lr:g}: the "
                    "range needs 0 < --min_lr < --max_lr")
  world, choice, sent, splits, task, model, _, config = build.prepare(config)
  rate = ExponentialRange(min_lr, max_lr, range_steps)
  _, train_step = build.optimizer_and_step(config, choice.mode,
                                           sent.compression, task, model,
                                           rate)
  train_step.start(datasets.TrainingStream.of(
      config, splits, rank=world.rank, world_size=world.size, task=task,
      resizing=False).batches())
  distributed.broadcast_from_chief(model.variables)
  window = metrics.StepWindow(train_step.totals)
  rates, losses = [], []
  too_high = False
  for done in range(1, range_steps + 1):
    try:
      # Rank 0's verdict on the step before reaches every rank through the
      # step's own stop flag, so all stop after the same step.
      stop = train_step.train(1, too_high).stop_agreed
    except steps.NonFinite:
      break
    rates.append(float(rate(done - 1)))
    losses.append(window.read(done, train_step.totals.local_sums(),
                              0.0)["loss"])
    curve = smoothed(losses)
    too_high = curve[-1] > DIVERGED * min(curve)
    if stop:
      break
  return rates, losses, world.size


def write_figures(path: str, rates: list[float], losses: list[float],
                  suggestion: float) -> None:
  """The PNG at `path` and the CSV beside it."""
  # Here, not at the top: only rank 0 draws.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

  figure = Figure(figsize=(8, 5), dpi=100)
  FigureCanvasAgg(figure)
  axes = figure.add_subplot()
  curve = smoothed(losses)
  axes.plot(rates, losses, alpha=0.3, label="loss (rank 0's batch)")
  axes.plot(rates, curve, label="smoothed")
  # The range that matters: a diverged loss would flatten the rest.
  axes.set_ylim(0.9 * min(curve), max(1.2 * curve[0], DIVERGED * min(curve)))
  axes.axvline(suggestion, color="grey", linestyle="--",
               label=f"suggested rate {suggestion:.3g}")
  axes.set_xscale("log")
  axes.set_xlabel("learning rate (applied, all processes)")
  axes.set_ylabel("training loss")
  axes.set_title("Learning-rate range test")
  axes.grid(True, alpha=0.4)
  axes.legend()
  figure.tight_layout()
  csv_path = os.path.splitext(path)[0] + ".csv"
  try:
    figure.savefig(path, format="png")
    with open(csv_path, "w") as f:
      f.write("learning_rate,loss,smoothed_loss\n")
      for row in zip(rates, losses, curve):
        f.write(",".join(f"{value:.6g}" for value in row) + "\n")
  except OSError as e:
    raise WriteFailed(f"--plot={path}: cannot write it or {csv_path} "
                      f"({e.strerror}); pass a path in a writable "
                      "directory") from None


def main(argv):
  del argv
  try:
    config = config_from_flags()
    rates, losses, world_size = range_test(
        config, min_lr=FLAGS.min_lr, max_lr=FLAGS.max_lr,
        range_steps=FLAGS.range_steps)
    if len(losses) < 2:
      raise UserError(f"the loss was not finite from --min_lr={FLAGS.min_lr:g}"
                      " on: lower --min_lr")
    rate = suggested_rate(rates, losses)
    scaling = config.optimization.lr_scaling
    base_lr = rate / schedules.scaled_rate(1.0, world_size, scaling)
    if distributed.is_chief():
      write_figures(FLAGS.plot, rates, losses, rate)
      ended = ("the loss diverged" if len(losses) < FLAGS.range_steps
               else "the range ended")
      print(f"{len(losses)} steps from {rates[0]:.3g} to {rates[-1]:.3g} "
            f"({ended}); lowest smoothed loss at {rate * 10:.3g}; suggested "
            f"rate {rate:.3g}, that is --base_lr={base_lr:.3g} with "
            f"--lr_scaling={scaling} on {world_size} processes; "
            f"plot in {FLAGS.plot}")
  except UserError as e:
    cli.exit_with_error(str(e), e.exit_code, program="engine.find_lr")


if __name__ == "__main__":
  logging.set_verbosity(logging.WARNING)
  app.run(main, flags_parser=functools.partial(cli.parse_flags,
                                              program="engine.find_lr"))
