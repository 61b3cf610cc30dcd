import numpy as np
import pytest
import keras
import tensorflow as tf

from engine.core.errors import UserError
from models import whitening
import models


@pytest.mark.parametrize("name, params, input_shape", [
    ("cnn", dict(filters=8), (28, 28, 1)),
    ("cnn", dict(filters=8), (32, 32, 3)),
    ("wrn", dict(depth=10, width=1), (28, 28, 1)),
    ("wrn", dict(depth=10, width=1), (32, 32, 3)),
    ("resnet9", dict(filters=8), (28, 28, 1)),
    ("resnet9", dict(filters=8), (32, 32, 3)),
])
def test_output_is_float32_logits_per_class(name, params, input_shape):
  model = models.build(name, input_shape=input_shape, num_classes=7, **params)
  logits = model(tf.zeros((3, *input_shape)), training=False)
  assert logits.shape == (3, 7) and logits.dtype == tf.float32


@pytest.mark.parametrize("name, params", [
    ("wrn", dict(depth=10, width=1)),
    ("resnet9", dict(filters=8)),
    ("resnet_small", {}),
])
def test_globally_pooled_models_take_images_of_any_size(name, params):
  """What --progressive_resizing trains them on: smaller images than
  those the model was built for."""
  model = models.build(name, input_shape=(32, 32, 3), num_classes=7,
                       **params)
  for side in (16, 20, 40):
    assert model(tf.zeros((2, side, side, 3)), training=False).shape == (2, 7)


@pytest.mark.parametrize("depth, width, millions", [
    (16, 10, 17.1),  # the Horovod lab's WRN-16-10 (paper, table 4: 17.2M)
    (28, 10, 36.5),  # paper, table 4
    (40, 4, 8.9),    # paper, table 4
])
def test_wide_resnet_has_the_papers_parameter_count(depth, width, millions):
  model = models.build("wrn", input_shape=(32, 32, 3), num_classes=10,
                       depth=depth, width=width)
  assert model.count_params() / 1e6 == pytest.approx(millions, abs=0.1)


def test_wide_resnet_batch_norm_as_in_the_lab():
  model = models.build("wrn", input_shape=(28, 28, 1), num_classes=10,
                       depth=10, width=1)
  norms = [l for l in model.layers
           if isinstance(l, keras.layers.BatchNormalization)]
  assert norms and all(l.momentum == 0.9 and l.epsilon == 1e-5 for l in norms)


def test_weight_decay_adds_an_l2_term_per_kernel():
  model = models.build("wrn", input_shape=(28, 28, 1), num_classes=10,
                       depth=10, width=1, weight_decay=1e-4)
  kernels = [w for w in model.trainable_weights if "kernel" in w.name]
  assert len(model.losses) == len(kernels)
  expected = sum(1e-4 * float(tf.reduce_sum(k ** 2)) for k in kernels)
  assert float(tf.add_n(model.losses)) == pytest.approx(expected, rel=1e-5)


def test_params_a_model_does_not_take_are_ignored():
  model = models.build("cnn", input_shape=(28, 28, 1), num_classes=10,
                       filters=4, depth=16, width=10)
  assert model.name == "cnn_4"


@pytest.mark.parametrize("name, params, message", [
    ("resnet9000", {}, "--model=resnet9000 is unknown"),
    ("wrn", dict(depth=12), "--depth=12"),
    ("resnet9", dict(stem="learnt"), "--stem=learnt: choose one of conv, "),
])
def test_bad_model_choices_are_named(name, params, message):
  with pytest.raises(UserError, match=message):
    models.build(name, input_shape=(28, 28, 1), num_classes=10, **params)


def test_resnet9_has_pages_layout():
  # Page's ResNet-9 at its width of 64 on CIFAR-10: 6.57M parameters.
  model = models.build("resnet9", input_shape=(32, 32, 3), num_classes=10,
                       filters=64)
  assert model.count_params() / 1e6 == pytest.approx(6.57, abs=0.01)
  convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
  assert [c.filters for c in convs] == [64, 128, 128, 128, 256, 512, 512, 512]
  assert sum(isinstance(l, keras.layers.Add) for l in model.layers) == 2


def test_resnet9_with_a_whitened_stem_has_no_stem_convolution_to_learn():
  model = models.build("resnet9", input_shape=(32, 32, 3), num_classes=10,
                       filters=64, stem="whitened")
  stem = model.get_layer("whitening")
  assert stem.kernel.shape == (2, 2, 3, 24)  # 2 x 12 directions of 12 values
  trainable = [v.path for v in model.trainable_variables]
  assert stem.kernel.path not in trainable and stem.bias.path in trainable
  convs = [l for l in model.layers if type(l) is keras.layers.Conv2D]
  assert [c.filters for c in convs] == [128, 128, 128, 256, 512, 512, 512]
  assert convs[0].kernel.shape[2] == 24


def test_whitening_makes_the_patches_uncorrelated_of_unit_variance(
    monkeypatch):
  """The outputs' first half (the second is its negative) over patches of
  images other than those it was fitted to, of the same correlations; the
  same filters whether the patches are counted at once or image by
  image."""
  rng = np.random.default_rng(0)

  def images(n):  # correlated neighbours, channels of different scales
    noise = rng.normal(size=(n, 13, 13, 2)) * [1.0, 3.0]
    return (noise[:, 1:, 1:] + 0.8 * noise[:, :-1, :-1]
            + 0.5 * noise[:, 1:, :-1]).astype(np.float32)

  layer = whitening.PatchWhitening(2, epsilon=0.0)
  fitted_to = images(400)
  layer.adapt(fitted_to)
  by_image = whitening.PatchWhitening(2, epsilon=0.0)
  monkeypatch.setattr(whitening, "CHUNK_PATCHES", 1)
  by_image.adapt(fitted_to)
  np.testing.assert_allclose(by_image.kernel.numpy(), layer.kernel.numpy(),
                             rtol=1e-5, atol=1e-6)
  out = layer(images(400)).numpy()[:, :-1, :-1]  # "same" pads right, below
  half = out[..., :8].reshape(-1, 8)
  np.testing.assert_allclose(np.cov(half, rowvar=False), np.eye(8),
                             atol=0.05)
  np.testing.assert_array_equal(out[..., 8:], -out[..., :8])


@pytest.mark.parametrize("pool_first, after_stage_conv", [
    (False, ["BatchNormalization", "ReLU", "MaxPooling2D"]),
    (True, ["MaxPooling2D", "BatchNormalization", "ReLU"]),
])
def test_resnet9_pools_each_stage_last_or_first(pool_first, after_stage_conv):
  model = models.build("resnet9", input_shape=(32, 32, 3), num_classes=10,
                       filters=8, pool_first=pool_first)
  names = [type(l).__name__ for l in model.layers]
  convs = [i for i, l in enumerate(model.layers)
           if isinstance(l, keras.layers.Conv2D)]
  pooled = [i for i in convs if "MaxPooling2D" in names[i + 1:i + 4]]
  assert len(pooled) == 3  # a stage's first convolution
  for i in pooled:
    assert names[i + 1:i + 4] == after_stage_conv
  assert model.count_params() == models.build(
      "resnet9", input_shape=(32, 32, 3), num_classes=10,
      filters=8).count_params()
