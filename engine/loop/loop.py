"""The train loop: the epochs of one run, from where it stands to its end.

`TrainLoop` reads top-down: a start (from a checkpoint, or after an elastic
reset), then per epoch its steps and its end (epoch_end.py: evaluation,
the record, the trial's report, the save and commit, the decision to
stop). Between steps it runs actions (actions.py); the run's state has one
owner (run_state.LoopState); a start's resources are a Session
(session.py). engine/train.py builds the parts and runs it.
"""
import functools
import time
from typing import Optional, Sequence

from absl import logging
import tensorflow as tf

from engine import datasets
from engine import distributed
from engine.compute import ema
from engine.compute import metrics
from engine.compute import optimizers
from engine.compute.step_outcome import NonFinite
from engine.distributed import elastic
from engine.loop import actions
from engine.loop import keras_callbacks
from engine.loop import preemption
from engine.loop import run_state
from engine.loop import session as session_lib
from engine.loop import stopping
from engine.loop import trial
from engine.loop.divergence import Divergence
from engine.loop.epoch_end import EpochEnd
from engine.loop.keras_callbacks import KerasCallbacks
from engine.loop.parts import TrainingParts
from engine.loop.run_directory import RunDirectory
from engine.loop.run_state import LoopState
from engine.loop.run_state import RunState
from engine.loop.session import Session
from engine.records import report
from engine.records import warm_start


class TrainLoop:
  """The epochs, from an elastic.TrainingState to the end of training.

  Runs once; under --elastic, again after each reset, from the last commit,
  on the processes there are then. So everything that depends on their
  number is set up at the start of a call (`_begin`): the global batch, the
  steps per epoch, the learning rate, this rank's data, who is rank 0.
  """

  def __init__(self, parts: TrainingParts,
               user_actions: Sequence[actions.Action] = ()):
    self._config = parts.config
    self._parts = parts
    self._model = parts.model
    self._optimizer = parts.optimizer
    self._learning_rate = parts.learning_rate
    self._train_step = parts.train_step
    # The early stopping count, with --target and --patience.
    training = self._config.training
    self._stop = stopping.Target(training.target, training.patience,
                                 minimize=parts.decider.minimize)
    # The run's counts as its checkpoints keep them.
    self._counts = run_state.Counts(
        self._train_step.totals.local_sums().size)
    # A sweep's trial reports to its study (--trial_study_dir).
    self._trial = (trial.TrialReports(self._config.trial, str(parts.decider))
                   if self._config.trial.study_dir else None)
    self._epoch_end = EpochEnd(
        config=parts.config, splits=parts.splits, model=parts.model,
        eval_step=parts.eval_step, weight_average=parts.weight_average,
        decider=parts.decider, trial=self._trial, commit=self._commit)
    self._diverged = Divergence(self._config.faults, self.variables,
                                self._commit)
    self._user_actions = list(user_actions)
    self._actions = []  # the start's (_begin)
    self._elastic_state = None  # the call's elastic.TrainingState
    self.directory = None  # rank 0's model_dir: checkpoints, flags, exports

  def variables(self) -> list[tf.Variable]:
    """What every rank must hold alike, and a checkpoint or a commit keeps:
    weights, optimizer state (its step counter first), the learning rate's
    factor, the weights' average, the early stopping count and the run's
    counts."""
    return (self._model.variables + optimizers.state(self._optimizer)
            + [self._learning_rate.factor]
            + ema.variables(self._parts.weight_average)
            + list(self._stop.variables) + list(self._counts.variables))

  def __call__(self, elastic_state: elastic.TrainingState) -> list[dict]:
    self._elastic_state = elastic_state
    session = self._begin(elastic_state.run_state)
    state = session.state
    try:
      while (state.epoch < self._config.training.epochs
             and not state.stopped):
        if session.callbacks.epoch_begin(state.epoch):
          break  # a Keras callback stopped the run
        try:
          train, train_seconds = self._train_epoch(session)
        except NonFinite as nonfinite:
          self._diverged(session, nonfinite)  # stops, or rolls back
          continue
        # With the train step's skipped steps since the commit.
        if self._epoch_end(session, train, train_seconds,
                           self._train_step.skipped_steps):
          break
      session.callbacks.train_end(keras_callbacks.epoch_logs(
          state.history[-1]) if state.history else {})  # (a collective)
      session.profiler.finish()
    finally:
      session.close()
    self._epoch_end.say_how_the_run_ended(session)
    return list(state.history)

  # A start: where training continues from, on how many processes.

  def _begin(self, committed: Optional[RunState]) -> Session:
    """Sets up a call: the batch and steps for the processes there are,
    the state to continue from, the learning rate, this rank's data."""
    config = self._config
    world = distributed.current(self._parts.world)
    chief = distributed.is_chief()
    report.configure_logging(chief)
    training = config.training
    stream = datasets.TrainingStream.of(
        config, self._parts.splits, rank=world.rank, world_size=world.size,
        task=self._train_step.task)
    session_lib.log_batches(stream)
    steps_per_epoch, global_batch = stream.steps_per_epoch, stream.global_batch
    run_state, fresh = self._continue_from(committed, world, chief,
                                           global_batch)
    # The schedule for this number of processes.
    self._learning_rate.set_world(world_size=world.size,
                                  steps_per_epoch=steps_per_epoch)
    state = LoopState(optimizer=self._optimizer,
                      learning_rate=self._learning_rate, start=run_state,
                      steps_per_epoch=steps_per_epoch,
                      global_batch=global_batch, world_size=world.size,
                      gradient_bytes=self._train_step.gradient_bytes,
                      epochs=training.epochs,
                      best_metric=str(self._parts.decider), stop=self._stop,
                      counts=self._counts)
    if committed is None:
      # What a worker lost before the first commit would go back to.
      self._commit(state.snapshot())
    session = Session(
        config=config, precision_choice=self._parts.precision,
        compression=self._parts.communication.compression, world=world,
        directory=self.directory if chief else None, state=state,
        train_step=self._train_step, stream=stream, callbacks=KerasCallbacks(
            self._parts.callbacks, model=self._model, is_chief=chief,
            epochs=training.epochs, steps_per_epoch=steps_per_epoch,
            optimizer=self._optimizer, learning_rate=self._learning_rate))
    if fresh and config.faults.on_nonfinite == "rollback":
      # Something to roll back to before the first epoch's checkpoint.
      self._save(session)
    self._actions = self._cadences(session) + self._user_actions + [
        session.profiler]
    session.callbacks.train_begin(state.epoch)
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
    parts = self._parts
    if chief and self.directory is None:
      self.directory = RunDirectory(
          self._config.training.model_dir, self._config,
          precision_choice=parts.precision,
          communication_choice=parts.communication, model=self._model,
          optimizer=self._optimizer, info=parts.splits.info,
          task=self._train_step.task, decider=parts.decider,
          lr_factor=self._learning_rate.factor,
          weight_average=parts.weight_average, stop=self._stop,
          counts=self._counts, mlperf=parts.mlperf)
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
    if self._trial:
      distributed.on_chief(self._trial.open if directory else None,
                           name="trial")
    for record in (parts.staged, parts.cpu_kernels):
      if directory and record:  # the staging's, the CPU kernels'
        directory.record_event(record)
    # --init_from: a new run's weights from another's file, on rank 0, then
    # everyone's with the broadcast; a resumed run has its own.
    warm = distributed.on_chief(functools.partial(
        warm_start.start_from, self._model,
        self._config.checkpoints.init_from, resuming=position is not None)
                                if directory else None, name="init_from")
    if warm and directory:
      logging.info("%s", warm)
    distributed.broadcast_from_chief(self.variables())
    if position is None:
      return RunState.beginning(global_batch, world.size), True
    return RunState.at(position, self._counts), False

  def _commit(self, run_state: RunState) -> None:
    """Under --elastic, what a reset goes back to: `run_state` and the
    variables, copied in host memory. The one commit path: at the start,
    every --commit_every_steps, at each epoch's end and after a rollback."""
    if self._config.faults.elastic:
      self._elastic_state.commit(run_state=run_state)

  # What happens between steps: the cadences, as actions
  # (engine/loop/actions.py), in the order they run after a call.

  def _cadences(self, session: Session) -> list[actions.Action]:
    config = self._config
    return [
        # Once per start, after the first update: whatever state an
        # optimizer creates at its first step rather than in
        # optimizers.build_state becomes rank 0's too. The model's
        # variables are every rank's already (BatchNorm's statistics are
        # averaged at every step: distributed/gradients.StepReduction).
        actions.Once(lambda at: (
            distributed.broadcast_from_chief(
                optimizers.state(self._optimizer)))),
        actions.AfterEveryCall(functools.partial(self._stop_if_agreed,
                                                 session)),
        *actions.every(config.checkpoints.checkpoint_every_steps,
                       lambda at: self._save(session)),
        *actions.every(config.faults.commit_every_steps
                       if config.faults.elastic else 0,
                       functools.partial(self._commit_within_epoch,
                                         session)),
        *(actions.every(config.training.summary_every_steps,
                        functools.partial(self._summarize, session))
          if session.directory else []),
        # Progress: the bar, or a log line each time another
        # 1/progress.LOG_LINES_PER_EPOCH of the epoch is done.
        actions.AfterEveryCall(
            lambda at: session.progress.step(at.step)),
    ]

  def _stop_if_agreed(self, session: Session, at: actions.At) -> None:
    """Ends the run where every rank agreed to stop (a signal on one of
    them: preemption.py), rank 0 saving first."""
    if not at.stop_agreed:
      return
    state, directory = session.state, session.directory
    self._keep_counts(state)
    # A collective: the signal reached at least one rank, maybe not this.
    signum = int(distributed.max_across_ranks(session.stop_requests.signum,
                                              name="stop_signal"))
    preemption.stop(
        signum,
        f"epoch {state.epoch + 1}, step {state.step}",
        directory and functools.partial(directory.save, state.position(),
                                        state.global_step))

  def _save(self, session: Session) -> str:
    """Rank 0 saves a checkpoint where the run stands, with its counts;
    every rank gets its path."""
    self._keep_counts(session.state)
    return session.save()

  def _keep_counts(self, state: LoopState) -> None:
    """The run's counts, with the train step's since the commit (over
    every rank: a collective), for the checkpoint saved next."""
    state.keep(self._train_step.totals.sums(),
               self._train_step.skipped_steps)

  def _commit_within_epoch(self, session: Session, at: actions.At) -> None:
    # The epoch's counts so far go with the commit: the steps a restart
    # redoes are counted once.
    session.state.committed(self._train_step.totals.sums(),
                            self._train_step.skipped_steps)
    self._train_step.reset_counts()
    self._commit(session.state.snapshot())

  def _summarize(self, session: Session, at: actions.At) -> None:
    # Rank 0's figures since the last summary: its running sums and times,
    # read on the host after a step whose status was read.
    session.reporter.steps(at.global_step, dict(
        session.window.read(at.step, self._train_step.totals.local_sums(),
                            session.times.step_seconds),
        learning_rate=session.state.learning_rate()))

  # An epoch's steps (its end: epoch_end.py).

  def _train_epoch(self, session: Session) -> tuple[metrics.Result, float]:
    """The epoch's remaining steps; its train figures over all ranks and
    this rank's seconds."""
    state = session.state
    began = time.perf_counter()
    # The step counts from here: the state holds what was counted before
    # (in this epoch, before a commit, a restart or a rollback).
    self._train_step.reset_counts()
    session.start_epoch()
    # The step counter is read once a call, after it (_at).
    at = self._at(session)
    while at.step < state.steps_per_epoch:
      count = actions.steps_in_call(
          self._actions, at.global_step, at_most=min(
              self._config.performance.steps_per_call,
              state.steps_per_epoch - at.step))
      if session.callbacks.per_batch:
        session.callbacks.batch_begin(at.step)
      with session.profiler.step(at.global_step + 1):
        stop_agreed = self._call(session, count)
      before, at = at.global_step, self._at(session, stop_agreed)
      for action in actions.due(self._actions, before, at.global_step):
        action.run(at)
      if session.callbacks.per_batch:
        # The epoch's figures so far over every rank (an allreduce, which
        # only per-batch callbacks cost), as Keras' batch logs; a stop
        # agreed here ends the run at the epoch's end.
        totals = self._train_step.totals
        session.callbacks.batch_end(at.step - 1, totals.result_of(
            state.epoch_sums(totals.sums())).figures)
    # An allreduce: all ranks are done.
    train = self._train_step.totals.result_of(
        state.epoch_sums(self._train_step.totals.sums()))
    return train, time.perf_counter() - began

  def _call(self, session: Session, count: int) -> bool:
    """`count` steps in one call of the train step (fewer if the ranks
    agree to stop), which reads its batches itself; timed part by part in
    a profiled window. Returns whether the ranks agreed to stop."""
    requested = session.stop_requests.requested
    with session.times.step():
      if session.profiler.timing:
        trained = session.profiler.timed(self._train_step, count, requested)
      else:
        trained = self._train_step.train(count, requested)
    session.times.waited_for_input(trained.input_seconds)
    return trained.stop_agreed

  def _at(self, session: Session, stop_agreed: bool = False) -> actions.At:
    global_step, epoch, step = session.state.where()
    return actions.At(global_step=global_step, epoch=epoch, step=step,
                      model=self._model, rank=session.world.rank,
                      world_size=session.world.size,
                      is_chief=session.directory is not None,
                      model_dir=self._config.training.model_dir,
                      stop_agreed=stop_agreed)
