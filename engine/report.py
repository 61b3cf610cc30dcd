"""What the chief tells the user: log lines and `model_dir/metrics.jsonl`.

Only rank 0 narrates and writes; the others log warnings and errors only, so
N processes produce one story rather than N interleaved copies.
"""
import json
import os

from absl import logging

METRICS_FILE = "metrics.jsonl"


def configure_logging(chief: bool) -> None:
  logging.set_verbosity(logging.INFO if chief else logging.WARNING)


class MetricsLog:
  """Appends one JSON object per epoch to model_dir/metrics.jsonl (chief only).

  One line per record, flushed as written: a reader (or a crash) never sees a
  half-written epoch, and `tail -f` follows a run as it goes.
  """

  def __init__(self, model_dir: str, *, chief: bool):
    self.path = os.path.join(model_dir, METRICS_FILE)
    self._chief = chief

  def write(self, record: dict) -> None:
    if not self._chief:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")


def log_epoch(record: dict, epochs: int) -> None:
  logging.info(
      "epoch %d/%d  train loss %.4f acc %.4f | val loss %.4f acc %.4f | "
      "lr %.3g | %.0f img/s | %.1fs (total %.1fs)",
      record["epoch"], epochs, record["train_loss"], record["train_accuracy"],
      record["val_loss"], record["val_accuracy"], record["learning_rate"],
      record["images_per_sec"], record["epoch_seconds"],
      record["cumulative_seconds"])
