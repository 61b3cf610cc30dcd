"""Input pipeline: this rank's batches of a split, for training and for
evaluation, whatever the data set (see `engine/datasets`).

Each split is a source of one of four kinds (engine/datasets/sources.py):
examples held in memory (`Examples`), arrays on disk read by rows
(`ArrayRows`), image files decoded as read (`ImageFiles`), and TFRecord
files streamed from disk (`ImageRecords`, ImageNet's encoded images, and
`FeatureRecords`, the arrays of declared features such as CosmoFlow's
volumes). Each kind shards, shuffles, batches and augments as it reads,
and gives its batches as stored. Here, and only here, every batch of
every kind and split is normalized (`_normalized`), once; then training's
are resized (progressive resizing), and all are prefetched. Three
properties matter more than speed, and every kind keeps them:

* Every rank runs the same number of steps each epoch. Horovod's allreduce
  waits for all ranks, so one rank with an extra batch would hang the job.
  `steps_per_epoch` is fixed from the global batch, and a rank whose shard
  is too short for it starts another pass over its shard.
* Ranks see disjoint data. Rank r keeps examples r, r + N, r + 2N, ...,
  the selection `tf.data.Dataset.shard(N, r)` makes, and shuffles only
  those (for arrays on disk and image files, it reads only those); from
  TFRecord files, rank r reads files r, r + N, ...
* An epoch's batches depend only on (seed, epoch, rank, size): shuffles are
  stateless permutations keyed by (seed, epoch), and augmentation uses
  stateless random ops keyed by epoch, step and rank. A run is reproducible,
  every epoch differs from the last, no two ranks augment alike, and a run
  can start at any epoch, and at any step of it.

Training reads one stream for the whole run, epoch after epoch, through one
iterator: prefetching carries on across epoch ends, and no iterator is torn
down between epochs.
"""
import tensorflow as tf

from engine.core.errors import UserError
from engine.datasets import DatasetInfo, Epochs, Shard, Source, sources
from engine.datasets.augmentation import Augmentation

# Fixed parallelism rather than tf.data's autotuning: one batch in flight
# and two ready keep the step fed (sources.PARALLEL_BATCHES). Autotuning
# bought nothing and cost a lot: its background optimizer competes with
# training for the cores, and an iterator's teardown waits for it
# (measured: 1.5-6 s at each epoch end and at exit on 2 processes sharing
# 2 cores).
PREFETCH_BATCHES = 2


def _without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


def steps_per_epoch(*, num_train: int, batch_size: int, world_size: int,
                    requested: int) -> int:
  """`requested` if set, else as many global batches as the data holds."""
  if requested:
    return requested
  global_batch = batch_size * world_size
  steps = num_train // global_batch
  if steps == 0:
    raise UserError(
        f"--batch_size={batch_size} on {world_size} processes is a global "
        f"batch of {global_batch}, more than the {num_train} training "
        "examples; lower --batch_size")
  return steps


def train_stream(source: Source, info: DatasetInfo, *, shard: Shard,
                 epochs: Epochs, augmentation: Augmentation,
                 first_epoch: int = 0, first_step: int = 0) -> tf.data.Dataset:
  """This rank's training batches from `first_epoch` on, `epochs.steps`
  per epoch.

  Normalized float32 images (or volumes) and their labels (int64 class
  ids, float targets, or masks flipped and shifted with their images), one
  stream for the whole run, augmented as `augmentation` says; with its
  `resizing`, the images of the first epochs are made smaller (`_resized`).
  A run resumed mid-epoch starts at `first_step` of `first_epoch`, with the
  very batches an uninterrupted run would have had there.
  """
  augmentation.check(info.image_shape)
  batches = _normalized(info, source.train_batches(
      info, shard=shard, epochs=epochs, augmentation=augmentation,
      first_epoch=first_epoch, first_step=first_step))
  if augmentation.resizing:
    batches = _resized(batches, augmentation.resizing, steps=epochs.steps,
                       first_epoch=first_epoch, first_step=first_step)
  return _without_autotune(batches.prefetch(PREFETCH_BATCHES))


def _resized(batches: tf.data.Dataset, resizing: tuple, *, steps: int,
             first_epoch: int, first_step: int) -> tf.data.Dataset:
  """Progressive resizing (fast.ai's; Touvron et al. 2019, "Fixing the
  train-test resolution discrepancy"): each batch of an epoch up to a
  stage's last epoch (1-based) resized to that stage's side, later ones
  as they are. The epoch follows from the batch's place in the stream, so
  a resumed run resizes exactly as the run it continues. Area-weighted
  (antialiased) so that a small image is the large one seen from further
  away, not a sample of its pixels."""
  last_epochs = tf.constant([last for _, last in resizing], tf.int64)
  sides = tf.constant([side for side, _ in resizing], tf.int32)

  def resized(index, batch):
    images, labels = batch
    epoch = first_epoch + (first_step + index) // steps  # 0-based
    stage = tf.searchsorted(last_epochs, [epoch], side="right")[0]
    return tf.cond(
        stage < len(resizing),
        lambda: tf.image.resize(images, [sides[stage], sides[stage]],
                                antialias=True),
        lambda: images), labels

  return batches.enumerate().map(resized,
                                 num_parallel_calls=sources.PARALLEL_BATCHES)


def eval_batches(source: Source, info: DatasetInfo, *, shard: Shard,
                 batch_size: int) -> tf.data.Dataset:
  """This rank's share of the whole split, each example exactly once,
  normalized.

  No padding and no repetition: the last batch may be short, and ranks may
  hold more examples than others. Figures are reduced as sums and counts, so
  the result is exactly the whole split's.
  """
  batches = _normalized(info, source.eval_batches(info, shard=shard,
                                                   batch_size=batch_size))
  return _without_autotune(batches.prefetch(PREFETCH_BATCHES))


def _normalized(info: DatasetInfo, batches: tf.data.Dataset
                ) -> tf.data.Dataset:
  """Batches as stored, normalized as the model receives them
  (DatasetInfo.normalized): the one place any batch is. Training's after
  their augmentation, which moves stored values (a shift fills its border
  with a stored value, or zero) and before progressive resizing, which
  averages normalized ones."""
  return batches.map(lambda images, labels: (info.normalized(images), labels),
                     num_parallel_calls=sources.PARALLEL_BATCHES)
