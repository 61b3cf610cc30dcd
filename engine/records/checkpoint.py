"""Checkpoints: rank 0 alone writes and reads them; every rank resumes.

A checkpoint holds the model, the optimizer (its step counter, which drives
the learning-rate schedule, and its slots), the position in the data: the
epoch and the step within it, with the global batch those steps were taken
with, and the rest of the run's state the train loop gives it
(engine/loop/run_state.py: the learning rate's factor, the early stopping
count, the run's counts; the weights' average). The data order and
augmentation are functions of (seed, epoch, step), so that position is all
it takes to continue the same stream.

Every variable of the model and the optimizer is saved, however the model
holds its layers (checkpoint_variables.py); a checkpoint that lacks any is
refused, naming them, before anything is restored.

Only rank 0 touches the files, so N processes never race on one directory
(the Horovod lab's step 7); after a restore the weights, the optimizer state
and the position are broadcast to the other ranks.

`tf.train.CheckpointManager` writes a checkpoint's files before it names it
in the `checkpoint` state file, so a crash during a save leaves the previous
one as latest. A latest checkpoint damaged afterwards (a truncated copy, a
full disk) is detected when it is read, reported, and the one before it is
used instead. A checkpoint of another model or data set is refused before
anything is written, naming both; so are checkpoints of another format
than this engine's (run_files.CHECKPOINT_FORMAT, recorded beside them),
naming the revision of the engine that reads them.

A save that fails (a full disk) is one line (errors.WriteFailed), and what
it left half-written is removed: the checkpoints before it stay whole, and
the latest of them is where a rerun resumes.
"""
import contextlib
import dataclasses
import glob
import math
import os
from typing import Optional

from absl import logging
import keras
import tensorflow as tf

from engine.compute import optimizers
from engine.compute import precision
from engine.core import run_files
from engine.core.errors import first_line
from engine.core.errors import UserError
from engine.core.errors import WriteFailed
from engine.records import checkpoint_variables
from engine.records import storage

RESUME_MODES = ("auto", "never")
# What finishes or evaluates a run whose checkpoints are of an earlier
# format, by format: the engine's last revision that wrote it.
_READERS = {0: "the engine's revision 27dc95f (82c6a49 for a novograd or "
               "lamb run saved on TensorFlow 2.15)",
            1: "the engine's revision 2650be9, the last on tf_keras "
               "(Keras 2)"}


@dataclasses.dataclass(frozen=True)
class Position:
  """Where training stands: `step` steps of epoch `epoch` (0-based) are done,
  after `seconds` of the run's time (training, evaluation and saving, over
  every start), which a resumed run's clock continues from."""
  epoch: int
  step: int
  global_batch: int
  world_size: int
  seconds: float = 0.0


def identity(model: keras.Model, info) -> str:
  """What a checkpoint's variables mean: which model, on which data."""
  labels = (f"labels {'x'.join(map(str, info.label_shape))} "
            f"{info.label_dtype}" if info.label_shape
            else f"{info.num_classes} classes")
  return (f"model {model.name} ({model.count_params()} parameters) on "
          f"{info.name} ({labels}, "
          f"{'x'.join(map(str, info.image_shape))} images)")


class Checkpoints:
  """The run's checkpoints: the latest few, and the best by validation.

  Create it on rank 0 only: constructing it reads the directory.
  `identity` describes what the variables mean (model, data set); a
  checkpoint whose identity differs is refused rather than half-restored.
  `lr_factor` is the learning rate's factor (schedules), which rollbacks
  lower and checkpoints keep; `weight_average` the ema.WeightAverage of a
  run with --ema_decay; `stop` the stopping.Target whose count a
  resume continues; `counts` the run's counts as a checkpoint keeps them
  (run_state.Counts: the epoch's train sums and skipped steps, the
  rollbacks).
  """

  def __init__(self, model_dir: str, *, model: keras.Model, optimizer,
               keep: int, identity: str,
               lr_factor: Optional[tf.Variable] = None,
               weight_average: Optional[tf.Module] = None,
               stop: Optional[tf.Module] = None,
               counts: Optional[tf.Module] = None):
    self.directory = os.path.join(model_dir, run_files.CHECKPOINT_DIR)
    self._format = _checked_format(
        self.directory, f"--model_dir={model_dir} holds checkpoints",
        "start a new run in another --model_dir")
    self._identity = identity
    self._scales_loss = precision.scales_loss(optimizer)
    self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
    self._global_batch = tf.Variable(0, dtype=tf.int64, trainable=False)
    self._world_size = tf.Variable(0, dtype=tf.int64, trainable=False)
    # The best epoch's deciding figure, higher better (tasks.Decider.score).
    self._best_score = tf.Variable(-math.inf, dtype=tf.float64,
                                   trainable=False)
    self._seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    self._identity_variable = tf.Variable(identity, dtype=tf.string,
                                          trainable=False)
    # Training's state besides the model's; evaluation restores none of it
    # (the optimizer's variables, the loss scale beside them).
    optimizer_objects = ({} if optimizer is None
                         else precision.checkpointed(optimizer))
    self._variables = checkpoint_variables.Variables(
        model, optimizer_objects.pop("optimizer", None))
    self._state = dict(
        epoch=self._epoch, step=self._step, global_batch=self._global_batch,
        world_size=self._world_size, seconds=self._seconds,
        best_score=self._best_score, identity=self._identity_variable,
        **optimizer_objects, **{name: saved for name, saved in dict(
            lr_factor=lr_factor, stop=stop).items() if saved is not None})
    # What a checkpoint may be without, and starts afresh (`reset`) when it
    # is: --ema_decay may be turned on when a run resumes, and checkpoints
    # of this format written before the counts were kept have none.
    self._optional = {name: saved for name, saved in (
        (_AVERAGE, weight_average), (_COUNTS, counts)) if saved is not None}
    self._checkpoint = tf.train.Checkpoint(
        **self._state, **self._variables.objects, **self._optional)
    self.size = storage.size_of(model.variables + (
        optimizers.state(optimizer) if optimizer is not None else []))
    self.restored_path = None  # the last checkpoint restored
    self._latest = _manager(self._checkpoint, self.directory, keep,
                            run_files.CHECKPOINT_NAME)
    self._best = _manager(self._checkpoint,
                          os.path.join(self.directory, run_files.BEST_DIR), 1,
                          run_files.BEST_NAME)
    if self.best_path:
      # The best so far, for a process that takes over as rank 0 in an
      # elastic run (a restore sets it too, from the checkpoint it reads).
      try:
        self._best_score.assign(tf.train.load_checkpoint(
            self.best_path).get_tensor(_BEST_SCORE_KEY))
      except (*_DAMAGE, ValueError) as e:
        raise UserError(
            f"{self.best_path}, the best checkpoint, is unreadable "
            f"({first_line(e)}); move {os.path.dirname(self.best_path)} "
            "away to train on without it") from None

  # Restoring.

  def existing(self) -> list[str]:
    """This run's checkpoints, oldest first."""
    return list(self._latest.checkpoints)

  def restore_latest_readable(self) -> Position:
    """The newest checkpoint that reads back whole; older ones if it won't."""
    candidates = self.existing()
    for path in reversed(candidates):
      try:
        return self._restore(path)
      except Unreadable as e:
        logging.warning("checkpoint %s is unreadable (%s); trying the one "
                        "before it", path, e)
    raise UserError(f"{self.directory}: none of its {len(candidates)} "
                    "checkpoints is readable; move the directory away to "
                    "start over")

  def restore(self, path: str) -> Position:
    """Restores `path` into the model and optimizer; returns its position.
    It may be another run's (--resume_from, engine.evaluate --checkpoint),
    whose format is checked first."""
    _checked_format(run_files.checkpoint_dir_of(path),
                    f"checkpoint {path} is", "give another checkpoint")
    try:
      return self._restore(path)
    except Unreadable as e:
      raise UserError(f"checkpoint {path} is unreadable ({e}); give another "
                      "one") from None

  def _restore(self, path: str) -> Position:
    try:
      reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as e:
      if not _exists(path):
        raise UserError(f"{path}: no such checkpoint") from None
      raise Unreadable(first_line(e)) from None
    if not reader.has_tensor(_IDENTITY_KEY):
      raise UserError(f"{path} was not written by this engine (it records "
                      "no model identity); pass another --resume_from")
    try:
      stored = reader.get_tensor(_IDENTITY_KEY)
    except _DAMAGE as e:
      raise Unreadable(first_line(e)) from None
    stored = stored.decode() if isinstance(stored, bytes) else str(stored)
    if stored != self._identity:
      raise UserError(f"checkpoint {path} holds {stored}, but this run is "
                      f"{self._identity}; use another --model_dir, or the "
                      "flags that run was started with")
    if self._scales_loss and not reader.has_tensor(_LOSS_SCALE_KEY):
      # A float16 optimizer saves its loss scale; the other way round (a
      # float16 checkpoint resumed in float32 or bfloat16) works.
      raise UserError(f"checkpoint {path} was saved without float16 loss "
                      "scaling and cannot continue with "
                      "--mixed_precision=float16; resume it with "
                      "--mixed_precision=none or bfloat16")
    keys = reader.get_variable_to_shape_map()
    refusal = self._variables.refusal(keys)
    if refusal:
      raise UserError(f"checkpoint {path} {refusal}")
    missing = [name for name in self._optional
               if not any(key.startswith(f"{name}/") for key in keys)]
    checkpoint = tf.train.Checkpoint(
        **self._state, **self._variables.objects_for(keys),
        **{name: saved for name, saved in self._optional.items()
           if name not in missing})
    try:
      # expect_partial: evaluation restores a model without its optimizer.
      checkpoint.restore(path).expect_partial() \
          .assert_existing_objects_matched()
    except _DAMAGE as e:  # a damaged data file
      raise Unreadable(first_line(e)) from None
    except (AssertionError, ValueError) as e:
      raise UserError(f"checkpoint {path} does not match this model: "
                      f"{first_line(e)}") from None
    for name in missing:
      # The average starts at the weights restored; the counts at nothing
      # counted.
      self._optional[name].reset()
    self.restored_path = path
    return Position(int(self._epoch.numpy()), int(self._step.numpy()),
                    int(self._global_batch.numpy()),
                    int(self._world_size.numpy()),
                    float(self._seconds.numpy()))

  @contextlib.contextmanager
  def weights_of(self, path: str):
    """While the block runs, the model's variables and their average as
    checkpoint `path` (this run's best) holds them; the run's own again
    after. Restored into the model itself rather than a clone, which works
    for every model, subclassed ones and custom layers Keras cannot clone
    too. Raises Unreadable if its files were damaged since."""
    average = {name: saved for name, saved in self._optional.items()
               if name == _AVERAGE}
    kept = self._variables.model_variables + [
        v for saved in average.values() for v in saved.variables]
    values = [v.numpy() for v in kept]
    try:
      try:
        keys = tf.train.load_checkpoint(path).get_variable_to_shape_map()
        refusal = self._variables.refusal(keys)
        if refusal:
          raise Unreadable(refusal)
        tf.train.Checkpoint(
            **self._variables.objects_for(keys, optimizer=False),
            **average).restore(path).expect_partial()
      except _DAMAGE as e:
        raise Unreadable(first_line(e)) from None
      yield
    finally:
      for variable, value in zip(kept, values):
        variable.assign(value)

  @property
  def best_score(self) -> float:
    return float(self._best_score.numpy())

  # Saving.

  @property
  def latest_path(self) -> Optional[str]:
    return self._latest.latest_checkpoint

  def save(self, position: Position, global_step: int) -> str:
    """Saves as ckpt-<global_step>."""
    self._set_position(position)
    return self._save(self._latest, run_files.CHECKPOINT_NAME, global_step)

  def save_at_epoch_end(self, position: Position, global_step: int,
                        score: float) -> bool:
    """Saves the epoch; also as best/ if its `score` (the deciding
    validation figure, higher better) is the best so far, which it returns.

    The best score is recorded before the epoch's checkpoint is written,
    so a run resumed from it compares later epochs with the true best and
    never replaces best/ with a worse epoch. best/ is written first: if the
    latest then fails to save, the rerun redoes the epoch and compares it
    with the best before it.
    """
    best = score > self.best_score
    if best:
      self._best_score.assign(score)
      self._set_position(position)
      self._save(self._best, run_files.BEST_NAME, global_step)
    self.save(position, global_step)
    return best

  def _save(self, manager: tf.train.CheckpointManager, name: str,
            number: int) -> str:
    """A save whose failure leaves the directory as it was: the save's
    temporary files and its unfinished checkpoint are removed.

    Before the first checkpoint in the directory, their format: a
    checkpoint is never without it (a directory that holds some already
    passed the format check and says so). A directory of an earlier
    format this engine reads is of this one from its first save on: an
    engine that reads the earlier one alone must not take it for that."""
    if self._format != run_files.CHECKPOINT_FORMAT:
      path = os.path.join(self.directory, run_files.FORMAT_FILE)
      with storage.writing("the checkpoints' format", path):
        run_files.record_checkpoint_format(self.directory)
      self._format = run_files.CHECKPOINT_FORMAT
    prefix = os.path.join(manager.directory, f"{name}-{number}")
    try:
      with storage.writing("checkpoint", prefix, self.size):
        return manager.save(checkpoint_number=number)
    except WriteFailed:
      leftovers = [prefix + "_temp"] + glob.glob(os.path.join(
          manager.directory, "checkpoint.tmp*"))
      if prefix not in manager.checkpoints:  # not one recorded before
        leftovers += glob.glob(prefix + ".index") + glob.glob(
            prefix + ".data-*")
      storage.remove(*leftovers)
      raise

  @property
  def best_path(self) -> Optional[str]:
    return self._best.latest_checkpoint

  def _set_position(self, position: Position) -> None:
    self._epoch.assign(position.epoch)
    self._step.assign(position.step)
    self._global_batch.assign(position.global_batch)
    self._world_size.assign(position.world_size)
    self._seconds.assign(position.seconds)


def _manager(checkpoint: tf.train.Checkpoint, directory: str, keep: int,
             name: str) -> tf.train.CheckpointManager:
  """A CheckpointManager; it reads the directory's state file, whose damage
  is one line rather than a traceback."""
  try:
    return tf.train.CheckpointManager(checkpoint, directory,
                                      max_to_keep=keep, checkpoint_name=name)
  except (*_DAMAGE, ValueError, UnicodeDecodeError) as e:
    state = os.path.join(directory, run_files.CHECKPOINT_STATE_FILE)
    raise UserError(f"{state} is damaged ({first_line(e)}); it lists the "
                    "checkpoints beside it: restore it from a copy, or move "
                    f"{directory} away") from None


def resolve(path: str) -> str:
  """A checkpoint prefix from `path`: a prefix, a checkpoint directory, or a
  model_dir (whose checkpoints/ holds them)."""
  for directory in (path, os.path.join(path, run_files.CHECKPOINT_DIR)):
    if os.path.isdir(directory):
      latest = tf.train.latest_checkpoint(directory)
      if latest:
        return latest
  if _exists(path):
    return path
  raise UserError(f"--resume_from={path}: no checkpoint there (give a "
                  "model_dir, its checkpoints/ directory or a checkpoint "
                  "prefix such as .../ckpt-12)")


_IDENTITY_KEY = "identity/.ATTRIBUTES/VARIABLE_VALUE"
_BEST_SCORE_KEY = "best_score/.ATTRIBUTES/VARIABLE_VALUE"
_AVERAGE = "weight_average"  # the weights' average, with --ema_decay
_COUNTS = "run_counts"  # the run's counts (run_state.Counts)
_LOSS_SCALE_KEY = "loss_scale/.ATTRIBUTES/VARIABLE_VALUE"
# What TensorFlow's checkpoint reader raises for truncated or garbled files.
_DAMAGE = (tf.errors.OpError, IndexError, OSError)


class Unreadable(Exception):
  """A checkpoint whose files are damaged: fall back to an older one (or
  export the final model alone)."""


def _exists(prefix: str) -> bool:
  return bool(tf.io.gfile.glob(prefix + ".index"))


def _checked_format(directory: str, holder: str,
                    instead: str) -> Optional[int]:
  """The format of the checkpoints in `directory`, None if it holds none.
  Checkpoints of another format than this engine's are refused before
  anything is read, in one line that starts with `holder` (who holds
  them) and says what reads them, or `instead`: restored, their variables
  would be missing, or mean something else."""
  found = run_files.checkpoint_format(directory)
  if found in (None, run_files.CHECKPOINT_FORMAT,
               *run_files.CHECKPOINT_FORMATS_READ):
    return found
  unrecorded = (f" (written before {run_files.FORMAT_FILE} recorded it)"
                if found == 0 else "")
  raise UserError(
      f"{holder} of format {found}{unrecorded}, and this engine reads "
      f"formats {', '.join(map(str, run_files.CHECKPOINT_FORMATS_READ))} "
      f"and {run_files.CHECKPOINT_FORMAT} only: finish or evaluate that "
      f"run with {_READERS.get(found, 'the engine that wrote them')}, or "
      f"{instead}")
