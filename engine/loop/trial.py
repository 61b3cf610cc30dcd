"""A sweep's trial, seen from its run: after each evaluated epoch, rank 0
reports the deciding figure to the study and asks whether the study's
pruner stops the trial here.

The run does this itself rather than the sweep watching it, so the answer
comes at the epoch's end, before the next epoch's first step, and a trial
started by a SLURM job on another node goes on reporting while the sweep
that started it is stopped. A pruned trial stops like an early-stopped
run: the epoch is recorded and saved first, then every rank stops; its
end record says "pruned" (engine.runs shows it), and the sweep tells the
study so when the run has exited.
"""
from typing import Optional

from absl import logging

from engine.core.config import TrialConfig
from engine.core.errors import UserError
from engine.sweeps import study


class TrialReports:
  """Rank 0's reports to the study of the sweep in `config.study_dir`."""

  def __init__(self, config: TrialConfig, metric: str):
    self._config = config
    self._metric = metric  # the run's --best_metric, as val_mae:min
    self._trial = None
    self._storage = ""  # the study's URL, for errors
    self.pruner = ""

  def open(self) -> None:
    """Finds the trial in its study (once): a --study_dir without a sweep,
    another deciding figure or a trial already ended is one line."""
    if self._trial is not None:
      return
    where = f"--trial_study_dir={self._config.study_dir}"
    sweep = study.read_sweep(self._config.study_dir)
    if sweep is None:
      raise UserError(f"{where}: no sweep there ({study.SWEEP_FILE} is "
                      "missing); engine.sweep starts trials with it")
    if sweep.metric != self._metric:
      raise UserError(f"{where}: the sweep decides by {sweep.metric}, this "
                      f"run by {self._metric}; pass --best_metric="
                      f"{sweep.metric}")
    self._trial, state = study.trial(sweep, self._config.number)
    if state.is_finished():
      raise UserError(f"{where}: trial {self._config.number} is "
                      f"{state.name.lower()} already; the sweep starts a "
                      "new trial for more")
    self.pruner = sweep.pruner
    self._storage = sweep.storage

  def pruned_after(self, epoch: int, value: Optional[float]) -> bool:
    """Reports epoch `epoch`'s figure (from 1); whether the pruner stops
    the trial after it."""
    self.open()
    if value is None:
      return False
    # Optuna keeps a step's first report: a resumed trial that reports an
    # epoch again is judged on the same figure. (SQLAlchemy is imported
    # here, as by study.storage, so that a run outside a sweep never loads
    # it.)
    import sqlalchemy.exc  # pylint: disable=g-import-not-at-top
    try:
      self._trial.report(value, epoch)
      pruned = self._trial.should_prune()
    except sqlalchemy.exc.SQLAlchemyError as e:
      raise study.database_error(self._storage, e) from None
    if pruned:
      logging.info("trial %d pruned after epoch %d by the study's %s "
                   "pruner", self._config.number, epoch, self.pruner)
    return pruned
