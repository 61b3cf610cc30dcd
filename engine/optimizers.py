"""Optimizers by name.

Weight decay is not an optimizer option here: it is the L2 term the models'
kernel regularizers add to the loss (`--weight_decay`), so it reaches every
optimizer the same way, as the Horovod lab's recipe does.
"""
import tensorflow as tf

from engine.errors import UserError


def names() -> list[str]:
  return ["adam", "sgd"]


def build(name: str, *, learning_rate: float, momentum: float,
          nesterov: bool) -> tf.keras.optimizers.Optimizer:
  # jit_compile=False: XLA is a per-run choice of the step, not of the
  # optimizer's update alone.
  if name == "sgd":
    return tf.keras.optimizers.SGD(learning_rate, momentum=momentum,
                                   nesterov=nesterov, jit_compile=False)
  if name == "adam":
    return tf.keras.optimizers.Adam(learning_rate, jit_compile=False)
  raise UserError(f"--optimizer={name} is unknown; choose one of "
                  f"{', '.join(names())}")

