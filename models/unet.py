"""A small U-Net (Ronneberger et al. 2015) for per-pixel outputs.

For segmentation (`num_classes` logits per pixel) and image-to-image tasks
(`num_classes` output channels). Each level halves the resolution with two
3x3 convolutions (BatchNorm, ReLU) then max pooling, and the way up doubles
it with a transposed convolution whose output is concatenated with the
level's features from the way down. As many levels as halve the image
exactly down to no less than 4 pixels, at most 4: 2 for 28x28 images.
"""
import keras

layers = keras.layers
MAX_LEVELS = 4


def build(*, input_shape, num_classes, filters=32, dropout=0.0,
          weight_decay=0.0) -> keras.Model:
  regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None

  def block(x, width):
    for _ in range(2):
      x = layers.Conv2D(width, 3, padding="same", use_bias=False,
                        kernel_regularizer=regularizer)(x)
      x = layers.BatchNormalization()(x)
      x = layers.ReLU()(x)
    return x

  inputs = keras.Input(input_shape)
  x, skips = inputs, []
  for level in range(levels(input_shape[:2])):
    x = block(x, filters * 2 ** level)
    skips.append(x)
    x = layers.MaxPooling2D()(x)
  x = block(x, filters * 2 ** len(skips))
  if dropout:
    x = layers.Dropout(dropout)(x)
  for level, skip in reversed(list(enumerate(skips))):
    x = layers.Conv2DTranspose(filters * 2 ** level, 2, strides=2,
                               kernel_regularizer=regularizer)(x)
    x = block(layers.Concatenate()([x, skip]), filters * 2 ** level)
  outputs = layers.Conv2D(num_classes, 1, kernel_regularizer=regularizer,
                          dtype="float32", name="logits")(x)
  return keras.Model(inputs, outputs, name=f"unet_{filters}")


def levels(size) -> int:
  """How many times (height, width) halve exactly, staying at least 4."""
  height, width = size
  count = 0
  while (count < MAX_LEVELS and height % 2 == 0 and width % 2 == 0
         and min(height, width) >= 8):
    height, width, count = height // 2, width // 2, count + 1
  return count
