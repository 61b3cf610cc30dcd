r"""The Horovod lab's recipe: Keras `model.fit` with horovod.tensorflow.keras.

What users of the lab (shared/seeds) trained with before the engine, made
comparable with it: the benchmark's model, batch, data and optimizer (Adam,
rate x processes), no augmentation, no validation. The lab's steps, in
order: initialize Horovod and place the process; shard the data by rank;
scale the rate; wrap the optimizer in `hvd.DistributedOptimizer`; broadcast
rank 0's initial weights; average the metrics at epoch ends; narrate on rank
0 only. Launched like the engine:

  horovodrun --gloo -np 2 .venv/bin/python -m bench.keras_fit --dataset=synthetic \
    --records=/tmp/keras_fit.jsonl

With TensorFlow 2.15 (Keras 2.15) Horovod 0.28.1's Keras DistributedOptimizer
takes the current `keras.optimizers.Adam` (the engine runs its update in
one kernel); no legacy optimizer is needed. `_check_weights_agree` proves after training
that the gradients really were averaged.
"""
from absl import app
from absl import flags
import horovod.tensorflow.keras as hvd
import numpy as np
import keras
import tensorflow as tf

from bench import epochs
from bench import workload
from engine import distributed

FLAGS = flags.FLAGS
workload.define_worker_flags()
# What a tf.data user shuffles through: a sixth of the training set.
SHUFFLE_BUFFER = 10000


def main(argv):
  del argv
  # The lab's step 1 (hvd.init(), one device per process) through the
  # engine's own set-up: on CPU it also binds each process to its share of
  # the cores, sizes the thread pools and sets Horovod's cycle time,
  # exactly as the engine does, so the comparison is of the training loops,
  # not of those settings.
  world = distributed.init()
  splits = workload.load(FLAGS.dataset)
  info = splits.info
  batches = _input_pipeline(splits.train, info, rank=world.rank,
                            world_size=world.size,
                            batch_size=FLAGS.batch_size)
  model = workload.build_model(info)
  optimizer = hvd.DistributedOptimizer(
      keras.optimizers.Adam(workload.BASE_LR * hvd.size()))
  model.compile(
      optimizer=optimizer, metrics=["accuracy"],
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  timer = epochs.EpochTimer(
      FLAGS.records,
      images_per_epoch=FLAGS.steps_per_epoch * FLAGS.batch_size * world.size,
      world_size=world.size, intra_op_threads=world.intra_op_threads,
      inter_op_threads=world.inter_op_threads, chief=distributed.is_chief())
  callbacks = [
      hvd.callbacks.BroadcastGlobalVariablesCallback(0),
      hvd.callbacks.MetricAverageCallback(),
      # Last, so an epoch's time includes the metrics' allreduce, as the
      # engine's does.
      epochs.TimeEpochs(timer),
  ]
  model.fit(batches, epochs=FLAGS.epochs,
            steps_per_epoch=FLAGS.steps_per_epoch, callbacks=callbacks,
            verbose=1 if distributed.is_chief() else 0)
  _check_weights_agree(model)


def _input_pipeline(examples, info, *, rank: int, world_size: int,
                    batch_size: int) -> tf.data.Dataset:
  """tf.data as a Keras user writes it: shard by rank, shuffle, batch.

  Normalized with the engine's statistics; tf.data's autotuning sizes the
  parallelism, as its guide recommends.
  """
  dataset = tf.data.Dataset.from_tensor_slices(
      (examples.images, examples.labels)).shard(world_size, rank)
  dataset = (dataset.repeat()
             .shuffle(SHUFFLE_BUFFER, seed=workload.SEED)
             .batch(batch_size, drop_remainder=True)
             .map(lambda images, labels: (info.normalized(images), labels),
                  num_parallel_calls=tf.data.AUTOTUNE))
  return dataset.prefetch(tf.data.AUTOTUNE)


def _check_weights_agree(model: keras.Model) -> None:
  """Every rank must end with rank 0's weights.

  Ranks train on different shards; only averaged gradients keep them
  equal. Were the optimizer not averaging (a Keras/Horovod mismatch), the
  figures would be of N independent trainings, not of data parallelism.
  """
  flat = np.concatenate([w.ravel() for w in model.get_weights()])
  everyone = hvd.allgather(tf.constant(flat[None]), name="weights").numpy()
  spread = float(np.max(np.abs(everyone - everyone[0])))
  if spread > 1e-6:
    raise SystemExit(f"keras_fit: weights differ across ranks by {spread:g} "
                     "after training: hvd.DistributedOptimizer did not "
                     "average the gradients")


if __name__ == "__main__":
  app.run(main)
