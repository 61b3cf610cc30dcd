"""Epoch timing: one record per epoch, in the shape of the engine's records.

The engine writes model_dir/metrics.jsonl itself; the bench workers write
the same keys (`epoch`, 1-based, `images_per_sec` over all processes,
`world_size`) into their --records, model_dir/metrics.jsonl too, with
`EpochTimer`, so the orchestrator reads every runner's figures one way
(bench/interleaved.py, through engine.core.run_files).
"""
import json
import time


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

  def end(self, epoch: int) -> None:
    """`epoch` is 1-based, as in metrics.jsonl."""
    seconds = time.perf_counter() - self._start
    if not self._path:
      return
    record = {"epoch": epoch, "images_per_sec": self._images / seconds,
              "train_seconds": seconds, **self._fixed}
    with open(self._path, "a") as f:
      f.write(json.dumps(record) + "\n")
