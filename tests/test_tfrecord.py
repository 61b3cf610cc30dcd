import collections
import os

import numpy as np
import pytest

from engine import datasets
from engine.core.errors import UserError
from engine.datasets import Augmentation, Epochs, Shard
from engine.datasets import RecordFiles
from tests import fixtures


def load(data_dir, **overrides):
  params = dict(data_dir=data_dir, image_size=16, num_classes=10,
                label_offset=0, train_examples=0, test_examples=0)
  params.update(overrides)
  return datasets.load("tfrecord", **params)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_tfrecords(str(tmp_path_factory.mktemp("records")),
                                  num_files=3, per_file=8, label_offset=1)


def test_loader_finds_the_splits_and_counts_them(data_dir):
  splits = load(data_dir, label_offset=1)
  assert isinstance(splits.train, RecordFiles)
  assert [os.path.basename(f) for f in splits.train.files] == [
      "train-00000-of-00003", "train-00001-of-00003", "train-00002-of-00003"]
  assert (splits.info.num_train, splits.info.num_test) == (24, 16)
  assert splits.info.image_shape == (16, 16, 3)
  assert load(data_dir, train_examples=1000).info.num_train == 1000


def test_eval_reads_every_record_once_across_ranks_decoded(data_dir):
  splits = load(data_dir, label_offset=1)
  _, expected = fixtures.learnable_images(16, (24, 20, 3), 10, 1)
  seen = []
  for images, labels in fixtures.eval_batches_of_every_rank(
      splits.test, splits.info, world_size=2, batch_size=5):
    assert images.shape[1:] == (16, 16, 3)
    assert abs(float(np.mean(images))) < 3  # normalized
    seen += labels.numpy().tolist()
  assert collections.Counter(seen) == collections.Counter(expected.tolist())


def test_training_files_are_split_across_ranks_and_steps_are_equal(data_dir):
  splits = load(data_dir, label_offset=1)
  # 3 files on 2 ranks: rank 0 reads files 0 and 2 (16 records), rank 1 file
  # 1 (8 records), yet both must give the same number of batches.
  steps = datasets.steps_per_epoch(num_train=24, batch_size=4, world_size=2,
                               requested=0)
  for rank in range(2):
    stream = datasets.train_stream(
        splits.train, splits.info,
        shard=Shard(rank, 2),
        epochs=Epochs(batch_size=4, steps=steps, seed=0),
        augmentation=Augmentation(flip=True, shift=0.0),
        first_epoch=0)
    batches = list(stream.take(2 * steps))
    assert len(batches) == 2 * steps
    assert all(b[0].shape == (4, 16, 16, 3) for b in batches)


def test_each_rank_reads_exactly_its_own_files_each_epoch(tmp_path):
  directory = str(tmp_path)
  fixtures.write_tfrecords(directory, num_files=2, per_file=4)
  splits = load(directory)
  labels = fixtures.learnable_images(8, (24, 20, 3), 10, 0)[1].tolist()
  for rank, own_file in ((0, labels[:4]), (1, labels[4:])):
    stream = datasets.train_stream(
        splits.train, splits.info,
        shard=Shard(rank, 2),
        epochs=Epochs(batch_size=2, steps=2, seed=0),
        augmentation=Augmentation(flip=False, shift=0.0),
        first_epoch=0)
    epochs = [[], []]
    for i, (_, batch_labels) in enumerate(stream.take(4)):
      epochs[i // 2] += batch_labels.numpy().tolist()
    for seen in epochs:  # one full pass over its own file per epoch
      assert collections.Counter(seen) == collections.Counter(own_file)


def test_fewer_files_than_processes(data_dir):
  splits = load(data_dir)
  with pytest.raises(UserError, match="3 TFRecord files cannot be split "
                     "across 4 processes"):
    datasets.train_stream(
        splits.train, splits.info,
        shard=Shard(0, 4),
        epochs=Epochs(batch_size=2, steps=1, seed=0),
        augmentation=Augmentation(flip=False, shift=0.0),
        first_epoch=0)


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "--dataset=tfrecord needs --data_dir"),
    (lambda d: os.path.join(d, "absent"), "no such directory"),
    (lambda d: d, "no train-\\* TFRecord files"),
])
def test_missing_data(tmp_path, make, message):
  with pytest.raises(UserError, match=message):
    load(make(str(tmp_path)) or "")


def test_truncated_file_is_named(tmp_path):
  fixtures.write_tfrecords(str(tmp_path), num_files=2)
  path = tmp_path / "train-00001-of-00002"
  path.write_bytes(path.read_bytes()[:-10])
  with pytest.raises(UserError, match="train-00001-of-00002: truncated"):
    load(str(tmp_path))
