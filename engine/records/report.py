"""What the chief tells the user: log lines, metrics.jsonl, TensorBoard.

Only rank 0 narrates and writes; the others log warnings and errors only, so
N processes produce one story rather than N interleaved copies, and one set
of files. A write that fails is one line (errors.WriteFailed, via storage).
"""
import contextlib
import glob
import json
import logging as python_logging
import os
from typing import Optional

from absl import logging
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import api as hparams_api
import tensorflow as tf

from engine.core import run_files
from engine.records import storage

# The Keras TensorBoard callback's layout, which users know: a run for
# training and one for validation under model_dir/tensorboard
# (run_files.TRAIN_RUN, VALIDATION_RUN), with the same tags, so each pair of
# curves overlays on one card. Epoch scalars are indexed by the epoch
# (1-based), within-epoch ones by the global step.
# Besides the task's figures (train_<name>, val_<name>), the epoch scalars.
_TRAIN_SCALARS = ("learning_rate", "images_per_sec")
# Within an epoch, every --summary_every_steps steps, in the train run.
STEP_TAG_PREFIX = "batch_"
# A profiled window's step report (engine/records/step_report.py), at its
# last step, in the train run: milliseconds a step of each part, on the
# slowest rank, and the report as text.
PROFILE_TAG_PREFIX = "profile/"
# The run's figures for the HParams dashboard (run_files.summary), written each
# epoch into model_dir/tensorboard itself, beside the run's hparams: the
# best and final deciding figure (best_val_accuracy, ...) and these.
HPARAMS_METRICS = ("seconds_to_target", "images_per_sec")
# Shorter names of figures in the log line.
_SHORT_NAMES = {"accuracy": "acc"}


def epoch_scalars(record: dict) -> dict[str, tuple[str, str]]:
  """An epoch record's TensorBoard scalars: metrics.jsonl key -> (run,
  tag). The task's figures go by their names into the train and
  validation runs (train_loss and val_loss both as epoch_loss)."""
  scalars = {}
  for key in record:
    if key.startswith("train_") and key != "train_examples":
      scalars[key] = (run_files.TRAIN_RUN,
                      "epoch_" + key.removeprefix("train_"))
    elif key.startswith("val_"):
      scalars[key] = (run_files.VALIDATION_RUN,
                      "epoch_" + key.removeprefix("val_"))
    elif key in _TRAIN_SCALARS:
      scalars[key] = (run_files.TRAIN_RUN, "epoch_" + key)
  return scalars


def _figures(record: dict, prefix: str) -> str:
  """The record's figures of one split as the log line shows them (not
  the details, as mae/<target>)."""
  return " ".join(
      f"{_SHORT_NAMES.get(key[len(prefix):], key[len(prefix):])} "
      f"{shown(value)}" for key, value in record.items()
      if key.startswith(prefix) and key != "train_examples"
      and "/" not in key)


def in_words(figures: dict, details: bool = False) -> str:
  """A task's figures of the test split in words ("test loss 0.3120, test
  accuracy 0.8811"); the details (iou/<class>) only with `details`."""
  return ", ".join(f"test {name} {shown(value)}"
                   for name, value in figures.items()
                   if details or "/" not in name)


def shown(value: Optional[float]) -> str:
  """A figure as logged: 4 decimals, or "-" where undefined (None)."""
  return "-" if value is None else f"{value:.4f}"


def configure_logging(chief: bool) -> None:
  logging.set_verbosity(logging.INFO if chief else logging.WARNING)
  logging.get_absl_logger().addFilter(_quiet_tensorflow)


_TENSORFLOW_SOURCES = os.path.dirname(tf.__file__) + os.sep


def _quiet_tensorflow(record) -> bool:
  """Drops TensorFlow's own INFO lines, which share absl's logger with the
  engine's: TensorFlow 2.21 logs one at every checkpoint save ("Sharding
  callback duration"). Its warnings and errors still show."""
  return (record.levelno >= python_logging.WARNING
          or not record.pathname.startswith(_TENSORFLOW_SOURCES))


class Reporter:
  """Reports each epoch: a log line, a metrics.jsonl record, TB scalars.

  metrics.jsonl gets one JSON object per line, flushed as written: a reader
  (or a crash) never sees a half-written epoch, and `tail -f` follows a run.
  Besides epochs it records events (a rollback, a run that ended without
  finishing), whose records carry an "event" key.
  TensorBoard gets the epoch scalars (EPOCH_SCALARS), scalars within
  epochs (`steps`), and the run's hparams with its summary figures, so
  `tensorboard --logdir runs/` compares runs in its HParams dashboard.
  A resumed or rolled-back run continues one curve: `keep_epochs_up_to`
  drops what was written after the point it continues from, from both.
  On ranks other than 0 every method does nothing.
  """

  def __init__(self, model_dir: str, *, chief: bool, epochs: int):
    self._model_dir = model_dir
    self.metrics_path = os.path.join(model_dir, run_files.METRICS_FILE)
    self._chief = chief
    self._epochs = epochs
    self._tensorboard_dir = os.path.join(model_dir,
                                         run_files.TENSORBOARD_DIR)
    self._writers = {}  # TensorBoard run ("" for the run's own) -> writer
    self._records = []  # the run's epoch records, for its summary figures

  def keep_epochs_up_to(self, epoch: int,
                        global_step: Optional[int] = None) -> None:
    """On resume: drops records of epochs after the checkpoint, which the
    resumed run is about to redo (written before a crash, say), and the
    end record of the start before. Rollbacks stay: they happened. With
    `global_step`, TensorBoard's events after it go too (batch scalars
    after it, epoch ones after `epoch`), so each curve stays one line."""
    if not self._chief:
      return
    records, dropped = self._read_metrics()
    kept = [(line, record) for line, record in records
            if _kept_on_resume(record, epoch)]
    self._records = [record for _, record in kept if "event" not in record]
    if len(kept) < len(records) or dropped:
      temporary = self.metrics_path + ".tmp"
      lines = [line for line, _ in kept]
      try:
        with storage.writing("metrics", temporary, sum(map(len, lines))):
          with open(temporary, "w") as f:
            f.writelines(lines)
      except storage.WriteFailed:
        storage.remove(temporary)
        raise
      os.replace(temporary, self.metrics_path)
    if global_step is not None:
      self.close()  # events files are rewritten, not appended to
      _drop_events_after(self._tensorboard_dir, epoch, global_step)

  def hparams(self, values: dict) -> None:
    """The run's hparams, for TensorBoard's HParams dashboard; runs with
    the same values form one group there (repeats of a recipe)."""
    if self._chief:
      with self._tensorboard("") as writer, writer.as_default(step=0):
        hparams_api.hparams(values)

  def event(self, record: dict) -> None:
    """Something that happened besides an epoch, already logged: its
    record, with its "event" key, in metrics.jsonl."""
    if self._chief:
      self._append(record)

  def steps(self, global_step: int, scalars: dict) -> None:
    """Figures within an epoch (loss, accuracy, rate, step time), as
    TensorBoard scalars `batch_<name>` in the train run."""
    if not self._chief:
      return
    with self._tensorboard(run_files.TRAIN_RUN) as writer:
      with writer.as_default(step=global_step):
        for name, value in scalars.items():
          if value is not None:  # a figure undefined over these steps
            tf.summary.scalar(STEP_TAG_PREFIX + name, value)

  def step_report(self, found: dict, text: str) -> None:
    """A profiled window's step report (`found`, as step_report.across
    gives it; `text`, its table), as TensorBoard scalars and text under
    profile/ at the window's last step."""
    if not self._chief:
      return
    slowest = found["ranks"][found["slowest_rank"]]
    scalars = {**{f"{part}_ms": 1e3 * seconds
                  for part, seconds in slowest["parts"].items()},
               "step_ms": 1e3 * slowest["step"],
               "step_p95_ms": 1e3 * slowest["distribution"]["step"]["p95"],
               "slowest_by_ms": 1e3 * found["slowest_by"]}
    if found["link"]:  # the allreduce's achieved bus bandwidth
      scalars["bus_gbit"] = found["link"]["bus_gbit"]["p50"]
    with self._tensorboard(run_files.TRAIN_RUN) as writer:
      with writer.as_default(step=found["window"][1]):
        for name, value in scalars.items():
          tf.summary.scalar(PROFILE_TAG_PREFIX + name, value)
        # Markdown: the table keeps its columns as code.
        tf.summary.text(PROFILE_TAG_PREFIX + "report",
                        "    " + text.replace("\n", "\n    "))
    self.flush()

  def epoch(self, record: dict, images: Optional[dict] = None) -> None:
    """`images`: the task's TensorBoard images of the validation figures,
    {tag: (image [1, H, W, 3] uint8, description)} (classification's
    confusion matrix)."""
    if not self._chief:
      return
    evaluated = any(value is not None for key, value in record.items()
                    if key.startswith("val_"))
    val = "val " + _figures(record, "val_") if evaluated else "not evaluated"
    logging.info(
        "epoch %d/%d  train %s | %s | "
        "lr %.3g | %.0f img/s, %.1fs input wait + %.1fs in steps | %.1fs "
        "(total %.1fs)",
        record["epoch"], self._epochs, _figures(record, "train_"), val,
        record["learning_rate"], record["images_per_sec"],
        record["input_seconds"], record["step_seconds"],
        record["epoch_seconds"], record["cumulative_seconds"])
    if record.get("skipped_steps"):
      logging.info("epoch %d: the float16 loss scaler skipped %d of its "
                   "steps (gradients not finite at its scale)",
                   record["epoch"], record["skipped_steps"])
    self._append(record)
    self._records.append(record)
    step = record["epoch"]
    for key, (run, tag) in epoch_scalars(record).items():
      if record[key] is None:  # an epoch not evaluated
        continue
      with self._tensorboard(run) as writer:
        with writer.as_default(step=step):
          tf.summary.scalar(tag, record[key])
    for tag, (image, description) in (images or {}).items():
      with self._tensorboard(run_files.VALIDATION_RUN) as writer:
        with writer.as_default(step=step):
          tf.summary.image(tag, image, description=description)
    summary = run_files.summary(self._records)
    decided_by = summary["metric"]
    with self._tensorboard("") as writer:
      with writer.as_default(step=step):
        for name, value in summary.items():
          if value is not None and name in (
              *HPARAMS_METRICS, f"best_{decided_by}", f"final_{decided_by}"):
            tf.summary.scalar(name, value)
    self.flush()

  def flush(self) -> None:
    for run, writer in self._writers.items():
      with storage.writing("TensorBoard events", self._run_dir(run)):
        writer.flush()

  def close(self) -> None:
    """Closes the event files; the next write opens new ones."""
    for run, writer in self._writers.items():
      with storage.writing("TensorBoard events", self._run_dir(run)):
        writer.close()
    self._writers = {}

  @contextlib.contextmanager
  def _tensorboard(self, run: str):
    """The writer of TensorBoard run `run` (opened on first use), inside
    storage.writing: a failed write is one line."""
    with storage.writing("TensorBoard events", self._run_dir(run)):
      if run not in self._writers:
        self._writers[run] = tf.summary.create_file_writer(self._run_dir(run))
      yield self._writers[run]

  def _run_dir(self, run: str) -> str:
    return os.path.join(self._tensorboard_dir, run)

  def _read_metrics(self) -> tuple[list[tuple[str, dict]], int]:
    """metrics.jsonl's lines with their records, and how many lines were
    not one (half a line, from a write that failed: a full disk), each
    dropped with a warning; the file is rewritten without them."""
    lines = run_files.read_metrics(self._model_dir)
    records = []
    for number, (line, record) in enumerate(lines, start=1):
      if record is None:
        logging.warning("%s: dropped line %d, not a record: %r",
                        self.metrics_path, number, line[:80])
      else:
        records.append((line.decode().rstrip("\n") + "\n", record))
    return records, len(lines) - len(records)

  def _append(self, record: dict) -> None:
    """One line. Half of one, left by a write that failed, is dropped when
    the run resumes (keep_epochs_up_to)."""
    line = json.dumps(record) + "\n"
    with storage.writing("metrics", self.metrics_path, len(line)):
      with open(self.metrics_path, "a") as f:
        f.write(line)


def _kept_on_resume(record: dict, epoch: int) -> bool:
  if "event" in record:
    return record["event"] != "end"
  return record["epoch"] <= epoch


def _drop_events_after(directory: str, epoch: int, global_step: int) -> None:
  """Rewrites the event files under `directory` without the summaries of
  steps a resumed run redoes: batch scalars and a step report's after
  `global_step`, epoch ones after `epoch`. Left in, TensorBoard would
  draw each redone stretch as a second line doubling back over the
  first."""
  for path in sorted(glob.glob(os.path.join(directory, "**", "events.*"),
                               recursive=True)):
    kept, dropped = [], 0
    for raw in _event_records(path):
      event = event_pb2.Event.FromString(raw)
      values = event.summary.value
      if values and event.step > (global_step if values[0].tag.startswith(
          (STEP_TAG_PREFIX, PROFILE_TAG_PREFIX)) else epoch):
        dropped += 1
      else:
        kept.append(raw)
    if dropped:
      temporary = path + ".tmp"
      with storage.writing("TensorBoard events", path,
                           sum(map(len, kept))):
        with tf.io.TFRecordWriter(temporary) as writer:
          for raw in kept:
            writer.write(raw)
      os.replace(temporary, path)


def _event_records(path: str) -> list[bytes]:
  """An event file's records, up to a damaged one (a killed writer's last
  record can be cut short)."""
  records = []
  try:
    for raw in tf.data.TFRecordDataset(path):
      records.append(raw.numpy())
  except tf.errors.DataLossError:
    logging.warning("%s: dropped its damaged end (after %d events)", path,
                    len(records))
  return records
