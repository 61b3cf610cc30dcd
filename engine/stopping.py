"""Early stopping at a target accuracy, as the Horovod lab's StopAtAccuracy.

The decision is taken on the validation accuracy reduced across ranks, the
same number on every rank, so all ranks stop after the same epoch: a rank
that stopped alone would leave the others waiting at their next allreduce.
"""
import dataclasses
from typing import Optional


@dataclasses.dataclass
class TargetAccuracy:
  """Stops after `patience` consecutive epochs at or above `target`.

  Remembers when the target was first reached (epoch and cumulative seconds),
  the time-to-accuracy figure scaling studies compare.
  """
  target: float  # 0: never stop early
  patience: int
  consecutive: int = 0
  first_reached_epoch: Optional[int] = None
  first_reached_seconds: Optional[float] = None

  def update(self, *, epoch: int, val_accuracy: float,
             cumulative_seconds: float) -> bool:
    """Records one epoch's result; returns whether to stop now."""
    if not self.target:
      return False
    if val_accuracy >= self.target:
      self.consecutive += 1
      if self.first_reached_epoch is None:
        self.first_reached_epoch = epoch
        self.first_reached_seconds = cumulative_seconds
    else:
      self.consecutive = 0
    return self.consecutive >= self.patience
