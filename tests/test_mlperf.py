"""The MLPerf HPC log (--mlperf_log, engine/records/mlperf.py) of a real run,
checked by mlperf-logging's own compliance checker.

One run of `engine.train` on 2 processes, CosmoFlow's way: volumes in
GZIP TFRecords staged to a node-local directory, the cosmoflow model, SGD
with warmup and step decay, --target on the validation MAE. The volumes'
targets lie within ±0.05 (CosmoFlow's span ±1), so the model's first
predictions are already under the closed division's 0.124: the checker
demands a run that reached it, and these tests check the log, not the
learning. Then the same run resumed, whose appended log is no submission,
and the one-line errors.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from engine.tools import make_volumes
from tests import fixtures
from tests import timeouts

# The newest HPC ruleset mlperf-logging (requirements.txt) holds.
RULESET = "3.0.0"
SIZE, CHANNELS = 16, 2
FLAGS = ["--dataset=tfrecord", "--log_transform", "--task=regression",
         "--model=cosmoflow", "--filters=2", "--optimizer=sgd",
         "--base_lr=0.001", "--warmup_epochs=1", "--lr_schedule=step",
         "--lr_decay_epochs=2", "--lr_decay_factor=0.5", "--batch_size=4",
         "--target=0.124", "--patience=2", "--progress=none",
         "--mlperf_org=tests", "--mlperf_platform=ci"]


def write_volumes(directory: str) -> str:
  """CosmoFlow's layout (make_volumes'), 2 volumes a file: Poisson counts,
  4 targets each within ±0.05."""
  rng = np.random.default_rng(0)
  for split, count in (("train", 16), ("validation", 8)):
    os.makedirs(os.path.join(directory, split))
    for index in range(count // 2):
      path = os.path.join(directory, split, f"cosmo_{index:05d}.tfrecord.gz")
      with tf.io.TFRecordWriter(path, "GZIP") as writer:
        for _ in range(2):
          writer.write(make_volumes.example(
              rng.poisson(64, (SIZE, SIZE, SIZE, CHANNELS)).astype(np.int16),
              rng.uniform(-0.05, 0.05, 4).astype(np.float32)))
  with open(os.path.join(directory, make_volumes.FEATURES_FILE), "w") as f:
    f.write(f"x:raw_int16:{SIZE}x{SIZE}x{SIZE}x{CHANNELS}\ny:float32:4\n")
  return directory


def train(data_dir, model_dir, *extra, processes=1):
  return fixtures.launch(
      ["-m", "engine.train", *FLAGS, f"--data_dir={data_dir}",
       f"--model_dir={model_dir}", *extra], processes=processes)


def check(log_path, out_dir) -> subprocess.CompletedProcess:
  """The compliance checker on `log_path`, as a submitter runs it."""
  return subprocess.run(
      [fixtures.PYTHON, "-m", "mlperf_logging.compliance_checker", "--usage",
       "hpc", "--ruleset", RULESET, "--log_output",
       os.path.join(out_dir, "checker.log"), log_path],
      cwd=out_dir, capture_output=True, text=True,
      timeout=timeouts.bound(120))


def lines(log_path) -> list[dict]:
  with open(log_path) as f:
    return [json.loads(line.removeprefix(":::MLLOG ")) for line in f]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = tmp_path_factory.mktemp("mlperf")
  data_dir = write_volumes(str(out / "volumes"))
  (out / "stage").mkdir()
  model_dir = out / "run"
  result = train(data_dir, model_dir, "--epochs=2",
                 f"--stage_dir={out / 'stage'}",
                 f"--mlperf_log={model_dir / 'mlperf.log'}", processes=2)
  assert result.returncode == 0, result.stderr[-3000:]
  return out, data_dir, model_dir


def test_the_log_passes_the_hpc_compliance_checker(run):
  out, _, model_dir = run
  result = check(str(model_dir / "mlperf.log"), str(out))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "closed_cosmoflow.yaml" in result.stderr
  assert result.stderr.rstrip().endswith("SUCCESS")


def test_rank_0_logs_the_run_its_epochs_and_that_it_reached_its_target(run):
  _, _, model_dir = run
  logged = lines(model_dir / "mlperf.log")
  keys = [line["key"] for line in logged]
  # Once each (rank 0 alone writes), in the order of the run.
  assert keys[:3] == ["init_start", "staging_start", "staging_stop"]
  assert keys.index("init_stop") + 1 == keys.index("run_start")
  assert keys[-1] == "run_stop" and keys.count("run_start") == 1
  epochs = [line for line in logged if "epoch_num" in line["metadata"]]
  assert [(line["key"], line["metadata"]["epoch_num"]) for line in epochs] \
      == [(key, epoch) for epoch in (1, 2) for key in (
          "epoch_start", "eval_start", "eval_stop", "eval_error",
          "epoch_stop")]
  times = [line["time_ms"] for line in logged[keys.index("run_start"):]]
  assert times == sorted(times)
  records = [json.loads(line) for line in
             (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert [line["value"] for line in logged if line["key"] == "eval_error"] \
      == [record["val_mae"] for record in records if "epoch" in record]
  values = {line["key"]: line["value"] for line in logged}
  assert {key: values[key] for key in (
      "submission_benchmark", "submission_division", "submission_org",
      "submission_platform", "global_batch_size", "train_samples",
      "eval_samples", "number_of_nodes", "accelerators_per_node", "opt_name",
      "opt_base_learning_rate", "opt_learning_rate_warmup_epochs",
      "opt_learning_rate_warmup_factor",
      "opt_learning_rate_decay_boundary_epochs",
      "opt_learning_rate_decay_factor", "cache_clear")} == dict(
          submission_benchmark="cosmoflow", submission_division="closed",
          submission_org="tests", submission_platform="ci",
          global_batch_size=8, train_samples=16, eval_samples=8,
          number_of_nodes=1, accelerators_per_node=0, opt_name="sgd",
          opt_base_learning_rate=0.001, opt_learning_rate_warmup_epochs=1.0,
          opt_learning_rate_warmup_factor=2.0,  # linear, on 2 processes
          opt_learning_rate_decay_boundary_epochs=[2],
          opt_learning_rate_decay_factor=0.5, cache_clear=False)
  assert logged[-1]["metadata"] | {"file": None, "lineno": None} == dict(
      file=None, lineno=None, status="success", target=0.124,
      target_metric="val_mae:min", target_reached=True,
      first_reached_epoch=1)


def test_a_resumed_run_appends_and_is_no_submission(run, tmp_path):
  _, data_dir, model_dir = run
  resumed = tmp_path / "resumed"
  shutil.copytree(model_dir, resumed)
  log = resumed / "mlperf.log"
  before = len(lines(log))
  result = train(data_dir, resumed, "--epochs=3", f"--mlperf_log={log}")
  assert result.returncode == 0, result.stderr[-3000:]
  appended = lines(log)[before:]
  assert [line["key"] for line in appended[:2]] == ["init_start", "resumed"]
  assert appended[1]["value"] == "epoch 3, step 0"
  assert [line["metadata"]["epoch_num"] for line in appended
          if line["key"] == "epoch_start"] == [3]
  assert appended[-1]["key"] == "run_stop"
  checked = check(str(log), str(tmp_path))
  assert checked.returncode == 1
  assert "Required EXACTLY_ONE occurrence of 'run_start' but found 2" \
      in checked.stderr


def test_an_unwritable_log_is_one_line_and_exit_2(run, tmp_path):
  _, data_dir, _ = run
  missing = tmp_path / "no_such_dir" / "mlperf.log"
  result = train(data_dir, tmp_path / "run", "--epochs=1",
                 f"--mlperf_log={missing}")
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.splitlines()[-1] == (
      f"engine.train: error: --mlperf_log={missing}: cannot write it (No "
      "such file or directory); pass a file in a writable directory")


def test_the_log_is_refused_under_elastic(tmp_path):
  result = fixtures.launch(["-m", "engine.train", "--elastic",
                            f"--mlperf_log={tmp_path / 'mlperf.log'}"])
  assert result.returncode == 2
  assert result.stderr.splitlines()[-1].startswith(
      "engine.train: error: --mlperf_log with --elastic: an MLPerf run keeps "
      "its processes")
