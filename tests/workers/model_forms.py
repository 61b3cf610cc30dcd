"""Models in each form a Keras user writes one, for the tests that check
that every variable is checkpointed however a model holds its layers
(tests/test_model_forms.py, tests/test_resume.py).

Each is built as `--model=tests/workers/model_forms.py:NAME` builds it,
with `input_shape` and `num_classes`, and has BatchNorm statistics, the
variables no optimizer holds.
"""
import keras

layers = keras.layers


class Block(layers.Layer):
  """A custom layer holding its convolutions in a list, as Keras' guides
  write one."""

  def __init__(self, filters, **kwargs):
    super().__init__(**kwargs)
    self.convs = [layers.Conv2D(filters, 3, padding="same") for _ in range(2)]
    self.norm = layers.BatchNormalization(momentum=0.5)

  def call(self, x, training=False):
    for conv in self.convs:
      x = keras.activations.relu(conv(x))
    return self.norm(x, training=training)


class Stage(layers.Layer):
  """Custom layers inside a custom layer, in a tuple."""

  def __init__(self, filters, **kwargs):
    super().__init__(**kwargs)
    self.blocks = (Block(filters), Block(filters))

  def call(self, x, training=False):
    for block in self.blocks:
      x = block(x, training=training)
    return x


class Listed(keras.Model):
  """A subclassed model with its layers in a list and a dict."""

  def __init__(self, num_classes, **kwargs):
    super().__init__(**kwargs)
    self.stages = [Block(4), Stage(8)]
    self.heads = {"pool": layers.GlobalAveragePooling2D(),
                  "out": layers.Dense(num_classes, dtype="float32")}

  def call(self, x, training=False):
    for stage in self.stages:
      x = stage(x, training=training)
    return self.heads["out"](self.heads["pool"](x))


def listed(input_shape, num_classes):
  model = Listed(num_classes, name="listed")
  model(keras.ops.zeros((1, *input_shape)))
  return model


def sequential(input_shape, num_classes):
  return keras.Sequential([
      keras.Input(input_shape), layers.Conv2D(4, 3),
      layers.BatchNormalization(momentum=0.5), layers.ReLU(),
      layers.GlobalAveragePooling2D(), layers.Dense(num_classes, dtype="float32")],
      name="sequential_form")


def functional(input_shape, num_classes):
  """A functional model with a nested Sequential and a custom layer."""
  inputs = keras.Input(input_shape)
  x = keras.Sequential([layers.Conv2D(4, 3, padding="same"),
                        layers.BatchNormalization(momentum=0.5)])(inputs)
  x = Block(4)(x)
  x = layers.GlobalAveragePooling2D()(x)
  return keras.Model(inputs, layers.Dense(num_classes, dtype="float32")(x),
                     name="functional_form")


def applications(input_shape, num_classes):
  """Keras Applications' MobileNetV2 (width 0.35), untrained, nested."""
  inputs = keras.Input(input_shape)
  x = layers.Resizing(32, 32)(inputs)
  x = layers.Concatenate()([x, x, x])
  backbone = keras.applications.MobileNetV2(
      input_shape=(32, 32, 3), alpha=0.35, include_top=False, weights=None,
      pooling="avg")
  for layer in backbone.layers:
    if isinstance(layer, layers.BatchNormalization):
      layer.momentum = 0.5
  return keras.Model(inputs, layers.Dense(num_classes, dtype="float32")(backbone(x)),
                     name="applications_form")
