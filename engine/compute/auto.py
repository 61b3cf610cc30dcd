"""The `auto` options' decisions, made once for a kind of run and kept:
--mixed_precision=auto (engine/compute/precision.py) and
--gradient_compression=auto (engine/compute/communication.py).

Whether 16 bits, or gradients sent in 16 bits, pay depends on the model,
the batch, the hardware and the link, so `auto` measures: every rank times
the run's real train step in each candidate (`timed`), rank 0's figures
decide for every rank, and a candidate beats the baseline (float32) only
by more than MARGIN and more than its own rounds' spread.

A measurement at every start made the same command train differently:
on a 2-core AVX512_BF16 EPYC a seeded run chose float32 once (measured
under load) and bfloat16 twice, and ended 0.708 against 0.525. So each
option is decided, by rank 0 for all ranks, from the first of:
1. the run's own: what its first start decided (model_dir's
   precision.json or communication.json, or the value its flags.txt names
   for a run first started without auto): a run never changes precision
   or rounding midway, resumed on other hardware or not;
2. nothing to measure: hardware of float32 alone, a process alone (no
   allreduce), or engine.evaluate (no training);
3. the kept decision for this kind of run (`kind_of_run`: the machine's
   CPU or GPUs, the model, the batch, the processes and hosts, TensorFlow's
   version), in the user's cache beside Horovod's wheel (`cache_dir`):
   every later run of that kind trains alike, whatever else the machine
   is doing. --remeasure_auto measures again and keeps the new decision;
4. measured now, and kept.
"""
import dataclasses
import hashlib
import itertools
import json
import os
import statistics
import time
from typing import Callable, Optional

from absl import logging
import keras
import tensorflow as tf

from engine import datasets
from engine import distributed
from engine import tasks
from engine.compute import communication
from engine.compute import precision
from engine.compute.step import TrainStep
from engine.core import cpu
from engine.core import run_files
from engine.core.config import TrainConfig

# Each measurement's rounds, the seconds of timed steps they share (all
# variants, all rounds), and the batches each rank reads for them. A
# variant runs as many steps a round (at least 1) as fit its share at the
# speed of one step timed first, over those batches again and again: a
# slow model costs a few seconds more, not a minute. On a 2-core EPYC, 2
# processes of a small convnet: 3 rounds of 0.2 s spread by 8-33% and
# chose bfloat16 5 times in 6; 5 rounds of 0.8 s spread by 13-22% and
# chose it 4 times in 4 (docs/performance.md).
MEASURED_ROUNDS = 5
MEASURED_SECONDS = 8.0
MEASURED_STEPS = 8
# How much faster than the baseline a candidate must measure, at least, to
# be chosen (and more than its rounds' spread, `choose`).
MARGIN = 0.05


@dataclasses.dataclass(frozen=True)
class Option:
  """An `auto` option: its flag, where a run records its decision, and how
  its values read."""
  flag: str
  file: str  # in model_dir
  key: str  # the decision's key in that file
  names: dict  # each value, in words
  figure: str  # a measured variant's figure, in words ("{} img/s")
  says_names: bool  # a decision said by its name (float32), or its value

  def said(self, value: str) -> str:
    return self.names[value] if self.says_names else value


PRECISION = Option("mixed_precision", run_files.PRECISION_FILE, "mode",
                   precision.NAMES, "{} {:.0f} img/s", says_names=True)
COMPRESSION = Option("gradient_compression", run_files.COMMUNICATION_FILE,
                     "compression", communication.NAMES,
                     "{} gradients {:.0f} img/s", says_names=False)
OPTIONS = (PRECISION, COMPRESSION)
BASELINE = "none"  # float32, either way


def decide(config: TrainConfig, world: distributed.World,
           preferred: precision.Choice, splits: datasets.Splits,
           task: tasks.Task, step_of: Callable[[str, str], TrainStep],
           model: keras.Model, measure: bool = True
           ) -> tuple[precision.Choice, communication.Choice]:
  """The run's precision and gradient compression: as asked, or auto's
  (above). `preferred`: the hardware's preferred mode, taken unmeasured
  when not `measure` (engine.evaluate); `step_of(mode, compression)`: a
  train step on a model of its own; `model`: the run's, which names its
  kind."""
  def kind(**more):
    return dict(kind_of_run(config, world, model), **more)

  mode = preferred
  if (config.performance.mixed_precision == "auto"
      and not config.faults.elastic):  # (its workers meet in the loop)
    candidates, hardware = precision.native()
    # A task's own step has no loss scaling.
    candidates = [c for c in candidates
                  if not (task.optimizers and c == "float16")]
    # Measured as the run sends its gradients; under auto, as float32.
    sent = config.performance.gradient_compression.replace("auto", "none")
    mode = precision.Choice(*_decided(
        PRECISION, config, kind, unmeasured=(
            (hardware, dict(hardware=hardware)) if len(candidates) == 1
            else None),
        default=(preferred.mode, preferred.why) if not measure else None,
        measured=lambda: timed(config, world, splits, {
            candidate: step_of(candidate, sent)
            for candidate in candidates}, "precision")))
  if config.performance.gradient_compression != "auto":
    return mode, communication.Choice(config.performance.gradient_compression)
  alone = "a process alone has no allreduce"
  sent = communication.Choice(*_decided(
      COMPRESSION, config, lambda: kind(precision=mode.mode),
      unmeasured=((alone, dict(unmeasured=alone, **communication.in_effect()))
                  if world.size == 1 else None),
      default=(BASELINE, "") if not measure else None,  # no gradients sent
      measured=lambda: dict(timed(config, world, splits, {
          compression: step_of(mode.mode, compression)
          for compression in communication.COMPRESSIONS}, "compression"),
                            **communication.in_effect())))
  return mode, sent


def _decided(option: Option, config: TrainConfig,
             kind_of: Callable[[], dict], *,
             unmeasured: Optional[tuple[str, dict]],
             default: Optional[tuple[str, str]],
             measured: Callable[[], dict]) -> tuple[str, str, dict]:
  """`option`'s decision: (value, why, figures to record in model_dir, {}
  for none), from the first of the run's own, nothing to measure
  (`unmeasured`: why, and what to record; `default`: the value and why,
  unrecorded), the kept one for this `kind_of()` run, a measurement now."""
  first = distributed.on_chief(
      lambda: of_first_start(option, config.training.model_dir),
      name=option.flag)
  if first:
    return first[0], first[1], {}
  if unmeasured is not None:
    why, figures = unmeasured
    return (BASELINE, f"{option.said(BASELINE)}, unmeasured: {why}",
            dict(images_per_sec={}, **figures))
  if default is not None:
    return (*default, {})
  kind = kind_of()
  kept = distributed.on_chief(
      lambda: None if config.performance.remeasure_auto else read_kept(
          option, kind), name=f"{option.flag}_kept")
  if kept:
    value, figures = kept[option.key], _figures_of(option, kept)
    why = (f"kept for this kind of run ({kept_path(option, kind)}), "
           f"{described(option, figures['images_per_sec'], value)}")
    logging.info("--%s=auto: %s", option.flag, why)
    return value, why, dict(figures, kept=kept_path(option, kind))
  began = time.perf_counter()
  figures = measured()
  chosen = distributed.on_chief(lambda: choose(figures), name=option.flag)
  why = described(option, figures["images_per_sec"], chosen)
  figures = dict(figures, seconds=round(time.perf_counter() - began, 2))
  logging.info("--%s=auto: %s (%.1f s; margin %.0f%%)", option.flag, why,
               figures["seconds"], 100 * figures["margin"])
  distributed.on_chief(lambda: keep(option, kind, chosen, figures),
                       name=f"{option.flag}_keep")
  return chosen, why, figures


def choose(figures: dict) -> str:
  """The fastest variant if it beats the baseline (float32) by the
  measurement's margin (`timed`: MARGIN, or its rounds' spread if
  larger), else the baseline: a 16-bit variant is kept only where it
  clearly pays."""
  images_per_sec = figures["images_per_sec"]
  fastest = max(images_per_sec, key=images_per_sec.get)
  if images_per_sec[fastest] > images_per_sec[BASELINE] * (
      1 + figures["margin"]):
    return fastest
  return BASELINE


def described(option: Option, images_per_sec: dict, chosen: str) -> str:
  """A measurement in words: each variant's figure, and the choice."""
  figures = ", ".join(option.figure.format(option.names[variant], rate)
                      for variant, rate in images_per_sec.items())
  return f"measured {figures}: {option.said(chosen)}"


def timed(config: TrainConfig, world: distributed.World,
          splits: datasets.Splits, train_steps: dict[str, TrainStep],
          name: str) -> dict:
  """Each variant's images/s over all ranks (this rank's timing), the
  steps a round each ran (rank 0's count, on every rank: each step holds
  an allreduce, so the ranks' collectives must match), and the margin a
  variant must win by: MARGIN, or the largest relative spread of a
  variant's rounds, if larger. `train_steps`: each variant's train step,
  on a model of its own at learning rate 0, timed on this rank's first
  training batches, alternating over MEASURED_ROUNDS rounds after a step
  that traces them."""
  batches = list(itertools.islice(datasets.TrainingStream.of(
      config, splits, rank=world.rank, world_size=world.size,
      resizing=False, steps=MEASURED_STEPS).batches(), MEASURED_STEPS))
  # Read once, before any is timed, and again and again from memory.
  in_memory = tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(
      lambda *parts: tf.stack(parts), *batches)).repeat()
  step_seconds = {}
  for variant, train_step in train_steps.items():
    train_step.start(in_memory)
    train_step.train(1)  # tracing, not timed
    started = time.perf_counter()
    train_step.train(1)
    step_seconds[variant] = time.perf_counter() - started
  share = MEASURED_SECONDS / (len(train_steps) * MEASURED_ROUNDS)
  steps = distributed.on_chief(lambda: {
      variant: max(1, int(share / seconds))
      for variant, seconds in step_seconds.items()}, name=f"{name}_steps")
  seconds = {variant: [] for variant in train_steps}
  variants = list(train_steps)
  for round_ in range(MEASURED_ROUNDS):
    for variant in variants[::-1] if round_ % 2 else variants:
      started = time.perf_counter()
      for _ in range(steps[variant]):
        train_steps[variant].train(1)
      seconds[variant].append(time.perf_counter() - started)
  examples = len(batches[0][1]) * world.size  # a step's, over all ranks
  spread = max((max(s) - min(s)) / statistics.median(s)
               for s in seconds.values())
  return dict(images_per_sec={
      variant: round(examples * steps[variant]
                     / statistics.median(seconds[variant]), 1)
      for variant in variants}, steps_per_round=steps,
              round_seconds={variant: [round(s, 4) for s in rounds]
                             for variant, rounds in seconds.items()},
              margin=round(max(MARGIN, spread), 3))


def kind_of_run(config: TrainConfig, world: distributed.World,
                model: keras.Model) -> dict:
  """What an `auto` decision holds for: the same machine kind (its CPU, or
  its GPUs), the same model (its name and its variables' shapes), input,
  batch, processes, hosts and TensorFlow. A change of any measures anew."""
  gpus = tf.config.list_physical_devices("GPU")
  machine = ([tf.config.experimental.get_device_details(gpu).get(
      "device_name", "GPU") for gpu in gpus] if gpus else
             f"{cpu.model_name()} ({precision.native()[1]}), "
             f"{world.intra_op_threads} threads a process")
  # Shapes, not names: Keras numbers a process's second model's layers
  # on from its first's.
  variables = hashlib.sha256(json.dumps(
      [(list(v.shape), str(v.dtype)) for v in model.weights]
  ).encode()).hexdigest()[:16]
  return dict(machine=machine, model=config.model.name,
              variables=variables, task=config.task.name,
              input=list(model.inputs[0].shape[1:]) if model.inputs else None,
              batch_size=config.training.batch_size,
              grad_accum_steps=config.performance.grad_accum_steps,
              processes=world.size, hosts=distributed.hosts()[0],
              tensorflow=tf.__version__)


def cache_dir() -> str:
  """Where decisions are kept: beside the Horovod wheel set-up keeps
  (~/.cache/horovod-engine), or HOROVOD_ENGINE_CACHE (the tests' own)."""
  return os.environ.get("HOROVOD_ENGINE_CACHE") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
      "horovod-engine")


def kept_path(option: Option, kind: dict) -> str:
  key = hashlib.sha256(json.dumps(kind, sort_keys=True).encode())
  return os.path.join(cache_dir(), "auto",
                      f"{option.flag}-{key.hexdigest()[:16]}.json")


def read_kept(option: Option, kind: dict) -> Optional[dict]:
  """The decision kept for this kind of run, or None (none, or one that
  cannot be read: measured again, and kept over it)."""
  try:
    with open(kept_path(option, kind)) as f:
      kept = json.load(f)
    if kept["kind"] == kind and kept[option.key] in option.names:
      return kept
  except (OSError, ValueError, KeyError, TypeError):
    pass
  return None


def keep(option: Option, kind: dict, chosen: str, figures: dict) -> None:
  """Keeps a decision for this kind of run; a cache that cannot be written
  is one warning (the next run measures again)."""
  path = kept_path(option, kind)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".partial", "w") as f:
      json.dump({option.key: chosen, **figures, "kind": kind}, f, indent=1)
    os.replace(path + ".partial", path)
  except OSError as e:
    logging.warning("--%s=auto: its decision is not kept (%s): the next run "
                    "of this kind measures again", option.flag, e)


def _figures_of(option: Option, recorded: dict) -> dict:
  return {k: v for k, v in recorded.items() if k not in (option.key, "kind")}


def record(option: Option, model_dir: str, value: str, figures: dict
           ) -> None:
  """The run's decision in model_dir (`option.file`), with its figures,
  which a resume and engine.evaluate take rather than deciding again."""
  run_files.write_record(model_dir, option.file,
                         {option.key: value, **figures})


def recorded(option: Option, model_dir: str) -> Optional[dict]:
  """The decision model_dir holds from the run's first start, if any, or a
  UserError naming the file if it cannot be read."""
  return run_files.read_choice(
      model_dir, option.file, option.key, option.names,
      f"what --{option.flag}=auto decided for this run: restore it, or "
      "delete it to measure again")


def of_first_start(option: Option, model_dir: str
                   ) -> Optional[tuple[str, str]]:
  """Under `auto`, the value a resumed run keeps, and why: its first
  start's decision (`option.file`), or, for a run first started with a
  value of its own, the one its flags.txt names. None for a new run."""
  if not model_dir:
    return None
  decision = recorded(option, model_dir)
  if decision:
    value, figures = decision[option.key], decision.get("images_per_sec")
    why = (described(option, figures, value) if figures else
           f"{option.said(value)}, unmeasured: "
           f"{decision.get('hardware') or decision.get('unmeasured', '')}")
    return value, f"{why} ({option.file})"
  first = run_files.read_flags(
      os.path.join(model_dir, run_files.FLAGS_FILE)).get(option.flag)
  if first in option.names:
    return first, (f"{option.said(first)}, the {option.key} of the run's "
                   f"first start ({run_files.FLAGS_FILE})")
  return None

