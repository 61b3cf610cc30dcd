"""Early stopping at a target, as the Horovod lab's StopAtAccuracy.

The target is a value of the task's deciding validation figure (accuracy
for classification; --best_metric, e.g. val_mae:min, for any task). The
decision is taken on that figure reduced across ranks, the
same number on every rank, so all ranks stop after the same epoch: a rank
that stopped alone would leave the others waiting at their next allreduce.

Its count is part of the run's state (engine/loop/run_state.py), which
moves it on as it records each epoch (LoopState.end_epoch): it is kept in
variables, which the checkpoints save and restore and an elastic commit
copies, so a resumed run goes on counting where it stopped, a rollback
forgets the epochs it undid, and the first time the target was reached
(the time-to-accuracy figure) survives both.
"""
from typing import Optional

import tensorflow as tf

_NOT_REACHED = -1


class Target(tf.Module):
  """Stops after `patience` consecutive epochs at or beyond `target`:
  above it, or below it with `minimize` (an error, say).

  Remembers when the target was first reached (epoch and cumulative seconds),
  the time-to-accuracy figure scaling studies compare.
  """

  def __init__(self, target: float, patience: int, minimize: bool = False):
    super().__init__(name="target")
    self.target = target  # 0: never stop early
    self.patience = patience
    self._minimize = minimize
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

  def update(self, *, epoch: int, value: float,
             cumulative_seconds: float) -> bool:
    """Records one epoch's figure; returns whether to stop now."""
    if not self.target:
      return False
    if (value <= self.target if self._minimize else value >= self.target):
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
