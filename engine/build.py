"""What a run is built from: its processes, data, model, optimizer and steps.

Training, evaluation (engine.evaluate) and the learning-rate range test
(engine.find_lr) build the same parts from the same TrainConfig, so a
model evaluated or range-tested is the one trained, on the same data, and
the order of the building (the seed before the model, the precision policy
before its layers) is written once.
"""
import functools
import time
from typing import Any, NamedTuple, Optional

from absl import logging
import keras
import tensorflow as tf

from engine import datasets
from engine import distributed
from engine import tasks
from engine.compute import auto
from engine.compute import communication
from engine.compute import ema
from engine.compute import metrics
from engine.compute import optimizers
from engine.compute import precision
from engine.compute import schedules
from engine.compute import eval_step as eval_steps
from engine.compute import step as steps
from engine.compute import task_step
from engine.compute import weight_decay
from engine.core import cpu
from engine.core.config import TrainConfig
from engine.core.errors import UserError
from engine.datasets import pipelines
from engine.datasets import Shard
from engine.datasets import staging
from engine import given as given_lib
from engine.given import AsBuilt, Given
from engine.loop import keras_callbacks
from engine.loop.parts import TrainingParts
from engine.records import mlperf
from engine.records import report
from engine.records import start_up
from flags import reached
from models import batch_norm
from models import pointwise
from models import winograd3d
from models import whitening
import models

# How many of the first training images models/whitening.py's layers are
# fitted to: 1024 (800,000 patches) of Fashion-MNIST's 28 x 28, fewer of
# larger images, down to 20 of 224 x 224 (a million patches).
ADAPTED_IMAGES = 1024
ADAPTED_PIXELS = 1 << 20


class Prepared(NamedTuple):
  """What training, evaluation and the range test share: the processes,
  the precision and gradient compression (as asked, or auto's choices),
  the data, the task, the model, and the validation figure that decides
  best/, early stopping and --target (build.decider)."""
  world: distributed.World
  precision: precision.Choice
  communication: communication.Choice
  splits: datasets.Splits
  task: tasks.Task
  model: keras.Model
  decider: tasks.Decider
  # The run's config: as given, or settled by a --dataset function's tf.data
  # datasets (engine/given.py, Given.settled).
  config: TrainConfig


def prepare(config: TrainConfig, measure_auto: bool = True,
            given: Optional[Given] = None) -> Prepared:
  """Distributed setup, the data set, the task, the precision, the
  gradient compression and the model. Auto's choices are the run's first
  start's (model_dir), kept for this kind of run, or measured now
  (engine/compute/auto.py); unless `measure_auto` is false:
  engine.evaluate takes the hardware's preferred mode and no compression
  for a run that recorded none. `given`: a fit script's model, data and
  callbacks (engine/given.py), in place of the flags'."""
  world = start_processes(config)
  # A user's data, task or model may fail on one rank alone (a file missing
  # on one host): all ranks stop with its line rather than wait for it. Not
  # under --elastic, whose workers meet first inside the train loop.
  agreed = functools.partial(distributed.agree,
                             collective=not config.faults.elastic)
  splits = None
  if not given:
    splits, given = agreed(functools.partial(data_set, config), name="load")
    config = given.settled(config) if given else config
  # The mode asked for; under auto, the hardware's preferred one until
  # auto.decide decides.
  choice = precision.Choice(*precision.resolve(
      config.performance.mixed_precision))
  splits, task, builder, model, decides = agreed(
      functools.partial(data_task_and_model, config, choice.mode, given,
                        splits), name="prepare")
  chosen, sent = auto.decide(config, world, choice, splits, task,
                             builder.measured_step, model,
                             measure=measure_auto)
  if (chosen.mode != choice.mode or chosen.figures.get("images_per_sec")
      or sent.figures.get("images_per_sec")):
    # In another mode, or after models of their own were measured: built
    # again as if it were the first, Keras' names afresh.
    keras.backend.clear_session()
    model = builder.model(chosen.mode)
  return Prepared(world, chosen, sent, splits, task, model, decides, config)


def start_processes(config: TrainConfig) -> distributed.World:
  """Horovod, this process's device and cores, and the chief's logging;
  says what it started."""
  devices, profiled = config.devices, config.profiling
  world = distributed.init(
      intra_op_threads=devices.intra_op_threads,
      inter_op_threads=devices.inter_op_threads, bind_cpus=devices.bind_cpus,
      idle_horovod_threads=devices.idle_horovod_threads,
      deterministic=devices.deterministic, timeline=profiled.horovod_timeline,
      link_levels=bool(profiled.profile_steps) and not config.faults.elastic)
  report.configure_logging(distributed.is_chief())
  kernels, kernels_advice = cpu.tensorflow_kernels()
  logging.info("%d processes on Horovod's %s controller; %s", world.size,
               distributed.controller(), start_up.processes(world, kernels))
  if (world.size > 1 and distributed.controller() == "MPI"
      and distributed.is_chief()):  # (the others log warnings too)
    logging.warning("%s", distributed.MPI_FROZEN_PROCESS)
  if world.device == "CPU" and kernels_advice:
    logging.warning("%s", kernels_advice)
  return world


def data_set(config: TrainConfig) -> tuple[Optional[datasets.Splits],
                                           Optional[Given]]:
  """--dataset's splits; or, where its function returns tf.data datasets,
  those and --model's model for them, as a fit script would give them
  (Given.of_flags)."""
  reached.refuse_unreached_flags(config)
  splits = datasets.load(
      config.data.name, data_dir=config.data.dir,
      model_dir=config.training.model_dir,
      normalization=config.data.normalization,
      labels=getattr(tasks.task_class(config.task.name), "labels", "any"),
      **config.data.params)
  if isinstance(splits, pipelines.Datasets):  # a fit run, by its flags
    return None, Given.of_flags(config, splits)
  return splits, None


def data_task_and_model(config: TrainConfig, mode: str,
                        given: Optional[Given] = None,
                        splits: Optional[datasets.Splits] = None) -> tuple[
    datasets.Splits, tasks.Task, "ModelBuilder", keras.Model, tasks.Decider]:
  """The data set (`splits`, from data_set), the task, the builder of its
  models and the model in precision `mode`, checked against each other and
  the flags, and the figure that decides the run: a --best_metric the task
  cannot give fails here, before anything is measured. A fit script's
  (`given`) are its own."""
  if not (given or splits):
    splits, given = data_set(config)
  if given:
    splits, task = given.splits_and_task(config)
    builder = AsBuilt(given.model)
    return splits, task, builder, given.model, decider(config, task)
  task = tasks.build(config.task.name, splits.info, **config.task.params)
  builder = ModelBuilder(config=config, splits=splits, task=task)
  model = builder.model(mode)
  given_lib.refuse_its_own_training(config, model)
  tasks.check(task, config.task.name, model, splits.info.image_shape)
  _check_resizing(config, splits.info, task, model)
  return splits, task, builder, model, decider(config, task)


class ModelBuilder:
  """The task's model built afresh in a precision mode: the run's, and one
  for each mode or compression measured (engine/compute/auto.py)."""

  def __init__(self, *, config: TrainConfig, splits: datasets.Splits,
               task: tasks.Task):
    self._config, self._splits, self._task = config, splits, task
    # The same images for every model built (measured, then the run's).
    self._first_images = functools.cache(functools.partial(_first_images,
                                                           splits))

  def model(self, mode: str) -> keras.Model:
    winograd3d.use(self._config.performance.cpu_kernels)
    # The same seed everywhere, then rank 0's weights win anyway.
    keras.utils.set_random_seed(self._config.training.seed)
    with precision.policy(mode):
      model = tasks.build_model(self._task, self._config.task.name,
                                self._flags_model)
      if self._config.performance.fused_batch_norm == "auto":
        batch_norm.fuse(model)
      if (self._config.performance.pointwise_matmul == "auto"
          and not tf.config.list_logical_devices("GPU")):
        pointwise.use(model)
      whitening.adapt(model, self._first_images)  # (a resume restores over it)
    return model

  def measured_step(self, mode: str, compression: str) -> steps.TrainStep:
    """A train step on a model of its own, to time (compute/auto.py)."""
    return optimizer_and_step(self._config, mode, compression, self._task,
                              self.model(mode), learning_rate=0.0)[1]

  def _flags_model(self, output_shape: tuple) -> keras.Model:
    """--model's, for the task's outputs."""
    return models.build(self._config.model.name,
                        input_shape=self._splits.info.image_shape,
                        num_classes=output_shape[-1],
                        output_shape=output_shape,
                        **weight_decay.model_params(self._config))


def _first_images(splits: datasets.Splits):
  """The training split's first images (ADAPTED_IMAGES, or as many as
  hold ADAPTED_PIXELS), normalized as the model receives them: what layers
  fitted to the data before training are fitted to (models/whitening.py),
  the same on every rank."""
  height, width = splits.info.image_shape[:2]
  images, _ = next(iter(datasets.eval_batches(
      splits.train, splits.info, shard=Shard(0, 1),
      batch_size=max(1, min(ADAPTED_IMAGES,
                            ADAPTED_PIXELS // (height * width))))))
  return images.numpy()


def _check_resizing(config: TrainConfig, info: datasets.DatasetInfo,
                    task: tasks.Task, model: keras.Model) -> None:
  """--progressive_resizing's stages, for these images, this many epochs
  and this model and task at each side, or a UserError."""
  stages = config.data.progressive_resizing
  if not stages:
    return
  given = f"--progressive_resizing={config.data.resizing_text()}"
  shape = info.image_shape
  if len(shape) != 3 or shape[0] != shape[1]:
    raise UserError(f"{given} resizes square images; {info.name}'s are "
                    f"{'x'.join(map(str, shape))}")
  if info.labels_are_masks():
    raise UserError(f"{given} resizes images, not the masks they are "
                    "labelled with")
  last = stages[-1][1]
  if last >= config.training.epochs:
    raise UserError(f"{given}: its stages end at epoch {last} of "
                    f"{config.training.epochs}; the last epochs must train "
                    "at full size, the size evaluated")
  for side, _ in stages:
    if side >= shape[0]:
      raise UserError(f"{given}: {side} pixels is not smaller than the "
                      f"images' {shape[0]}")
    try:
      tasks.check(task, config.task.name, model, (side, side, shape[2]))
    except UserError as e:
      raise UserError(f"{given}: --model={config.model.name} does not take "
                      f"{side}x{side} images ({e}); a model for any size "
                      "builds keras.Input((None, None, channels)) and "
                      "pools globally") from None


def stage(config: TrainConfig, world: distributed.World,
          splits: datasets.Splits) -> tuple[datasets.Splits, dict]:
  """For --stage_dir: the splits reading this rank's files from their
  node-local copies (engine/datasets/staging.py), and the staging's record for
  metrics.jsonl: files and bytes over all ranks, the bytes copied, and the
  seconds until the slowest process had its share."""
  data_dir, stage_dir = config.data.dir, config.data.stage_dir
  if config.faults.elastic:
    raise UserError("--stage_dir with --elastic: a process's share of the "
                    "files changes with the workers; stage without --elastic")
  splits, staged = distributed.agree(lambda: staging.stage(
      splits, data_dir=data_dir, stage_dir=stage_dir,
      rank=world.rank, world_size=world.size), name="stage")
  files, size, copied = distributed.sum_across_ranks(
      [staged.files, staged.bytes, staged.copied_bytes], name="staged")
  seconds = distributed.max_across_ranks(staged.seconds, name="staging")
  logging.info("staged %d files (%.1f MB, %.1f MB copied) to %s in %.1f s "
               "(%.1f MB/s)", files, size / staging.MB, copied / staging.MB,
               stage_dir, seconds,
               copied / staging.MB / max(seconds, 1e-6))
  return splits, dict(event="staged", stage_dir=stage_dir,
                      files=int(files), bytes=int(size),
                      copied_bytes=int(copied), seconds=round(seconds, 3),
                      time=round(time.time(), 3))


def decider(config: TrainConfig, task: tasks.Task) -> tasks.Decider:
  """The validation figure that decides best/, early stopping and the
  target: --best_metric, or the task's own."""
  best_metric = config.task.best_metric
  decides = (tasks.Decider.of(best_metric, task, flag="best_metric")
             if best_metric else
             tasks.Decider.of(task.best_metric, task))
  if decides.figure not in _figure_names(task):
    raise UserError(f"--best_metric={best_metric}: the "
                    f"{task.name} task's figures are "
                    f"{', '.join('val_' + n for n in _figure_names(task))}")
  if config.training.target_accuracy and decides.key != "val_accuracy":
    raise UserError(f"--target_accuracy: this run is decided by "
                    f"{decides.key}; give its target as --target")
  return decides


def _figure_names(task: tasks.Task) -> list[str]:
  """The names of the task's figures (of sums of zeros)."""
  totals = metrics.Totals("figure_names", task)
  return list(totals.result_of(totals.local_sums()).figures)


def learning_rate_schedule(config: TrainConfig) -> schedules.WarmupThenDecay:
  """The flags' learning rate, a function of the step; `set_world` gives
  it the number of processes and the steps per epoch."""
  optimization = config.optimization
  return schedules.WarmupThenDecay(
      base_lr=optimization.base_lr, scaling=optimization.lr_scaling,
      warmup_epochs=optimization.warmup_epochs,
      decay=optimization.lr_schedule, epochs=config.training.epochs,
      decay_epochs=optimization.lr_decay_epochs,
      decay_factor=optimization.lr_decay_factor,
      decay_table=optimization.lr_decay_table)


def optimizer_and_step(config: TrainConfig, mode: str, compression: str,
                       task: tasks.Task, model: keras.Model, learning_rate,
                       weight_average=None, given_optimizers=None
                       ) -> tuple[Any, steps.TrainStep]:
  """The optimizer the flags ask for, at `learning_rate` (a schedule of the
  step), with --weight_decay given to `model`'s kernels where its builder
  has not (weight_decay.py), and the train step that applies it to `model`
  for `task` (and updates `weight_average`, an ema.WeightAverage), in
  precision `mode` (precision.Choice's), its gradients sent with
  `compression` (communication.Choice's); a fit script's optimizers
  (`given_optimizers`, by name: engine/given.py) in place of the flags'."""
  optimization, performance = config.optimization, config.performance
  weight_decay.apply(model, config)
  def optimizer(name=""):
    if given_optimizers:
      return given_optimizers[name]
    return optimizers.build(optimization.optimizer,
                            learning_rate=learning_rate,
                            momentum=optimization.momentum,
                            nesterov=optimization.nesterov,
                            weight_decay=config.model.params["weight_decay"])

  if task.optimizers:  # the task's own step applies several
    if mode == "float16":
      raise UserError("--mixed_precision=float16: a task with its own train "
                      "step has no loss scaling; use bfloat16 or none")
    optimizer = optimizers.Several({name: optimizer(name)
                                    for name in task.optimizers})
    step = task_step.TaskTrainStep
  else:
    optimizer = precision.with_loss_scaling(optimizer(), mode)
    step = steps.TrainStep
  return optimizer, step(
      model=model, optimizer=optimizer,
      allreduce_op=performance.allreduce_op, compression=compression,
      accumulation_steps=performance.grad_accum_steps, task=task,
      weight_average=weight_average, xla=performance.xla,
      steps_per_call=performance.steps_per_call,
      deterministic=config.devices.deterministic)


def eval_step(config: TrainConfig, task: tasks.Task,
              model: keras.Model) -> eval_steps.EvalStep:
  """The evaluation step, with the views --eval_flip and --eval_shift ask
  for."""
  image_shape = task.info.image_shape
  return eval_steps.EvalStep(model=model, task=task, xla=config.performance.xla,
                        image_shape=image_shape, flip=config.data.eval_flip,
                        shift=eval_shift_pixels(config, image_shape))


def eval_shift_pixels(config: TrainConfig, image_shape: tuple) -> int:
  """--eval_shift, a fraction of the width, in whole pixels of these
  images."""
  fraction = config.data.eval_shift
  if not fraction:
    return 0
  width = image_shape[1]
  pixels = round(fraction * width)
  if not 0 < 2 * pixels < width:
    raise UserError(f"--eval_shift={fraction:g}: {pixels} pixels of "
                    f"images {width} wide; give a fraction that moves them "
                    "at least one pixel and less than half their width")
  return pixels


def training_parts(config: TrainConfig,
                   given: Optional[Given] = None) -> TrainingParts:
  """The parts of a training run, built on every rank alike; a fit
  script's model, data and optimizer (`given`) in place of the flags'."""
  began = time.time()  # MLPerf's init_start (--mlperf_log)
  # Distributed setup (Horovod, this process's device and cores), the data
  # set every rank reads its own shard of, and the model.
  world, choice, sent, splits, task, model, decides, config = prepare(
      config, given=given)
  # With --stage_dir, each rank reads its files from node-local copies.
  staged = None
  if config.data.stage_dir:
    splits, staged = stage(config, world, splits)
  info = splits.info
  logging.info("%s: %d train, %d test examples of %s", info.name,
               info.num_train, info.num_test,
               "x".join(map(str, info.image_shape)))
  logging.info("model %s: %d parameters; batch norms trained through "
               "TensorFlow's fused kernel: %d (--fused_batch_norm=%s); "
               "pointwise convolutions as matrix products: %d "
               "(--pointwise_matmul=%s); task %s", model.name,
               model.count_params(), batch_norm.fused(model),
               config.performance.fused_batch_norm, pointwise.served(model),
               config.performance.pointwise_matmul, task.name)
  kernels = start_up.cpu_kernels(config, model)
  # Optimizer and learning rate: scaled with the global batch (linear:
  # base_lr * world.size, set for each number of processes the loop runs
  # on), warmed up per step, then decayed; a function of the step evaluated
  # inside the train step.
  # A fit script's optimizers keep their own rates (the first's recorded).
  given_optimizers = given_lib.optimizers_of(task, model)
  first_given = next(iter(given_optimizers.values()), None)
  learning_rate = (schedules.AsCompiled(first_given) if first_given
                   else learning_rate_schedule(config))
  # The weights' moving average, which evaluation and exports use.
  weight_average = ema.maybe_average(model, config.optimization.ema_decay)
  optimizer, train_step = optimizer_and_step(
      config, choice.mode, sent.compression, task, model, learning_rate,
      weight_average, given_optimizers=given_optimizers)
  parts = TrainingParts(
      config=config, world=world, precision=choice, communication=sent,
      splits=splits, staged=staged, cpu_kernels=kernels, task=task,
      model=model, learning_rate=learning_rate,
      weight_average=weight_average, optimizer=optimizer,
      train_step=train_step, eval_step=eval_step(config, task, model),
      decider=decides,
      # Rank 0 writes it (from RunDirectory.open); a no-op without the flag.
      mlperf=mlperf.MLPerfLog.requested(config, began=began, world=world,
                                        info=info, staged=staged,
                                        decider=decides),
      callbacks=(given.callbacks if given else ()) + keras_callbacks.of_flag(
          config.training.callbacks))
  start_up.numerics(config, choice, sent, world, model, optimizer=(
      ", ".join(f"{type(o).__name__} (the script's)"
                for o in given_optimizers.values())
      or config.optimization.optimizer))
  return parts
