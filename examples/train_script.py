"""Your own model and data from a script, launched by horovodrun:

  horovodrun --gloo -np 2 .venv/bin/python examples/train_script.py [--epochs=5 ...]

The model is plain Keras 3 (`import keras`, TensorFlow's own). The engine
is imported first: it puts Keras on TensorFlow's backend and chooses
TensorFlow's CPU kernels (oneDNN's), which are read once, early.
"""
import gzip
import os

from engine import datasets, train
import numpy as np
import keras

layers = keras.layers


def load_fashion_mnist(data_dir):
  """Arrays from anywhere (here Debian's Fashion-MNIST files)."""
  def read(name, header):
    path = os.path.join(data_dir or "/usr/share/datasets/fashion-mnist", name)
    with gzip.open(path + ".gz") as f:
      return np.frombuffer(f.read(), np.uint8, offset=header)
  return datasets.from_arrays(
      read("train-images-idx3-ubyte", 16).reshape(-1, 28, 28),
      read("train-labels-idx1-ubyte", 8),
      read("t10k-images-idx3-ubyte", 16).reshape(-1, 28, 28),
      read("t10k-labels-idx1-ubyte", 8),
      class_names=["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"])


def conv_net(input_shape, num_classes, dropout=0.25):
  inputs = x = keras.Input(input_shape)
  for width in (32, 64):
    x = layers.Conv2D(width, 3, padding="same", use_bias=False)(x)
    x = layers.MaxPooling2D()(layers.ReLU()(layers.BatchNormalization()(x)))
  x = layers.Dropout(dropout)(layers.Flatten()(x))
  logits = layers.Dense(num_classes, dtype="float32")(x)
  return keras.Model(inputs, logits, name="conv_net")


if __name__ == "__main__":
  train.run(model=conv_net, dataset=load_fashion_mnist, epochs=3,
            optimizer="adam", base_lr=0.001, model_dir="runs/train_script")
