"""The training loop, run for real on one process (engine/train.py)."""
import gzip
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from engine import build as engine_build
from engine.records import start_up
from engine.records import checkpoint_variables
from engine.compute import precision
from models import whitening
import models
from tests import fixtures


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      num_train=200, num_test=50)


def test_early_stopping_stops_at_the_right_epoch_and_says_when(data_dir,
                                                               tmp_path):
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}", "--epochs=6",
       "--batch_size=20", "--steps_per_epoch=5", f"--model_dir={tmp_path}",
       "--target_accuracy=0.01", "--patience=3", "--progress=none"])
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(l) for l in
             (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["epoch"] for r in records] == [1, 2, 3]  # patience 3, reached at 1
  assert all(r["target_accuracy_first_epoch"] == 1 for r in records)
  assert records[0]["target_accuracy_first_seconds"] == pytest.approx(
      records[0]["cumulative_seconds"])
  assert "stopping early" in result.stderr
  assert "first reached at epoch 1" in result.stderr


def test_a_cpu_run_is_warned_of_float16_and_xla_and_of_nothing_else(caplog):
  # pylint: disable-next=protected-access
  warn = start_up._warn_about_slow_options_on_cpu
  warn(fixtures.train_config(), precision.Choice(mode="none"))
  warn(fixtures.train_config(), precision.Choice(mode="bfloat16"))
  assert not caplog.records
  warn(fixtures.train_config(performance=dict(xla=True)),
       precision.Choice(mode="float16"))
  messages = [r.getMessage() for r in caplog.records]
  assert len(messages) == 2
  assert messages[0].startswith("--mixed_precision=float16 on CPU")
  assert messages[1].startswith("--xla on CPU")


def test_evaluation_every_n_epochs_and_always_after_the_last(data_dir,
                                                             tmp_path):
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}", "--epochs=5",
       "--batch_size=20", "--steps_per_epoch=3", f"--model_dir={tmp_path}",
       "--eval_every_epochs=2", "--progress=none"])
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(l) for l in
             (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evaluated = [r["epoch"] for r in records if r["val_accuracy"] is not None]
  assert evaluated == [2, 4, 5]
  assert [r["val_loss"] is None for r in records] == [
      True, False, True, False, False]
  assert "epoch 1/5  train loss" in result.stderr
  assert result.stderr.count("| not evaluated |") == 2


def test_a_resumed_run_goes_on_counting_towards_early_stopping(data_dir,
                                                               tmp_path):
  # Reached at epoch 1 and counted twice before the first job ends: the
  # resumed job stops after its first epoch (patience 3), remembering when
  # the target was first reached, rather than counting from 0 again; on 2
  # processes, both of which must stop there (rank 0 restores the count,
  # and a rank that went on alone would wait for the other and fail).
  def launch(epochs):
    result = fixtures.launch(
        ["-m", "engine.train", f"--data_dir={data_dir}", f"--epochs={epochs}",
         "--batch_size=10", "--steps_per_epoch=5", f"--model_dir={tmp_path}",
         "--target_accuracy=0.01", "--patience=3", "--progress=none"],
        processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(l) for l in
            (tmp_path / "metrics.jsonl").read_text().splitlines()]

  first = launch(2)
  records = launch(6)
  assert [r["epoch"] for r in records] == [1, 2, 3]
  assert records[-1]["stopped_early"]
  assert records[-1]["target_accuracy_first_epoch"] == 1
  assert records[-1]["target_accuracy_first_seconds"] == pytest.approx(
      first[0]["cumulative_seconds"])


def test_a_whitened_stem_is_fitted_to_the_first_training_images_and_frozen(
    data_dir, tmp_path):
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}", "--epochs=2",
       "--batch_size=20", "--steps_per_epoch=3", f"--model_dir={tmp_path}",
       "--model=resnet9", "--filters=4", "--stem=whitened",
       "--progress=none"])
  assert result.returncode == 0, result.stderr[-3000:]
  with gzip.open(os.path.join(data_dir, "train-images-idx3-ubyte.gz")) as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(
        -1, 28, 28, 1)[:engine_build.ADAPTED_IMAGES]
  statistics = json.loads((tmp_path / "normalization.json").read_text())
  fitted = whitening.PatchWhitening(2)
  fitted.adapt((images - np.float32(statistics["mean"]))
               / np.float32(statistics["std"]))
  # The first layer's, restored into the same model (the checkpoint keys
  # its variables by their places in Keras' list of them).
  restored = models.build("resnet9", input_shape=(28, 28, 1), num_classes=10,
                          filters=4, stem="whitened")
  tf.train.Checkpoint(model_variables=tf.train.Checkpoint(
      **checkpoint_variables.keyed(restored.variables))).restore(
          tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
      ).expect_partial()
  stem = restored.get_layer("whitening")
  kernel, bias = stem.kernel.numpy(), stem.bias.numpy()
  assert kernel.shape == (2, 2, 1, 8) and bias.shape == (8,)
  np.testing.assert_allclose(kernel, fitted.kernel.numpy(), rtol=1e-5,
                             atol=1e-6)
  assert np.abs(bias).max() > 0  # learnt, from zeros
