"""Volumes from TFRecords of declared features (CosmoFlow's layout), their
augmentations, staging to node-local storage, and CosmoFlow's network.

The records are written here in the real format (tf.train.Example,
GZIP/ZLIB TFRecords), damaged on purpose where a test needs it; the
multi-process guarantees are in tests/test_task_runs.py.
"""
import dataclasses
import json
import os
import subprocess

import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import datasets
from engine.core import run_files
from engine.core.errors import UserError
from engine.datasets import Augmentation, RecordFiles, record_features
from engine.datasets import sources
from engine.datasets import staging
import models
from tests import fixtures

SIZE = 8
SPEC = f"x:raw_int16:{SIZE}x{SIZE}x{SIZE}x2,y:float32:3"


def example(volume: np.ndarray, targets, **fields) -> bytes:
  """One record as CosmoFlow writes it: raw int16 bytes, float targets."""
  feature = {
      "x": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[volume.astype("<i2").tobytes()])),
      "y": tf.train.Feature(float_list=tf.train.FloatList(value=targets))}
  feature.update(fields)
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def volumes(count: int, seed: int):
  """Counts whose mean is set by the first target: learnable, and varied
  enough that every flip and transpose changes a volume."""
  rng = np.random.default_rng(seed)
  targets = rng.uniform(-1, 1, (count, 3)).astype(np.float32)
  counts = rng.poisson(3 * (2 + targets[:, 0, None, None, None, None]),
                       (count, SIZE, SIZE, SIZE, 2)).astype(np.int16)
  return counts, targets


def write(directory, *, files=(4, 2), per_file=3, compression="GZIP",
          records=None, features_file=True) -> str:
  """train/ and validation/ directories of TFRecord files, features.txt
  beside them; `records(split, file, index, default)` may replace a
  record's bytes."""
  directory = str(directory)
  for split, count, seed in (("train", files[0], 0),
                             ("validation", files[1], 1)):
    os.makedirs(os.path.join(directory, split), exist_ok=True)
    counts, targets = volumes(count * per_file, seed)
    for f in range(count):
      path = os.path.join(directory, split, f"cosmo_{f:03d}.tfrecord")
      with tf.io.TFRecordWriter(path, compression) as writer:
        for i in range(per_file):
          n = f * per_file + i
          record = example(counts[n], targets[n])
          if records:
            record = records(split, f, i, record)
          writer.write(record)
  if features_file:
    with open(os.path.join(directory, "features.txt"), "w") as f:
      f.write(SPEC.replace(",", "\n") + "\n")
  return directory


def load(data_dir, **overrides):
  params = dict(image_size=0, num_classes=0, label_offset=0,
                train_examples=0, test_examples=0)
  return datasets.load("tfrecord", data_dir=str(data_dir),
                       **{**params, **overrides})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return write(tmp_path_factory.mktemp("volumes"))


# The spec.


def test_a_spec_reads_cosmoflows_layout():
  spec = record_features.parse("x:raw_int16:128x128x128x4,y:float32:4", "f")
  assert (spec.input.name, spec.input.dtype, spec.input.shape,
          spec.input.raw) == ("x", "int16", (128, 128, 128, 4), True)
  assert (spec.label.dtype, spec.label.shape, spec.label.raw) == (
      "float32", (4,), False)
  assert str(spec) == "x:raw_int16:128x128x128x4,y:float32:4"
  assert record_features.parse(str(spec).replace(",", "\n"), "f") == spec
  assert record_features.parse("image:float32:4x4x1,label:int64",
                               "f").label.shape == ()


@pytest.mark.parametrize("text, says", [
    ("x:raw_int16:8x8x8x1", "1 features declared"),
    ("x:raw_int16:8x8x8x1,y:float32:1,z:int64", "3 features declared"),
    ("x:raw_int17:8x8x8x1,y:float32:1", "is not NAME:KIND[:SHAPE]"),
    ("x:float64:8x8x1,y:float32:1", "is not NAME:KIND[:SHAPE]"),
    ("x:raw_int16,y:float32:1", "a raw field needs one"),
    ("x:raw_int16:8x0x8x1,y:float32:1", "positive sizes"),
    ("x:raw_int16:8xax8x1,y:float32:1", "positive sizes"),
    ("x:raw_int16:64x64,y:float32:1", "2 dimensions"),
    ("x:raw_int16:8x8x1,x:float32:1", "both x"),
])
def test_a_bad_spec_is_one_line_naming_where_it_came_from(text, says):
  with pytest.raises(UserError, match="^--tfrecord_features=.*") as error:
    record_features.spec_of("", text)
  assert says in str(error.value) and "\n" not in str(error.value)


def test_the_flag_wins_over_features_txt_and_none_means_imagenets(data_dir,
                                                                   tmp_path):
  assert str(record_features.spec_of(str(data_dir), "")) == SPEC
  assert record_features.spec_of(
      str(data_dir), "a:float32:2x2x1,b:int64").input.name == "a"
  assert record_features.spec_of(str(tmp_path), "") is None


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB", ""])
def test_compression_is_detected_from_the_first_bytes(tmp_path, compression):
  write(tmp_path, compression=compression)
  files = load(tmp_path).train.files
  assert record_features.compression_of(files, "auto") == compression
  assert record_features.compression_of(files, "zlib") == "ZLIB"
  assert record_features.compression_of(files, "none") == ""
  assert load(tmp_path).info.num_train == 12


# Loading: counts, statistics, a record that does not match.


def test_the_loader_gives_volumes_and_float_targets(data_dir):
  splits = load(data_dir)
  info = splits.info
  assert isinstance(splits.train, RecordFiles) and splits.train.features
  assert [os.path.basename(f) for f in splits.train.files] == [
      f"cosmo_{f:03d}.tfrecord" for f in range(4)]
  assert (info.num_train, info.num_test) == (12, 6)
  assert info.image_shape == (SIZE, SIZE, SIZE, 2)
  assert (info.image_dtype, info.label_shape, info.label_dtype) == (
      "int16", (3,), "float32")
  assert splits.train.compression == "GZIP"


@pytest.mark.parametrize("log_transform", [False, True])
def test_statistics_are_per_channel_after_the_transform(data_dir,
                                                        log_transform):
  counts, targets = volumes(12, 0)  # the sample holds every record here
  values = counts.astype(np.float64)
  if log_transform:
    values = np.log1p(values)
  info = load(data_dir, log_transform=log_transform).info
  np.testing.assert_allclose(info.mean, values.mean(axis=(0, 1, 2, 3)),
                             rtol=1e-6)
  np.testing.assert_allclose(info.std, values.std(axis=(0, 1, 2, 3)),
                             rtol=1e-6)
  np.testing.assert_allclose(info.label_mean, targets.mean(axis=0),
                             rtol=1e-5)
  assert info.transform == ("log1p" if log_transform else "")


def test_normalization_applies_the_transform_it_was_measured_after(data_dir):
  info = load(data_dir, log_transform=True).info
  stored = tf.constant([[[[[0, 7]]]]], tf.int16)
  expected = (np.log1p([0.0, 7.0]) - np.array(info.mean)) / np.array(
      info.std)
  np.testing.assert_allclose(info.normalized(stored).numpy().ravel(),
                             expected, rtol=1e-5)


def test_a_run_keeps_the_transform_its_statistics_were_measured_after(
    data_dir, tmp_path):
  datasets.record(str(tmp_path), load(data_dir, log_transform=True).info)
  assert json.loads((tmp_path / run_files.NORMALIZATION_FILE).read_text())[
      "transform"] == "log1p"
  assert load(data_dir, log_transform=True,
              model_dir=str(tmp_path)).info.transform == "log1p"
  with pytest.raises(UserError, match="normalizes log1p values.*untransformed"
                     ".*--log_transform"):
    load(data_dir, model_dir=str(tmp_path))


def _int64(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


@pytest.mark.parametrize("damage, says", [
    (lambda record: example(np.zeros((SIZE, SIZE, SIZE)), [0.0] * 3),
     "field x holds 1024 bytes; the spec "
     f"x:raw_int16:{SIZE}x{SIZE}x{SIZE}x2 takes 2048 bytes"),
    (lambda record: example(np.zeros((SIZE, SIZE, SIZE, 2)), [0.0] * 4),
     "field y holds 4 values; the spec y:float32:3 takes 3 values"),
    (lambda record: tf.train.Example(features=tf.train.Features(feature={
        "y": tf.train.Feature(float_list=tf.train.FloatList(
            value=[0.0] * 3))})).SerializeToString(),
     "field x holds nothing (missing or empty); the spec "
     f"x:raw_int16:{SIZE}x{SIZE}x{SIZE}x2 takes 2048 bytes"),
])
def test_a_record_that_does_not_match_is_named_by_file_index_and_field(
    tmp_path, damage, says):
  write(tmp_path, records=lambda split, f, i, record: (
      damage(record) if (split, f, i) == ("train", 2, 1) else record))
  with pytest.raises(UserError) as error:
    load(tmp_path)
  path = os.path.join(tmp_path, "train", "cosmo_002.tfrecord")
  assert str(error.value).startswith(f"{path}: record 1: {says}")


def test_a_field_of_another_type_names_its_record(tmp_path):
  wrong = tf.train.Example(features=tf.train.Features(feature={
      "x": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[np.zeros((SIZE,) * 3 + (2,), "<i2").tobytes()])),
      "y": _int64([1, 2, 3])})).SerializeToString()
  write(tmp_path, records=lambda split, f, i, record: (
      wrong if (split, f, i) == ("validation", 1, 2) else record))
  with pytest.raises(UserError) as error:
    load(tmp_path)
  message = str(error.value)
  assert message.startswith(
      os.path.join(tmp_path, "validation", "cosmo_001.tfrecord")
      + ": record 2: ")
  assert "\n" not in message


def test_a_damaged_file_is_named_with_the_record_it_breaks_at(tmp_path):
  write(tmp_path, per_file=3)
  path = os.path.join(tmp_path, "train", "cosmo_001.tfrecord")
  content = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(content[:len(content) * 2 // 3])
  with pytest.raises(UserError, match=(
      f"^{path}: record [0-2]: unreadable .*a truncated or damaged file, or "
      "one compressed otherwise than gzip")):
    load(tmp_path)


def test_counts_from_flags_are_taken_as_given(data_dir):
  info = load(data_dir, train_examples=1000, test_examples=100).info
  assert (info.num_train, info.num_test) == (1000, 100)


def test_log_transform_is_refused_for_imagenets_layout(tmp_path):
  fixtures.write_tfrecords(str(tmp_path), num_files=2, per_file=2)
  with pytest.raises(UserError, match="--log_transform: for TFRecords of "
                     "declared features"):
    load(tmp_path, image_size=16, num_classes=10, log_transform=True)


# The pipeline.


def test_validation_reads_every_record_once_across_ranks(data_dir):
  splits = load(data_dir)
  counts, targets = volumes(6, 1)
  seen_volumes, seen_targets = [], []
  for images, labels in fixtures.eval_batches_of_every_rank(
      splits.test, splits.info, world_size=2, batch_size=4):
    seen_volumes.append(images.numpy())
    seen_targets.append(labels.numpy())
  seen = np.concatenate(seen_targets)
  order = [int(np.argmin(np.abs(targets - t).sum(axis=1))) for t in seen]
  assert sorted(order) == list(range(6))
  normalized = ((counts[order] - np.array(splits.info.mean))
                / np.array(splits.info.std))
  np.testing.assert_allclose(np.concatenate(seen_volumes), normalized,
                             rtol=1e-5, atol=1e-5)


def train_batches(splits, *, batch_size=2, steps=3, flip=True,
                  transpose=True, first_epoch=0, first_step=0):
  return [(x.numpy(), y.numpy()) for x, y in datasets.train_stream(
      splits.train, splits.info, shard=datasets.Shard(0, 2),
      epochs=datasets.Epochs(batch_size=batch_size, steps=steps, seed=5),
      augmentation=Augmentation(flip=flip, shift=0.1, transpose=transpose),
      first_epoch=first_epoch, first_step=first_step).take(7)]


def test_training_batches_resume_at_any_step_and_differ_by_epoch(data_dir):
  splits = load(data_dir)
  batches = train_batches(splits)
  again = train_batches(splits)
  resumed = train_batches(splits, first_epoch=1, first_step=1)
  for (x, y), (x2, y2) in zip(batches, again):
    np.testing.assert_array_equal(x, x2)
  for (x, y), (x2, y2) in zip(batches[4:], resumed):
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
  # Rank 0 holds files 0 and 2: 6 examples, 3 steps of 2 each epoch.
  first, second = (np.concatenate([y for _, y in batches[e * 3:e * 3 + 3]])
                   for e in (0, 1))
  assert sorted(map(tuple, first)) == sorted(map(tuple, second))
  assert not np.array_equal(first, second)


@pytest.mark.parametrize("per_file, log_transform", [(3, False), (1, True)])
def test_cached_records_give_the_very_batches_streaming_does(
    tmp_path, per_file, log_transform):
  """--cache_records: records decoded (and normalized) once, the same
  batches at every step, resumed or not (3 a file: shuffled in windows; 1:
  by their order), log-transformed or not."""
  directory = write(tmp_path, files=(6, 2), per_file=per_file)
  streamed, cached = (load(directory, log_transform=log_transform,
                           cache_records=cache) for cache in (False, True))
  assert cached.train.cache and not streamed.train.cache
  for first in (dict(), dict(first_epoch=1, first_step=2)):
    for (x, y), (x2, y2) in zip(train_batches(streamed, **first),
                                train_batches(cached, **first)):
      np.testing.assert_array_equal(x, x2)
      np.testing.assert_array_equal(y, y2)


@pytest.mark.parametrize("per_file, log_transform", [(3, False), (1, True)])
def test_cached_validation_gives_the_very_batches_and_reads_no_file_again(
    tmp_path, per_file, log_transform):
  """--cache_records holds the validation records too: every rank's
  evaluation batches are those streamed, bit for bit and in their order,
  normalized once, and an evaluation after the first reads no file."""
  directory = write(tmp_path, files=(4, 4) if per_file > 1 else (8, 12),
                    per_file=per_file)
  streamed, cached = (load(directory, log_transform=log_transform,
                           cache_records=cache) for cache in (False, True))
  assert cached.test.cache_evaluation and not streamed.test.cache_evaluation

  def evaluated(splits):
    return [[(x.numpy(), y.numpy()) for x, y in datasets.eval_batches(
        splits.test, splits.info, shard=datasets.Shard(rank, 2),
        batch_size=2)] for rank in (0, 1)]

  expected, first = evaluated(streamed), evaluated(cached)
  for rank_expected, rank_first in zip(expected, first):
    assert len(rank_first) == len(rank_expected) == 3  # of 2
    for (x, y), (x2, y2) in zip(rank_expected, rank_first):
      np.testing.assert_array_equal(x, x2)
      np.testing.assert_array_equal(y, y2)
  for path in os.listdir(os.path.join(directory, "validation")):
    os.remove(os.path.join(directory, "validation", path))
  for rank_first, rank_again in zip(first, evaluated(cached)):
    for (x, y), (x2, y2) in zip(rank_first, rank_again):
      np.testing.assert_array_equal(x, x2)
      np.testing.assert_array_equal(y, y2)


def test_volumes_are_flipped_and_transposed_each_their_own_way():
  counts, _ = volumes(64, 3)
  stored = tf.constant(counts)
  key = tf.constant([1, 2], tf.int64)
  augmented = sources.augment_volumes(stored, key, flip=True,
                                      transpose=True).numpy()
  views = {}
  for n in range(64):
    for order in sources._AXIS_ORDERS:  # pylint: disable=protected-access
      for flips in np.ndindex(2, 2, 2):
        view = np.transpose(counts[n], order + (3,))
        for axis, flipped in enumerate(flips):
          if flipped:
            view = np.flip(view, axis)
        if np.array_equal(view, augmented[n]):
          views.setdefault(n, (order, flips))
  assert sorted(views) == list(range(64))  # each one of the 48 symmetries
  assert len(set(views.values())) > 20
  np.testing.assert_array_equal(sources.augment_volumes(
      stored, key, flip=False, transpose=False), counts)
  np.testing.assert_array_equal(sources.augment_volumes(
      stored, key, flip=True, transpose=True), augmented)


def test_transposes_are_for_cubic_volumes(tmp_path):
  spec = "x:raw_int16:8x8x4x2,y:float32:3"
  write(tmp_path, records=lambda split, f, i, record: example(
      np.zeros((8, 8, 4, 2)), [0.0] * 3), features_file=False)
  splits = load(tmp_path, tfrecord_features=spec)
  with pytest.raises(UserError, match="--random_transpose .*cubic volumes"
                     r".*8x8x4x2"):
    train_batches(splits)
  assert len(train_batches(splits, transpose=False)) == 7


# Staging.


def test_each_rank_stages_its_own_files_and_a_rerun_copies_nothing(
    data_dir, tmp_path):
  splits = load(data_dir)
  stage_dir = str(tmp_path)
  staged_splits, staged = {}, {}
  for rank in (0, 1):
    staged_splits[rank], staged[rank] = staging.stage(
        splits, data_dir=str(data_dir), stage_dir=stage_dir, rank=rank,
        world_size=2)
  copies = sorted(os.path.relpath(os.path.join(root, name), stage_dir)
                  for root, _, names in os.walk(stage_dir) for name in names)
  folder = copies[0].split(os.sep)[0]
  assert folder.startswith(os.path.basename(str(data_dir)) + "-")
  assert copies == sorted(os.path.join(folder, split, f"cosmo_{f:03d}"
                                       ".tfrecord")
                          for split, count in (("train", 4),
                                               ("validation", 2))
                          for f in range(count))
  assert [staged[r].files for r in (0, 1)] == [3, 3]
  assert staged[0].copied_bytes == staged[0].bytes > 0
  for rank in (0, 1):  # its own files read from the stage, others' not
    own = staged_splits[rank].train.rank_files(datasets.Shard(rank, 2))
    assert all(f.startswith(stage_dir) for f in own)
    other = staged_splits[rank].train.rank_files(datasets.Shard(1 - rank, 2))
    assert not any(f.startswith(stage_dir) for f in other)
  # The staged files read as the originals.
  assert [y.numpy().tolist() for _, y in datasets.eval_batches(
      staged_splits[1].test, splits.info, shard=datasets.Shard(1, 2),
      batch_size=8)] == [y.numpy().tolist() for _, y in datasets.eval_batches(
          splits.test, splits.info, shard=datasets.Shard(1, 2), batch_size=8)]
  _, again = staging.stage(splits, data_dir=str(data_dir),
                           stage_dir=stage_dir, rank=0, world_size=2)
  assert (again.files, again.copied_bytes) == (3, 0)


def test_a_changed_source_is_staged_again(tmp_path):
  data_dir = write(tmp_path / "data")
  splits = load(data_dir)
  stage_dir = tmp_path / "stage"
  stage_dir.mkdir()
  staging.stage(splits, data_dir=data_dir, stage_dir=str(stage_dir), rank=0,
                world_size=1)
  path = splits.train.files[0]
  with open(path, "ab") as f:
    f.write(b"\0")
  _, staged = staging.stage(splits, data_dir=data_dir,
                            stage_dir=str(stage_dir), rank=0, world_size=1)
  assert staged.copied_bytes == os.path.getsize(path)


def test_a_missing_stage_dir_or_other_data_is_one_line(data_dir, tmp_path):
  splits = load(data_dir)
  with pytest.raises(UserError, match=r"--stage_dir=\S+/nowhere: no such "
                     r"directory; give node-local storage .*\$TMPDIR"):
    staging.stage(splits, data_dir=str(data_dir),
                  stage_dir=str(tmp_path / "nowhere"), rank=0, world_size=1)
  in_memory = dataclasses.replace(splits, train=datasets.Examples(
      np.zeros((2, SIZE, SIZE, SIZE, 2)), np.zeros((2, 3))))
  with pytest.raises(UserError, match="staging copies TFRecord files"):
    staging.stage(in_memory, data_dir=str(data_dir), stage_dir=str(tmp_path),
                  rank=0, world_size=1)


@pytest.fixture
def small_disk(tmp_path):
  if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs needs root")
  mount = tmp_path / "small"
  mount.mkdir()
  subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                  str(mount)], check=True)
  yield str(mount)
  subprocess.run(["umount", str(mount)], check=True)


def test_a_full_stage_dir_is_one_line_before_any_copy(tmp_path, small_disk):
  data_dir = write(tmp_path / "data", per_file=8, compression="")
  splits = load(data_dir)
  with pytest.raises(UserError, match=r"--stage_dir=.*: this process's share "
                     r"of the files needs [\d.]+ MB and [\d.]+ MB are free"):
    staging.stage(splits, data_dir=data_dir, stage_dir=small_disk, rank=0,
                  world_size=1)
  assert os.listdir(small_disk) == []


# CosmoFlow's network.


@pytest.mark.parametrize("size, blocks", [(16, 3), (32, 4), (64, 5),
                                          (128, 5)])
def test_cosmoflow_serves_16_to_128_cubed(size, blocks):
  model = models.build("cosmoflow", input_shape=(size, size, size, 4),
                       num_classes=4, filters=2)
  convolutions = [l for l in model.layers
                  if isinstance(l, keras.layers.Conv3D)]
  assert len(convolutions) == blocks
  assert [c.filters for c in convolutions] == [2 * 2 ** i
                                               for i in range(blocks)]
  outputs = model(tf.random.normal((2, size, size, size, 4)) * 100).numpy()
  assert outputs.shape == (2, 4) and np.abs(outputs).max() <= 1.2 + 1e-6


def test_cosmoflow_takes_its_depth_and_refuses_images():
  model = models.build("cosmoflow", input_shape=(32, 32, 32, 1),
                       num_classes=4, filters=2, conv_layers=2)
  assert sum(isinstance(l, keras.layers.Conv3D) for l in model.layers) == 2
  with pytest.raises(UserError, match="--model=cosmoflow takes volumes "
                     "DxHxWxC; these inputs are 28x28x1"):
    models.build("cosmoflow", input_shape=(28, 28, 1), num_classes=10)


def test_cosmoflow_builds_the_references_kernel_unless_told():
  def kernels(**params):
    model = models.build("cosmoflow", input_shape=(16, 16, 16, 1),
                         num_classes=4, filters=2, **params)
    return {l.kernel_size for l in model.layers
            if isinstance(l, keras.layers.Conv3D)}
  assert kernels() == {(3, 3, 3)}  # mlcommons/hpc's configs/cosmo.yaml
  assert kernels(kernel_size=2) == {(2, 2, 2)}  # its v0.7's
  with pytest.raises(UserError, match=r"^--kernel_size=0: the Conv3D "
                     "kernel's side is at least 1"):
    kernels(kernel_size=0)


def references_layers(size, kernel_size, blocks):
  """CosmoFlow's network as the reference orders its layers, in stock
  Keras: Conv3D, LeakyReLU, MaxPool3D a block."""
  layers = keras.layers
  stack = [keras.Input((size, size, size, 2))]
  for i in range(blocks):
    stack += [layers.Conv3D(2 * 2 ** i, kernel_size, padding="same"),
              layers.LeakyReLU(0.3), layers.MaxPool3D(2)]
  stack += [layers.Flatten(), layers.Dense(128), layers.LeakyReLU(0.3),
            layers.Dense(64), layers.LeakyReLU(0.3),
            layers.Dense(4, activation="tanh"), layers.Rescaling(1.2)]
  return keras.Sequential(stack)


@pytest.mark.parametrize("size, kernel_size, blocks, by_taps", [
    (16, 3, 4, [False, False, False, True]),  # the last on 2^3 voxels
    (16, 2, 4, [False, False, False, True]),  # padded after each voxel
    (8, 3, 2, [False, False]),
])
def test_cosmoflows_blocks_compute_the_references_layers(size, kernel_size,
                                                         blocks, by_taps):
  keras.utils.set_random_seed(0)
  model = models.build("cosmoflow", input_shape=(size, size, size, 2),
                       num_classes=4, filters=2, conv_layers=blocks,
                       kernel_size=kernel_size)
  assert [bool(l._side_by_taps) for l in model.layers
          if isinstance(l, keras.layers.Conv3D)] == by_taps
  reference = references_layers(size, kernel_size, blocks)
  reference.set_weights(model.get_weights())
  volumes = tf.random.stateless_normal((3, size, size, size, 2), (0, 1))
  computed = [fixtures.outputs_and_gradients(network, volumes)
              for network in (model, reference)]
  # The same sums in another order: each tensor within float32 rounding
  # as a whole (an element may cancel to near zero either way).
  for ours, theirs in zip(*computed):
    assert np.linalg.norm(ours - theirs) <= 1e-5 * np.linalg.norm(theirs)


# From the command line.


@pytest.mark.parametrize("when, per_file, flags, bad, says", [
    # Start-up reads every record: nothing is written.
    ("at start-up", 3, [], example(np.zeros((SIZE, SIZE, SIZE, 1)),
                                   [0.0] * 3),
     "record 2: field x holds 1024 bytes; the spec "
     f"x:raw_int16:{SIZE}x{SIZE}x{SIZE}x2 takes 2048 bytes"),
    # Counts from flags skip that reading, and the statistics' sample takes
    # the first 16 records of each of the 4 files: record 2 of 20 is found
    # as the pipeline decodes it.
    ("while training", 20, ["--train_examples=80", "--test_examples=40"],
     example(np.zeros((SIZE, SIZE, SIZE, 2)), [0.0] * 2),
     "record 18: field y holds 2 values; the spec y:float32:3 takes 3 "
     "values"),
    # Named: a serialized record's map of features has no fixed order
    # (protobuf 7), and pytest-xdist's workers must collect the same names.
], ids=["at start-up", "while training"])
def test_a_mismatched_record_is_one_line(tmp_path, when, per_file, flags,
                                         bad, says):
  index = int(says.split()[1].rstrip(":"))
  data_dir = write(tmp_path / "data", per_file=per_file,
                   records=lambda split, f, i, record: (
                       bad if (split, f, i) == ("train", 3, index)
                       else record))
  model_dir = tmp_path / "run"
  result = fixtures.launch(
      ["-m", "engine.train", "--dataset=tfrecord", f"--data_dir={data_dir}",
       "--task=regression", "--model=cosmoflow", "--filters=2",
       "--batch_size=4", "--epochs=1", "--progress=none",
       f"--model_dir={model_dir}", *flags])
  assert result.returncode == 2, result.stderr[-2000:]
  path = os.path.join(data_dir, "train", "cosmo_003.tfrecord")
  assert result.stderr.strip().splitlines()[-1] == (
      f"engine.train: error: {path}: {says}")
  assert "epoch 1/1" not in result.stderr
  assert model_dir.exists() == (when == "while training")


def test_the_stage_dir_is_expanded_in_each_process(data_dir, tmp_path,
                                                   monkeypatch):
  monkeypatch.setenv("NODE_LOCAL", str(tmp_path))
  staged_splits, _ = staging.stage(
      load(data_dir), data_dir=str(data_dir), stage_dir="$NODE_LOCAL",
      rank=0, world_size=1)
  assert staged_splits.train.files[0].startswith(str(tmp_path))
  monkeypatch.delenv("NODE_LOCAL")
  with pytest.raises(UserError, match=r"--stage_dir=\$NODE_LOCAL: "
                     r"\$NODE_LOCAL names an environment variable"):
    staging.stage(load(data_dir), data_dir=str(data_dir),
                  stage_dir="$NODE_LOCAL", rank=0, world_size=1)


@pytest.mark.parametrize("program", ["engine.train", "engine.find_lr"])
def test_random_transpose_reaches_the_pipeline(tmp_path, program):
  data_dir = write(tmp_path / "data", records=lambda split, f, i, record: (
      example(np.zeros((8, 8, 4, 2)), [0.0] * 3)), features_file=False)
  result = fixtures.launch(
      ["-m", program, "--dataset=tfrecord", f"--data_dir={data_dir}",
       "--tfrecord_features=x:raw_int16:8x8x4x2,y:float32:3",
       "--task=regression", "--model=cosmoflow", "--filters=2",
       "--random_transpose", "--batch_size=2", "--progress=none",
       f"--model_dir={tmp_path / 'run'}"])
  assert result.returncode == 2
  assert "--random_transpose puts a volume's three axes in a random order" \
      in result.stderr.strip().splitlines()[-1]


def test_one_sample_files_are_shuffled_by_their_order_alone(tmp_path):
  """No window: each epoch's volumes come in its files' permuted order."""
  splits = load(write(tmp_path, files=(6, 2), per_file=1))
  epochs = [np.concatenate([y for _, y in batches])
            for batches in (train_batches(splits, steps=1, batch_size=3,
                                          flip=False, transpose=False,
                                          first_epoch=e)[:1]
                            for e in range(4))]
  _, targets = volumes(6, 0)
  own = targets[0::2]  # rank 0 of 2: files 0, 2, 4
  for seen in epochs:
    assert sorted(map(tuple, seen)) == sorted(map(tuple, own))
  assert len({tuple(map(tuple, seen)) for seen in epochs}) > 1


def test_cached_records_train_as_streamed_ones_on_two_processes_and_resume(
    tmp_path):
  """--cache_records under horovodrun -np 2, on one-record files: every
  epoch's training and validation figures are those of the streamed run
  (the same batches, the whole validation split read exactly once), and a
  cached run stopped after 2 epochs and resumed ends on the weights and
  figures of one that was not."""
  data_dir = write(tmp_path / "data", files=(8, 6), per_file=1)

  def train(model_dir, *extra, epochs=3):
    result = fixtures.launch(
        ["-m", "engine.train", "--dataset=tfrecord", f"--data_dir={data_dir}",
         "--task=regression", "--model=cosmoflow", "--filters=2",
         "--kernel_size=2", "--log_transform", "--random_flip",
         "--random_transpose", "--batch_size=2", f"--epochs={epochs}",
         "--deterministic", "--progress=none", f"--model_dir={model_dir}",
         *extra], processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    return [r for _, r in run_files.read_metrics(str(model_dir))
            if r and "event" not in r]

  figures = ("epoch", "global_step", "train_loss", "val_loss", "val_mae",
             "val_r2")
  streamed = train(tmp_path / "streamed")
  cached = train(tmp_path / "cached", "--cache_records")
  assert [r["epoch"] for r in cached] == [1, 2, 3]
  assert [[r[f] for f in figures] for r in cached] == \
      [[r[f] for f in figures] for r in streamed]

  train(tmp_path / "resumed", "--cache_records", epochs=2)
  resumed = train(tmp_path / "resumed", "--cache_records")
  assert [r["epoch"] for r in resumed] == [1, 2, 3]
  assert resumed[-1]["val_mae"] == pytest.approx(cached[-1]["val_mae"],
                                                 rel=1e-6)
  weights = {}
  for run in ("cached", "resumed"):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(
        str(tmp_path / run / "checkpoints")))
    # (Every variable of the model and the optimizer: the checkpoint keys
    # them.)
    weights[run] = {n: reader.get_tensor(n)
                    for n in reader.get_variable_to_shape_map()
                    if n.startswith(("model_variables/",
                                     "optimizer_variables/"))}
  assert weights["cached"] and weights["cached"].keys() == \
      weights["resumed"].keys()
  for name, value in weights["cached"].items():
    np.testing.assert_allclose(weights["resumed"][name], value, rtol=1e-5,
                               atol=1e-6, err_msg=name)
