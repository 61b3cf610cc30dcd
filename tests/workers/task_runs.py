"""Run by tests/test_task_runs.py under `horovodrun -np 2`: every guarantee
the engine gives classifiers, for other tasks. Each rank writes what it
observed to OUT/rank<r>.json.

1. Regression on arrays of float targets, segmentation of Fashion-MNIST
   files' masks, their denoising (reconstruction), a GAN's own step
   (examples/dcgan.py) and CosmoFlow's regression of generated volumes
   from GZIP TFRecords staged to a node-local directory (all
   --deterministic; the volumes' second block by our Winograd kernels):
   the weights after training, on every rank; the
   reported validation figures against the whole test split evaluated by
   this rank alone; and a run stopped after epoch 1 and resumed, against
   the run straight through.
2. Regression with a learning rate that diverges: the error every rank
   raises.
3. Volumes with a record that does not match the spec: the error every
   rank raises, and whether model_dir was made.
"""
import json
import os
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from engine import datasets
from engine import train as engine_train
from engine.compute import metrics
from engine.core.errors import Diverged, UserError
from models import winograd3d
from tests import fixtures


def weights(model) -> np.ndarray:
  return np.concatenate([v.numpy().ravel() for v in model.variables])


def whole_split_figures(result, config) -> dict:
  """The task's figures over the whole test split, by this rank alone."""
  task = result.eval_step.task
  splits = datasets.load(config.data.name, data_dir=config.data.dir,
                         model_dir=config.training.model_dir,
                         labels=task.labels, **config.data.params)
  totals = metrics.Totals("whole_split", task)
  for images, labels in datasets.eval_batches(
      splits.test, splits.info, shard=datasets.Shard(0, 1), batch_size=7):
    inputs, targets = task.inputs_and_targets(images, labels)
    outputs = result.model(inputs, training=False)
    totals.update(targets, outputs, task.loss(targets, outputs))
  return totals.result_of(totals.local_sums()).figures


def straight_and_resumed(config, name: str, observe=None) -> dict:
  """`config`'s run straight through, and stopped after epoch 1 and
  resumed: what the test compares, and what `observe` gives of the
  straight run's model."""
  straight = engine_train.train(config)
  flat = weights(straight.model)
  everyone = hvd.allgather(tf.constant(flat[None]), name=name).numpy()
  stopped = config.replace(training=dict(
      epochs=1, model_dir=config.training.model_dir + "_resumed"))
  engine_train.train(stopped)
  resumed = engine_train.train(stopped.replace(
      training=dict(epochs=config.training.epochs)))
  return {
      "max_weight_difference_across_ranks":
          float(np.abs(everyone - everyone[0]).max()),
      "history": straight.history,
      "whole_split": whole_split_figures(straight, config),
      "resumed_weight_difference":
          float(np.abs(weights(resumed.model) - flat).max()),
      **(observe(straight.model) if observe else {}),
  }


def regression(out_dir: str, arrays: str) -> dict:
  config = fixtures.train_config(
      data=dict(name="arrays", dir=arrays), task=dict(name="regression"),
      model=dict(name="cnn", params={
          **fixtures.train_config().model.params, "filters": 4}),
      training=dict(batch_size=4, epochs=3, progress="none",
                    model_dir=os.path.join(out_dir, "regression")),
      optimization=dict(base_lr=0.01), devices=dict(deterministic=True))
  observed = straight_and_resumed(config, "regression")
  try:
    engine_train.train(config.replace(
        optimization=dict(optimizer="sgd", base_lr=1e12),
        training=dict(model_dir=os.path.join(out_dir, "diverged"))))
    observed["diverged"] = None
  except Diverged as e:
    observed["diverged"] = str(e)
  return observed


def segmentation(out_dir: str, fashion_mnist: str) -> dict:
  """Masks flipped and shifted with their images, BatchNorm (U-Net)."""
  return straight_and_resumed(fixtures.train_config(
      data=dict(dir=fashion_mnist, random_flip=True, random_shift=0.1),
      task=dict(name="segmentation"),
      model=dict(name="unet", params={
          **fixtures.train_config().model.params, "filters": 4}),
      training=dict(batch_size=8, epochs=2, steps_per_epoch=5,
                    progress="none",
                    model_dir=os.path.join(out_dir, "segmentation")),
      devices=dict(deterministic=True)), "segmentation")


def reconstruction(out_dir: str, fashion_mnist: str) -> dict:
  """Each image's own noise, whatever rank and batch it is in."""
  defaults = fixtures.train_config()
  return straight_and_resumed(fixtures.train_config(
      data=dict(dir=fashion_mnist, random_flip=True),
      task=dict(name="reconstruction",
                params={**defaults.task.params, "noise": 0.5}),
      model=dict(name="unet", params={**defaults.model.params, "filters": 4}),
      training=dict(batch_size=8, epochs=2, steps_per_epoch=5,
                    progress="none",
                    model_dir=os.path.join(out_dir, "reconstruction")),
      devices=dict(deterministic=True)), "reconstruction")


def gan(out_dir: str, fashion_mnist: str) -> dict:
  """examples/dcgan.py: a task's own step, two models, two optimizers."""
  return straight_and_resumed(fixtures.train_config(
      data=dict(dir=fashion_mnist),
      task=dict(name="tests/workers/tiny_gan.py:TinyDCGAN"),
      training=dict(batch_size=8, epochs=2, steps_per_epoch=5,
                    progress="none", model_dir=os.path.join(out_dir, "gan")),
      devices=dict(deterministic=True)), "gan")


def graphs_calling(module, name: str) -> list:
  """The graphs `module.name` adds its ops to from now on (each a
  tf.function's, as traced: the train step's is `_plain_step`)."""
  graphs, original = [], getattr(module, name)
  def recorded(*args, **kwargs):
    graphs.append(tf.compat.v1.get_default_graph())
    return original(*args, **kwargs)
  setattr(module, name, recorded)
  return graphs


def volumes(out_dir: str, volumes_dir: str, damaged_dir: str) -> dict:
  """CosmoFlow's layout: log(1 + x), flips and transposes, staging."""
  convolved_in = graphs_calling(winograd3d, "conv3d")
  defaults = fixtures.train_config()
  config = fixtures.train_config(
      data=dict(name="tfrecord", dir=volumes_dir,
                params={**defaults.data.params, "log_transform": True},
                random_flip=True, random_transpose=True,
                stage_dir=os.path.join(out_dir, "stage")),
      task=dict(name="regression", params={**defaults.task.params,
                                           "standardize_targets": False}),
      # 16 filters: the second block (8^3 voxels, 16 channels in) trains
      # through our Winograd kernels (models/winograd3d.py).
      model=dict(name="cosmoflow",
                 params={**defaults.model.params, "filters": 16}),
      training=dict(batch_size=4, epochs=2, progress="none",
                    model_dir=os.path.join(out_dir, "volumes")),
      optimization=dict(base_lr=0.003), devices=dict(deterministic=True))
  observed = straight_and_resumed(config, "volumes", lambda model: {
      "by_winograd": [layer._by_winograd for layer in model.layers
                      if hasattr(layer, "_by_winograd")]})
  # Our kernels' ops in the train step's graph that ran, forward and
  # backward (the gradients the tape took through them).
  observed["winograd_ops_in_step"] = sorted({
      op.type for graph in convolved_in if graph.name == "_train_steps"
      for op in graph.get_operations() if op.type.startswith("Winograd3D")})
  damaged = config.replace(
      data=dict(dir=damaged_dir),
      training=dict(model_dir=os.path.join(out_dir, "damaged_run")))
  try:
    engine_train.train(damaged)
    observed["damaged"] = None
  except UserError as e:
    observed["damaged"] = str(e)
  observed["damaged_model_dir_made"] = os.path.exists(
      damaged.training.model_dir)
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
