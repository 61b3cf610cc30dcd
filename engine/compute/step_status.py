"""A train step's status: what the host learns of each step, and the words
for a step that was not finite.

A step returns an outcome: its status, one integer the host reads per call
(bits: every rank agreed to stop; something was not finite, on some rank),
and the details it reads only when something was not finite: rank 0's
loss, the share of ranks whose loss was not finite, which gradients were
not, and the float16 loss scale of the step. Every rank computes the same
status after the same step, so all take the same way after it.
"""
from typing import Optional

import tensorflow as tf

from engine import distributed

STOP_AGREED = 1
NONFINITE = 2
_NAMES_SHOWN = 3  # the variables named of those not finite


class NonFinite(Exception):
  """A step whose loss or gradients were not finite, on some rank; it was
  not applied. Raised on every rank after the same step: the call's
  `step`-th (1-based; a call of `TrainStep.steps` takes several)."""

  def __init__(self, what: str, step: int = 1):
    super().__init__(what)
    self.step = step


def outcome(*, stop_share, finite, loss, nonfinite_loss_share,
            gradients_finite, loss_scale) -> dict:
  """A step's outcome, from the shares of ranks that asked to stop and
  whose loss was not finite, and whether the step was `finite`."""
  status = (tf.cast(stop_share > 0, tf.int32) * STOP_AGREED
            + tf.cast(tf.logical_not(finite), tf.int32) * NONFINITE)
  return dict(status=status, loss=tf.cast(loss, tf.float32),
              nonfinite_loss_share=nonfinite_loss_share,
              gradients_finite=gradients_finite, loss_scale=loss_scale)


def no_outcome(gradient_checks: int) -> dict:
  """What a step returns, before any step: a status of 0, with
  `gradient_checks` gradients' finiteness."""
  return dict(status=tf.constant(0), loss=tf.constant(0.0),
              nonfinite_loss_share=tf.constant(0.0),
              gradients_finite=tf.ones([gradient_checks], tf.bool),
              loss_scale=tf.constant(0.0))


def described(outcome_read: dict, names: Optional[list]) -> str:
  """What was not finite: the loss, on how many ranks, and which gradients
  (the first few of the variables `names`; None: the outcome checks the
  gradients of a task's own step together)."""
  parts = []
  rank, size = distributed.rank_and_size()
  ranks = round(float(outcome_read["nonfinite_loss_share"]) * size)
  if ranks:
    parts.append(f"the loss was non-finite on {ranks} of {size} "
                 f"processes (rank {rank}'s: "
                 f"{float(outcome_read['loss']):g})")
  finite = outcome_read["gradients_finite"].numpy()
  if not finite.all():
    parts.append(_gradients_described(finite, names))
  return " and ".join(parts)


def _gradients_described(finite, names: Optional[list]) -> str:
  if names is None:
    return "the gradients of the task's step were non-finite"
  names = [name for name, ok in zip(names, finite) if not ok]
  shown = ", ".join(names[:_NAMES_SHOWN])
  more = ", ..." if len(names) > _NAMES_SHOWN else ""
  return (f"the gradients of {len(names)} of {len(finite)} variables were "
          f"non-finite ({shown}{more})")
