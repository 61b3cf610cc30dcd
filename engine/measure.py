"""What `auto` options measure at start-up: the run's real train step,
timed in alternating rounds on its first batches.

--mixed_precision=auto times a step per native precision mode
(engine/compute/precision.py), --gradient_compression=auto a step per
compression (engine/compute/communication.py); both through `timed`, so
the two measurements are made alike: every rank times each variant's
steps on its own first training batches, allreduce included, the
variants alternating over MEASURED_ROUNDS rounds after a step that traces
them; rank 0's figures decide, for every rank. A variant runs as many
steps a round (1 to MEASURED_STEPS) as fit its share of MEASURED_SECONDS
at the speed of one step timed first, so a slow model costs a few seconds
more, not a minute. The models measured are thrown away; the run's is
built afterwards, from the seed, as if nothing had been measured
(build.prepare).
"""
import dataclasses
import itertools
import statistics
import time
from typing import Callable

from absl import logging

from engine import datasets
from engine import distributed
from engine import tasks
from engine.compute import communication
from engine.compute import precision
from engine.core.config import TrainConfig
from engine.datasets import Epochs, Shard
from engine.datasets.augmentation import Augmentation
from engine.input import data

# Each `auto` measurement's rounds, the seconds of timed steps they share
# (all variants, all rounds), and the most steps a variant runs in one.
MEASURED_ROUNDS = 3
MEASURED_SECONDS = 4.0
MEASURED_STEPS = 8


def timed(config: TrainConfig, world: distributed.World,
          splits: datasets.Splits, train_steps: dict[str, Callable],
          name: str) -> dict:
  """Each variant's images/s over all ranks (this rank's timing), and the
  steps a round each ran (rank 0's count, on every rank: each step holds
  an allreduce, so the ranks' collectives must match). `train_steps`:
  each variant's train step, on a model of its own at learning rate 0."""
  batches = list(itertools.islice(data.train_stream(
      splits.train, splits.info, shard=Shard(world.rank, world.size),
      epochs=Epochs(batch_size=config.training.batch_size
                    * config.performance.grad_accum_steps,
                    steps=MEASURED_STEPS, seed=config.training.seed),
      augmentation=Augmentation.requested(config.data, resizing=False)),
                                  MEASURED_STEPS))
  step_seconds = {}
  for variant, train_step in train_steps.items():
    train_step(*batches[0])  # tracing, not timed
    started = time.perf_counter()
    train_step(*batches[1 % len(batches)])
    step_seconds[variant] = time.perf_counter() - started
  share = MEASURED_SECONDS / (len(train_steps) * MEASURED_ROUNDS)
  steps = distributed.on_chief(lambda: {
      variant: max(1, min(len(batches), int(share / seconds)))
      for variant, seconds in step_seconds.items()}, name=f"{name}_steps")
  seconds = {variant: [] for variant in train_steps}
  variants = list(train_steps)
  for round_ in range(MEASURED_ROUNDS):
    for variant in variants[::-1] if round_ % 2 else variants:
      started = time.perf_counter()
      for images, labels in batches[:steps[variant]]:
        train_steps[variant](images, labels)
      seconds[variant].append(time.perf_counter() - started)
  examples = len(batches[0][1]) * world.size  # a step's, over all ranks
  return dict(images_per_sec={
      variant: examples * steps[variant] / statistics.median(seconds[variant])
      for variant in variants}, steps_per_round=steps)


def precision_choice(config: TrainConfig, preferred: precision.Choice,
                     candidates: tuple[str, ...], world: distributed.World,
                     splits: datasets.Splits, task: tasks.Task,
                     step_of: Callable[[str, str], Callable],
                     measure: bool) -> precision.Choice:
  """--mixed_precision=auto: the mode of the run's first start (recorded
  in model_dir), or measured now among the hardware's native `candidates`,
  else the hardware's `preferred`; on hardware of float32 alone, float32
  unmeasured, recorded all the same so that a resume elsewhere keeps it.
  `step_of(mode, compression)`: a train step on a new model."""
  first_start = distributed.on_chief(
      lambda: precision.of_first_start(config.training.model_dir),
      name="precision")
  if first_start:
    mode, why = first_start
    return precision.Choice(mode=mode, why=why)
  if not measure:
    return preferred
  if len(candidates) == 1:
    return dataclasses.replace(preferred, figures=dict(
        images_per_sec={}, hardware=preferred.why))
  began = time.perf_counter()
  # Measured as the run asks its gradients sent; under auto, as float32.
  compression = config.performance.gradient_compression.replace(
      "auto", "none")
  modes = [mode for mode in candidates
           # A task's own step has no loss scaling.
           if not (task.optimizers and mode == "float16")]
  figures = timed(config, world, splits, {
      mode: step_of(mode, compression) for mode in modes}, "precision")
  chosen = distributed.on_chief(
      lambda: precision.choose(figures["images_per_sec"]),
      name="precision_choice")
  return precision.Choice(mode=chosen, **_described(
      "--mixed_precision", precision.described, chosen, figures, began))


def compression_choice(config: TrainConfig, mode: str,
                       world: distributed.World, splits: datasets.Splits,
                       step_of: Callable[[str, str], Callable],
                       measure: bool) -> communication.Choice:
  """--gradient_compression: the one asked for; under auto, the first
  start's (recorded in model_dir), or measured now in precision `mode`
  with a step per compression (`step_of(mode, compression)`, a train step
  on a new model). A process alone runs none unmeasured, which a first
  start records. (auto with --elastic is refused with the flags: its
  workers meet inside the train loop, after start-up.)"""
  asked = config.performance.gradient_compression
  if asked != "auto":
    return communication.Choice(asked)
  first_start = distributed.on_chief(
      lambda: communication.of_first_start(config.training.model_dir),
      name="compression")
  if first_start:
    return communication.Choice(*first_start)
  if world.size == 1:
    unmeasured = "a process alone has no allreduce"
    return communication.Choice("none", f"none, unmeasured: {unmeasured}",
                                dict(images_per_sec={}, unmeasured=unmeasured,
                                     **communication.in_effect()))
  if not measure:  # engine.evaluate: no gradients to send
    return communication.Choice("none")
  began = time.perf_counter()
  figures = timed(config, world, splits, {
      compression: step_of(mode, compression)
      for compression in ("none", "fp16")}, "compression")
  chosen = distributed.on_chief(
      lambda: communication.choose(figures["images_per_sec"]),
      name="compression_choice")
  described = _described("--gradient_compression", communication.described,
                         chosen, figures, began)
  described["figures"].update(communication.in_effect())
  return communication.Choice(chosen, **described)


def _described(flag: str, describe, chosen: str, figures: dict,
               began: float) -> dict:
  """A measured choice's `why` (logged) and `figures` (recorded): rank
  0's images/s rounded, the steps a round, and the seconds it took."""
  why = describe(figures["images_per_sec"], chosen)
  took = time.perf_counter() - began
  logging.info("%s=auto: %s (%.1f s)", flag, why, took)
  return dict(why=why, figures=dict(
      images_per_sec={variant: round(rate, 1) for variant, rate
                      in figures["images_per_sec"].items()},
      steps_per_round=figures["steps_per_round"], seconds=round(took, 2)))
