"""Augmentation as the task's targets allow (engine/datasets/splits.py,
Task.augmentation_keeps_targets): flips and shifts by default only where
the task says its targets are kept, a warning where a flag asks anyway."""
import logging

from absl import flags
import numpy as np

from engine import train as train_lib
from engine.datasets import Augmentation, DatasetInfo
from engine.tasks import Classification, Reconstruction, Regression
from engine.tasks import Segmentation, Task
import flags as engine_flags
from tests import fixtures

IMAGES = DatasetInfo(name="images", image_shape=(16, 16, 1), num_classes=0,
                     num_train=1, num_test=1, mean=(0.0,), std=(1.0,),
                     label_shape=(2,), label_dtype="float32")
MASKS = DatasetInfo(name="masks", image_shape=(16, 16, 1), num_classes=3,
                    num_train=1, num_test=1, mean=(0.0,), std=(1.0,),
                    label_shape=(16, 16), label_dtype="int64")
VOLUMES = DatasetInfo(name="volumes", image_shape=(8, 8, 8, 4),
                      num_classes=0, num_train=1, num_test=1,
                      mean=(0.0,) * 4, std=(1.0,) * 4, label_shape=(4,),
                      label_dtype="float32")


def test_the_defaults_apply_only_to_tasks_whose_targets_are_kept(caplog):
  data = fixtures.train_config().data  # the flags' defaults, none given
  assert (data.random_flip, data.random_shift) == (True, 0.1)
  assert not data.given_augmentation
  # Labels, masks that move with their images, the images themselves, and
  # CosmoFlow's volumes, whose physics no flip changes.
  for task in (Classification(num_classes=2), Segmentation(MASKS),
               Reconstruction(IMAGES), Regression(VOLUMES)):
    kept = Augmentation.requested(data, task)
    assert (kept.flip, kept.shift) == (True, 0.1), task
  # A position, which a flip moves; a user's task that does not say.
  for task in (Regression(IMAGES), Task()):
    moved = Augmentation.requested(data, task)
    assert (moved.flip, moved.shift, moved.transpose) == (False, 0.0, False)
  assert not caplog.records
  assert Augmentation.requested(data).flip  # no task: as the flags say


def test_a_flag_given_for_targets_not_kept_applies_with_one_warning(caplog):
  data = fixtures.train_config(data=dict(
      random_flip=True, random_shift=0.2,
      given_augmentation=("random_flip",))).data
  with caplog.at_level(logging.WARNING):
    asked = Augmentation.requested(data, Regression(IMAGES))
  assert (asked.flip, asked.shift) == (True, 0.0)  # the shift: not given
  [line] = [r.getMessage() for r in caplog.records]
  assert line.startswith("--random_flip moves the training images of "
                         "Regression and not its targets")
  assert "learned wrong" in line


def test_the_config_knows_which_augmentation_flags_were_given(monkeypatch):
  monkeypatch.setattr(flags.FLAGS["random_shift"], "present", 1)
  given = engine_flags.config_from_flags().data.given_augmentation
  assert given == ("random_shift",)


def write_squares(path, *, seed=0) -> str:
  """16x16 noise with a bright 4x4 square; the targets its centre (x, y)
  in pixels, which a horizontal flip moves."""
  rng = np.random.default_rng(seed)
  arrays = {}
  for split, count in (("train", 512), ("test", 128)):
    images = rng.integers(0, 60, (count, 16, 16)).astype(np.uint8)
    corners = rng.integers(0, 13, (count, 2))
    for image, (x, y) in zip(images, corners):
      image[y:y + 4, x:x + 4] = 220
    arrays[f"x_{split}"] = images
    arrays[f"y_{split}"] = (corners + 1.5).astype(np.float32)
  np.savez(path, **arrays)
  return path


def test_a_position_is_learned_far_better_without_the_flips_it_forbids(
    tmp_path):
  """The default for a regression of positions takes no flips or shifts;
  flips forced on move the square and leave its centre behind."""
  data_dir = write_squares(str(tmp_path / "squares.npz"))

  def val_mae(name, **data):
    config = fixtures.train_config(
        data=dict(name="arrays", dir=data_dir, **data),
        task=dict(name="regression"), model=dict(name="cnn"),
        optimization=dict(optimizer="adam", base_lr=0.003,
                          lr_schedule="constant", warmup_epochs=0.0),
        training=dict(model_dir=str(tmp_path / name), batch_size=32,
                      epochs=6, progress="none"))
    return train_lib.train(config).history[-1]["val_mae"]

  default = val_mae("default")
  flipped = val_mae("flipped", random_flip=True,
                    given_augmentation=("random_flip",))
  assert default < 0.5 * flipped, (default, flipped)


def test_flags_txt_records_only_the_augmentation_flags_given(monkeypatch):
  """So a run started again from its flags.txt decides as the run did."""
  import flags as engine_flags  # pylint: disable=import-outside-toplevel
  fixtures.train_config()  # parses the flags
  lines = engine_flags.as_flagfile().splitlines()
  assert not [l for l in lines if l.startswith("--random_")]
  monkeypatch.setattr(flags.FLAGS["random_flip"], "present", 1)
  lines = engine_flags.as_flagfile().splitlines()
  assert [l for l in lines if l.startswith("--random_")] == ["--random_flip"]
