"""The run's configuration: what the user asked for, as plain values.

The command line's flags (flags/, whose config_from_flags reads absl's
FLAGS for the entry points) become a TrainConfig: everything below the
entry point takes one, so a test or a script builds one without a command
line, and two runs differ only by the values they were given.

A TrainConfig is nested by concern, one frozen section per module of
flags/ (elastic training's two flags sit with the faults it survives, and
--target with the early stopping it ends), and holds the flags' values
only. What a run measures or decides at start-up is never written back
into it but travels in records of its own: the precision (build.prepare's
precision.Choice), the processes (distributed.World), the global batch and
steps per epoch (run_state.LoopState). So this module imports no
TensorFlow and probes no hardware.

A section's fields keep their flag's name less the section's own prefix
(--data_dir is `config.data.dir`); the data set, model and task a run uses
are their sections' `name`, and what their code is given their `params`.
"""
import dataclasses
import os
from typing import Optional

# The config and each of its sections: frozen, since what a run was asked
# for does not change while it runs (TrainConfig.replace makes another);
# keyword-only, since a section of eleven values is read by name.
_SECTION = dict(frozen=True, kw_only=True)


@dataclasses.dataclass(**_SECTION)
class DataConfig:
  """The data set (a registered name or a user's module:function), how
  its images are augmented and evaluated, and where it is staged."""
  name: str
  dir: str
  params: dict  # what a data set's loader declares it takes
  normalization: Optional[tuple]  # (mean, std) per channel, or None
  random_flip: bool
  random_shift: float  # a fraction of the width
  random_transpose: bool  # volumes: a random order of their axes
  # Those of the three above the command line (or a flagfile) gives: a
  # task whose targets do not follow its images gets only these
  # (engine/datasets/splits.py: Augmentation.requested).
  given_augmentation: tuple = ()
  # ((side, last epoch), ...): smaller training images for the first epochs
  progressive_resizing: tuple
  eval_flip: bool
  eval_shift: float  # a fraction of the width, as random_shift
  stage_dir: str  # node-local storage to copy TFRecord files to; "": none

  def resizing_text(self) -> str:
    """--progressive_resizing as a flag's value: SIDE:EPOCHS,..."""
    return ",".join(f"{side}:{last}" for side, last in
                    self.progressive_resizing)


@dataclasses.dataclass(**_SECTION)
class ModelConfig:
  """The model: a registered name or a user's module:function."""
  name: str
  params: dict


@dataclasses.dataclass(**_SECTION)
class TaskConfig:
  """The task: a registered name or a user's module:Class."""
  name: str
  params: dict  # what a task's __init__ declares it takes
  best_metric: str  # "val_<figure>:max|min", or "": the task's own


@dataclasses.dataclass(**_SECTION)
class OptimizationConfig:
  optimizer: str
  base_lr: float
  lr_scaling: str
  warmup_epochs: float
  lr_schedule: str
  lr_decay_epochs: tuple
  lr_decay_factor: float
  lr_decay_table: tuple  # ((epoch, factor), ...): the table schedule's
  momentum: float
  nesterov: bool
  label_smoothing: float
  ema_decay: float


@dataclasses.dataclass(**_SECTION)
class TrainingConfig:
  batch_size: int  # per process and micro-batch
  epochs: int
  steps_per_epoch: int  # 0: the data's
  target: float  # of the deciding figure; 0: none
  target_accuracy: bool  # whether the target came as --target_accuracy
  patience: int
  seed: int
  model_dir: str
  progress: str
  summary_every_steps: int
  eval_every_epochs: int
  callbacks: str  # a user's function returning Keras callbacks; "": none

  def evaluates(self, epoch: int) -> bool:
    """Whether epoch `epoch` (0-based) is evaluated: every
    --eval_every_epochs, and the last."""
    return ((epoch + 1) % self.eval_every_epochs == 0
            or epoch + 1 == self.epochs)


@dataclasses.dataclass(**_SECTION)
class CheckpointConfig:
  resume: str
  resume_from: str
  init_from: str  # weights a new run starts from (warm_start.py)
  keep_checkpoints: int
  checkpoint_every_steps: int


@dataclasses.dataclass(**_SECTION)
class FaultConfig:
  """What a run does when a step is not finite, or a worker is lost."""
  on_nonfinite: str
  rollback_lr_factor: float
  max_rollbacks: int
  elastic: bool
  commit_every_steps: int


@dataclasses.dataclass(**_SECTION)
class DeviceConfig:
  intra_op_threads: int
  inter_op_threads: int
  bind_cpus: bool
  idle_horovod_threads: bool
  deterministic: bool


@dataclasses.dataclass(**_SECTION)
class PerformanceConfig:
  # As asked: none, float16, bfloat16, or auto, which build.prepare
  # resolves (precision.Choice).
  mixed_precision: str
  xla: bool
  gradient_compression: str
  allreduce_op: str
  grad_accum_steps: int
  steps_per_call: int
  fused_batch_norm: str  # auto or off
  pointwise_matmul: str  # auto or off
  cpu_kernels: str  # auto, off, or a variant (models/winograd3d.VARIANTS)
  remeasure_auto: bool  # auto's decisions measured again, not the kept ones


@dataclasses.dataclass(**_SECTION)
class ProfilingConfig:
  # The windows' (first, last) global steps, flattened: (first, last,
  # first, last, ...), or () for none.
  profile_steps: tuple
  profile_all_ranks: bool
  horovod_timeline: bool
  profile_every: int = 0  # the windows again every this many steps; 0: once
  # The link between hosts the step report sets the allreduce against:
  # Gbit/s (None: not given) and microseconds.
  profile_link_gbit: Optional[float] = None
  profile_link_latency_us: float = 0.0


@dataclasses.dataclass(**_SECTION)
class MLPerfConfig:
  """The MLPerf HPC log rank 0 writes, and the submission it names."""
  log: str  # the file; "": none
  benchmark: str
  division: str
  status: str
  org: str
  platform: str  # "": this host's name
  cache_clear: bool  # as the job says: the engine clears no cache


@dataclasses.dataclass(**_SECTION)
class TrialConfig:
  """The sweep this run is a trial of (engine.sweep sets both)."""
  study_dir: str  # "": no sweep
  number: int


@dataclasses.dataclass(**_SECTION)
class TrainConfig:
  """Everything a run was asked to do, by concern (see flags/ for the
  meanings)."""
  data: DataConfig
  model: ModelConfig
  task: TaskConfig
  optimization: OptimizationConfig
  training: TrainingConfig
  checkpoints: CheckpointConfig
  faults: FaultConfig
  devices: DeviceConfig
  performance: PerformanceConfig
  profiling: ProfilingConfig
  mlperf: MLPerfConfig
  trial: TrialConfig
  command_line: str  # the flags as a flagfile, recorded in model_dir
  # The flags the user set, by name (the others are at their defaults): a
  # builder's parameter among them must reach the run's builder
  # (flags/reached.py). Not compared: two configs of the same
  # values are the same run, whichever flags said them.
  given: frozenset = dataclasses.field(default=frozenset(), compare=False)

  def replace(self, **changes) -> "TrainConfig":
    """This config with `changes`: a section's by a dict of its fields,
    any other field by its value, e.g.
    `config.replace(training=dict(epochs=2), command_line=text)`. A field
    a section lacks is a TypeError naming it."""
    return dataclasses.replace(self, **{
        name: (dataclasses.replace(getattr(self, name), **value)
               if dataclasses.is_dataclass(getattr(self, name)) else value)
        for name, value in changes.items()})

  def hparams(self, world_size: int, global_batch: int,
              mixed_precision: str) -> dict:
    """What TensorBoard's HParams dashboard compares runs by: the flags
    that shape the result, and the processes, global batch and precision
    (auto's choice) they ran with."""
    data, optimization, training = self.data, self.optimization, self.training
    return dict(
        dataset=data.name, model=self.model.name, **self.model.params,
        task=self.task.name,
        optimizer=optimization.optimizer, base_lr=optimization.base_lr,
        lr_scaling=optimization.lr_scaling,
        warmup_epochs=optimization.warmup_epochs,
        lr_schedule=optimization.lr_schedule,
        momentum=optimization.momentum,
        label_smoothing=optimization.label_smoothing,
        ema_decay=optimization.ema_decay,
        batch_size=training.batch_size, global_batch=global_batch,
        processes=world_size, epochs=training.epochs,
        mixed_precision=mixed_precision,
        grad_accum_steps=self.performance.grad_accum_steps,
        random_flip=data.random_flip, random_shift=data.random_shift,
        progressive_resizing=data.resizing_text(),
        eval_flip=data.eval_flip, eval_shift=data.eval_shift,
        seed=training.seed)


def default_model_dir(dataset: str, model: str) -> str:
  """runs/<dataset>_<model>, a user's module:function by its function's
  name."""
  def short(name):
    return name.rpartition(":")[2]
  return os.path.join("runs", f"{short(dataset)}_{short(model)}")
