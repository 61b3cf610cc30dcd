"""Mixed precision: the Keras policy, and loss scaling for float16.

Under a mixed policy layers compute in 16 bits and keep float32 weights;
the models' logits layer is float32 (models/), so softmax and the loss are
computed in float32. float16's narrow exponent underflows small gradients,
so the loss is multiplied by a dynamic scale before the backward pass and the
gradients divided by it after the allreduce (step.py); bfloat16 has float32's
exponent and needs no scaling.

`auto` picks what the hardware computes natively: bfloat16 on GPUs of
compute capability 8 and later (Ampere) and on CPUs with AVX512_BF16 or
AMX; float16 on GPUs with Tensor Cores before Ampere (Volta, Turing);
float32 elsewhere, where 16-bit types are emulated and slower
(bench/cpu_defaults.py: float16 on CPU was 66-74x slower).
"""
from typing import Optional

import tensorflow as tf

MODES = ("none", "float16", "bfloat16", "auto")
CPU_BFLOAT16_FEATURES = ("avx512_bf16", "amx_bf16")
_POLICIES = {"none": "float32", "float16": "mixed_float16",
             "bfloat16": "mixed_bfloat16"}


def resolve(mode: str, cpu_flags: Optional[set] = None) -> tuple[str, str]:
  """The mode to run: `mode` itself, or for `auto` the hardware's native
  one, with why it was chosen ("" when `mode` was explicit). `cpu_flags`:
  the CPU's feature flags, read from /proc/cpuinfo by default."""
  if mode != "auto":
    return mode, ""
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    major, minor = tf.config.experimental.get_device_details(gpus[0]).get(
        "compute_capability", (0, 0))
    gpu = f"GPU of compute capability {major}.{minor}"
    if major >= 8:
      return "bfloat16", f"{gpu} (Ampere or later)"
    if major >= 7:
      return "float16", f"{gpu} (Tensor Cores, before Ampere)"
    return "none", f"{gpu} (no Tensor Cores)"
  features = _cpu_flags() if cpu_flags is None else cpu_flags
  native = [f.upper() for f in CPU_BFLOAT16_FEATURES if f in features]
  if native:
    return "bfloat16", f"CPU with {' and '.join(native)}"
  return "none", "CPU without AVX512_BF16 or AMX: 16 bits would be emulated"


def _cpu_flags() -> set:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def set_policy(mode: str) -> None:
  """Sets the policy of every layer built from now on (global in Keras)."""
  tf.keras.mixed_precision.set_global_policy(_POLICIES[mode])


def with_loss_scaling(optimizer, mode: str):
  """float16: the optimizer wrapped in Keras' dynamic LossScaleOptimizer.

  It starts at a scale of 2^15, halves it when a step's gradients overflow
  (and skips that step: the same on every rank, since all see the same
  averaged gradients), and doubles it after 2000 finite steps. Its scale is
  checkpointed with the optimizer, so a resumed run continues with it.
  """
  if mode != "float16":
    return optimizer
  return tf.keras.mixed_precision.LossScaleOptimizer(optimizer)


def scales_loss(optimizer) -> bool:
  return isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
