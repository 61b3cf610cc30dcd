"""The train step's phases on this rank's own clock, measured inside the
compiled step: what the step report of a profiled window splits each
step into (engine/loop/profiling.py).

Neither of the usual sources says it per rank. Horovod's timeline is rank
0's, and once its response cache answers it no longer marks when each rank
was ready; TensorFlow's trace shows Horovod's asynchronous op only as it is
handed over, not its wait. So the step timed in a profiled window is traced
a second time with a `StepClock`: a `tf.timestamp()` after each phase, and
each a barrier (the next phase waits for it), so a stamp cannot land late.
Outside the window the step is the one traced without, and holds no stamp.

The phases sum to the graph's time by construction. A rank that waits in
the allreduce for another shows it as communication; the smallest
communication across ranks is about the transfer itself (the report's
part). On a GPU the stamps order the ops' launches, not their completion,
so there the phases are the host's view; the device's own times are in
the profile's trace.
"""
import contextlib

import tensorflow as tf

# In the order a step runs them. Backward ends when the backward pass has
# every gradient, communication when they are reduced: where the backward
# pass hands each gradient to the allreduce as it has it (GPU), what the
# transfers overlap is in backward, and communication is what is left
# exposed after it.
PHASES = ("forward", "backward", "communication", "optimizer")


class StepClock:
  """Stamps for one trace of the step: `started` first, then
  `ended(phase, tensors)` for each of PHASES the step runs, in order."""

  def __init__(self):
    self._stamps = []  # (the phase it ends, or None first; the stamp)

  def started(self, *inputs) -> list:
    """The step's `inputs`, made to wait for its first stamp."""
    self._stamp(None, [])
    return self.gated(inputs)

  def ended(self, phase: str, tensors) -> None:
    """Stamps the end of `phase` once `tensors` (a structure) are
    computed. The next phase waits for the stamp through `gated` or
    `next_phase`."""
    if phase not in PHASES:
      raise ValueError(f"{phase!r} is not one of {PHASES}")
    # (Variables are read here, after what updated them.)
    self._stamp(phase, [tf.convert_to_tensor(t)
                        for t in tf.nest.flatten(tensors) if t is not None])

  def gated(self, tensors) -> list:
    """`tensors` (a sequence), made to wait for the last stamp."""
    with self.next_phase():
      return [None if t is None else tf.identity(t) for t in tensors]

  def next_phase(self):
    """A context whose ops wait for the last stamp: for a phase that does
    not start from a tensor (a tape's backward pass)."""
    return tf.control_dependencies([self._stamps[-1][1]])

  def seconds(self) -> dict:
    """Each phase's seconds in this step, as tensors; a phase the step
    did not stamp is absent."""
    (_, previous), *stamps = self._stamps
    found = {}
    for phase, stamp in stamps:
      found[phase] = found.get(phase, 0.0) + (stamp - previous)
      previous = stamp
    return found

  def _stamp(self, phase, tensors) -> None:
    with tf.control_dependencies([t for t in tensors if t is not None]):
      self._stamps.append((phase, tf.timestamp()))


class NoClock:
  """The step outside a profiled window: no stamp, no op."""

  def started(self, *inputs) -> list:
    return list(inputs)

  def ended(self, phase: str, tensors) -> None:
    pass

  def gated(self, tensors) -> list:
    return list(tensors)

  def next_phase(self):
    return contextlib.nullcontext()
