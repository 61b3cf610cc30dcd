import numpy as np
import pytest
import tensorflow as tf

from engine.core.errors import UserError
from engine.datasets import Augmentation, DatasetInfo, Epochs, Examples, Shard
from engine.datasets import sources
from engine import datasets

NUM = 103
INFO = DatasetInfo(name="t", image_shape=(4, 6, 1), num_classes=10,
                   num_train=NUM, num_test=NUM, mean=(0.0,), std=(1.0,))


def numbered_examples():
  """Example i is an image filled with i % 256 and label i, to trace it."""
  labels = np.arange(NUM, dtype=np.int64)
  images = np.broadcast_to((labels % 256).astype(np.uint8)[:, None, None, None],
                           (NUM, 4, 6, 1))
  return Examples(np.ascontiguousarray(images), labels)


def train_labels(rank, world_size, epoch, *, steps, batch_size=8, seed=0):
  """The labels of each batch of `epoch`, from a stream started there."""
  batches = datasets.train_stream(
      numbered_examples(), INFO,
      shard=Shard(rank, world_size),
      epochs=Epochs(batch_size=batch_size, steps=steps, seed=seed),
      augmentation=Augmentation(flip=False, shift=0.0),
      first_epoch=epoch)
  return [labels.numpy().tolist() for _, labels in batches.take(steps)]


def test_steps_per_epoch_is_floor_of_examples_over_global_batch():
  assert datasets.steps_per_epoch(num_train=60000, batch_size=128, world_size=2,
                              requested=0) == 234
  assert datasets.steps_per_epoch(num_train=60000, batch_size=128, world_size=2,
                              requested=7) == 7


def test_global_batch_larger_than_the_data_is_an_error():
  with pytest.raises(UserError, match="global batch of 120.*lower --batch"):
    datasets.steps_per_epoch(num_train=100, batch_size=60, world_size=2,
                         requested=0)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_eval_shards_are_disjoint_and_cover_the_split(world_size):
  seen = []
  for rank in range(world_size):
    batches = datasets.eval_batches(numbered_examples(), INFO,
                                shard=Shard(rank, world_size), batch_size=10)
    seen += [label for _, labels in batches for label in labels.numpy()]
  assert sorted(seen) == list(range(NUM))


def test_train_shards_are_disjoint_and_every_rank_runs_the_same_steps():
  world_size, batch_size = 3, 8
  steps = datasets.steps_per_epoch(num_train=NUM, batch_size=batch_size,
                               world_size=world_size, requested=0)
  per_rank = [train_labels(rank, world_size, epoch=0, steps=steps)
              for rank in range(world_size)]
  assert [len(batches) for batches in per_rank] == [steps] * world_size
  flat = [set(sum(batches, [])) for batches in per_rank]
  assert all(len(f) == steps * batch_size for f in flat)  # no repeats
  assert not (flat[0] & flat[1] or flat[0] & flat[2] or flat[1] & flat[2])
  assert flat[1] <= set(range(1, NUM, 3))  # rank 1 keeps its own shard


def test_the_stream_runs_epoch_after_epoch_and_can_start_at_any():
  stream = datasets.train_stream(
      numbered_examples(), INFO,
      shard=Shard(0, 2),
      epochs=Epochs(batch_size=8, steps=6, seed=0),
      augmentation=Augmentation(flip=False, shift=0.0),
      first_epoch=0)
  labels = [l.numpy().tolist() for _, l in stream.take(18)]
  assert labels[6:12] == train_labels(0, 2, epoch=1, steps=6)
  assert labels[12:] == train_labels(0, 2, epoch=2, steps=6)


def test_resizing_gives_each_epoch_its_side_and_a_resume_its_batches():
  def stream(first_epoch, first_step=0):
    return datasets.train_stream(
        numbered_examples(), INFO,
        shard=Shard(0, 2),
        epochs=Epochs(batch_size=8, steps=3, seed=0),
        augmentation=Augmentation(flip=False, shift=0.0,
                                  resizing=((2, 1), (3, 2))),
        first_epoch=first_epoch,
        first_step=first_step)

  batches = list(stream(0).take(12))
  assert [tuple(images.shape[1:3]) for images, _ in batches] == (
      [(2, 2)] * 3 + [(3, 3)] * 3 + [(4, 6)] * 6)
  for images, labels in batches:  # resized, not cropped: still constant
    np.testing.assert_allclose(images.numpy().reshape(8, -1),
                               np.repeat(labels.numpy()[:, None] % 256,
                                         images.shape[1] * images.shape[2],
                                         axis=1), atol=1e-3)
  resumed = list(stream(1, first_step=2).take(7))
  for (images, labels), (again, again_labels) in zip(batches[5:], resumed):
    np.testing.assert_array_equal(again, images)
    np.testing.assert_array_equal(again_labels, labels)


def test_order_is_reproducible_and_changes_every_epoch():
  first = train_labels(0, 2, epoch=0, steps=6)
  assert train_labels(0, 2, epoch=0, steps=6) == first
  assert train_labels(0, 2, epoch=1, steps=6) != first
  assert train_labels(0, 2, epoch=0, steps=6, seed=1) != first


def test_more_steps_than_the_shard_holds_repeats_the_shard():
  batches = train_labels(1, 2, epoch=0, steps=10)  # 80 > 51 examples
  assert len(batches) == 10
  assert set(sum(batches, [])) == set(range(1, NUM, 2))


def test_flip_mirrors_some_images_and_shift_moves_them():
  image = np.zeros((1, 4, 6, 1), np.uint8)
  image[0, :, 0] = 200  # a bright left column
  images = tf.constant(np.repeat(image, 64, axis=0))
  key = tf.constant([3, 4], tf.int64)
  flipped = sources.augment(images, key, flip=True, shift=0.0).numpy()
  right = flipped[:, :, 5, 0].min(axis=1) == 200
  left = flipped[:, :, 0, 0].min(axis=1) == 200
  assert np.all(left ^ right) and 10 < right.sum() < 54
  again = sources.augment(images, key, flip=True, shift=0.0).numpy()
  np.testing.assert_array_equal(again, flipped)


def test_shift_moves_whole_pixels_and_fills_with_the_nearest_edge():
  gradient = (np.arange(6, dtype=np.uint8) * 40)[None, None, :, None]
  images = tf.constant(np.broadcast_to(gradient, (64, 4, 6, 1)))
  shifted = sources.augment(images, tf.constant([5, 6], tf.int64),
                            flip=False, shift=0.5).numpy()
  columns = np.arange(6)
  offsets = []
  for image in shifted:
    matches = [dx for dx in range(-3, 4) if np.array_equal(
        image[..., 0], np.broadcast_to(np.clip(columns + dx, 0, 5) * 40,
                                       (4, 6)))]
    assert len(matches) == 1, image[..., 0]
    offsets += matches
  assert set(offsets) == set(range(-3, 4))  # every shift up to 0.5 * 6


def test_normalize_uses_the_training_statistics():
  info = INFO.__class__(**{**INFO.__dict__, "mean": (10.0,), "std": (2.0,)})
  out = info.normalized(tf.constant([[14]], tf.uint8))
  assert out.dtype == tf.float32 and out.numpy().item() == 2.0
