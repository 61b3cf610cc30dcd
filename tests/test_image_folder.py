"""--dataset=image_folder: class folders of JPEG, PNG, BMP and GIF files."""
import collections
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from engine import datasets
from engine.core.errors import UserError
from engine.datasets import Augmentation, Epochs, Shard
from engine.datasets import ImageFiles, image_folder
from tests import fixtures

TRAIN_COUNTS, VALIDATION_COUNTS = (7, 5, 6), (3, 2, 4)


def load(data_dir, **overrides):
  params = dict(data_dir=str(data_dir), image_size=16, channels=3,
                validation_split=0.0, skip_bad_files=False)
  params.update(overrides)
  return datasets.load("image_folder", **params)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return fixtures.write_image_folder(str(tmp_path_factory.mktemp("images")),
                                     train_counts=TRAIN_COUNTS,
                                     validation_counts=VALIDATION_COUNTS)


@pytest.fixture
def copy(folder, tmp_path):
  return shutil.copytree(folder, tmp_path / "copy")


def test_labels_are_the_sorted_class_folders(folder):
  splits = load(folder)
  assert isinstance(splits.train, ImageFiles)
  assert splits.info.class_names == fixtures.IMAGE_CLASSES
  assert (splits.info.num_train, splits.info.num_test) == (18, 9)
  assert collections.Counter(splits.train.labels.tolist()) == {0: 7, 1: 5,
                                                               2: 6}
  assert {os.path.splitext(p)[1] for p in splits.train.paths} == {
      ".png", ".jpg", ".bmp", ".gif"}
  assert splits.info.image_shape == (16, 16, 3)


@pytest.mark.parametrize("channels", [1, 3])
def test_every_format_and_mode_decodes_to_the_channels_asked(folder,
                                                             channels):
  splits = load(folder, channels=channels)
  for path, label in zip(splits.train.paths, splits.train.labels):
    image = image_folder.decode(tf.constant(path), (16, 16, channels))
    assert image.shape == (16, 16, channels), path
    # The class band is bright in every format (JPEG blurs it a little).
    band = image.numpy()[label * 5:(label + 1) * 5].mean()
    rest = np.delete(image.numpy(), np.s_[label * 5:(label + 1) * 5],
                     axis=0).mean()
    assert band > rest + 100, path


def test_normalization_comes_from_a_sample_and_is_the_same_each_time(folder):
  first, second = load(folder).info, load(folder).info
  assert (first.mean, first.std) == (second.mean, second.std)
  assert 40 < first.mean[0] < 120 and 40 < first.std[0] < 100
  given = load(folder, normalization=((1.0, 2.0, 3.0), (4.0, 5.0, 6.0)))
  assert (given.info.mean, given.info.std) == ((1.0, 2.0, 3.0),
                                               (4.0, 5.0, 6.0))


def test_validation_split_holds_out_each_class_the_same_way(copy):
  shutil.rmtree(copy / "validation")
  splits = load(copy, validation_split=0.34)
  again = load(copy, validation_split=0.34)
  assert splits.test.paths == again.test.paths
  assert collections.Counter(splits.test.labels.tolist()) == {0: 2, 1: 2,
                                                              2: 2}
  assert not set(splits.train.paths) & set(splits.test.paths)
  assert len(splits.train.paths) + len(splits.test.paths) == 18


def test_eval_reads_each_file_once_across_ranks(folder):
  splits = load(folder)
  seen = []
  for images, labels in fixtures.eval_batches_of_every_rank(
      splits.test, splits.info, world_size=2, batch_size=2):
    assert images.shape[1:] == (16, 16, 3)
    seen += labels.numpy().tolist()
  assert sorted(seen) == sorted(splits.test.labels.tolist())


def rank_stream(splits, rank, *, first_epoch=0, first_step=0, steps=4):
  batches = datasets.train_stream(
      splits.train, splits.info,
      shard=Shard(rank, 2),
      epochs=Epochs(batch_size=2, steps=steps, seed=1),
      augmentation=Augmentation(flip=True, shift=0.1),
      first_epoch=first_epoch,
      first_step=first_step)
  return [(images.numpy(), labels.numpy()) for images, labels in
          batches.take(steps - first_step)]


def test_ranks_train_on_disjoint_complete_shares(folder):
  splits = load(folder)
  # 18 files on 2 ranks, 9 each: an epoch of 4 steps of 2 is 8 per rank.
  steps = datasets.steps_per_epoch(num_train=18, batch_size=2, world_size=2,
                               requested=0)
  seen = [collections.Counter() for _ in range(2)]
  for rank in range(2):
    for images, labels in rank_stream(splits, rank, steps=steps):
      assert images.shape == (2, 16, 16, 3)
      assert abs(images.mean()) < 3  # normalized
      seen[rank].update(labels.tolist())
  assert sum(seen[0].values()) == sum(seen[1].values()) == 8
  shares = [set(splits.train.paths[r::2]) for r in range(2)]
  assert not shares[0] & shares[1]
  assert shares[0] | shares[1] == set(splits.train.paths)


def test_a_stream_started_mid_epoch_gives_the_same_batches(folder):
  splits = load(folder)
  whole = rank_stream(splits, 1, first_epoch=1)
  resumed = rank_stream(splits, 1, first_epoch=1, first_step=2)
  for (images, labels), (again, again_labels) in zip(whole[2:], resumed):
    np.testing.assert_array_equal(labels, again_labels)
    np.testing.assert_array_equal(images, again)


# Bad data: one line naming the file or folder, before any training.

def test_empty_class_folder_is_named(copy):
  for path in (copy / "train" / "bee").iterdir():
    path.unlink()
  with pytest.raises(UserError, match=r"train/bee: no .* images in this "
                     "class folder"):
    load(copy)


def test_a_validation_class_that_train_lacks_is_named(copy):
  (copy / "validation" / "dog").mkdir()
  shutil.copy(copy / "validation" / "ant" / "ant_002.png",
              copy / "validation" / "dog")
  with pytest.raises(UserError, match=r"validation/dog: a class that .*train "
                     "lacks"):
    load(copy)


@pytest.mark.parametrize("content, problem", [
    (b"name,label\n", "not a JPEG, PNG, BMP or GIF image"),
    (b"", "empty file")])
def test_a_bad_file_is_named_or_skipped_and_counted(copy, content, problem):
  bad = copy / "train" / "cat" / "notes.jpg"
  bad.write_bytes(content)
  with pytest.raises(UserError, match=f"{bad}: {problem}; remove it, or "
                     "pass --skip_bad_files"):
    load(copy)
  assert load(copy, skip_bad_files=True).info.num_train == 18


def test_a_broken_link_is_named(copy):
  os.symlink(copy / "nowhere.png", copy / "train" / "ant" / "gone.png")
  with pytest.raises(UserError, match="gone.png: cannot read it"):
    load(copy)


def test_files_that_are_not_images_by_name_are_ignored(copy):
  (copy / "train" / "ant" / "README.txt").write_text("ants")
  (copy / "train" / "ant" / ".DS_Store").write_bytes(b"\0\0")
  assert load(copy).info.num_train == 18


def test_without_validation_folder_or_split_says_what_to_do(copy):
  shutil.rmtree(copy / "validation")
  with pytest.raises(UserError, match="no validation/ folder.*"
                     "--validation_split=0.1"):
    load(copy)


def test_an_image_that_fails_to_decode_is_named_at_start_up(copy):
  """Its first bytes look right; the statistics' sample decodes it."""
  bad = copy / "train" / "cat" / "cat_000.png"
  bad.write_bytes(bad.read_bytes()[:60])
  with pytest.raises(UserError, match=f"{bad}: cannot decode it"):
    load(copy)
