"""What a model_dir holds: the name of every file and folder a run keeps
there, and the small readers and writers of them that several modules share.

Rank 0 writes a run's model_dir (engine.loop.run_directory,
engine.records.report, engine.records.checkpoint, ...), and a resumed
start, engine.evaluate and engine.runs read it back. Each takes its names
from here, so the layout is written down once:

  flags.txt              the flags of the run's first start, a flagfile
  flags.latest.txt       those of its latest start, once it has resumed:
                         the flags in force
  metrics.jsonl          a record per epoch and per event (engine.records.report)
  classes.txt            the class names, one a line in label order
  normalization.json     the statistics the run normalizes with
  precision.json         what --mixed_precision=auto chose (engine.compute.precision)
  communication.json     what --gradient_compression=auto chose, and Horovod's
                         fusion threshold and cycle (engine.compute.communication)
  checkpoints/           ckpt-<global step>, best/best-<global step>, and
                         format.json, their format's version
  tensorboard/           train/ and validation/, and the run's hparams
  export/                final/ and best/: SavedModels
  profile/, timeline.json  traces of --profile_steps (engine.loop.profiling),
                           profile/step_reports.jsonl their step reports

It imports no TensorFlow: engine.runs reads runs without it, in a fraction
of a second.
"""
import glob
import json
import math
import os
import statistics
from typing import Callable, Optional

from engine.core.errors import UserError

FLAGS_FILE = "flags.txt"
LATEST_FLAGS_FILE = "flags.latest.txt"
METRICS_FILE = "metrics.jsonl"
# In the first epoch record of a start that resumed with other flags: the
# flags it changed, {"step": the step of the epoch it resumed at,
# "flags": {name: [then, now]}}.
FLAGS_CHANGED = "flags_changed"
# The same file a data set may hold beside its images (engine.datasets
# reads it there, and engine.tools.to_tfrecords writes it).
CLASSES_FILE = "classes.txt"
NORMALIZATION_FILE = "normalization.json"
PRECISION_FILE = "precision.json"
COMMUNICATION_FILE = "communication.json"
# A sweep's trial (engine/sweeps/trials.py): what the sweep knows of it,
# and the run's output.
TRIAL_FILE = "trial.json"
TRIAL_LOG = "trial.log"

CHECKPOINT_DIR = "checkpoints"
# tf.train.CheckpointManager's names in it: the latest few as
# ckpt-<global step>, the best in best/ as best-<global step>, each
# manager's list of them in its state file.
CHECKPOINT_NAME = "ckpt"
BEST_DIR = BEST_NAME = "best"
CHECKPOINT_STATE_FILE = "checkpoint"  # TensorFlow's name
# The format of the checkpoints (which variables they hold, by what name,
# meaning what), recorded beside them in FORMAT_FILE before a run's first
# save. A run resumes, and engine.evaluate reads, checkpoints of this
# format only: another is refused in one line (engine.records.checkpoint) rather
# than restored wrongly. Format 0 stands for checkpoints written before the
# format was recorded. Raise it with any change to what a checkpoint holds.
FORMAT_FILE = "format.json"
# Format 3: every variable of Keras 3's model and optimizer by its place
# in Keras' own list of them; 2 named them by TensorFlow's object graph of
# the model, which misses the layers a model holds in lists and dicts, and
# is read still where it holds every variable (engine.records.checkpoint);
# 1 was tf_keras', Keras 2's.
CHECKPOINT_FORMAT = 3
# The earlier formats this engine reads too.
CHECKPOINT_FORMATS_READ = (2,)

TENSORBOARD_DIR = "tensorboard"
# The Keras TensorBoard callback's runs, which users know (engine.records.report).
TRAIN_RUN, VALIDATION_RUN = "train", "validation"
EXPORT_DIR = "export"
FINAL_EXPORT, BEST_EXPORT = "final", "best"
PROFILE_DIR = "profile"
TIMELINE_FILE = "timeline.json"
STEP_REPORT_FILE = "step_report.json"  # in PROFILE_DIR: the latest window's
STEP_REPORTS_FILE = "step_reports.jsonl"  # in PROFILE_DIR: a line a window


def profile_dir(model_dir: str, rank: int) -> str:
  """Where rank `rank` writes its profile: profile/ for rank 0, and
  profile/rank_<r> for the others (the profiler names its file after the
  host, which processes on one host share)."""
  directory = os.path.join(model_dir, PROFILE_DIR)
  return os.path.join(directory, f"rank_{rank}") if rank else directory


# The flags files.

# The flags that say where a run is, not what it does: every run has its
# own values of them. engine.runs compares runs by none of them, and a
# resumed start names no change of them (engine.loop.run_directory).
PLACE_FLAGS = ("model_dir", "trial_study_dir", "trial_number")


def record_flags(model_dir: str, command_line: str) -> None:
  """FLAGS_FILE: the flags of the run's first start, usable as a flagfile.

  A resumed start's flags go to LATEST_FLAGS_FILE, the flags in force
  now; FLAGS_FILE is never overwritten, so the run can always be
  reproduced from its start. Where a resume changed flags, its first
  epoch's record in METRICS_FILE says which, and from which step of that
  epoch (FLAGS_CHANGED; engine.loop.run_directory).
  """
  first = os.path.join(model_dir, FLAGS_FILE)
  path = os.path.join(model_dir, LATEST_FLAGS_FILE) if os.path.exists(
      first) else first
  with open(path, "w") as f:
    f.write(command_line)


def latest_flags_file(model_dir: str) -> Optional[str]:
  """The flags file of the run's latest start, None if it has none."""
  for name in (LATEST_FLAGS_FILE, FLAGS_FILE):
    path = os.path.join(model_dir, name)
    if os.path.exists(path):
      return path
  return None


def read_flags(path: str) -> dict[str, str]:
  """A flagfile's values by flag name, booleans as "true" or "false"; none
  if there is no such file.

  A bare `--noname` is taken as name=false: no engine boolean flag's name
  starts with "no".
  """
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return flag_values(f.read())
  except FileNotFoundError:
    return {}
  except OSError as e:
    raise UserError(f"{path}: cannot read it ({e.strerror})") from None


def flag_values(flagfile: str) -> dict[str, str]:
  """A flagfile's text as read_flags reads its file: a start's own flags
  (TrainConfig.command_line) set against its run's."""
  values = {}
  for line in flagfile.splitlines():
    line = line.strip()
    if not line.startswith("--"):  # a blank line or a comment
      continue
    name, has_value, value = line[2:].partition("=")
    if not has_value:
      name, value = ((name[2:], "false") if name.startswith("no") else
                     (name, "true"))
    values[name] = value
  return values


# metrics.jsonl.


def read_metrics(model_dir: str) -> list[tuple[bytes, Optional[dict]]]:
  """METRICS_FILE's lines that are not blank, each with its record, or
  None if it is not one (a line half written, by a run writing it now or
  one that failed or was killed while it wrote); none if there is no
  such file."""
  path = os.path.join(model_dir, METRICS_FILE)
  try:
    with open(path, "rb") as f:
      lines = [line for line in f if line.strip()]
  except FileNotFoundError:
    return []
  except OSError as e:
    raise UserError(f"{path}: cannot read it ({e.strerror})") from None
  return [(line, record_of(line)) for line in lines]


def epochs_and_events(model_dir: str) -> tuple[list[dict], list[dict],
                                                Optional[dict]]:
  """A run's epoch records in epoch order, its event records as written,
  and its end record if that is the run's last word (else None).

  A record of an epoch recorded already (redone after a rollback, or after
  a resume from an earlier checkpoint) replaces that epoch's record and
  the ones after it, as the resumed run itself does; an epoch after an end
  record means a later start went on. A line that is not a record is
  skipped: the last can be half written (by a run writing it now, or one
  killed while it wrote)."""
  records, events, end = [], [], None
  for _, record in read_metrics(model_dir):
    if record is None:
      continue
    if "event" in record:
      events.append(record)
      if record["event"] == "end":
        end = record
    elif is_int(record.get("epoch")):
      while records and records[-1]["epoch"] >= record["epoch"]:
        records.pop()
      records.append(record)
      end = None
  return records, events, end


def record_of(line: bytes) -> Optional[dict]:
  """A metrics.jsonl line's record (an epoch's, or an event's), or None if
  it is not one."""
  try:
    record = json.loads(line)
  except (ValueError, UnicodeDecodeError):  # not JSON, or not UTF-8
    return None
  if isinstance(record, dict) and ("event" in record or isinstance(
      record.get("epoch"), int)):
    return record
  return None


# The JSON records: precision.json, communication.json, normalization.json,
# format.json.


def write_record(directory: str, name: str, value) -> None:
  """`directory`'s JSON file `name`: `value`."""
  with open(os.path.join(directory, name), "w") as f:
    json.dump(value, f)


def read_record(directory: str, name: str,
                check: Callable[[object], object], keeps: str):
  """`directory`'s JSON file `name` through `check` (which raises
  ValueError, KeyError or TypeError on what it refuses), or None if there
  is none. An unreadable one is a UserError naming it and saying what it
  `keeps`."""
  path = os.path.join(directory, name) if directory else ""
  if not path or not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return check(json.load(f))
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UserError(f"{path}: unreadable ({e}); it records {keeps}") from None


def read_choice(directory: str, name: str, key: str, allowed,
                keeps: str) -> Optional[dict]:
  """An `auto` option's choice, recorded in `directory`'s JSON file
  `name` by the run's first start: the object, whose `key` is one of
  `allowed`; None if there is none; a UserError naming it if it cannot be
  read."""
  def checked(choice):
    if choice[key] not in allowed:
      raise ValueError(f"{key} {choice[key]!r}")
    return choice

  return read_record(directory, name, checked, keeps)


# The data's records: classes.txt and normalization.json.


def write_classes(directory: str, class_names) -> None:
  """CLASSES_FILE in `directory`: one name a line, in label order."""
  with open(os.path.join(directory, CLASSES_FILE), "w") as f:
    f.writelines(name + "\n" for name in class_names)


def write_normalization(model_dir: str, statistics: dict) -> None:
  """NORMALIZATION_FILE: the statistics the run normalizes with, written
  at its first start (`read_normalization` says what they hold)."""
  write_record(model_dir, NORMALIZATION_FILE, statistics)


def read_normalization(model_dir: str) -> Optional[dict]:
  """NORMALIZATION_FILE's statistics, or None if there is none: mean and
  std, and target_mean and target_std if recorded; each a tuple of finite
  numbers, the stds positive; and the transform they were measured after
  ('' for none). A resume and engine.evaluate normalize with them exactly
  as the run's first start did."""
  def checked(recorded):
    statistics = {key: tuple(float(v) for v in recorded[key])
                  for key in ("mean", "std", "target_mean", "target_std")
                  if key in recorded or key in ("mean", "std")}
    stds = statistics["std"] + statistics.get("target_std", ())
    # What would make every normalized image (or target) NaN or infinite.
    if (min(stds, default=0) <= 0 or
        not all(map(math.isfinite, sum(statistics.values(), ())))):
      raise ValueError("not finite numbers with a positive std")
    return dict(statistics, transform=str(recorded.get("transform", "")))

  return read_record(
      model_dir, NORMALIZATION_FILE, checked,
      "the run's normalization: restore it, or delete it to recompute")


# The checkpoints' format.


def checkpoint_format(directory: str) -> Optional[int]:
  """The format of the checkpoints in `directory` (a model_dir's
  checkpoints/): the version its FORMAT_FILE records, 0 if it has none,
  or None if it holds no checkpoint."""
  def checked(recorded):
    if type(recorded["version"]) is not int:
      raise ValueError(f"version {recorded['version']!r}")
    return recorded["version"]

  if not any(glob.glob(os.path.join(glob.escape(place), "*.index"))
             for place in (directory, os.path.join(directory, BEST_DIR))):
    return None
  version = read_record(
      directory, FORMAT_FILE, checked,
      "the format of the checkpoints beside it (this engine writes "
      f'{{"version": {CHECKPOINT_FORMAT}}}): restore it from a copy')
  return 0 if version is None else version


def record_checkpoint_format(directory: str) -> None:
  """FORMAT_FILE in `directory`, made if need be: CHECKPOINT_FORMAT."""
  os.makedirs(directory, exist_ok=True)
  write_record(directory, FORMAT_FILE, {"version": CHECKPOINT_FORMAT})


def checkpoint_dir_of(prefix: str) -> str:
  """The checkpoints/ directory that checkpoint `prefix` is in: its own,
  or for a best checkpoint its parent."""
  directory = os.path.dirname(os.path.abspath(prefix))
  if os.path.basename(directory) == BEST_DIR:
    return os.path.dirname(directory)
  return directory


# A run's figures, from its metrics.jsonl records (engine.runs, and
# engine.records.report for TensorBoard's HParams).


def decided_by(records: list[dict]) -> tuple[str, bool]:
  """The key of the figure that decided the run's best epoch, and whether
  lower is better: the records' best_metric (val_accuracy:max for a run
  with no records yet)."""
  spec = records[-1].get("best_metric") if records else None
  key, _, direction = (spec or "val_accuracy:max").partition(":")
  return key, direction == "min"


def summary(records: list[dict]) -> dict:
  """A run's figures from its epoch records (in order), for the table here
  and for TensorBoard's HParams dashboard (engine.records.report): one
  place, so the two never disagree.

  `metric` is the key of the deciding figure (val_accuracy, val_mae), and
  `best_<metric>` and `final_<metric>` its best and last values.
  `images_per_sec` is the median over the epochs, leaving out epoch 1 when
  there are others: its time includes tracing the step functions. A figure
  no record gives (no epochs yet, no --target, or not reached) is None.
  """
  metric, minimize = decided_by(records)
  values = [r[metric] for r in records if is_finite(r.get(metric))]
  timed = ([r for r in records if r.get("epoch") != 1]
           if len(records) >= 2 else records)
  rates = [r["images_per_sec"] for r in timed
           if is_finite(r.get("images_per_sec"))]
  last = records[-1] if records else {}
  # The last evaluated epoch's (--eval_every_epochs skips some).
  final = values[-1] if values else None
  seconds_to_target = last.get("target_accuracy_first_seconds")
  best = min if minimize else max
  return {
      "metric": metric,
      f"best_{metric}": best(values) if values else None,
      f"final_{metric}": final,
      "seconds_to_target": (seconds_to_target
                            if is_finite(seconds_to_target) else None),
      "images_per_sec": statistics.median(rates) if rates else None,
      "epochs": last.get("epoch", 0),
      "world_size": last.get("world_size"),
  }


def is_int(value) -> bool:
  """An integer in a record (JSON's true and false are not)."""
  return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))
