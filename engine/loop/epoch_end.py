"""The end of an epoch: what the train loop does after an epoch's last
step, in this order, on every rank alike.

1. Evaluation, of the epochs TrainingConfig.evaluates (every
   --eval_every_epochs, and the last): the whole test split, each rank its
   shard, with the weights' average if the run keeps one; on rank 0 the
   task's pictures of the first few test examples.
2. The record: the run's state records the epoch and moves on
   (LoopState.end_epoch), early stopping's count with it, so that the
   epoch's checkpoint holds the count that decides below.
3. The trial's report, for a sweep's trial (--trial_study_dir): its study
   answers whether it is pruned, which the record says.
4. The save and the commit: rank 0 writes the record, TensorBoard's
   figures and pictures and the epoch's checkpoint (best/ too, if the
   epoch is the best so far); under --elastic, the commit.
5. The decision: stop early (--target reached for --patience epochs),
   stop pruned, or train on.

The figures that decide are reduced over ranks, the same on every rank, so
all ranks stop after the same epoch.
"""
from typing import Callable, Optional

from absl import logging

from engine import datasets
from engine import tasks
from engine.compute import ema
from engine.compute import eval_step as eval_steps
from engine.compute import metrics
from engine.core.config import TrainConfig
from engine.loop import trial as trial_lib
from engine.loop.run_state import RunState
from engine.loop import keras_callbacks
from engine.loop.session import Session
from engine.records import report

# Test examples the task draws in TensorBoard each evaluated epoch.
SAMPLES = 4


class EpochEnd:
  """The end of each epoch (above), and the run's last line."""

  def __init__(self, *, config: TrainConfig, splits: datasets.Splits, model,
               eval_step: eval_steps.EvalStep,
               weight_average: Optional[ema.WeightAverage],
               decider: tasks.Decider,
               trial: Optional[trial_lib.TrialReports],
               commit: Callable[[RunState], None]):
    """`commit`: the loop's one commit path (under --elastic)."""
    self._config = config
    self._splits = splits
    self._model = model
    self._eval_step = eval_step
    self._weight_average = weight_average
    self._decider = decider
    self._trial = trial
    self._commit = commit
    self.last_val = None

  def __call__(self, session: Session, train: metrics.Result,
               train_seconds: float, skipped_steps: int) -> bool:
    """The epoch's end, given its train figures over all ranks, this
    rank's seconds and the train step's skipped steps since the commit;
    returns whether the run stops."""
    state = session.state
    # (A fit script may give no validation data: engine.fit.)
    val, pictures = (self._evaluate(session)
                     if self._config.training.evaluates(state.epoch)
                     and self._splits.test is not None else (None, {}))
    self.last_val = val or self.last_val
    record = state.end_epoch(
        train, val, train_seconds=train_seconds,
        input_seconds=session.times.input_seconds,
        step_seconds=session.times.step_seconds,
        eval_seconds=session.times.eval_seconds if val else None,
        skipped_steps=skipped_steps)
    if val and "stopped_early" not in record and self._pruned(session,
                                                               record):
      record["pruned"] = True
    # The fit script's callbacks see the record's figures before the save,
    # so the checkpoint holds a rate ReduceLROnPlateau just lowered.
    by_callback = session.callbacks.epoch_end(
        record["epoch"] - 1, keras_callbacks.epoch_logs(record))
    if by_callback:
      record["stopped_early"] = True  # as engine.runs and sweeps read it
    if record.get("stopped_early") or record.get("pruned"):
      state.stop()  # before the save: the checkpoint holds the stop
    self._save_and_commit(session, record, val, pictures)
    return self._decided(session, record, by_callback)

  def _evaluate(self, session: Session) -> tuple[metrics.Result, dict]:
    """The whole test split, each rank its shard, reduced exactly; and on
    rank 0 the task's pictures of the first few test examples."""
    pictures = {}
    with session.times.evaluation(), ema.averaged(self._weight_average):
      val = eval_steps.evaluate(self._eval_step, datasets.eval_batches(
          self._splits.test, self._splits.info,
          shard=datasets.Shard(session.world.rank, session.world.size),
          batch_size=self._config.training.batch_size))
      if session.directory:
        pictures = self._pictures()
    return val, pictures

  def _pictures(self) -> dict:
    """The task's TensorBoard pictures of the first SAMPLES test examples
    (segmentation: image, true and predicted masks; reconstruction: image,
    noisy image, reconstruction)."""
    task = self._eval_step.task
    if not tasks.defines(task, "sample_images"):
      return {}  # the task draws none
    for images, labels in datasets.eval_batches(
        self._splits.test, self._splits.info, shard=datasets.Shard(0, 1),
        batch_size=SAMPLES).take(1):
      return task.sample_images(self._model, images, labels)
    return {}  # an empty test split

  def _pruned(self, session: Session, record: dict) -> bool:
    """A sweep's trial: whether its study prunes it after this epoch.
    Rank 0 asks; every rank gets the answer, so all stop together."""
    if not self._trial:
      return False
    return session.on_chief(lambda directory: self._trial.pruned_after(
        record["epoch"], record[self._decider.key]), name="trial_report")

  def _save_and_commit(self, session: Session, record: dict,
                       val: Optional[metrics.Result], pictures: dict) -> None:
    """Rank 0 writes the record, TensorBoard's images and the epoch's
    checkpoints; then the commit. Nothing of the epoch is left to count:
    the checkpoint keeps the state's counts as they stand."""
    state = session.state
    state.keep()
    position = state.position(seconds=record["cumulative_seconds"])
    global_step = state.global_step
    images = ({**self._eval_step.task.summary_images(val.sums), **pictures}
              if val else {})
    session.on_chief(lambda directory: directory.end_epoch(
        record, images, position, global_step), name="end_epoch")
    self._commit(state.snapshot(seconds=record["cumulative_seconds"]))

  def _decided(self, session: Session, record: dict,
               by_callback: bool) -> bool:
    """Whether the run stops here: pruned by its study, or early (by a
    Keras callback, or its --target)."""
    if record.get("pruned"):
      session.on_chief(lambda directory: directory.record_pruned(
          record["epoch"], self._trial.pruner), name="pruned")
      return True
    if by_callback:
      logging.info("stopping at epoch %d: a Keras callback set "
                   "model.stop_training", record["epoch"])
      return True
    if record.get("stopped_early"):
      training = self._config.training
      logging.info("stopping early: %s %s %g for %d epochs; first reached "
                   "at epoch %d, %.1fs", self._decider.key,
                   "<=" if self._decider.minimize else ">=",
                   training.target, training.patience,
                   record["target_accuracy_first_epoch"],
                   record["target_accuracy_first_seconds"])
      return True
    return False

  def say_how_the_run_ended(self, session: Session) -> None:
    """The run's last line: its last evaluation's figures, or that it had
    no epochs left to train."""
    if self.last_val:
      logging.info("final %s (%d examples); metrics in %s",
                   report.in_words(self.last_val.figures),
                   self.last_val.examples, session.reporter.metrics_path)
    elif session.state.stopped and not session.state.history:
      logging.info("%s stopped early after epoch %d: nothing left to "
                   "train; pass a larger --epochs to train on, or start a "
                   "new run from its weights (another --model_dir, "
                   "--init_from=%s)", self._config.training.model_dir,
                   session.state.epoch, self._config.training.model_dir)
    elif not session.state.history:
      logging.info("%s has finished its %d epochs already; pass a larger "
                   "--epochs to train on, or another --model_dir for a new "
                   "run", self._config.training.model_dir,
                   self._config.training.epochs)
