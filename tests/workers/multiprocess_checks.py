"""Run by tests/test_multiprocess.py, under `horovodrun -np N` or alone.

Three checks in one launch, since each TensorFlow process takes seconds to
start. Each rank writes what it observed to OUT/rank<r>.json; the test
asserts on those files.

1. Real engine runs on generated files (Fashion-MNIST, and when given,
   CIFAR-10, TFRecords, synthetic data, and Fashion-MNIST again with a
   user's subclassed model, and with the performance and profiling
   options): afterwards, every rank's
   variables (including BatchNorm statistics), the reported validation
   figures against the full test set evaluated locally, trace counts, steps.
2. The engine's collectives on Keras 3 variables, and a stop one rank
   asks for, which the step agrees across ranks.
3. The data-parallel step: a fixed global batch of 2B examples, split across
   the ranks, through the engine's TrainStep; rank 0 saves the weights to
   OUT/step_weights_plain.npz so the test compares N processes with 1. On
   more than one process, the same with each performance option
   (STEP_VARIANTS), to OUT/step_weights_<variant>.npz.
"""
import json
import os
import re
import sys

import horovod.tensorflow as hvd
import numpy as np
import keras
import tensorflow as tf

from engine import datasets, distributed
from engine import train as engine_train
from engine.compute import ema, optimizers
from engine.compute import precision
from engine.compute import step as steps
from engine.loop import actions
from engine.tasks import classification
import models
from models import batch_norm
from tests import fixtures

GLOBAL_BATCH, STEPS = 16, 3
# TrainStep options (and a mixed precision mode) checked against the plain
# step of one process.
STEP_VARIANTS = {
    "accumulated": dict(accumulation_steps=2),
    # Each gradient reduced as the backward pass has it: the GPU default.
    "overlapped": dict(overlap_allreduce=True),
    "fp16_compressed": dict(compression="fp16"),
    "xla": dict(xla=True),
    "float16": dict(mixed_precision="float16"),
    "bfloat16": dict(mixed_precision="bfloat16"),
}


def engine_run(config) -> dict:
  """Trains with `config`; what this rank holds and reports afterwards
  (with --ema_decay, of the weights' average, which the run evaluated)."""
  # A script's own action every 2 steps: each rank's rank + 1, summed
  # across ranks at the step it ran at.
  action_runs = []
  def sum_ranks(at: actions.At) -> None:
    total = distributed.sum_across_ranks([at.rank + 1], name="action")
    action_runs.append([at.global_step, at.epoch, at.step, at.world_size,
                        float(total[0])])
  result = engine_train.train(config,
                              user_actions=[actions.Every(2, sum_ranks)])
  model = result.model
  flat = np.concatenate([v.numpy().ravel() for v in model.variables
                         + ema.variables(result.weight_average)])
  everyone = hvd.allgather(tf.constant(flat[None]), name="weights_" +
                           re.sub(r"\W", "_",
                                  config.training.model_dir)).numpy()
  with ema.averaged(result.weight_average):
    full_loss, full_accuracy = full_split_figures(model, config)
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
      "fused_batch_norms": batch_norm.fused(model),
      "weight_average_updates": (
          int(result.weight_average.updates.numpy())
          if result.weight_average else None),
      "history": result.history,
      "action_runs": action_runs,
      "horovod_cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"),
      "mpi_yield_when_idle": os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
      "threads_by_policy": threads_by_policy(),
  }


def threads_by_policy() -> dict:
  """How many of this process's threads run in each scheduling class."""
  names = {os.SCHED_OTHER: "normal", os.SCHED_IDLE: "idle"}
  counts = {}
  for thread in os.listdir("/proc/self/task"):
    try:
      policy = names.get(os.sched_getscheduler(int(thread)), "other")
    except ProcessLookupError:  # it ended since the listing
      continue
    counts[policy] = counts.get(policy, 0) + 1
  return counts


def full_split_figures(model, config) -> tuple[float, float]:
  """Loss and accuracy of the whole test split, computed by this rank alone."""
  splits = datasets.load(config.data.name, data_dir=config.data.dir,
                         model_dir=config.training.model_dir,
                         normalization=config.data.normalization,
                         **config.data.params)
  losses, correct = [], 0
  for images, labels in datasets.eval_batches(
      splits.test, splits.info, shard=datasets.Shard(0, 1), batch_size=64):
    logits = model(images, training=False)
    losses += classification.cross_entropy(labels, logits).numpy().tolist()
    correct += int(tf.reduce_sum(tf.cast(
        tf.argmax(logits, -1) == labels, tf.int32)))
  return float(np.mean(losses)), correct / len(losses)


def data_parallel_steps(out_dir: str, name: str = "plain",
                        mixed_precision: str = "none", **options) -> None:
  rng = np.random.default_rng(0)
  images = rng.normal(size=(STEPS, GLOBAL_BATCH, 28, 28, 1)).astype("float32")
  labels = rng.integers(0, 10, (STEPS, GLOBAL_BATCH))
  keras.utils.set_random_seed(hvd.rank())  # different inits, then broadcast
  with precision.policy(mixed_precision):
    model = models.build("cnn", input_shape=(28, 28, 1), num_classes=10,
                         filters=4, dropout=0.0, weight_decay=1e-4)
  optimizer = precision.with_loss_scaling(
      keras.optimizers.SGD(0.1, momentum=0.9), mixed_precision)
  train_step = steps.TrainStep(model=model, optimizer=optimizer, **options)
  distributed.broadcast_from_chief(model.variables)
  per_rank = GLOBAL_BATCH // hvd.size()
  mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)
  for i in range(STEPS):
    fixtures.one_step(train_step, tf.constant(images[i, mine]),
                      tf.constant(labels[i, mine]))
    if i == 0:
      distributed.broadcast_from_chief(model.variables +
                                       optimizers.state(optimizer))
  weights = np.concatenate([w.numpy().ravel() for w in model.trainable_weights])
  everyone = hvd.allgather(tf.constant(weights[None]), name=name).numpy()
  if distributed.is_chief():
    np.savez(os.path.join(out_dir, f"step_weights_{name}.npz"),
             weights=weights, traces=train_step.traces,
             max_difference_across_ranks=np.abs(everyone - everyone[0]).max())


def keras_variables_across_ranks() -> dict:
  """Keras 3 variables, which lack the `ref()` Horovod keys variables by
  (horovod/horovod#4290), through the engine's collectives: each rank's
  kernel and bias hold rank + 1; the kernel broadcast from rank 0, the
  bias averaged."""
  layer = keras.layers.Dense(2)
  layer.build((None, 3))
  kernel, bias = layer.trainable_variables
  kernel.assign(np.full((3, 2), hvd.rank() + 1.0, "float32"))
  bias.assign(np.full((2,), hvd.rank() + 1.0, "float32"))
  distributed.broadcast_from_chief([kernel])
  distributed.average_across_ranks([bias])
  return {"broadcast": kernel.numpy().tolist(),
          "averaged": bias.numpy().tolist()}


def stop_requests_across_ranks() -> list:
  """What the step returns when rank 1 alone asks to stop, then when no
  rank does: the stop is every rank's or none's."""
  model = models.build("cnn", input_shape=(28, 28, 1), num_classes=10,
                       filters=4, dropout=0.0, weight_decay=0.0)
  train_step = steps.TrainStep(model=model,
                               optimizer=keras.optimizers.SGD(0.1))
  images = tf.zeros((2, 28, 28, 1))
  labels = tf.zeros((2,), tf.int64)
  return [fixtures.one_step(train_step, images, labels,
                            stop_requested=hvd.rank() == 1).stop_agreed,
          fixtures.one_step(train_step, images, labels).stop_agreed]


def main(out_dir: str, fashion_mnist_dir: str, cifar10_dir: str = "",
         tfrecord_dir: str = "") -> None:
  """Without CIFAR-10 and TFRecord directories (the 1-process reference),
  only Fashion-MNIST is trained."""
  model_dir = os.path.join(out_dir, "model")
  observed = engine_run(fixtures.train_config(
      data=dict(dir=fashion_mnist_dir),
      model=dict(name="wrn", params=dict(depth=10, width=1, dropout=0.1,
                                         weight_decay=1e-4)),
      training=dict(batch_size=16, epochs=2, seed=3, model_dir=model_dir,
                    progress="none"),
      optimization=dict(optimizer="sgd", base_lr=0.01, nesterov=True)))
  observed["datasets"] = {}
  if cifar10_dir and tfrecord_dir:
    defaults = fixtures.train_config()
    data_params = defaults.data.params
    each = {
        "cifar10": dict(data=dict(dir=cifar10_dir, random_shift=0.125)),
        # With the weights' average (--ema_decay), shared across ranks.
        "synthetic": dict(optimization=dict(ema_decay=0.9), data=dict(params={
            **data_params, "train_examples": 40, "test_examples": 9,
            "image_size": 16, "channels": 3})),
        "tfrecord": dict(data=dict(dir=tfrecord_dir, params={
            **data_params, "image_size": 16, "num_classes": 10})),
    }
    # ResNet-9 for its BatchNorm statistics, at width 4: ResNetSmall's 26
    # layers took 3-4 times as long to build, trace and export, and
    # tests/workers/own_data_run.py trains it on two processes already.
    for name, changes in each.items():
      observed["datasets"][name] = engine_run(fixtures.train_config(
          data=dict(name=name),
          model=dict(name="resnet9",
                     params={**defaults.model.params, "filters": 4}),
          training=dict(model_dir=os.path.join(out_dir, name), epochs=2,
                        steps_per_epoch=3, batch_size=4, progress="none"),
          optimization=dict(optimizer="lamb", base_lr=0.01,
                            warmup_epochs=1.0, lr_schedule="cosine"),
      ).replace(**changes))
    # A user's subclassed model (tests/fixtures.py), its Keras
    # BatchNormalization trained through the fused kernel.
    code_dir = fixtures.write_user_code(os.path.join(out_dir, "code"))
    observed["datasets"]["users_model"] = engine_run(fixtures.train_config(
        data=dict(dir=fashion_mnist_dir),
        model=dict(name=f"{code_dir}/users_model.py:build_subclassed"),
        training=dict(model_dir=os.path.join(out_dir, "users_model"),
                      epochs=2, steps_per_epoch=3, batch_size=4,
                      progress="none")))
    observed["options"] = engine_run(fixtures.train_config(
        data=dict(dir=fashion_mnist_dir),
        model=dict(params={**defaults.model.params, "filters": 8}),
        training=dict(model_dir=os.path.join(out_dir, "options"), epochs=2,
                      batch_size=8, progress="none"),
        performance=dict(grad_accum_steps=2, mixed_precision="float16",
                         gradient_compression="fp16"),
        profiling=dict(profile_steps=(2, 3), profile_all_ranks=True)))
  observed["keras_variables"] = keras_variables_across_ranks()
  observed["stops"] = stop_requests_across_ranks()
  # Each rank's own, of its own size: on rank 0, every rank's in order.
  observed["gathered_on_chief"] = distributed.gathered_on_chief(
      {"rank": hvd.rank(), "series": list(range(hvd.rank() + 2))},
      name="gathered_on_chief")
  data_parallel_steps(out_dir)
  if hvd.size() > 1:
    for name, options in STEP_VARIANTS.items():
      data_parallel_steps(out_dir, name, **options)
  with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(observed, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
