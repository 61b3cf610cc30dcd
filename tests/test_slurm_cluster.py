"""scripts/slurm/train.sbatch under a real SLURM, across two simulated hosts.

tests/simulated_slurm.py runs Debian's munge, slurmctld and a slurmd on
each of tests/simulated_hosts.py's two hosts; the jobs here are submitted
with `sbatch -N 2` as a cluster's users submit them, each process running
tests/workers/recorded_run.py (the engine, recording its rank, host and
final weights) on a tiny Fashion-MNIST:

  each launcher (srun, the default, with the PMI it chooses where the
  site's default is none; horovodrun over ssh; mpirun), world size 2
  across the two hosts; Adasum under srun's MPI; an srun without a PMI,
  refused in one line; a job preempted by SIGTERM, requeued and resumed
  (on srun); a frozen rank under MPI, ended by Horovod's stall shutdown;
  a rank crashed under srun, its job ended rather than hung.

Skipped, with the reason, where not root or where SLURM, munge or Open MPI
are missing (scripts/setup.sh installs them as root).
"""
import json
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest

from engine import distributed
from tests import fixtures
from tests import simulated_hosts
from tests import simulated_slurm
from tests import timeouts

WORKER = os.path.join("tests", "workers", "recorded_run.py")

reason = simulated_slurm.unavailable() or (
    None if shutil.which("mpirun") else "no mpirun: apt-get install "
    "openmpi-bin libopenmpi-dev (scripts/setup.sh does, as root)")
# Serial: namespaces, mounts and daemons of its own (make test).
pytestmark = [pytest.mark.serial,
              pytest.mark.skipif(reason is not None, reason=str(reason))]

# A run of a few seconds: the cnn at width 4 on 601 images, batch 32.
ENGINE = ["--model=cnn", "--filters=4", "--batch_size=32", "--progress=none"]
# Of its 9 steps, in the jobs on MPI's controller.
PROFILED = "--profile_steps=3,6"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("slurm")
  data_dir = fixtures.write_fashion_mnist(str(tmp / "data"))
  with simulated_hosts.SimulatedHosts(2) as hosts, \
      simulated_slurm.SimulatedSlurm(hosts) as slurm:
    yield Cluster(slurm, tmp, data_dir)


class Cluster:
  """Submits train.sbatch jobs, each recording into a directory of its own."""

  def __init__(self, slurm, tmp, data_dir):
    self.slurm = slurm
    self.tmp = tmp
    self.data_dir = data_dir

  def submit(self, name, *engine_flags, launcher=None, **env):
    """A job of train.sbatch on its default launcher (srun), or `launcher`."""
    if launcher:
      env["LAUNCHER"] = launcher
    out = self.tmp / name
    out.mkdir()
    job_id = self.slurm.submit_training(
        str(out), [f"--data_dir={self.data_dir}",
                   f"--model_dir={out / 'run'}", *ENGINE, *engine_flags],
        env=fixtures.engine_env(PROGRAM=WORKER,
                                RECORD_OUT=str(out), **env))
    return Job(self, job_id, out)


class Job:

  def __init__(self, cluster_, job_id, out):
    self.cluster = cluster_
    self.id = job_id
    self.out = out

  def wait(self, **kwargs):
    """The job's fields once it reaches one of the states; on a timeout,
    its output's end with SLURM's logs."""
    try:
      return self.cluster.slurm.wait(self.id, **kwargs)
    except TimeoutError as e:
      raise TimeoutError(f"{e}\njob.out: {self.output[-3000:]}") from None

  def preempt_after_an_epoch(self, epoch_seconds):
    """Once an epoch is in (within `epoch_seconds` nominal seconds), what
    SLURM does before the time limit (--signal=B:TERM@120); the job then
    stopped and requeued."""
    deadline = time.monotonic() + timeouts.bound(epoch_seconds)
    while not self.metrics():
      assert time.monotonic() < deadline, self.output[-3000:]
      time.sleep(0.2)
    signalled = self.cluster.slurm.run(["scancel", "--batch", "--signal=TERM",
                                        str(self.id)])
    assert signalled.returncode == 0, signalled.stderr
    fields = self.wait(states=("PENDING", "COMPLETED", "FAILED"))
    assert (fields["JobState"], fields["Restarts"]) == ("PENDING", "1"), (
        self.output[-3000:])

  @property
  def output(self):
    with open(self.out / "job.out", errors="replace") as f:
      return f.read()

  @property
  def processes(self):
    return sorted(fixtures.recorded_processes(self.out),
                  key=lambda p: p["rank"])

  def metrics(self):
    path = self.out / "run" / "metrics.jsonl"
    if not path.exists():
      return []
    with open(path) as f:
      return [json.loads(line) for line in f]


def assert_trained_on_both_hosts(job):
  fields = job.wait()
  assert fields["JobState"] == "COMPLETED", job.output[-3000:]
  processes = job.processes
  assert [p["rank"] for p in processes] == [0, 1], job.output[-3000:]
  assert {p["size"] for p in processes} == {2}
  assert sorted(p["hostname"] for p in processes) == ["host0", "host1"]
  first, second = processes
  for a, b in zip(first["weights"], second["weights"]):
    np.testing.assert_array_equal(a, b)
  assert [m["world_size"] for m in job.metrics()] == [2]


@pytest.fixture(scope="module")
def launchers(cluster):  # pylint: disable=redefined-outer-name
  """One job per launcher, submitted together: SLURM runs two at a time,
  each on a core of each host."""
  return {
      "horovodrun": cluster.submit("horovodrun", "--epochs=1",
                                   launcher="horovodrun"),
      "mpirun": cluster.submit("mpirun", "--epochs=1", PROFILED,
                               launcher="mpirun"),
      "srun": cluster.submit("srun", "--epochs=1", "--allreduce_op=adasum",
                             PROFILED),
      # A user's (or site's) choice of PMI: a version of PMIx by name.
      "srun chosen": cluster.submit("srun_chosen", "--epochs=1",
                                    launcher="srun", SLURM_MPI_TYPE="pmix_v4"),
  }


def test_horovodrun_over_ssh_trains_across_the_hosts(launchers):
  job = launchers["horovodrun"]
  assert_trained_on_both_hosts(job)
  assert "2 processes on host0:1,host1:1 via horovodrun" in job.output
  assert "2 processes on Horovod's Gloo controller" in job.output
  assert distributed.MPI_FROZEN_PROCESS not in job.output


def test_mpirun_trains_across_the_hosts(launchers):
  job = launchers["mpirun"]
  assert_trained_on_both_hosts(job)
  assert "via mpirun" in job.output
  # Said once, by rank 0: the frozen-process guarantee differs on MPI.
  assert "2 processes on Horovod's MPI controller" in job.output
  assert job.output.count(distributed.MPI_FROZEN_PROCESS) == 1


def test_srun_chooses_pmix_where_the_sites_default_is_none(launchers):
  job = launchers["srun"]
  assert_trained_on_both_hosts(job)  # with Adasum: MPI's controller
  assert "via srun --mpi=pmix" in job.output


@pytest.mark.parametrize("name, op", [("mpirun", "average"),
                                      ("srun", "adasum")])
def test_the_step_report_gathers_both_hosts_under_mpi(launchers, name, op):
  """On MPI's controller, averaging or with Adasum (whose gradients are
  reduced each as the backward pass has it): each host's rank timed its
  own window, every phase of the step in it."""
  job = launchers[name]
  assert job.wait()["JobState"] == "COMPLETED", job.output[-3000:]
  report = json.loads((job.out / "run" / "profile" / "step_report.json")
                      .read_text())
  assert report["window"] == [4, 6]
  assert report["settings"]["allreduce_op"] == op
  for figures in report["ranks"]:
    assert all(figures["parts"][phase] > 0 for phase in (
        "forward", "backward", "communication", "optimizer")), figures
    assert sum(figures["parts"].values()) == pytest.approx(figures["step"])
  assert [r["rank"] for r in report["ranks"]] == [0, 1]
  assert f"{report['verdict']['bound']}-bound: " in job.output


def test_srun_keeps_the_pmi_the_user_or_site_chose(launchers):
  job = launchers["srun chosen"]
  assert_trained_on_both_hosts(job)
  assert "via srun --mpi=pmix_v4" in job.output


def test_srun_without_a_pmi_is_refused_in_one_line(cluster):  # pylint: disable=redefined-outer-name
  # What train.sbatch avoids: srun under the site's default, none.
  out = cluster.tmp / "no_pmi"
  out.mkdir()
  job_id = cluster.slurm.submit(
      ["-N", "2", "--ntasks-per-node=1", f"--chdir={fixtures.REPO}",
       f"--output={out}/job.out", "--wrap",
       f"srun {fixtures.PYTHON} -m engine.train --data_dir={cluster.data_dir}"
       f" --model_dir={out}/run"],
      env=fixtures.engine_env(SLURM_CONF=cluster.slurm.conf))
  fields = cluster.slurm.wait(job_id)
  with open(out / "job.out") as f:
    output = f.read()
  assert fields["JobState"] == "FAILED", output
  errors = [line for line in output.splitlines() if "error" in line.lower()
            and not line.startswith("srun:")]
  assert errors == ["engine.train: error: srun started 2 tasks with no "
                    "PMI (--mpi=none, the default of many sites), so each "
                    "would train alone: launch with srun --mpi=pmix (srun "
                    "--mpi=list shows this cluster's) or through "
                    "scripts/slurm/train.sbatch"] * 2, output
  assert "PMI support" not in output  # Open MPI's page on it
  assert not os.path.exists(out / "run" / "checkpoints")


def test_a_preempted_job_requeues_and_resumes(cluster):  # pylint: disable=redefined-outer-name
  epochs = 30
  job = cluster.submit("preempted", f"--epochs={epochs}")
  job.preempt_after_an_epoch(epoch_seconds=120)
  stopped_at = len(job.metrics())
  assert stopped_at < epochs, "the signal came after the run had finished"
  # SLURM holds the requeued job for the credentials' lifetime
  # (simulated_slurm.CRED_EXPIRE_SECONDS here), then starts it again.
  fields = job.wait()
  output = job.output
  assert fields["JobState"] == "COMPLETED", (
      f"{fields}\n{output[-3000:]}\n{cluster.slurm.logs(30)}")
  assert "preempted and saved: job" in output and "requeued" in output
  assert "(job %d, restart 1)" % job.id in output
  assert "run the same command again to continue" in output
  metrics = job.metrics()
  assert [m["epoch"] for m in metrics] == list(range(1, epochs + 1))
  seconds = [m["cumulative_seconds"] for m in metrics]
  assert seconds == sorted(seconds)
  assert_trained_on_both_hosts_after_restart(job)


def test_a_preempted_mpirun_job_saves_steps_longer_than_mpiruns_grace(
    cluster):  # pylint: disable=redefined-outer-name
  """mpirun passes SIGTERM on only to kill: SIGKILL follows a second later,
  and a 2 s step never ends in time. train.sbatch sends it SIGUSR1, which
  it passes on, and the ranks save at their next step; rank 0's save,
  slowed to 3 s, lands though mpirun kills what still runs a second or
  two after a rank exits."""
  job = cluster.submit("preempted_mpirun", "--epochs=30", launcher="mpirun",
                       RECORD_STEP_SECONDS="2", RECORD_SAVE_SECONDS="3")
  job.preempt_after_an_epoch(epoch_seconds=180)
  output = job.output
  saved = re.findall(r"engine.train: stopped by SIGUSR1 at epoch \d+, "
                     r"step \d+; saved \S+/(ckpt-\d+)", output)
  assert len(saved) == 1, output[-3000:]
  assert f"{saved[0]}.index" in os.listdir(job.out / "run" / "checkpoints")
  cancelled = cluster.slurm.run(["scancel", str(job.id)])
  assert cancelled.returncode == 0, cancelled.stderr
  job.wait(states=("CANCELLED",))


def assert_trained_on_both_hosts_after_restart(job):
  # The requeued job's processes recorded last; the first part's stopped.
  processes = job.processes
  assert sorted(p["hostname"] for p in processes) == ["host0", "host1"]
  first, second = processes
  for a, b in zip(first["weights"], second["weights"]):
    np.testing.assert_array_equal(a, b)


def test_a_stuck_rank_under_mpi_ends_by_the_stall_shutdown(cluster):  # pylint: disable=redefined-outer-name
  job = cluster.submit(
      "stuck", "--epochs=3", launcher="mpirun", STALL_SHUTDOWN_SECONDS="6",
      HOROVOD_STALL_CHECK_TIME_SECONDS="2", RECORD_STUCK_RANK="1",
      RECORD_STUCK_AT="3")
  fields = job.wait(timeout=120)
  output = job.output
  assert fields["JobState"] == "FAILED", output[-3000:]
  # Horovod's stall check names the rank (marked "!") as it shuts down;
  # the engine's line points there.
  assert "Missing ranks:\n1!: [" in output, output[-3000:]
  assert "stalled for longer than 6 seconds. Will shutdown." in output
  assert ("engine.train: error: another process stopped the job (its "
          "error, if any, is above), or stopped answering: Horovod's stall "
          "check ends a job whose ranks wait 6 s for one "
          "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS), and its last warning "
          "above marks that rank with '!'; run the same command again: it "
          "starts from the beginning (no checkpoint yet)") in output


def test_a_crashed_rank_ends_the_srun_job(cluster):  # pylint: disable=redefined-outer-name
  """Rank 0 dies mid-run: rank 1, left waiting in MPI for a coordinator
  that is gone, is ended by srun, and the job fails instead of holding its
  nodes until the time limit."""
  job = cluster.submit("crashed", "--epochs=3", RECORD_CRASH_RANK="0",
                       RECORD_CRASH_AT="3", EXIT_WAIT_SECONDS="5")
  fields = job.wait(timeout=120)
  output = job.output
  assert fields["JobState"] == "FAILED", output[-3000:]
  assert "host0: task 0: Segmentation fault" in output, output[-3000:]
  assert "host1: task 1: Killed" in output, output[-3000:]


def test_slurm_leaves_the_machine_as_it_found_it():
  def namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True,
                          text=True).stdout
  before = namespaces()
  with pytest.raises(RuntimeError, match="a failure inside"):
    with simulated_hosts.SimulatedHosts(2) as hosts, \
        simulated_slurm.SimulatedSlurm(hosts) as slurm:
      directory = os.path.dirname(slurm.conf)
      raise RuntimeError("a failure inside")
  assert namespaces() == before
  assert not os.path.exists(directory)
  # Every daemon named its files in that directory on its command line.
  running = subprocess.run(["pgrep", "-f", directory], capture_output=True)
  assert running.returncode == 1, running.stdout


def test_the_scaling_script_runs_the_recipe_on_1_and_2_nodes(cluster):  # pylint: disable=redefined-outer-name
  out = cluster.tmp / "scaling"
  result = cluster.slurm.run(
      [os.path.join(fixtures.REPO, "scripts", "slurm", "scaling.sh"),
       "--nodes=1,2", f"--out={out}", "--sbatch=--ntasks-per-node=1",
       "--wait", "--", *fixtures.ENGINE_FLAGS,
       f"--data_dir={cluster.data_dir}", *ENGINE, "--epochs=2"],
      env=fixtures.engine_env(SLURM_CONF=cluster.slurm.conf,
                              IFACE=simulated_hosts.INTERFACE),
      timeout=300)
  assert result.returncode == 0, result.stderr
  header, *rows, wrote = result.stdout.splitlines()
  assert wrote == f"wrote {out / 'scaling.png'}"
  assert header.split() == ["run", "epochs", "best", "final", "img/s",
                            "procs", "speedup", "efficiency", "state"]
  assert [row.split()[0] for row in rows] == ["nodes_1", "nodes_2"]
  assert [row.split()[5:8] for row in rows][0] == ["1", "1.00x", "100%"]
  assert rows[1].split()[5] == "2"
  assert all(row.split()[-1] == "finished" for row in rows), result.stdout
  with open(out / "scaling.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(out / "nodes_2.out") as f:
    assert "2 processes on host0:1,host1:1 via srun --mpi=pmix" in f.read()
