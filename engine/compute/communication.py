"""How the gradients travel between processes: --gradient_compression, and
the Horovod fusion threshold and cycle in effect.

`auto` measures, as --mixed_precision=auto does: whether half the bytes
pay depends on the link as much as on the model. Over loopback on two
cores the cast to float16 and back costs more than the bytes it saves; on
a slow link between hosts the allreduce bounds the step and half the bytes
halve it. Before training (engine/compute/auto.py) every rank times the
run's real train step with the gradients sent as float32 (`none`) and as
float16 (`fp16`), alternating over rounds, on its first training batches;
rank 0's figures decide for every rank. float16 is chosen only when it is
clearly faster: it rounds the gradients, so it must pay; the decision is
kept for runs of the same kind. A process alone
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

# How the gradients can be sent (engine/compute/step.py's Horovod
# compressions), and --gradient_compression's values: `auto` resolves to
# one of them.
COMPRESSIONS = ("none", "fp16")
MODES = (*COMPRESSIONS, "auto")
# Horovod 0.28.1's own defaults (horovod/common/operations.cc), in effect
# where neither the launcher nor the engine sets them.
HOROVOD_FUSION_THRESHOLD_BYTES = 128 * 1024 * 1024
HOROVOD_CYCLE_TIME_MS = 1.0
NAMES = {"none": "float32", "fp16": "float16"}


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
