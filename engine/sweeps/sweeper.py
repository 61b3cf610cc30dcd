"""The sweep itself: trials started while the budget lasts, watched, and
told to the study as they end.

engine/sweep.py, the command, opens the study and gives a Sweeper the
launcher and the budget its flags ask for; the Sweeper reads no flags.
Trials that ended are kept; trials a stopped sweep left running are
started again from their checkpoints, or watched again if their SLURM jobs
are still queued or running. SIGTERM or Ctrl-C stops the running trials at
their next step, saved, and the Sweeper returns the signal: the command
exits with it, and the same command continues the study.
"""
import dataclasses
import os
import signal
import time

from engine.sweeps import space as spaces
from engine.sweeps import study as studies
from engine.sweeps import trials
from engine.sweeps.study import Sweep

# How often the sweep looks at its running trials, in seconds.
POLL_SECONDS = 1.0
# How long a stopping sweep waits for its trials to save.
STOP_WAIT_SECONDS = 120


@dataclasses.dataclass(frozen=True)
class Budget:
  """How long a sweep starts new trials: until its study holds `trials`
  (counted over every start and every host sharing it; 0: no count), or
  `hours` after this start (0: no limit); a grid ends when its points do.
  Running trials finish."""
  trials: int = 0
  hours: float = 0.0

  def left(self, study, sweep: Sweep, began: float) -> bool:
    """Whether a new trial may start, `began` (time.monotonic) being this
    start's."""
    if self.hours and time.monotonic() - began > self.hours * 3600:
      return False
    if sweep.sampler == "grid" and study.sampler.is_exhausted(study):
      return False
    return not self.trials or len(study.get_trials(
        deepcopy=False)) < self.trials


class Sweeper:
  """Starts the study's trials while its budget lasts and tells the study
  how each ended."""

  def __init__(self, *, sweep: Sweep, storage, study, launcher,
               study_dir: str, budget: Budget, parallel: int):
    """`storage` and `study`: Optuna's (study.storage, study.open_study);
    `launcher`: where trials run (trials.Local, slurm.Slurm); `parallel`:
    trials running at once."""
    self._sweep = sweep
    self._storage = storage
    self._study = study
    self._launcher = launcher
    self._study_dir = os.path.abspath(study_dir)
    self._budget = budget
    self._parallel = parallel
    # This sweep's trials among a shared study's: this host's (or SLURM
    # cluster's), this dir's.
    self._worker = f"{launcher.where}:{self._study_dir}"
    shared = not sweep.storage.startswith("sqlite")
    study.sampler = studies.sampler(
        sweep, drawn=len(study.get_trials(deepcopy=False)),
        worker=self._worker if shared else "")
    self._running = {}  # number -> (handle, model_dir, params)
    self._stopping = 0  # the signal that stops the sweep

  def run(self) -> int:
    """Starts trials while the budget lasts and tells the study how each
    ended; returns when none runs: 0, or the signal that stopped the sweep
    (its running trials saved, to be resumed by its next start)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, self._stop)
    began = time.monotonic()
    self._resume_unfinished()
    while True:
      self._tell_ended()
      if self._stopping:
        break
      while (len(self._running) < self._parallel
             and self._budget.left(self._study, self._sweep, began)):
        self._start_new()
      if not self._running and not self._budget.left(self._study,
                                                     self._sweep, began):
        break
      time.sleep(POLL_SECONDS)
    if self._stopping:
      self._stop_trials()
    return self._stopping

  def _resume_unfinished(self) -> None:
    """Trials this sweep left running when it was stopped: watched again
    where the launcher can (a SLURM job still queued or running); told, if
    their runs ended meanwhile (finished, or pruned before the sweep could
    tell it); else started again, resuming from their checkpoints. Each is
    counted once: it keeps its number."""
    import optuna  # pylint: disable=g-import-not-at-top
    for frozen in self._study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
      if frozen.user_attrs.get("worker") != self._worker:
        continue  # another host's, or another directory's
      model_dir = studies.trial_dir(self._study_dir, frozen.number)
      handle = self._launcher.adopt(frozen.user_attrs)
      if handle is not None:
        print(f"engine.sweep: trial {frozen.number} still running: watched "
              "again", flush=True)
        self._running[frozen.number] = (handle, model_dir, frozen.params)
        continue
      ending = trials.ending(model_dir, self._sweep.figure,
                             self._sweep.minimize, exit_code=None)
      if ending.state != trials.RUNNING:
        self._ended(frozen.number, model_dir, frozen.params, ending)
        continue
      print(f"engine.sweep: trial {frozen.number} resumed", flush=True)
      self._launch(frozen.number, frozen.params)

  def _start_new(self) -> None:
    trial = self._study.ask()
    params = {parameter.flag: parameter.suggest(trial)
              for parameter in self._sweep.space}
    self._launch(trial.number, params)
    print(f"engine.sweep: trial {trial.number} started: "
          + " ".join(spaces.as_flags(params)), flush=True)

  def _launch(self, number: int, params: dict) -> None:
    model_dir = studies.trial_dir(self._study_dir, number)
    os.makedirs(model_dir, exist_ok=True)
    trials.write(model_dir, dict(number=number, params=params,
                                 state=trials.RUNNING))
    # Its worker first: a trial whose start fails is this sweep's to resume.
    studies.set_trial_attr(self._storage, self._sweep, number, "worker",
                           self._worker)
    handle = self._launcher.start(model_dir, [
        *self._sweep.base_flags, *spaces.as_flags(params),
        f"--model_dir={model_dir}", f"--trial_study_dir={self._study_dir}",
        f"--trial_number={number}"])
    for key, value in handle.attrs.items():
      studies.set_trial_attr(self._storage, self._sweep, number, key, value)
    self._running[number] = (handle, model_dir, params)

  def _tell_ended(self) -> None:
    for number, (handle, model_dir, params) in list(self._running.items()):
      exit_code = handle.poll()
      if exit_code is None:
        continue
      del self._running[number]
      ending = trials.ending(model_dir, self._sweep.figure,
                             self._sweep.minimize, exit_code)
      if ending.state == trials.RUNNING and not self._stopping:
        ending = trials.Ending(trials.FAILED, ending.value, ending.epochs,
                               ending.reason or "stopped by a signal")
      self._ended(number, model_dir, params, ending)

  def _ended(self, number: int, model_dir: str, params: dict,
             ending: trials.Ending) -> None:
    """Tells the study how trial `number` ended, records it in its
    trial.json and says it."""
    self._tell(number, ending)
    trials.write(model_dir, dict(number=number, params=params,
                                 state=ending.state, value=ending.value,
                                 epochs=ending.epochs, reason=ending.reason))
    self._say(number, ending)

  def _tell(self, number: int, ending: trials.Ending) -> None:
    import optuna  # pylint: disable=g-import-not-at-top
    state = optuna.trial.TrialState
    if ending.state == trials.RUNNING:
      return  # stopped with the sweep: the next start resumes it
    if ending.state == trials.FAILED:
      studies.set_trial_attr(self._storage, self._sweep, number, "reason",
                             ending.reason)
    try:
      if ending.state == trials.COMPLETE:
        self._study.tell(number, ending.value)
      else:
        self._study.tell(number, state=(
            state.PRUNED if ending.state == trials.PRUNED else state.FAIL))
    except (ValueError, RuntimeError) as e:  # told already (a restart)
      print(f"engine.sweep: trial {number}: {e}", flush=True)

  def _say(self, number: int, ending: trials.Ending) -> None:
    figure = (f"{self._sweep.figure} {ending.value:.4f}"
              if ending.value is not None else "no figure")
    words = {trials.COMPLETE: f"complete: {figure}",
             trials.PRUNED: f"pruned: {figure}",
             trials.FAILED: f"failed: {ending.reason}",
             trials.RUNNING: "stopped, saved; the next start resumes it"}
    print(f"engine.sweep: trial {number} {words[ending.state]} after "
          f"{ending.epochs} epochs", flush=True)

  def _stop(self, signum, frame) -> None:
    del frame
    self._stopping = self._stopping or signum
    for handle, _, _ in self._running.values():
      handle.stop()

  def _stop_trials(self) -> None:
    trials.wait_all([h for h, _, _ in self._running.values()],
                    timeout=STOP_WAIT_SECONDS)
    self._tell_ended()


def where_it_stands(study, sweep: Sweep, study_dir: str) -> str:
  """A line: the trials by state, and the best."""
  counts = {}
  for frozen in study.get_trials(deepcopy=False):
    counts[frozen.state.name.lower()] = counts.get(
        frozen.state.name.lower(), 0) + 1
  line = "engine.sweep: " + ", ".join(f"{n} {state}"
                                      for state, n in sorted(counts.items()))
  best = studies.best_trial(study)
  if best:
    line += (f"; best: trial {best.number}, {sweep.figure} "
             f"{best.value:.4f} (python -m engine.sweep --study_dir="
             f"{study_dir} --best)")
  return line
