"""Optimizers by name, and their state, whichever Keras API they come from.

sgd and adam are Keras' own optimizers; novograd and lamb, the large-batch
optimizers of the Horovod lab, come from tensorflow-addons, which builds them
on Keras' legacy optimizer API. The two APIs create and list their state
differently; `build_state` and `state` hide that from the rest of the engine.

Weight decay is not an optimizer option here: it is the L2 term the models'
kernel regularizers add to the loss (--weight_decay), so its gradient
2 * weight_decay * w joins every gradient before the optimizer sees it:
- sgd: classic weight decay, scaled by the learning rate (and momentum);
- adam: L2 regularization, divided by Adam's second-moment estimate like the
  rest of the gradient (not AdamW's decoupled decay);
- novograd: normalized per layer together with the gradient;
- lamb: part of the update whose per-layer trust ratio LAMB computes.
The addons optimizers' own `weight_decay` arguments are left at 0, so decay
is never applied twice.
"""
import warnings

import tensorflow as tf

from engine.errors import UserError


def names() -> list[str]:
  return ["adam", "lamb", "novograd", "sgd"]


def build(name: str, *, learning_rate, momentum: float, nesterov: bool,
          xla: bool = False) -> tf.keras.optimizers.Optimizer:
  """`learning_rate` is a float or a LearningRateSchedule of the step.

  `xla` compiles the update of Keras' own optimizers (which do so on GPUs
  only); XLA is the run's choice (--xla), not Keras' default.
  """
  if name == "sgd":
    return tf.keras.optimizers.SGD(learning_rate, momentum=momentum,
                                   nesterov=nesterov, jit_compile=xla)
  if name == "adam":
    return tf.keras.optimizers.Adam(learning_rate, jit_compile=xla)
  if name in ("novograd", "lamb"):
    addons = _tensorflow_addons()
    if name == "novograd":
      return addons.optimizers.NovoGrad(learning_rate)
    return addons.optimizers.LAMB(learning_rate)
  raise UserError(f"--optimizer={name} is unknown; choose one of "
                  f"{', '.join(names())}")


def build_state(optimizer, variables) -> None:
  """Creates the optimizer's slots for `variables` now, not at its first step.

  A tf.function whose first call creates variables is traced twice; with the
  slots made beforehand the train step is traced once.
  """
  if hasattr(optimizer, "build"):
    optimizer.build(variables)
  else:  # Keras' legacy API, used by tensorflow-addons
    optimizer._create_all_weights(variables)  # pylint: disable=protected-access


def state(optimizer) -> list[tf.Variable]:
  """The optimizer's variables (step counter and slots), in either API."""
  variables = optimizer.variables
  return list(variables() if callable(variables) else variables)


class Several(tf.Module):
  """Named optimizers for a task's own train step (a GAN's generator and
  discriminator), each built from the optimizer flags: checkpointed,
  restored and broadcast as one optimizer is. Each applies its update once
  a step, so their step counters (and learning rates) go alike."""

  def __init__(self, by_name: dict):
    super().__init__(name="optimizers")
    self.by_name = dict(by_name)

  def build(self, variables: dict) -> None:
    """`variables`: each optimizer's name -> the variables it updates."""
    for name, optimizer in self.by_name.items():
      build_state(optimizer, variables[name])

  @property
  def variables(self) -> list[tf.Variable]:
    return [v for optimizer in self.by_name.values() for v in state(optimizer)]

  @property
  def iterations(self) -> tf.Variable:
    """The step counter (the first optimizer's; the others' go alike)."""
    return next(iter(self.by_name.values())).iterations


def set_step(optimizer, step: int) -> None:
  """Sets the step counter (of each of Several optimizers), which the
  learning-rate schedule reads."""
  for each in (optimizer.by_name.values() if isinstance(optimizer, Several)
               else [optimizer]):
    each.iterations.assign(step)


def _tensorflow_addons():
  """Imported only for the optimizers that need it: it is slow to import and
  warns at import time that it is in maintenance mode, which we know."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tensorflow_addons  # pylint: disable=import-outside-toplevel
  return tensorflow_addons
