"""CosmoFlow's network (MLPerf HPC): 3D convolutions for volumes.

As the reference (mlcommons/hpc, cosmoflow/models/cosmoflow.py) builds
it: `conv_layers` blocks of a Conv3D (`kernel_size`, `filters` x 2^i
filters, bias, "same" padding), LeakyReLU and MaxPool3D (halving each
axis); flattened; dense 128 and 64, each LeakyReLU then dropout; and
`num_classes` outputs through tanh scaled by 1.2, so that targets
normalized to [-1, 1] (as CosmoFlow's parameters are) lie inside the
output's range with room at its ends. The reference's 5 blocks of 32
filters on 128^3 x 4 inputs; `conv_layers=0` takes as many as halve the
smallest axis down to 2 voxels or more, at most 5 (3 for 16^3, 5 from
64^3), so one builder serves 16^3 to 128^3.

The kernel is 3, as the reference builds it today: its build_model
defaults to kernel_size=3 and its configs/cosmo.yaml sets `kernel_size: 3`
(mlcommons/hpc at 9d014c8 and e281eb1). In MLPerf HPC v0.7's time
(7783a76) build_model defaulted to 2 and the config set no kernel: 2, the
size flags/cosmoflow_mini.cfg keeps (--kernel_size=2) so that its measured
figures stay its network's.

Each block computes the reference's function in a cheaper order: the
convolution, then the max-pooling, then the bias and LeakyReLU on the
eighth of the voxels the pooling keeps (`PooledConv3D`). Adding a bias per
channel and LeakyReLU are both non-decreasing, so they commute with a
maximum, bit for bit (rounding is non-decreasing too), and the gradient
reaches the same voxel; the bias' gradient sums the same terms, fewer
zeros. Each LeakyReLU's gradient is taken from its output
(`leaky_relu`), whose sign is its input's, which leaves TensorFlow's
graph rewriter free to fuse a Dense layer's bias and activation into its
matrix product (with the input's, the rewrite fails and is skipped).
bench/RESULTS.md, "CosmoFlow's step", measures both.
"""
import math

import keras
import tensorflow as tf

from engine.core.errors import UserError

layers = keras.layers
MAX_CONV_LAYERS = 5
KERNEL_SIZE = 3  # the reference's today (above)
DENSE_SIZES = (128, 64)
# The reference's LeakyReLU: Keras' default slope.
LEAKY_SLOPE = 0.3
OUTPUT_SCALE = 1.2


def leaky_relu(x: tf.Tensor) -> tf.Tensor:
  """LeakyReLU whose gradient is computed from its output: the same
  gradient, since the output's sign is the input's (LEAKY_SLOPE > 0), and
  the input is then used by this op alone, as a fused kernel needs."""

  @tf.custom_gradient
  def activation(inputs):
    outputs = tf.nn.leaky_relu(inputs, LEAKY_SLOPE)

    def gradient(upstream):
      return tf.raw_ops.LeakyReluGrad(gradients=upstream, features=outputs,
                                      alpha=LEAKY_SLOPE)

    return outputs, gradient

  return activation(x)


class LeakyReLU(layers.LeakyReLU):
  """The reference's LeakyReLU (LEAKY_SLOPE), its gradient from its output
  (`leaky_relu`)."""

  def __init__(self, **kwargs):
    kwargs.setdefault("alpha", LEAKY_SLOPE)
    super().__init__(**kwargs)

  def call(self, inputs):
    return leaky_relu(inputs)


class PooledConv3D(layers.Conv3D):
  """One block: Conv3D ("same" padding, its bias), LeakyReLU, MaxPool3D(2)
  as the reference orders them, computed as convolution, pooling, bias,
  LeakyReLU (the module's docstring says why it is the same function). A
  Conv3D's variables, so checkpoints of either order read alike."""

  def __init__(self, filters, kernel_size, **kwargs):
    super().__init__(filters, kernel_size, padding="same", **kwargs)

  def call(self, inputs):
    outputs = self.convolution_op(inputs, self.kernel)
    outputs = tf.nn.max_pool3d(outputs, 2, 2, "VALID")
    return leaky_relu(tf.nn.bias_add(outputs, self.bias))

  def compute_output_shape(self, input_shape):
    shape = super().compute_output_shape(input_shape)
    return tf.TensorShape([shape[0]] + [d // 2 for d in shape[1:4]]
                          + [shape[4]])


def build(*, input_shape, num_classes, filters=32, conv_layers=0,
          kernel_size=KERNEL_SIZE, dropout=0.0,
          weight_decay=0.0) -> keras.Model:
  if kernel_size < 1:
    raise UserError(f"--kernel_size={kernel_size}: the Conv3D kernel's side "
                    "is at least 1 (the reference's is 3)")
  if len(input_shape) != 4:
    raise UserError(f"--model=cosmoflow takes volumes DxHxWxC; these inputs "
                    f"are {'x'.join(map(str, input_shape))}")
  regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
  inputs = keras.Input(input_shape)
  x = inputs
  for i in range(conv_layers or default_conv_layers(input_shape)):
    x = PooledConv3D(filters * 2 ** i, kernel_size,
                     kernel_regularizer=regularizer)(x)
  x = layers.Flatten()(x)
  for size in DENSE_SIZES:
    x = layers.Dense(size, kernel_regularizer=regularizer)(x)
    x = LeakyReLU()(x)
    if dropout:
      x = layers.Dropout(dropout)(x)
  x = layers.Dense(num_classes, activation="tanh",
                   kernel_regularizer=regularizer)(x)
  outputs = layers.Rescaling(OUTPUT_SCALE, dtype="float32")(x)
  return keras.Model(inputs, outputs, name="cosmoflow")


def default_conv_layers(input_shape) -> int:
  """Blocks that leave at least 2 voxels along the smallest axis."""
  return max(1, min(MAX_CONV_LAYERS, int(math.log2(min(input_shape[:3]))) - 1))
