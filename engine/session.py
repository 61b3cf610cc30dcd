"""One start of the train loop, on one set of processes.

A run is one start of the loop; under --elastic, one more after each reset,
on the processes there are then. A start sets up what lasts as long as it:
this rank's batches, the reporting, progress, profiling and stop handling,
which `close()` ends however the start ends. It also carries the run state
as it moves on (the epochs' records, the epoch's figures so far, the
clock), which `run_state()` gives for a commit (engine/run_state.py).
"""
import functools
import time
from typing import Any, Callable, Optional

from absl import logging
import tensorflow as tf

from engine import checkpoint
from engine import distributed
from engine import metrics
from engine import preemption
from engine import profiling
from engine import progress as progress_lib
from engine import report
from engine.config import TrainConfig
from engine.model_dir import RunDirectory
from engine.run_state import RunState


class Session:
  """What a start set up, and the run state as it moves on."""

  def __init__(self, *, config: TrainConfig, world: distributed.World,
               directory: Optional[RunDirectory], steps_per_epoch: int,
               global_batch: int, first_epoch: int, first_step: int,
               run_state: RunState, train_totals: metrics.Totals,
               best_metric: str,
               batches_from: Callable[..., tf.data.Dataset]):
    """`best_metric`: the deciding figure, as "val_accuracy:max", which each
    epoch's record names for engine.runs. `train_totals`: the train step's
    running sums, which summaries
    within an epoch read. `batches_from(first_epoch=, first_step=)`: this
    rank's training batches from there on (data.train_batches, all else
    given)."""
    self.world = world
    self._epochs = config.epochs
    self._best_metric = best_metric
    self._model_dir = config.model_dir
    self.directory = directory  # rank 0's model_dir; None on the others
    self.steps_per_epoch = steps_per_epoch
    self.global_batch = global_batch
    self.first_epoch = first_epoch
    self._batches_from = batches_from
    self.read_from(first_epoch, first_step)
    self.global_step = 0  # of the step being taken
    self.steps_run = 0
    self.optimizer_state_broadcast = False
    self.val = None
    # The run state as it moves on.
    self.history = list(run_state.history)
    self.epoch_sums = run_state.epoch_sums  # of steps committed before
    self.epoch_began_seconds = run_state.epoch_began_seconds
    self._began = time.perf_counter()
    self._seconds_before = run_state.position.seconds  # before this start
    chief = distributed.is_chief()
    self.reporter = report.Reporter(config.model_dir, chief=chief,
                                    epochs=config.epochs)
    # What was written past this point (before a crash, say) goes.
    self.reporter.keep_epochs_up_to(
        first_epoch, first_epoch * steps_per_epoch + first_step)
    self.reporter.hparams(config.hparams(world.size, global_batch))
    self.progress = progress_lib.Progress(
        mode=config.progress, chief=chief, steps_per_epoch=steps_per_epoch,
        epochs=config.epochs, global_batch=global_batch)
    self.stop_requests = preemption.StopRequests()
    self.stop_requests.install()
    self.times = profiling.EpochTimes()
    self.window = metrics.StepWindow(train_totals)
    self.profiler = profiling.StepProfiler(
        config.model_dir, steps=config.profile_steps, rank=world.rank,
        all_ranks=config.profile_all_ranks,
        timeline=config.horovod_timeline)

  def read_from(self, epoch: int, step: int) -> None:
    """This rank's batches from step `step` of epoch `epoch` on (a start,
    or a rollback's)."""
    self.first_step = step  # of the next epoch to train
    self.batches = iter(self._batches_from(first_epoch=epoch,
                                           first_step=step))

  def say_how_it_ended(self) -> None:
    if self.val:
      logging.info("final %s (%d examples); metrics in %s",
                   report.in_words(self.val.figures), self.val.examples,
                   self.reporter.metrics_path)
    elif not self.history:
      logging.info("%s has finished its %d epochs already; pass a larger "
                   "--epochs to train on, or another --model_dir for a new "
                   "run", self._model_dir, self._epochs)

  def seconds(self) -> float:
    """The run's time so far: before this start, and since."""
    return self._seconds_before + time.perf_counter() - self._began

  def end_epoch(self, epoch: int, train: metrics.Result,
                val: Optional[metrics.Result], *, train_seconds: float,
                learning_rate: float, skipped_steps: int) -> dict:
    """The epoch's line in metrics.jsonl (`val` None: not evaluated), with
    its time, since it began or this start (its saves count too)."""
    cumulative_seconds = self.seconds()
    epoch_seconds = cumulative_seconds - self.epoch_began_seconds
    self.epoch_began_seconds = cumulative_seconds
    record = {
        "epoch": epoch + 1,
        "global_step": (epoch + 1) * self.steps_per_epoch,
        # The task's figures: train_loss, train_accuracy, ...
        **{f"train_{name}": value for name, value in train.figures.items()},
        "train_examples": train.examples,
        **{f"val_{name}": val.figures[name] if val else None
           for name in train.figures},
        "learning_rate": learning_rate,
        "images_per_sec": self.steps_run * self.global_batch / train_seconds,
        # Rank 0's split of the train time: a large input share means the
        # input pipeline, not the step, bounds the run.
        "input_seconds": self.times.input_seconds,
        "step_seconds": self.times.step_seconds,
        "epoch_seconds": epoch_seconds,
        "cumulative_seconds": cumulative_seconds,
        "world_size": self.world.size,
        "skipped_steps": skipped_steps,
        "epochs": self._epochs,
        "best_metric": self._best_metric,
        "time": round(time.time(), 3),
    }
    self.history.append(record)
    return record

  def position(self, epoch: int, step: int,
               seconds: Optional[float] = None) -> checkpoint.Position:
    """`step` steps of `epoch` done on these processes, at the run's time
    `seconds` (now, by default)."""
    return checkpoint.Position(
        epoch, step, self.global_batch, self.world.size,
        self.seconds() if seconds is None else seconds)

  def run_state(self, position: checkpoint.Position) -> RunState:
    """The run state at `position`, for a commit."""
    return RunState(position=position,
                    epoch_began_seconds=self.epoch_began_seconds,
                    epoch_sums=self.epoch_sums, history=tuple(self.history))

  def on_chief(self, action: Callable[[RunDirectory], Any],
               name: str) -> Any:
    """`action(directory)` on rank 0, which owns model_dir; every rank gets
    its result, or its error (a failed write stops every rank alike)."""
    directory = self.directory
    return distributed.on_chief(
        directory and functools.partial(action, directory), name=name)

  def close(self) -> None:
    self.profiler.close()
    self.stop_requests.uninstall()
    self.reporter.close()
