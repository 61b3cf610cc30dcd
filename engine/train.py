r"""Data-parallel training with Horovod: the engine's one training loop.

Launch one process per device:

  horovodrun -np 2 .venv/bin/python -m engine.train --flagfile=flags/X.cfg

Read `train()` top to bottom to follow a batch from disk to the optimizer:
distributed setup, input pipeline, model, optimizer, the train loop, and what
is reported.
"""
import contextlib
import copy
import dataclasses
import functools
import os
import re
import signal
import sys
import time
import traceback
from typing import Any, Callable, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from engine import checkpoint
from engine import data
from engine import datasets
from engine import distributed
from engine import elastic
from engine import ema
from engine import export
from engine import liveness
from engine import metrics
from engine import optimizers
from engine import precision
from engine import preemption
from engine import profiling
from engine import progress as progress_lib
from engine import report
from engine import schedules
from engine import step as steps
from engine import stopping
from engine import storage
from engine import user_code
from engine.errors import Diverged
from engine.errors import UserError
from engine.errors import WorkerLost
from engine.errors import WriteFailed
import flags as engine_flags
import models

FLAGS = flags.FLAGS
FLAGS_FILE = "flags.txt"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Everything a run depends on, as plain values (see flags/ for meanings)."""
  # Data (dataset and model: a registered name or a user's module:function)
  dataset: str
  data_dir: str
  data_params: dict  # what a data set's loader declares it takes
  normalization: Optional[tuple]  # (mean, std) per channel, or None
  random_flip: bool
  eval_flip: bool
  eval_shift_pixels: int
  random_shift: float
  # Model
  model: str
  model_params: dict
  # Optimization
  optimizer: str
  base_lr: float
  lr_scaling: str
  warmup_epochs: float
  lr_schedule: str
  lr_decay_epochs: tuple
  lr_decay_factor: float
  momentum: float
  nesterov: bool
  label_smoothing: float
  ema_decay: float
  # Training
  batch_size: int
  epochs: int
  steps_per_epoch: int
  target_accuracy: float
  patience: int
  seed: int
  model_dir: str
  progress: str
  summary_every_steps: int
  eval_every_epochs: int
  # Checkpoints
  resume: str
  resume_from: str
  keep_checkpoints: int
  checkpoint_every_steps: int
  command_line: str  # the flags as a flagfile, recorded in model_dir
  # Faults
  on_nonfinite: str
  rollback_lr_factor: float
  max_rollbacks: int
  # Elastic
  elastic: bool
  commit_every_steps: int
  # Devices
  intra_op_threads: int
  inter_op_threads: int
  bind_cpus: bool
  deterministic: bool
  # Performance
  mixed_precision: str  # none, float16 or bfloat16 (--mixed_precision=auto
  mixed_precision_why: str  # resolved by precision.resolve, and why)
  xla: bool
  gradient_compression: str
  allreduce_op: str
  grad_accum_steps: int
  # Profiling
  profile_steps: tuple  # (first, last) global steps, or () for none
  profile_all_ranks: bool
  horovod_timeline: bool


@dataclasses.dataclass
class TrainResult:
  model: tf.keras.Model
  history: list[dict]    # the epochs' metrics.jsonl records, on every rank
  train_step: steps.TrainStep
  eval_step: steps.EvalStep
  # --ema_decay's average of the weights, which evaluation used; else None.
  weight_average: Optional[ema.WeightAverage] = None


def prepare(config: TrainConfig):
  """Distributed setup, the data set and the model: what training and
  evaluation share. Returns (world, splits, model)."""
  world = distributed.init(intra_op_threads=config.intra_op_threads,
                           inter_op_threads=config.inter_op_threads,
                           bind_cpus=config.bind_cpus,
                           deterministic=config.deterministic,
                           timeline=config.horovod_timeline)
  report.configure_logging(distributed.is_chief())
  kernels, kernels_advice = distributed.cpu_kernels()
  logging.info("%d processes; %s", world.size, _describe(world, kernels))
  if world.device == "CPU" and kernels_advice:
    logging.warning("%s", kernels_advice)

  def data_and_model():
    splits = datasets.load(config.dataset, data_dir=config.data_dir,
                           model_dir=config.model_dir,
                           normalization=config.normalization,
                           **config.data_params)
    # The same seed everywhere, then rank 0's weights win anyway.
    tf.keras.utils.set_random_seed(config.seed)
    precision.set_policy(config.mixed_precision)
    model = models.build(config.model, input_shape=splits.info.image_shape,
                         num_classes=splits.info.num_classes,
                         **config.model_params)
    return splits, model

  # A user's data or model may fail on one rank alone (a file missing on one
  # host): all ranks stop with its line rather than wait for it. Not under
  # --elastic, whose workers meet first inside the train loop.
  splits, model = distributed.agree(data_and_model, name="prepare",
                                    collective=not config.elastic)
  return world, splits, model


def train(config: TrainConfig) -> TrainResult:
  elastic.check_launch(config.elastic)
  # Distributed setup (Horovod, this process's device and cores), the data
  # set every rank reads its own shard of, and the model.
  world, splits, model = prepare(config)
  info = splits.info
  logging.info("%s: %d train, %d test examples of %s", info.name,
               info.num_train, info.num_test,
               "x".join(map(str, info.image_shape)))
  logging.info("model %s: %d parameters", model.name, model.count_params())

  # Optimizer and learning rate: scaled with the global batch (linear:
  # base_lr * world.size, set for each number of processes the loop runs
  # on), warmed up per step, then decayed; a function of the step evaluated
  # inside the train step.
  learning_rate = learning_rate_schedule(config)
  # The weights' moving average, which evaluation and exports use.
  weight_average = ema.maybe_average(model, config.ema_decay)
  optimizer, train_step = optimizer_and_step(config, model, learning_rate,
                                             weight_average)
  eval_step = steps.EvalStep(model=model, xla=config.xla,
                             image_shape=info.image_shape,
                             num_classes=info.num_classes,
                             flip=config.eval_flip,
                             shift=config.eval_shift_pixels)
  logging.info("%s; precision %s%s%s; allreduce %s, compression %s",
               config.optimizer, config.mixed_precision
               if config.mixed_precision != "none" else "float32",
               f" (auto: {config.mixed_precision_why})"
               if config.mixed_precision_why else "",
               ", XLA" if config.xla else "", config.allreduce_op,
               config.gradient_compression)
  if world.device == "CPU":
    _warn_about_slow_options_on_cpu(config)

  # The train loop, from the checkpoint in model_dir if there is one. Under
  # --elastic, Horovod runs it again after each change of workers, from the
  # state last committed.
  loop = _TrainLoop(config=config, world=world, splits=splits, model=model,
                    optimizer=optimizer, learning_rate=learning_rate,
                    train_step=train_step, eval_step=eval_step,
                    weight_average=weight_average)
  state = elastic.TrainingState(
      loop.variables, position=None, epoch_sums=_NO_EXAMPLES,
      cumulative_seconds=0.0, history=[],
      stop=stopping.TargetAccuracy(config.target_accuracy, config.patience))
  try:
    history = elastic.run(loop)(state) if config.elastic else loop(state)
    # Whoever is rank 0 at the end exports; every rank learns if it failed.
    distributed.on_chief(loop.run.export if distributed.is_chief() else None,
                         name="export")
  except BaseException as e:
    if loop.run:  # rank 0's (Horovod may be shut down: no hvd.rank())
      loop.run.record_end(e)  # for engine.runs: how the run stopped
    raise
  return TrainResult(model=model, history=history, train_step=train_step,
                     eval_step=eval_step, weight_average=weight_average)


def learning_rate_schedule(config: TrainConfig) -> schedules.WarmupThenDecay:
  """The flags' learning rate, a function of the step; `set_world` gives
  it the number of processes and the steps per epoch."""
  return schedules.WarmupThenDecay(
      base_lr=config.base_lr, scaling=config.lr_scaling,
      warmup_epochs=config.warmup_epochs, decay=config.lr_schedule,
      epochs=config.epochs, decay_epochs=config.lr_decay_epochs,
      decay_factor=config.lr_decay_factor)


def optimizer_and_step(config: TrainConfig, model: tf.keras.Model,
                       learning_rate, weight_average=None
                       ) -> tuple[Any, steps.TrainStep]:
  """The optimizer the flags ask for, at `learning_rate` (a schedule of the
  step), and the train step that applies it to `model` (and updates
  `weight_average`, an ema.WeightAverage)."""
  optimizer = precision.with_loss_scaling(
      optimizers.build(config.optimizer, learning_rate=learning_rate,
                       momentum=config.momentum, nesterov=config.nesterov,
                       xla=config.xla), config.mixed_precision)
  return optimizer, steps.TrainStep(
      model=model, optimizer=optimizer, allreduce_op=config.allreduce_op,
      compression=config.gradient_compression,
      accumulation_steps=config.grad_accum_steps,
      label_smoothing=config.label_smoothing, weight_average=weight_average,
      xla=config.xla)


# Loss sum, correct predictions, examples: an epoch before its first step.
_NO_EXAMPLES = np.zeros(3)


class _TrainLoop:
  """The epochs, from a TrainingState to the end of training.

  Runs once; under --elastic, again after each reset, from the last commit,
  on the processes there are then. So everything that depends on their
  number is set up at the start of a call (`_start`): the global batch, the
  steps per epoch, the learning rate, this rank's data, who is rank 0.
  """

  def __init__(self, *, config: TrainConfig, world: distributed.World,
               splits, model: tf.keras.Model, optimizer,
               learning_rate: schedules.WarmupThenDecay,
               train_step: steps.TrainStep, eval_step: steps.EvalStep,
               weight_average: Optional[ema.WeightAverage]):
    self._config = config
    self._world = world
    self._splits = splits
    self._model = model
    self._optimizer = optimizer
    self._learning_rate = learning_rate
    self._train_step = train_step
    self._eval_step = eval_step
    self._weight_average = weight_average
    self._model_dir = config.model_dir
    self._rollbacks = 0  # in this process's life (see --max_rollbacks)
    self.run = None  # rank 0's model_dir: checkpoints, flags, exports

  def variables(self) -> list[tf.Variable]:
    """What every rank must hold alike: weights, optimizer state, the
    learning rate's factor, and the weights' average."""
    return (self._model.variables + optimizers.state(self._optimizer)
            + [self._learning_rate.factor]
            + ema.variables(self._weight_average))

  def __call__(self, state: elastic.TrainingState) -> list[dict]:
    start = self._start(state)
    try:
      epoch = start.first_epoch
      while epoch < self._config.epochs:
        try:
          train, train_seconds = self._train_epoch(start, state, epoch)
        except steps.NonFinite as nonfinite:
          epoch = self._diverged(start, state, nonfinite)
          continue
        val = self._evaluate(start) if self._evaluates(epoch) else None
        if self._end_epoch(start, state, epoch, train, val, train_seconds):
          break
        epoch += 1
    finally:
      start.close()
    self._say_how_it_ended(start)
    return start.history

  # A start: where training continues from, on how many processes.

  def _start(self, state: elastic.TrainingState) -> "_Start":
    """Sets up a call: the batch and steps for the processes there are,
    the position to continue from, the learning rate, this rank's data."""
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
    position = self._resume_or_restart(state, world, chief)
    first_epoch, first_step = _starting_point(position, steps_per_epoch,
                                              global_batch, world.size)
    self._set_learning_rate(world, steps_per_epoch,
                            first_epoch * steps_per_epoch + first_step)
    # The run's clock: a restart's commit, or the checkpoint resumed from.
    seconds = (state.cumulative_seconds if state.position is not None
               else position.seconds if position else 0.0)
    if config.elastic and state.position is None:
      # What a worker lost before the first commit would go back to.
      state.commit(position=checkpoint.Position(
          first_epoch, first_step, global_batch, world.size, seconds),
                   cumulative_seconds=seconds)
    start = _Start(
        config=config, model_dir=self._model_dir, world=world,
        run=self.run if chief else None, steps_per_epoch=steps_per_epoch,
        global_batch=global_batch, first_epoch=first_epoch,
        first_step=first_step, state=state, seconds=seconds,
        hparams=_hparams(config, world, global_batch))
    self._read_from(start, first_epoch, first_step)
    if position is None and config.on_nonfinite == "rollback":
      # Something to roll back to before the first epoch's checkpoint.
      start.on_chief(lambda run: run.save(checkpoint.Position(
          0, 0, global_batch, world.size, start.seconds()), 0),
                     name="initial_checkpoint")
    return start

  def _read_from(self, start: "_Start", epoch: int, step: int) -> None:
    """This rank's batches from step `step` of epoch `epoch` on."""
    config, world = self._config, start.world
    start.first_step = step
    start.batches = iter(data.train_batches(
        self._splits.train, self._splits.info, rank=world.rank,
        world_size=world.size,
        batch_size=config.batch_size * config.grad_accum_steps,
        steps=start.steps_per_epoch, seed=config.seed, first_epoch=epoch,
        first_step=step, flip=config.random_flip, shift=config.random_shift))

  def _resume_or_restart(self, state: elastic.TrainingState,
                         world: distributed.World,
                         chief: bool) -> Optional[checkpoint.Position]:
    """Where the run stands, with the same variables on every rank.

    Checkpoints and resuming: rank 0 alone reads and writes model_dir. The
    run's first start restores the latest checkpoint, and every rank
    continues from rank 0's weights and optimizer state, restored or
    initial, so the first averaged gradient is taken at one point. A
    restart (elastic) continues from the committed state instead.
    """
    if chief and self.run is None:
      self.run = _Run(self._model_dir, self._config, model=self._model,
                      optimizer=self._optimizer, info=self._splits.info,
                      lr_factor=self._learning_rate.factor,
                      weight_average=self._weight_average)
    run = self.run if chief else None
    if state.position is not None:
      position = state.position
      logging.info("restarting on %d processes (was %d) from the commit at "
                   "epoch %d, step %d", world.size, position.world_size,
                   position.epoch + 1, position.step)
      if run and run.checkpoints is None:
        run.take_over()
      return position
    position = distributed.on_chief(run.open if run else None, name="resume")
    distributed.broadcast_from_chief(self.variables())
    return position

  def _set_learning_rate(self, world: distributed.World,
                         steps_per_epoch: int, global_step: int) -> None:
    """The schedule for this number of processes, at `global_step`."""
    config = self._config
    self._learning_rate.set_world(world_size=world.size,
                                  steps_per_epoch=steps_per_epoch)
    self._optimizer.iterations.assign(global_step)
    logging.info("learning rate %g x %d processes (%s) = %g%s",
                 config.base_lr, world.size, config.lr_scaling,
                 self._learning_rate.peak_lr,
                 f" after {config.warmup_epochs:g} warmup epochs"
                 if config.warmup_epochs else "")

  # An epoch: its steps, its evaluation, its record.

  def _train_epoch(self, start: "_Start", state: elastic.TrainingState,
                   epoch: int) -> tuple[metrics.Result, float]:
    """The epoch's remaining steps; its train figures over all ranks and
    this rank's seconds."""
    config, train_step = self._config, self._train_step
    every = config.checkpoint_every_steps
    commit_every = config.commit_every_steps if config.elastic else 0
    summary_every = config.summary_every_steps if start.run else 0
    start.epoch_began = time.perf_counter()
    train_step.totals.reset()
    train_step.skipped_steps = 0
    start.times.reset()
    start.window.start_epoch(start.first_step)
    start.progress.start_epoch(epoch, start.first_step)
    for done in range(start.first_step + 1, start.steps_per_epoch + 1):
      global_step = epoch * start.steps_per_epoch + done
      start.global_step = global_step
      with start.profiler.step(global_step):
        with start.times.input():
          images, labels = next(start.batches)
        with start.times.step():
          stop_agreed = train_step(images, labels,
                                   start.stop_requests.requested)
      if not start.optimizer_state_broadcast:
        # Once per start, after the first update: whatever state an
        # optimizer creates at its first step rather than in
        # optimizers.build_state becomes rank 0's too.
        distributed.broadcast_from_chief(self.variables())
        start.optimizer_state_broadcast = True
      position = checkpoint.Position(epoch, done, start.global_batch,
                                     start.world.size, start.seconds())
      if stop_agreed:
        _preempted(start.run, position, global_step,
                   start.stop_requests.signum)
      if every and global_step % every == 0:
        start.on_chief(lambda run: run.save(position, global_step),
                       name="save")
      if commit_every and global_step % commit_every == 0:
        # The epoch's figures so far go with the commit: the steps a
        # restart redoes are counted once.
        start.epoch_sums = start.epoch_sums + train_step.totals.sums()
        train_step.totals.reset()
        state.commit(position=position, epoch_sums=start.epoch_sums)
      if summary_every and global_step % summary_every == 0:
        # Rank 0's figures since the last summary: its running sums and
        # times, read on the host after a step whose status was read.
        start.reporter.steps(global_step, dict(
            start.window.read(done, train_step.totals.local_sums(),
                              start.times.step_seconds),
            learning_rate=float(self._learning_rate(global_step - 1))))
      start.progress.step(done)
    start.steps_run = start.steps_per_epoch - start.first_step
    start.first_step = 0
    # An allreduce: all ranks are done.
    train = metrics.Result.of(start.epoch_sums + train_step.totals.sums())
    start.epoch_sums = _NO_EXAMPLES
    return train, time.perf_counter() - start.epoch_began

  def _evaluates(self, epoch: int) -> bool:
    """Whether epoch `epoch` (0-based) is evaluated: every
    --eval_every_epochs, and the last."""
    config = self._config
    return ((epoch + 1) % config.eval_every_epochs == 0
            or epoch + 1 == config.epochs)

  def _evaluate(self, start: "_Start") -> metrics.Result:
    """The whole test split, each rank its shard, reduced exactly."""
    # BatchNorm's moving statistics are updated from each rank's own
    # batches and drift apart; average them so every rank evaluates (and
    # ends with) one model.
    distributed.average_across_ranks(self._model.non_trainable_variables)
    with ema.averaged(self._weight_average):
      start.val = steps.evaluate(self._eval_step, data.eval_batches(
          self._splits.test, self._splits.info, rank=start.world.rank,
          world_size=start.world.size, batch_size=self._config.batch_size))
    return start.val

  def _end_epoch(self, start: "_Start", state: elastic.TrainingState,
                 epoch: int, train: metrics.Result,
                 val: Optional[metrics.Result], train_seconds: float) -> bool:
    """Records, saves and commits the epoch (`val` None: not evaluated);
    returns whether to stop."""
    config = self._config
    # Since the last epoch ended (or the start): its saves count too.
    epoch_seconds = start.seconds() - start.cumulative_seconds
    start.cumulative_seconds += epoch_seconds
    global_step = (epoch + 1) * start.steps_per_epoch
    stop_now = bool(val) and start.stop.update(
        epoch=epoch + 1, val_accuracy=val.accuracy,
        cumulative_seconds=start.cumulative_seconds)
    record = {
        "epoch": epoch + 1,
        "global_step": global_step,
        "train_loss": train.loss,
        "train_accuracy": train.accuracy,
        "train_examples": train.examples,
        "val_loss": val.loss if val else None,
        "val_accuracy": val.accuracy if val else None,
        # The rate of the epoch's last update, as the optimizer applied it.
        "learning_rate": float(self._learning_rate(global_step - 1)),
        "images_per_sec": start.steps_run * start.global_batch / train_seconds,
        # Rank 0's split of the train time: a large input share means the
        # input pipeline, not the step, bounds the run.
        "input_seconds": start.times.input_seconds,
        "step_seconds": start.times.step_seconds,
        "epoch_seconds": epoch_seconds,
        "cumulative_seconds": start.cumulative_seconds,
        "world_size": start.world.size,
        "skipped_steps": self._train_step.skipped_steps,
        "epochs": config.epochs,
        "time": round(time.time(), 3),
    }
    if stop_now:
      record["stopped_early"] = True
    if config.target_accuracy:
      record["target_accuracy_first_epoch"] = start.stop.first_reached_epoch
      record["target_accuracy_first_seconds"] = \
          start.stop.first_reached_seconds
    start.history.append(record)
    # An allreduce, on every rank; rank 0 draws it.
    confusion = self._eval_step.confusion.counts() if val else None
    position = checkpoint.Position(epoch + 1, 0, start.global_batch,
                                   start.world.size, start.cumulative_seconds)
    start.on_chief(lambda run: run.end_epoch(
        start.reporter, record, confusion, position, global_step),
                   name="end_epoch")
    if config.elastic:
      state.commit(position=position, epoch_sums=_NO_EXAMPLES,
                   cumulative_seconds=start.cumulative_seconds,
                   history=list(start.history), stop=copy.copy(start.stop))
    if stop_now:
      logging.info("stopping early: validation accuracy >= %g for %d "
                   "epochs; first reached at epoch %d, %.1fs",
                   config.target_accuracy, config.patience,
                   start.stop.first_reached_epoch,
                   start.stop.first_reached_seconds)
    return stop_now

  # A divergence: stop, or roll back.

  def _diverged(self, start: "_Start", state: elastic.TrainingState,
                nonfinite: steps.NonFinite) -> int:
    """After a step that was not finite (and not applied, on any rank):
    stops with Diverged, or rolls back (--on_nonfinite=rollback) and
    returns the epoch to go on from."""
    config = self._config
    global_step = start.global_step
    epoch, step = divmod(global_step - 1, start.steps_per_epoch)
    rate = float(self._learning_rate(global_step - 1))
    what = (f"at global step {global_step} (epoch {epoch + 1}, step "
            f"{step + 1}) with learning rate {rate:.4g}: {nonfinite}")
    rolling_back = config.on_nonfinite == "rollback"
    if rolling_back and self._rollbacks < config.max_rollbacks:
      return self._roll_back(start, state, what)
    latest = start.on_chief(lambda run: run.checkpoints.latest_path,
                            name="latest")
    kept = (f"nothing was saved after {latest}, the last good checkpoint"
            if latest else "no checkpoint was saved")
    advice = (f"{self._rollbacks} rollbacks (--max_rollbacks) did not get "
              "past it; lower --base_lr" if rolling_back else
              "lower --base_lr, or pass --on_nonfinite=rollback")
    raise Diverged(f"training diverged {what}; the step was not applied and "
                   f"{kept}; {advice}")

  def _roll_back(self, start: "_Start", state: elastic.TrainingState,
                 what: str) -> int:
    """Back to the last good checkpoint (rank 0 restores it, every rank
    receives it), with the learning rate multiplied by
    --rollback_lr_factor from then on: what practitioners do by hand after
    a loss spike."""
    config = self._config
    factor = float(self._learning_rate.factor.numpy()) * \
        config.rollback_lr_factor
    position, path = start.on_chief(lambda run: run.roll_back(),
                                    name="rollback")
    distributed.broadcast_from_chief(self.variables())
    self._learning_rate.factor.assign(factor)
    self._rollbacks += 1
    first_epoch, first_step = _starting_point(
        position, start.steps_per_epoch, start.global_batch, start.world.size)
    first_global_step = first_epoch * start.steps_per_epoch + first_step
    self._optimizer.iterations.assign(first_global_step)
    self._read_from(start, first_epoch, first_step)
    start.history = [r for r in start.history if r["epoch"] <= first_epoch]
    logging.warning("rolling back %s; back to %s (global step %d), learning "
                    "rate x%g from now on (rollback %d of at most %d)", what,
                    path, first_global_step, factor, self._rollbacks,
                    config.max_rollbacks)
    record = {"event": "rollback", "epoch": first_epoch,
              "global_step": first_global_step,
              "diverged_at_step": start.global_step, "checkpoint": path,
              "learning_rate_factor": factor, "rollback": self._rollbacks}
    start.on_chief(lambda run: run.record_rollback(start.reporter, record),
                   name="record_rollback")
    if config.elastic:
      state.commit(position=position, epoch_sums=_NO_EXAMPLES,
                   history=list(start.history))
    return first_epoch

  def _say_how_it_ended(self, start: "_Start") -> None:
    if start.val:
      logging.info("final test loss %.4f, test accuracy %.4f (%d examples); "
                   "metrics in %s", start.val.loss, start.val.accuracy,
                   start.val.examples, start.reporter.metrics_path)
    elif not start.history:
      logging.info("%s has finished its %d epochs already; pass a larger "
                   "--epochs to train on, or another --model_dir for a new "
                   "run", self._model_dir, self._config.epochs)


class _Start:
  """One call of the train loop: what it set up, and its running state.

  Made by `_TrainLoop._start`; the reporting, progress, profiling and stop
  handling live as long as the call, and `close()` ends them however the
  call ends.
  """

  def __init__(self, *, config: TrainConfig, model_dir: str,
               world: distributed.World, run: Optional["_Run"],
               steps_per_epoch: int, global_batch: int, first_epoch: int,
               first_step: int, state: elastic.TrainingState, seconds: float,
               hparams: dict):
    self.world = world
    self.run = run  # rank 0's model_dir; None on the other ranks
    self.steps_per_epoch = steps_per_epoch
    self.global_batch = global_batch
    self.first_epoch = first_epoch
    self.first_step = first_step  # of the next epoch to train
    self.batches = None  # this rank's, from first_step (_TrainLoop._read_from)
    self.global_step = 0  # of the step being taken
    self.steps_run = 0
    self.optimizer_state_broadcast = False
    self.history = list(state.history)
    self._began = time.perf_counter()
    self._seconds_before = seconds  # the run's time before this start
    self.cumulative_seconds = seconds  # at the last epoch's end
    self.epoch_sums = state.epoch_sums  # of steps committed before a restart
    self.val = None
    self.stop = copy.copy(state.stop)
    chief = distributed.is_chief()
    self.reporter = report.Reporter(model_dir, chief=chief,
                                    epochs=config.epochs)
    # What was written past this point (before a crash, say) goes.
    self.reporter.keep_epochs_up_to(
        first_epoch, first_epoch * steps_per_epoch + first_step)
    self.reporter.hparams(hparams)
    self.progress = progress_lib.Progress(
        mode=config.progress, chief=chief, steps_per_epoch=steps_per_epoch,
        epochs=config.epochs, global_batch=global_batch)
    self.stop_requests = preemption.StopRequests()
    self.stop_requests.install()
    self.times = profiling.EpochTimes()
    self.window = metrics.StepWindow()
    self.profiler = profiling.StepProfiler(
        model_dir, steps=config.profile_steps, rank=world.rank,
        all_ranks=config.profile_all_ranks,
        timeline=config.horovod_timeline)
    self.epoch_began = 0.0  # perf_counter() at the epoch's first step

  def on_chief(self, action: Callable[["_Run"], Any], name: str) -> Any:
    """`action(run)` on rank 0, which owns model_dir; every rank gets its
    result, or its error (a failed write stops every rank alike)."""
    run = self.run
    return distributed.on_chief(run and functools.partial(action, run),
                                name=name)

  def seconds(self) -> float:
    """The run's time so far: before this start, and since."""
    return self._seconds_before + time.perf_counter() - self._began

  def close(self) -> None:
    self.profiler.close()
    self.stop_requests.uninstall()
    self.reporter.close()


class _Run:
  """Rank 0's side of a run's model_dir: checkpoints, flags, exports.

  Its writes that fail (a full disk, a removed or read-only model_dir) end
  in WriteFailed saying where a rerun of the same command resumes.
  """

  def __init__(self, model_dir: str, config: TrainConfig, *, model,
               optimizer, info: datasets.DatasetInfo, lr_factor: tf.Variable,
               weight_average: Optional[ema.WeightAverage]):
    self.model_dir = model_dir
    self._config = config
    self._model = model
    self._optimizer = optimizer
    self._info = info
    self._lr_factor = lr_factor
    self._weight_average = weight_average
    self._identity = checkpoint.identity(model, info)
    self.checkpoints = None
    self.opened = False  # model_dir passed the checks and is written to

  def open(self) -> Optional[checkpoint.Position]:
    """Checks model_dir against the resume flags; restores; records flags.

    Nothing is written before the checks pass, so a refused run leaves the
    directory (and any checkpoints in it) exactly as it was.
    """
    self._open_checkpoints()
    position = None
    if self.checkpoints.existing():
      if self._config.resume == "never":
        raise UserError(
            f"--model_dir={self.model_dir} holds checkpoints of an earlier "
            "run and --resume=never; pass --resume=auto to continue it, or "
            "another --model_dir")
      position = self.checkpoints.restore_latest_readable()
      logging.info("resuming %s at epoch %d, step %d", self.model_dir,
                   position.epoch + 1, position.step)
    elif self._config.resume == "never" and os.path.exists(
        os.path.join(self.model_dir, report.METRICS_FILE)):
      raise UserError(f"--model_dir={self.model_dir} holds an earlier run "
                      "(metrics.jsonl) and --resume=never; choose another "
                      "--model_dir")
    elif self._config.resume_from:
      source = checkpoint.resolve(self._config.resume_from)
      position = self.checkpoints.restore(source)
      logging.info("starting %s from %s (epoch %d, step %d)", self.model_dir,
                   source, position.epoch + 1, position.step)
    _make_model_dir(self.model_dir)  # the checks passed: now it is written
    storage.warn_if_short_of_space(self.model_dir,
                                   checkpoint_size=self.checkpoints.size,
                                   keep=self._config.keep_checkpoints)
    with self._writes(), storage.writing(
        "flags.txt, classes.txt and normalization.json in", self.model_dir):
      _record_flags(self.model_dir, self._config.command_line)
      datasets.record(self.model_dir, self._info)
    self.opened = True
    return position

  def take_over(self) -> None:
    """For a process that becomes rank 0 mid-run (elastic): the run's
    checkpoints, to write, without restoring any."""
    _make_model_dir(self.model_dir)
    self._open_checkpoints()
    self.opened = True

  def _open_checkpoints(self) -> None:
    self.checkpoints = checkpoint.Checkpoints(
        self.model_dir, model=self._model, optimizer=self._optimizer,
        keep=self._config.keep_checkpoints, identity=self._identity,
        lr_factor=self._lr_factor, weight_average=self._weight_average)

  def save(self, position: checkpoint.Position, global_step: int) -> str:
    with self._writes():
      return self.checkpoints.save(position, global_step)

  def end_epoch(self, reporter: report.Reporter, record: dict,
                confusion: Optional[np.ndarray],
                position: checkpoint.Position, global_step: int) -> None:
    """The epoch's record and its checkpoints (the best among those
    evaluated)."""
    accuracy = record["val_accuracy"]
    with self._writes():
      reporter.epoch(record, confusion)
      if accuracy is None:
        self.checkpoints.save(position, global_step)
      elif self.checkpoints.save_at_epoch_end(position, global_step,
                                              accuracy):
        logging.info("best validation accuracy so far: %.4f", accuracy)

  def record_end(self, error: BaseException) -> None:
    """How the run stopped, when it stopped before finishing: the end
    record engine.runs reads. Best effort: a full disk may refuse it."""
    if not self.opened:
      return
    try:
      report.Reporter(self.model_dir, chief=True,
                      epochs=self._config.epochs).event(_end_record(error))
    except WriteFailed as e:
      logging.warning("not recorded in metrics.jsonl: %s", e)

  def roll_back(self) -> tuple[checkpoint.Position, str]:
    """Restores the latest readable checkpoint: its position and path."""
    position = self.checkpoints.restore_latest_readable()
    return position, self.checkpoints.restored_path

  def record_rollback(self, reporter: report.Reporter, record: dict) -> None:
    """The rollback's event, after the records of epochs it undid go."""
    with self._writes():
      reporter.keep_epochs_up_to(record["epoch"], record["global_step"])
      reporter.event(record)

  def export(self) -> None:
    """The final model and the best checkpoint, as SavedModels."""
    directory = os.path.join(self.model_dir, export.EXPORT_DIR)
    exported = ["final"]
    with self._writes():
      with ema.averaged(self._weight_average):
        export.save(self._model, self._info, os.path.join(directory, "final"))
      if self.checkpoints.best_path:
        try:
          export.save_checkpoint(self._model, self.checkpoints.best_path,
                                 self._info, os.path.join(directory, "best"),
                                 self._weight_average)
          exported.append("best")
        except export.UnreadableCheckpoint as e:
          logging.warning("the best checkpoint %s: exported the final model "
                          "only", e)
    logging.info("exported SavedModels to %s (%s)", directory,
                 ", ".join(exported))

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


def _starting_point(position, steps_per_epoch: int, global_batch: int,
                    world_size: int) -> tuple[int, int]:
  """The (epoch, step) to continue from, in this run's steps.

  With another number of processes (or batch size) the global batch
  differs, so the steps done so far in the epoch are converted through the
  examples they covered.
  """
  if position is None:
    return 0, 0
  step = position.step
  if position.global_batch != global_batch:
    step = position.step * position.global_batch // global_batch
    logging.info("continuing on %d processes (was %d): global batch %d "
                 "(was %d), %d steps per epoch; the learning rate is "
                 "rescaled; step %d of the epoch becomes step %d", world_size,
                 position.world_size, global_batch, position.global_batch,
                 steps_per_epoch, position.step, step)
  # A stop after an epoch's last step resumes with no steps left in it: the
  # epoch is still evaluated and recorded.
  return position.epoch, min(step, steps_per_epoch)


def _preempted(run, position: checkpoint.Position, global_step: int,
               signum: int):
  where = f"epoch {position.epoch + 1}, step {position.step}"
  name = signal.Signals(signum).name if signum else "a signal on another rank"
  if run:
    path = run.save(position, global_step)
    raise preemption.Preempted(
        signum, f"stopped by {name} at {where}; saved {path}; run the same "
        "command again to continue")
  raise preemption.Preempted(signum, f"stopped by {name} at {where}")


def _hparams(config: TrainConfig, world: distributed.World,
             global_batch: int) -> dict:
  """What TensorBoard's HParams dashboard compares runs by: the flags that
  shape the result, and the processes and global batch they ran with."""
  return dict(
      dataset=config.dataset, model=config.model, **config.model_params,
      optimizer=config.optimizer, base_lr=config.base_lr,
      lr_scaling=config.lr_scaling, warmup_epochs=config.warmup_epochs,
      lr_schedule=config.lr_schedule, momentum=config.momentum,
      label_smoothing=config.label_smoothing, ema_decay=config.ema_decay,
      batch_size=config.batch_size, global_batch=global_batch,
      processes=world.size, epochs=config.epochs,
      mixed_precision=config.mixed_precision,
      grad_accum_steps=config.grad_accum_steps,
      random_flip=config.random_flip, random_shift=config.random_shift,
      eval_flip=config.eval_flip, eval_shift_pixels=config.eval_shift_pixels,
      seed=config.seed)


def _end_record(error: BaseException) -> dict:
  """metrics.jsonl's record of a run that stopped before finishing."""
  if isinstance(error, (preemption.Preempted, KeyboardInterrupt)):
    signum = getattr(error, "signum", signal.SIGINT)  # 0: another rank's
    how = dict(state="stopped",
               signal=signal.Signals(signum).name if signum else None)
  elif isinstance(error, Diverged):
    how = dict(state="diverged")
  else:
    how = dict(state="error")
  if distributed.is_peer_failure(error):
    reason = "another process stopped"
  else:
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return dict(event="end", **how, reason=reason, time=round(time.time(), 3))


def _record_flags(model_dir: str, command_line: str) -> None:
  """flags.txt: the flags of the run's first start, usable as a flagfile.

  A resumed start's flags go to flags.latest.txt; flags.txt is never
  overwritten, so the run can always be reproduced from its start.
  """
  first = os.path.join(model_dir, FLAGS_FILE)
  path = os.path.join(model_dir, "flags.latest.txt") if os.path.exists(
      first) else first
  with open(path, "w") as f:
    f.write(command_line)


def _make_model_dir(path: str) -> None:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UserError(f"--model_dir={path}: cannot create it ({e.strerror}); "
                    "pass a writable directory") from None


def _warn_about_slow_options_on_cpu(config: TrainConfig) -> None:
  """GPU options that cost a CPU run dearly (bench/step_options.py on an
  AMD EPYC with AVX512-BF16: the cnn and WRN-16-2; bench/RESULTS.md)."""
  if config.mixed_precision == "float16":
    logging.warning("--mixed_precision=float16 on CPU: no float16 "
                    "arithmetic, steps were 66-74x slower than float32 "
                    "there; use bfloat16 (1.34x faster on CPUs with "
                    "AVX512-BF16) or none")
  if config.xla:
    logging.warning("--xla on CPU: steps were 1.7-4.7x slower than "
                    "TensorFlow's oneDNN kernels there")


def _describe(world: distributed.World, kernels: str) -> str:
  if world.device == "GPU":
    return "one GPU per process"
  return (f"CPU, {world.intra_op_threads} intra-op and "
          f"{world.inter_op_threads} inter-op threads per process, "
          f"{kernels} kernels, Horovod cycle "
          f"{os.environ['HOROVOD_CYCLE_TIME']} ms")


def config_from_flags() -> TrainConfig:
  mixed_precision, why = precision.resolve(FLAGS.mixed_precision)
  return TrainConfig(
      dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
      data_params=dict(
          image_size=FLAGS.image_size, num_classes=FLAGS.num_classes,
          label_offset=FLAGS.label_offset,
          train_examples=FLAGS.train_examples,
          test_examples=FLAGS.test_examples,
          synthetic_image_shape=tuple(
              int(d) for d in FLAGS.synthetic_image_shape),
          synthetic_classes=FLAGS.synthetic_classes,
          channels=int(FLAGS.channels),
          validation_split=FLAGS.validation_split,
          skip_bad_files=FLAGS.skip_bad_files,
          array_keys=tuple(FLAGS.array_keys)),
      normalization=_normalization_from_flags(),
      random_flip=FLAGS.random_flip, random_shift=FLAGS.random_shift,
      eval_flip=FLAGS.eval_flip, eval_shift_pixels=FLAGS.eval_shift_pixels,
      model=FLAGS.model,
      model_params=dict(depth=FLAGS.depth, width=FLAGS.width,
                        filters=FLAGS.filters, dropout=FLAGS.dropout,
                        weight_decay=FLAGS.weight_decay),
      optimizer=FLAGS.optimizer, base_lr=FLAGS.base_lr,
      lr_scaling=FLAGS.lr_scaling, warmup_epochs=FLAGS.warmup_epochs,
      lr_schedule=FLAGS.lr_schedule,
      lr_decay_epochs=tuple(int(e) for e in FLAGS.lr_decay_epochs),
      lr_decay_factor=FLAGS.lr_decay_factor, momentum=FLAGS.momentum,
      nesterov=FLAGS.nesterov, label_smoothing=FLAGS.label_smoothing,
      ema_decay=FLAGS.ema_decay,
      batch_size=FLAGS.batch_size, epochs=FLAGS.epochs,
      steps_per_epoch=FLAGS.steps_per_epoch,
      target_accuracy=FLAGS.target_accuracy, patience=FLAGS.patience,
      progress=FLAGS.progress, summary_every_steps=FLAGS.summary_every_steps,
      eval_every_epochs=FLAGS.eval_every_epochs,
      seed=FLAGS.seed,
      model_dir=FLAGS.model_dir or default_model_dir(FLAGS.dataset,
                                                     FLAGS.model),
      intra_op_threads=FLAGS.intra_op_threads,
      inter_op_threads=FLAGS.inter_op_threads, bind_cpus=FLAGS.bind_cpus,
      deterministic=FLAGS.deterministic,
      mixed_precision=mixed_precision, mixed_precision_why=why, xla=FLAGS.xla,
      gradient_compression=FLAGS.gradient_compression,
      allreduce_op=FLAGS.allreduce_op,
      grad_accum_steps=FLAGS.grad_accum_steps,
      profile_steps=tuple(int(step) for step in FLAGS.profile_steps.split(",")
                          if FLAGS.profile_steps),
      profile_all_ranks=FLAGS.profile_all_ranks,
      horovod_timeline=FLAGS.horovod_timeline,
      resume=FLAGS.resume, resume_from=FLAGS.resume_from,
      keep_checkpoints=FLAGS.keep_checkpoints,
      checkpoint_every_steps=FLAGS.checkpoint_every_steps,
      on_nonfinite=FLAGS.on_nonfinite,
      rollback_lr_factor=FLAGS.rollback_lr_factor,
      max_rollbacks=FLAGS.max_rollbacks,
      elastic=FLAGS.elastic, commit_every_steps=FLAGS.commit_every_steps,
      command_line=engine_flags.as_flagfile())


def default_model_dir(dataset: str, model: str) -> str:
  """runs/<dataset>_<model>, a user's module:function by its function's
  name."""
  def short(name):
    return name.rpartition(":")[2]
  return os.path.join("runs", f"{short(dataset)}_{short(model)}")


def _normalization_from_flags() -> Optional[tuple]:
  if not FLAGS.image_mean:
    return None
  try:
    mean, std = (tuple(float(v) for v in values)
                 for values in (FLAGS.image_mean, FLAGS.image_std))
  except ValueError:
    raise UserError(f"--image_mean={','.join(FLAGS.image_mean)} "
                    f"--image_std={','.join(FLAGS.image_std)}: give numbers, "
                    "one per channel") from None
  if len(mean) != len(std) or min(std) <= 0:
    raise UserError("--image_mean and --image_std: give one mean and one "
                    "positive std per channel")
  return mean, std


def run(*, model=None, dataset=None, **flag_values) -> TrainResult:
  """Trains from a Python script, launched as `horovodrun -np N python
  SCRIPT.py [--flag=value ...]`: the engine's flags, with the script's
  values as their defaults and its command line over them.

  `model` and `dataset` are module-level functions, or names as their
  flags take: a model builder called as --model's, and a data set loader
  returning `engine.datasets.Splits` (for arrays a script holds:
  `engine.datasets.from_arrays`). They are recorded in flags.txt as
  `path/to/SCRIPT.py:function`, so resuming and engine.evaluate find them.
  Any other keyword is a flag: `epochs=3`, `batch_size=64`. Errors end the
  process with one line and a non-zero exit, as the command line does.
  """
  logging.use_absl_handler()  # as app.run does: absl's log format
  values = dict(flag_values, model=model, dataset=dataset)
  try:
    for name, value in values.items():
      if value is not None:
        FLAGS.set_default(name, user_code.spec_of(value)
                          if callable(value) else value)
    FLAGS(sys.argv)
  except UserError as e:
    _exit_with_error(str(e))
  except (flags.Error, KeyError) as e:
    _exit_with_error(f"run(): {e}")
  return _train_or_exit()


def main(argv):
  if len(argv) > 1:
    _exit_with_error(f"unexpected arguments: {' '.join(argv[1:])} (flags "
                     "take the form --name=value)")
  _train_or_exit()


def parse_flags(argv: list[str], program: str = "engine.train") -> list[str]:
  """absl's parsing, its errors (a bad value, an unknown flag, a flagfile
  that is not text) as one line, headed by `program`: engine.evaluate and
  engine.find_lr parse the engine's flags too."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    _exit_with_error(str(e), program=program)
  except UnicodeDecodeError as e:
    _exit_with_error(f"a --flagfile is not UTF-8 text ({e.reason} at byte "
                     f"{e.start}); flagfiles hold one --name=value a line",
                     program=program)


def _train_or_exit() -> TrainResult:
  """Trains with the flags; an error the user can act on ends the process
  with one line (`engine.train: error: ...`) and its kind's exit code
  (engine.errors), a preemption with 128 + the signal's number."""
  try:
    config = config_from_flags()
    return train(config)
  except UserError as e:
    _exit_with_error(str(e), e.exit_code)
  except preemption.Preempted as e:
    print(f"engine.train: {e}", file=sys.stderr)
    sys.exit(128 + e.signum)
  except tf.errors.DataLossError as e:
    # A TFRecord file found corrupt while streaming: its counts came from
    # flags, so it was not read at start-up, where the check names the file.
    _exit_with_error(
        f"corrupt input data ({_op_detail(e)}), found while training; run "
        "with --train_examples=0 --test_examples=0 to check every file at "
        "start-up and name it")
  except tf.errors.InvalidArgumentError as e:
    _exit_with_error(_bad_input_found_while_training(e))
  except UnicodeDecodeError as e:
    # TensorFlow quoting a record's raw bytes in its error message.
    if "tensorflow" not in traceback.extract_tb(e.__traceback__)[-1].filename:
      raise
    _exit_with_error("invalid input data found while training: TensorFlow "
                     f"quoted bytes of it that are not text ({e.reason}); a "
                     "TFRecord file whose records are not tf.train.Example?")
  except tf.errors.OpError as e:
    if not distributed.is_peer_failure(e):
      raise
    # horovodrun sends the survivors SIGTERM as soon as one process exits,
    # and SIGKILL 5 s later: the line below takes a few seconds to find.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_error(liveness.describe_lost_process(
        tf.train.latest_checkpoint(os.path.join(config.model_dir,
                                                checkpoint.CHECKPOINT_DIR))),
                     WorkerLost.exit_code)


def _bad_input_found_while_training(error: tf.errors.InvalidArgumentError
                                    ) -> str:
  """Data the start-up checks could not see: an image whose first bytes
  looked right (image_folder checks only those), a label beyond the
  classes, a record of the wrong shape."""
  detail = _op_detail(error)
  if "image" in error.message.lower():
    return (f"an image failed to decode while training ({detail}); its "
            "first bytes looked right at start-up: replace or remove the "
            "damaged file")
  if "label value" in error.message:
    return (f"a label out of range found while training ({detail}); labels "
            "are class ids 0..N-1 for N classes (--num_classes, classes.txt)")
  return f"invalid input data found while training ({detail})"


def _op_detail(error: tf.errors.OpError) -> str:
  """A TensorFlow op error's message on one line, without its op and
  graph names."""
  return " ".join(re.sub(r"\{\{.*?\}\}|\[\[.*?\]\]|\[Op:.*", "",
                         error.message, flags=re.DOTALL).split())


def _exit_with_error(message: str, exit_code: int = UserError.exit_code,
                     program: str = "engine.train") -> None:
  # One line, whatever a file or flag put in it: control characters
  # (newlines among them) as escapes.
  printable = "".join(c if c.isprintable() else repr(c)[1:-1]
                      for c in message)
  print(f"{program}: error: {printable}", file=sys.stderr)
  sys.exit(exit_code)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
