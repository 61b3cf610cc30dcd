"""Wide Residual Networks (Zagoruyko & Komodakis, 2016).

WRN-d-k has (d - 4) / 6 pre-activation residual blocks in each of three
groups of 16k, 32k and 64k channels. WRN-16-10 is the Horovod lab's model.
As in the lab, BatchNorm uses momentum 0.9 and epsilon 1e-5 (Keras' defaults
are 0.99 and 1e-3, tuned for inference) and every kernel carries L2 weight
decay. The stem and downsampling follow the paper, so the same builder serves
28x28 (Fashion-MNIST) and 32x32 (CIFAR-10) inputs.
"""
import functools

import keras

from engine.core.errors import UserError

layers = keras.layers


def build(*, input_shape, num_classes, depth=16, width=10, dropout=0.0,
          weight_decay=0.0) -> keras.Model:
  if depth < 10 or (depth - 4) % 6:
    raise UserError(f"--depth={depth}: a WideResNet's depth is 6n+4 with "
                    "n >= 1 (10, 16, 22, 28, 40)")
  if width < 1:
    raise UserError(f"--width={width}: the widening factor must be >= 1")
  regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
  conv = functools.partial(layers.Conv2D, padding="same", use_bias=False,
                           kernel_initializer="he_normal",
                           kernel_regularizer=regularizer)
  normalized = functools.partial(layers.BatchNormalization, momentum=0.9,
                                 epsilon=1e-5)

  def block(x, channels, stride):
    activated = layers.ReLU()(normalized()(x))
    if stride == 1 and x.shape[-1] == channels:
      shortcut = x
    else:
      shortcut = conv(channels, 1, strides=stride)(activated)
    y = conv(channels, 3, strides=stride)(activated)
    y = layers.ReLU()(normalized()(y))
    if dropout:
      y = layers.Dropout(dropout)(y)
    y = conv(channels, 3)(y)
    return layers.Add()([y, shortcut])

  # Any height and width, as global pooling allows: smaller images for
  # the first epochs (--progressive_resizing) or at test time.
  inputs = keras.Input((None, None, input_shape[-1]))
  x = conv(16, 3)(inputs)
  for group, channels in enumerate((16 * width, 32 * width, 64 * width)):
    for index in range((depth - 4) // 6):
      x = block(x, channels, stride=2 if group and not index else 1)
  x = layers.ReLU()(normalized()(x))
  x = layers.GlobalAveragePooling2D()(x)
  logits = layers.Dense(num_classes, kernel_regularizer=regularizer,
                        dtype="float32", name="logits")(x)
  return keras.Model(inputs, logits, name=f"wrn_{depth}_{width}")
