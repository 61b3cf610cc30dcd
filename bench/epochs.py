"""Epoch timing: one record per epoch, in the shape of the engine's records.

The engine writes model_dir/metrics.jsonl itself; the bench workers write
the same keys (`epoch`, 1-based, `images_per_sec` over all processes,
`world_size`) into their --records, model_dir/metrics.jsonl too, with
`EpochTimer`, so the orchestrator reads every runner's figures one way
(bench/interleaved.py, through engine.core.run_files).
"""
import json
import time

import keras


class EpochTimer:
  """Times each epoch's training steps; the chief appends the records."""

  def __init__(self, path: str, *, images_per_epoch: int, world_size: int,
               intra_op_threads: int, inter_op_threads: int, chief: bool):
    self._path = path if chief else None
    self._fixed = {"world_size": world_size,
                   "intra_op_threads": intra_op_threads,
                   "inter_op_threads": inter_op_threads}
    self._images = images_per_epoch
    self._start = None
    if self._path:
      open(self._path, "w").close()  # a rerun starts a fresh file

  def start(self) -> None:
    self._start = time.perf_counter()

  def end(self, epoch: int, **figures: float) -> None:
    """`epoch` is 1-based, as in metrics.jsonl; `figures` join the
    record."""
    seconds = time.perf_counter() - self._start
    if not self._path:
      return
    record = {"epoch": epoch, "images_per_sec": self._images / seconds,
              "train_seconds": seconds, **self._fixed, **figures}
    with open(self._path, "a") as f:
      f.write(json.dumps(record) + "\n")


class TimeEpochs(keras.callbacks.Callback):
  """Keras `fit`'s epochs timed by an EpochTimer; each of `figures`, a
  name in fit's logs, recorded as train_<name>."""

  def __init__(self, timer: EpochTimer, figures: tuple = ()):
    super().__init__()
    self._timer, self._figures = timer, figures

  def on_epoch_begin(self, epoch, logs=None):
    self._timer.start()

  def on_epoch_end(self, epoch, logs=None):
    self._timer.end(epoch + 1, **{f"train_{name}": float(logs[name])
                                  for name in self._figures})
