import glob
import json
import os

import pytest
import tensorflow as tf

from engine import report

RECORD = {"epoch": 1, "global_step": 30, "train_loss": 1.5,
          "train_accuracy": 0.5, "val_loss": 1.25, "val_accuracy": 0.625,
          "learning_rate": 0.01, "images_per_sec": 1000.0,
          "input_seconds": 0.5, "step_seconds": 2.0, "epoch_seconds": 3.0,
          "cumulative_seconds": 3.0, "world_size": 2}


def scalars(model_dir):
  values = {}
  files = glob.glob(os.path.join(model_dir, "tensorboard", "events.*"))
  for path in files:
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        values[(value.tag, event.step)] = float(
            tf.make_ndarray(value.tensor))
  return values


def test_chief_writes_metrics_jsonl_and_tensorboard_scalars(tmp_path):
  reporter = report.Reporter(str(tmp_path), chief=True, epochs=2)
  reporter.epoch(RECORD)
  reporter.epoch({**RECORD, "epoch": 2, "global_step": 60, "val_loss": 1.0})
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(l) for l in lines][0] == RECORD
  values = scalars(str(tmp_path))  # stored as float32
  assert values[("val/loss", 30)] == 1.25 and values[("val/loss", 60)] == 1.0
  assert values[("train/accuracy", 30)] == 0.5
  assert values[("learning_rate", 60)] == pytest.approx(0.01)
  assert values[("images_per_sec", 30)] == 1000.0
  assert {tag for tag, _ in values} == set(report.SCALARS.values())


def test_other_ranks_write_nothing(tmp_path):
  report.Reporter(str(tmp_path), chief=False, epochs=1).epoch(RECORD)
  assert not os.listdir(tmp_path)
