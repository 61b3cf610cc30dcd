"""engine.sweep --launcher=slurm under a real SLURM, on two simulated hosts.

tests/simulated_slurm.py runs munge, slurmctld and a slurmd on each of
tests/simulated_hosts.py's two hosts (two cores each). One study of three
2-process trials, each a job of scripts/slurm/train.sbatch packed onto a
host: two run at once, the third waits in the queue. It goes through the
three starts of a sweep that matter under SLURM:

  stopped by SIGTERM: the running jobs save and end, not requeued; the
  queued one is cancelled; every trial stays running in the study;
  started again: each trial submitted anew, resuming from its checkpoint;
  then the sweep is killed (SIGKILL), leaving its jobs to run on;
  started again: those jobs watched, not submitted twice, to their ends:
  complete, or failed with the engine's one-line error (trial 2's data
  directory does not exist); then --best's flagfile and engine.runs.

Skipped, with the reason, where not root or where SLURM or munge are
missing (scripts/setup.sh installs them as root).
"""
import os
import re
import signal
import subprocess
import time

import pytest

from engine.core import run_files
from engine.sweeps import study as studies
from tests import fixtures
from tests import simulated_hosts
from tests import simulated_slurm
from tests import timeouts

reason = simulated_slurm.unavailable()
# Serial: namespaces, mounts and daemons of its own (make test).
pytestmark = [pytest.mark.serial,
              pytest.mark.skipif(reason is not None, reason=str(reason))]

# Epochs of about 2 s (TRAIN_IMAGES), enough of them that trial 0, which
# may start some seconds before trial 1, still trains when the test stops
# the sweep after trial 1's first epoch: trial 2 is then still queued.
EPOCHS = 12
TRAIN_IMAGES = 3000
# Optuna 5's TPE (random over its first 10 trials) with this seed draws the
# data directory for trials 0 and 1 and the missing one for trial 2, the
# one queued; sgd for one of the first two and adam for the other.
SEED = 29
SPACE = """\
base_lr: {{log_uniform: [0.001, 0.01]}}
optimizer: {{choice: [sgd, adam]}}
data_dir: {{choice: [{data}, {missing}]}}
"""
# Runs of seconds: the cnn at width 4, batch 32.
ENGINE = ["--model=cnn", "--filters=4", "--batch_size=32", "--progress=none",
          f"--epochs={EPOCHS}"]


class Study:
  """The study's directory, its sweep's command, and what the sweep says."""

  def __init__(self, slurm, tmp):
    self.slurm = slurm
    self.tmp = tmp
    self.dir = str(tmp / "study")
    self.missing = str(tmp / "missing")
    space = tmp / "space.yaml"
    space.write_text(SPACE.format(
        data=fixtures.write_fashion_mnist(str(tmp / "data"),
                                          num_train=TRAIN_IMAGES),
        missing=self.missing))
    self.command = [
        fixtures.PYTHON, "-m", "engine.sweep", f"--space={space}",
        f"--study_dir={self.dir}", "--launcher=slurm", "--trials=3",
        "--processes=2", "--parallel=3", "--pruner=none",
        f"--sampler_seed={SEED}", "--", *fixtures.ENGINE_FLAGS, *ENGINE]
    self.env = fixtures.engine_env(SLURM_CONF=slurm.conf,
                                   IFACE=simulated_hosts.INTERFACE)
    self._starts = 0

  def start(self) -> tuple[subprocess.Popen, str]:
    """The sweep on the first host, in the background; its output's file."""
    self._starts += 1
    out = str(self.tmp / f"sweep{self._starts}.out")
    with open(out, "w") as f:
      return self.slurm.start(self.command, env=self.env, stdout=f,
                              stderr=subprocess.STDOUT, text=True), out

  def trial_dir(self, number: int) -> str:
    return studies.trial_dir(self.dir, number)

  def log(self, number: int) -> str:
    path = os.path.join(self.trial_dir(number), run_files.TRIAL_LOG)
    if not os.path.exists(path):
      return ""
    with open(path, errors="replace") as f:
      return f.read()

  def records(self, number: int) -> list[dict]:
    return [record for _, record in run_files.read_metrics(
        self.trial_dir(number)) if record is not None]

  def epochs(self, number: int) -> int:
    return max([r["epoch"] for r in self.records(number)
                if "event" not in r], default=0)

  def trials(self) -> list:
    return studies.open_study(studies.read_sweep(self.dir)).get_trials()

  def job(self, number: int) -> dict:
    """Trial `number`'s job, as scontrol shows it."""
    frozen = self.trials()[number]
    return self.slurm.job(frozen.user_attrs["slurm_job"])


def wait_for(condition, what: str, sweep: subprocess.Popen, out: str,
             timeout: float) -> None:
  """Until `condition()`, for `timeout` nominal seconds, while the sweep
  runs."""
  seconds = timeouts.bound(timeout)
  deadline = time.monotonic() + seconds
  while not condition():
    if sweep.poll() is not None:
      raise AssertionError(f"the sweep exited ({sweep.returncode}) before "
                           f"{what}:\n{read(out)[-3000:]}")
    if time.monotonic() > deadline:
      raise AssertionError(f"not {what} after {seconds:.0f} s:\n"
                           f"{read(out)[-3000:]}")
    time.sleep(0.5)


def read(path: str) -> str:
  with open(path, errors="replace") as f:
    return f.read()


def ended(sweep: subprocess.Popen, out: str, timeout: float) -> str:
  """The sweep's output once it has exited."""
  try:
    sweep.wait(timeout=timeouts.bound(timeout))
  except subprocess.TimeoutExpired:
    raise AssertionError(f"the sweep still runs after {timeout} s:\n"
                         f"{read(out)[-3000:]}") from None
  return read(out)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("sweep_slurm")
  with simulated_hosts.SimulatedHosts(2) as hosts, \
      simulated_slurm.SimulatedSlurm(hosts) as slurm:
    yield Study(slurm, tmp)


@pytest.fixture(scope="module")
def stopped(study):  # pylint: disable=redefined-outer-name
  """The sweep's first start, stopped by SIGTERM once trials 0 and 1 have
  trained an epoch."""
  sweep, out = study.start()
  try:
    wait_for(lambda: study.epochs(0) and study.epochs(1),
             "trials 0 and 1 trained an epoch", sweep, out, timeout=300)
    queued = study.job(2)["JobState"]
    trained = [study.epochs(0), study.epochs(1)]
    os.killpg(sweep.pid, signal.SIGTERM)
    output = ended(sweep, out, timeout=180)
  finally:
    simulated_hosts.kill_group(sweep)
  return dict(returncode=sweep.returncode, output=output, queued=queued,
              trained=trained, jobs=[study.job(n) for n in range(3)],
              logs=[study.log(n) for n in range(3)],
              ends=[study.records(n)[-1] for n in (0, 1)],
              states=[t.state.name for t in study.trials()])


def test_a_stopped_sweep_stops_its_jobs_saved_and_not_requeued(stopped):  # pylint: disable=redefined-outer-name
  output = stopped["output"]
  assert stopped["returncode"] == 128 + signal.SIGTERM, output[-3000:]
  assert "stopped by SIGTERM; the running trials saved" in output
  # Trial 2 waited in the queue: two jobs fill the two hosts.
  too_late = (f"epochs {stopped['trained']} of {EPOCHS} trained at the "
              "stop: raise EPOCHS")
  assert stopped["queued"] == "PENDING", too_late
  for number in (0, 1):
    job = stopped["jobs"][number]
    assert (job["JobState"], job["Restarts"], job["Requeue"]) == (
        "FAILED", "0", "0"), (too_late, job, stopped["logs"][number][-3000:])
    assert "[train.sbatch] preempted and saved; not requeued" in (
        stopped["logs"][number])
    assert stopped["ends"][number]["state"] == "stopped"
    assert f"trial {number} stopped, saved; the next start resumes it" in (
        output)
  # Cancelled in the queue: it never ran, so it has no log, and it is
  # not told failed.
  assert stopped["jobs"][2]["JobState"] == "CANCELLED"
  assert not stopped["logs"][2]
  assert stopped["states"] == ["RUNNING"] * 3


@pytest.fixture(scope="module")
def resumed(study, stopped):  # pylint: disable=redefined-outer-name
  """The sweep started again, killed (SIGKILL) once trials 0 and 1 have
  trained an epoch more."""
  before = [study.epochs(0), study.epochs(1)]
  first_jobs = [job["JobId"] for job in stopped["jobs"]]
  sweep, out = study.start()
  try:
    wait_for(lambda: study.epochs(0) > before[0] and
             study.epochs(1) > before[1],
             "trials 0 and 1 trained an epoch more", sweep, out, timeout=300)
    os.killpg(sweep.pid, signal.SIGKILL)
    output = ended(sweep, out, timeout=30)
  finally:
    simulated_hosts.kill_group(sweep)
  return dict(output=output, first_jobs=first_jobs,
              jobs=[str(t.user_attrs["slurm_job"]) for t in study.trials()])


def test_the_sweep_started_again_submits_each_trial_anew(
    study, resumed):  # pylint: disable=redefined-outer-name
  output = resumed["output"]
  for number in range(3):
    assert f"engine.sweep: trial {number} resumed" in output, output[-3000:]
  assert "started:" not in output  # no new trial: the budget is spent
  assert all(new != old for new, old in zip(resumed["jobs"],
                                            resumed["first_jobs"]))
  for number in (0, 1):
    # Appended to the same log, from its checkpoint.
    log = study.log(number)
    for job in (resumed["first_jobs"][number], resumed["jobs"][number]):
      assert re.search(rf"2 processes on host\d:2 via srun --mpi=pmix "
                       rf"\(job {job}, restart 0\)", log), log[-3000:]
    assert f"resuming {study.trial_dir(number)} at epoch" in log, log[-3000:]


@pytest.fixture(scope="module")
def finished(study, resumed):  # pylint: disable=redefined-outer-name
  """The sweep started again after its kill, to the study's end."""
  del resumed
  ran = study.slurm.run(study.command, env=study.env, timeout=600)
  return dict(returncode=ran.returncode, output=ran.stdout + ran.stderr,
              trials=study.trials())


def test_a_killed_sweeps_jobs_are_watched_again_not_submitted_twice(
    resumed, finished):  # pylint: disable=redefined-outer-name
  output = finished["output"]
  assert finished["returncode"] == 0, output[-3000:]
  for number in range(3):
    assert f"trial {number} still running: watched again" in output, (
        output[-3000:])
  assert "resumed" not in output
  assert [str(t.user_attrs["slurm_job"]) for t in finished["trials"]] == (
      resumed["jobs"])


def test_every_trial_ends_as_a_slurm_job_complete_or_failed_in_one_line(
    study, finished):  # pylint: disable=redefined-outer-name
  trials = finished["trials"]
  assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "FAIL"], (
      finished["output"][-3000:])
  assert [t.params["data_dir"] == study.missing for t in trials] == [
      False, False, True], "the seed no longer draws the missing data last"
  assert {t.params["optimizer"] for t in trials[:2]} == {"sgd", "adam"}
  for trial in trials:
    assert trial.user_attrs["slurm_cluster"] == "simulated"
    assert trial.user_attrs["worker"] == f"slurm:simulated:{study.dir}"
  assert trials[2].user_attrs["reason"] == (
      f"--data_dir={study.missing}: no such directory; pass --data_dir=DIR "
      "holding the four Fashion-MNIST idx files")
  for number in (0, 1):
    epochs = [r["epoch"] for r in study.records(number) if "event" not in r]
    assert epochs == list(range(1, EPOCHS + 1))
    assert trials[number].value == max(
        r["val_accuracy"] for r in study.records(number)
        if "event" not in r)
    assert study.job(number)["JobState"] == "COMPLETED"
  assert study.job(2)["JobState"] == "FAILED"
  assert "engine.sweep: 2 complete, 1 fail; best: trial" in (
      finished["output"])


def test_the_best_trials_flagfile_and_the_runs_table(
    study, finished):  # pylint: disable=redefined-outer-name
  best = max(finished["trials"][:2], key=lambda t: t.value)
  flagfile = subprocess.run(
      [fixtures.PYTHON, "-m", "engine.sweep", f"--study_dir={study.dir}",
       "--best"], env=fixtures.engine_env(), capture_output=True, text=True,
      timeout=timeouts.bound(120))
  assert flagfile.returncode == 0, flagfile.stderr
  lines = flagfile.stdout.splitlines()
  assert lines[0].startswith(f"# Trial {best.number} of the sweep in "
                             f"{study.dir}: val_accuracy {best.value:.4f}")
  assert lines[1:] == [*fixtures.ENGINE_FLAGS, *ENGINE,
                       f"--base_lr={best.params['base_lr']}",
                       f"--optimizer={best.params['optimizer']}",
                       f"--data_dir={best.params['data_dir']}"]
  table = subprocess.run(
      [fixtures.PYTHON, "-m", "engine.runs", study.dir],
      env=fixtures.engine_env(), capture_output=True, text=True,
      timeout=timeouts.bound(60))
  assert table.returncode == 0, table.stderr
  rows = {row.split()[0]: row for row in table.stdout.splitlines()[1:]}
  assert sorted(rows) == ["trials/0000", "trials/0001", "trials/0002"], \
      table.stdout
  # Trial 2 failed before its run began (no flags.txt, no metrics.jsonl):
  # listed from its trial.json, with its reason.
  assert rows["trials/0000"].endswith("complete")
  assert rows["trials/0001"].endswith("complete")
  assert "failed: --data_dir=" in rows["trials/0002"], table.stdout
