import glob
import json
import os

import numpy as np
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


def test_the_confusion_matrix_is_drawn_row_by_row():
  counts = np.array([[3, 1, 0], [0, 0, 0], [0, 2, 2]], np.float64)
  image = report.confusion_image(counts, size=30)
  assert image.shape == (1, 30, 30, 3) and image.dtype == np.uint8
  cell = image[0, 5::10, 5::10, 0]  # the red channel at each cell's centre
  # Darker is larger: 3/4 < 1/4 < 0, and an empty row is white.
  assert cell[0, 0] < cell[0, 1] < cell[0, 2] == 255
  assert list(cell[1]) == [255, 255, 255]
  assert cell[2, 1] == cell[2, 2] < cell[2, 0]


def test_the_chief_writes_the_confusion_image_each_epoch(tmp_path):
  reporter = report.Reporter(str(tmp_path), chief=True, epochs=2)
  reporter.epoch(RECORD, np.eye(4))
  [path] = glob.glob(os.path.join(tmp_path, "tensorboard", "events.*"))
  images = [value for event in tf.compat.v1.train.summary_iterator(path)
            for value in event.summary.value
            if value.tag == "val/confusion_matrix"]
  assert len(images) == 1
  assert images[0].metadata.plugin_data.plugin_name == "images"


def test_a_resume_drops_damaged_lines_and_keeps_events(tmp_path):
  metrics = tmp_path / report.METRICS_FILE
  metrics.write_text('{"epoch": 1, "val_accuracy": 0.5}\n'
                     '{"event": "rollback", "epoch": 1}\n'
                     '{"epoch": 2, "val_acc\n'  # a write cut short
                     '[1, 2]\n'
                     '{"epoch": 2, "val_accuracy": 0.6}\n')
  report.Reporter(str(tmp_path), chief=True, epochs=3).keep_epochs_up_to(1)
  assert metrics.read_text() == ('{"epoch": 1, "val_accuracy": 0.5}\n'
                                 '{"event": "rollback", "epoch": 1}\n')
