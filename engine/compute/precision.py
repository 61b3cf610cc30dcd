"""Mixed precision: the Keras policy, and loss scaling for float16.

Under a mixed policy layers compute in 16 bits and keep float32 weights;
the models' logits layer is float32 (models/), so softmax and the loss are
computed in float32. float16's narrow exponent underflows small gradients,
so the loss is multiplied by a dynamic scale before the backward pass and the
gradients divided by it after the allreduce (step.py); bfloat16 has float32's
exponent and needs no scaling.

`auto` measures: whether 16 bits pay depends on the model's shapes as much
as on the hardware (on an AVX512_BF16 CPU, ResNet-9 of width 8 ran 20%
slower in bfloat16, WRN-16-2 1.59x faster). Before training, every rank
times a few steps of each mode the hardware computes natively (`native`:
bfloat16 on GPUs of compute capability 8 and later and on CPUs with
AVX512_BF16 or AMX, float16 on GPUs with Tensor Cores; never an emulated
one: float16 on CPU was 66-74x slower, bench/cpu_defaults.py) on the real
model, batch and data, and rank 0's fastest wins if it clearly beats
float32; the decision is kept for runs of the same kind
(engine/compute/auto.py).
Hardware with float32 alone runs float32 unmeasured.
"""
import contextlib
import dataclasses
from typing import Optional

import keras
import tensorflow as tf

from engine.core import cpu

MODES = ("none", "float16", "bfloat16", "auto")
NAMES = {"none": "float32", "bfloat16": "bfloat16", "float16": "float16"}
CPU_BFLOAT16_FEATURES = ("avx512_bf16", "amx_bf16")
_POLICIES = {"none": "float32", "float16": "mixed_float16",
             "bfloat16": "mixed_bfloat16"}


@dataclasses.dataclass(frozen=True)
class Choice:
  """The precision a run computes in, decided at start-up (build.prepare)
  and kept apart from the TrainConfig, which holds --mixed_precision as
  asked: `mode` is none, float16 or bfloat16, never auto."""
  mode: str
  why: str = ""  # under auto, why this mode; "" for a mode asked for
  # Under auto, what the first start measured (or, on hardware of float32
  # alone, the hardware), for run_files.PRECISION_FILE: {} when there is
  # nothing to record (a mode asked for, a resume, engine.evaluate).
  figures: dict = dataclasses.field(default_factory=dict)


def resolve(mode: str, cpu_flags: Optional[set] = None) -> tuple[str, str]:
  """The mode to run: `mode` itself, or for `auto` the hardware's
  preferred native one, with why it was chosen ("" when `mode` was
  explicit). `cpu_flags`: the CPU's feature flags, read from /proc/cpuinfo
  by default."""
  if mode != "auto":
    return mode, ""
  modes, hardware = native(cpu_flags)
  return modes[1] if len(modes) > 1 else "none", hardware


def native(cpu_flags: Optional[set] = None) -> tuple[tuple[str, ...], str]:
  """The modes this hardware computes natively, float32 ("none") first and
  its preferred 16-bit mode next, and the hardware in words: the modes
  `auto` measures. Emulated ones are never tried."""
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    major, minor = tf.config.experimental.get_device_details(gpus[0]).get(
        "compute_capability", (0, 0))
    gpu = f"GPU of compute capability {major}.{minor}"
    if major >= 8:
      return ("none", "bfloat16", "float16"), f"{gpu} (Ampere or later)"
    if major >= 7:
      return ("none", "float16"), f"{gpu} (Tensor Cores, before Ampere)"
    return ("none",), f"{gpu} (no Tensor Cores)"
  features = cpu.features() if cpu_flags is None else cpu_flags
  bfloat16 = [f.upper() for f in CPU_BFLOAT16_FEATURES if f in features]
  if bfloat16:
    return ("none", "bfloat16"), f"CPU with {' and '.join(bfloat16)}"
  return ("none",), "CPU without AVX512_BF16 or AMX: 16 bits would be emulated"


@contextlib.contextmanager
def policy(mode: str):
  """The policy of every layer built inside (Keras' is global), and the
  one before it again after: a layer keeps the policy it was built with,
  and neither a fit script's next model nor the next test in the process
  should be built in the run's 16 bits."""
  before = keras.config.dtype_policy()
  keras.config.set_dtype_policy(_POLICIES[mode])
  try:
    yield
  finally:
    keras.config.set_dtype_policy(before)


def with_loss_scaling(optimizer, mode: str):
  """float16: the optimizer wrapped in Keras' dynamic LossScaleOptimizer.
  It starts at a scale of 2^15, halves it when a step's gradients overflow
  (and skips that step: the same on every rank, since all see the same
  averaged gradients), and doubles it after 2000 finite steps. Its scale is
  checkpointed with the optimizer, so a resumed run continues with it.
  """
  if mode != "float16":
    return optimizer
  return keras.optimizers.LossScaleOptimizer(optimizer)


def scales_loss(optimizer) -> bool:
  return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def loss_scale(optimizer) -> tf.Variable:
  """The loss scale of a LossScaleOptimizer (its `dynamic_scale`)."""
  return optimizer.dynamic_scale


def checkpointed(optimizer) -> dict:
  """What a checkpoint keeps of `optimizer`, by name: the optimizer, and
  under float16 the loss scale and its count of finite steps beside it
  rather than inside it. Keras 3's LossScaleOptimizer lists its own
  variables and its inner optimizer's in one list, so a checkpoint of it
  would not restore into the same optimizer unwrapped: a float16 run
  resumed in float32 or bfloat16 (which works; the other way round is
  refused, engine/records/checkpoint.py). Call it once the optimizer is
  built (the train step builds it)."""
  if not scales_loss(optimizer):
    return {"optimizer": optimizer}
  return {"optimizer": optimizer.inner_optimizer,
          "loss_scale": optimizer.dynamic_scale,
          "loss_scale_steps": optimizer.step_counter}
