"""Keras' pointwise convolutions (a kernel of 1, stride 1) computed as
matrix products, in any model: the built-in ones and a user's, without
editing it.

A convolution whose kernel is 1 along every axis mixes the channels at
each position and nothing else: at stride 1, it is the product of the
positions' channel vectors with a matrix. On a CPU, oneDNN's convolution
computes such a layer and its two gradients slower than oneDNN's matrix
product computes the same, the more so the fewer positions a map has:
ResNet50V2's step at 32x32 images (maps of 8x8 to 1x1) took 0.70-0.79x
its time with them as products, MobileNetV2's 0.79-0.98x; ResNet-50's at
224 (56x56 to 7x7) about the same time (bench/RESULTS.md, "Pointwise
convolutions as matrix products"). Strided ones keep Keras' convolution:
the subsampling before the product and its gradient's scatter cost more
than the product saved (the guide ResNet's strided shortcuts).

`use` gives each qualifying `keras.layers.Conv2D` and `Conv3D` of a model
a convolution through `tf.matmul`, and leaves the layer Keras' own in
every other way: its class and config (a `.keras` export loads without
the engine), its variables and checkpoint keys, its bias and activation.
What the product does not compute as Keras does falls back to Keras'
own: groups, channels first, a subclass with a convolution of its own.
Only float32 layers are served: the 16-bit products were not measured.
"""
import types

import keras
import tensorflow as tf

from engine.core import compat

# Conv2D's and Conv3D's own (Keras' base convolution's); Conv1D calls the
# convolution itself, past `convolution_op`, so it keeps Keras' own.
_KERAS_CALL = keras.layers.Conv2D.call
_KERAS_CONVOLUTION = keras.layers.Conv2D.convolution_op


def use(model: keras.Model) -> int:
  """Computes every qualifying pointwise convolution in `model` (nested
  models, layers inside a user's layers, `keras.applications`) as a
  matrix product; returns how many. Only the instance changes, never the
  class: every other model keeps Keras' layer as it is."""
  served = [layer for layer in compat.layers_within(model) if _qualifies(layer)]
  for layer in served:
    # Around Keras' attribute tracking: a method is no state to track.
    object.__setattr__(layer, "convolution_op",
                       types.MethodType(_matrix_product, layer))
  return len(served)


def served(model: keras.Model) -> int:
  """How many of `model`'s convolutions `use` computes as products."""
  return sum(isinstance(vars(layer).get("convolution_op"), types.MethodType)
             for layer in compat.layers_within(model))


def _qualifies(layer) -> bool:
  return (isinstance(layer, (keras.layers.Conv2D, keras.layers.Conv3D))
          and type(layer).call is _KERAS_CALL
          and type(layer).convolution_op is _KERAS_CONVOLUTION
          and all(size == 1 for size in layer.kernel_size)
          and all(stride == 1 for stride in layer.strides)
          and layer.groups == 1 and layer.data_format == "channels_last"
          and layer.compute_dtype == "float32")


def _matrix_product(layer, inputs, kernel):
  """The layer's convolution: each position's channels times the kernel
  as a (channels in, channels out) matrix ("same" and "valid" padding
  alike: neither pads a kernel of 1)."""
  del layer  # (the method's own; the product needs nothing of it)
  return tf.tensordot(inputs, tf.reshape(kernel, kernel.shape[-2:]), 1)
