"""ResNet-50 and the NERSC tutorial's ResNetSmall (He et al., 2015).

Both follow the "Deep Learning at Scale" tutorial, which adapted
keras_applications' ResNet-50 (v1): bottleneck blocks of 1x1, 3x3 and 1x1
convolutions, the stride on the first 1x1 convolution and on the projection
shortcut. Convolutions keep their biases although BatchNorm follows each one,
so that ResNet-50 has keras_applications' 25,636,712 parameters and the
counts people quote for it hold here. As in the tutorial, BatchNorm uses
momentum 0.9 and epsilon 1e-5 (Keras' defaults are 0.99 and 1e-3, tuned for
inference); every kernel carries L2 weight decay when it is asked for.

ResNet-50 is the ImageNet network (224x224 inputs, a strided 7x7 stem and
max pooling); ResNetSmall is its 26-layer cousin for 32x32 images, with a
3x3 stem, no pooling and one projection and one identity block per stage.
"""
import functools

import keras

layers = keras.layers

# Per stage: the filters of the 1x1, 3x3 and 1x1 convolutions of its
# bottleneck blocks, the number of blocks and the stride of the first block.
_RESNET50_STAGES = (((64, 64, 256), 3, 1),
                    ((128, 128, 512), 4, 2),
                    ((256, 256, 1024), 6, 2),
                    ((512, 512, 2048), 3, 2))
_RESNET_SMALL_STAGES = (((64, 64, 64), 2, 2),
                        ((128, 128, 128), 2, 2),
                        ((256, 256, 256), 2, 2),
                        ((512, 512, 512), 2, 2))


def resnet50(*, input_shape, num_classes,
             weight_decay=0.0) -> keras.Model:
  return _resnet("resnet50", _imagenet_stem, _RESNET50_STAGES,
                 input_shape=input_shape, num_classes=num_classes,
                 weight_decay=weight_decay)


def resnet_small(*, input_shape, num_classes,
                 weight_decay=0.0) -> keras.Model:
  return _resnet("resnet_small", _small_image_stem, _RESNET_SMALL_STAGES,
                 input_shape=input_shape, num_classes=num_classes,
                 weight_decay=weight_decay)


def _resnet(name, stem, stages, *, input_shape, num_classes,
            weight_decay) -> keras.Model:
  """The two networks differ only in their stem and their stage table."""
  regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
  conv = functools.partial(layers.Conv2D, kernel_initializer="he_normal",
                           kernel_regularizer=regularizer)
  # Any height and width, as global pooling allows: smaller images for
  # the first epochs (--progressive_resizing) or at test time.
  inputs = keras.Input((None, None, input_shape[-1]))
  x = stem(inputs, conv)
  for stage, (filters, blocks, stride) in enumerate(stages, start=2):
    for block in range(blocks):
      x = _bottleneck(x, conv, filters, stride=stride if block == 0 else 1,
                      name=f"stage{stage}_block{block + 1}")
  x = layers.GlobalAveragePooling2D()(x)
  logits = layers.Dense(num_classes, kernel_regularizer=regularizer,
                        dtype="float32", name="logits")(x)
  return keras.Model(inputs, logits, name=name)


def _imagenet_stem(x, conv):
  """Takes 224x224 images down to 56x56 before the first stage."""
  x = layers.ZeroPadding2D(3)(x)
  x = layers.ReLU()(_conv_bn(x, conv, 64, 7, strides=2, name="stem"))
  x = layers.ZeroPadding2D(1)(x)
  return layers.MaxPooling2D(3, strides=2)(x)


def _small_image_stem(x, conv):
  """Keeps 32x32 images at full resolution: the stages halve it four times."""
  return layers.ReLU()(_conv_bn(x, conv, 64, 3, padding="same", name="stem"))


def _bottleneck(x, conv, filters, *, stride, name):
  """A residual block; its shortcut is projected where shapes change.

  keras_applications calls a block with a projection shortcut a "conv block"
  and one with an identity shortcut an "identity block". Each stage opens
  with a conv block, as it either strides or widens the channels.
  """
  first, middle, out_channels = filters
  y = layers.ReLU()(_conv_bn(x, conv, first, 1, strides=stride,
                             name=f"{name}_1"))
  y = layers.ReLU()(_conv_bn(y, conv, middle, 3, padding="same",
                             name=f"{name}_2"))
  y = _conv_bn(y, conv, out_channels, 1, name=f"{name}_3")
  if stride == 1 and x.shape[-1] == out_channels:
    shortcut = x
  else:
    shortcut = _conv_bn(x, conv, out_channels, 1, strides=stride,
                        name=f"{name}_shortcut")
  return layers.ReLU()(layers.Add()([y, shortcut]))


def _conv_bn(x, conv, filters, kernel_size, *, name, **conv_args):
  x = conv(filters, kernel_size, name=f"{name}_conv", **conv_args)(x)
  return layers.BatchNormalization(momentum=0.9, epsilon=1e-5,
                                   name=f"{name}_bn")(x)
