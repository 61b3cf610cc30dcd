"""Every private TensorFlow and Keras API the engine touches, each where no
public one does the job, with what is missing: the next TensorFlow or
Keras that moves one breaks this file and tests/test_compat.py, nothing
else.
"""
import keras
import tensorflow as tf
# No public API says whether oneDNN's kernels are on: TensorFlow decides
# from TF_ENABLE_ONEDNN_OPTS and the CPU, once, and only this reports it.
from tensorflow.python.util import _pywrap_util_port
# No public API tells, while a function is traced, that XLA will compile
# it (tf.function(jit_compile=True) traces it in an XLA context).
from tensorflow.python.ops import control_flow_util


def onednn_enabled() -> bool:
  """Whether TensorFlow runs oneDNN's CPU kernels (decided the first time
  it is asked, for the process)."""
  return bool(_pywrap_util_port.IsMklEnabled())


def in_xla_context() -> bool:
  """Whether the function being traced is compiled by XLA."""
  return control_flow_util.GraphOrParentsInXlaContext(
      tf.compat.v1.get_default_graph())


def layers_within(model: keras.Model) -> list:
  """`model` and every layer inside it, at any depth: its layers, theirs,
  and layers held in a user's own layers. Keras' `layers` is the top level
  alone; its own walk is private."""
  return list(model._flatten_layers())  # pylint: disable=protected-access


def layer_computing(tensor) -> keras.layers.Layer:
  """The layer whose call computed a functional model's symbolic `tensor`
  (one of `model.outputs`): Keras' own way back from a tensor, which no
  public API gives."""
  return tensor._keras_history.operation  # pylint: disable=protected-access
