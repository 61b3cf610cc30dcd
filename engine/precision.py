"""Mixed precision: the Keras policy, and loss scaling for float16.

Under a mixed policy layers compute in 16 bits and keep float32 weights;
the models' logits layer is float32 (models/), so softmax and the loss are
computed in float32. float16's narrow exponent underflows small gradients,
so the loss is multiplied by a dynamic scale before the backward pass and the
gradients divided by it after the allreduce (step.py); bfloat16 has float32's
exponent and needs no scaling.
"""
import tensorflow as tf

MODES = ("none", "float16", "bfloat16")
_POLICIES = {"none": "float32", "float16": "mixed_float16",
             "bfloat16": "mixed_bfloat16"}


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
