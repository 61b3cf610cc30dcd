"""The user models bench/user_models.py trains: each as a user's model file
writes it, Keras' layers alone and no engine import, a function
`build(input_shape, num_classes)` the engine calls by
`--model=bench/user_model_files.py:NAME` and Keras `fit` calls itself.

`guide_resnet` is a small ResNet as Keras' guides write one (Conv2D,
BatchNormalization, ReLU, Add, global pooling); the two `keras.applications`
networks take Fashion-MNIST's 28x28 grey images resized to 32x32 and
repeated to three channels inside the model, as
examples/keras_applications.py does, with `weights=None`.
"""
import keras

layers = keras.layers


def guide_resnet(input_shape, num_classes):
  def block(x, filters, stride):
    shortcut = x
    x = layers.Conv2D(filters, 3, strides=stride, padding="same",
                      use_bias=False)(x)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    if stride != 1 or shortcut.shape[-1] != filters:
      shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(
          shortcut)
      shortcut = layers.BatchNormalization()(shortcut)
    return layers.ReLU()(layers.Add()([x, shortcut]))

  inputs = keras.Input(input_shape)
  x = layers.Conv2D(32, 3, padding="same", use_bias=False)(inputs)
  x = layers.ReLU()(layers.BatchNormalization()(x))
  for filters, stride in ((32, 1), (64, 2), (128, 2)):
    x = block(x, filters, stride)
  x = layers.GlobalAveragePooling2D()(x)
  return keras.Model(inputs, layers.Dense(num_classes)(x),
                     name="guide_resnet")


def _application(network, input_shape, num_classes, **options):
  inputs = keras.Input(input_shape)
  x = layers.Resizing(32, 32)(inputs)
  if input_shape[-1] == 1:
    x = layers.Concatenate()([x, x, x])
  backbone = network(input_shape=(32, 32, 3), include_top=False,
                     weights=None, pooling="avg", **options)
  return keras.Model(inputs, layers.Dense(num_classes)(backbone(x)),
                     name=backbone.name)


def mobilenet_v2(input_shape, num_classes):
  return _application(keras.applications.MobileNetV2, input_shape,
                      num_classes, alpha=0.5)


def resnet50_v2(input_shape, num_classes):
  return _application(keras.applications.ResNet50V2, input_shape,
                      num_classes)


def resnet50(input_shape, num_classes):
  """Horovod's synthetic benchmark's network (bench/horovod_benchmark.py) at
  the images' own size, with logits."""
  return keras.applications.ResNet50(
      weights=None, input_shape=input_shape, classes=num_classes,
      classifier_activation=None)
