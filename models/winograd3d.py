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

scripts/build_kernels.sh compiles the kernels into the venv for its
TensorFlow, once for each vector width (`VARIANTS`); each process loads
the widest its own CPU runs (`variant`), so one venv serves every x86-64
node. --cpu_kernels (`use`) turns them off or names a variant. Where none
loads, the models that would take them take TensorFlow's convolution,
said in one line (`available`).
"""
import os
import sys

from absl import logging
import numpy as np
import tensorflow as tf

from engine.core import compat
from engine.core import cpu
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
# The builds of scripts/build_kernels.sh, widest first, and the CPU
# features (Linux's names) each one's instructions need.
VARIANTS = {"avx512": {"avx512f"}, "avx2": {"avx2", "fma"}}
CHOICES = ("auto", "off", *VARIANTS)
# --cpu_kernels's; the environment's in a process that parses no flags
# (the tests run each variant so).
_choice = os.environ.get("ENGINE_CPU_KERNELS", "auto")
_library = None
_library_variant = None
_warned = False


def use(choice: str) -> None:
  """The kernels this process takes (--cpu_kernels): auto, the widest
  variant its CPU runs; off, none; or a variant by name, which the CPU
  must run."""
  global _choice
  if choice in VARIANTS and not VARIANTS[choice] <= cpu.features():
    raise UserError(f"--cpu_kernels={choice}: this CPU lacks "
                    f"{', '.join(sorted(VARIANTS[choice] - cpu.features()))};"
                    " use --cpu_kernels=auto")
  _choice = choice


def variant():
  """The variant this process loads, or None (off, or a CPU without
  AVX2). Under auto, the widest the CPU runs of those built (a compiler
  without AVX-512 builds AVX2's alone)."""
  if _choice != "auto":
    return None if _choice == "off" else _choice
  runs = [v for v, needs in VARIANTS.items() if needs <= cpu.features()]
  built = [v for v in runs if os.path.exists(_path(v))]
  return (built or runs or [None])[0]


def library_path() -> str:
  """Where scripts/build_kernels.sh puts this process's variant: in the
  venv, which has the TensorFlow they were compiled against."""
  return _path(variant())


def _path(variant_name: str) -> str:
  return os.path.join(sys.prefix, "lib", "horovod-engine",
                      f"winograd3d_{variant_name}.so")


def available() -> bool:
  """Whether training can take the kernels here. A library missing or not
  loading is one warning (once a process), and False: the layers take
  TensorFlow's convolution."""
  global _warned
  if variant() is None:
    return False
  try:
    _ops()
    return True
  except (UserError, tf.errors.OpError) as e:
    if not _warned:
      logging.warning("%s; CosmoFlow's 3x3x3 blocks take TensorFlow's "
                      "convolution", str(e).strip().splitlines()[0])
      _warned = True
    return False


def _ops():
  global _library, _library_variant
  if _library is None:
    if variant() is None:
      raise UserError(f"the Winograd kernels are {_choice_described()}")
    path = library_path()
    if not os.path.exists(path):
      raise UserError(f"the Winograd kernels are not built ({path}): run "
                      "`make setup` (scripts/build_kernels.sh compiles them)")
    try:
      _library, _library_variant = tf.load_op_library(path), variant()
    except tf.errors.OpError as e:
      raise UserError(f"the Winograd kernels ({path}) do not load: "
                      f"{e.message.strip().splitlines()[0]}") from None
  return _library


def _choice_described() -> str:
  if _choice == "off":
    return "off (--cpu_kernels=off)"
  return "not for this CPU (it has no AVX2 and FMA)"


def blocks(model) -> tuple[int, int]:
  """How many of `model`'s layers fit the kernels (a layer says so by its
  `fits_winograd`), and how many of those take them."""
  fitting = [layer for layer in compat.layers_within(model)
             if getattr(layer, "fits_winograd", False)]
  return len(fitting), sum(layer._by_winograd for layer in fitting)


def loaded():
  """The variant this process loaded, or None."""
  return _library_variant


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
