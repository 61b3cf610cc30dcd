"""Run by tests/test_task_runs.py under `horovodrun -np 2`: every guarantee
the engine gives classifiers, for other tasks. Each rank writes what it
observed to OUT/rank<r>.json.

1. Regression on arrays of float targets, segmentation of Fashion-MNIST
   files' masks, their denoising (reconstruction), a GAN's own step
   (examples/dcgan.py) and CosmoFlow's regression of generated volumes
   from GZIP TFRecords staged to a node-local directory (all
   --deterministic): the weights after training, on every rank; the
   reported validation figures against the whole test split evaluated by
   this rank alone; and a run stopped after epoch 1 and resumed, against
   the run straight through.
2. Regression with a learning rate that diverges: the error every rank
   raises.
3. Volumes with a record that does not match the spec: the error every
   rank raises, and whether model_dir was made.
"""
import dataclasses
import json
import os
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from engine import datasets
from engine import train as engine_train
from engine.compute import metrics
from engine.errors import Diverged, UserError
from engine.input import data
from tests import fixtures


def weights(model) -> np.ndarray:
  return np.concatenate([v.numpy().ravel() for v in model.variables])


def whole_split_figures(result, config) -> dict:
  """The task's figures over the whole test split, by this rank alone."""
  task = result.eval_step.task
  splits = datasets.load(config.dataset, data_dir=config.data_dir,
                         model_dir=config.model_dir, labels=task.labels,
                         **config.data_params)
  totals = metrics.Totals("whole_split", task)
  for images, labels in data.eval_batches(splits.test, splits.info, rank=0,
                                          world_size=1, batch_size=7):
    inputs, targets = task.inputs_and_targets(images, labels)
    outputs = result.model(inputs, training=False)
    totals.update(targets, outputs, task.loss(targets, outputs))
  return totals.result_of(totals.local_sums()).figures


def straight_and_resumed(config, name: str) -> dict:
  """`config`'s run straight through, and stopped after epoch 1 and
  resumed: what the test compares."""
  straight = engine_train.train(config)
  flat = weights(straight.model)
  everyone = hvd.allgather(tf.constant(flat[None]), name=name).numpy()
  stopped = dataclasses.replace(
      config, epochs=1, model_dir=config.model_dir + "_resumed")
  engine_train.train(stopped)
  resumed = engine_train.train(dataclasses.replace(stopped,
                                                   epochs=config.epochs))
  return {
      "max_weight_difference_across_ranks":
          float(np.abs(everyone - everyone[0]).max()),
      "history": straight.history,
      "whole_split": whole_split_figures(straight, config),
      "resumed_weight_difference":
          float(np.abs(weights(resumed.model) - flat).max()),
  }


def regression(out_dir: str, arrays: str) -> dict:
  config = fixtures.train_config(
      dataset="arrays", data_dir=arrays, task="regression", model="cnn",
      model_params={**fixtures.train_config().model_params, "filters": 4},
      batch_size=4, epochs=3, base_lr=0.01, deterministic=True,
      progress="none", model_dir=os.path.join(out_dir, "regression"))
  observed = straight_and_resumed(config, "regression")
  try:
    engine_train.train(dataclasses.replace(
        config, optimizer="sgd", base_lr=1e12,
        model_dir=os.path.join(out_dir, "diverged")))
    observed["diverged"] = None
  except Diverged as e:
    observed["diverged"] = str(e)
  return observed


def segmentation(out_dir: str, fashion_mnist: str) -> dict:
  """Masks flipped and shifted with their images, BatchNorm (U-Net)."""
  return straight_and_resumed(fixtures.train_config(
      data_dir=fashion_mnist, task="segmentation", model="unet",
      model_params={**fixtures.train_config().model_params, "filters": 4},
      random_flip=True, random_shift=0.1, batch_size=8, epochs=2,
      steps_per_epoch=5, deterministic=True, progress="none",
      model_dir=os.path.join(out_dir, "segmentation")), "segmentation")


def reconstruction(out_dir: str, fashion_mnist: str) -> dict:
  """Each image's own noise, whatever rank and batch it is in."""
  return straight_and_resumed(fixtures.train_config(
      data_dir=fashion_mnist, task="reconstruction", model="unet",
      model_params={**fixtures.train_config().model_params, "filters": 4},
      task_params={**fixtures.train_config().task_params, "noise": 0.5},
      random_flip=True, batch_size=8, epochs=2, steps_per_epoch=5,
      deterministic=True, progress="none",
      model_dir=os.path.join(out_dir, "reconstruction")), "reconstruction")


def gan(out_dir: str, fashion_mnist: str) -> dict:
  """examples/dcgan.py: a task's own step, two models, two optimizers."""
  return straight_and_resumed(fixtures.train_config(
      data_dir=fashion_mnist, task="tests/workers/tiny_gan.py:TinyDCGAN",
      batch_size=8, epochs=2, steps_per_epoch=5, deterministic=True,
      progress="none", model_dir=os.path.join(out_dir, "gan")), "gan")


def volumes(out_dir: str, volumes_dir: str, damaged_dir: str) -> dict:
  """CosmoFlow's layout: log(1 + x), flips and transposes, staging."""
  defaults = fixtures.train_config()
  config = fixtures.train_config(
      dataset="tfrecord", data_dir=volumes_dir, task="regression",
      model="cosmoflow", model_params={**defaults.model_params, "filters": 2},
      data_params={**defaults.data_params, "log_transform": True},
      task_params={**defaults.task_params, "standardize_targets": False},
      random_flip=True, random_transpose=True,
      stage_dir=os.path.join(out_dir, "stage"), batch_size=4, epochs=2,
      base_lr=0.003, deterministic=True, progress="none",
      model_dir=os.path.join(out_dir, "volumes"))
  observed = straight_and_resumed(config, "volumes")
  damaged = dataclasses.replace(
      config, data_dir=damaged_dir,
      model_dir=os.path.join(out_dir, "damaged_run"))
  try:
    engine_train.train(damaged)
    observed["damaged"] = None
  except UserError as e:
    observed["damaged"] = str(e)
  observed["damaged_model_dir_made"] = os.path.exists(damaged.model_dir)
  return observed


def main(out_dir: str, arrays: str, fashion_mnist: str, volumes_dir: str,
         damaged_dir: str) -> None:
  observed = {"regression": regression(out_dir, arrays),
              "segmentation": segmentation(out_dir, fashion_mnist),
              "reconstruction": reconstruction(out_dir, fashion_mnist),
              "gan": gan(out_dir, fashion_mnist),
              "volumes": volumes(out_dir, volumes_dir, damaged_dir)}
  with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(observed, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
