r"""Keras `fit` trained by an engine recipe: the engine's rival to a target.

bench/time_to_accuracy.py races the engine against what a Keras user with
Horovod's callbacks writes for the same recipe. Given the engine's flags (a
flagfile from flags/), this trains with `model.fit` and
`horovod.tensorflow.keras`, and gives Keras every lever the recipe pulls:
- the same model, built by the engine's registry, under the same Keras
  precision policy;
- the same batches: the engine's own input pipeline (shard by rank,
  shuffle, augment, normalize), so data is not what differs;
- the same optimizer and learning-rate schedule object (warmup, decay, rate
  scaled with the processes), wrapped in `hvd.DistributedOptimizer`;
- label smoothing through `CategoricalCrossentropy(label_smoothing=...)`;
- for --task=segmentation, per-pixel `SparseCategoricalCrossentropy` and
  Keras' `MeanIoU` as its metric;
- for --task=regression, Keras' MSE, MAE or Huber loss (--loss) on the
  targets as the task's model predicts them (standardized, or as stored),
  and Keras' `MeanAbsoluteError` as its metric: CosmoFlow's reference
  (mlcommons/hpc) trains this way;
- a moving average of the weights through the optimizer's own `use_ema`;
- Horovod's callbacks: rank 0's weights broadcast, metrics averaged;
- --steps_per_call as Keras' `steps_per_execution`.

After each epoch a callback evaluates the test split as the engine does
(BatchNorm statistics averaged across ranks, the averaged weights swapped
in, the views --eval_flip and --eval_shift ask for, each rank its
shard, summed exactly) and rank 0 appends a record to
`--model_dir`/metrics.jsonl, in the engine's shape, so engine.runs reads
both alike:
`epoch`, the task's `val_<figure>`s, `images_per_sec` (training steps
only) and
`cumulative_seconds` (training and evaluation since `fit` began, as the
engine's clock counts training, evaluation and checkpoints).

  horovodrun --gloo -np 2 .venv/bin/python -m bench.keras_recipe \
    --flagfile=flags/fashion_mnist_fast.cfg --model_dir=/tmp/keras_run
"""
import functools
import json
import os
import time

from absl import app
import horovod.tensorflow.keras as hvd
import keras
import tensorflow as tf

from engine import build
from engine import cli
from engine import distributed
from engine.compute import optimizers
from engine.compute import eval_step as eval_steps
from engine.core import run_files
from engine.datasets import Shard
from engine import datasets
from engine.tasks import Regression, Segmentation
from flags import config_from_flags


def main(argv):
  del argv
  config = config_from_flags()
  prepared = build.prepare(config)
  world, splits, task, model = (prepared.world, prepared.splits,
                                prepared.task, prepared.model)
  training, optimization = config.training, config.optimization
  stream = datasets.TrainingStream.of(config, splits, rank=world.rank,
                                      world_size=world.size, resizing=False)
  steps_per_epoch = stream.steps_per_epoch
  batches, loss, metric = _as_keras_trains(stream.batches(), task,
                                           splits.info, optimization)
  learning_rate = build.learning_rate_schedule(config)
  learning_rate.set_world(world_size=world.size,
                          steps_per_epoch=steps_per_epoch)
  # hvd.DistributedOptimizer rebuilds the optimizer from its config, which
  # cannot carry the schedule object: it is set on the rebuilt one.
  optimizer = optimizers.build(optimization.optimizer, learning_rate=0.0,
                               momentum=optimization.momentum,
                               nesterov=optimization.nesterov)
  # Keras' own average; the optimizer's config carries these two.
  if optimization.ema_decay:
    optimizer.use_ema = True
    optimizer.ema_momentum = optimization.ema_decay
  optimizer = hvd.DistributedOptimizer(optimizer)
  optimizer.learning_rate = learning_rate
  # --steps_per_call as Keras' own: that many steps in one call of its
  # train function.
  model.compile(
      optimizer=optimizer,
      loss=loss, metrics=[metric],
      steps_per_execution=config.performance.steps_per_call)
  model.fit(batches, epochs=training.epochs, steps_per_epoch=steps_per_epoch,
            verbose=0, callbacks=[
                hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                hvd.callbacks.MetricAverageCallback(),
                _EvaluateAndRecord(config, world, splits, task,
                                   images_per_epoch=(steps_per_epoch
                                                     * stream.global_batch))])


def _as_keras_trains(batches, task, info, optimization):
  """(batches, loss, metric) as a Keras user writes them for the task:
  one-hot labels, standardized targets or masks."""
  if isinstance(task, Segmentation):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return batches, loss, keras.metrics.MeanIoU(
        info.num_classes, sparse_y_pred=False, name="train_metric")
  if isinstance(task, Regression):
    loss = {"mse": keras.losses.MeanSquaredError(),
            "mae": keras.losses.MeanAbsoluteError(),
            "huber": keras.losses.Huber()}[task.loss_name]
    return batches.map(lambda images, labels: (
        images, task.standardized(labels))), loss, (
            keras.metrics.MeanAbsoluteError(name="train_metric"))
  loss = keras.losses.CategoricalCrossentropy(
      from_logits=True, label_smoothing=optimization.label_smoothing)
  return batches.map(lambda images, labels: (
      images, tf.one_hot(labels, info.num_classes))), loss, (
          keras.metrics.CategoricalAccuracy(name="train_metric"))


class _EvaluateAndRecord(keras.callbacks.Callback):
  """The engine's evaluation after each epoch, and its record, timed."""

  def __init__(self, config, world, splits, task, *,
               images_per_epoch: int):
    super().__init__()
    self._config = config
    self._world = world
    self._splits = splits
    self._task = task
    self._images_per_epoch = images_per_epoch
    self._records = os.path.join(config.training.model_dir,
                                 run_files.METRICS_FILE)
    self._started = self._epoch_started = 0.0
    self._eval_step = None

  def on_train_begin(self, logs=None):
    self._started = time.perf_counter()
    self._eval_step = eval_steps.EvalStep(
        model=self.model, task=self._task,
        image_shape=self._splits.info.image_shape,
        flip=self._config.data.eval_flip, shift=build.eval_shift_pixels(
            self._config, self._splits.info.image_shape))
    if distributed.is_chief():
      os.makedirs(self._config.training.model_dir, exist_ok=True)
      open(self._records, "w").close()  # a rerun starts afresh

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch_started = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    train_seconds = time.perf_counter() - self._epoch_started
    distributed.average_across_ranks(self.model.non_trainable_variables)
    own = self.model.get_weights()
    if self._config.optimization.ema_decay:
      self.model.optimizer.finalize_variable_values(
          self.model.trainable_variables)
    val = eval_steps.evaluate(self._eval_step, datasets.eval_batches(
        self._splits.test, self._splits.info,
        shard=Shard(self._world.rank, self._world.size),
        batch_size=self._config.training.batch_size))
    self.model.set_weights(own)
    record = {"epoch": epoch + 1, "epochs": self._config.training.epochs,
              # Keras' own figure, averaged over ranks by Horovod's callback.
              "train_keras_metric": float(logs["train_metric"]),
              **{f"val_{name}": value for name, value in val.figures.items()},
              "best_metric": f"val_{self._task.best_metric}",
              "images_per_sec": self._images_per_epoch / train_seconds,
              "train_seconds": train_seconds,
              "cumulative_seconds": time.perf_counter() - self._started,
              "world_size": self._world.size}
    if distributed.is_chief():
      with open(self._records, "a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
  app.run(main, flags_parser=functools.partial(cli.parse_flags,
                                              program="bench.keras_recipe"))
