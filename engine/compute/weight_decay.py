"""--weight_decay on any model: an L2 term on every kernel, or AdamW's
decoupled decay.

The recipes were tuned with weight decay as an L2 term in the loss,
weight_decay * sum(w ** 2) over every kernel, its gradient joining every
gradient before the optimizer sees it (optimizers.py says what that does
under each). A kernel is a trainable variable Keras names `kernel` or
`*_kernel`: the weights of Dense, EinsumDense, every convolution and
transposed convolution (a separable one's depthwise_kernel and
pointwise_kernel) and a recurrent layer's recurrent_kernel; not biases,
nor BatchNorm's or LayerNorm's scales and offsets, nor an Embedding's
table.

The built-in models add the term themselves, as kernel regularizers: their
builders declare weight_decay. Any other model (a user's builder that does
not declare it, a task's own model) gets the same term from the engine: the
L2 regularizer the built-ins use, set on each kernel's Keras variable, which
the model's `losses` then collect as they collect the built-ins', so the
compiled train step adds it to the loss (step.py) and a task's own step
adds its gradient to the gradients it averages (task_step.py).

Regularizers a model already has are never doubled nor replaced. Under a
builder that declares weight_decay they are its way of applying it, and
are left alone (the engine gives the term to a kernel it left without one:
a head a task adds, or all of them if it ignores its weight_decay). Under
one that does not, nothing says whether --weight_decay should join them or
replace them: with it set, such a model is refused in one line. Under AdamW
the decay is the optimizer's own, and no L2 term is added anywhere: the
builders are given 0 (`model_params`) and the kernels nothing.
"""
from typing import Optional

import keras
import tensorflow as tf

from engine.compute import optimizers
from engine.core.config import TrainConfig
from engine.core.errors import UserError
import models


class EngineL2(keras.regularizers.L2):
  """--weight_decay's term as the engine gives a kernel: Keras' L2, as the
  built-ins' regularizers are, of a class of its own so that what a model
  built with it says of itself (`described`) tells the engine's term from
  the model's own."""


def model_params(config: TrainConfig) -> dict:
  """--model's parameters, --weight_decay among them as the builders that
  declare it take it: 0 under an optimizer that decays the weights itself
  (AdamW), where the decay is the optimizer's alone."""
  params = dict(config.model.params)
  if _decoupled(config):
    params["weight_decay"] = 0.0
  return params


def apply(model: keras.Model, config: TrainConfig) -> None:
  """Gives every kernel of `model` without a regularizer --weight_decay's
  L2 term, unless the optimizer decays the weights itself; a UserError for
  a model with regularizers of its own whose builder declares no
  weight_decay."""
  decay, name = config.model.params["weight_decay"], config.model.name
  if not decay or _decoupled(config):
    return
  own = _own_regularized(model)
  if own and not models.takes(name, "weight_decay"):
    paths = ", ".join(v.path for v in own[:3])
    more = f" and {len(own) - 3} more" if len(own) > 3 else ""
    raise UserError(
        f"--weight_decay={decay:g}: the model's layers carry regularizers "
        f"of their own ({paths}{more}), and --model={name} declares no "
        "weight_decay; declare it to apply --weight_decay yourself, or "
        "leave --weight_decay at 0")
  term = EngineL2(decay)
  for kernel in kernels(model):
    if kernel.regularizer is None:
      kernel.regularizer = term


def described(model: keras.Model, config: TrainConfig) -> Optional[str]:
  """How `model`'s weights are decayed (after `apply`), for the start-up
  log; None without weight decay."""
  decay = config.model.params["weight_decay"]
  if not decay:
    return None
  if _decoupled(config):
    return (f"weight decay {decay:g}: {config.optimization.optimizer}'s "
            "decoupled decay, no L2 term")
  own = len(_own_regularized(model))
  given = sum(isinstance(v.regularizer, EngineL2) for v in kernels(model))
  if not given:
    whose = f"the model's own regularizers: {config.model.name}'s"
  elif not own:
    whose = "given by the engine"
  else:
    whose = (f"{config.model.name}'s own regularizers on {own}, the "
             f"engine's on {given}")
  return (f"weight decay {decay:g}: an L2 term on {own + given} kernels "
          f"({whose})")


def kernels(model: keras.Model) -> list:
  """The model's kernels (above)."""
  return [v for v in model.trainable_variables
          if v.name == "kernel" or v.name.endswith("_kernel")]


def with_regularization(gradients: list, variables: list) -> list:
  """`gradients` (of `variables`, one each, None for one the loss does not
  use) plus the gradients of the variables' regularizers: for a step that
  computes its loss itself, what adding the model's `losses` to it adds."""
  regularized = [v for v in variables
                 if getattr(v, "regularizer", None) is not None]
  if not regularized:
    return gradients
  with tf.GradientTape() as tape:
    penalty = tf.add_n([v.regularizer(v) for v in regularized])
  return [gradient if extra is None else
          extra if gradient is None else gradient + extra
          for gradient, extra in zip(gradients,
                                     tape.gradient(penalty, variables))]


def _own_regularized(model: keras.Model) -> list:
  """The model's trainable variables carrying regularizers of its own."""
  return [v for v in model.trainable_variables
          if v.regularizer is not None
          and not isinstance(v.regularizer, EngineL2)]


def _decoupled(config: TrainConfig) -> bool:
  return config.optimization.optimizer in optimizers.DECOUPLED_DECAY
