"""The train step's phases on this rank's own clock, measured inside the
compiled step: what the step report of a profiled window splits each
step into (engine/loop/profiling.py).

Neither of the usual sources says it per rank. Horovod's timeline is rank
0's, and once its response cache answers it no longer marks when each rank
was ready; TensorFlow's trace shows Horovod's asynchronous op only as it is
handed over, not its wait. So the step timed in a profiled window is traced
a second time with a `StepClock`: the step runs each phase in
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

import tensorflow as tf

# In the order a step runs them. `input` is timed in the graph only where
# the call reads its batches itself (several steps a call). Backward ends
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
