"""Early stopping at a target accuracy, as the Horovod lab's StopAtAccuracy.

The decision is taken on the validation accuracy reduced across ranks, the
same number on every rank, so all ranks stop after the same epoch: a rank
that stopped alone would leave the others waiting at their next allreduce.

Its count is part of the run's state (engine/run_state.py): it is kept in
variables, which the checkpoints save and restore and an elastic commit
copies, so a resumed run goes on counting where it stopped, a rollback
forgets the epochs it undid, and the first time the target was reached
(the time-to-accuracy figure) survives both.
"""
from typing import Optional

import tensorflow as tf

_NOT_REACHED = -1


class TargetAccuracy(tf.Module):
  """Stops after `patience` consecutive epochs at or above `target`.

  Remembers when the target was first reached (epoch and cumulative seconds),
  the time-to-accuracy figure scaling studies compare.
  """

  def __init__(self, target: float, patience: int):
    super().__init__(name="target_accuracy")
    self.target = target  # 0: never stop early
    self.patience = patience
    self._consecutive = tf.Variable(0, dtype=tf.int64, trainable=False)
    self._first_epoch = tf.Variable(_NOT_REACHED, dtype=tf.int64,
                                    trainable=False)
    self._first_seconds = tf.Variable(float(_NOT_REACHED), dtype=tf.float64,
                                      trainable=False)

  @property
  def consecutive(self) -> int:
    return int(self._consecutive.numpy())

  @property
  def first_reached_epoch(self) -> Optional[int]:
    epoch = int(self._first_epoch.numpy())
    return None if epoch == _NOT_REACHED else epoch

  @property
  def first_reached_seconds(self) -> Optional[float]:
    if self.first_reached_epoch is None:
      return None
    return float(self._first_seconds.numpy())

  def update(self, *, epoch: int, val_accuracy: float,
             cumulative_seconds: float) -> bool:
    """Records one epoch's result; returns whether to stop now."""
    if not self.target:
      return False
    if val_accuracy >= self.target:
      self._consecutive.assign_add(1)
      if self.first_reached_epoch is None:
        self._first_epoch.assign(epoch)
        self._first_seconds.assign(cumulative_seconds)
    else:
      self._consecutive.assign(0)
    return self.consecutive >= self.patience

  def reset(self) -> None:
    """Nothing counted: a run that has not reached its target (and what a
    checkpoint saved before this count was restores to)."""
    self._consecutive.assign(0)
    self._first_epoch.assign(_NOT_REACHED)
    self._first_seconds.assign(float(_NOT_REACHED))
