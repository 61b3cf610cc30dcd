"""How the gradients travel between processes: --gradient_compression, and
the Horovod fusion threshold and cycle in effect.

`auto` measures, as --mixed_precision=auto does: whether half the bytes
pay depends on the link as much as on the model. Over loopback on two
cores the cast to float16 and back costs more than the bytes it saves; on
a slow link between hosts the allreduce bounds the step and half the bytes
halve it. Before training (engine/measure.py) every rank times the run's
real train step with the gradients sent as float32 (`none`) and as float16
(`fp16`), alternating over rounds, on its first training batches; rank 0's
figures decide for every rank. float16 is chosen only when it is faster by
MARGIN: it rounds the gradients, so it must clearly pay. A process alone
has no allreduce and runs `none`, unmeasured.

The choice, its figures, and the fusion threshold and cycle Horovod ran
with are recorded in model_dir (run_files.COMMUNICATION_FILE); a resume
keeps the first start's choice. The fusion threshold and cycle are read by
Horovod once, at hvd.init(), and Horovod 0.28.1 has no setter and cannot
start again in the same process under `horovodrun --gloo`, so they are not
measured here: they are recorded as they were (docs/performance.md says
why Horovod's own autotuner is not used).
"""
import dataclasses
import os
from typing import Optional

from engine.core import run_files

# How the gradients can be sent (engine/compute/step.py's Horovod
# compressions), and --gradient_compression's values: `auto` resolves to
# one of them.
COMPRESSIONS = ("none", "fp16")
MODES = (*COMPRESSIONS, "auto")
# How much faster than float32 gradients float16 ones must measure to be
# chosen: above the spread of repeated measurements on a quiet machine.
MARGIN = 0.05
# Horovod 0.28.1's own defaults (horovod/common/operations.cc), in effect
# where neither the launcher nor the engine sets them.
HOROVOD_FUSION_THRESHOLD_BYTES = 128 * 1024 * 1024
HOROVOD_CYCLE_TIME_MS = 1.0
_NAMES = {"none": "float32", "fp16": "float16"}


@dataclasses.dataclass(frozen=True)
class Choice:
  """The gradient compression a run uses, decided at start-up
  (build.prepare) and kept apart from the TrainConfig, which holds
  --gradient_compression as asked: `compression` is none or fp16, never
  auto."""
  compression: str
  why: str = ""  # under auto, why; "" for a compression asked for
  # Under auto, what the first start measured, for COMMUNICATION_FILE;
  # {} when there is nothing to record (asked for, a resume).
  figures: dict = dataclasses.field(default_factory=dict)


def choose(images_per_sec: dict[str, float]) -> str:
  """fp16 if it beats float32 gradients ("none") by MARGIN, else none."""
  if images_per_sec.get("fp16", 0) > images_per_sec["none"] * (1 + MARGIN):
    return "fp16"
  return "none"


def described(images_per_sec: dict[str, float], chosen: str) -> str:
  """The measurement in words: each compression's img/s, and the choice."""
  figures = ", ".join(f"{_NAMES[mode]} gradients {rate:.0f} img/s"
                      for mode, rate in images_per_sec.items())
  return f"measured {figures}: {chosen}"


def in_effect() -> dict:
  """The fusion threshold (bytes) and cycle (ms) Horovod was started with:
  the environment's, which horovodrun --fusion-threshold-mb and
  --cycle-time-ms set (and the engine, for the cycle on CPU), else
  Horovod's defaults. Read after hvd.init(), which read them."""
  threshold = os.environ.get("HOROVOD_FUSION_THRESHOLD")
  cycle = os.environ.get("HOROVOD_CYCLE_TIME")
  return dict(
      fusion_threshold_bytes=(int(threshold) if threshold
                              else HOROVOD_FUSION_THRESHOLD_BYTES),
      cycle_time_ms=float(cycle) if cycle else HOROVOD_CYCLE_TIME_MS)


def record(model_dir: str, choice: Choice) -> None:
  """COMMUNICATION_FILE: `auto`'s choice, its figures and the fusion
  threshold and cycle in effect, which a resume uses rather than choosing
  again: a run never changes how its gradients are rounded midway."""
  run_files.write_record(model_dir, run_files.COMMUNICATION_FILE, dict(
      compression=choice.compression, **choice.figures))


def recorded(model_dir: str) -> Optional[dict]:
  """The choice recorded in model_dir by the run's first start, if any,
  or a UserError naming the file if it cannot be read."""
  return run_files.read_choice(
      model_dir, run_files.COMMUNICATION_FILE, "compression", _NAMES,
      "the gradient compression --gradient_compression=auto chose for this "
      "run: restore it, or delete it to measure again")


def of_first_start(model_dir: str) -> Optional[tuple[str, str]]:
  """Under `auto`, the compression a resumed run keeps, and why: the one
  its first start chose (COMMUNICATION_FILE), or, for a run first started
  with a compression of its own, the one its flags.txt names. None for a
  new run, which chooses."""
  if not model_dir:
    return None
  choice = recorded(model_dir)
  if choice:
    compression, figures = choice["compression"], choice.get(
        "images_per_sec")
    why = (described(figures, compression) if figures else
           f"{compression}, unmeasured: {choice.get('unmeasured', '')}")
    return compression, f"{why} ({run_files.COMMUNICATION_FILE})"
  first = run_files.read_flags(
      os.path.join(model_dir, run_files.FLAGS_FILE)).get(
          "gradient_compression")
  if first in _NAMES:
    return first, (f"{first}, the compression of the run's first start "
                   f"({run_files.FLAGS_FILE})")
  return None
