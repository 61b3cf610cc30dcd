"""3x3x3 convolutions by Winograd's F(2x2x2, 3x3x3), on a CPU.

A "same"-padded, stride-1 Conv3D of volumes with even sides computed by
our own kernels (models/kernels/winograd3d.cc, which says why): 3.4x
fewer multiplications than the direct convolution, with the transforms
around them fused so that they stay in cache. The convolution and both
its gradients come from its ops: the kernel taken to Winograd's domain
and convolved; the input's gradient the same convolution of the output's
gradient with the kernel mirrored and its channels swapped; the kernel's
its gradient in Winograd's domain, taken back to the 27 taps. The same
function as tf.nn.conv3d to float rounding (tests/test_winograd3d.py).

scripts/setup.sh compiles the kernels into the venv for its TensorFlow
and its machine's vector width (`library_path`).
"""
import os
import sys

import numpy as np
import tensorflow as tf
# The one way to tell, while a function is traced, that XLA will compile
# it (tf.function(jit_compile=True) traces it in an XLA context): XLA has
# no kernel for these ops.
from tensorflow.python.ops import control_flow_util

from engine.core.errors import UserError

# A kernel mirrored along an axis is the same kernel in Winograd's domain
# with its points 0 and infinity swapped (G applied to the taps reversed),
# so the input gradient's kernel is the forward's, permuted and transposed.
MIRRORED_POINTS = np.array([3, 1, 2, 0])
MIRRORED = (16 * MIRRORED_POINTS[:, None, None] + 4 * MIRRORED_POINTS[:, None]
            + MIRRORED_POINTS).ravel()
# The channels the kernels take, in and out: a multiple of the widest
# vector they may be compiled for (AVX-512's 16 floats).
CHANNEL_MULTIPLE = 16
_library = None


def library_path() -> str:
  """Where scripts/setup.sh puts the compiled kernels: in the venv, which
  has the TensorFlow they were compiled against."""
  return os.path.join(sys.prefix, "lib", "horovod-engine", "winograd3d.so")


def _ops():
  global _library
  if _library is None:
    path = library_path()
    if not os.path.exists(path):
      raise UserError(f"the Winograd kernels are not built ({path}): run "
                      "`make setup` (scripts/setup.sh compiles them)")
    _library = tf.load_op_library(path)
  return _library


def in_xla() -> bool:
  """Whether the function being traced is compiled by XLA (--xla), where
  the direct convolution is taken."""
  return control_flow_util.GraphOrParentsInXlaContext(
      tf.compat.v1.get_default_graph())


def conv3d(inputs: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
  """tf.nn.conv3d(inputs, kernel, [1] * 5, "SAME") for a [3, 3, 3, in,
  out] kernel, `in` and `out` multiples of CHANNEL_MULTIPLE, on volumes of
  even sides."""
  ops = _ops()

  @tf.custom_gradient
  def convolution(inputs, kernel):
    transformed = ops.winograd3d_transform_kernel(kernel)
    outputs = ops.winograd3d_conv(inputs, transformed)

    def gradient(upstream):
      mirrored = tf.transpose(tf.gather(transformed, MIRRORED), [0, 2, 1])
      input_gradient = ops.winograd3d_conv(upstream, mirrored)
      kernel_gradient = ops.winograd3d_untransform_kernel(
          ops.winograd3d_kernel_gradient(inputs, upstream))
      return input_gradient, kernel_gradient

    return outputs, gradient

  # The variable read here, so that the gradient function is given its
  # value as a tensor (a variable inside would need its own gradient).
  return convolution(inputs, tf.convert_to_tensor(kernel))
