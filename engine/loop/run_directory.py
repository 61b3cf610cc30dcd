"""Rank 0's side of a run's model_dir: what a run leaves on disk.

Only rank 0 writes model_dir, so N processes never race on one directory
(the Horovod lab's step 7). `RunDirectory` is where that is done: the
resume checks before anything is written (which flags a resume may
change: START_FLAGS and KEPT_FLAGS below), the flags files, the
checkpoints, the epoch records, the end record and the exports. Every write
that fails (a full disk, a removed or read-only model_dir) ends in one line,
WriteFailed, that says where a rerun of the same command resumes.
"""
import contextlib
import os
import signal
import time
from typing import Optional

from absl import logging
import tensorflow as tf

from engine import datasets
from engine import distributed
from engine import tasks
from engine.compute import auto
from engine.compute import communication
from engine.compute import ema
from engine.compute import precision
from engine.core import run_files
from engine.core.config import TrainConfig
from engine.core.errors import Diverged
from engine.core.errors import UserError
from engine.core.errors import WriteFailed
from engine.loop import preemption
from engine.loop import run_state
from engine.loop import stopping
from engine.records import checkpoint
from engine.records import export
from engine.records import report
from engine.records import storage
from engine.records.mlperf import MLPerfLog

# What a resumed start may change of its run's flags: those of the run's
# latest start (run_files.latest_flags_file) set against its own, by name.
# Every flag is compared, and each one changed is named as the run resumes
# (its log line, and "flags_changed" in its first epoch's record in
# metrics.jsonl), but for
# the two lists below.
#
# Not compared: where the run is, where this start runs its threads and
# stages its data, how it is watched, and how it found its checkpoints.
# They say nothing of what the run computes, and a start gives its own.
START_FLAGS = (*run_files.PLACE_FLAGS, "resume", "resume_from", "stage_dir",
               "intra_op_threads", "inter_op_threads", "bind_cpus",
               "idle_horovod_threads", "progress", "summary_every_steps",
               "profile_steps", "profile_every", "profile_all_ranks",
               "horovod_timeline", "profile_link_gbit",
               "profile_link_latency_us")
# Refused: what the run's checkpoints, data order and figures are of. Its
# checkpoints hold this model's variables and this optimizer's slots; its
# data order and augmentation are this data's and this seed's; it
# normalizes with its first start's statistics (normalization.json); its
# best checkpoint is this figure's best. A start that changes one is
# refused before anything is written, naming each; a new run takes another
# --model_dir. The checkpoint's identity (checkpoint.identity), checked as
# it is restored, then catches what no flag says: a user's model or data
# function whose code changed. What a checkpoint itself cannot continue
# with (a float16 run from one without a loss scale) it refuses as it is
# read. The rest the engine honours from the step it resumes at: the
# learning rate and its schedule, the batch size and the processes (the
# position converted: run_state.starting_point), the epochs, --ema_decay,
# the precision, regularization, augmentation and the faults' handling.
KEPT_FLAGS = (
    "model", "depth", "width", "filters", "stem", "pool_first",
    "conv_layers", "kernel_size", "optimizer",
    "dataset", "data_dir", "image_size", "channels", "num_classes",
    "label_offset", "validation_split", "train_examples", "test_examples",
    "array_keys", "tfrecord_features", "log_transform", "image_mean",
    "image_std",
    "task", "best_metric", "standardize_targets", "seed")
# Flags whose values are paths: the same file however spelled.
_PATH_FLAGS = ("data_dir", "mlperf_log")


class RunDirectory:
  """Rank 0's side of a run's model_dir: checkpoints, flags, exports.

  Its writes that fail (a full disk, a removed or read-only model_dir) end
  in WriteFailed saying where a rerun of the same command resumes.
  """

  def __init__(self, model_dir: str, config: TrainConfig, *,
               precision_choice: precision.Choice,
               communication_choice: communication.Choice, model, optimizer,
               info: datasets.DatasetInfo, task: tasks.Task,
               decider: tasks.Decider, lr_factor: tf.Variable,
               weight_average: Optional[ema.WeightAverage],
               stop: stopping.Target, counts: run_state.Counts,
               mlperf: MLPerfLog):
    """`precision_choice` and `communication_choice`: the start-up's, whose
    figures a first start records; `decider`: the validation figure that
    decides best/; `stop`, `counts`: the run's state the checkpoints keep
    besides its variables' (run_state.py); `mlperf`: --mlperf_log's, which
    this writes."""
    self.model_dir = model_dir
    self._config = config
    self._precision = precision_choice
    self._communication = communication_choice
    self._model = model
    self._task = task
    self._decider = decider
    self._optimizer = optimizer
    self._info = info
    self._lr_factor = lr_factor
    self._weight_average = weight_average
    self._stop = stop
    self._counts = counts
    self.mlperf = mlperf
    self._identity = checkpoint.identity(model, info)
    self.checkpoints = None
    # The run's metrics.jsonl and TensorBoard events, which rank 0 writes.
    self.reporter = report.Reporter(model_dir, chief=True,
                                    epochs=config.training.epochs)
    self.opened = False  # model_dir passed the checks and is written to
    self._flags_changed_record = None  # for this start's first epoch's

  def open(self) -> Optional[checkpoint.Position]:
    """Checks model_dir against the resume flags and the run's own
    (KEPT_FLAGS); restores; records the flags, and what a resume changed.

    Nothing is written before the checks pass, so a refused run leaves the
    directory (and any checkpoints in it) exactly as it was.
    """
    self._open_checkpoints()
    position, changed = None, {}
    if self.checkpoints.existing():
      if self._config.checkpoints.resume == "never":
        raise UserError(
            f"--model_dir={self.model_dir} holds checkpoints of an earlier "
            "run and --resume=never; pass --resume=auto to continue it, or "
            "another --model_dir")
      changed = self._flags_changed()
      position = self.checkpoints.restore_latest_readable()
      logging.info("resuming %s at epoch %d, step %d%s", self.model_dir,
                   position.epoch + 1, position.step,
                   f" with flags changed: {_said(changed)}" if changed
                   else "")
    elif self._config.checkpoints.resume == "never" and os.path.exists(
        os.path.join(self.model_dir, run_files.METRICS_FILE)):
      raise UserError(f"--model_dir={self.model_dir} holds an earlier run "
                      f"({run_files.METRICS_FILE}) and --resume=never; "
                      "choose another --model_dir")
    elif self._config.checkpoints.resume_from:
      source = checkpoint.resolve(self._config.checkpoints.resume_from)
      position = self.checkpoints.restore(source)
      logging.info("starting %s from %s (epoch %d, step %d)", self.model_dir,
                   source, position.epoch + 1, position.step)
    _make_model_dir(self.model_dir)  # the checks passed: now it is written
    # MLPerf's init and run_start (the log may be in model_dir).
    self.mlperf.start(resumed_at=None if position is None else
                      f"epoch {position.epoch + 1}, step {position.step}")
    storage.warn_if_short_of_space(
        self.model_dir, checkpoint_size=self.checkpoints.size,
        keep=self._config.checkpoints.keep_checkpoints)
    with self._writes(), storage.writing(
        f"{run_files.FLAGS_FILE}, {run_files.CLASSES_FILE} and "
        f"{run_files.NORMALIZATION_FILE} in", self.model_dir):
      run_files.record_flags(self.model_dir, self._config.command_line)
      datasets.record(self.model_dir, self._info)
      if self._precision.figures:  # --mixed_precision=auto's choice
        auto.record(auto.PRECISION, self.model_dir, self._precision.mode,
                    self._precision.figures)
      if self._communication.figures:  # --gradient_compression=auto's
        auto.record(auto.COMPRESSION, self.model_dir,
                    self._communication.compression,
                    self._communication.figures)
    self.opened = True
    # What flags.latest.txt now holds, and from which step of the epoch:
    # in this start's first epoch record, as its own line would be an
    # epoch to every reader of the epochs.
    self._flags_changed_record = changed and {run_files.FLAGS_CHANGED: dict(
        step=position.step,
        flags={name: list(values) for name, values in changed.items()})}
    return position

  def _flags_changed(self) -> dict[str, tuple[Optional[str],
                                              Optional[str]]]:
    """This start's flags that differ from the run's latest start's, but
    START_FLAGS: {name: (then, now)}, None for a value a flags file lacks
    (an augmentation flag left to the task, a flag the engine lacked
    then). A UserError naming those of KEPT_FLAGS, which a resume may not
    change."""
    recorded_in = run_files.latest_flags_file(self.model_dir)
    if recorded_in is None:  # checkpoints without the run's flags
      return {}
    then = run_files.read_flags(recorded_in)
    now = run_files.flag_values(self._config.command_line)
    changed = {name: (then.get(name), now.get(name))
               for name in dict.fromkeys([*now, *then])
               if name not in START_FLAGS
               and _differ(name, then.get(name), now.get(name))}
    refused = {name: values for name, values in changed.items()
               if name in KEPT_FLAGS and None not in values}
    if refused:
      raise UserError(
          f"--model_dir={self.model_dir} holds a run, and this start "
          f"changes {_said(refused)}, which its checkpoints, data order "
          "and figures are of; resume it with its flags "
          f"(--flagfile={recorded_in}), or start a new run in another "
          "--model_dir")
    return changed

  def take_over(self) -> None:
    """For a process that becomes rank 0 mid-run (elastic): the run's
    checkpoints, to write, without restoring any."""
    _make_model_dir(self.model_dir)
    self._open_checkpoints()
    self.opened = True

  def _open_checkpoints(self) -> None:
    self.checkpoints = checkpoint.Checkpoints(
        self.model_dir, model=self._model, optimizer=self._optimizer,
        keep=self._config.checkpoints.keep_checkpoints,
        identity=self._identity,
        lr_factor=self._lr_factor, weight_average=self._weight_average,
        stop=self._stop, counts=self._counts)

  def save(self, position: checkpoint.Position, global_step: int) -> str:
    with self._writes():
      return self.checkpoints.save(position, global_step)

  def end_epoch(self, record: dict, images: dict,
                position: checkpoint.Position, global_step: int) -> None:
    """The epoch's record, its TensorBoard `images` (the task's), and its
    checkpoints (the best among those evaluated)."""
    value = record[self._decider.key]
    if self._flags_changed_record:
      record = {**record, **self._flags_changed_record}
      self._flags_changed_record = None
    with self._writes():
      self.reporter.epoch(record, images)
      self.mlperf.epoch(record)
      if value is None:
        self.checkpoints.save(position, global_step)
      elif self.checkpoints.save_at_epoch_end(position, global_step,
                                              self._decider.score(value)):
        logging.info("best %s so far: %.4f", _described(self._decider.key),
                     value)

  def record_event(self, record: dict) -> None:
    """Something of this start's besides its epochs (the staging), in
    metrics.jsonl."""
    with self._writes():
      self.reporter.event(record)

  def record_pruned(self, epoch: int, pruner: str) -> None:
    """A sweep's trial stopped by its study's pruner after `epoch`: the
    end record engine.runs and the sweep read."""
    self.record_event(dict(
        event="end", state="pruned",
        reason=f"pruned after epoch {epoch} by the study's {pruner} pruner",
        time=round(time.time(), 3)))

  def finish(self) -> None:
    """The run trained to its end: MLPerf's run_stop (success if it
    reached --target), then the exports."""
    with self._writes():
      self._stop_mlperf()
    self.export()

  def record_end(self, error: BaseException) -> None:
    """How the run stopped, when it stopped before finishing: the end
    record engine.runs reads, and MLPerf's run_stop (aborted, unless the
    target was reached before). Best effort: a full disk may refuse them."""
    if not self.opened:
      return
    record = _end_record(error)
    for what, write in (
        ("metrics.jsonl", lambda: self.reporter.event(record)),
        ("the MLPerf log", lambda: self._stop_mlperf(record["reason"]))):
      try:
        write()
      except WriteFailed as e:
        logging.warning("not recorded in %s: %s", what, e)

  def _stop_mlperf(self, reason: str = "") -> None:
    self.mlperf.stop(target=self._stop.target,
                     first_reached_epoch=self._stop.first_reached_epoch,
                     reason=reason)
    self.mlperf.close()

  def roll_back(self) -> tuple[checkpoint.Position, str]:
    """Restores the latest readable checkpoint: its position and path."""
    position = self.checkpoints.restore_latest_readable()
    return position, self.checkpoints.restored_path

  def record_rollback(self, record: dict) -> None:
    """The rollback's event, after the records of epochs it undid go."""
    with self._writes():
      self.reporter.keep_epochs_up_to(record["epoch"], record["global_step"])
      self.reporter.event(record)

  def export(self) -> None:
    """The final model and the best checkpoint, as SavedModels."""
    directory = os.path.join(self.model_dir, run_files.EXPORT_DIR)
    exported = [run_files.FINAL_EXPORT]
    with self._writes():
      try:
        with ema.averaged(self._weight_average):
          export.save(self._model, self._task,
                      os.path.join(directory, run_files.FINAL_EXPORT))
      except NotImplementedError:  # a fit script's GAN of Keras' guide
        logging.warning("no exports: model %s has no call() to serve; its "
                        "checkpoints hold its weights", self._model.name)
        return
      if self.checkpoints.best_path:
        try:
          with self.checkpoints.weights_of(self.checkpoints.best_path), \
              ema.averaged(self._weight_average):
            export.save(self._model, self._task,
                        os.path.join(directory, run_files.BEST_EXPORT))
          exported.append(run_files.BEST_EXPORT)
        except checkpoint.Unreadable as e:
          logging.warning("the best checkpoint %s is unreadable (%s): "
                          "exported the final model only",
                          self.checkpoints.best_path, e)
    logging.info("exported SavedModels and Keras models to %s (%s)",
                 directory, ", ".join(exported))

  @contextlib.contextmanager
  def _writes(self):
    """A failed write's message, ending with where a rerun resumes."""
    try:
      yield
    except WriteFailed as e:
      latest = self.checkpoints.latest_path if self.checkpoints else None
      where = (f"it resumes from {latest}" if latest
               else "it starts from the beginning")
      raise WriteFailed(f"{e}, then run the same command again: {where}"
                        ) from None


def _differ(name: str, then: Optional[str], now: Optional[str]) -> bool:
  """Whether a flag's value changed: a path's spelling is not a change."""
  if name in _PATH_FLAGS and then and now:
    return os.path.realpath(then) != os.path.realpath(now)
  return then != now


def _said(changed: dict) -> str:
  """Flags changed, as the log says them: --base_lr 0.1 → 0.05, ..."""
  def shown(value):
    return "unset" if value is None else value or "''"

  return ", ".join(f"--{name} {shown(then)} → {shown(now)}"
                   for name, (then, now) in changed.items())


def _described(key: str) -> str:
  """A metrics.jsonl key in words: val_accuracy, validation accuracy."""
  return key.replace("val_", "validation ", 1).replace("_", " ")


def _end_record(error: BaseException) -> dict:
  """metrics.jsonl's record of a run that stopped before finishing."""
  if isinstance(error, (preemption.Preempted, KeyboardInterrupt)):
    how = dict(state="stopped", signal=signal.Signals(
        getattr(error, "signum", signal.SIGINT)).name)
  elif isinstance(error, Diverged):
    how = dict(state="diverged")
  else:
    how = dict(state="error")
  if distributed.is_peer_failure(error):
    reason = "another process stopped"
  else:
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return dict(event="end", **how, reason=reason, time=round(time.time(), 3))


def _make_model_dir(path: str) -> None:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UserError(f"--model_dir={path}: cannot create it ({e.strerror}); "
                    "pass a writable directory") from None
