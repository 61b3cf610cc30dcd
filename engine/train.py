r"""Data-parallel training with Horovod: the engine's one training loop.

Launch one process per device:

  horovodrun --gloo -np 2 .venv/bin/python -m engine.train --flagfile=flags/X.cfg

Read `train()` top to bottom to follow a batch from disk to the optimizer:
distributed setup, input pipeline, model, optimizer, then the loop: a start
(from a checkpoint, or after an elastic reset), and per epoch its steps, its
evaluation and its end. What the parts are built from lives beside this
file: the flags as values (config.py), the parts (build.py), rank 0's
model_dir (model_dir.py), the state a run continues from (run_state.py),
the command line and its one-line errors (cli.py).
"""
import dataclasses
import functools
import time
from typing import Optional

from absl import app
from absl import logging
import tensorflow as tf

from engine import build
from engine import cli
from engine import data
from engine import distributed
from engine import elastic
from engine import ema
from engine import metrics
from engine import optimizers
from engine import preemption
from engine import report
from engine import schedules
from engine import step as steps
from engine import stopping
from engine import tasks
from engine.config import TrainConfig
from engine.errors import Diverged
from engine.model_dir import RunDirectory
from engine.run_state import NO_EXAMPLES
from engine.run_state import RunState
from engine.run_state import starting_point
from engine.session import Session

# Test examples the task draws in TensorBoard each evaluated epoch.
SAMPLES = 4


@dataclasses.dataclass
class TrainResult:
  model: tf.keras.Model
  history: list[dict]    # the epochs' metrics.jsonl records, on every rank
  train_step: steps.TrainStep
  eval_step: steps.EvalStep
  # --ema_decay's average of the weights, which evaluation used; else None.
  weight_average: Optional[ema.WeightAverage] = None


def train(config: TrainConfig) -> TrainResult:
  elastic.check_launch(config.elastic)
  # Distributed setup (Horovod, this process's device and cores), the data
  # set every rank reads its own shard of, and the model.
  config, world, splits, task, model = build.prepare(config)
  # With --stage_dir, each rank reads its files from node-local copies.
  splits, staged = build.stage(config, world, splits)
  info = splits.info
  logging.info("%s: %d train, %d test examples of %s", info.name,
               info.num_train, info.num_test,
               "x".join(map(str, info.image_shape)))
  logging.info("model %s: %d parameters; task %s", model.name,
               model.count_params(), task.name)

  # Optimizer and learning rate: scaled with the global batch (linear:
  # base_lr * world.size, set for each number of processes the loop runs
  # on), warmed up per step, then decayed; a function of the step evaluated
  # inside the train step.
  learning_rate = build.learning_rate_schedule(config)
  # The weights' moving average, which evaluation and exports use.
  weight_average = ema.maybe_average(model, config.ema_decay)
  optimizer, train_step = build.optimizer_and_step(config, task, model,
                                                   learning_rate,
                                                   weight_average)
  eval_step = build.eval_step(config, task, model)
  # The validation figure that decides best/, early stopping and --target.
  decider = build.decider(config, task)
  build.describe_numerics(config, world)

  # The train loop, from the checkpoint in model_dir if there is one. Under
  # --elastic, Horovod runs it again after each change of workers, from the
  # state last committed.
  loop = _TrainLoop(config=config, world=world, splits=splits, model=model,
                    optimizer=optimizer, learning_rate=learning_rate,
                    train_step=train_step, eval_step=eval_step,
                    weight_average=weight_average, decider=decider,
                    staged=staged,
                    stop=stopping.Target(config.target, config.patience,
                                         minimize=decider.minimize))
  state = elastic.TrainingState(loop.variables, run_state=None)
  try:
    history = (elastic.restarting(loop)(state) if config.elastic
               else loop(state))
    # Whoever is rank 0 at the end exports; every rank learns if it failed.
    distributed.on_chief(loop.directory.export if distributed.is_chief()
                         else None, name="export")
  except BaseException as e:
    if loop.directory:  # rank 0's (Horovod may be shut down: no hvd.rank())
      loop.directory.record_end(e)  # for engine.runs: how the run stopped
    raise
  return TrainResult(model=model, history=history, train_step=train_step,
                     eval_step=eval_step, weight_average=weight_average)


class _TrainLoop:
  """The epochs, from an elastic.TrainingState to the end of training.

  Runs once; under --elastic, again after each reset, from the last commit,
  on the processes there are then. So everything that depends on their
  number is set up at the start of a call (`_begin`): the global batch, the
  steps per epoch, the learning rate, this rank's data, who is rank 0.
  """

  def __init__(self, *, config: TrainConfig, world: distributed.World,
               splits, model: tf.keras.Model, optimizer,
               learning_rate: schedules.WarmupThenDecay,
               train_step: steps.TrainStep, eval_step: steps.EvalStep,
               weight_average: Optional[ema.WeightAverage],
               decider, staged: Optional[dict], stop: stopping.Target):
    self._config = config
    self._world = world
    self._splits = splits
    self._model = model
    self._optimizer = optimizer
    self._learning_rate = learning_rate
    self._train_step = train_step
    self._eval_step = eval_step
    self._weight_average = weight_average
    self._decider = decider
    self._staged = staged  # the staging's record, for metrics.jsonl
    self._stop = stop
    self._rollbacks = 0  # in this process's life (see --max_rollbacks)
    self._elastic_state = None  # the call's elastic.TrainingState
    self.directory = None  # rank 0's model_dir: checkpoints, flags, exports

  def variables(self) -> list[tf.Variable]:
    """What every rank must hold alike, and a checkpoint or a commit keeps:
    weights, optimizer state, the learning rate's factor, the weights'
    average and the early stopping count."""
    return (self._model.variables + optimizers.state(self._optimizer)
            + [self._learning_rate.factor]
            + ema.variables(self._weight_average)
            + list(self._stop.variables))

  def __call__(self, state: elastic.TrainingState) -> list[dict]:
    self._elastic_state = state
    session = self._begin(state.run_state)
    try:
      epoch = session.first_epoch
      while epoch < self._config.epochs:
        try:
          train, train_seconds = self._train_epoch(session, epoch)
        except steps.NonFinite as nonfinite:
          epoch = self._diverged(session, nonfinite)
          continue
        val, pictures = (self._evaluate(session)
                         if self._config.evaluates(epoch) else (None, {}))
        if self._end_epoch(session, epoch, train, val, pictures,
                           train_seconds):
          break
        epoch += 1
    finally:
      session.close()
    session.say_how_it_ended()
    return session.history

  # A start: where training continues from, on how many processes.

  def _begin(self, committed: Optional[RunState]) -> Session:
    """Sets up a call: the batch and steps for the processes there are,
    the state to continue from, the learning rate, this rank's data."""
    config, info = self._config, self._splits.info
    world = distributed.current(self._world)
    chief = distributed.is_chief()
    report.configure_logging(chief)
    # A step takes grad_accum_steps micro-batches of batch_size per rank.
    step_batch = config.batch_size * config.grad_accum_steps
    steps_per_epoch = data.steps_per_epoch(
        num_train=info.num_train, batch_size=step_batch,
        world_size=world.size, requested=config.steps_per_epoch)
    global_batch = step_batch * world.size
    logging.info("global batch %d on %d processes%s, %d steps per epoch",
                 global_batch, world.size,
                 f" ({config.grad_accum_steps} micro-batches of "
                 f"{config.batch_size} per process)"
                 if config.grad_accum_steps > 1 else "", steps_per_epoch)
    run_state, fresh = self._continue_from(committed, world, chief,
                                           global_batch)
    first_epoch, first_step = starting_point(
        run_state.position, steps_per_epoch, global_batch, world.size)
    self._set_learning_rate(world, steps_per_epoch,
                            first_epoch * steps_per_epoch + first_step)
    if committed is None:
      # What a worker lost before the first commit would go back to.
      self._commit(run_state)
    session = Session(
        config=config, world=world, directory=self.directory if chief
        else None, steps_per_epoch=steps_per_epoch,
        global_batch=global_batch, first_epoch=first_epoch,
        first_step=first_step, run_state=run_state,
        train_totals=self._train_step.totals,
        best_metric=str(self._decider),
        batches_from=functools.partial(
            data.train_batches, self._splits.train, info, rank=world.rank,
            world_size=world.size, batch_size=step_batch,
            steps=steps_per_epoch, seed=config.seed, flip=config.random_flip,
            shift=config.random_shift, transpose=config.random_transpose,
            resizing=config.progressive_resizing))
    if fresh and config.on_nonfinite == "rollback":
      # Something to roll back to before the first epoch's checkpoint.
      session.on_chief(lambda directory: directory.save(
          session.position(0, 0), 0), name="initial_checkpoint")
    return session

  def _continue_from(self, committed: Optional[RunState],
                     world: distributed.World, chief: bool,
                     global_batch: int) -> tuple[RunState, bool]:
    """The state to continue from, the same on every rank, and whether the
    run is new (nothing to continue).

    Checkpoints and resuming: rank 0 alone reads and writes model_dir. The
    run's first start restores the latest checkpoint, and every rank
    continues from rank 0's variables, restored or initial, so the first
    averaged gradient is taken at one point. A restart (elastic) continues
    from the committed state instead, whose variables Horovod has synced.
    """
    if chief and self.directory is None:
      self.directory = RunDirectory(
          self._config.model_dir, self._config, model=self._model,
          optimizer=self._optimizer, info=self._splits.info,
          task=self._train_step.task, decider=self._decider,
          lr_factor=self._learning_rate.factor,
          weight_average=self._weight_average, stop=self._stop)
    directory = self.directory if chief else None
    if committed is not None:
      position = committed.position
      logging.info("restarting on %d processes (was %d) from the commit at "
                   "epoch %d, step %d", world.size, position.world_size,
                   position.epoch + 1, position.step)
      if directory and directory.checkpoints is None:
        directory.take_over()  # rank 0 now, and not at the first start
      return committed, False
    position = distributed.on_chief(directory.open if directory else None,
                                    name="resume")
    if directory and self._staged:
      directory.record_event(self._staged)
    distributed.broadcast_from_chief(self.variables())
    if position is None:
      return RunState.beginning(global_batch, world.size), True
    return RunState.at(position), False

  def _set_learning_rate(self, world: distributed.World,
                         steps_per_epoch: int, global_step: int) -> None:
    """The schedule for this number of processes, at `global_step`."""
    config = self._config
    self._learning_rate.set_world(world_size=world.size,
                                  steps_per_epoch=steps_per_epoch)
    optimizers.set_step(self._optimizer, global_step)
    logging.info("learning rate %g x %d processes (%s) = %g%s",
                 config.base_lr, world.size, config.lr_scaling,
                 self._learning_rate.peak_lr,
                 f" after {config.warmup_epochs:g} warmup epochs"
                 if config.warmup_epochs else "")

  def _commit(self, run_state: RunState) -> None:
    """Under --elastic, what a reset goes back to: `run_state` and the
    variables, copied in host memory. The one commit path: at the start,
    every --commit_every_steps, at each epoch's end and after a rollback."""
    if self._config.elastic:
      self._elastic_state.commit(run_state=run_state)

  # An epoch: its steps, its evaluation, its record.

  def _train_epoch(self, session: Session,
                   epoch: int) -> tuple[metrics.Result, float]:
    """The epoch's remaining steps; its train figures over all ranks and
    this rank's seconds."""
    train_step = self._train_step
    began = time.perf_counter()
    train_step.totals.reset()
    train_step.skipped_steps = 0
    session.times.reset()
    session.window.start_epoch(session.first_step)
    session.progress.start_epoch(epoch, session.first_step)
    done = session.first_step
    while done < session.steps_per_epoch:
      count = self._steps_in_call(session, epoch, done)
      first = epoch * session.steps_per_epoch + done + 1
      session.global_step = first
      with session.profiler.step(first):
        ran, stop_agreed = self._call(session, count)
      done += ran
      session.global_step = first + ran - 1
      if not session.optimizer_state_broadcast:
        # Once per start, after the first update: whatever state an
        # optimizer creates at its first step rather than in
        # optimizers.build_state becomes rank 0's too. The model's
        # variables are every rank's already (BatchNorm's statistics are
        # averaged at every step: steps.TrainStep._shared).
        distributed.broadcast_from_chief(optimizers.state(self._optimizer))
        session.optimizer_state_broadcast = True
      self._after_step(session, epoch, done, stop_agreed)
      session.progress.step(done)
    session.steps_run = session.steps_per_epoch - session.first_step
    session.first_step = 0
    # An allreduce: all ranks are done.
    train = train_step.totals.result_of(session.epoch_sums
                                        + train_step.totals.sums())
    session.epoch_sums = NO_EXAMPLES
    return train, time.perf_counter() - began

  def _call(self, session: Session, count: int) -> tuple[int, bool]:
    """`count` steps (fewer if the ranks agree to stop): one call of the
    train step per step at --steps_per_call=1, the batch read on the host
    and its wait timed apart; one call for all of them beyond, reading its
    batches inside (their wait is then step time). Returns the steps run
    and whether the ranks agreed to stop."""
    requested = session.stop_requests.requested
    if self._config.steps_per_call == 1:
      with session.times.input():
        images, labels = next(session.batches)
      with session.times.step():
        return 1, self._train_step(images, labels, requested)
    with session.times.step():
      return self._train_step.steps(session.batches, count, requested)

  def _steps_in_call(self, session: Session, epoch: int, done: int) -> int:
    """How many steps the next call takes, after step `done` of `epoch`: up
    to --steps_per_call, ending at the epoch's end and at every step where
    something is due (a checkpoint, a commit, a summary), so cadences hold
    step by step at any K; one alone for the start's first step (its
    optimizer state is broadcast after it) and each profiled step (traced
    and marked one by one)."""
    config = self._config
    if not session.optimizer_state_broadcast:
      return 1
    taken = epoch * session.steps_per_epoch + done
    count = min(config.steps_per_call, session.steps_per_epoch - done)
    for every in (config.checkpoint_every_steps, config.summary_every_steps,
                  config.commit_every_steps if config.elastic else 0):
      if every:
        count = min(count, every - taken % every)
    return session.profiler.steps_untraced(taken + 1, count)

  def _after_step(self, session: Session, epoch: int, done: int,
                  stop_agreed: bool) -> None:
    """What follows step `done` of `epoch` (the last of a call): a stop the
    ranks agreed on, and the saves, commits and summaries due at this
    step."""
    config, totals = self._config, self._train_step.totals
    global_step = session.global_step
    position = session.position(epoch, done)
    if stop_agreed:
      preemption.stop(
          session.stop_requests.signum,
          f"epoch {position.epoch + 1}, step {position.step}",
          session.directory and functools.partial(
              session.directory.save, position, global_step))
    if (config.checkpoint_every_steps
        and global_step % config.checkpoint_every_steps == 0):
      session.on_chief(lambda directory: directory.save(position,
                                                        global_step),
                       name="save")
    if (config.elastic and config.commit_every_steps
        and global_step % config.commit_every_steps == 0):
      # The epoch's figures so far go with the commit: the steps a
      # restart redoes are counted once.
      session.epoch_sums = session.epoch_sums + totals.sums()
      totals.reset()
      self._commit(session.run_state(position))
    if (session.directory and config.summary_every_steps
        and global_step % config.summary_every_steps == 0):
      # Rank 0's figures since the last summary: its running sums and
      # times, read on the host after a step whose status was read.
      session.reporter.steps(global_step, dict(
          session.window.read(done, totals.local_sums(),
                              session.times.step_seconds),
          learning_rate=float(self._learning_rate(global_step - 1))))

  def _evaluate(self, session: Session) -> tuple[metrics.Result, dict]:
    """The whole test split, each rank its shard, reduced exactly; and on
    rank 0 the task's pictures of the first few test examples."""
    pictures = {}
    with ema.averaged(self._weight_average):
      session.val = steps.evaluate(self._eval_step, data.eval_batches(
          self._splits.test, self._splits.info, rank=session.world.rank,
          world_size=session.world.size, batch_size=self._config.batch_size))
      if session.directory:
        pictures = self._pictures()
    return session.val, pictures

  def _pictures(self) -> dict:
    """The task's TensorBoard pictures of the first SAMPLES test examples
    (segmentation: image, true and predicted masks; reconstruction: image,
    noisy image, reconstruction)."""
    task = self._eval_step.task
    if not tasks.defines(task, "sample_images"):
      return {}  # the task draws none
    for images, labels in data.eval_batches(
        self._splits.test, self._splits.info, rank=0, world_size=1,
        batch_size=SAMPLES).take(1):
      return task.sample_images(self._model, images, labels)
    return {}  # an empty test split

  def _end_epoch(self, session: Session, epoch: int,
                 train: metrics.Result, val: Optional[metrics.Result],
                 pictures: dict, train_seconds: float) -> bool:
    """Records, saves and commits the epoch (`val` None: not evaluated),
    with the task's TensorBoard `pictures`; returns whether to stop."""
    config = self._config
    global_step = (epoch + 1) * session.steps_per_epoch
    record = session.end_epoch(
        epoch, train, val, train_seconds=train_seconds,
        # The rate of the epoch's last update, as the optimizer applied it.
        learning_rate=float(self._learning_rate(global_step - 1)),
        skipped_steps=self._train_step.skipped_steps)
    stop_now = bool(val) and self._stop.update(
        epoch=epoch + 1, value=val.figures[self._decider.figure],
        cumulative_seconds=record["cumulative_seconds"])
    if stop_now:
      record["stopped_early"] = True
    if config.target:
      record["target_accuracy_first_epoch"] = self._stop.first_reached_epoch
      record["target_accuracy_first_seconds"] = \
          self._stop.first_reached_seconds
    position = session.position(epoch + 1, 0,
                                seconds=record["cumulative_seconds"])
    session.on_chief(lambda directory: directory.end_epoch(
        session.reporter, record,
        {**self._eval_step.task.summary_images(val.sums), **pictures}
        if val else {},
        position, global_step), name="end_epoch")
    self._commit(session.run_state(position))
    if stop_now:
      logging.info("stopping early: %s %s %g for %d epochs; first reached "
                   "at epoch %d, %.1fs", self._decider.key,
                   "<=" if self._decider.minimize else ">=",
                   config.target, config.patience,
                   self._stop.first_reached_epoch,
                   self._stop.first_reached_seconds)
    return stop_now

  # A divergence: stop, or roll back.

  def _diverged(self, session: Session,
                nonfinite: steps.NonFinite) -> int:
    """After a step that was not finite (and not applied, on any rank):
    stops with Diverged, or rolls back (--on_nonfinite=rollback) and
    returns the epoch to go on from."""
    config = self._config
    session.global_step += nonfinite.step - 1  # the call's step that failed
    global_step = session.global_step
    epoch, step = divmod(global_step - 1, session.steps_per_epoch)
    rate = float(self._learning_rate(global_step - 1))
    what = (f"at global step {global_step} (epoch {epoch + 1}, step "
            f"{step + 1}) with learning rate {rate:.4g}: {nonfinite}")
    rolling_back = config.on_nonfinite == "rollback"
    if rolling_back and self._rollbacks < config.max_rollbacks:
      return self._roll_back(session, what)
    latest = session.on_chief(
        lambda directory: directory.checkpoints.latest_path, name="latest")
    kept = (f"nothing was saved after {latest}, the last good checkpoint"
            if latest else "no checkpoint was saved")
    advice = (f"{self._rollbacks} rollbacks (--max_rollbacks) did not get "
              "past it; lower --base_lr" if rolling_back else
              "lower --base_lr, or pass --on_nonfinite=rollback")
    raise Diverged(f"training diverged {what}; the step was not applied and "
                   f"{kept}; {advice}")

  def _roll_back(self, session: Session, what: str) -> int:
    """Back to the last good checkpoint (rank 0 restores it, every rank
    receives it: weights, optimizer, and the early stopping count as it
    was then), with the learning rate multiplied by --rollback_lr_factor
    from then on: what practitioners do by hand after a loss spike."""
    config = self._config
    factor = float(self._learning_rate.factor.numpy()) * \
        config.rollback_lr_factor
    position, path = session.on_chief(
        lambda directory: directory.roll_back(), name="rollback")
    distributed.broadcast_from_chief(self.variables())
    self._learning_rate.factor.assign(factor)
    self._rollbacks += 1
    first_epoch, first_step = starting_point(
        position, session.steps_per_epoch, session.global_batch,
        session.world.size)
    first_global_step = first_epoch * session.steps_per_epoch + first_step
    optimizers.set_step(self._optimizer, first_global_step)
    session.read_from(first_epoch, first_step)
    session.history = [r for r in session.history
                       if r["epoch"] <= first_epoch]
    session.epoch_sums = NO_EXAMPLES
    logging.warning("rolling back %s; back to %s (global step %d), learning "
                    "rate x%g from now on (rollback %d of at most %d)", what,
                    path, first_global_step, factor, self._rollbacks,
                    config.max_rollbacks)
    record = {"event": "rollback", "epoch": first_epoch,
              "global_step": first_global_step,
              "diverged_at_step": session.global_step, "checkpoint": path,
              "learning_rate_factor": factor, "rollback": self._rollbacks}
    session.on_chief(lambda directory: directory.record_rollback(
        session.reporter, record), name="record_rollback")
    # The run's clock goes on: the time of the undone steps was spent.
    self._commit(session.run_state(session.position(first_epoch,
                                                    first_step)))
    return first_epoch



def run(*, model=None, dataset=None, **flag_values) -> TrainResult:
  """Trains from a Python script, launched as `horovodrun --gloo -np N python
  SCRIPT.py`: `model` and `dataset` are functions or names, any other
  keyword a flag's default (engine.cli.run says how)."""
  return cli.run(train, model=model, dataset=dataset, **flag_values)


def main(argv):
  # `train` is looked up when called: a test may wrap it.
  cli.train_or_exit(train, argv)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
