"""Keras 3's batch normalization trained through TensorFlow's fused kernel,
in any model: the built-in ones and a user's, without editing it.

Keras 3 normalizes a batch with separate operations (the moments, then the
affine arithmetic) on every backend; Keras 2 (tf_keras) called
TensorFlow's FusedBatchNormV3, one kernel (oneDNN's on CPU, cuDNN's on
GPU) for the moments, the normalization and their gradients. On the fast
recipe's ResNet-9 that made Keras 3's float32 step 1.6x slower on CPU, all
of it in batch normalization (bench/RESULTS.md, "Keras 3 against
tf_keras"), and a user's model written as Keras' guides write it pays the
same. `fuse` gives each `keras.layers.BatchNormalization` of a model a
training computation through the fused kernel, and leaves the layer Keras'
own everywhere else: its class and config (so a `.keras` export is the
user's classes, loading without the engine), its variables and checkpoint
keys, its moving averages (of the biased variance, as Keras 3 keeps them),
inference, and what the kernel does not compute as Keras does (a mask,
another axis or rank, renormalization, synchronized statistics, a frozen
layer), which falls back to Keras' own call.
"""
import types

import keras
import tensorflow as tf

from engine.core import compat

_DATA_FORMATS = {4: "NHWC", 5: "NDHWC"}
_KERAS_CALL = keras.layers.BatchNormalization.call


def fuse(model: keras.Model) -> int:
  """Trains every Keras BatchNormalization in `model` (nested models,
  layers inside a user's layers, `keras.applications`) through the fused
  kernel; returns how many. A subclass with a `call` of its own, or one
  renormalizing or synchronizing its statistics, keeps Keras' computation.
  Only the instance changes, never the class: every other model keeps
  Keras' layer as it is."""
  served = [layer for layer in compat.layers_within(model)
            if isinstance(layer, keras.layers.BatchNormalization)
            and type(layer).call is _KERAS_CALL
            and not (layer.renorm or layer.synchronized)]
  for layer in served:
    # Around Keras' attribute tracking: a method is no state to track.
    object.__setattr__(layer, "call", types.MethodType(_call, layer))
  return len(served)


def fused(model: keras.Model) -> int:
  """How many of `model`'s batch normalizations `fuse` serves."""
  return sum(isinstance(vars(layer).get("call"), types.MethodType)
             for layer in compat.layers_within(model))


def _call(layer, inputs, training=None, mask=None):
  """The layer's call: in training, over the last axis of images or
  volumes, FusedBatchNormV3; otherwise Keras' own."""
  rank = len(inputs.shape)
  if (not (training and layer.trainable) or mask is not None
      or rank not in _DATA_FORMATS or layer.axis not in (-1, rank - 1)):
    return _KERAS_CALL(layer, inputs, training=training, mask=mask)
  channels = inputs.shape[-1]
  scale = (tf.cast(layer.gamma, tf.float32) if layer.scale
           else tf.ones([channels]))
  offset = (tf.cast(layer.beta, tf.float32) if layer.center
            else tf.zeros([channels]))
  outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
      inputs, scale, offset, epsilon=layer.epsilon, is_training=True,
      data_format=_DATA_FORMATS[rank])
  # The kernel's variance is unbiased (over n - 1); Keras 3 averages the
  # biased one (over n).
  count = tf.cast(tf.size(inputs, out_type=tf.int64) // channels,
                  tf.float32)
  variance *= (count - 1.0) / count
  momentum = layer.momentum
  layer.moving_mean.assign(layer.moving_mean * momentum
                           + mean * (1.0 - momentum))
  layer.moving_variance.assign(layer.moving_variance * momentum
                               + variance * (1.0 - momentum))
  return tf.cast(outputs, layer.compute_dtype)
