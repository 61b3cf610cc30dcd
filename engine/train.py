r"""Data-parallel training with Horovod: the engine's one training loop.

Launch one process per device:

  horovodrun -np 2 .venv/bin/python -m engine.train --flagfile=flags/X.cfg

Read `train()` top to bottom to follow a batch from disk to the optimizer:
distributed setup, input pipeline, model, optimizer, the train loop, and what
is reported.
"""
import dataclasses
import os
import re
import sys
import time

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from engine import data
from engine import datasets
from engine import distributed
from engine import optimizers
from engine import progress as progress_lib
from engine import report
from engine import schedules
from engine import step as steps
from engine import stopping
from engine.errors import UserError
import flags as engine_flags  # noqa: F401 (defines the flags)
import models

FLAGS = flags.FLAGS


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
  # Devices
  intra_op_threads: int
  inter_op_threads: int
  bind_cpus: bool


@dataclasses.dataclass
class TrainResult:
  model: tf.keras.Model
  history: list[dict]    # the metrics.jsonl records, on every rank
  train_step: steps.TrainStep
  eval_step: steps.EvalStep


def train(config: TrainConfig) -> TrainResult:
  # Distributed setup: Horovod, this process's device and cores.
  world = distributed.init(intra_op_threads=config.intra_op_threads,
                           inter_op_threads=config.inter_op_threads,
                           bind_cpus=config.bind_cpus)
  chief = distributed.is_chief()
  report.configure_logging(chief)
  logging.info("%d processes; %s", world.size, _describe(world))

  # Input pipeline: every rank reads its own shard of the same examples.
  splits = datasets.load(config.dataset, data_dir=config.data_dir,
                         **config.data_params)
  info = splits.info
  steps_per_epoch = data.steps_per_epoch(
      num_train=info.num_train, batch_size=config.batch_size,
      world_size=world.size, requested=config.steps_per_epoch)
  global_batch = config.batch_size * world.size
  logging.info("%s: %d train, %d test examples of %s; global batch %d, "
               "%d steps per epoch", info.name, info.num_train, info.num_test,
               "x".join(map(str, info.image_shape)), global_batch,
               steps_per_epoch)

  # Model: the same seed everywhere, then rank 0's weights win anyway.
  tf.keras.utils.set_random_seed(config.seed)
  model = models.build(config.model, input_shape=info.image_shape,
                       num_classes=info.num_classes, **config.model_params)
  logging.info("model %s: %d parameters", model.name, model.count_params())

  # Optimizer and learning rate: scaled with the global batch (linear:
  # base_lr * world.size), warmed up per step, then decayed; a function of
  # the step evaluated inside the train step.
  peak_lr = schedules.scaled_rate(config.base_lr, world.size,
                                  config.lr_scaling)
  learning_rate = schedules.WarmupThenDecay(
      base_lr=config.base_lr, peak_lr=peak_lr,
      warmup_steps=round(config.warmup_epochs * steps_per_epoch),
      decay=config.lr_schedule, steps_per_epoch=steps_per_epoch,
      decay_epochs=config.lr_decay_epochs,
      decay_factor=config.lr_decay_factor,
      total_steps=config.epochs * steps_per_epoch)
  optimizer = optimizers.build(config.optimizer, learning_rate=learning_rate,
                               momentum=config.momentum,
                               nesterov=config.nesterov)
  logging.info("%s, learning rate %g x %d processes (%s) = %g%s", config.optimizer,
               config.base_lr, world.size, config.lr_scaling, peak_lr,
               f" after {config.warmup_epochs:g} warmup epochs"
               if config.warmup_epochs else "")

  train_step = steps.TrainStep(model=model, optimizer=optimizer)
  eval_step = steps.EvalStep(model=model)
  model_dir = config.model_dir or os.path.join(
      "runs", f"{config.dataset}_{config.model}")
  distributed.on_chief(lambda: _make_model_dir(model_dir), name="model_dir")
  reporter = report.Reporter(model_dir, chief=chief, epochs=config.epochs)
  progress = progress_lib.Progress(
      mode=config.progress, chief=chief, steps_per_epoch=steps_per_epoch,
      epochs=config.epochs, global_batch=global_batch)
  stop = stopping.TargetAccuracy(config.target_accuracy, config.patience)

  # Train loop.
  # Every rank starts from rank 0's initial weights, so the first averaged
  # gradient is taken at one point, not at N different ones.
  distributed.broadcast_from_chief(model.variables)
  optimizer_state_broadcast = False
  history = []
  cumulative_seconds = 0.0
  batches = iter(data.train_batches(
      splits.train, info, rank=world.rank, world_size=world.size,
      batch_size=config.batch_size, steps=steps_per_epoch, seed=config.seed,
      first_epoch=0, flip=config.random_flip, shift=config.random_shift))
  for epoch in range(config.epochs):
    start = time.perf_counter()
    train_step.totals.reset()
    progress.start_epoch(epoch)
    for done in range(1, steps_per_epoch + 1):
      train_step(*next(batches))
      if not optimizer_state_broadcast:
        # After the first update every optimizer has its state (slots of
        # legacy optimizers exist only now): broadcast it with the weights
        # so every rank continues from rank 0's exact state.
        distributed.broadcast_from_chief(model.variables +
                                         optimizers.state(optimizer))
        optimizer_state_broadcast = True
      progress.step(done)
    train = train_step.totals.result()  # an allreduce: all ranks are done
    train_seconds = time.perf_counter() - start

    # BatchNorm's moving statistics are updated from each rank's own batches
    # and drift apart; average them so every rank evaluates (and ends with)
    # one model.
    distributed.average_across_ranks(model.non_trainable_variables)
    val = steps.evaluate(eval_step, data.eval_batches(
        splits.test, info, rank=world.rank, world_size=world.size,
        batch_size=config.batch_size))
    epoch_seconds = time.perf_counter() - start
    cumulative_seconds += epoch_seconds
    global_step = int(optimizer.iterations.numpy())
    stop_now = stop.update(epoch=epoch + 1, val_accuracy=val.accuracy,
                           cumulative_seconds=cumulative_seconds)

    record = {
        "epoch": epoch + 1,
        "global_step": global_step,
        "train_loss": train.loss,
        "train_accuracy": train.accuracy,
        "val_loss": val.loss,
        "val_accuracy": val.accuracy,
        # The rate of the epoch's last update, as the optimizer applied it.
        "learning_rate": float(learning_rate(global_step - 1)),
        "images_per_sec": train.examples / train_seconds,
        "epoch_seconds": epoch_seconds,
        "cumulative_seconds": cumulative_seconds,
        "world_size": world.size,
    }
    if config.target_accuracy:
      record["target_accuracy_first_epoch"] = stop.first_reached_epoch
      record["target_accuracy_first_seconds"] = stop.first_reached_seconds
    history.append(record)
    reporter.epoch(record)
    if stop_now:
      logging.info("stopping early: validation accuracy >= %g for %d "
                   "epochs; first reached at epoch %d, %.1fs",
                   config.target_accuracy, config.patience,
                   stop.first_reached_epoch, stop.first_reached_seconds)
      break

  logging.info("final test loss %.4f, test accuracy %.4f (%d examples); "
               "metrics in %s", val.loss, val.accuracy, val.examples,
               reporter.metrics_path)
  return TrainResult(model=model, history=history, train_step=train_step,
                     eval_step=eval_step)


def _make_model_dir(path: str) -> None:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UserError(f"--model_dir={path}: cannot create it ({e.strerror}); "
                    "pass a writable directory") from None


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
      inter_op_threads=FLAGS.inter_op_threads, bind_cpus=FLAGS.bind_cpus)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    train(config_from_flags())
  except UserError as e:
    _exit_with_error(str(e))
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
