"""A Keras 3 fit script, trained data-parallel by the engine.

  horovodrun --gloo -np 2 .venv/bin/python examples/fit_script.py [--epochs=8]

Everything here is the script a Keras user has: a tf.data pipeline, a
compiled Sequential model (softmax output, a string loss, "accuracy"),
Keras' callbacks and one of the user's. Two lines differ from its
`model.fit` form: `import engine`, and `model.fit(` -> `engine.fit(model, `
(bench/fit_script.py runs both forms side by side; docs/from-fit.md).
The engine's flags (--model_dir, --epochs, ...) come after the script.
"""
import gzip
import json
import os

import engine
import keras
import numpy as np
import tensorflow as tf

DATA_DIR = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
BATCH = 64
# The user's callback writes what it saw here, one file per process.
SEEN_DIR = os.environ.get("FIT_SCRIPT_SEEN", "")


def read(name, header):
  with gzip.open(os.path.join(DATA_DIR, name + ".gz")) as f:
    return np.frombuffer(f.read(), np.uint8, offset=header)


def pipeline(images, labels, training):
  images = images.reshape(-1, 28, 28, 1)
  dataset = tf.data.Dataset.from_tensor_slices((images, labels.astype("int64")))
  if training:
    dataset = dataset.shuffle(10000, seed=0)
  return dataset.batch(BATCH).map(
      lambda x, y: (tf.cast(x, tf.float32) / 255.0, y)).prefetch(2)


class SeenLogs(keras.callbacks.Callback):
  """The user's own callback: the logs of each epoch's end, as it got them."""

  def __init__(self):
    super().__init__()
    self.seen = []

  def on_epoch_end(self, epoch, logs=None):
    self.seen.append({"epoch": epoch, **{k: float(v) for k, v in logs.items()}})
    if SEEN_DIR:
      name = f"seen.{os.environ.get('HOROVOD_RANK', '0')}.json"
      with open(os.path.join(SEEN_DIR, name), "w") as f:
        json.dump(self.seen, f)


train = pipeline(read("train-images-idx3-ubyte", 16),
                 read("train-labels-idx1-ubyte", 8), training=True)
test = pipeline(read("t10k-images-idx3-ubyte", 16),
                read("t10k-labels-idx1-ubyte", 8), training=False)

model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dropout(0.25),
    keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])

callbacks = [
    keras.callbacks.CSVLogger(os.environ.get("FIT_SCRIPT_CSV", "epochs.csv")),
    keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5,
                                      patience=2),
    keras.callbacks.EarlyStopping(monitor="val_loss", patience=4),
    SeenLogs(),
]
engine.fit(model, train, validation_data=test, epochs=8, callbacks=callbacks)
