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

A block whose input is at most 2 voxels a side (the reference's fifth on
32^3 volumes) convolves by taps (`convolution_by_taps`): there most of a
kernel's taps fall on the padding, where oneDNN's direct convolution
runs at a fraction of its speed. On a CPU at float32, a block of kernel 3
on at least 8 voxels a side from at least 16 channels (the second and
third on 32^3 volumes) convolves by Winograd's F(2x2x2, 3x3x3) in our own
kernels (models/winograd3d.py): 3.4x fewer multiplications than oneDNN's
direct convolution, whose kernels there already run at the core's peak.
In training only: inference (validation, and the SavedModel a run exports,
which must load without our kernels) takes the direct convolution, the
same function to float rounding.
"""
import itertools
import math

import keras
import numpy as np
import tensorflow as tf

from engine.core import compat
from engine.core.errors import UserError
from models import winograd3d

layers = keras.layers
MAX_CONV_LAYERS = 5
KERNEL_SIZE = 3  # the reference's today (above)
DENSE_SIZES = (128, 64)
# The reference's LeakyReLU: Keras' default slope.
LEAKY_SLOPE = 0.3
OUTPUT_SCALE = 1.2
# Volumes at most this many voxels a side are convolved by taps
# (`convolution_by_taps`).
MAX_SIDE_BY_TAPS = 2
# Volumes at least this many voxels a side, from a multiple of
# winograd3d.CHANNEL_MULTIPLE channels, are convolved by Winograd's
# algorithm on a CPU at float32: on 4^3 voxels, half of them on the
# padding, it took 1.5x the direct convolution's time. (On the first
# block's 4 channels its transforms outweighed the products saved, and
# the kernels take none.)
MIN_SIDE_BY_WINOGRAD = 8


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
    kwargs.setdefault("negative_slope", LEAKY_SLOPE)
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

  def build(self, input_shape):
    super().build(input_shape)
    # From the model's input, since augmentation (a random order of the
    # axes) leaves the sides of the batches it gives unknown.
    side = tuple(input_shape[1:4])
    self._side_by_taps = side if max(side) <= MAX_SIDE_BY_TAPS else None
    self.fits_winograd = (
        min(side) >= MIN_SIDE_BY_WINOGRAD
        and all(n % 2 == 0 for n in side)
        and self.kernel_size == (3, 3, 3)
        and input_shape[4] % winograd3d.CHANNEL_MULTIPLE == 0
        and self.filters % winograd3d.CHANNEL_MULTIPLE == 0
        and self.compute_dtype == "float32"
        and not tf.config.list_logical_devices("GPU"))
    # Where our kernels are off or did not load, TensorFlow's.
    self._by_winograd = self.fits_winograd and winograd3d.available()

  def call(self, inputs, training=None):
    if self._side_by_taps:
      outputs = convolution_by_taps(inputs, self.kernel, self._side_by_taps)
    elif (self._by_winograd and training
          and not compat.in_xla_context()):  # (XLA has no kernel of ours)
      outputs = winograd3d.conv3d(inputs, self.kernel)
    else:
      outputs = self.convolution_op(inputs, self.kernel)
    outputs = tf.nn.max_pool3d(outputs, 2, 2, "VALID")
    return leaky_relu(tf.nn.bias_add(outputs, self.bias))

  def compute_output_shape(self, input_shape):
    shape = super().compute_output_shape(input_shape)
    return tf.TensorShape([shape[0]] + [d // 2 for d in shape[1:4]]
                          + [shape[4]])


def convolution_by_taps(inputs: tf.Tensor, kernel: tf.Tensor,
                        side: tuple) -> tf.Tensor:
  """A "same"-padded, stride-1 Conv3D of volumes `side` voxels a side,
  as one matrix product a kernel tap (every voxel times the tap's matrix:
  one batched product, at a matrix product's full speed), then each
  output voxel's sum of the products that reach it: the convolution's
  sums in another order (float rounding).

  On a few voxels a side it is faster, though it multiplies products the
  padding would discard (27 taps a voxel, of which 8 reach an output on
  2^3 voxels): forward and backward 2.1x oneDNN's direct convolution on
  the reference's fifth block (bench/RESULTS.md, "CosmoFlow's reference
  network"). Its products, and the gather of them, grow with the volume:
  on 4^3 voxels it takes 1.8x the direct convolution's time, so larger
  volumes are convolved directly."""
  taps = kernel.shape[:3]
  voxels, tap_count = math.prod(side), math.prod(taps)
  channels_in, channels_out = kernel.shape[3], kernel.shape[4]
  products = tf.matmul(
      tf.reshape(inputs, [1, -1, channels_in]),
      tf.reshape(kernel, [tap_count, channels_in, channels_out]))
  # [example, tap x input voxel, channel], and a zero row after them for
  # the taps that fall on the padding, where there are such.
  products = tf.reshape(
      tf.transpose(tf.reshape(products, [tap_count, -1, voxels,
                                         channels_out]), [1, 0, 2, 3]),
      [-1, tap_count * voxels, channels_out])
  reaching = _products_reaching(side, taps)
  if (reaching == tap_count * voxels).any():
    products = tf.pad(products, [[0, 0], [0, 1], [0, 0]])
  outputs = tf.reduce_sum(tf.gather(products, reaching, axis=1), axis=2)
  return tf.reshape(outputs, [-1, *side, channels_out])


def _products_reaching(side, taps) -> np.ndarray:
  """For each output voxel, the rows of `convolution_by_taps`' products
  (tap x voxels + input voxel) that it sums: the taps whose input voxel
  lies inside the volume, the rest the zero row past them, so that every
  output voxel sums as many. "Same" padding puts (k - 1) // 2 of a
  kernel's k taps before a voxel, as TensorFlow's convolution does."""
  voxels, tap_count = math.prod(side), math.prod(taps)
  rows = []
  for output in itertools.product(*map(range, side)):
    reaching = []
    for tap in itertools.product(*map(range, taps)):
      source = [o + t - (k - 1) // 2 for o, t, k in zip(output, tap, taps)]
      if all(0 <= s < n for s, n in zip(source, side)):
        reaching.append(np.ravel_multi_index(tap, taps) * voxels
                        + np.ravel_multi_index(source, side))
    rows.append(reaching)
  width = max(map(len, rows))
  return np.array([r + [tap_count * voxels] * (width - len(r)) for r in rows])


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
