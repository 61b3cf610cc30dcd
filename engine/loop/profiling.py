"""Where step time goes: each epoch's input/step split, and step traces.

`EpochTimes` splits an epoch's train time into seconds waiting for the next
batch and seconds in the train step, so a glance at the log says whether
the input pipeline or the step bounds the run. `StepProfiler` traces a range
of steps with TensorFlow's profiler (kernels, host threads, the input
pipeline; TensorBoard's Profile tab) and, with `timeline`, Horovod's
timeline (each allreduce's negotiation, wait and transfer; chrome://tracing
or Perfetto). Each traced step is marked with its number, so the profile's
overview shows step times and the trace viewer separates steps. Every
rank also times its own window, step by step, into the step report
(engine/records/step_report.py): rank 0 writes it beside the trace, logs
its table and verdict, and gives its figures to TensorBoard.
"""
import contextlib
import os
import time
from typing import Optional

from absl import logging
import tensorflow as tf

from engine import distributed
from engine.core import run_files
from engine.loop import actions
from engine.records import report
from engine.records import step_report
from engine.records import storage


class EpochTimes:
  """Seconds this rank spent waiting for input and in the step, per epoch,
  and evaluating after it.

  The step's time includes waiting in the allreduce for slower ranks, and
  it is complete: the step returns a value read on the host, so its work
  has finished when the call returns.
  """

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self.input_seconds = 0.0
    self.step_seconds = 0.0
    self.eval_seconds = 0.0

  @contextlib.contextmanager
  def input(self):
    start = time.perf_counter()
    yield
    self.input_seconds += time.perf_counter() - start

  @contextlib.contextmanager
  def step(self):
    start = time.perf_counter()
    yield
    self.step_seconds += time.perf_counter() - start

  @contextlib.contextmanager
  def evaluation(self):
    start = time.perf_counter()
    yield
    self.eval_seconds += time.perf_counter() - start


class StepProfiler(actions.Action):
  """Traces global steps `steps[0]..steps[1]` (inclusive, 1-based).

  Wrap each call (its input and the step) in `step(global_step)`, run it
  as an action after the calls it says (engine/loop/actions.py), call
  `start_epoch()` as each epoch begins, `finish()` when the loop ends with
  every rank (a window the run's end cut short is reported then), and
  `close()` when the loop ends, however it ends: a run that stops or fails
  inside the range still closes its trace. Rank 0 writes model_dir/profile;
  with `all_ranks`, every rank writes its own (run_files.profile_dir).
  `settings`: what the run already does, which the report's verdict does
  not suggest (step_report.verdict).
  """

  def __init__(self, model_dir: str, *, steps: Optional[tuple[int, int]],
               rank: int, all_ranks: bool, timeline: bool,
               settings: Optional[dict] = None,
               reporter: Optional[report.Reporter] = None):
    self._first, self._last = steps or (0, -1)
    self._traces = bool(steps) and (rank == 0 or all_ranks)
    self._logdir = run_files.profile_dir(model_dir, rank)
    self._rank = rank
    # Every rank starts and stops the timeline (a collective setting);
    # Horovod's coordinator, rank 0, writes it.
    self._timeline = os.path.join(model_dir, run_files.TIMELINE_FILE) if (
        steps and timeline) else None
    self._tracing = False
    self._model_dir = model_dir
    self.timing = False  # inside a step of the range: `timed` runs it
    # Each timed step: its global step, and its parts in seconds
    # (step_report.PARTS).
    self._timed_steps = []
    self._global_step = None  # of the step `step` is around
    # When the previous timed call returned; None after an epoch's end (its
    # evaluation and save are not the host's time between calls).
    self._call_ended = None
    self._settings = settings or {}  # the run's, for the suggestions
    self._reporter = reporter  # TensorBoard's writer of the report, if any

  def close(self) -> None:
    self._stop()

  def start_epoch(self) -> None:
    """An epoch begins: its first call is not timed from the last one's."""
    self._call_ended = None

  def finish(self) -> None:
    """The loop ended with every rank: a window cut short by the run's end
    (a stop, early stopping, fewer steps than it names) is reported on
    the steps it timed."""
    self._end()

  def next_due(self, global_step: int) -> Optional[int]:
    """The step after `global_step` that ends a call: the one before the
    traced range (up to it), each within it (each traced step is a call of
    its own, marked with its number); None after it."""
    if global_step + 1 < self._first:
      return self._first - 1
    if global_step < self._last:
      return global_step + 1
    return None

  def run(self, at: actions.At) -> None:
    """Ends the trace after the range's last step, and reports it."""
    if at.global_step >= self._last:
      self._end()

  def timed(self, train_step, batches, stop_requested: bool) -> bool:
    """One step of the range, on the next of `batches`, timed part by part
    (the step's phases by `train_step.timed`); whether the ranks agreed to
    stop."""
    began = time.perf_counter()
    images, labels = next(batches)
    called = time.perf_counter()
    stop_agreed, phases = train_step.timed(images, labels, stop_requested)
    ended = time.perf_counter()
    between = began - self._call_ended if self._call_ended else None
    self._call_ended = ended
    self._timed_steps.append(dict(
        phases, global_step=self._global_step, input=called - began,
        between_calls=between,
        launch_and_read=ended - called - sum(phases.values())))
    return stop_agreed

  @contextlib.contextmanager
  def step(self, global_step: int):
    """Around the call that takes global step `global_step` (1-based)."""
    if not self._first <= global_step <= self._last:
      yield
      return
    if not self._tracing:
      self._start(global_step)
    self._global_step = global_step
    self.timing = True
    try:
      if self._traces:
        with tf.profiler.experimental.Trace("train", step_num=global_step,
                                            _r=1):
          yield
      else:
        yield
    finally:
      self.timing = False

  def _end(self) -> None:
    """The trace stopped, and the steps timed reported."""
    self._stop()
    if self._timed_steps:
      self._report()

  def _report(self) -> None:
    """Every rank's window gathered; rank 0 writes the report, logs its
    table, and gives its figures to TensorBoard. The range's first step
    traces the timed step and is left out, unless it is the only one."""
    steps = self._timed_steps[1:] or self._timed_steps
    self._timed_steps = []
    ranks = distributed.gathered(step_report.of_rank(steps),
                                 name="step_report")
    found = step_report.across(
        ranks, (steps[0]["global_step"], steps[-1]["global_step"]),
        self._settings)
    def write():
      with storage.writing("step report", self._model_dir):
        path = step_report.write(self._model_dir, found)
      text = step_report.table(found)
      logging.info("step report of steps %d-%d in %s:\n%s",
                   *found["window"], path, text)
      if self._reporter:
        self._reporter.step_report(found, text)
    distributed.on_chief(write if self._rank == 0 else None,
                         name="step_report_written")

  def _start(self, global_step: int) -> None:
    if self._traces:
      with storage.writing("profile trace", self._logdir):
        tf.profiler.experimental.start(self._logdir)
    self._tracing = True  # (not if it failed: nothing to stop then)
    if self._timeline:
      distributed.start_timeline(self._timeline)
    logging.info("profiling steps %d to %d into %s%s", global_step,
                 self._last, self._logdir,
                 f" and {self._timeline}" if self._timeline else "")

  def _stop(self) -> None:
    if not self._tracing:
      return
    self._tracing = False
    try:
      if self._traces:  # the trace is written now: a full disk fails here
        with storage.writing("profile trace", self._logdir):
          tf.profiler.experimental.stop()
    finally:
      if self._timeline:
        distributed.stop_timeline()
