"""A user's Keras callbacks, run by the engine's train loop as Keras' fit
runs them: `self.model` and `self.params` set, Keras' hooks called with
the run's exact, rank-reduced figures as `logs`.

Which ranks run them: every rank runs every callback with the same logs,
so what one decides (ReduceLROnPlateau's lower rate, EarlyStopping's stop)
is decided alike everywhere. A callback that writes files runs on rank 0
alone: Keras' CSVLogger and ModelCheckpoint, and a user's callback that
declares it with a class (or instance) attribute `writes_files = True`.

Stopping: a callback sets `model.stop_training = True` on some rank; the
ranks agree on it (the largest of every rank's, a collective) after each
hook that may set it, and the hook returns the agreed answer, so every rank
stops at the same step. After the batch hooks that agreement costs a
collective a step, so it is paid only where some callback overrides
`on_batch_end` or `on_train_batch_end` (`per_batch`), decided once.

The learning rate: ReduceLROnPlateau and LearningRateScheduler read and
assign `model.optimizer.learning_rate`. A compiled optimizer's float rate
is Keras' own variable: the assignment lands there, and the optimizer's
variables are checkpointed and broadcast. The engine's schedule
(WarmupThenDecay) cannot be assigned in Keras, so the optimizer is given
`RunRate` in its place: its value is the schedule at the optimizer's step,
and an assignment sets the schedule's `factor` so that the rate at this
step is the one assigned; later steps follow the schedule's curve
(warmup, decay) scaled by it, and the checkpoints keep the factor.

Refused, in one line naming the engine's own: BackupAndRestore (the engine
resumes from --model_dir's checkpoints), TensorBoard (the engine writes
its summaries), ProgbarLogger and History (the engine's progress and
History), and anything that is no keras.callbacks.Callback.

Epochs are counted from 0 in the hooks, as Keras does; a resumed run says
where it continues in `train_begin(initial_epoch)`, and its finished epochs
are not seen again. A callback's own state (EarlyStopping's wait) starts
afresh at each start, as under Keras' BackupAndRestore.
"""
from typing import Optional

import keras

from engine import distributed
from engine.compute import schedules
from engine.core import user_code
from engine.core.errors import UserError
from engine.core.errors import first_line

# Keras' callbacks that write files: rank 0 runs them alone.
WRITES_FILES = (keras.callbacks.CSVLogger, keras.callbacks.ModelCheckpoint)

# Keras' callbacks the engine does itself, and what it does instead.
REFUSED = {
    keras.callbacks.BackupAndRestore: (
        "the engine resumes from --model_dir's checkpoints (each epoch's, "
        "and every --checkpoint_every_steps)"),
    keras.callbacks.TensorBoard: (
        "the engine writes TensorBoard summaries to --model_dir "
        "(docs/watching.md)"),
    keras.callbacks.ProgbarLogger: (
        "the engine shows the run's progress on rank 0 itself"),
    keras.callbacks.History: "engine.fit returns the run's History itself",
}

# What a callback overrides to act after a step.
_BATCH_END = ("on_batch_end", "on_train_batch_end")
_BATCH_HOOKS = _BATCH_END + ("on_batch_begin", "on_train_batch_begin")

# What a rank sends to the agreement when one of its callbacks failed:
# above any stop_training (0 or 1).
_FAILED = 2.0


def writes_files(callback: keras.callbacks.Callback) -> bool:
  """Whether `callback` writes files, and so runs on rank 0 alone."""
  return (isinstance(callback, WRITES_FILES)
          or bool(getattr(callback, "writes_files", False)))


def epoch_logs(record: dict) -> dict:
  """An epoch record's figures (metrics.jsonl) under Keras' names: loss,
  accuracy, ..., val_loss, val_accuracy (the evaluated epochs'), and
  learning_rate."""
  logs = {key[len("train_"):]: value for key, value in record.items()
          if key.startswith("train_") and key != "train_examples"}
  logs.update({key: value for key, value in record.items()
               if key.startswith("val_") and value is not None})
  logs["learning_rate"] = record["learning_rate"]
  return logs


class RunRate:
  """The engine's schedule as a learning rate Keras can assign (above).

  Keras' optimizer reads a rate that is neither a schedule nor a variable
  by calling it, and assigns one through its `assign`."""

  def __init__(self, schedule: schedules.WarmupThenDecay,
               optimizer: keras.optimizers.Optimizer):
    self._schedule = schedule
    self._optimizer = optimizer

  def __call__(self):
    return self._schedule(self._optimizer.iterations)

  def assign(self, rate: float) -> None:
    current = float(self())
    if current == 0:
      raise UserError(f"the learning rate is 0 at step "
                      f"{int(self._optimizer.iterations)} of --lr_schedule="
                      f"{self._schedule.decay}, so no callback can scale it "
                      f"to {rate:g}; use --lr_schedule=constant")
    factor = self._schedule.factor
    factor.assign(float(factor) * float(rate) / current)


class KerasCallbacks:
  """A run's Keras callbacks (above): the loop calls the hooks, in Keras'
  order, on every rank alike."""

  def __init__(self, callbacks, *, model: keras.Model, is_chief: bool,
               epochs: int, steps_per_epoch: int,
               optimizer: Optional[keras.optimizers.Optimizer] = None,
               learning_rate=None):
    """`optimizer`: the one the run trains with (the model's compiled one
    if None); a model never compiled is given it, as compile() would.
    `learning_rate`: the run's rate, made assignable if it is the engine's
    schedule (RunRate)."""
    callbacks = list(callbacks or [])
    for callback in callbacks:
      _check(callback)
    self._model = model
    model.stop_training = False  # as fit() has it before any hook
    self.initial_epoch = 0  # train_begin's
    # Decided from every rank's list, so every rank pays the same
    # collectives.
    self.per_batch = any(_overrides(c, _BATCH_HOOKS) for c in callbacks)
    self._stop_per_batch = any(_overrides(c, _BATCH_END) for c in callbacks)
    self._list = keras.callbacks.CallbackList(
        [c for c in callbacks if is_chief or not writes_files(c)],
        model=model, epochs=epochs, steps=steps_per_epoch, verbose=0)
    if optimizer is None:
      optimizer = getattr(model, "optimizer", None)
    elif callbacks and getattr(model, "optimizer", None) is None:
      # Only for callbacks that read it: a model holding an optimizer
      # exports it into its .keras file too.
      model.optimizer = optimizer
    if isinstance(learning_rate, schedules.WarmupThenDecay):
      optimizer.learning_rate = RunRate(learning_rate, optimizer)

  def train_begin(self, initial_epoch: int) -> bool:
    """Before the first step of this start, at epoch `initial_epoch` (0 or
    where a resumed run continues); whether to stop."""
    self._model.stop_training = False
    self.initial_epoch = initial_epoch
    return self._run("on_train_begin", {})

  def epoch_begin(self, epoch: int) -> bool:
    """Before epoch `epoch` (from 0); whether to stop."""
    if epoch < self.initial_epoch:
      raise ValueError(f"epoch {epoch} was finished before this start, at "
                       f"epoch {self.initial_epoch}")
    return self._run("on_epoch_begin", epoch, {})

  def batch_begin(self, step: int) -> None:
    """Before the epoch's step `step` (from 0), if `per_batch`."""
    self._run("on_train_batch_begin", step, {}, agree=False)

  def batch_end(self, step: int, logs: dict) -> bool:
    """After the epoch's step `step` (from 0), if `per_batch`: `logs`
    what the loop has at hand, at least {"loss": ...}; whether to stop."""
    return self._run("on_train_batch_end", step, dict(logs),
                     agree=self._stop_per_batch)

  def epoch_end(self, epoch: int, logs: dict) -> bool:
    """After epoch `epoch` (from 0), given its figures (`epoch_logs`);
    whether to stop."""
    return self._run("on_epoch_end", epoch, dict(logs))

  def train_end(self, logs: dict) -> None:
    """After the last step of this start, given the last epoch's figures."""
    self._run("on_train_end", dict(logs))

  def _run(self, hook: str, *args, agree: bool = True) -> bool:
    """Calls `hook` on this rank's callbacks; with `agree`, every rank
    learns whether any stops or failed (a collective) and every rank fails
    with the first failure's line. Whether the ranks stop."""
    message = ""
    for callback in self._list.callbacks:
      try:
        getattr(callback, hook)(*args)
      except Exception as error:  # pylint: disable=broad-except
        message = (f"keras callback {type(callback).__name__}.{hook} "
                   f"raised {type(error).__name__}: {first_line(error)}")
        break
    if not agree:
      if message:
        raise UserError(message)
      return bool(self._model.stop_training)
    agreed = distributed.max_across_ranks(
        _FAILED if message else float(bool(self._model.stop_training)),
        name=f"keras_callbacks/{hook}")
    if agreed == _FAILED:
      messages = distributed.gathered(message, name=f"keras_failed/{hook}")
      rank, first = next((r, m) for r, m in enumerate(messages) if m)
      raise UserError(message or f"on rank {rank}: {first}")
    self._model.stop_training = bool(agreed)
    return bool(agreed)


def _check(callback) -> None:
  """A UserError unless `callback` is a Keras callback the engine runs."""
  if not isinstance(callback, keras.callbacks.Callback):
    raise UserError(f"callbacks: a {type(callback).__name__} is no "
                    "keras.callbacks.Callback; pass Keras 3 callbacks")
  for kind, instead in REFUSED.items():
    if isinstance(callback, kind):
      raise UserError(f"callbacks: keras.callbacks.{kind.__name__} is "
                      f"refused: {instead}; drop it")


def _overrides(callback: keras.callbacks.Callback, hooks) -> bool:
  """Whether `callback` has any of `hooks` of its own: its class's, or
  set on it (LambdaCallback's)."""
  return any(hook in vars(callback) or getattr(type(callback), hook)
             is not getattr(keras.callbacks.Callback, hook)
             for hook in hooks)


def of_flag(spec: str) -> tuple:
  """--callbacks' callbacks: what the user's function returns, as a
  tuple (checked with the others by KerasCallbacks); () without the flag."""
  if not spec:
    return ()
  made = user_code.load(spec, "callbacks")()
  if not isinstance(made, (list, tuple)):
    raise UserError(f"--callbacks={spec} returned a {type(made).__name__}; "
                    "return a list of keras.callbacks.Callback")
  return tuple(made)
