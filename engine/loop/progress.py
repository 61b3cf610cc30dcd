"""Progress through an epoch's steps, on the chief.

A bar when the chief writes to a terminal (one process, run by hand); plain
log lines, LOG_LINES_PER_EPOCH of them (one per tenth of the epoch), when
it does not (horovodrun pipes every rank's output, CI, files), so logs
stay readable. The loop calls `step` after every call (an action:
engine/loop/loop.py's cadences); this says when a line is due.
"""
import sys
import time

from absl import logging
import keras

MODES = ("auto", "bar", "log", "none")
_BAR_REFRESH_SECONDS = 0.2
# The log's cadence: a line each time this fraction of an epoch's steps is
# passed (every step of an epoch shorter than this).
LOG_LINES_PER_EPOCH = 10


class Progress:

  def __init__(self, *, mode: str, chief: bool, steps_per_epoch: int,
               epochs: int, global_batch: int):
    if mode == "auto":
      mode = "bar" if sys.stdout.isatty() else "log"
    self.mode = mode if chief else "none"
    self._steps = steps_per_epoch
    self._epochs = epochs
    self._global_batch = global_batch
    self._log_every = max(1, steps_per_epoch // LOG_LINES_PER_EPOCH)

  def start_epoch(self, epoch: int, first_step: int = 0) -> None:
    """`first_step` steps of the epoch were done before (a resumed run):
    the rate counts the steps from here."""
    self._epoch = epoch
    self._first_step = self._logged = first_step
    self._start = self._shown = time.perf_counter()
    if self.mode == "bar":
      self._bar = keras.utils.Progbar(self._steps, unit_name="step")

  def step(self, done: int) -> None:
    """`done` steps of this epoch are finished (1-based; a call of several
    steps moves it by several: a line is logged for each tenth passed)."""
    if self.mode == "bar":
      now = time.perf_counter()
      if now - self._shown >= _BAR_REFRESH_SECONDS or done == self._steps:
        self._bar.update(done)
        self._shown = now
    elif (self.mode == "log"
          and done // self._log_every > self._logged // self._log_every):
      self._logged = done
      rate = ((done - self._first_step) * self._global_batch
              / (time.perf_counter() - self._start))
      logging.info("epoch %d/%d step %d/%d, %.0f img/s", self._epoch + 1,
                   self._epochs, done, self._steps, rate)
