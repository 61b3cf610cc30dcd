"""Elastic training, for real: horovodrun's elastic launch on one machine.

Two launches on one model_dir, through tests/workers/recorded_run.py, whose
journals say which steps each process ran, on how many processes, at which
learning rate:

1. "shrink": 2 workers (hosts localhost and 127.0.0.1, two names of this
   machine), 3 epochs; the worker on 127.0.0.1 kills itself with SIGKILL
   mid-epoch 2, between two commits. The job must finish on 1 worker.
   Both workers pause for a few seconds early in epoch 2, before the
   commit the survivor restarts from: time the run's clock must keep.
2. "grow": a new job on the same model_dir, 5 epochs, starting on localhost
   alone: it resumes from the first job's checkpoint; 127.0.0.1 is added
   to the discovery script's list mid-epoch 4, and the job must grow to 2.
"""
import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from engine import distributed
from engine.core.errors import UserError
from engine.distributed import elastic
from tests import fixtures
from tests import timeouts

# Serial (make test): workers killed and added against Horovod's discovery
# and its timeouts.
pytestmark = pytest.mark.serial

NUM_TRAIN, BATCH, COMMIT_EVERY = 1024, 16, 5
BASE_LR = 0.001
KILL_AT = 43  # the victim's 43rd step: epoch 2, step 11 of 32; commit at 8
SLEEP_AT, SLEEP_SECONDS = 35, 8  # epoch 2, step 3: before that commit
WORKER = os.path.join(fixtures.REPO, "tests", "workers", "recorded_run.py")
DISCOVERY = os.path.join(fixtures.REPO, "scripts", "discover_hosts.sh")


def launch(tmp, name, *, hosts, processes, epochs, **events):
  """One elastic job; returns its output, journals and final weights."""
  out = tmp / name
  out.mkdir()
  hosts_file = tmp / f"{name}_hosts"
  hosts_file.write_text("".join(f"{host}:1\n" for host in hosts))
  command = [fixtures.HOROVODRUN, "--gloo", "-np", str(processes),
             "--min-np", "1",
             "--max-np", "2", "--host-discovery-script", DISCOVERY,
             "--network-interface", "lo", fixtures.PYTHON, WORKER,
             "--elastic", f"--commit_every_steps={COMMIT_EVERY}",
             f"--data_dir={tmp / 'data'}", f"--model_dir={tmp / 'run'}",
             "--filters=8", f"--batch_size={BATCH}", f"--epochs={epochs}",
             f"--base_lr={BASE_LR}", "--lr_scaling=linear",
             "--warmup_epochs=0", "--progress=none",
             "--summary_every_steps=2"]
  env = fixtures.engine_env(
      RECORD_OUT=str(out), ELASTIC_HOSTS=str(hosts_file),
      **{f"ELASTIC_{k.upper()}": str(v) for k, v in events.items()})
  result = subprocess.run(command, cwd=fixtures.REPO, env=env, text=True,
                          capture_output=True, timeout=timeouts.bound(600))
  processes = fixtures.recorded_processes(out)
  with open(tmp / "run" / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  return dict(result=result, output=result.stdout + result.stderr,
              processes=processes, records=records, model_dir=tmp / "run")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("elastic")
  fixtures.write_fashion_mnist(str(tmp / "data"), num_train=NUM_TRAIN,
                               num_test=128)
  shrink = launch(tmp, "shrink", hosts=["localhost", "127.0.0.1"],
                  processes=2, epochs=3, kill_host="127.0.0.1",
                  kill_at=KILL_AT, sleep_at=SLEEP_AT,
                  sleep_seconds=SLEEP_SECONDS)
  grow = launch(tmp, "grow", hosts=["localhost"], processes=1, epochs=5,
                add_host="127.0.0.1:1", add_at=5)
  return dict(shrink=shrink, grow=grow)


def examples_before(step: dict) -> int:
  """Where a step starts in the run's stream of examples, from the step
  counter and the number of processes it ran on."""
  global_batch = BATCH * step["size"]
  epoch, done = divmod(step["iteration"], NUM_TRAIN // global_batch)
  return epoch * NUM_TRAIN + done * global_batch


def jumps(steps: list[dict]) -> list[tuple[int, int]]:
  """(end of a step, start of the next) wherever they differ."""
  ends = [examples_before(s) + BATCH * s["size"] for s in steps]
  starts = [examples_before(s) for s in steps]
  return [(end, start) for end, start in zip(ends, starts[1:]) if end != start]


def test_restarts_and_the_resume_continue_one_curve_and_one_clock(jobs):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tensorboard = jobs["grow"]["model_dir"] / "tensorboard"

  def steps(run, tag):
    return sorted(event.step for path in (tensorboard / run).glob("events.*")
                  for event in tf.compat.v1.train.summary_iterator(str(path))
                  for value in event.summary.value if value.tag == tag)

  # Each point once, though the shrink redid the steps after its commit.
  assert steps("validation", "epoch_accuracy") == [1, 2, 3, 4, 5]
  batch_steps = steps("train", "batch_loss")
  assert batch_steps == sorted(set(batch_steps))
  assert batch_steps[-1] == jobs["grow"]["records"][-1]["global_step"]
  seconds = [r["cumulative_seconds"] for r in jobs["grow"]["records"]]
  assert seconds == sorted(seconds) and seconds[0] > 0


def test_a_job_that_loses_a_worker_finishes_on_the_other(jobs):
  shrink = jobs["shrink"]
  assert shrink["result"].returncode == 0, shrink["output"][-3000:]
  assert "exit with status code 137" in shrink["output"]  # the SIGKILL
  [survivor] = shrink["processes"]
  assert survivor["host"] == "localhost" and survivor["size"] == 1
  assert [r["world_size"] for r in shrink["records"]] == [2, 1, 1]
  assert "restarting on 1 processes (was 2) from the commit at epoch 2, " \
      "step 8" in shrink["output"]


def test_a_restart_mid_epoch_keeps_the_time_before_its_commit(jobs):
  # The pause came before the commit the restart went back to: it is part
  # of epoch 2's time and of the run's clock, as a checkpoint's would be.
  epoch1, epoch2, _ = jobs["shrink"]["records"]
  assert epoch2["epoch_seconds"] >= SLEEP_SECONDS
  assert epoch2["cumulative_seconds"] - epoch1["cumulative_seconds"] \
      >= SLEEP_SECONDS


def test_after_a_loss_only_the_steps_since_the_last_commit_are_redone(jobs):
  steps = jobs["shrink"]["processes"][0]["steps"]
  # One jump back, to the commit before the failed step; otherwise each
  # step starts where the one before ended, to the end of epoch 3.
  [(failed_end, restart)] = jumps(steps)
  commit = COMMIT_EVERY * 2 * BATCH
  assert restart % commit == 0 and 0 < failed_end - restart <= commit
  assert examples_before(steps[-1]) + BATCH == 3 * NUM_TRAIN
  # Every epoch's figures count each of its examples once.
  assert [r["train_examples"] for r in jobs["shrink"]["records"]] == \
      [NUM_TRAIN] * 3


def test_the_learning_rate_follows_the_number_of_processes(jobs):
  for job in jobs.values():
    for process in job["processes"]:
      for step in process["steps"]:
        if "learning_rate" in step:  # the failed step has none
          assert step["learning_rate"] == pytest.approx(
              BASE_LR * step["size"])
  records = jobs["grow"]["records"]
  assert [r["learning_rate"] for r in records] == pytest.approx(
      [BASE_LR * r["world_size"] for r in records])


def test_a_new_job_resumes_from_the_elastic_jobs_checkpoints(jobs):
  grow = jobs["grow"]
  assert grow["result"].returncode == 0, grow["output"][-3000:]
  assert "at epoch 4, step 0" in grow["output"]
  first = next(p for p in grow["processes"]
               if p["host"] == "localhost")["steps"][0]
  assert (first["size"], examples_before(first)) == (1, 3 * NUM_TRAIN)


def test_an_added_worker_starts_from_the_committed_state(jobs):
  grow = jobs["grow"]
  assert [r["world_size"] for r in grow["records"]] == [2, 1, 1, 2, 2]
  assert [r["train_examples"] for r in grow["records"]] == [NUM_TRAIN] * 5
  first, added = sorted(grow["processes"], key=lambda p: len(p["steps"]),
                        reverse=True)
  assert added["host"] == "127.0.0.1"
  # Growing happens at a commit: nothing is redone, nothing skipped.
  assert not jumps(first["steps"])
  assert examples_before(first["steps"][-1]) + 2 * BATCH == 5 * NUM_TRAIN
  # The new worker's first step is the others' first step on 2 processes,
  # and it ends with their weights.
  joined = next(s for s in first["steps"] if s["size"] == 2)
  assert added["steps"][0] == joined
  for a, b in zip(first["weights"], added["weights"]):
    np.testing.assert_array_equal(a, b)


def test_elastic_needs_an_elastic_launch_and_the_other_way_round(
    monkeypatch):
  monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
  elastic.check_launch(False)
  with pytest.raises(UserError, match="--elastic needs an elastic launch"):
    elastic.check_launch(True)
  monkeypatch.setenv("HOROVOD_ELASTIC", "1")
  elastic.check_launch(True)
  with pytest.raises(UserError, match="pass --elastic"):
    elastic.check_launch(False)


def test_a_restore_goes_back_to_the_last_commit():
  distributed.start_horovod()
  variable = tf.Variable([1.0, 2.0])
  state = elastic.TrainingState(lambda: [variable], position=None,
                                history=[])
  state.sync()
  state.commit(position=(0, 5), history=["epoch 1"])
  variable.assign([7.0, 7.0])
  state.position, state.history = (0, 9), ["epoch 1", "epoch 2"]
  state.restore()
  assert variable.numpy().tolist() == [1.0, 2.0]
  assert (state.position, state.history) == ((0, 5), ["epoch 1"])
