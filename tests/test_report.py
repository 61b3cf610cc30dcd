import glob
import json
import logging as python_logging
import os

from absl import logging as absl_logging
import numpy as np
import pytest
import tensorflow as tf

from engine.core import run_files
from engine.records import report
from engine.tasks.classification import Classification
from tests import fixtures

RECORD = {"epoch": 1, "global_step": 30, "train_loss": 1.5,
          "train_accuracy": 0.5, "val_loss": 1.25, "val_accuracy": 0.625,
          "learning_rate": 0.01, "images_per_sec": 1000.0,
          "input_seconds": 0.5, "step_seconds": 2.0, "epoch_seconds": 3.0,
          "cumulative_seconds": 3.0, "world_size": 2}


def events(model_dir, run):
  """(tag, step, value) of TensorBoard run `run` ("train", "validation",
  "" for the run's own) in the order written."""
  found = []
  for path in sorted(glob.glob(os.path.join(model_dir, "tensorboard", run,
                                            "events.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        found.append((value.tag, event.step, value))
  return found


def scalars(model_dir, run):
  return {(tag, step): float(tf.make_ndarray(value.tensor))
          for tag, step, value in events(model_dir, run)
          if value.metadata.plugin_data.plugin_name == "scalars"}


def test_chief_writes_metrics_jsonl_and_tensorboard_scalars(tmp_path):
  reporter = report.Reporter(str(tmp_path), chief=True, epochs=2)
  reporter.epoch(RECORD)
  reporter.epoch({**RECORD, "epoch": 2, "global_step": 60, "val_loss": 1.0})
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(l) for l in lines][0] == RECORD
  # The Keras callback's layout: train and validation runs with the same
  # tags, indexed by the epoch. Stored as float32.
  train, val = scalars(str(tmp_path), "train"), scalars(str(tmp_path),
                                                       "validation")
  assert val[("epoch_loss", 1)] == 1.25 and val[("epoch_loss", 2)] == 1.0
  assert train[("epoch_accuracy", 1)] == 0.5
  assert train[("epoch_learning_rate", 2)] == pytest.approx(0.01)
  assert train[("epoch_images_per_sec", 1)] == 1000.0
  assert {tag for tag, _ in val} == {"epoch_loss", "epoch_accuracy"}
  assert {tag for tag, _ in val} < {tag for tag, _ in train}
  assert {(run, tag) for run, tag in report.epoch_scalars(RECORD).values()} == \
      {("train", tag) for tag, _ in train} | {("validation", tag)
                                              for tag, _ in val}


def test_other_ranks_write_nothing(tmp_path):
  report.Reporter(str(tmp_path), chief=False, epochs=1).epoch(RECORD)
  assert not os.listdir(tmp_path)


def test_the_chief_writes_the_confusion_image_each_epoch(tmp_path):
  reporter = report.Reporter(str(tmp_path), chief=True, epochs=2)
  reporter.epoch(RECORD, Classification(num_classes=4).summary_images(
      {"confusion": np.eye(4)}))
  images = [value for tag, step, value in events(str(tmp_path), "validation")
            if tag == "confusion_matrix" and step == 1]
  assert len(images) == 1
  assert images[0].metadata.plugin_data.plugin_name == "images"


def test_a_resume_drops_damaged_lines_and_keeps_events(tmp_path):
  metrics = tmp_path / run_files.METRICS_FILE
  metrics.write_text('{"epoch": 1, "val_accuracy": 0.5}\n'
                     '{"event": "rollback", "epoch": 1}\n'
                     '{"epoch": 2, "val_acc\n'  # a write cut short
                     '[1, 2]\n'
                     '{"epoch": 2, "val_accuracy": 0.6}\n')
  report.Reporter(str(tmp_path), chief=True, epochs=3).keep_epochs_up_to(1)
  assert metrics.read_text() == ('{"epoch": 1, "val_accuracy": 0.5}\n'
                                 '{"event": "rollback", "epoch": 1}\n')


def test_within_epoch_scalars_go_to_the_train_run_by_global_step(tmp_path):
  reporter = report.Reporter(str(tmp_path), chief=True, epochs=2)
  reporter.steps(10, dict(loss=2.0, accuracy=0.25, learning_rate=0.1,
                          step_seconds=0.5))
  reporter.steps(20, dict(loss=1.5, accuracy=0.5, learning_rate=0.2,
                          step_seconds=0.25))
  reporter.flush()
  assert scalars(str(tmp_path), "train") == {
      ("batch_loss", 10): 2.0, ("batch_accuracy", 10): 0.25,
      ("batch_learning_rate", 10): pytest.approx(0.1),
      ("batch_step_seconds", 10): 0.5, ("batch_loss", 20): 1.5,
      ("batch_accuracy", 20): 0.5,
      ("batch_learning_rate", 20): pytest.approx(0.2),
      ("batch_step_seconds", 20): 0.25}


def test_the_run_records_its_hparams_and_figures_for_the_dashboard(tmp_path):
  reporter = report.Reporter(str(tmp_path), chief=True, epochs=3)
  reporter.hparams(dict(model="cnn", base_lr=0.01, processes=2))
  targets = dict(target_accuracy_first_epoch=None,
                 target_accuracy_first_seconds=None)
  reporter.epoch({**RECORD, **targets})
  reporter.epoch({**RECORD, **targets, "epoch": 2, "val_accuracy": 0.75,
                  "images_per_sec": 1200.0, "target_accuracy_first_epoch": 2,
                  "target_accuracy_first_seconds": 6.0})
  reporter.epoch({**RECORD, **targets, "epoch": 3, "val_accuracy": 0.7,
                  "images_per_sec": 1100.0, "target_accuracy_first_epoch": 2,
                  "target_accuracy_first_seconds": 6.0})
  own = events(str(tmp_path), "")
  [hparams] = [value for tag, _, value in own
               if value.metadata.plugin_data.plugin_name == "hparams"]
  assert b"cnn" in hparams.metadata.plugin_data.content
  figures = scalars(str(tmp_path), "")
  assert figures[("best_val_accuracy", 3)] == 0.75
  assert figures[("final_val_accuracy", 3)] == pytest.approx(0.7)
  assert figures[("seconds_to_target", 3)] == 6.0
  assert figures[("images_per_sec", 3)] == 1150.0  # median, epoch 1 aside
  assert ("seconds_to_target", 1) not in figures  # not reached yet


def test_a_resume_drops_what_was_written_after_its_point(tmp_path):
  first = report.Reporter(str(tmp_path), chief=True, epochs=3)
  for epoch in (1, 2, 3):
    for step in (10, 20, 30):
      first.steps(30 * (epoch - 1) + step, dict(loss=1.0))
    first.epoch({**RECORD, "epoch": epoch, "global_step": 30 * epoch})
  first.event({"event": "rollback", "epoch": 1})
  first.event({"event": "end", "state": "stopped", "signal": "SIGTERM"})
  first.close()
  # Resumed from a checkpoint at epoch 2, step 15 (global step 75).
  report.Reporter(str(tmp_path), chief=True, epochs=3).keep_epochs_up_to(
      2, 75)
  records = [json.loads(line) for line in
             (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r.get("epoch") for r in records] == [1, 2, 1]
  assert records[-1]["event"] == "rollback"  # the end record went
  assert sorted(step for tag, step in scalars(str(tmp_path), "train")
                if tag == "batch_loss") == [10, 20, 30, 40, 50, 60, 70]
  assert sorted(step for tag, step in scalars(str(tmp_path), "validation")
                if tag == "epoch_accuracy") == [1, 2]
  assert sorted(step for tag, step in scalars(str(tmp_path), "")
                if tag == "final_val_accuracy") == [1, 2]


def test_tensorflows_own_info_lines_are_dropped_and_its_warnings_kept(
    tmp_path, caplog):
  report.configure_logging(chief=True)
  absl_logger = absl_logging.get_absl_logger()
  with caplog.at_level(python_logging.INFO):
    # TensorFlow 2.21 logs "Sharding callback duration" at every save.
    tf.train.Checkpoint(v=tf.Variable(1.0)).write(str(tmp_path / "ckpt"))
    absl_logging.info("the engine's own line")
  assert "the engine's own line" in caplog.text
  assert "Sharding callback" not in caplog.text
  inside = os.path.join(os.path.dirname(tf.__file__), "python", "x.py")
  for level, kept in [(python_logging.INFO, False),
                      (python_logging.WARNING, True)]:
    record = absl_logger.makeRecord("absl", level, inside, 1, "m", (), None)
    assert bool(absl_logger.filter(record)) == kept


def test_a_step_report_goes_to_tensorboard_at_its_windows_last_step(
    tmp_path):
  from engine.records import step_report, step_table  # pylint: disable=import-outside-toplevel
  found = step_report.across(
      [step_report.of_rank([dict(input=0.001, forward=0.002, backward=0.003,
                                 communication=0.004, optimizer=0.001,
                                 launch_and_read=0.001,
                                 between_calls=0.001)])] * 2,
      (4, 5), fixtures.step_settings(gradient_bytes=4_000_000))
  reporter = report.Reporter(str(tmp_path), chief=True, epochs=1)
  reporter.step_report(found, step_table.table(found))
  reporter.close()
  figures = scalars(str(tmp_path), "train")
  assert figures[("profile/step_ms", 5)] == pytest.approx(13.0)
  assert figures[("profile/communication_ms", 5)] == pytest.approx(4.0)
  assert figures[("profile/slowest_by_ms", 5)] == pytest.approx(0.0)
  # 4 MB in 4 ms, each rank sending half twice: 8 Gbit/s.
  assert figures[("profile/bus_gbit", 5)] == pytest.approx(8.0)
  texts = [value for tag, step, value in events(str(tmp_path), "train")
           if tag == "profile/report" and step == 5]
  text = tf.make_ndarray(texts[0].tensor).item().decode()
  assert "compute-bound: " in text and "  try --mixed_precision" in text
  # Indexed by the step, as the batch scalars: a resume before it drops it.
  report.Reporter(str(tmp_path), chief=True, epochs=1).keep_epochs_up_to(
      1, 4)
  assert not [tag for tag, _ in scalars(str(tmp_path), "train")
              if tag.startswith("profile/")]
  report.Reporter(str(tmp_path), chief=False, epochs=1).step_report(
      found, "")  # another rank: nothing, and no error
