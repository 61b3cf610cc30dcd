import datetime
import pickle
import re
import tarfile

import numpy as np
import pytest

from engine.core.errors import UserError
from engine.datasets import cifar10
from tests import fixtures

NUM_PER_BATCH = 20
NUM_TEST = 12
HOW_TO_POINT = (r"pass --data_dir=DIR holding cifar-10-batches-py/ or "
                r"cifar-10-python\.tar\.gz$")


def _written(batch_index: int):
  """What `fixtures.write_cifar10` put in batch `batch_index` (0-5)."""
  num = NUM_TEST if batch_index == 5 else NUM_PER_BATCH
  return fixtures.learnable_images(num, (32, 32, 3), 10, batch_index)


def _rewrite_batch(path, edit):
  """Replaces the batch pickled at `path` by `edit(batch)`."""
  batch = pickle.loads(path.read_bytes(), encoding="bytes")
  path.write_bytes(pickle.dumps(edit(batch), protocol=2))


def _error_at(path) -> str:
  """The start of a regex for an error that names the file `path`."""
  return f"^{re.escape(str(path))}: "


@pytest.mark.parametrize("layout, subdir", [
    ("dir", ""), ("dir", "cifar-10-batches-py"), ("tar", "")])
def test_round_trip(tmp_path, layout, subdir):
  fixtures.write_cifar10(str(tmp_path), NUM_PER_BATCH, NUM_TEST, layout)
  splits = cifar10.load(str(tmp_path / subdir))
  train = [_written(i) for i in range(5)]
  expected_images = np.concatenate([images for images, _ in train])
  np.testing.assert_array_equal(splits.train.images, expected_images)
  np.testing.assert_array_equal(
      splits.train.labels, np.concatenate([labels for _, labels in train]))
  test_images, test_labels = _written(5)
  np.testing.assert_array_equal(splits.test.images, test_images)
  np.testing.assert_array_equal(splits.test.labels, test_labels)
  for split in (splits.train, splits.test):
    assert split.images.dtype == np.uint8 and split.labels.dtype == np.int64
    assert split.images.flags.c_contiguous
  info = splits.info
  assert (info.name, info.image_shape, info.num_classes, info.shift_fill) == (
      "cifar10", (32, 32, 3), 10, "constant")
  assert (info.num_train, info.num_test) == (5 * NUM_PER_BATCH, NUM_TEST)
  pixels = expected_images.astype(np.float64)
  assert info.mean == pytest.approx(tuple(pixels.mean(axis=(0, 1, 2))))
  assert info.std == pytest.approx(tuple(pixels.std(axis=(0, 1, 2))))
  assert len(set(info.mean)) == 3  # the channels' statistics are distinct


def test_rows_are_red_green_blue_planes_in_row_major_order(tmp_path):
  """Checks the layout against the CIFAR-10 description, not the fixture."""
  fixtures.write_cifar10(str(tmp_path), NUM_PER_BATCH, NUM_TEST)
  row = np.zeros(3072, np.uint8)
  row[1] = 200  # red, row 0, column 1
  row[1024 + 32] = 100  # green, row 1, column 0
  row[3071] = 50  # blue, row 31, column 31
  _rewrite_batch(tmp_path / "cifar-10-batches-py" / "data_batch_1",
                 lambda batch: {**batch, b"data": row[np.newaxis],
                                b"labels": [3]})
  splits = cifar10.load(str(tmp_path))
  image = splits.train.images[0]
  assert (image[0, 1, 0], image[1, 0, 1], image[31, 31, 2]) == (200, 100, 50)
  assert image.sum() == 350
  assert splits.train.labels[0] == 3
  assert splits.info.num_train == 1 + 4 * NUM_PER_BATCH


def test_extracted_directory_is_preferred_to_the_archive(tmp_path):
  fixtures.write_cifar10(str(tmp_path), NUM_PER_BATCH, NUM_TEST)
  (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not read")
  assert cifar10.load(str(tmp_path)).info.num_train == 5 * NUM_PER_BATCH


def test_data_dir_is_required():
  with pytest.raises(UserError, match="^--data_dir is required for CIFAR-10; "
                     + HOW_TO_POINT):
    cifar10.load("")


def test_missing_directory(tmp_path):
  data_dir = tmp_path / "nowhere"
  with pytest.raises(UserError, match=f"^--data_dir={re.escape(str(data_dir))}"
                     ": no such directory; " + HOW_TO_POINT):
    cifar10.load(str(data_dir))


def test_directory_without_the_data(tmp_path):
  with pytest.raises(UserError, match="holds neither cifar-10-batches-py/ nor "
                     r"cifar-10-python\.tar\.gz; " + HOW_TO_POINT):
    cifar10.load(str(tmp_path))


def test_missing_batch_is_named(tmp_path):
  fixtures.write_cifar10(str(tmp_path), NUM_PER_BATCH, NUM_TEST)
  path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
  path.unlink()
  with pytest.raises(UserError, match=_error_at(path) + "file not found; "
                     "cifar-10-batches-py/ must hold data_batch_1, .*"
                     "test_batch$"):
    cifar10.load(str(tmp_path))


def test_truncated_archive(tmp_path):
  fixtures.write_cifar10(str(tmp_path), NUM_PER_BATCH, NUM_TEST, "tar")
  archive = tmp_path / "cifar-10-python.tar.gz"
  archive.write_bytes(archive.read_bytes()[:archive.stat().st_size // 2])
  with pytest.raises(UserError, match=_error_at(archive) +
                     r"truncated or corrupt archive \(.+\); replace it"):
    cifar10.load(str(tmp_path))


def test_archive_without_the_batches(tmp_path):
  archive = tmp_path / "cifar-10-python.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(__file__, "cifar-10-batches-py/readme.html")
  with pytest.raises(UserError, match=_error_at(archive) + "has no member "
                     "cifar-10-batches-py/data_batch_1, .*; it is not the "
                     "CIFAR-10 python version$"):
    cifar10.load(str(tmp_path))


def test_archive_member_is_named(tmp_path):
  directory = tmp_path / "source"
  fixtures.write_cifar10(str(directory), NUM_PER_BATCH, NUM_TEST)
  batches_dir = directory / "cifar-10-batches-py"
  (batches_dir / "test_batch").write_bytes(b"\x80\x02garbage")
  archive = tmp_path / "cifar-10-python.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(batches_dir, "cifar-10-batches-py")
  with pytest.raises(UserError, match=re.escape(
      f"{archive} member cifar-10-batches-py/test_batch: not a readable")):
    cifar10.load(str(tmp_path))


@pytest.mark.parametrize("content", [
    b"<html>404 not found</html>",
    pickle.dumps({b"data": np.zeros((1, 3072), np.uint8)}, protocol=2)[:-20],
])
def test_garbage_pickle(tmp_path, content):
  fixtures.write_cifar10(str(tmp_path), NUM_PER_BATCH, NUM_TEST)
  path = tmp_path / "cifar-10-batches-py" / "test_batch"
  path.write_bytes(content)
  with pytest.raises(UserError, match=_error_at(path) + r"not a readable "
                     r"pickle \(.+\); the file is truncated or corrupt"):
    cifar10.load(str(tmp_path))


def test_pickle_naming_other_code_is_refused(tmp_path):
  fixtures.write_cifar10(str(tmp_path), NUM_PER_BATCH, NUM_TEST)
  path = tmp_path / "cifar-10-batches-py" / "test_batch"
  path.write_bytes(pickle.dumps(datetime.date(2009, 4, 8)))
  with pytest.raises(UserError, match=_error_at(path) + r"not a readable "
                     r"pickle \(UnpicklingError: refusing to load "
                     r"datetime\.date\)"):
    cifar10.load(str(tmp_path))


@pytest.mark.parametrize("edit, message", [
    (lambda b: {b"data": b[b"data"], b"fine_labels": b[b"labels"]},
     r"not a CIFAR-10 batch \(a dict with keys b'data' and b'labels'\)"),
    (lambda b: [b[b"data"], b[b"labels"]], r"not a CIFAR-10 batch \(.*\)"),
    (lambda b: {**b, b"data": b[b"data"].astype(np.int64)},
     "b'data' is int64, not a uint8 array"),
    (lambda b: {**b, b"data": b[b"data"].tobytes()},
     "b'data' is bytes, not a uint8 array"),
    (lambda b: {**b, b"data": b[b"data"][:, :-1]},
     r"b'data' has 61420 bytes, not a multiple of 3072 \(one 32x32 RGB "
     r"image\)"),
    (lambda b: {**b, b"labels": b[b"labels"][:-1]},
     r"20 images but labels of shape \(19,\)"),
    (lambda b: {**b, b"labels": [1.0] * 20}, "labels are float64, not "
     "integers"),
    (lambda b: {**b, b"labels": [2] * 19 + [10]},
     "labels go from 2 to 10, CIFAR-10 has classes 0 to 9"),
    (lambda b: {**b, b"labels": [-1] + [2] * 19},
     "labels go from -1 to 2, CIFAR-10 has classes 0 to 9"),
])
def test_malformed_batch_is_named(tmp_path, edit, message):
  fixtures.write_cifar10(str(tmp_path), NUM_PER_BATCH, NUM_TEST)
  path = tmp_path / "cifar-10-batches-py" / "data_batch_2"
  _rewrite_batch(path, edit)
  with pytest.raises(UserError, match=_error_at(path) + message + "$"):
    cifar10.load(str(tmp_path))
