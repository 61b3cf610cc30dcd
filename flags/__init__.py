"""The engine's command-line flags, one module per concern, and the
TrainConfig they become.

Importing this package defines them all. `--helpfull` lists them grouped by
these modules: flags.data, flags.model, flags.task, flags.optimization,
flags.training, flags.checkpoints, flags.faults, flags.elastic,
flags.devices, flags.performance, flags.profiling, flags.mlperf,
flags.trial. Their defaults are the CPU preset
(flags/fashion_mnist_cpu.cfg): with no flags at all, the engine trains a
small CNN on Fashion-MNIST to over 90% test accuracy in minutes.

An enum flag takes its choices in any case (--tfrecord_compression=GZIP,
TensorFlow's spelling) and holds the spelling listed; a value not among
them is one line naming them.

absl's FLAGS are read here (config_from_flags) for the entry points that
parse them (engine.cli, engine.evaluate, engine.find_lr, engine.sweep):
the engine below them takes the TrainConfig (engine/core/config.py). So
flags/ sits above the engine's packages, whose choices its modules name,
and below the commands.
"""
from typing import Optional

from absl import flags as absl_flags

from engine.core import config
from engine.core.errors import UserError
from flags import (checkpoints, data, devices, elastic, faults, mlperf,
                   model, optimization, performance, profiling, task, trial,
                   training)

FLAGS = absl_flags.FLAGS
MODULES = (data, model, task, optimization, training, checkpoints, faults,
           elastic, devices, performance, profiling, mlperf, trial)


def as_flagfile() -> str:
  """The engine's flags with their current values, as a flagfile's lines.

  Only the engine's own flags: absl's logging and debugging flags are not
  part of what a run is; nor the augmentation flags not given, whose
  defaults the task decides (data.TASK_DEFAULTS).
  """
  lines = [flag.serialize()
           for module in MODULES
           for flag in FLAGS.get_flags_for_module(module.__name__)
           if flag.present or flag.name not in data.TASK_DEFAULTS]
  return "\n".join(lines) + "\n"


def config_from_flags() -> config.TrainConfig:
  """The parsed flags as a TrainConfig, or a UserError for flags that
  contradict each other."""
  _check_flags_agree()
  return config.TrainConfig(
      data=_data(), model=_model(), task=_task(),
      optimization=_optimization(), training=_training(),
      checkpoints=config.CheckpointConfig(
          resume=FLAGS.resume, resume_from=FLAGS.resume_from,
          init_from=FLAGS.init_from,
          keep_checkpoints=FLAGS.keep_checkpoints,
          checkpoint_every_steps=FLAGS.checkpoint_every_steps),
      faults=config.FaultConfig(
          on_nonfinite=FLAGS.on_nonfinite,
          rollback_lr_factor=FLAGS.rollback_lr_factor,
          max_rollbacks=FLAGS.max_rollbacks,
          elastic=FLAGS.elastic, commit_every_steps=FLAGS.commit_every_steps),
      devices=config.DeviceConfig(
          intra_op_threads=FLAGS.intra_op_threads,
          inter_op_threads=FLAGS.inter_op_threads, bind_cpus=FLAGS.bind_cpus,
          idle_horovod_threads=FLAGS.idle_horovod_threads,
          deterministic=FLAGS.deterministic),
      performance=_performance(), profiling=_profiling(), mlperf=_mlperf(),
      trial=config.TrialConfig(study_dir=FLAGS.trial_study_dir,
                               number=FLAGS.trial_number),
      command_line=as_flagfile(), given=given_flags())


def given_flags() -> frozenset:
  """The engine's flags the command line or a flagfile set to a value other
  than their default.

  Set, not defaulted: a flag no builder of the run takes is refused only if
  the user asked for it. And other than the default, since a flagfile the
  engine wrote (model_dir/flags.txt, engine.sweep --best) gives every flag,
  those no builder of its run took among them, at their defaults.
  """
  return frozenset(flag.name
                   for module in MODULES
                   for flag in FLAGS.get_flags_for_module(module.__name__)
                   if flag.present and flag.value != flag.default)


def _check_flags_agree() -> None:
  """A UserError for flags of different modules that contradict each
  other (a module's own are its validators')."""
  if FLAGS.init_from and FLAGS.resume_from:
    raise UserError("--init_from and --resume_from: give one (--init_from "
                    "takes another run's weights alone, --resume_from its "
                    "optimizer and position too)")
  if FLAGS.target and FLAGS.target_accuracy:
    raise UserError("--target and --target_accuracy: give one (--target is "
                    "for any figure, --target_accuracy for val_accuracy)")
  if FLAGS.mlperf_log and FLAGS.elastic:
    raise UserError("--mlperf_log with --elastic: an MLPerf run keeps its "
                    "processes, and rank 0 writes its log; log without "
                    "--elastic")
  if FLAGS.deterministic and FLAGS.profile_steps:
    raise UserError("--profile_steps with --deterministic: TensorFlow "
                    "refuses the step report's clocks (tf.timestamp) under "
                    "op determinism; profile without --deterministic")
  if bool(FLAGS.trial_study_dir) != (FLAGS.trial_number >= 0):
    raise UserError("--trial_study_dir and --trial_number: give both "
                    "(engine.sweep does, for each trial it starts) or "
                    "neither")


def _data() -> config.DataConfig:
  return config.DataConfig(
      name=FLAGS.dataset, dir=FLAGS.data_dir,
      # What the data flags give loaders (each takes those it declares).
      params=dict(image_size=FLAGS.image_size, num_classes=FLAGS.num_classes,
                  channels=int(FLAGS.channels),
                  label_offset=FLAGS.label_offset,
                  train_examples=FLAGS.train_examples,
                  test_examples=FLAGS.test_examples,
                  validation_split=FLAGS.validation_split,
                  skip_bad_files=FLAGS.skip_bad_files,
                  array_keys=tuple(FLAGS.array_keys),
                  tfrecord_features=FLAGS.tfrecord_features,
                  tfrecord_compression=FLAGS.tfrecord_compression,
                  log_transform=FLAGS.log_transform,
                  cache_records=FLAGS.cache_records),
      normalization=_normalization(),
      random_flip=FLAGS.random_flip, random_shift=FLAGS.random_shift,
      random_transpose=FLAGS.random_transpose,
      given_augmentation=tuple(name for name in data.TASK_DEFAULTS
                               if FLAGS[name].present),
      progressive_resizing=data.resizing_stages(FLAGS.progressive_resizing),
      eval_flip=FLAGS.eval_flip, eval_shift=FLAGS.eval_shift,
      stage_dir=FLAGS.stage_dir)


def _normalization() -> Optional[tuple]:
  """--image_mean and --image_std as (mean, std), or None: the data
  set's own."""
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


def _model() -> config.ModelConfig:
  return config.ModelConfig(
      name=FLAGS.model,
      params=dict(depth=FLAGS.depth, width=FLAGS.width,
                  filters=FLAGS.filters, conv_layers=FLAGS.conv_layers,
                  kernel_size=FLAGS.kernel_size,
                  stem=FLAGS.stem, pool_first=FLAGS.pool_first,
                  dropout=FLAGS.dropout,
                  weight_decay=FLAGS.weight_decay))


def _task() -> config.TaskConfig:
  return config.TaskConfig(
      name=FLAGS.task,
      params=dict(label_smoothing=FLAGS.label_smoothing,
                  loss=FLAGS.loss, ignore_label=FLAGS.ignore_label,
                  noise=FLAGS.noise, seed=FLAGS.seed,
                  standardize_targets=FLAGS.standardize_targets),
      best_metric=FLAGS.best_metric)


def _optimization() -> config.OptimizationConfig:
  return config.OptimizationConfig(
      optimizer=FLAGS.optimizer, base_lr=FLAGS.base_lr,
      lr_scaling=FLAGS.lr_scaling, warmup_epochs=FLAGS.warmup_epochs,
      lr_schedule=FLAGS.lr_schedule,
      lr_decay_epochs=tuple(int(e) for e in FLAGS.lr_decay_epochs),
      lr_decay_factor=FLAGS.lr_decay_factor,
      lr_decay_table=optimization.decay_table(FLAGS.lr_decay_table),
      momentum=FLAGS.momentum,
      nesterov=FLAGS.nesterov, label_smoothing=FLAGS.label_smoothing,
      ema_decay=FLAGS.ema_decay)


def _training() -> config.TrainingConfig:
  return config.TrainingConfig(
      batch_size=FLAGS.batch_size, epochs=FLAGS.epochs,
      steps_per_epoch=FLAGS.steps_per_epoch,
      target=FLAGS.target or FLAGS.target_accuracy,
      target_accuracy=bool(FLAGS.target_accuracy),
      patience=FLAGS.patience, seed=FLAGS.seed,
      model_dir=FLAGS.model_dir or config.default_model_dir(FLAGS.dataset,
                                                            FLAGS.model),
      progress=FLAGS.progress,
      summary_every_steps=FLAGS.summary_every_steps,
      eval_every_epochs=FLAGS.eval_every_epochs, callbacks=FLAGS.callbacks)


def _performance() -> config.PerformanceConfig:
  return config.PerformanceConfig(
      mixed_precision=FLAGS.mixed_precision, xla=FLAGS.xla,
      gradient_compression=FLAGS.gradient_compression,
      allreduce_op=FLAGS.allreduce_op,
      grad_accum_steps=FLAGS.grad_accum_steps,
      steps_per_call=FLAGS.steps_per_call,
      fused_batch_norm=FLAGS.fused_batch_norm,
      pointwise_matmul=FLAGS.pointwise_matmul,
      cpu_kernels=FLAGS.cpu_kernels,
      remeasure_auto=FLAGS.remeasure_auto)


def _profiling() -> config.ProfilingConfig:
  return config.ProfilingConfig(
      profile_steps=tuple(int(step)
                          for step in FLAGS.profile_steps.split(",")
                          if FLAGS.profile_steps),
      profile_all_ranks=FLAGS.profile_all_ranks,
      horovod_timeline=FLAGS.horovod_timeline,
      profile_every=FLAGS.profile_every,
      profile_link_gbit=FLAGS.profile_link_gbit,
      profile_link_latency_us=FLAGS.profile_link_latency_us)


def _mlperf() -> config.MLPerfConfig:
  return config.MLPerfConfig(
      log=FLAGS.mlperf_log, benchmark=FLAGS.mlperf_benchmark,
      division=FLAGS.mlperf_division, status=FLAGS.mlperf_status,
      org=FLAGS.mlperf_org, platform=FLAGS.mlperf_platform,
      cache_clear=FLAGS.mlperf_cache_clear)
