import pytest
import keras
import tensorflow as tf

from models import resnet

BUILDERS = [resnet.resnet50, resnet.resnet_small]

# The architectures as published, written out here rather than read from the
# module so that a wrong table there cannot agree with itself: the stem's
# kernel size, then per stage the bottleneck filters and the number of blocks.
RESNET50 = (7, [((64, 64, 256), 3), ((128, 128, 512), 4),
                ((256, 256, 1024), 6), ((512, 512, 2048), 3)])
RESNET_SMALL = (3, [((64, 64, 64), 2), ((128, 128, 128), 2),
                    ((256, 256, 256), 2), ((512, 512, 512), 2)])


def expected_params(architecture, in_channels, num_classes):
  """Counts by hand: biased convolutions, each followed by a BatchNorm."""
  stem_kernel, stages = architecture

  def conv_bn(inputs, filters, kernel):
    # Kernel and bias; BatchNorm's gamma, beta, moving mean and variance.
    return kernel * kernel * inputs * filters + filters + 4 * filters

  channels = 64
  total = conv_bn(in_channels, channels, stem_kernel)
  for (first, middle, out), blocks in stages:
    total += conv_bn(channels, out, 1)  # The first block's projection.
    for _ in range(blocks):
      total += (conv_bn(channels, first, 1) + conv_bn(first, middle, 3)
                + conv_bn(middle, out, 1))
      channels = out
  return total + channels * num_classes + num_classes


@pytest.mark.parametrize("builder", BUILDERS)
def test_output_is_float32_logits_per_class(builder):
  model = builder(input_shape=(32, 32, 3), num_classes=7)
  logits = model(tf.zeros((2, 32, 32, 3)), training=False)
  assert logits.shape == (2, 7) and logits.dtype == tf.float32


@pytest.mark.parametrize("num_classes, count", [
    (1000, 25_636_712),  # keras_applications' ResNet50
    (10, 23_608_202),
])
def test_resnet50_has_keras_applications_parameter_count(num_classes, count):
  assert expected_params(RESNET50, 3, num_classes) == count
  model = resnet.resnet50(input_shape=(224, 224, 3), num_classes=num_classes)
  assert model.count_params() == count


def test_resnet_small_has_the_tutorials_parameter_count():
  model = resnet.resnet_small(input_shape=(32, 32, 3), num_classes=10)
  assert model.count_params() == expected_params(RESNET_SMALL, 3, 10)


def test_resnet_small_has_26_weighted_layers_and_4_projections():
  model = resnet.resnet_small(input_shape=(32, 32, 3), num_classes=10)
  convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
  shortcuts = [l for l in convs if "shortcut" in l.name]
  dense = [l for l in model.layers if isinstance(l, keras.layers.Dense)]
  assert len(shortcuts) == 4
  assert len(convs) - len(shortcuts) + len(dense) == 26


@pytest.mark.parametrize("builder", BUILDERS)
def test_batch_norm_as_in_the_tutorial(builder):
  model = builder(input_shape=(32, 32, 3), num_classes=10)
  norms = [l for l in model.layers
           if isinstance(l, keras.layers.BatchNormalization)]
  assert norms and all(l.momentum == 0.9 and l.epsilon == 1e-5 for l in norms)


@pytest.mark.parametrize("builder", BUILDERS)
def test_weight_decay_adds_an_l2_term_per_kernel(builder):
  model = builder(input_shape=(32, 32, 3), num_classes=10, weight_decay=1e-4)
  kernels = [w for w in model.trainable_weights if "kernel" in w.name]
  assert len(model.losses) == len(kernels)


@pytest.mark.parametrize("builder", BUILDERS)
def test_no_weight_decay_adds_no_loss(builder):
  model = builder(input_shape=(32, 32, 3), num_classes=10)
  assert not model.losses
