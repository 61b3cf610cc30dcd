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
import itertools
import os
import time
from typing import Optional

from absl import logging
import tensorflow as tf

from engine import distributed
from engine.core import run_files
from engine.distributed import link_probe as link_probe_lib
from engine.loop import actions
from engine.records import horovod_timeline
from engine.records import link_levels
from engine.records import report
from engine.records import step_advice
from engine.records import step_report
from engine.records import step_table
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

  def waited_for_input(self, seconds: float) -> None:
    """Of the step's time, what it waited for its batches (stamped in the
    step: TrainStep.train) goes to the input's."""
    self.input_seconds += seconds
    self.step_seconds -= seconds

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
  """Profiles windows of global steps: `steps`, (first, last) pairs
  (1-based, inclusive), again every `every` steps if given.

  Wrap each call (its input and the step) in `step(global_step)`, run it
  as an action after the calls it says (engine/loop/actions.py), call
  `start_epoch()` as each epoch begins, `finish()` when the loop ends with
  every rank (a window the run's end cut short is reported then), and
  `close()` when the loop ends, however it ends: a run that stops or fails
  inside a window still closes its trace. Rank 0 writes model_dir/profile;
  with `all_ranks`, every rank writes its own (run_files.profile_dir).
  Horovod's timeline records the first window. `settings`: what the run
  does, for the report (step_advice.Settings); `link_probe`, if given,
  times each level of the links at each window's end (every rank's).

  Inside a window the calls are the run's own, --steps_per_call steps
  each, reading their batches inside (`timed`).
  """

  def __init__(self, model_dir: str, *, steps: tuple, rank: int,
               all_ranks: bool, timeline: bool,
               settings: step_advice.Settings, every: int = 0,
               host: str = "", local_rank: int = 0,
               link_probe: Optional[link_probe_lib.LinkProbe] = None,
               reporter: Optional[report.Reporter] = None):
    self._windows = _windows(list(zip(steps[::2], steps[1::2])), every)
    self._first, self._last = next(self._windows, (0, -1))
    self._traces = bool(steps) and (rank == 0 or all_ranks)
    self._logdir = run_files.profile_dir(model_dir, rank)
    self._rank = rank
    # Every rank starts and stops the timeline (a collective setting);
    # Horovod's coordinator, rank 0, writes it.
    self._timeline = os.path.join(model_dir, run_files.TIMELINE_FILE) if (
        steps and timeline) else None
    self._tracing = False
    self._last_trace_written = range(0)  # the seconds the last trace was
    self._model_dir = model_dir
    self.timing = False  # inside a call of a window: `timed` runs it
    # Each timed call: its parts in seconds a step (step_report.of_rank).
    self._timed_calls = []
    self._global_step = None  # the first of the call `step` is around
    # When the previous timed call returned; None after an epoch's end (its
    # evaluation and save are not the host's time between calls).
    self._call_ended = None
    self._settings = settings
    self._where = dict(host=host, local_rank=local_rank)
    self._link_probe = link_probe
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
    next window (up to it), and within a window each step at one step a
    call (each traced step marked with its number), else its last; None
    after the last window."""
    self._window_after(global_step)
    if global_step + 1 < self._first:
      return self._first - 1
    if global_step < self._last:
      return global_step + 1 if (
          self._settings.performance.steps_per_call == 1) else self._last
    return None

  def run(self, at: actions.At) -> None:
    """Ends the trace after a window's last step, and reports it."""
    if at.global_step >= self._last:
      self._end()

  def _window_after(self, global_step: int) -> None:
    """The window in effect after `global_step`: the first that has not
    ended, or the last if all have."""
    while global_step >= self._last:
      upcoming = next(self._windows, None)
      if upcoming is None:
        return
      self._first, self._last = upcoming

  def timed(self, train_step, count: int, stop_requested: bool):
    """One call of the window, as the run makes it, timed part by part
    (the step's phases on its own clock, the batches' reading its
    `input`: TrainStep.train); the call's steps.Trained."""
    traces = train_step.timed_traces
    began, began_at = time.perf_counter(), time.time()
    trained = train_step.train(count, stop_requested, timed=True)
    phases, ran = trained.phases, trained.steps
    ended, ended_at = time.perf_counter(), time.time()
    between = began - self._call_ended if self._call_ended else None
    self._call_ended = ended
    graph = sum(phases.values())
    parts = dict(phases, between_calls=between,
                 launch_and_read=ended - began - graph)
    self._timed_calls.append(dict(
        {part: None if seconds is None else seconds / max(1, ran)
         for part, seconds in parts.items()},
        global_step=self._global_step, steps=ran, graph=graph / max(1, ran),
        traced=train_step.timed_traces > traces, span=(began_at, ended_at)))
    return trained

  @contextlib.contextmanager
  def step(self, global_step: int):
    """Around the call whose first step is `global_step` (1-based)."""
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
    """The trace stopped, and the calls timed reported."""
    self._stop()
    if self._timed_calls:
      self._report()
    self._timeline = None  # the first window's

  def _report(self) -> None:
    """Every rank's window gathered on rank 0, which makes the report,
    writes it, logs its table, and gives its figures to TensorBoard. A
    call that traced the timed step is left out, unless it is the only
    one."""
    calls = [c for c in self._timed_calls if not c["traced"]] or (
        self._timed_calls)
    self._timed_calls = []
    probed = self._link_probe.probe(link_levels.probe_bytes(
        self._settings.gradient_bytes, hosts=distributed.hosts()[0],
        link=self._settings.link)) if self._link_probe else None
    ranks = distributed.gathered_on_chief(
        step_report.of_rank(calls, **self._where, link_probe=probed,
                            profiled=self._traces),
        name="step_report")
    window = (calls[0]["global_step"],
              calls[-1]["global_step"] + calls[-1]["steps"] - 1)
    def write():
      found = step_report.across(
          ranks, window, self._settings,
          collective=self._collective(calls) if len(ranks) > 1 else None)
      with storage.writing("step report", self._model_dir):
        path = step_report.write(self._model_dir, found)
      text = step_table.table(found)
      logging.info("step report of steps %d-%d in %s:\n%s",
                   *found["window"], path, text)
      if self._reporter:
        self._reporter.step_report(found, text)
    distributed.on_chief(write if self._rank == 0 else None,
                         name="step_report_written")

  def _collective(self, calls: list[dict]) -> Optional[list[float]]:
    """Of a window Horovod's timeline recorded (rank 0 writes it): the
    seconds a step its collectives ran, call by call; None without one,
    or, said in a warning, when it cannot be read."""
    if not self._timeline:
      return None
    try:
      return horovod_timeline.collective_seconds(self._timeline, calls)
    except (OSError, ValueError, LookupError) as e:
      logging.warning("Horovod's timeline %s could not be read (%s): the "
                      "step report's communication is not split into "
                      "negotiation and the collective", self._timeline, e)
      return None

  def _start(self, global_step: int) -> None:
    self._call_ended = None  # the time since the last window is not a call's
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
        # Into a run named by the second it is written in: a window's
        # trace written within the second of the last one's would replace
        # it.
        while int(time.time()) in self._last_trace_written:
          time.sleep(0.05)
        began = int(time.time())
        with storage.writing("profile trace", self._logdir):
          tf.profiler.experimental.stop()
        self._last_trace_written = range(began, int(time.time()) + 1)
    finally:
      if self._timeline:
        distributed.stop_timeline()


def _windows(windows: list[tuple[int, int]], every: int):
  """`windows`, in order, then again `every` steps on, and on (if
  `every`)."""
  for cycle in itertools.count() if every else [0]:
    for first, last in windows:
      yield first + cycle * every, last + cycle * every
