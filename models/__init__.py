"""Models by name: `build(name, **params) -> keras.Model`.

Every builder takes `input_shape` and `num_classes` and returns a Keras
model whose output is float32 logits of shape [batch, num_classes]. For a
task other than classification (engine/tasks) `num_classes` is the width
of the model's output: the number of targets of a regression, say.
Builders declare the parameters they use in their signatures and receive
only those (engine/core/registry.py), so the flags shared by several models
(dropout, weight decay) reach the models that have them; one the user set
that the run's model does not take is refused (flags/reached.py). A user's
own builder, `--model=package.module:function` or
`--model=path/to/file.py:function`, is called the same way, and what it
returns is checked here, at start-up, rather than ten calls into training.
"""
import inspect

import keras
import tensorflow as tf

from engine.core import compat
from engine.core.errors import first_line
from engine.core.errors import UserError
from engine.core.registry import Registry
from models import cnn, cosmoflow, resnet, resnet9, unet, wrn

_MODELS = Registry("model", {
    "cnn": cnn.build,
    "cosmoflow": cosmoflow.build,
    "resnet50": resnet.resnet50,
    "resnet9": resnet9.build,
    "resnet_small": resnet.resnet_small,
    "unet": unet.build,
    "wrn": wrn.build,
})
names = _MODELS.names
is_known = _MODELS.is_known
takes = _MODELS.takes
not_taken = _MODELS.not_taken


def build(name: str, *, input_shape, num_classes: int, output_shape=None,
          **params) -> keras.Model:
  """`output_shape`: of one example's output, if not [num_classes] (a
  task's: engine/tasks)."""
  model = _MODELS.build(name, input_shape=tuple(input_shape),
                        num_classes=num_classes, **params)
  _float32_outputs(model)
  _check(model, name, tuple(input_shape), num_classes,
         tuple(output_shape or (num_classes,)))
  return model


def build_as_written(name: str, *, input_shape, **params) -> keras.Model:
  """A user's compiled model (or one with its own train_step), for data
  given as tf.data datasets: built as its function writes it, precision
  and outputs included; its compile() checks the outputs against the
  labels (engine/tasks/compiled.py)."""
  wanted = inspect.signature(_MODELS.builder(name)).parameters.get(
      "num_classes")
  if wanted is not None and wanted.default is wanted.empty:
    raise UserError(f"--model={name} takes num_classes, which tf.data "
                    "datasets do not tell: give it a default in the "
                    "function's signature")
  model = _MODELS.build(name, input_shape=tuple(input_shape), **params)
  _check_keras3(model, name)
  return model


def _float32_outputs(model) -> None:
  """The layers that compute a functional model's outputs compute in
  float32, where --mixed_precision's policy would have made them 16-bit.

  Keras' mixed precision guide asks for a last layer with
  `dtype="float32"`, so that softmax and the loss see float32 logits; a
  model written without it trains under Keras `fit` (its losses cast the
  outputs) and would be refused by the check below. Set here instead, on
  those layers alone, so that a user's model trains under
  --mixed_precision=auto as written. Their variables are float32 under
  every policy, so checkpoints and the `.keras` export load in any mode. A
  subclassed model's outputs come from no layer one can name: it is
  checked as it is.
  """
  if not isinstance(model, keras.Model):
    return
  for output in getattr(model, "outputs", None) or ():
    layer = compat.layer_computing(output)
    if layer.compute_dtype in ("bfloat16", "float16"):
      layer.dtype_policy = "float32"


def refuse_keras2(model, where: str) -> None:
  """A UserError for a Keras 2 model (tf_keras, or `tf.keras` under
  TF_USE_LEGACY_KERAS=1).

  The engine's Keras is Keras 3 (engine/__init__.py): Keras 2's layers and
  variables do not mix with Keras 3's models, optimizers and losses. Told
  here, before anything fails ten calls later.
  """
  if any(cls.__module__.partition(".")[0] == "tf_keras"
         for cls in type(model).__mro__):
    raise UserError(
        f"{where} built a Keras 2 model ({type(model).__name__}, from "
        "tf_keras); the engine trains Keras 3 models: build it with "
        "`import keras` (TensorFlow's own Keras), without "
        "TF_USE_LEGACY_KERAS")


def _check_keras3(model, name: str) -> None:
  """A UserError unless --model=`name` returned a Keras 3 model."""
  refuse_keras2(model, f"--model={name}")
  if not isinstance(model, keras.Model):
    raise UserError(f"--model={name} returned a {type(model).__name__}, not "
                    "a keras.Model (import keras)")


def _check(model, name: str, input_shape: tuple, num_classes: int,
           output_shape: tuple) -> None:
  """A Keras model giving float32 outputs of `output_shape` (logits per
  class), or a UserError.

  Checked by calling it on two blank images, which also creates the
  variables of a subclassed model before anything saves or broadcasts them.
  """
  _check_keras3(model, name)
  try:
    logits = model(tf.zeros((2, *input_shape)), training=False)
  except Exception as e:  # the user's code: one line
    raise UserError(f"--model={name} fails on a batch of "
                    f"{'x'.join(map(str, input_shape))} images: "
                    f"{type(e).__name__}: {first_line(e)}"
                    ) from None
  shape = tuple(getattr(logits, "shape", ()))
  if shape != (2, *output_shape):
    wanted = ", ".join(map(str, output_shape))
    what = (" logits, one per class" if output_shape == (num_classes,)
            else " outputs per image (the task's)")
    raise UserError(f"--model={name} outputs shape {list(shape)} for 2 "
                    f"images; it must output [batch, {wanted}]{what}")
  if logits.dtype != tf.float32:
    raise UserError(f"--model={name} outputs {logits.dtype.name} logits; "
                    "end the model with a float32 layer, e.g. "
                    "keras.layers.Activation('linear', dtype='float32'), "
                    "so that softmax and the loss are computed in float32")
