r"""The fit script bench/fit_script.py measures, and its parts: Fashion-MNIST
as tf.data pipelines and a small CNN in Keras' layers, written once for
every variant.

Run as a script, it is a Keras user's fit script, in either form:

  FIT_SCRIPT_FORM=fit .venv/bin/python bench/fit_script_parts.py
  FIT_SCRIPT_FORM=engine.fit horovodrun --gloo -np 2 .venv/bin/python \
      bench/fit_script_parts.py --model_dir=/tmp/run --progress=none

`fit` calls `model.fit` in this process alone (nothing imports Horovod);
`engine.fit` is the same script with `engine.fit(model, ` in its place,
the engine's flags after the script. The orchestrator sets the rest in the
environment (FIT_SCRIPT_EPOCHS, FIT_SCRIPT_EXAMPLES; for `fit`,
FIT_SCRIPT_DIR for its epoch records and FIT_SCRIPT_THREADS, the engine's
intra- and inter-op threads). engine.train takes the parts by name:

  --dataset=bench/fit_script_parts.py:datasets \
      --model=bench/fit_script_parts.py:compiled_cnn   # the tf.data route
  --dataset=bench/fit_script_parts.py:gathered_datasets ...  # gathered
  --dataset=fashion_mnist --model=bench/fit_script_parts.py:cnn  # arrays
"""
import gzip
import os

import engine
import keras
import numpy as np
import tensorflow as tf

from bench import epochs as epochs_lib

DATA_DIR = "/usr/share/datasets/fashion-mnist"
NUM_TRAIN = 60000  # Fashion-MNIST's training images
BATCH = 64  # each process's
LEARNING_RATE = 1e-3


def _read(data_dir: str, name: str, header: int) -> np.ndarray:
  with gzip.open(os.path.join(data_dir, name + ".gz")) as f:
    return np.frombuffer(f.read(), np.uint8, offset=header)


def _pipeline(images: np.ndarray, labels: np.ndarray,
              training: bool) -> tf.data.Dataset:
  dataset = tf.data.Dataset.from_tensor_slices(
      (images.reshape(-1, 28, 28, 1), labels.astype("int64")))
  if training:
    dataset = dataset.shuffle(10000, seed=0)
  return (dataset.batch(BATCH)
          .map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y),
               num_parallel_calls=tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE))


def datasets(data_dir: str = "", train_examples: int = 0
             ) -> tuple[tf.data.Dataset, tf.data.Dataset]:
  """(train, validation): the first `train_examples` training images (0:
  all NUM_TRAIN) shuffled, and the 10000 test images, in batches of BATCH.
  engine.train passes --data_dir and --train_examples."""
  data_dir = data_dir or DATA_DIR
  images = _read(data_dir, "train-images-idx3-ubyte", 16).reshape(-1, 784)
  labels = _read(data_dir, "train-labels-idx1-ubyte", 8)
  kept = slice(0, train_examples or len(labels))
  return (_pipeline(images[kept], labels[kept], training=True),
          _pipeline(_read(data_dir, "t10k-images-idx3-ubyte", 16),
                    _read(data_dir, "t10k-labels-idx1-ubyte", 8),
                    training=False))


def gathered_datasets(data_dir: str = "", train_examples: int = 0
                      ) -> tuple[tf.data.Dataset, tf.data.Dataset]:
  """`datasets`' data, its training batches made as the engine's arrays
  source makes them (engine/datasets/sources.py): a shuffled range of
  indices batched, each batch gathered from the images held in memory,
  not shuffled and batched image by image. What the engine's tf.data
  route costs apart from the user's way of writing a pipeline."""
  data_dir = data_dir or DATA_DIR
  kept = slice(0, train_examples or NUM_TRAIN)
  images = tf.constant(_read(data_dir, "train-images-idx3-ubyte", 16)
                       .reshape(-1, 28, 28, 1)[kept])
  labels = tf.constant(_read(data_dir, "train-labels-idx1-ubyte", 8)
                       .astype("int64")[kept])
  train = (tf.data.Dataset.range(int(labels.shape[0]))
           .shuffle(int(labels.shape[0]), seed=0).batch(BATCH)
           .map(lambda i: (tf.cast(tf.gather(images, i), tf.float32) / 255.0,
                           tf.gather(labels, i)), num_parallel_calls=2)
           .prefetch(2))
  return train, datasets(data_dir, train_examples)[1]


def cnn(input_shape=(28, 28, 1), num_classes: int = 10) -> keras.Model:
  """Two convolutions and a dense layer, as Keras' MNIST example; logits
  out, which the engine's classification task and the compiled loss
  below both take."""
  layers = keras.layers
  return keras.Sequential([
      keras.Input(input_shape),
      layers.Conv2D(32, 3, activation="relu"),
      layers.MaxPooling2D(),
      layers.Conv2D(64, 3, activation="relu"),
      layers.MaxPooling2D(),
      layers.Flatten(),
      layers.Dropout(0.25),
      layers.Dense(num_classes),
  ], name="cnn")


def compiled_cnn(input_shape=(28, 28, 1), num_classes: int = 10
                 ) -> keras.Model:
  """`cnn` compiled as the script compiles it: Adam at LEARNING_RATE
  (engine.train's --optimizer=adam --base_lr=1e-3), sparse cross-entropy,
  accuracy."""
  model = cnn(input_shape, num_classes)
  model.compile(
      optimizer=keras.optimizers.Adam(LEARNING_RATE),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=["accuracy"])
  return model


class TimeTraining(keras.callbacks.Callback):
  """`model.fit`'s epochs timed into the engine's record shape
  (bench/epochs.py): each from its start to its validation's, which the
  engine's images/s leaves out too."""

  def __init__(self, timer: epochs_lib.EpochTimer):
    super().__init__()
    self._timer, self._epoch = timer, 0

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch + 1
    self._timer.start()

  def on_test_begin(self, logs=None):
    self._timer.end(self._epoch)


def _fit_callbacks(examples: int) -> list[keras.callbacks.Callback]:
  """For `model.fit`: the engine's threads, set before TensorFlow runs
  anything (which fixes them), and the epochs' timer."""
  intra, inter = map(int, os.environ["FIT_SCRIPT_THREADS"].split(","))
  tf.config.threading.set_intra_op_parallelism_threads(intra)
  tf.config.threading.set_inter_op_parallelism_threads(inter)
  return [TimeTraining(epochs_lib.EpochTimer(
      os.path.join(os.environ["FIT_SCRIPT_DIR"], "metrics.jsonl"),
      images_per_epoch=examples, world_size=1, intra_op_threads=intra,
      inter_op_threads=inter, chief=True))]


def main() -> None:
  epochs = int(os.environ["FIT_SCRIPT_EPOCHS"])
  examples = int(os.environ.get("FIT_SCRIPT_EXAMPLES", "0")) or NUM_TRAIN
  fit = os.environ["FIT_SCRIPT_FORM"] == "fit"
  callbacks = _fit_callbacks(examples) if fit else []
  train, test = datasets(train_examples=examples)
  keras.utils.set_random_seed(0)
  model = compiled_cnn()
  if fit:
    model.fit(train, validation_data=test, epochs=epochs, callbacks=callbacks,
              verbose=0)
  else:
    engine.fit(model, train, validation_data=test, epochs=epochs)


if __name__ == "__main__":
  main()
