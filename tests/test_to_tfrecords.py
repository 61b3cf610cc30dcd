"""engine.tools.to_tfrecords: image folders and arrays to sharded TFRecords."""
import collections
import glob
import os

import pytest
import tensorflow as tf

from engine import datasets
from engine.core.errors import UserError
from engine.tools import to_tfrecords
from tests import fixtures


def records(path):
  """(encoded bytes, label) of each record of the TFRecord file `path`."""
  out = []
  for raw in tf.data.TFRecordDataset(path):
    example = tf.train.Example.FromString(raw.numpy())
    feature = example.features.feature
    out.append((feature["image/encoded"].bytes_list.value[0],
                feature["image/class/label"].int64_list.value[0]))
  return out


def shards(out, split):
  return sorted(glob.glob(os.path.join(out, f"{split}-*")))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return fixtures.write_image_folder(str(tmp_path_factory.mktemp("images")))


def test_an_image_folder_becomes_shards_of_its_files(folder, tmp_path):
  out = str(tmp_path / "records")
  to_tfrecords.convert(folder, out, shards=3, threads=2)
  assert [os.path.basename(p) for p in shards(out, "train")] == [
      "train-00000-of-00003", "train-00001-of-00003", "train-00002-of-00003"]
  assert len(shards(out, "validation")) == 2  # 9 of 18: half as many
  class_names, train, validation = datasets.image_folder.list_files(
      folder, validation_split=0.0, skip_bad_files=False)
  for split, files in (("train", train), ("validation", validation)):
    stored = [r for path in shards(out, split) for r in records(path)]
    expected = []
    for path, label in files:
      with open(path, "rb") as f:
        expected.append((f.read(), label))
    assert sorted(stored) == sorted(expected)  # the files as they are
  # Every training shard holds more than one class: shuffled, then dealt.
  for path in shards(out, "train"):
    assert len({label for _, label in records(path)}) > 1
  splits = datasets.load("tfrecord", data_dir=out, image_size=16,
                         num_classes=1000, label_offset=0, train_examples=0,
                         test_examples=0)
  assert splits.info.class_names == tuple(class_names)
  assert splits.info.num_classes == 3
  assert (splits.info.num_train, splits.info.num_test) == (18, 9)
  # The reader decodes all four formats.
  labels = [l for _, l in datasets.eval_batches(
      splits.test, splits.info, shard=datasets.Shard(0, 1), batch_size=4)]
  assert sum(len(l) for l in labels) == 9


def test_arrays_become_png_records(tmp_path):
  path = fixtures.write_arrays(str(tmp_path / "a.npz"), num_train=21,
                               num_test=5)
  out = str(tmp_path / "records")
  to_tfrecords.convert(path, out, shards=2, threads=2)
  images, labels = fixtures.learnable_images(21, (12, 12), 4, 0)
  stored = [r for p in shards(out, "train") for r in records(p)]
  decoded = sorted((tf.io.decode_png(e).numpy()[..., 0].tobytes(), l)
                   for e, l in stored)
  assert decoded == sorted((i.tobytes(), l) for i, l in zip(images, labels))
  with open(os.path.join(out, "classes.txt")) as f:
    assert f.read().split() == [f"class_{i}" for i in range(4)]


def test_a_rerun_keeps_the_shards_already_written(folder, tmp_path):
  out = str(tmp_path / "records")
  to_tfrecords.convert(folder, out, shards=3, threads=2)
  written = {p: os.stat(p).st_mtime_ns for p in shards(out, "train")}
  os.remove(shards(out, "train")[1])  # as if interrupted while writing it
  with open(os.path.join(out, "train-00001-of-00003.tmp-123"), "wb") as f:
    f.write(b"half a shard")
  to_tfrecords.convert(folder, out, shards=3, threads=2)
  again = {p: os.stat(p).st_mtime_ns for p in shards(out, "train")
           if ".tmp-" not in p}
  assert set(again) == set(written)
  kept = [p for p in written if again[p] == written[p]]
  assert len(kept) == 2


def test_another_conversion_into_the_same_directory_is_refused(folder,
                                                               tmp_path):
  out = str(tmp_path / "records")
  to_tfrecords.convert(folder, out, shards=3, threads=2)
  with pytest.raises(UserError, match="holds another conversion"):
    to_tfrecords.convert(folder, out, shards=4)


def test_float_arrays_are_refused(tmp_path):
  path = fixtures.write_arrays(str(tmp_path / "f.npz"), dtype="float32")
  with pytest.raises(UserError, match="float images; TFRecords hold encoded "
                     "uint8"):
    to_tfrecords.convert(path, str(tmp_path / "out"), shards=2)


def test_the_command_line_reports_progress_and_what_to_train_with(folder,
                                                                  tmp_path):
  out = tmp_path / "records"
  result = fixtures.launch(["-m", "engine.tools.to_tfrecords",
                            f"--from={folder}", f"--to={out}", "--shards=2"],
                           timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "27/27 images" in result.stderr
  assert (f"18 training and 9 validation examples of 3 classes in 2 + 1 "
          f"shards; train with --dataset=tfrecord --data_dir={out}"
          in result.stdout)
  counts = collections.Counter(os.path.basename(p).split("-")[0]
                               for p in glob.glob(str(out / "*-of-*")))
  assert counts == {"train": 2, "validation": 1}
  bad = fixtures.launch(["-m", "engine.tools.to_tfrecords",
                         f"--from={tmp_path}/none", f"--to={out}2"],
                        timeout=120)
  assert bad.returncode == 2
  assert "Traceback" not in bad.stderr
  assert f"to_tfrecords: error: --from={tmp_path}/none: no such file" in \
      bad.stderr
