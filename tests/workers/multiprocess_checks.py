"""Run by tests/test_multiprocess.py, under `horovodrun -np N` or alone.

Two checks in one launch, since each TensorFlow process takes seconds to
start. Each rank writes what it observed to OUT/rank<r>.json; the test
asserts on those files.

1. A real engine run on generated Fashion-MNIST files: afterwards, every
   rank's variables (including BatchNorm statistics), the reported validation
   figures against the full test set evaluated locally, trace counts, steps.
2. The data-parallel step: a fixed global batch of 2B examples, split across
   the ranks, through the engine's TrainStep; rank 0 saves the weights to
   OUT/step_weights.npz so the test compares N processes with 1.
"""
import json
import os
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from engine import data, datasets, distributed
from engine import step as steps
from engine import train as engine_train
import models

GLOBAL_BATCH, STEPS = 16, 3


def engine_run(data_dir: str, model_dir: str) -> dict:
  config = engine_train.TrainConfig(
      dataset="fashion_mnist", data_dir=data_dir, random_flip=True,
      random_shift=0.1, model="wrn",
      model_params=dict(depth=10, width=1, dropout=0.1, weight_decay=1e-4),
      batch_size=16, epochs=2, steps_per_epoch=0, optimizer="sgd",
      base_lr=0.01, momentum=0.9, nesterov=True, seed=3, model_dir=model_dir,
      intra_op_threads=0, inter_op_threads=0, bind_cpus=True)
  result = engine_train.train(config)
  model = result.model

  flat = np.concatenate([v.numpy().ravel() for v in model.variables])
  everyone = hvd.allgather(tf.constant(flat[None]), name="weights").numpy()

  splits = datasets.load("fashion_mnist", data_dir)
  images, labels = splits.test.images, splits.test.labels
  logits = model(data.normalize(images, splits.info), training=False)
  full_loss = float(tf.reduce_mean(steps.cross_entropy(labels, logits)))
  full_accuracy = float(tf.reduce_mean(tf.cast(
      tf.argmax(logits, -1) == labels, tf.float64)))
  return {
      "max_weight_difference_across_ranks":
          float(np.abs(everyone - everyone[0]).max()),
      "reported_val_loss": result.history[-1]["val_loss"],
      "reported_val_accuracy": result.history[-1]["val_accuracy"],
      "full_test_loss": full_loss,
      "full_test_accuracy": full_accuracy,
      "train_traces": result.train_step.traces,
      "eval_traces": result.eval_step.traces,
      "global_step": result.history[-1]["global_step"],
      "history": result.history,
  }


def data_parallel_steps(out_dir: str) -> None:
  rng = np.random.default_rng(0)
  images = rng.normal(size=(STEPS, GLOBAL_BATCH, 28, 28, 1)).astype("float32")
  labels = rng.integers(0, 10, (STEPS, GLOBAL_BATCH))
  tf.keras.utils.set_random_seed(hvd.rank())  # different inits, then broadcast
  model = models.build("cnn", input_shape=(28, 28, 1), num_classes=10,
                       filters=4, dropout=0.0, weight_decay=1e-4)
  optimizer = tf.keras.optimizers.SGD(0.1, momentum=0.9)
  train_step = steps.TrainStep(model=model, optimizer=optimizer)
  distributed.broadcast_from_chief(model.variables)
  per_rank = GLOBAL_BATCH // hvd.size()
  mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)
  for i in range(STEPS):
    train_step(tf.constant(images[i, mine]), tf.constant(labels[i, mine]))
    if i == 0:
      distributed.broadcast_from_chief(model.variables + optimizer.variables)
  if distributed.is_chief():
    np.savez(os.path.join(out_dir, "step_weights.npz"),
             *[w.numpy() for w in model.trainable_weights])


def main(data_dir: str, out_dir: str) -> None:
  observed = engine_run(data_dir, os.path.join(out_dir, "model"))
  data_parallel_steps(out_dir)
  with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(observed, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
