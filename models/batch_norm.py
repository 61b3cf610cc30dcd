"""Batch normalization for the built-in models: Keras 3's layer, trained
through TensorFlow's fused kernel.

Keras 3 normalizes a batch with separate operations (the moments, then the
affine arithmetic) on every backend; Keras 2 (tf_keras) called
TensorFlow's FusedBatchNormV3, one kernel (oneDNN's on CPU) for the
moments, the normalization and their gradients. On the fast recipe's
ResNet-9 that made Keras 3's float32 step 1.6x slower on CPU, all of it in
batch normalization (bench/RESULTS.md, "Keras 3 against tf_keras"). This
layer trains through the fused kernel, and is Keras' own everywhere else:
its weights, its moving averages (biased variance, as Keras 3 keeps them),
inference, and its config, so a model built with it saves and loads as
one built with `keras.layers.BatchNormalization` would, with `models`
importable (registered below).
"""
import keras
import tensorflow as tf

_DATA_FORMATS = {4: "NHWC", 5: "NDHWC"}


@keras.saving.register_keras_serializable(package="engine")
class BatchNormalization(keras.layers.BatchNormalization):
  """`keras.layers.BatchNormalization`, fused in training over the last
  axis of images and volumes; Keras' own computation otherwise (a mask,
  another axis or rank, synchronized statistics)."""

  def call(self, inputs, training=None, mask=None):
    rank = len(inputs.shape)
    if (not training or mask is not None or self.synchronized
        or rank not in _DATA_FORMATS or self.axis not in (-1, rank - 1)):
      return super().call(inputs, training=training, mask=mask)
    channels = inputs.shape[-1]
    scale = (tf.cast(self.gamma, tf.float32) if self.scale
             else tf.ones([channels]))
    offset = (tf.cast(self.beta, tf.float32) if self.center
              else tf.zeros([channels]))
    outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
        inputs, scale, offset, epsilon=self.epsilon, is_training=True,
        data_format=_DATA_FORMATS[rank])
    # The kernel's variance is unbiased (over n - 1); Keras 3 averages the
    # biased one (over n).
    count = tf.cast(tf.size(inputs, out_type=tf.int64) // channels,
                    tf.float32)
    variance *= (count - 1.0) / count
    momentum = self.momentum
    self.moving_mean.assign(self.moving_mean * momentum
                            + mean * (1.0 - momentum))
    self.moving_variance.assign(self.moving_variance * momentum
                                + variance * (1.0 - momentum))
    return outputs
