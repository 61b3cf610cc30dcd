"""Our Winograd kernels for 3x3x3 convolutions (models/winograd3d.py):
the same function and gradients as TensorFlow's convolution, and where
CosmoFlow's network takes them.

In-process, on the kernels scripts/setup.sh compiled into the venv.
"""
import numpy as np
import pytest
import keras
import tensorflow as tf

from engine.core.errors import UserError
import models
from models import winograd3d
from tests import fixtures


def both_ways(inputs, kernel, upstream):
  """[output, input gradient, kernel gradient] by the direct convolution
  and by ours."""
  computed = []
  for convolve in (lambda x, k: tf.nn.conv3d(x, k, [1] * 5, "SAME"),
                   winograd3d.conv3d):
    with tf.GradientTape() as tape:
      tape.watch([inputs, kernel])
      outputs = convolve(inputs, kernel)
    computed.append([outputs, *tape.gradient(outputs, [inputs, kernel],
                                             output_gradients=upstream)])
  return computed


@pytest.mark.parametrize("volume, channels_in, channels_out", [
    ((8, 8, 8), 16, 32),   # the widest vectors both ways
    ((4, 6, 10), 32, 16),  # sides apart, tiles on every edge
    ((2, 2, 2), 48, 64),   # one tile: all but its middle taps on padding
])
def test_the_convolution_and_its_gradients_are_tensorflows(
    volume, channels_in, channels_out):
  inputs = tf.random.stateless_normal((2, *volume, channels_in), (1, 2))
  kernel = tf.random.stateless_normal((3, 3, 3, channels_in, channels_out),
                                      (3, 4)) * 0.1
  upstream = tf.random.stateless_normal((2, *volume, channels_out), (5, 6))
  theirs, ours = both_ways(inputs, kernel, upstream)
  for name, a, b in zip(["output", "input gradient", "kernel gradient"],
                        ours, theirs):
    # The same sums in another order: within float32 rounding of the
    # whole (Winograd's transforms add a few roundings a term).
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), name


def test_the_kernel_gradient_sums_the_same_way_every_time():
  inputs = tf.random.stateless_normal((2, 8, 8, 8, 16), (1, 2))
  upstream = tf.random.stateless_normal((2, 8, 8, 8, 32), (5, 6))
  ops = winograd3d._ops()
  first = ops.winograd3d_kernel_gradient(inputs, upstream).numpy()
  again = ops.winograd3d_kernel_gradient(inputs, upstream).numpy()
  assert np.array_equal(first, again)


def test_the_untransform_is_the_transforms_gradient():
  # <T(w), g> = <w, T'(g)> for every w and g: T' is T's transpose.
  ops = winograd3d._ops()
  kernel = tf.random.stateless_normal((3, 3, 3, 16, 32), (1, 2))
  gradient = tf.random.stateless_normal((64, 16, 32), (3, 4))
  left = tf.reduce_sum(ops.winograd3d_transform_kernel(kernel) * gradient)
  right = tf.reduce_sum(kernel * ops.winograd3d_untransform_kernel(gradient))
  assert abs(float(left) - float(right)) <= 1e-4 * abs(float(left))


@pytest.mark.parametrize("inputs, kernel, says", [
    ((1, 4, 5, 4, 16), (64, 16, 16), "the volume's sides must be even"),
    ((1, 4, 4, 4, 16), (64, 8, 16), r"the transformed kernel is \[64, 16, "
                                    r"Co\]"),
    # The first block's 4 channels in (the vectors' lanes: 16 with
    # AVX-512, 8 with AVX2); 4 out.
    ((1, 4, 4, 4, 4), (64, 4, 16), "channels in and out must be multiples "
                                   "of (8|16); got 4 and 16"),
    ((1, 4, 4, 4, 16), (64, 16, 4), "channels in and out must be multiples "
                                    "of (8|16); got 16 and 4"),
])
def test_shapes_the_kernels_cannot_take_are_refused(inputs, kernel, says):
  with pytest.raises(tf.errors.InvalidArgumentError, match=says):
    winograd3d._ops().winograd3d_conv(tf.zeros(inputs), tf.zeros(kernel))


def convolutions(model):
  return [l for l in model.layers if isinstance(l, keras.layers.Conv3D)]


def test_cosmoflow_takes_them_for_its_second_and_third_blocks():
  # The reference network on 32^3 x 4: the first block has 4 channels in,
  # the fourth 4^3 voxels, the fifth 2^3 (by taps).
  model = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                       num_classes=4, filters=32, conv_layers=5)
  assert [l._by_winograd for l in convolutions(model)] == [
      False, True, True, False, False]

  volumes = tf.zeros((1, 32, 32, 32, 4))

  def op_types(training, jit_compile=False):
    call = tf.function(lambda v: model(v, training=training),
                       jit_compile=jit_compile)
    graph = call.get_concrete_function(volumes).graph
    return {op.type for op in graph.get_operations()}
  assert "Winograd3DConv" in op_types(training=True)
  # Inference (validation, the exported SavedModel) and XLA take the
  # direct convolution: a SavedModel must load without our kernels, and
  # XLA has none of them.
  assert not any(t.startswith("Winograd") for t in op_types(training=False))
  assert not any(t.startswith("Winograd")
                 for t in op_types(training=True, jit_compile=True))


def test_bfloat16_takes_onednns_convolution():
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    model = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                         num_classes=4, filters=32, conv_layers=3)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert not any(l._by_winograd for l in convolutions(model))


def test_missing_kernels_are_one_line(monkeypatch, tmp_path):
  monkeypatch.setattr(winograd3d, "_library", None)
  monkeypatch.setattr(winograd3d, "library_path",
                      lambda: str(tmp_path / "winograd3d.so"))
  with pytest.raises(UserError, match=r"^the Winograd kernels are not "
                     r"built \(.*winograd3d.so\): run `make setup`"):
    winograd3d.conv3d(tf.zeros((1, 2, 2, 2, 16)), tf.zeros((3, 3, 3, 16, 16)))


def test_cosmoflows_network_trains_as_the_direct_one():
  # The same weights, one batch: outputs and every gradient of the model
  # with Winograd's blocks against the same model with none.
  keras.utils.set_random_seed(0)
  ours = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                      num_classes=4, filters=16, conv_layers=3)
  direct = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                        num_classes=4, filters=16, conv_layers=3)
  for layer in convolutions(direct):
    layer._by_winograd = False
  assert [l._by_winograd for l in convolutions(ours)] == [False, True, True]
  direct.set_weights(ours.get_weights())
  # Against the same blocks convolved directly, not the reference's
  # layers: on this many voxels the reference's order, pooling after the
  # bias and LeakyReLU, meets ties that their rounding makes and sends
  # those gradients to another voxel; its gradients then differ from
  # either network's by up to 0.5%.
  volumes = tf.random.stateless_normal((2, 32, 32, 32, 4), (0, 1))
  computed = [fixtures.outputs_and_gradients(network, volumes)
              for network in (ours, direct)]
  for a, b in zip(*computed):
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)
