"""A sweep's trials as SLURM jobs of scripts/slurm/train.sbatch, so that a
study spreads over a cluster's queue (engine.sweep --launcher=slurm).

Each trial is `sbatch train.sbatch` from the repository root, with the
engine's flags after the script: --processes tasks, at most that many
per node, so that a trial fits on one node where the queue has one free
(train.sbatch's own default is a task per node), the job's output
appended to the trial's log, the sweep's own venv (VENV). What a
site decides, SLURM's own variables in the sweep's environment give, as
for any sbatch: SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT,
SBATCH_GPUS_PER_TASK, ...; train.sbatch's LAUNCHER and IFACE pass through.

The sweep sees a job queued, running or requeued as running: train.sbatch
requeues a job SLURM stops before its time limit, saved, and it resumes
from its checkpoint. It asks scontrol (every QUERY_SECONDS, to spare a
busy controller), or SLURM's accounting (sacct) once scontrol has
forgotten an ended job.

Stopping a sweep stops its jobs, saved, and lets them end: their requeue
turned off first, or train.sbatch would requeue them to run on unwatched.
The sweep started again submits them anew, and each resumes from its
checkpoint; a job it finds still queued or running (its sweep was killed
without stopping it) it watches as its own, rather than submitting a
second job into the same model_dir.
"""
import math
import os
import re
import subprocess
import sys
import time
from typing import Optional

from engine.core import run_files
from engine.core.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TRAIN_SBATCH = os.path.join(REPO, "scripts", "slurm", "train.sbatch")
# How often a job's state is asked of SLURM, in seconds.
QUERY_SECONDS = 5.0
# How long a SLURM command may take to answer, in seconds.
COMMAND_SECONDS = 60
# The states of a job that has ended (squeue(1), "JOB STATE CODES");
# every other one (pending, running, requeued, suspended, ...) may run yet.
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
         "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


class SlurmTrial:
  """A trial running as SLURM job `job_id`."""

  def __init__(self, job_id: int, cluster: str):
    self.job_id = job_id
    self.attrs = {"slurm_job": job_id, "slurm_cluster": cluster}
    self._exit_code = None
    self._asked = -math.inf

  def poll(self) -> Optional[int]:
    """None while the job is queued or running; then 0 if it COMPLETED,
    its exit code if it ended otherwise."""
    if self._exit_code is None and (
        time.monotonic() - self._asked >= QUERY_SECONDS):
      self._asked = time.monotonic()
      self._exit_code = _exit_code_once_ended(self.job_id)
    return self._exit_code

  def stop(self) -> None:
    """Asks the job to save and stop, for good: train.sbatch passes SIGTERM
    on to the ranks, which save, and requeues the job unless its requeue
    is off. A job not running yet is cancelled: it has nothing to save."""
    fields = _job(self.job_id)
    if not fields or fields.get("JobState") in ENDED:
      return
    _slurm(["scontrol", "update", f"JobId={self.job_id}", "Requeue=0"])
    signalled = fields.get("JobState") == "RUNNING" and not _slurm(
        ["scancel", "--batch", "--signal=TERM", str(self.job_id)]).returncode
    if not signalled:
      _slurm(["scancel", str(self.job_id)])


class Slurm:
  """Trials as jobs of scripts/slurm/train.sbatch, `processes` tasks each."""

  def __init__(self, processes: int):
    self.processes = processes
    self.cluster = _cluster_name()
    # The sweep's trials are this cluster's, whichever login node it runs on.
    self.where = f"slurm:{self.cluster}"

  def start(self, model_dir: str, args: list[str]) -> SlurmTrial:
    # squeue shows the study and the trial (STUDY/trials/0003): fmnist-0003.
    study = os.path.basename(os.path.dirname(os.path.dirname(model_dir)))
    name = f"{study}-{os.path.basename(model_dir)}"
    log = os.path.join(model_dir, run_files.TRIAL_LOG)
    env = dict(os.environ, VENV=sys.prefix, TF_CPP_MIN_LOG_LEVEL=os.environ.get(
        "TF_CPP_MIN_LOG_LEVEL", "2"))
    submitted = _slurm(
        ["sbatch", "--parsable", f"--job-name={name}",
         f"--ntasks={self.processes}",
         f"--ntasks-per-node={self.processes}",
         "--output=" + log.replace("%", "%%"),  # sbatch's patterns: %j, ...
         TRAIN_SBATCH, *args], cwd=REPO, env=env)
    if submitted.returncode:
      raise UserError(f"--launcher=slurm: sbatch refused the job of "
                      f"{model_dir} ({_first_line(submitted.stderr)}); fix "
                      "that, then run the same command again to continue "
                      "the study")
    # --parsable: "id" or, on a federation, "id;cluster".
    return SlurmTrial(int(submitted.stdout.split()[-1].split(";")[0]),
                      self.cluster)

  def adopt(self, attrs: dict) -> Optional[SlurmTrial]:
    """The job of a trial an earlier sweep started (`attrs`, its record),
    to watch as this sweep's own if SLURM knows it yet. None if not, or if
    that sweep stopped it (its requeue is off; SBATCH_NO_REQUEUE's jobs
    look so too), once it has ended: the sweep submits the trial anew, and
    it resumes from its checkpoint."""
    if "slurm_job" not in attrs:
      return None  # its sbatch failed
    job_id = int(attrs["slurm_job"])
    fields = _job(job_id)
    if fields is None:
      raise UserError(f"--launcher=slurm: SLURM did not answer about job "
                      f"{job_id}; run the same command again")
    if not fields:
      return None
    if fields.get("Requeue") == "0":
      while _exit_code_once_ended(job_id) is None:
        time.sleep(QUERY_SECONDS)
      return None
    return SlurmTrial(job_id, self.cluster)


# --- Asking SLURM -----------------------------------------------------------

def _slurm(command: list[str], **kwargs) -> subprocess.CompletedProcess:
  """A SLURM command's result; one that did not answer in COMMAND_SECONDS
  as a failed one."""
  try:
    return subprocess.run(command, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True,
                          timeout=COMMAND_SECONDS, check=False, **kwargs)
  except FileNotFoundError:
    raise UserError(f"--launcher=slurm: no `{command[0]}` here; run the "
                    "sweep where SLURM's commands are (a login node)") \
        from None
  except subprocess.TimeoutExpired:
    return subprocess.CompletedProcess(
        command, 1, "", f"no answer in {COMMAND_SECONDS} s")


def _cluster_name() -> str:
  shown = _slurm(["scontrol", "show", "config"])
  match = re.search(r"^ClusterName\s*=\s*(\S+)", shown.stdout, re.MULTILINE)
  if shown.returncode or not match:
    raise UserError("--launcher=slurm: SLURM does not answer here (scontrol "
                    f"show config: {_first_line(shown.stderr)}); run the "
                    "sweep where sbatch works (a login node)")
  return match.group(1)


def _job(job_id: int) -> Optional[dict]:
  """scontrol's fields of the job, as strings; {} once SLURM has forgotten
  it (MinJobAge after its end), None if SLURM did not answer."""
  shown = _slurm(["scontrol", "show", "job", "--oneliner", str(job_id)])
  if shown.returncode:
    return {} if "Invalid job id" in shown.stderr else None
  fields = {}
  for key, value in re.findall(r"(\w+)=(\S*)", shown.stdout):
    fields.setdefault(key, value)  # the job's own, before its command's
  return fields


def _exit_code_once_ended(job_id: int) -> Optional[int]:
  """None while the job may run yet (or SLURM did not answer); then its
  exit code: 0 for COMPLETED."""
  fields = _job(job_id)
  if fields is None:
    return None
  if fields:
    state, code = fields.get("JobState", ""), fields.get("ExitCode", "")
    return _exit_code(state, code) if state in ENDED else None
  # Forgotten by scontrol: it ended; its accounting, if the site keeps one.
  accounted = _slurm(["sacct", "--jobs", str(job_id), "--allocations",
                      "--noheader", "--parsable2", "--format=State,ExitCode"])
  state, _, code = (accounted.stdout.strip().splitlines() or [""])[0] \
      .partition("|")
  return _exit_code((state.split() or [""])[0], code)


def _exit_code(state: str, code: str) -> int:
  """0 for COMPLETED; otherwise the job's exit status, or 128 + the signal
  that ended it, or 1 (a job cancelled, timed out or forgotten)."""
  if state == "COMPLETED":
    return 0
  status, _, signum = code.partition(":")
  if not (status.isdigit() and signum.isdigit()):
    return 1
  return int(status) or (128 + int(signum) if int(signum) else 1)


def _first_line(text: str) -> str:
  return (text.strip().splitlines() or ["no message"])[0]
