"""What the chief tells the user: log lines, metrics.jsonl, TensorBoard.

Only rank 0 narrates and writes; the others log warnings and errors only, so
N processes produce one story rather than N interleaved copies, and one set
of files. A write that fails is one line (errors.WriteFailed, via storage).
"""
import json
import os
from typing import Optional

from absl import logging
import numpy as np
import tensorflow as tf

from engine import storage

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
# metrics.jsonl key -> TensorBoard tag.
SCALARS = {
    "train_loss": "train/loss",
    "train_accuracy": "train/accuracy",
    "val_loss": "val/loss",
    "val_accuracy": "val/accuracy",
    "learning_rate": "learning_rate",
    "images_per_sec": "images_per_sec",
}


def configure_logging(chief: bool) -> None:
  logging.set_verbosity(logging.INFO if chief else logging.WARNING)


class Reporter:
  """Reports each epoch: a log line, a metrics.jsonl record, TB scalars.

  metrics.jsonl gets one JSON object per line, flushed as written: a reader
  (or a crash) never sees a half-written epoch, and `tail -f` follows a run.
  Besides epochs it records events (a rollback), whose records carry an
  "event" key.
  TensorBoard scalars go to model_dir/tensorboard, indexed by global step.
  On ranks other than 0 every method does nothing.
  """

  def __init__(self, model_dir: str, *, chief: bool, epochs: int):
    self.metrics_path = os.path.join(model_dir, METRICS_FILE)
    self._chief = chief
    self._epochs = epochs
    self._tensorboard_dir = os.path.join(model_dir, TENSORBOARD_DIR)
    self._summaries = None
    if chief:
      with storage.writing("TensorBoard events", self._tensorboard_dir):
        self._summaries = tf.summary.create_file_writer(
            self._tensorboard_dir)

  def keep_epochs_up_to(self, epoch: int) -> None:
    """On resume: drops records of epochs after the checkpoint, which the
    resumed run is about to redo (written before a crash, say). Events
    stay: they happened."""
    if not self._chief or not os.path.exists(self.metrics_path):
      return
    with open(self.metrics_path, "rb") as f:
      lines = [l for l in f if l.strip()]
    kept = []
    for number, line in enumerate(lines, start=1):
      record = _parsed(line)
      if record is None:
        # Half a line, from a write that failed (a full disk), say.
        logging.warning("%s: dropped line %d, not a record: %r",
                        self.metrics_path, number, line[:80])
      elif "event" in record or record["epoch"] <= epoch:
        kept.append(line.decode().rstrip("\n") + "\n")
    if len(kept) < len(lines):
      temporary = self.metrics_path + ".tmp"
      try:
        with storage.writing("metrics", temporary, sum(map(len, kept))):
          with open(temporary, "w") as f:
            f.writelines(kept)
      except storage.WriteFailed:
        storage.remove(temporary)
        raise
      os.replace(temporary, self.metrics_path)

  def event(self, record: dict) -> None:
    """Something that happened besides an epoch, already logged: its
    record, with its "event" key, in metrics.jsonl."""
    if self._chief:
      self._append(record)

  def epoch(self, record: dict,
            confusion: Optional[np.ndarray] = None) -> None:
    """`confusion`: the validation confusion matrix, counts[true, predicted],
    drawn as a TensorBoard image."""
    if not self._chief:
      return
    logging.info(
        "epoch %d/%d  train loss %.4f acc %.4f | val loss %.4f acc %.4f | "
        "lr %.3g | %.0f img/s, %.1fs input wait + %.1fs in steps | %.1fs "
        "(total %.1fs)",
        record["epoch"], self._epochs, record["train_loss"],
        record["train_accuracy"], record["val_loss"], record["val_accuracy"],
        record["learning_rate"], record["images_per_sec"],
        record["input_seconds"], record["step_seconds"],
        record["epoch_seconds"], record["cumulative_seconds"])
    if record.get("skipped_steps"):
      logging.info("epoch %d: the float16 loss scaler skipped %d of its "
                   "steps (gradients not finite at its scale)",
                   record["epoch"], record["skipped_steps"])
    self._append(record)
    with storage.writing("TensorBoard events", self._tensorboard_dir):
      with self._summaries.as_default(step=record["global_step"]):
        for key, tag in SCALARS.items():
          tf.summary.scalar(tag, record[key])
        if confusion is not None:
          tf.summary.image("val/confusion_matrix",
                           confusion_image(confusion),
                           description="Rows: true class, columns: predicted "
                           "class, in label order (classes.txt); each row "
                           "normalized, white 0 to dark blue 1.")
      self._summaries.flush()

  def _append(self, record: dict) -> None:
    """One line. Half of one, left by a write that failed, is dropped when
    the run resumes (keep_epochs_up_to)."""
    line = json.dumps(record) + "\n"
    with storage.writing("metrics", self.metrics_path, len(line)):
      with open(self.metrics_path, "a") as f:
        f.write(line)


def _parsed(line: bytes) -> Optional[dict]:
  """A metrics.jsonl line's record, or None if it is not one."""
  try:
    record = json.loads(line)
  except (ValueError, UnicodeDecodeError):
    return None
  if isinstance(record, dict) and ("event" in record or isinstance(
      record.get("epoch"), int)):
    return record
  return None


def confusion_image(counts: np.ndarray, size: int = 320) -> np.ndarray:
  """The row-normalized confusion matrix as a [1, H, W, 3] uint8 image:
  each cell a square of pixels, white for 0 to dark blue for 1, with grey
  lines between cells when they are large enough to show them."""
  classes = len(counts)
  with np.errstate(invalid="ignore", divide="ignore"):
    shares = np.nan_to_num(counts / counts.sum(axis=1, keepdims=True))
  cell = max(1, size // classes)
  pixels = np.kron(shares, np.ones((cell, cell)))
  white, blue = np.array([255.0, 255.0, 255.0]), np.array([8.0, 48.0, 107.0])
  image = white + pixels[..., None] * (blue - white)
  if cell >= 4:
    image[::cell, :] = image[:, ::cell] = 160
  return image.astype(np.uint8)[None]
