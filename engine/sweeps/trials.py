"""A sweep's trials as engine runs: how each is started, and how it ended.

A trial is `python -m engine.train` with the base flags, its drawn values,
its own --model_dir under the study and --study_dir/--trial_number, so
its rank 0 reports to the study (engine/loop/trial.py). Its output goes to
`trial.log` in its model_dir; `trial.json` there says what the sweep
knows of it (number, values, state, deciding figure, reason), which
engine.runs shows beside the run's own records.

Launchers: `Local` runs it as `horovodrun --gloo -np P` on this machine;
`Slurm` (slurm.py) submits it as a job of scripts/slurm/train.sbatch, so a
study spreads over a cluster's queue. Each says `where` its trials run (a
sweep continues its own trials there), starts a trial, and `adopt`s one an
earlier sweep left: a handle to watch it by, or None, to start it again.
"""
import ctypes
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

from engine.core import run_files

# Optuna's states, as the sweep records and engine.runs shows them.
COMPLETE, PRUNED, FAILED, RUNNING = "complete", "pruned", "failed", "running"
# The engine's one-line error, in a trial's log (horovodrun prefixes each
# line with its rank).
_ERROR = re.compile(r"engine\.train: (?:error: )?(.*)$")


@dataclasses.dataclass(frozen=True)
class Ending:
  """How a trial's run ended: `state` one of COMPLETE, PRUNED, FAILED, or
  RUNNING for a run stopped by a signal, to be resumed."""
  state: str
  value: Optional[float]  # the deciding figure: the best epoch's
  epochs: int             # epochs trained
  reason: str = ""


def ending(model_dir: str, figure: str, minimize: bool,
           exit_code: Optional[int]) -> Ending:
  """How the run in `model_dir` ended, from its records and exit code
  (None: a run an earlier sweep started, whose exit code is gone; RUNNING
  unless its records say it finished or was pruned)."""
  records, _, end = run_files.epochs_and_events(model_dir)
  values = [r[figure] for r in records if run_files.is_finite(r.get(figure))]
  value = (min(values) if minimize else max(values)) if values else None
  epochs = records[-1]["epoch"] if records else 0
  state = (end or {}).get("state")
  if not records and end is None and not os.path.exists(
      os.path.join(model_dir, run_files.TRIAL_LOG)):
    # No log: a job cancelled in the queue. Nothing ran, nothing failed.
    return Ending(RUNNING, None, 0,
                  f"it never started (no {run_files.TRIAL_LOG})")
  if state == "pruned":
    return Ending(PRUNED, values[-1] if values else None, epochs,
                  end.get("reason", ""))
  if state == "stopped":
    return Ending(RUNNING, value, epochs, end.get("reason", ""))
  if exit_code is None:
    last = records[-1] if records else {}
    finished = end is None and (last.get("stopped_early") is True or (
        bool(last) and last["epoch"] >= last.get("epochs", epochs + 1)))
    exit_code = 0 if finished else None
    if exit_code is None:
      return Ending(RUNNING, value, epochs)
  if exit_code == 0 and end is None:
    if value is None:
      return Ending(FAILED, None, epochs, f"no {figure} was recorded; "
                    "does the run evaluate (--eval_every_epochs)?")
    return Ending(COMPLETE, value, epochs)
  reason = (end or {}).get("reason") or last_error(model_dir) or (
      f"exited with {exit_code}")
  return Ending(FAILED, value, epochs, reason)


def last_error(model_dir: str) -> str:
  """The engine's one-line error in the trial's log, or its last line."""
  try:
    with open(os.path.join(model_dir, run_files.TRIAL_LOG), encoding="utf-8",
              errors="replace") as f:
      lines = [line.strip() for line in f if line.strip()]
  except OSError:
    return ""
  for line in reversed(lines):
    match = _ERROR.search(line)
    if match:
      return match.group(1)
  return lines[-1] if lines else ""


def write(model_dir: str, record: dict) -> None:
  """trial.json, replaced whole."""
  run_files.write_record(model_dir, run_files.TRIAL_FILE, record)


def read(model_dir: str) -> Optional[dict]:
  return run_files.read_record(model_dir, run_files.TRIAL_FILE, dict,
                               keeps="what the sweep knows of this trial")


# --- Launchers --------------------------------------------------------------

def _engine_command() -> list[str]:
  return [sys.executable, "-m", "engine.train"]


def _die_with_parent() -> None:
  """In the child: SIGTERM when the sweep's process dies, however it dies
  (kill -9 too), so the trial saves and stops instead of training on
  unwatched; the sweep started again resumes it."""
  libc = ctypes.CDLL("libc.so.6", use_errno=True)
  pr_set_pdeathsig = 1
  libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


class LocalTrial:
  """A trial running as horovodrun's processes on this machine."""

  def __init__(self, process: subprocess.Popen):
    self._process = process
    self.attrs = {"host": socket.gethostname(), "pid": process.pid}

  def poll(self) -> Optional[int]:
    return self._process.poll()

  def stop(self) -> None:
    """Saves and stops it (horovodrun passes SIGTERM on to the ranks)."""
    if self._process.poll() is None:
      self._process.send_signal(signal.SIGTERM)


class Local:
  """Trials as `horovodrun --gloo -np processes` on this machine."""

  def __init__(self, processes: int):
    self.processes = processes
    self.where = socket.gethostname()

  def start(self, model_dir: str, args: list[str]) -> LocalTrial:
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get(
        "TF_CPP_MIN_LOG_LEVEL", "2"))
    with open(os.path.join(model_dir, run_files.TRIAL_LOG), "ab") as log:
      process = subprocess.Popen(
          [horovodrun, "--gloo", "-np", str(self.processes),
           *_engine_command(), *args],
          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
          env=env, preexec_fn=_die_with_parent)
    return LocalTrial(process)

  def adopt(self, attrs: dict) -> None:
    """None: a trial an earlier sweep on this machine started cannot be
    watched (its processes are not this sweep's children), so the sweep
    starts it again; first this waits while they run, so that they leave
    its model_dir to the new ones: they got SIGTERM when that sweep died,
    and may still be saving."""
    while self._still_running(attrs):
      time.sleep(1.0)

  def _still_running(self, attrs: dict) -> bool:
    if attrs.get("host") != socket.gethostname() or "pid" not in attrs:
      return False
    try:
      os.kill(int(attrs["pid"]), 0)
    except (ProcessLookupError, ValueError):
      return False
    except PermissionError:
      pass
    return True


def wait_all(handles: list, timeout: float) -> None:
  """Waits up to `timeout` seconds for the trials to end."""
  deadline = time.monotonic() + timeout
  while any(h.poll() is None for h in handles):
    if time.monotonic() > deadline:
      return
    time.sleep(0.5)
