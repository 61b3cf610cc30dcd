"""Watching and comparing real runs: TensorBoard over its HTTP data API, and
engine.runs' table.

Four short runs, one process each, launched side by side into one
directory: two that finish with different optimizers and rates, one
stopped by SIGTERM, one that diverges.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests import fixtures
from tests import timeouts

# Serial (make test): a run stopped by SIGTERM after its first checkpoint,
# and a TensorBoard server on a port.
pytestmark = pytest.mark.serial

STEPS = 20  # per epoch
ENV = fixtures.engine_env()
RUNS = {
    "adam": ["--optimizer=adam", "--base_lr=0.003", "--epochs=2"],
    "sgd": ["--optimizer=sgd", "--base_lr=0.05", "--epochs=2"],
    "stopped": ["--optimizer=sgd", "--base_lr=0.05", "--epochs=30"],
    "diverged": ["--optimizer=sgd", "--base_lr=1e9", "--epochs=2"],
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  data_dir = fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                          num_train=601, num_test=101)
  root = tmp_path_factory.mktemp("runs")
  started = {}
  for name, flags in RUNS.items():
    started[name] = subprocess.Popen(
        [fixtures.PYTHON, "-m", "engine.train", *fixtures.ENGINE_FLAGS,
         f"--data_dir={data_dir}",
         f"--model_dir={root / name}", f"--steps_per_epoch={STEPS}",
         "--batch_size=16", "--filters=4", "--progress=none",
         "--target_accuracy=0.3", "--patience=5", "--summary_every_steps=5",
         *flags], cwd=fixtures.REPO, env=ENV, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  stopped = started["stopped"]
  first = root / "stopped" / "checkpoints" / f"ckpt-{STEPS}.index"
  deadline = time.time() + timeouts.bound(120)
  while not first.exists():
    assert stopped.poll() is None, stopped.stdout.read()[-3000:]
    assert time.time() < deadline, f"{first} never appeared"
    time.sleep(0.05)
  stopped.send_signal(signal.SIGTERM)
  codes = {name: run.wait(timeout=timeouts.bound(300))
           for name, run in started.items()}
  outputs = {name: run.stdout.read() for name, run in started.items()}
  assert codes == {"adam": 0, "sgd": 0, "stopped": 128 + signal.SIGTERM,
                   "diverged": 3}, {n: o[-2000:] for n, o in outputs.items()}
  return root


def records(model_dir):
  with open(model_dir / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


# engine.runs


def runs_table(*args):
  result = subprocess.run([fixtures.PYTHON, "-m", "engine.runs", *args],
                          cwd=fixtures.REPO, env=ENV, text=True,
                          capture_output=True, timeout=timeouts.bound(60))
  assert result.returncode == 0, result.stderr
  return result.stdout


def test_the_runs_table_shows_what_differs_and_how_each_run_ended(root):
  plot = root.parent / "accuracy.png"
  header, *rows = runs_table(str(root), f"--plot={plot}").splitlines()[:5]
  columns = header.split()
  # The flags that differ, and only those.
  assert "--optimizer" in columns and "--base_lr" in columns
  assert "--epochs" in columns
  assert "--data_dir" not in columns and "--batch_size" not in columns
  assert "--model_dir" not in columns
  assert columns[-3:] == ["img/s", "procs", "state"]
  by_run = {row.split()[0]: row for row in rows}
  assert sorted(by_run) == sorted(RUNS)
  adam = records(root / "adam")
  best = max(r["val_accuracy"] for r in adam)
  assert re.search(rf"^adam +adam +0\.003 +2 +2/2 +{best:.4f} +"
                   rf"{adam[-1]['val_accuracy']:.4f} +[0-9.]+ +\d+ +1 +"
                   "finished$", by_run["adam"]), by_run["adam"]
  assert by_run["sgd"].endswith(" 1  finished")
  stopped = len([r for r in records(root / "stopped") if "event" not in r])
  assert re.search(rf" {stopped}/30 .* stopped by SIGTERM$", by_run["stopped"])
  assert re.search(r" 0/2 .* diverged$", by_run["diverged"])
  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# TensorBoard, as a user starts it, queried through its HTTP data API.


@pytest.fixture(scope="module")
def tensorboard(root):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  server = subprocess.Popen(
      [os.path.join(os.path.dirname(fixtures.PYTHON), "tensorboard"),
       f"--logdir={root}", "--host=127.0.0.1", f"--port={port}",
       "--reload_interval=1"], env=ENV, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True)

  def get(path, **query):
    if query:
      path += "?" + urllib.parse.urlencode(
          {k: json.dumps(v) if isinstance(v, dict) else v
           for k, v in query.items()})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/{path}",
                                timeout=timeouts.bound(30)) as reply:
      return json.loads(reply.read())

  try:
    deadline = time.time() + timeouts.bound(120)
    while True:  # until it serves, and has read every run's files
      assert server.poll() is None, server.stderr.read()[-3000:]
      assert time.time() < deadline, "TensorBoard did not load the runs"
      try:
        tags = get("plugin/scalars/tags")
        if all("epoch_loss" in tags.get(f"{name}/tensorboard/{run}", {})
               for name in ("adam", "sgd") for run in ("train", "validation")):
          break
      except OSError:
        pass
      time.sleep(0.5)
    yield get
  finally:
    server.terminate()
    server.wait(timeout=timeouts.bound(30))


def test_tensorboard_overlays_train_and_validation_as_keras_does(
    root, tensorboard):
  runs = tensorboard("runs")
  for name in ("adam", "sgd"):
    assert {f"{name}/tensorboard/train", f"{name}/tensorboard/validation",
            f"{name}/tensorboard"} <= set(runs)
  tags = tensorboard("plugin/scalars/tags")
  train, validation = (set(tags["adam/tensorboard/train"]),
                       set(tags["adam/tensorboard/validation"]))
  assert {"epoch_loss", "epoch_accuracy"} <= train & validation
  assert {"epoch_learning_rate", "epoch_images_per_sec", "batch_loss",
          "batch_accuracy", "batch_learning_rate",
          "batch_step_seconds"} <= train - validation
  accuracy = tensorboard("plugin/scalars/scalars",
                         run="adam/tensorboard/validation",
                         tag="epoch_accuracy")
  assert [step for _, step, _ in accuracy] == [1, 2]
  assert [value for _, _, value in accuracy] == pytest.approx(
      [r["val_accuracy"] for r in records(root / "adam")])
  losses = tensorboard("plugin/scalars/scalars", run="adam/tensorboard/train",
                       tag="batch_loss")
  assert [step for _, step, _ in losses] == list(range(5, 2 * STEPS + 1, 5))


def test_tensorboard_lists_every_run_in_the_hparams_dashboard(tensorboard):
  experiment = tensorboard("plugin/hparams/experiment",
                           request={"experimentName": ""})
  hparams = {info["name"] for info in experiment["hparamInfos"]}
  assert {"dataset", "model", "filters", "optimizer", "base_lr",
          "lr_schedule", "batch_size", "global_batch", "processes",
          "mixed_precision"} <= hparams
  metrics = {info["name"]["tag"] for info in experiment["metricInfos"]}
  assert {"best_val_accuracy", "final_val_accuracy", "seconds_to_target",
          "images_per_sec"} <= metrics
  groups = tensorboard("plugin/hparams/session_groups", request={
      "experimentName": "", "startIndex": 0, "sliceSize": 100,
      "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS",
                          "STATUS_FAILURE", "STATUS_RUNNING"]})
  sessions = {session["name"]: group["hparams"] for group in
              groups["sessionGroups"] for session in group["sessions"]}
  assert sessions["adam/tensorboard"]["optimizer"] == "adam"
  assert sessions["sgd/tensorboard"]["base_lr"] == pytest.approx(0.05)
  assert set(sessions) >= {"adam/tensorboard", "sgd/tensorboard",
                           "stopped/tensorboard"}
