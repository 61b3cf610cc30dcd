"""Models by name: `build(name, **params) -> tf.keras.Model`.

Every builder takes `input_shape` and `num_classes` and returns a functional
Keras model whose output is float32 logits. Builders declare the parameters
they use in their signatures; `build` passes each builder only those, so the
flags shared by several models (dropout, weight decay) reach the models that
have them and are ignored by the others.
"""
import inspect
from typing import Callable

import tensorflow as tf

from engine.errors import UserError
from models import cnn, wrn

_BUILDERS: dict[str, Callable[..., tf.keras.Model]] = {
    "cnn": cnn.build,
    "wrn": wrn.build,
}


def names() -> list[str]:
  return sorted(_BUILDERS)


def build(name: str, **params) -> tf.keras.Model:
  if name not in _BUILDERS:
    raise UserError(f"--model={name} is unknown; choose one of "
                    f"{', '.join(names())}")
  builder = _BUILDERS[name]
  accepted = inspect.signature(builder).parameters
  return builder(**{k: v for k, v in params.items() if k in accepted})
