"""What every runner trains: the same data, model, batch and optimizer.

The engine gets this workload as flags (`engine_flags`); the bench workers
(keras_fit, plain_loop) build it from the same pieces the engine uses: the
data sets' loaders in engine/datasets and the model registry in models/. So
a difference in throughput is a difference in the training loop around the
step, not in what is trained.
"""
from absl import flags
import keras
import tensorflow as tf

from engine import datasets
from engine.compute import optimizers
from engine.datasets import Splits
import models

# Data: real Fashion-MNIST, or random images of its shape and split sizes.
DATASETS = {"synthetic": "synthetic", "real": "fashion_mnist"}
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
SYNTHETIC_TRAIN, SYNTHETIC_TEST = 60000, 10000
# Model and optimizer: the engine's CPU preset (flags/fashion_mnist_cpu.cfg),
# with the rate scaled linearly with processes by each runner.
MODEL = "cnn"
FILTERS = 32
BASE_LR = 1e-3
SEED = 0


def engine_flags(dataset: str) -> list[str]:
  """engine.train's flags for this workload on `dataset`, augmentation off
  (the workers have none), float32 as the workers compute, and no progress
  lines (nothing but the epochs)."""
  data = [f"--dataset={dataset}"]
  if dataset == "synthetic":
    data += [f"--image_size={IMAGE_SHAPE[0]}", f"--channels={IMAGE_SHAPE[2]}",
             f"--num_classes={NUM_CLASSES}",
             f"--train_examples={SYNTHETIC_TRAIN}",
             f"--test_examples={SYNTHETIC_TEST}"]
  return data + [f"--model={MODEL}", f"--filters={FILTERS}",
                 "--optimizer=adam", f"--base_lr={BASE_LR}",
                 "--lr_scaling=linear", "--random_flip=false",
                 "--random_shift=0", f"--seed={SEED}", "--progress=none",
                 "--mixed_precision=none"]


def load(dataset: str) -> Splits:
  """The data set through the engine's own loader (the idx reader for
  Fashion-MNIST; nothing is downloaded)."""
  return datasets.load(dataset, data_dir="", image_size=IMAGE_SHAPE[0],
                       channels=IMAGE_SHAPE[2], num_classes=NUM_CLASSES,
                       train_examples=SYNTHETIC_TRAIN,
                       test_examples=SYNTHETIC_TEST)


def build_model(info: datasets.DatasetInfo) -> keras.Model:
  keras.utils.set_random_seed(SEED)
  return models.build(MODEL, input_shape=info.image_shape,
                      num_classes=info.num_classes, filters=FILTERS)


def train_step(model: keras.Model):
  """A plain compiled step: the engine's math with no Horovod in it, its
  Adam at BASE_LR (one process) built here.

  plain_loop runs it, and bench/flops.py counts the floating-point
  operations of its graph.
  """
  optimizer = optimizers.build("adam", learning_rate=BASE_LR, momentum=0.0,
                               nesterov=False)
  optimizers.build_state(optimizer, model.trainable_variables)

  @tf.function
  def step(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True))
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  return step


def use_threads(intra_op: int, inter_op: int) -> None:
  """Sizes TensorFlow's thread pools; must run before its first op."""
  tf.config.threading.set_intra_op_parallelism_threads(intra_op)
  tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def define_worker_flags() -> None:
  """The flags both workers take; the orchestrator passes them all."""
  flags.DEFINE_enum("dataset", None, sorted(DATASETS.values()),
                    "Data set to train on.", required=True)
  flags.DEFINE_integer("batch_size", 128, "Examples per process per step.",
                       lower_bound=1)
  flags.DEFINE_integer("epochs", 4, "Epochs; the first is warm-up.",
                       lower_bound=1)
  flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch.",
                       lower_bound=1)
  flags.DEFINE_string("records", None,
                      "JSON-lines file for one record per epoch (rank 0).",
                      required=True)
