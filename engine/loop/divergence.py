"""A step that was not finite: the run stops with Diverged, or rolls back
to its last good checkpoint (--on_nonfinite=rollback, at most
--max_rollbacks times), with the learning rate multiplied by
--rollback_lr_factor from then on: what practitioners do by hand after a
loss spike.

The step was not applied, on any rank, and every rank learns of it after
the same step (step_outcome.NonFinite), so every rank takes the same way.
"""
from typing import Callable

from absl import logging
import tensorflow as tf

from engine import distributed
from engine.compute.step_outcome import NonFinite
from engine.core.config import FaultConfig
from engine.core.errors import Diverged
from engine.loop.run_state import RunState
from engine.loop.session import Session


class Divergence:
  """What the loop does after a step that was not finite."""

  def __init__(self, faults: FaultConfig,
               variables: Callable[[], list[tf.Variable]],
               commit: Callable[[RunState], None]):
    """`variables`: what a restored checkpoint gives every rank (the
    loop's); `commit`: the loop's one commit path (under --elastic)."""
    self._faults = faults
    self._variables = variables
    self._commit = commit

  def __call__(self, session: Session, nonfinite: NonFinite) -> None:
    """Rolls back, or raises Diverged naming the step, the rate and the
    last good checkpoint (the step counter counted the step)."""
    faults, state = self._faults, session.state
    what = (f"at global step {state.global_step} (epoch {state.epoch + 1}, "
            f"step {state.step}) with learning rate "
            f"{state.learning_rate():.4g}: {nonfinite}")
    rolling_back = faults.on_nonfinite == "rollback"
    if rolling_back and state.rollbacks < faults.max_rollbacks:
      self._roll_back(session, what)
      return
    latest = session.on_chief(
        lambda directory: directory.checkpoints.latest_path, name="latest")
    kept = (f"nothing was saved after {latest}, the last good checkpoint"
            if latest else "no checkpoint was saved")
    advice = (f"{state.rollbacks} rollbacks (--max_rollbacks) did not get "
              "past it; lower --base_lr" if rolling_back else
              "lower --base_lr, or pass --on_nonfinite=rollback")
    raise Diverged(f"training diverged {what}; the step was not applied and "
                   f"{kept}; {advice}")

  def _roll_back(self, session: Session, what: str) -> None:
    """Back to the last good checkpoint: rank 0 restores it, every rank
    receives it (weights, optimizer, the early stopping count and the
    run's counts as they were then); the run's state goes on from it."""
    state = session.state
    diverged_at_step = state.global_step

    def restore():
      position, path = session.on_chief(
          lambda directory: directory.roll_back(), name="rollback")
      distributed.broadcast_from_chief(self._variables())
      return position, path

    path = state.roll_back(restore, self._faults.rollback_lr_factor)
    session.read_from_state()
    factor = state.learning_rate_factor
    logging.warning("rolling back %s; back to %s (global step %d), learning "
                    "rate x%g from now on (rollback %d of at most %d)", what,
                    path, state.global_step, factor, state.rollbacks,
                    self._faults.max_rollbacks)
    record = {"event": "rollback", "epoch": state.epoch,
              "global_step": state.global_step,
              "diverged_at_step": diverged_at_step, "checkpoint": path,
              "learning_rate_factor": factor, "rollback": state.rollbacks}
    session.on_chief(lambda directory: directory.record_rollback(record),
                     name="record_rollback")
    # The run's clock goes on: the time of the undone steps was spent.
    self._commit(state.snapshot())
