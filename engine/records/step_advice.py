"""What the engine offers against what bounds a step, leaving out what
the run already does: the step report's suggestions
(engine/records/step_report.py)."""
import dataclasses
from typing import Optional

from engine.core import config
from engine.records import scaling


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the run does, from its typed config (engine/loop/session.py):
  what the verdict does not suggest, and what the report's link figures
  are of."""
  device: str                  # "CPU" or "GPU"
  processes_per_host: int
  # The run's, its `auto` choices decided (build.prepare).
  performance: config.PerformanceConfig
  records: bool                # reads TFRecords
  cache_records: bool
  image_records: bool          # in ImageNet's layout
  streams_declared_records: bool
  stage_dir: bool
  gradient_bytes: int = 0      # an update's, as the allreduce sends them
  link: Optional[scaling.Link] = None  # --profile_link_gbit's
  controller: str = ""         # Horovod's, of several processes: Gloo or MPI


def against(bounds, settings: Settings) -> list[str]:
  """What to try against `bounds` (in their order), each flag once."""
  return _once_a_flag(text for bound in bounds
                      for text in _offered(bound, settings))


def _once_a_flag(suggestions) -> list[str]:
  """`suggestions` in their order, a flag offered against two bounds
  (--cache_records against input and compute) kept where it comes first."""
  kept, flags = [], set()
  for text in suggestions:
    flag = text.split(":")[0].split(" ")[0] if text.startswith("--") else text
    if flag not in flags:
      flags.add(flag)
      kept.append(text)
  return kept


def _offered(bound: str, settings: Settings) -> list[str]:
  """What the engine offers against `bound`, leaving out what a run with
  `settings` already does."""
  gpu, performance = settings.device == "GPU", settings.performance
  offered = {
      "input": [
          (settings.records and not settings.cache_records
           and not settings.image_records,
           "--cache_records: TFRecords of declared features decoded once "
           "and kept in memory"),
          (settings.records and not settings.stage_dir,
           "--stage_dir: TFRecords copied to node-local storage first"),
          (True, "more cores for each process's reads (tf.data reads in "
                 "parallel, as many as it has cores)")],
      "compute": [
          (performance.mixed_precision == "none",
           "--mixed_precision=" + ("float16" if gpu else "bfloat16 (where "
                                   "the CPU has AVX512_BF16 or AMX)")),
          # On a CPU tf.data decodes on the cores the step computes on:
          # the decoding shows as longer forward and backward passes, not
          # as input wait (bench/RESULTS.md, "The step at float32 is the
          # core's peak").
          (not gpu and settings.streams_declared_records,
           "--cache_records: the records are decoded on the cores that "
           "compute, which shows in forward and backward, not in input"),
          (gpu and not performance.xla, "--xla")],
      "communication": [
          (performance.gradient_compression == "none",
           "--gradient_compression=fp16: half the bytes"),
          (performance.grad_accum_steps == 1,
           "--grad_accum_steps: one allreduce for several batches"),
          (True, "Horovod's fusion and cycle (horovodrun --fusion-"
                 "threshold-mb, --cycle-time-ms)"),
          (settings.processes_per_host > 1,
           "fewer processes per host, each with more threads"),
          (performance.allreduce_op == "average",
           "--allreduce_op=adasum, where Horovod runs on MPI"),
          # bench/RESULTS.md, "Processes of one host: Gloo against MPI".
          (settings.controller == "Gloo" and settings.processes_per_host > 1,
           "Horovod's MPI for processes that share a host (mpirun or "
           "srun; Horovod built with MPI): it trained 1.08-1.13x as fast as "
           "Gloo on 2 processes of one host, measured; Gloo alone names "
           "a frozen rank")],
      # Measured at the run's own steps a call (the window runs them).
      "host": [
          (True, f"--steps_per_call above {performance.steps_per_call}: "
                 "several steps a call, one launch and read")],
  }[bound]
  return [text for applies, text in offered if applies]
