"""--dataset=arrays: .npz, a directory of .npy files, HDF5; and from_arrays."""
import h5py
import numpy as np
import pytest

from engine import datasets
from engine.core.errors import UserError
from engine.datasets import ArrayRows, Examples
from engine.datasets import Augmentation, Epochs, Shard
from tests import fixtures

FORMATS = ["a.npz", "a.h5", "npy_dir"]


def load(path, **overrides):
  params = dict(data_dir=str(path), array_keys=())
  params.update(overrides)
  return datasets.load("arrays", **params)


@pytest.fixture(scope="module", params=FORMATS)
def stored(request, tmp_path_factory):
  return fixtures.write_arrays(str(tmp_path_factory.mktemp("arrays") /
                                   request.param))


def test_every_format_reads_the_same_arrays_by_rows(stored):
  splits = load(stored)
  assert isinstance(splits.train, ArrayRows)
  expected, labels = fixtures.learnable_images(61, (12, 12), 4, 0)
  np.testing.assert_array_equal(splits.train.labels, labels)
  rows = [0, 3, 60]
  np.testing.assert_array_equal(splits.train.images.read(rows),
                                expected[rows][..., None])
  info = splits.info
  assert info.image_shape == (12, 12, 1)  # H x W: one channel
  assert (info.num_train, info.num_test, info.num_classes) == (61, 23, 4)
  assert info.class_names == ("class_0", "class_1", "class_2", "class_3")
  assert info.image_dtype == "uint8"


def test_each_rank_reads_its_rows_and_eval_covers_the_split(stored):
  splits = load(stored)
  _, test_labels = fixtures.learnable_images(23, (12, 12), 4, 1)
  seen = []
  for images, labels in fixtures.eval_batches_of_every_rank(
      splits.test, splits.info, world_size=2, batch_size=5):
    assert images.shape[1:] == (12, 12, 1)
    seen += labels.numpy().tolist()
  assert sorted(seen) == sorted(test_labels.tolist())
  stream = datasets.train_stream(
      splits.train, splits.info,
      shard=Shard(1, 2),
      epochs=Epochs(batch_size=8, steps=5, seed=0),
      augmentation=Augmentation(flip=False, shift=0.0),
      first_epoch=0)
  # 30 odd-numbered rows, read in 5 batches of 8 (two passes).
  labels = np.concatenate([l.numpy() for _, l in stream.take(5)])
  assert set(labels) <= set(splits.train.labels[1::2].tolist())


def test_the_formats_train_alike(tmp_path):
  streams = []
  for name in FORMATS:
    splits = load(fixtures.write_arrays(str(tmp_path / name)))
    stream = datasets.train_stream(
        splits.train, splits.info,
        shard=Shard(0, 2),
        epochs=Epochs(batch_size=8, steps=3, seed=2),
        augmentation=Augmentation(flip=True, shift=0.1),
        first_epoch=1)
    streams.append([(i.numpy(), l.numpy()) for i, l in stream.take(3)])
  for other in streams[1:]:
    for (images, labels), (again, again_labels) in zip(streams[0], other):
      np.testing.assert_array_equal(labels, again_labels)
      np.testing.assert_array_equal(images, again)


def test_float_images_and_renamed_keys(tmp_path):
  path = str(tmp_path / "f.npz")
  x, y = fixtures.learnable_images(20, (8, 8, 3), 2, 0)
  np.savez(path, images=x / 255.0, labels=y, tx=x[:5] / 255.0, ty=y[:5])
  splits = load(path, array_keys=("x_train=images", "y_train=labels",
                                  "x_test=tx", "y_test=ty"))
  assert splits.info.image_dtype == "float32"
  assert splits.info.image_shape == (8, 8, 3)
  assert 0 < splits.info.mean[0] < 1
  assert splits.info.classes() == ("0", "1")


def test_a_compressed_npz_is_read_into_memory(tmp_path):
  path = str(tmp_path / "c.npz")
  x, y = fixtures.learnable_images(20, (8, 8), 3, 0)
  np.savez_compressed(path, x_train=x, y_train=y, x_test=x, y_test=y)
  splits = load(path)
  assert isinstance(splits.train, Examples)
  np.testing.assert_array_equal(splits.train.images[..., 0], x)


def test_from_arrays_is_in_memory_and_checked():
  x, y = fixtures.learnable_images(20, (8, 8), 3, 0)
  splits = datasets.from_arrays(x, y, x, y, class_names=["a", "b", "c"])
  assert isinstance(splits.train, Examples)
  assert splits.info.classes() == ("a", "b", "c")
  with pytest.raises(UserError, match="y_test: 19 labels for 20 images"):
    datasets.from_arrays(x, y, x, y[:-1])


# Bad data: one line naming the file and what is wrong.

def bad_npz(tmp_path, **changes):
  x, y = fixtures.learnable_images(20, (8, 8), 3, 0)
  arrays = dict(x_train=x, y_train=y, x_test=x[:6], y_test=y[:6])
  arrays.update(changes)
  path = str(tmp_path / "bad.npz")
  np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
  return path


@pytest.mark.parametrize("changes, message", [
    (dict(y_test=np.array([0, 1, 2, 3, 1, 0])),
     r"bad.npz:y_test: label 3 is out of range \(y_train's labels go up to "
     "2\\)"),
    (dict(y_train=np.full(20, -1)), "bad.npz:y_train: label -1 is out of "
     "range"),
    (dict(y_train=np.zeros(19, np.int64)),
     "bad.npz:y_train: 19 labels for 20 images in x_train"),
    (dict(x_train=np.zeros((20, 8), np.uint8)),
     r"bad.npz:x_train: images of shape \[20, 8\]; give N x H x W x C"),
    (dict(x_test=np.zeros((6, 4, 4), np.uint8)),
     "x_train images are 8x8x1 but x_test images are 4x4x1"),
    (dict(y_train=np.full(20, 0.5)), "bad.npz:y_train: labels of type "
     "float64 that are not whole numbers"),
    (dict(x_train=np.zeros((20, 8, 8), np.int32)),
     "bad.npz:x_train: images of type int32; give uint8 or float"),
    (dict(y_test=None), r"bad.npz: no y_test \(it holds x_test, x_train, "
     "y_train\\)"),
])
def test_bad_arrays_are_named(tmp_path, changes, message):
  with pytest.raises(UserError, match=message):
    load(bad_npz(tmp_path, **changes))


def test_bad_paths_and_files_are_named(tmp_path):
  with pytest.raises(UserError, match="no such file or directory"):
    load(tmp_path / "none.npz")
  (tmp_path / "x.csv").write_text("1,2\n")
  with pytest.raises(UserError, match="x.csv: not an .npz, .h5 or .hdf5"):
    load(tmp_path / "x.csv")
  (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really")
  with pytest.raises(UserError, match="broken.npz: not a readable .npz"):
    load(tmp_path / "broken.npz")
  (tmp_path / "broken.h5").write_bytes(b"\x89HDF garbage")
  with pytest.raises(UserError, match="broken.h5: not a readable HDF5"):
    load(tmp_path / "broken.h5")


def test_a_truncated_npy_is_named(tmp_path):
  directory = fixtures.write_arrays(str(tmp_path / "npy"))
  path = tmp_path / "npy" / "x_train.npy"
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(UserError, match="x_train.npy: truncated"):
    load(directory)


def test_hdf5_keys_are_renamed(tmp_path):
  path = str(tmp_path / "k.h5")
  x, y = fixtures.learnable_images(10, (8, 8), 2, 0)
  with h5py.File(path, "w") as f:
    f["train/x"], f["y"], f["tx"], f["ty"] = x, y, x, y
  with pytest.raises(UserError, match="k.h5: no x_train"):
    load(path)
  splits = load(path, array_keys=("x_train=train/x", "y_train=y",
                                  "x_test=tx", "y_test=ty"))
  assert splits.info.num_train == 10
