"""What the host learns of a train step: its status, and in a profiled
window its phases on this rank's own clock.

A step returns an outcome: its status, one integer the host reads per call
(bits: every rank agreed to stop; something was not finite, on some rank),
and the details it reads only when something was not finite: rank 0's
loss, the share of ranks whose loss was not finite, which gradients were
not, and the float16 loss scale of the step. Every rank computes the same
status after the same step, so all take the same way after it.

The phases (`StepClock`) are what the step report of a profiled window
splits each step into (engine/loop/profiling.py). Neither of the usual
sources says it per rank. Horovod's timeline is rank 0's, and once its
response cache answers it no longer marks when each rank was ready;
TensorFlow's trace shows Horovod's asynchronous op only as it is handed
over, not its wait. So the step timed in a profiled window is traced a
second time with a `StepClock`: the step runs each phase in
`clock.phase(name)`, which stamps `tf.timestamp()` at its end. The stamp
waits on every op the phase made, its side effects too (BatchNorm's moving
statistics, the metrics' sums), and every op of the next phase waits on
the stamp, so a phase's work cannot be booked under its neighbour. Outside
the window the step is the one traced with `NoClock`, and holds no stamp.

The phases sum to the graph's time by construction. A rank that waits in
the allreduce for another shows it as communication; the smallest
communication across ranks is about the transfer itself (the report's
part). On a GPU the stamps order the ops' launches, not their completion,
so there the phases are the host's view; the device's own times are in
the profile's trace.
"""
import contextlib
from typing import Optional

import tensorflow as tf

from engine import distributed

STOP_AGREED = 1
NONFINITE = 2
_NAMES_SHOWN = 3  # the variables named of those not finite


class NonFinite(Exception):
  """A step whose loss or gradients were not finite, on some rank; it was
  not applied. Raised on every rank after the same step: the call's
  `step`-th (1-based; a call of `TrainStep.train` takes several)."""

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


# The phases.

# In the order a step runs them; `input` is reading the step's batch, in
# the graph (the step owns its iterator: TrainStep.train). Backward ends
# when the backward pass has every gradient, communication when they are
# reduced: where the backward pass hands each gradient to the allreduce as
# it has it (GPU), what the transfers overlap is in backward, and
# communication is what is left exposed after it. A task's own train step
# (engine/tasks/task.py) is one phase, `task_step`: what it does inside is
# the task's.
PHASES = ("input", "forward", "backward", "communication", "optimizer",
          "task_step")


class StepClock:
  """Stamps for one trace of the step (or of one step in a call of
  several): `phase(name)` around each phase, in order; `seconds()` after
  the last."""

  def __init__(self, after=()):
    """Its first stamp once `after` (tensors: what the previous step of
    the call gave) are computed."""
    with tf.control_dependencies(list(after)):
      self._stamps = [tf.timestamp()]
    self._phases = []

  @contextlib.contextmanager
  def phase(self, name: str, *, overlaps_previous: bool = False):
    """A phase of the step: what is made inside waits for the previous
    phase's stamp, unless it `overlaps_previous` (the allreduces the
    backward pass feeds as it goes); its own stamp waits on all of it."""
    if name not in PHASES:
      raise ValueError(f"{name!r} is not one of {PHASES}")
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    waits = [] if overlaps_previous else [self._stamps[-1]]
    with tf.control_dependencies(waits):
      yield
    with tf.control_dependencies(graph.get_operations()[first:]):
      self._stamps.append(tf.timestamp())
    self._phases.append(name)

  def seconds(self) -> dict:
    """Each phase's seconds in this step, as tensors; a phase the step
    did not run is absent."""
    found = {}
    for name, start, end in zip(self._phases, self._stamps,
                                self._stamps[1:]):
      found[name] = found.get(name, 0.0) + (end - start)
    return found


class NoClock:
  """The step outside a profiled window: no stamp, no op."""

  def phase(self, name: str, *, overlaps_previous: bool = False):
    del name, overlaps_previous
    return contextlib.nullcontext()


NO_CLOCK = NoClock()
