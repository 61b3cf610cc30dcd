"""The run's configuration: the engine's flags as plain values.

absl's FLAGS are read here and only here (and by the entry points that
parse them, engine.cli): everything below the entry point takes a
TrainConfig, so a test or a script builds one without a command line, and
two runs differ only by the values they were given.
"""
import dataclasses
import os
from typing import Optional

from absl import flags

from engine.compute import precision
from engine.errors import UserError
import flags as engine_flags

FLAGS = flags.FLAGS


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
  eval_shift: float  # a fraction of the width, as random_shift
  random_shift: float
  random_transpose: bool  # volumes: a random order of their axes
  # ((side, last epoch), ...): smaller training images for the first epochs
  progressive_resizing: tuple
  stage_dir: str  # node-local storage to copy TFRecord files to; "": none
  # Model
  model: str
  model_params: dict
  # Task (a registered name or a user's module:Class)
  task: str
  task_params: dict  # what a task's __init__ declares it takes
  best_metric: str  # "val_<figure>:max|min", or "": the task's own
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
  target: float  # of the deciding figure; 0: none
  target_accuracy: bool  # whether the target came as --target_accuracy
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
  # --mixed_precision=auto: the hardware's native modes, which
  # build.prepare measures where there are several (then none: the choice
  # is in mixed_precision, and precision_figures has each mode's img/s and
  # the seconds it took, or the hardware where float32 ran unmeasured).
  precision_candidates: tuple
  precision_figures: dict
  xla: bool
  gradient_compression: str
  allreduce_op: str
  grad_accum_steps: int
  steps_per_call: int
  # Profiling
  profile_steps: tuple  # (first, last) global steps, or () for none
  profile_all_ranks: bool
  horovod_timeline: bool

  def evaluates(self, epoch: int) -> bool:
    """Whether epoch `epoch` (0-based) is evaluated: every
    --eval_every_epochs, and the last."""
    return ((epoch + 1) % self.eval_every_epochs == 0
            or epoch + 1 == self.epochs)

  def resizing_text(self) -> str:
    """--progressive_resizing as a flag's value: SIDE:EPOCHS,..."""
    return ",".join(f"{side}:{last}" for side, last in
                    self.progressive_resizing)

  def hparams(self, world_size: int, global_batch: int) -> dict:
    """What TensorBoard's HParams dashboard compares runs by: the flags
    that shape the result, and the processes and global batch they ran
    with."""
    return dict(
        dataset=self.dataset, model=self.model, **self.model_params,
        task=self.task,
        optimizer=self.optimizer, base_lr=self.base_lr,
        lr_scaling=self.lr_scaling, warmup_epochs=self.warmup_epochs,
        lr_schedule=self.lr_schedule, momentum=self.momentum,
        label_smoothing=self.label_smoothing, ema_decay=self.ema_decay,
        batch_size=self.batch_size, global_batch=global_batch,
        processes=world_size, epochs=self.epochs,
        mixed_precision=self.mixed_precision,
        grad_accum_steps=self.grad_accum_steps,
        random_flip=self.random_flip, random_shift=self.random_shift,
        progressive_resizing=self.resizing_text(),
        eval_flip=self.eval_flip, eval_shift=self.eval_shift,
        seed=self.seed)


def config_from_flags() -> TrainConfig:
  mixed_precision, why = precision.resolve(FLAGS.mixed_precision)
  native = (precision.native()[0] if FLAGS.mixed_precision == "auto"
            else ())
  if FLAGS.target and FLAGS.target_accuracy:
    raise UserError("--target and --target_accuracy: give one (--target is "
                    "for any figure, --target_accuracy for val_accuracy)")
  return TrainConfig(
      dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
      data_params=_data_params_from_flags(),
      normalization=_normalization_from_flags(),
      random_flip=FLAGS.random_flip, random_shift=FLAGS.random_shift,
      eval_flip=FLAGS.eval_flip, eval_shift=FLAGS.eval_shift,
      random_transpose=FLAGS.random_transpose,
      progressive_resizing=engine_flags.data.resizing_stages(
          FLAGS.progressive_resizing),
      stage_dir=FLAGS.stage_dir,
      model=FLAGS.model,
      model_params=dict(depth=FLAGS.depth, width=FLAGS.width,
                        filters=FLAGS.filters, conv_layers=FLAGS.conv_layers,
                        stem=FLAGS.stem, pool_first=FLAGS.pool_first,
                        dropout=FLAGS.dropout,
                        weight_decay=FLAGS.weight_decay),
      task=FLAGS.task,
      task_params=dict(label_smoothing=FLAGS.label_smoothing,
                       loss=FLAGS.loss, ignore_label=FLAGS.ignore_label,
                       noise=FLAGS.noise, seed=FLAGS.seed,
                       standardize_targets=FLAGS.standardize_targets),
      best_metric=FLAGS.best_metric,
      optimizer=FLAGS.optimizer, base_lr=FLAGS.base_lr,
      lr_scaling=FLAGS.lr_scaling, warmup_epochs=FLAGS.warmup_epochs,
      lr_schedule=FLAGS.lr_schedule,
      lr_decay_epochs=tuple(int(e) for e in FLAGS.lr_decay_epochs),
      lr_decay_factor=FLAGS.lr_decay_factor, momentum=FLAGS.momentum,
      nesterov=FLAGS.nesterov, label_smoothing=FLAGS.label_smoothing,
      ema_decay=FLAGS.ema_decay,
      batch_size=FLAGS.batch_size, epochs=FLAGS.epochs,
      steps_per_epoch=FLAGS.steps_per_epoch,
      target=FLAGS.target or FLAGS.target_accuracy,
      target_accuracy=bool(FLAGS.target_accuracy), patience=FLAGS.patience,
      progress=FLAGS.progress, summary_every_steps=FLAGS.summary_every_steps,
      eval_every_epochs=FLAGS.eval_every_epochs,
      seed=FLAGS.seed,
      model_dir=FLAGS.model_dir or default_model_dir(FLAGS.dataset,
                                                     FLAGS.model),
      intra_op_threads=FLAGS.intra_op_threads,
      inter_op_threads=FLAGS.inter_op_threads, bind_cpus=FLAGS.bind_cpus,
      deterministic=FLAGS.deterministic,
      mixed_precision=mixed_precision, mixed_precision_why=why,
      precision_candidates=native,
      precision_figures={}, xla=FLAGS.xla,
      gradient_compression=FLAGS.gradient_compression,
      allreduce_op=FLAGS.allreduce_op,
      grad_accum_steps=FLAGS.grad_accum_steps,
      steps_per_call=FLAGS.steps_per_call,
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


def _data_params_from_flags() -> dict:
  """What the data flags give loaders (each takes those it declares)."""
  return dict(image_size=FLAGS.image_size, num_classes=FLAGS.num_classes,
              channels=int(FLAGS.channels), label_offset=FLAGS.label_offset,
              train_examples=FLAGS.train_examples,
              test_examples=FLAGS.test_examples,
              validation_split=FLAGS.validation_split,
              skip_bad_files=FLAGS.skip_bad_files,
              array_keys=tuple(FLAGS.array_keys),
              tfrecord_features=FLAGS.tfrecord_features,
              tfrecord_compression=FLAGS.tfrecord_compression,
              log_transform=FLAGS.log_transform)


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
