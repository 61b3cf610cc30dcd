"""One run state: where a run stands, which every way of continuing reads.

A run continues in three ways, and each must pick up exactly where the run
stood: a resume (a new job, from rank 0's checkpoint), a rollback (after a
non-finite step, from the last good checkpoint) and an elastic reset (after
a change of workers, from the last commit in host memory). What they
continue from is split by where it lives:

* In variables, which every rank holds alike, the checkpoints save and an
  elastic commit copies: the weights, the optimizer, the learning rate's
  factor (lowered by rollbacks), the weights' average, the early stopping
  count (stopping.Target), and the run's counts as a checkpoint keeps them
  (`Counts`). engine/loop/loop.py's TrainLoop lists them in one place
  (`variables()`).
* In a `RunState`: the position in the data and the run's clock, what the
  epoch has counted so far (its train sums and skipped steps), the
  rollbacks, and for an elastic commit the epochs' records. A checkpoint
  keeps all but the records; the loop builds a RunState in one place and
  commits it in one place.

`LoopState` owns all of it while the run moves on: the loop changes the
learning rate's factor, the early stopping count and the counts through
its methods only, so a resumed run stops, rolls back and reports as the
run that went on would have.
"""
import dataclasses
import time
from typing import Callable, Optional

from absl import logging
import numpy as np

import tensorflow as tf

from engine.compute import metrics
from engine.compute import optimizers
from engine.loop import stopping
from engine.records.checkpoint import Position

# The sums of an epoch before its first step (metrics.Totals): a zero that
# adds to the task's sums of any shape.
NO_EXAMPLES = np.zeros(())


@dataclasses.dataclass(frozen=True)
class RunState:
  """Where training stands, between two steps.

  `position.seconds` is the run's clock at that point (training,
  evaluation and saving, over every start); `epoch_began_seconds` the clock
  when the position's epoch began, so that epoch's time is whole after a
  reset. `epoch_sums` are the train figures of the epoch's steps before the
  position, and `skipped_steps` the steps of it the float16 loss scaler
  skipped, so a reset or a resume counts each step once; `rollbacks` those
  of the run so far (--max_rollbacks); `stopped_at_epochs`, the run's
  --epochs when it decided to stop at the position's epoch end
  (`LoopState.stop`; 0: it did not), which makes that end final: a later
  start trains nothing unless it asks for more epochs than that.
  """
  position: Position
  epoch_began_seconds: float
  epoch_sums: np.ndarray = dataclasses.field(
      default_factory=NO_EXAMPLES.copy)
  history: tuple = ()  # the epochs' metrics.jsonl records
  skipped_steps: int = 0
  rollbacks: int = 0
  stopped_at_epochs: int = 0

  @classmethod
  def at(cls, position: Position,
         counts: Optional["Counts"] = None) -> "RunState":
    """The state a checkpoint gives: its position and clock, and its
    `counts` (restored); the epoch's time is counted again from its
    step."""
    if counts is None:
      return cls(position=position, epoch_began_seconds=position.seconds)
    return cls(position=position, epoch_began_seconds=position.seconds,
               epoch_sums=counts.epoch_sums.numpy(),
               skipped_steps=int(counts.skipped_steps.numpy()),
               rollbacks=int(counts.rollbacks.numpy()),
               stopped_at_epochs=int(counts.stopped_at_epochs.numpy()))

  @classmethod
  def beginning(cls, global_batch: int, world_size: int) -> "RunState":
    """A new run's state: nothing done, no time spent."""
    return cls.at(Position(0, 0, global_batch, world_size))


class Counts(tf.Module):
  """What a checkpoint keeps of the run's counts (RunState's): the epoch's
  train sums and skipped steps up to its position, the rollbacks, and
  the --epochs of a run that stopped there (0: none).

  A copy, written before each save (LoopState.keep) and read at a start
  and a rollback: the counts themselves move on in LoopState. A checkpoint
  written before they were kept restores them as nothing counted
  (`reset`): the epoch's figures then count from its step.
  """

  def __init__(self, sums_size: int):
    super().__init__(name="run_counts")
    self.epoch_sums = tf.Variable(tf.zeros([sums_size], tf.float64),
                                  trainable=False)
    self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.rollbacks = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.stopped_at_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)

  def reset(self) -> None:
    self.epoch_sums.assign(tf.zeros_like(self.epoch_sums))
    self.skipped_steps.assign(0)
    self.rollbacks.assign(0)
    self.stopped_at_epochs.assign(0)


def starting_point(position: Position, steps_per_epoch: int,
                   global_batch: int, world_size: int) -> tuple[int, int]:
  """The (epoch, step) to continue from, in this run's steps.

  With another number of processes (or batch size) the global batch
  differs, so the steps done so far in the epoch are converted through the
  examples they covered.
  """
  step = position.step
  if position.global_batch != global_batch:
    step = position.step * position.global_batch // global_batch
    logging.info("continuing on %d processes (was %d): global batch %d "
                 "(was %d), %d steps per epoch; the learning rate is "
                 "rescaled; step %d of the epoch becomes step %d", world_size,
                 position.world_size, global_batch, position.global_batch,
                 steps_per_epoch, position.step, step)
  # A stop after an epoch's last step resumes with no steps left in it: the
  # epoch is still evaluated and recorded.
  return position.epoch, min(step, steps_per_epoch)


class LoopState:
  """The run's state as the train loop moves it on, and its one owner:
  the loop changes it through these methods only.

  One step counter: the optimizer's `iterations` (as Orbit's global step),
  which every step taken advances (one the loss scaler or a non-finite
  check skipped too) and which the learning-rate schedule reads. The
  position in the data derives from it and the epoch being trained:
  `step` = `global_step` - `epoch` * `steps_per_epoch`, so an epoch whose
  steps are all done but which is not yet evaluated and recorded is
  (epoch, steps_per_epoch), never (epoch + 1, 0).

  The train step counts the steps it takes since the epoch began or was
  last committed (its running sums and skipped steps, which `committed`,
  `keep` and `end_epoch` are given); this state holds what the epoch
  counted before, and takes them in at a commit and at the epoch's end.

  Each start of the loop (engine/loop/loop.py's TrainLoop._begin) makes
  one from the RunState it continues from, which its Session
  (session.py) holds; a commit, a checkpoint and a rollback read and set
  it as a whole (`snapshot`, `position` and `keep`, `roll_back`).
  """

  def __init__(self, *, optimizer, learning_rate, start: RunState,
               steps_per_epoch: int, global_batch: int, world_size: int,
               gradient_bytes: int, epochs: int, best_metric: str,
               stop: Optional[stopping.Target] = None,
               counts: Optional[Counts] = None):
    """`learning_rate`: the schedule of the step, whose factor rollbacks
    lower; `best_metric`: the deciding figure, as "val_accuracy:max",
    which each epoch's record names for engine.runs; `gradient_bytes`: an
    update's allreduce, which the records give engine.runs' scaling model;
    `stop`: the early stopping count (none: never stops early); `counts`:
    the checkpoints' copy of the counts (none: not checkpointed)."""
    self._optimizer = optimizer
    self._learning_rate = learning_rate
    self._stop = stop or stopping.Target(target=0, patience=0)
    self._counts = counts
    self.steps_per_epoch = steps_per_epoch
    self.global_batch = global_batch
    self.world_size = world_size
    self._gradient_bytes = gradient_bytes
    self._epochs = epochs
    self._best_metric = best_metric
    self._history = list(start.history)
    self._epoch_sums = start.epoch_sums  # of steps committed before
    self._skipped_steps = start.skipped_steps  # committed before too
    self._rollbacks = start.rollbacks
    self._stopped_at_epochs = start.stopped_at_epochs
    self._epoch_began_seconds = start.epoch_began_seconds
    self._began = time.perf_counter()
    self._seconds_before = start.position.seconds  # before this start
    self._continue_at(*starting_point(start.position, steps_per_epoch,
                                      global_batch, world_size))

  # Where the run stands.

  @property
  def global_step(self) -> int:
    """The steps taken over the run: the optimizer's step counter."""
    return optimizers.step(self._optimizer)

  @property
  def epoch(self) -> int:
    """The epoch being trained (or done and not yet recorded), from 0."""
    return self._epoch

  @property
  def step(self) -> int:
    """The steps of the epoch being trained that are done."""
    return self.where()[2]

  def where(self) -> tuple[int, int, int]:
    """(global_step, epoch, step) from one read of the step counter."""
    global_step = self.global_step
    return (global_step, self._epoch,
            global_step - self._epoch * self.steps_per_epoch)

  @property
  def first_step(self) -> int:
    """The step of the epoch its training began from, in this start (or
    since a rollback): 0 but in the epoch a run continues in."""
    return self._first_step

  @property
  def history(self) -> tuple:
    """The epochs' metrics.jsonl records."""
    return tuple(self._history)

  @property
  def stopped(self) -> bool:
    """Whether the run decided to stop (`stop`), in this start or in one
    before that had as many --epochs as this one: it trains no further
    epoch. (More --epochs than it stopped with train on, as they do for
    a run whose epochs ran out.)"""
    return 0 < self._epochs <= self._stopped_at_epochs

  def stop(self) -> None:
    """The run stops at this epoch's end for good (its --target reached,
    a Keras callback's stop_training, its study's pruning): the next
    checkpoint says so, so a second start into the run with the same
    --epochs trains nothing and leaves its checkpoints as they are."""
    self._stopped_at_epochs = self._epochs

  @property
  def rollbacks(self) -> int:
    """The run's rollbacks so far (--max_rollbacks)."""
    return self._rollbacks

  @property
  def learning_rate_factor(self) -> float:
    """What rollbacks multiplied the learning rate by."""
    return float(self._learning_rate.factor.numpy())

  def learning_rate(self) -> float:
    """The rate of the last step taken, as the optimizer applied it."""
    return float(self._learning_rate(self.global_step - 1))

  def seconds(self) -> float:
    """The run's time so far: before this start, and since."""
    return self._seconds_before + time.perf_counter() - self._began

  def position(self, seconds: Optional[float] = None) -> Position:
    """Where the run stands, at the run's time `seconds` (now, by
    default): what a checkpoint saves."""
    return Position(self.epoch, self.step, self.global_batch,
                    self.world_size,
                    self.seconds() if seconds is None else seconds)

  def snapshot(self, seconds: Optional[float] = None) -> RunState:
    """The run state now, for a commit."""
    return RunState(position=self.position(seconds),
                    epoch_began_seconds=self._epoch_began_seconds,
                    epoch_sums=self._epoch_sums, history=self.history,
                    skipped_steps=self._skipped_steps,
                    rollbacks=self._rollbacks,
                    stopped_at_epochs=self._stopped_at_epochs)

  def epoch_sums(self, since_commit: np.ndarray) -> np.ndarray:
    """The epoch's train sums: those committed before, and `since_commit`
    (the train step's running sums over every rank)."""
    return self._epoch_sums + since_commit

  def keep(self, sums: np.ndarray = NO_EXAMPLES,
           skipped_steps: int = 0) -> None:
    """Before a checkpoint is saved: its copy of the counts (Counts), with
    the train step's `sums` (over every rank) and `skipped_steps` since
    the commit (none at an epoch's end, recorded already)."""
    if self._counts is None:
      return
    self._counts.epoch_sums.assign(np.broadcast_to(
        self.epoch_sums(sums), self._counts.epoch_sums.shape))
    self._counts.skipped_steps.assign(self._skipped_steps + skipped_steps)
    self._counts.rollbacks.assign(self._rollbacks)
    self._counts.stopped_at_epochs.assign(self._stopped_at_epochs)

  # How it moves on.

  def committed(self, sums: np.ndarray, skipped_steps: int = 0) -> None:
    """A commit within the epoch took the steps' sums and skipped steps so
    far with it (counted once, if a restart redoes the steps after it)."""
    self._epoch_sums = self._epoch_sums + sums
    self._skipped_steps += skipped_steps

  def end_epoch(self, train: metrics.Result, val: Optional[metrics.Result],
                *, train_seconds: float, input_seconds: float,
                step_seconds: float, eval_seconds: Optional[float],
                skipped_steps: int) -> dict:
    """Records the epoch that is done (`val` None: not evaluated; if it
    was, its deciding figure counts for early stopping) and moves on to
    the next; returns its line in metrics.jsonl, with its time since it
    began or since this start (its saves count too), and whether the run
    stops early (`stopped_early`). `skipped_steps`: the train step's since
    the commit."""
    cumulative_seconds = self.seconds()
    epoch_seconds = cumulative_seconds - self._epoch_began_seconds
    steps_run = self.steps_per_epoch - self._first_step
    record = {
        "epoch": self.epoch + 1,
        "global_step": self.global_step,
        # The task's figures: train_loss, train_accuracy, ...
        **{f"train_{name}": value for name, value in train.figures.items()},
        "train_examples": train.examples,
        **{f"val_{name}": val.figures[name] if val else None
           for name in train.figures},
        # The rate of the epoch's last update.
        "learning_rate": self.learning_rate(),
        "images_per_sec": steps_run * self.global_batch / train_seconds,
        "steps_run": steps_run,  # since the epoch began or this start
        # Rank 0's split of the train time: a large input share means the
        # input pipeline, not the step, bounds the run.
        "input_seconds": input_seconds,
        "step_seconds": step_seconds,
        # The evaluation's, at the epoch's end (None: not evaluated).
        "eval_seconds": eval_seconds,
        "epoch_seconds": epoch_seconds,
        "cumulative_seconds": cumulative_seconds,
        "world_size": self.world_size,
        "global_batch": self.global_batch,
        "gradient_bytes": self._gradient_bytes,
        "skipped_steps": self._skipped_steps + skipped_steps,
        "epochs": self._epochs,
        "best_metric": self._best_metric,
        "time": round(time.time(), 3),
    }
    record.update(self._stopping(record))
    self._history.append(record)
    self._epoch_began_seconds = cumulative_seconds
    self._epoch_sums = NO_EXAMPLES
    self._skipped_steps = 0
    self._epoch += 1
    self._first_step = 0
    return record

  def _stopping(self, record: dict) -> dict:
    """The early stopping count moved on by the epoch's deciding figure,
    if it was evaluated: what the epoch's record says of it."""
    value = record[self._best_metric.partition(":")[0]]
    fields = {}
    if value is not None and self._stop.update(
        epoch=record["epoch"], value=value,
        cumulative_seconds=record["cumulative_seconds"]):
      fields["stopped_early"] = True
    if self._stop.target:
      fields["target_accuracy_first_epoch"] = self._stop.first_reached_epoch
      fields["target_accuracy_first_seconds"] = \
          self._stop.first_reached_seconds
    return fields

  def roll_back(self, restore: Callable[[], tuple[Position, str]],
                lr_factor: float) -> str:
    """Back at a checkpoint, which `restore()` restores into the variables
    on every rank (the early stopping count as it was then, the counts)
    and whose position and path it returns: its epochs' records kept, the
    epoch's counts as they were there; one more rollback, and the learning
    rate multiplied by `lr_factor` from now on. The run's clock goes on:
    the time of the undone steps was spent. Returns the path."""
    factor = self.learning_rate_factor * lr_factor
    position, path = restore()
    self._learning_rate.factor.assign(factor)
    self._rollbacks += 1
    self._continue_at(*starting_point(position, self.steps_per_epoch,
                                      self.global_batch, self.world_size))
    self._history = [r for r in self._history if r["epoch"] <= self._epoch]
    restored = RunState.at(position, self._counts)
    self._epoch_sums = restored.epoch_sums
    self._skipped_steps = restored.skipped_steps
    return path

  def _continue_at(self, epoch: int, step: int) -> None:
    self._epoch = epoch
    self._first_step = step
    optimizers.set_step(self._optimizer, epoch * self.steps_per_epoch + step)
