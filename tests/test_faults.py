"""Faults, for real: divergence, a full disk, a model_dir that turns
read-only or disappears, a worker that stops answering.

One `horovodrun -np 2` launch of tests/workers/fault_runs.py holds the runs
where ranks matter (module-scoped fixture, asserted on by several tests);
command-line launches check what a user sees: one line, its exit code.
"""
import contextlib
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from tests import fixtures
from tests import timeouts

# Serial (make test): tmpfs mounts, a frozen worker timed against Gloo's
# timeout.
pytestmark = pytest.mark.serial

WORKER = os.path.join(fixtures.REPO, "tests", "workers", "fault_runs.py")
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="mounting a tmpfs or a "
                                "read-only bind mount needs root")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      num_train=301, num_test=51)


@pytest.fixture(scope="module")
def ranks(data_dir, tmp_path_factory):
  out = tmp_path_factory.mktemp("faults")
  result = fixtures.launch([WORKER, str(out), data_dir], processes=2)
  assert result.returncode == 0, result.stderr[-3000:]
  return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def errors_of(ranks, run):
  """Each rank's error from `run`, which every rank must have had."""
  errors = [rank[run] for rank in ranks]
  assert all("error" in error for error in errors), errors
  return errors


def test_a_divergence_stops_every_rank_after_the_same_step(ranks):
  errors = errors_of(ranks, "diverged")
  assert {e["error"] for e in errors} == {"Diverged"}
  steps = {re.search(r"at global step (\d+) \(epoch 2, step \d+\) with "
                     r"learning rate 4000: ", e["message"]).group(1)
           for e in errors}
  assert len(steps) == 1, errors
  message = errors[0]["message"]
  assert "the loss was non-finite on 2 of 2 processes" in message
  assert re.search(r"; the step was not applied and nothing was saved "
                   r"after \S+/checkpoints/ckpt-6, the last good checkpoint; "
                   r"lower --base_lr, or pass --on_nonfinite=rollback$",
                   message), message


def test_a_divergence_leaves_checkpoints_and_exports_byte_identical(ranks):
  assert ranks[0]["saved_files_unchanged"]


def test_a_rollback_recovers_on_every_rank_and_keeps_the_lowered_rate(ranks):
  for rank in ranks:
    assert rank["rolled_back"]["epochs"] == [2, 3]
    assert rank["rolled_back"]["max_weight_difference_across_ranks"] == 0.0
  records = ranks[0]["records"]
  assert [r["epoch"] for r in records if "event" not in r] == [1, 2, 3]
  (rollback,) = [r for r in records if "event" in r]
  assert rollback["event"] == "rollback"
  assert rollback["checkpoint"].endswith(os.path.join("checkpoints",
                                                      "ckpt-6"))
  assert rollback["global_step"] == 6 < rollback["diverged_at_step"] <= 12
  assert rollback["learning_rate_factor"] == pytest.approx(1e-5)
  # 0.02 x 2 processes x the schedule's 10^5 x the rollback's 10^-5.
  assert records[-1]["learning_rate"] == pytest.approx(0.04)
  assert ranks[0]["saved_lr_factor"] == pytest.approx(1e-5)


@needs_root
def test_a_full_disk_stops_every_rank_with_one_line(ranks):
  assert "error" not in ranks[0]["disk_first_epoch"]
  errors = errors_of(ranks, "disk_full")
  assert errors[0] == errors[1]  # rank 0's error, on every rank
  message = errors[0]["message"]
  assert errors[0]["error"] == "WriteFailed"
  assert re.fullmatch(
      r"could not write checkpoint \S+/checkpoints/(best/best|ckpt)-12 "
      r"\(3\.\d MB\): No space left on device; [\d.]+ (MB|KB) free on its "
      r"file system; free some space, then run the same command again: it "
      r"resumes from \S+/checkpoints/ckpt-6", message), message


@needs_root
def test_a_full_disk_keeps_every_earlier_file_and_leaves_no_temporary_ones(
    ranks):
  assert ranks[0]["disk_full_checkpoints_unchanged"]
  assert set(ranks[0]["disk_full_new_files"]) <= {"flags.latest.txt"}


@needs_root
def test_a_rerun_after_space_is_freed_resumes_from_the_last_checkpoint(
    ranks):
  for rank in ranks:
    assert rank["disk_enlarged"]["epochs"] == [2]
  assert ranks[0]["disk_records"] == [1, 2]


@needs_root
def test_a_model_dir_made_read_only_mid_run_stops_every_rank(ranks):
  errors = errors_of(ranks, "read_only")
  assert errors[0] == errors[1]
  assert "Read-only file system" in errors[0]["message"]
  assert "make the file system writable, then run the same command again: "\
      "it resumes from" in errors[0]["message"]


def test_a_model_dir_removed_mid_run_stops_every_rank(ranks):
  errors = errors_of(ranks, "removed")
  assert errors[0] == errors[1]
  assert "No such file or directory" in errors[0]["message"]
  assert "was model_dir removed? put it back" in errors[0]["message"]


def one_line_per_rank(result, ranks=("[0]", "[1]")) -> list[str]:
  """Each rank's one error line, with no traceback from any rank."""
  lines = [l for l in result.stderr.splitlines() if l[:3] in ranks]
  assert not [l for l in lines if "Traceback" in l], result.stderr[-3000:]
  errors = []
  for rank in ranks:
    mine = [l for l in lines if l.startswith(rank) and "error:" in l]
    assert len(mine) == 1, result.stderr[-3000:]
    errors.append(mine[0].split("engine.train: error: ", 1)[1])
  return errors


def test_a_divergence_on_the_command_line_exits_3_with_one_line(data_dir,
                                                                tmp_path):
  # The command of the report that asked for this: a rate that diverges.
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}",
       f"--model_dir={tmp_path}/run", "--optimizer=sgd", "--base_lr=50",
       "--epochs=3", "--steps_per_epoch=2", "--progress=none"], timeout=120)
  assert result.returncode == 3, result.stderr[-3000:]
  (error,) = one_line_per_rank(result, ranks=("eng",))
  step = int(re.match(r"training diverged at global step (\d+) ",
                      error).group(1))
  saved = {int(re.match(r"ckpt-(\d+)\.", name).group(1))
           for name in os.listdir(tmp_path / "run" / "checkpoints")
           if name.startswith("ckpt-")}
  assert all(s < step for s in saved), (saved, step)
  assert not os.path.exists(tmp_path / "run" / "export")


@pytest.fixture
def tiny_tmpfs(tmp_path):
  """A 1 MB tmpfs: room for the flags, not for a checkpoint."""
  path = tmp_path / "tiny"
  path.mkdir()
  subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                  str(path)], check=True)
  try:
    yield path
  finally:
    subprocess.run(["umount", str(path)], check=True)


@needs_root
def test_a_full_disk_on_the_command_line_exits_4_on_every_rank(data_dir,
                                                               tiny_tmpfs):
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}",
       f"--model_dir={tiny_tmpfs}/run", "--epochs=1", "--steps_per_epoch=2",
       "--batch_size=16", "--progress=none"], processes=2, timeout=180)
  assert result.returncode != 0
  errors = one_line_per_rank(result)
  assert errors[0] == errors[1]
  assert re.match(rf"could not write checkpoint {tiny_tmpfs}/run/checkpoints/"
                  r"best/best-2 \(4\.8 MB\): No space left on device; ",
                  errors[0]), errors[0]
  assert errors[0].endswith("then run the same command again: it starts "
                            "from the beginning")
  # horovodrun ends the other process once the first one exits.
  assert re.match(r"Process [01] exit with status code 4\.", result.stdout)
  assert not [name for name in os.listdir(tiny_tmpfs / "run" / "checkpoints"
                                          / "best")
              if name != "checkpoint"]


def test_float16_skips_a_nan_batch_counts_it_and_trains_on(tmp_path):
  arrays = fixtures.write_arrays(str(tmp_path / "data.npz"), num_train=32,
                                 num_test=8, shape=(8, 8), dtype="float32")
  with np.load(arrays) as stored:
    values = dict(stored)
  values["x_train"][5, 0, 0] = np.nan  # in one batch of each epoch
  np.savez(arrays, **values)
  result = fixtures.launch(
      ["-m", "engine.train", "--dataset=arrays", f"--data_dir={arrays}",
       f"--model_dir={tmp_path}/run", "--mixed_precision=float16",
       "--image_mean=0.5", "--image_std=0.25", "--filters=4",
       "--batch_size=8", "--epochs=2", "--progress=none"], timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(line) for line in
             (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [r["skipped_steps"] for r in records] == [1, 1]
  assert "epoch 2: the float16 loss scaler skipped 1 of its steps" in \
      result.stderr


def pid_of_rank(rank: int, model_dir) -> int:
  """The engine process of `rank` (horovodrun sets HOROVOD_RANK)."""
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        command = f.read().split(b"\0")
      with open(f"/proc/{pid}/environ", "rb") as f:
        environment = f.read().split(b"\0")
    except OSError:
      continue
    if (command[0] == fixtures.PYTHON.encode()
        and f"--model_dir={model_dir}".encode() in command
        and f"HOROVOD_RANK={rank}".encode() in environment):
      return int(pid)
  raise AssertionError(f"no process of rank {rank}")


def test_a_frozen_worker_is_named_with_the_wait_and_the_resume_point(
    data_dir, tmp_path):
  model_dir = tmp_path / "run"
  env = fixtures.engine_env(
      HOROVOD_GLOO_TIMEOUT_SECONDS="5")  # 30 s by default
  job = subprocess.Popen(
      [*fixtures.horovodrun(2), fixtures.PYTHON, "-m",
       "engine.train", *fixtures.ENGINE_FLAGS, f"--data_dir={data_dir}",
       f"--model_dir={model_dir}",
       "--epochs=100", "--steps_per_epoch=5", "--batch_size=16",
       "--progress=none"], cwd=fixtures.REPO, env=env, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  frozen = None
  try:
    deadline = time.monotonic() + timeouts.bound(120)
    while not (model_dir / "checkpoints" / "checkpoint").exists():
      assert time.monotonic() < deadline and job.poll() is None
      time.sleep(0.1)
    survivor, frozen = (pid_of_rank(rank, model_dir) for rank in (0, 1))
    os.kill(frozen, signal.SIGSTOP)
    while os.path.exists(f"/proc/{survivor}"):  # it gives up, and says why
      assert time.monotonic() < deadline
      time.sleep(0.1)
    # What horovodrun would do 10 s later: a stopped process ignores its
    # SIGTERM.
    os.kill(frozen, signal.SIGKILL)
    stdout, stderr = job.communicate(timeout=timeouts.bound(120))
  finally:
    job.kill()
    if frozen:  # a stopped process outlives a killed horovodrun
      with contextlib.suppress(ProcessLookupError):
        os.kill(frozen, signal.SIGKILL)
  (error,) = one_line_per_rank(subprocess.CompletedProcess(
      job.args, job.returncode, stdout, stderr), ranks=("[0]",))
  silence = re.fullmatch(
      r"rank 1 stopped answering: silent for (\d+) s; this process waited "
      r"for it for Gloo's timeout of 5 s \(HOROVOD_GLOO_TIMEOUT_SECONDS\) "
      rf"and stopped; run the same command again: it resumes from "
      rf"{model_dir}/checkpoints/ckpt-\d+", error)
  assert silence and 5 <= int(silence.group(1)) < 20, error
  assert "Process 0 exit with status code 5." in stdout
