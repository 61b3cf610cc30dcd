"""One start of the train loop, on one set of processes.

A run is one start of the loop; under --elastic, one more after each reset,
on the processes there are then. A start sets up what lasts as long as it:
the run's state (run_state.LoopState) continued from where the run stood,
this rank's batches, the reporting, progress, profiling and stop handling,
which `close()` ends however the start ends.
"""
import dataclasses
import functools
import socket
from typing import Any, Callable, Optional

from absl import logging

from engine import distributed
from engine.records import scaling
from engine.compute import metrics
from engine.compute import precision
from engine.core.config import TrainConfig
from engine import datasets
from engine.datasets import record_features
from engine.distributed import link_probe
from engine.loop import preemption
from engine.loop import profiling
from engine.loop.keras_callbacks import KerasCallbacks
from engine.loop import progress as progress_lib
from engine.loop.run_directory import RunDirectory
from engine.loop.run_state import LoopState
from engine.records import report
from engine.records import step_advice


def log_batches(stream: datasets.TrainingStream) -> None:
  """A start's global batch and steps per epoch, said once."""
  micro_batches = stream.micro_batches
  logging.info("global batch %d on %d processes%s, %d steps per epoch",
               stream.global_batch, stream.shard.world_size,
               f" ({micro_batches} micro-batches of "
               f"{stream.epochs.batch_size // micro_batches} per process)"
               if micro_batches > 1 else "", stream.steps_per_epoch)


def _profiled_settings(config: TrainConfig, world: distributed.World,
                       precision_mode: str, compression: str,
                       gradient_bytes: int) -> step_advice.Settings:
  """What the run does, for its step report: what it would otherwise
  suggest (step_report.verdict), the gradients' bytes and the link."""
  performance, profile = config.performance, config.profiling
  return step_advice.Settings(
      device=world.device, processes_per_host=distributed.hosts()[1],
      performance=dataclasses.replace(performance,
                                      mixed_precision=precision_mode,
                                      gradient_compression=compression),
      stage_dir=bool(config.data.stage_dir), gradient_bytes=gradient_bytes,
      controller=distributed.controller() if world.size > 1 else "",
      link=scaling.Link.of(profile.profile_link_gbit,
                           profile.profile_link_latency_us)
      if profile.profile_link_gbit else None,
      **_records_read(config.data))


def _records_read(data_config) -> dict:
  """How the run reads TFRecords: `image_records` in ImageNet's layout
  (encoded images, which --cache_records does not take), else of declared
  features, `streams_declared_records` when decoded each epoch (on a CPU,
  on the cores that compute); --cache_records decodes them once."""
  records = data_config.name == "tfrecord"
  cached = bool(data_config.params.get("cache_records"))
  declared = records and record_features.spec_of(
      data_config.dir, data_config.params.get("tfrecord_features", ""))
  return dict(records=records, cache_records=cached,
              image_records=bool(records and not declared),
              streams_declared_records=bool(declared and not cached))


class Session:
  """What a start set up: the run's state and what it reads and reports
  with."""

  def __init__(self, *, config: TrainConfig,
               precision_choice: precision.Choice, compression: str,
               world: distributed.World,
               directory: Optional[RunDirectory], state: LoopState,
               train_step, stream: datasets.TrainingStream,
               callbacks: KerasCallbacks):
    """`precision_choice`: the start-up's, whose mode the run's hparams
    name; `compression`, the gradients' as start-up decided it.
    `train_step`: the run's (engine/compute/step.py), which reads the
    batches of `stream`, this rank's, from where the state stands; its
    running sums are what summaries within an epoch read, its gradients'
    bytes the step report's bandwidth. `callbacks`: a fit script's Keras
    callbacks, for this start."""
    self.world = world
    self.callbacks = callbacks
    self.directory = directory  # rank 0's model_dir; None on the others
    self.state = state
    chief = distributed.is_chief()
    training, profile = config.training, config.profiling
    self._stream = stream
    self._train_step = train_step
    self.read_from_state()
    # Rank 0's is its model_dir's; the others' does nothing.
    self.reporter = directory.reporter if directory else report.Reporter(
        training.model_dir, chief=False, epochs=training.epochs)
    # What was written past this point (before a crash, say) goes.
    self.reporter.keep_epochs_up_to(state.epoch, state.global_step)
    self.reporter.hparams(config.hparams(world.size, state.global_batch,
                                         precision_choice.mode))
    self.progress = progress_lib.Progress(
        mode=training.progress, chief=chief,
        steps_per_epoch=state.steps_per_epoch, epochs=training.epochs,
        global_batch=state.global_batch)
    self.stop_requests = preemption.StopRequests()
    self.stop_requests.install()
    self.times = profiling.EpochTimes()
    self.window = metrics.StepWindow(train_step.totals)
    self.profiler = profiling.StepProfiler(
        training.model_dir, steps=profile.profile_steps, rank=world.rank,
        all_ranks=profile.profile_all_ranks,
        timeline=profile.horovod_timeline, every=profile.profile_every,
        settings=_profiled_settings(config, world, precision_choice.mode,
                                    compression, train_step.gradient_bytes),
        host=socket.gethostname(), local_rank=distributed.local_rank(),
        link_probe=link_probe.LinkProbe(world.dynamic_process_sets),
        reporter=self.reporter)

  def read_from_state(self) -> None:
    """The train step reads this rank's batches from where the state
    stands on (a start, or a rollback's)."""
    self._train_step.start(self._stream.batches(
        first_epoch=self.state.epoch, first_step=self.state.step))

  def start_epoch(self) -> None:
    """The epoch's timing, summaries' window and progress, from the step
    its training begins at."""
    self.times.reset()
    self.profiler.start_epoch()
    self.window.start_epoch(self.state.first_step)
    self.progress.start_epoch(self.state.epoch, self.state.first_step)

  def on_chief(self, action: Callable[[RunDirectory], Any],
               name: str) -> Any:
    """`action(directory)` on rank 0, which owns model_dir; every rank gets
    its result, or its error (a failed write stops every rank alike)."""
    directory = self.directory
    return distributed.on_chief(
        directory and functools.partial(action, directory), name=name)

  def save(self) -> str:
    """Rank 0 saves a checkpoint where the run stands; every rank gets its
    path."""
    state = self.state
    position, global_step = state.position(), state.global_step
    return self.on_chief(lambda directory: directory.save(position,
                                                          global_step),
                         name="save")

  def close(self) -> None:
    self.profiler.close()
    self.stop_requests.uninstall()
    self.reporter.close()
