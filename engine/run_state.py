"""One run state: where a run stands, which every way of continuing reads.

A run continues in three ways, and each must pick up exactly where the run
stood: a resume (a new job, from rank 0's checkpoint), a rollback (after a
non-finite step, from the last good checkpoint) and an elastic reset (after
a change of workers, from the last commit in host memory). What they
continue from is split by where it lives:

* In variables, which every rank holds alike, the checkpoints save and an
  elastic commit copies: the weights, the optimizer, the learning rate's
  factor (lowered by rollbacks), the weights' average, and the early
  stopping count (stopping.Target). The train loop lists them in
  one place (`variables()`).
* In a `RunState`: the position in the data and the run's clock, and for
  an elastic commit, what the epoch has counted so far and the epochs'
  records. A checkpoint keeps the position and the clock; the loop builds a
  RunState in one place and commits it in one place.
"""
import dataclasses

from absl import logging
import numpy as np

from engine.checkpoint import Position

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
  position, so a reset counts each step once.
  """
  position: Position
  epoch_began_seconds: float
  epoch_sums: np.ndarray = dataclasses.field(
      default_factory=NO_EXAMPLES.copy)
  history: tuple = ()  # the epochs' metrics.jsonl records

  @classmethod
  def at(cls, position: Position) -> "RunState":
    """The state a checkpoint gives: its position and clock; the epoch's
    figures and time are counted again from its step."""
    return cls(position=position, epoch_began_seconds=position.seconds)

  @classmethod
  def beginning(cls, global_batch: int, world_size: int) -> "RunState":
    """A new run's state: nothing done, no time spent."""
    return cls.at(Position(0, 0, global_batch, world_size))


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
