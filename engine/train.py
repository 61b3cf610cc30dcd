r"""Data-parallel training with Horovod: the engine's one training loop.

Launch one process per device:

  horovodrun -np 2 .venv/bin/python -m engine.train --flagfile=flags/X.cfg

Read `train()` top to bottom to follow a batch from disk to the optimizer:
distributed setup, input pipeline, model, optimizer, the train loop, and what
is reported.
"""
import copy
import dataclasses
import os
import re
import signal
import sys
import time
from typing import Optional

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
from engine import export
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
from engine.errors import UserError
import flags as engine_flags
import models

FLAGS = flags.FLAGS
FLAGS_FILE = "flags.txt"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Everything a run depends on, as plain values (see flags/ for meanings)."""
  # Data
  dataset: str
  data_dir: str
  data_params: dict  # what a data set's loader declares it takes
  random_flip: bool
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
  # Training
  batch_size: int
  epochs: int
  steps_per_epoch: int
  target_accuracy: float
  patience: int
  seed: int
  model_dir: str
  progress: str
  # Checkpoints
  resume: str
  resume_from: str
  keep_checkpoints: int
  checkpoint_every_steps: int
  command_line: str  # the flags as a flagfile, recorded in model_dir
  # Elastic
  elastic: bool
  commit_every_steps: int
  # Devices
  intra_op_threads: int
  inter_op_threads: int
  bind_cpus: bool
  deterministic: bool
  # Performance
  mixed_precision: str
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
  history: list[dict]    # the metrics.jsonl records, on every rank
  train_step: steps.TrainStep
  eval_step: steps.EvalStep


def prepare(config: TrainConfig):
  """Distributed setup, the data set and the model: what training and
  evaluation share. Returns (world, splits, model)."""
  world = distributed.init(intra_op_threads=config.intra_op_threads,
                           inter_op_threads=config.inter_op_threads,
                           bind_cpus=config.bind_cpus,
                           deterministic=config.deterministic,
                           timeline=config.horovod_timeline)
  report.configure_logging(distributed.is_chief())
  logging.info("%d processes; %s", world.size, _describe(world))
  splits = datasets.load(config.dataset, data_dir=config.data_dir,
                         **config.data_params)
  # The same seed everywhere, then rank 0's weights win anyway.
  tf.keras.utils.set_random_seed(config.seed)
  precision.set_policy(config.mixed_precision)
  model = models.build(config.model, input_shape=splits.info.image_shape,
                       num_classes=splits.info.num_classes,
                       **config.model_params)
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
  learning_rate = schedules.WarmupThenDecay(
      base_lr=config.base_lr, scaling=config.lr_scaling,
      warmup_epochs=config.warmup_epochs, decay=config.lr_schedule,
      epochs=config.epochs, decay_epochs=config.lr_decay_epochs,
      decay_factor=config.lr_decay_factor)
  optimizer = precision.with_loss_scaling(
      optimizers.build(config.optimizer, learning_rate=learning_rate,
                       momentum=config.momentum, nesterov=config.nesterov,
                       xla=config.xla), config.mixed_precision)
  train_step = steps.TrainStep(
      model=model, optimizer=optimizer, allreduce_op=config.allreduce_op,
      compression=config.gradient_compression,
      accumulation_steps=config.grad_accum_steps, xla=config.xla)
  eval_step = steps.EvalStep(model=model, xla=config.xla)
  logging.info("%s; precision %s%s; allreduce %s, compression %s",
               config.optimizer, config.mixed_precision
               if config.mixed_precision != "none" else "float32",
               ", XLA" if config.xla else "", config.allreduce_op,
               config.gradient_compression)
  if world.device == "CPU":
    _warn_about_slow_options_on_cpu(config)

  # The train loop, from the checkpoint in model_dir if there is one. Under
  # --elastic, Horovod runs it again after each change of workers, from the
  # state last committed.
  loop = _TrainLoop(config=config, world=world, splits=splits, model=model,
                    optimizer=optimizer, learning_rate=learning_rate,
                    train_step=train_step, eval_step=eval_step)
  state = elastic.TrainingState(
      loop.variables, position=None, epoch_sums=_NO_EXAMPLES,
      cumulative_seconds=0.0, history=[],
      stop=stopping.TargetAccuracy(config.target_accuracy, config.patience))
  history = elastic.run(loop)(state) if config.elastic else loop(state)

  # Whoever is rank 0 at the end exports.
  if distributed.is_chief():
    loop.run.export(info)
  return TrainResult(model=model, history=history, train_step=train_step,
                     eval_step=eval_step)


# Loss sum, correct predictions, examples: an epoch before its first step.
_NO_EXAMPLES = np.zeros(3)


class _TrainLoop:
  """The epochs, from a TrainingState to the end of training.

  Runs once; under --elastic, again after each reset, from the last commit,
  on the processes there are then. So everything that depends on their
  number is set up at the start of a call: the global batch, the steps per
  epoch, the learning rate, this rank's data, who is rank 0.
  """

  def __init__(self, *, config: TrainConfig, world: distributed.World,
               splits, model: tf.keras.Model, optimizer,
               learning_rate: schedules.WarmupThenDecay,
               train_step: steps.TrainStep, eval_step: steps.EvalStep):
    self._config = config
    self._world = world
    self._splits = splits
    self._model = model
    self._optimizer = optimizer
    self._learning_rate = learning_rate
    self._train_step = train_step
    self._eval_step = eval_step
    self._model_dir = config.model_dir or os.path.join(
        "runs", f"{config.dataset}_{config.model}")
    self.run = None  # rank 0's model_dir: checkpoints, flags, exports

  def variables(self) -> list[tf.Variable]:
    """What every rank must hold alike: weights and optimizer state."""
    return self._model.variables + optimizers.state(self._optimizer)

  def __call__(self, state: elastic.TrainingState) -> list[dict]:
    config, info = self._config, self._splits.info
    model, train_step = self._model, self._train_step
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

    # Checkpoints and resuming: rank 0 alone reads and writes model_dir.
    # The run's first start restores the latest checkpoint, and every rank
    # continues from rank 0's weights and optimizer state, restored or
    # initial, so the first averaged gradient is taken at one point. A
    # restart (elastic) continues from the committed state instead.
    if chief and self.run is None:
      self.run = _Run(self._model_dir, config, model=model,
                      optimizer=self._optimizer,
                      identity=checkpoint.identity(model, info))
    run = self.run if chief else None
    restart = state.position is not None
    if restart:
      position = state.position
      logging.info("restarting on %d processes (was %d) from the commit at "
                   "epoch %d, step %d", world.size, position.world_size,
                   position.epoch + 1, position.step)
      if run and run.checkpoints is None:
        run.take_over()
    else:
      position = distributed.on_chief(run.open if run else None,
                                      name="resume")
      distributed.broadcast_from_chief(self.variables())
    first_epoch, first_step = _starting_point(position, steps_per_epoch,
                                              global_batch, world.size)
    self._learning_rate.set_world(world_size=world.size,
                                  steps_per_epoch=steps_per_epoch)
    self._optimizer.iterations.assign(first_epoch * steps_per_epoch +
                                      first_step)
    logging.info("learning rate %g x %d processes (%s) = %g%s",
                 config.base_lr, world.size, config.lr_scaling,
                 self._learning_rate.peak_lr,
                 f" after {config.warmup_epochs:g} warmup epochs"
                 if config.warmup_epochs else "")
    if config.elastic and not restart:
      # What a worker lost before the first commit would go back to.
      state.commit(position=checkpoint.Position(
          first_epoch, first_step, global_batch, world.size))

    reporter = report.Reporter(self._model_dir, chief=chief,
                               epochs=config.epochs)
    reporter.keep_epochs_up_to(first_epoch)  # records of undone epochs go
    progress = progress_lib.Progress(
        mode=config.progress, chief=chief, steps_per_epoch=steps_per_epoch,
        epochs=config.epochs, global_batch=global_batch)
    stop = copy.copy(state.stop)
    stop_requests = preemption.StopRequests()
    stop_requests.install()
    times = profiling.EpochTimes()
    profiler = profiling.StepProfiler(
        self._model_dir, steps=config.profile_steps, rank=world.rank,
        all_ranks=config.profile_all_ranks,
        timeline=config.horovod_timeline)

    # Train loop.
    every = config.checkpoint_every_steps
    commit_every = config.commit_every_steps if config.elastic else 0
    optimizer_state_broadcast = False
    history = list(state.history)
    cumulative_seconds = state.cumulative_seconds
    epoch_sums = state.epoch_sums  # of steps committed before a restart
    batches = iter(data.train_batches(
        self._splits.train, info, rank=world.rank, world_size=world.size,
        batch_size=step_batch, steps=steps_per_epoch, seed=config.seed,
        first_epoch=first_epoch, first_step=first_step,
        flip=config.random_flip, shift=config.random_shift))
    val = None
    try:
      for epoch in range(first_epoch, config.epochs):
        start = time.perf_counter()
        train_step.totals.reset()
        times.reset()
        progress.start_epoch(epoch, first_step)
        for done in range(first_step + 1, steps_per_epoch + 1):
          global_step = epoch * steps_per_epoch + done
          with profiler.step(global_step):
            with times.input():
              images, labels = next(batches)
            with times.step():
              stop_agreed = train_step(images, labels,
                                       stop_requests.requested)
          if not optimizer_state_broadcast:
            # Once per start, after the first update: whatever state an
            # optimizer creates at its first step rather than in
            # optimizers.build_state becomes rank 0's too.
            distributed.broadcast_from_chief(self.variables())
            optimizer_state_broadcast = True
          position = checkpoint.Position(epoch, done, global_batch,
                                         world.size)
          if stop_agreed:
            _preempted(run, position, global_step, stop_requests.signum)
          if run and every and global_step % every == 0:
            run.checkpoints.save(position, global_step)
          if commit_every and global_step % commit_every == 0:
            # The epoch's figures so far go with the commit: the steps a
            # restart redoes are counted once.
            epoch_sums = epoch_sums + train_step.totals.sums()
            train_step.totals.reset()
            state.commit(position=position, epoch_sums=epoch_sums)
          progress.step(done)
        steps_run = steps_per_epoch - first_step
        first_step = 0
        # An allreduce: all ranks are done.
        train = metrics.Result.of(epoch_sums + train_step.totals.sums())
        epoch_sums = _NO_EXAMPLES
        train_seconds = time.perf_counter() - start

        # BatchNorm's moving statistics are updated from each rank's own
        # batches and drift apart; average them so every rank evaluates (and
        # ends with) one model.
        distributed.average_across_ranks(model.non_trainable_variables)
        val = steps.evaluate(self._eval_step, data.eval_batches(
            self._splits.test, info, rank=world.rank, world_size=world.size,
            batch_size=config.batch_size))
        epoch_seconds = time.perf_counter() - start
        cumulative_seconds += epoch_seconds
        global_step = (epoch + 1) * steps_per_epoch
        stop_now = stop.update(epoch=epoch + 1, val_accuracy=val.accuracy,
                               cumulative_seconds=cumulative_seconds)

        record = {
            "epoch": epoch + 1,
            "global_step": global_step,
            "train_loss": train.loss,
            "train_accuracy": train.accuracy,
            "train_examples": train.examples,
            "val_loss": val.loss,
            "val_accuracy": val.accuracy,
            # The rate of the epoch's last update, as the optimizer applied
            # it.
            "learning_rate": float(self._learning_rate(global_step - 1)),
            "images_per_sec": steps_run * global_batch / train_seconds,
            # Rank 0's split of the train time: a large input share means
            # the input pipeline, not the step, bounds the run.
            "input_seconds": times.input_seconds,
            "step_seconds": times.step_seconds,
            "epoch_seconds": epoch_seconds,
            "cumulative_seconds": cumulative_seconds,
            "world_size": world.size,
        }
        if config.target_accuracy:
          record["target_accuracy_first_epoch"] = stop.first_reached_epoch
          record["target_accuracy_first_seconds"] = stop.first_reached_seconds
        history.append(record)
        reporter.epoch(record)
        position = checkpoint.Position(epoch + 1, 0, global_batch,
                                       world.size)
        if run:
          run.end_epoch(position, global_step, val.accuracy)
        if config.elastic:
          state.commit(position=position, epoch_sums=_NO_EXAMPLES,
                       cumulative_seconds=cumulative_seconds,
                       history=list(history), stop=copy.copy(stop))
        if stop_now:
          logging.info("stopping early: validation accuracy >= %g for %d "
                       "epochs; first reached at epoch %d, %.1fs",
                       config.target_accuracy, config.patience,
                       stop.first_reached_epoch, stop.first_reached_seconds)
          break
    finally:
      profiler.close()
      stop_requests.uninstall()

    if val:
      logging.info("final test loss %.4f, test accuracy %.4f (%d examples); "
                   "metrics in %s", val.loss, val.accuracy, val.examples,
                   reporter.metrics_path)
    elif not history:
      logging.info("%s has finished its %d epochs already; pass a larger "
                   "--epochs to train on, or another --model_dir for a new "
                   "run", self._model_dir, config.epochs)
    return history


class _Run:
  """Rank 0's side of a run's model_dir: checkpoints, flags, exports."""

  def __init__(self, model_dir: str, config: TrainConfig, *, model,
               optimizer, identity: str):
    self.model_dir = model_dir
    self._config = config
    self._model = model
    self._optimizer = optimizer
    self._identity = identity
    self.checkpoints = None

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
    _record_flags(self.model_dir, self._config.command_line)
    return position

  def take_over(self) -> None:
    """For a process that becomes rank 0 mid-run (elastic): the run's
    checkpoints, to write, without restoring any."""
    self._open_checkpoints()

  def _open_checkpoints(self) -> None:
    _make_model_dir(self.model_dir)
    self.checkpoints = checkpoint.Checkpoints(
        self.model_dir, model=self._model, optimizer=self._optimizer,
        keep=self._config.keep_checkpoints, identity=self._identity)

  def end_epoch(self, position: checkpoint.Position, global_step: int,
                val_accuracy: float) -> None:
    if self.checkpoints.save_at_epoch_end(position, global_step,
                                          val_accuracy):
      logging.info("best validation accuracy so far: %.4f", val_accuracy)

  def export(self, info) -> None:
    """The final model and the best checkpoint, as SavedModels."""
    directory = os.path.join(self.model_dir, export.EXPORT_DIR)
    export.save(self._model, info, os.path.join(directory, "final"))
    if self.checkpoints.best_path:
      export.save_checkpoint(self._model, self.checkpoints.best_path, info,
                             os.path.join(directory, "best"))
    logging.info("exported SavedModels to %s (final, best)", directory)


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
    path = run.checkpoints.save(position, global_step)
    raise preemption.Preempted(
        signum, f"stopped by {name} at {where}; saved {path}; run the same "
        "command again to continue")
  raise preemption.Preempted(signum, f"stopped by {name} at {where}")


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


def _describe(world: distributed.World) -> str:
  if world.device == "GPU":
    return "one GPU per process"
  return (f"CPU, {world.intra_op_threads} intra-op and "
          f"{world.inter_op_threads} inter-op threads per process")


def config_from_flags() -> TrainConfig:
  return TrainConfig(
      dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
      data_params=dict(
          image_size=FLAGS.image_size, num_classes=FLAGS.num_classes,
          label_offset=FLAGS.label_offset,
          train_examples=FLAGS.train_examples,
          test_examples=FLAGS.test_examples,
          synthetic_image_shape=tuple(
              int(d) for d in FLAGS.synthetic_image_shape),
          synthetic_classes=FLAGS.synthetic_classes),
      random_flip=FLAGS.random_flip, random_shift=FLAGS.random_shift,
      model=FLAGS.model,
      model_params=dict(depth=FLAGS.depth, width=FLAGS.width,
                        filters=FLAGS.filters, dropout=FLAGS.dropout,
                        weight_decay=FLAGS.weight_decay),
      optimizer=FLAGS.optimizer, base_lr=FLAGS.base_lr,
      lr_scaling=FLAGS.lr_scaling, warmup_epochs=FLAGS.warmup_epochs,
      lr_schedule=FLAGS.lr_schedule,
      lr_decay_epochs=tuple(int(e) for e in FLAGS.lr_decay_epochs),
      lr_decay_factor=FLAGS.lr_decay_factor, momentum=FLAGS.momentum,
      nesterov=FLAGS.nesterov,
      batch_size=FLAGS.batch_size, epochs=FLAGS.epochs,
      steps_per_epoch=FLAGS.steps_per_epoch,
      target_accuracy=FLAGS.target_accuracy, patience=FLAGS.patience,
      progress=FLAGS.progress,
      seed=FLAGS.seed, model_dir=FLAGS.model_dir,
      intra_op_threads=FLAGS.intra_op_threads,
      inter_op_threads=FLAGS.inter_op_threads, bind_cpus=FLAGS.bind_cpus,
      deterministic=FLAGS.deterministic,
      mixed_precision=FLAGS.mixed_precision, xla=FLAGS.xla,
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
      elastic=FLAGS.elastic, commit_every_steps=FLAGS.commit_every_steps,
      command_line=engine_flags.as_flagfile())


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    train(config_from_flags())
  except UserError as e:
    _exit_with_error(str(e))
  except preemption.Preempted as e:
    print(f"engine.train: {e}", file=sys.stderr)
    sys.exit(128 + e.signum)
  except tf.errors.DataLossError as e:
    # A TFRecord file found corrupt while streaming: its counts came from
    # flags, so it was not read at start-up, where the check names the file.
    detail = re.sub(r"\{\{.*?\}\}|\[Op:.*", "", e.message).strip()
    _exit_with_error(
        f"corrupt input data ({detail}); run with --train_examples=0 "
        "--test_examples=0 to check every file at start-up and name it")
  except tf.errors.OpError as e:
    if not distributed.is_peer_failure(e):
      raise
    _exit_with_error("another process stopped the job; its error is above")


def _exit_with_error(message: str) -> None:
  print(f"engine.train: error: {message}", file=sys.stderr)
  sys.exit(2)


if __name__ == "__main__":
  app.run(main)
