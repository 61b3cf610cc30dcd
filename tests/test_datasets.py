import gzip

import numpy as np
import pytest

from engine import datasets
from engine.core.errors import UserError
from engine.datasets import fashion_mnist
from tests import fixtures


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      num_train=50, num_test=20)


def test_fashion_mnist_reads_all_four_files(data_dir):
  splits = datasets.load("fashion_mnist", data_dir)
  info = splits.info
  assert (info.num_train, info.num_test) == (50, 20)
  assert info.image_shape == (28, 28, 1) and info.num_classes == 10
  expected, expected_labels = fixtures.learnable_images(50, (28, 28), 10, 0)
  np.testing.assert_array_equal(splits.train.images[..., 0], expected)
  np.testing.assert_array_equal(splits.train.labels, expected_labels)
  assert splits.train.images.dtype == np.uint8
  assert splits.train.labels.dtype == np.int64
  assert splits.test.images.shape == (20, 28, 28, 1)
  assert info.mean == pytest.approx((expected.mean(),))
  assert info.std == pytest.approx((expected.std(),))


def test_missing_directory_says_how_to_get_the_data(tmp_path):
  with pytest.raises(UserError, match="--data_dir=.*no such directory"):
    datasets.load("fashion_mnist", str(tmp_path / "nowhere"))


def test_missing_file_is_named(tmp_path):
  fixtures.write_fashion_mnist(str(tmp_path), num_train=5, num_test=5)
  (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
  with pytest.raises(UserError, match="t10k-labels-idx1-ubyte.gz is missing"):
    datasets.load("fashion_mnist", str(tmp_path))


def test_images_and_labels_of_different_lengths(tmp_path):
  fixtures.write_fashion_mnist(str(tmp_path), num_train=5, num_test=5)
  labels = gzip.compress(fashion_mnist.encode_idx(np.zeros(6, np.uint8)))
  (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(labels)
  with pytest.raises(UserError, match=r"train images \(5, 28, 28\) and "
                     r"labels \(6,\) do not match"):
    datasets.load("fashion_mnist", str(tmp_path))


def test_unknown_data_set():
  with pytest.raises(UserError, match="--dataset=imagenet22k is unknown"):
    datasets.load("imagenet22k", "")


def test_missing_default_directory_says_which_package(monkeypatch, tmp_path):
  monkeypatch.setattr(fashion_mnist, "DEFAULT_DIR", str(tmp_path / "absent"))
  with pytest.raises(UserError,
                     match="apt-get install dataset-fashion-mnist"):
    datasets.load("fashion_mnist", "")


@pytest.mark.parametrize("flag", ["train_examples", "test_examples"])
def test_a_count_a_loader_does_not_take_is_refused_naming_the_flag(
    data_dir, tmp_path, flag):
  """--train_examples and --test_examples reach tfrecord and synthetic;
  every other loader refuses them in one line rather than drop them."""
  folder = fixtures.write_image_folder(str(tmp_path / "folder"))
  for name, where, extra in (
      ("fashion_mnist", data_dir, {}),
      ("cifar10", fixtures.write_cifar10(str(tmp_path / "cifar")), {}),
      ("arrays", fixtures.write_arrays(str(tmp_path / "a.npz")),
       dict(array_keys=())),
      ("image_folder", folder, dict(image_size=8, channels=3,
                                    validation_split=0.0,
                                    skip_bad_files=False))):
    with pytest.raises(UserError, match=f"^--{flag}=7: --dataset={name} "
                       "counts its own examples.*drop it$"):
      datasets.load(name, data_dir=where, **{flag: 7}, **extra)
    datasets.load(name, data_dir=where, **{flag: 0}, **extra)  # the default


def test_synthetic_makes_the_counts_it_is_given():
  splits = datasets.load("synthetic", image_size=8, channels=1,
                         num_classes=3, train_examples=12, test_examples=5)
  assert (splits.info.num_train, splits.info.num_test) == (12, 5)
  assert len(splits.train.labels) == 12 and len(splits.test.labels) == 5


def test_the_label_kind_is_decided_once_by_the_loader_and_carried(
    data_dir, tmp_path):
  kinds = {labels: datasets.load("fashion_mnist", data_dir,
                                 labels=labels).info.label_kind
           for labels in ("classes", "targets", "masks", "any")}
  assert kinds == {"classes": datasets.LabelKind.CLASSES,
                   "targets": datasets.LabelKind.TARGETS,
                   "masks": datasets.LabelKind.MASKS,
                   "any": datasets.LabelKind.CLASSES}
  # A user's loader that does not say: decided from the labels' shape.
  def info(label_shape, label_dtype):
    return datasets.DatasetInfo(
        name="mine", image_shape=(8, 8, 1), num_classes=2, num_train=1,
        num_test=1, mean=(0.0,), std=(1.0,), label_shape=label_shape,
        label_dtype=label_dtype).label_kind
  assert info((), "int64") == datasets.LabelKind.CLASSES
  assert info((3,), "float32") == datasets.LabelKind.TARGETS
  assert info((8, 8), "uint8") == datasets.LabelKind.MASKS
  assert info((8, 8), "float32") == datasets.LabelKind.OTHER
  with pytest.raises(UserError, match=r"^Task.labels = 'boxes': give one "
                     "of classes, targets, masks, other or any"):
    datasets.LabelKind.of("boxes")
