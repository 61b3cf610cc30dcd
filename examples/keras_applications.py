"""Your own model in its own file: a Keras Applications network, untrained.

  horovodrun --gloo -np 2 .venv/bin/python -m engine.train \
      --model=examples/keras_applications.py:mobilenet_v2 \
      --model_dir=runs/mobilenet_v2 --epochs=3

The engine calls `mobilenet_v2(input_shape=..., num_classes=..., dropout=...)`
(the flags its signature declares) and trains what it returns like its own
models: sharded data, averaged gradients, checkpoints, resume, export.
Nothing is downloaded: `weights=None` starts from random weights.
"""
import keras

layers = keras.layers


def mobilenet_v2(input_shape, num_classes, dropout=0.0):
  """MobileNetV2 (width 0.5) for small images of any channel count.

  Keras' MobileNetV2 takes RGB images of at least 32x32: smaller ones are
  resized up, and one channel repeated three times, inside the model, so
  the exported model takes the data set's images as they are.
  """
  inputs = keras.Input(input_shape)
  x = inputs
  if min(input_shape[:2]) < 32:
    x = layers.Resizing(32, 32)(x)
  if input_shape[-1] == 1:
    x = layers.Concatenate()([x, x, x])
  backbone = keras.applications.MobileNetV2(
      input_shape=(*x.shape[1:3], 3), alpha=0.5, include_top=False,
      weights=None, pooling="avg")
  for layer in backbone.layers:
    if isinstance(layer, layers.BatchNormalization):
      # Keras' 0.999 averages over thousands of steps: evaluated after a
      # few epochs of a small data set, the model would still use its
      # initial statistics and score 10%.
      layer.momentum = 0.9
  x = layers.Dropout(dropout)(backbone(x))
  # float32 logits, also under --mixed_precision: softmax and the loss in
  # full precision.
  logits = layers.Dense(num_classes, dtype="float32", name="logits")(x)
  return keras.Model(inputs, logits, name="mobilenet_v2")
