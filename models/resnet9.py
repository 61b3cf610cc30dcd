"""ResNet-9 (Page 2018, "How to train your ResNet"), for small images.

The network behind the fastest DAWNBench CIFAR-10 entries of its day: 94%
in minutes. A stem convolution, three stages that double the channels and
halve the resolution (convolution, BatchNorm, ReLU, 2x2 max pooling), the
first and last with a residual block of two such convolutions, then global
max pooling and a dense layer whose outputs are scaled by 1/8 into logits. `filters` is the stem's width (64
in the paper); on 28x28 Fashion-MNIST the stages run at 28, 14 and 7 pixels.
Its cost grows with filters squared, so small widths suit CPUs: at 16 it
takes about 4 times the cnn's multiply-adds at its default width.

Two changes from Keller Jordan's airbench (2024), both off by default:
`stem="whitened"` replaces the stem convolution with a frozen whitening of
2x2 patches and a ReLU (models/whitening.py): 8 channels per image channel
instead of `filters`, so the first stage is cheaper too. `pool_first`
pools each stage right after its convolution, so that BatchNorm and ReLU
run on a quarter of the pixels (not the same function: a max taken before
BatchNorm picks the minimum where its scale is negative).
"""
import keras

from engine.core.errors import UserError
from models import whitening

layers = keras.layers
STEMS = ("conv", "whitened")


def build(*, input_shape, num_classes, filters=16, weight_decay=0.0,
          stem="conv", pool_first=False) -> keras.Model:
  if stem not in STEMS:
    raise UserError(f"--stem={stem}: choose one of {', '.join(STEMS)}")
  regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None

  def conv_bn(x, width, pool=False):
    x = layers.Conv2D(width, 3, padding="same", use_bias=False,
                      kernel_regularizer=regularizer)(x)
    if pool and pool_first:
      x = layers.MaxPooling2D()(x)
    x = layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)
    x = layers.ReLU()(x)
    return layers.MaxPooling2D()(x) if pool and not pool_first else x

  def stage(x, width, residual):
    x = conv_bn(x, width, pool=True)
    if residual:
      x = layers.Add()([x, conv_bn(conv_bn(x, width), width)])
    return x

  # Any height and width, as global pooling allows: smaller images for
  # the first epochs (--progressive_resizing) or at test time.
  inputs = keras.Input((None, None, input_shape[-1]))
  if stem == "whitened":
    x = layers.ReLU()(whitening.PatchWhitening(2, name="whitening")(inputs))
  else:
    x = conv_bn(inputs, filters)
  x = stage(x, 2 * filters, residual=True)
  x = stage(x, 4 * filters, residual=False)
  x = stage(x, 8 * filters, residual=True)
  x = layers.GlobalMaxPooling2D()(x)
  x = layers.Dense(num_classes, kernel_regularizer=regularizer)(x)
  # Page's scaling of the logits by 1/8: maxima of ReLUs are large, and
  # unscaled logits start the loss far above log(classes).
  logits = layers.Rescaling(0.125, dtype="float32", name="logits")(x)
  return keras.Model(inputs, logits, name=f"resnet9_{filters}")
