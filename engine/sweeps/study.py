"""A sweep's study: what it searches, where Optuna keeps it, its trials.

The study directory holds `sweep.json` (what defines the study: the space,
the base flags, the deciding figure, the sampler and pruner, the storage)
and a directory per trial under `trials/`. Optuna's storage holds the
trials' values and states: SQLite in the study directory by default
(`study.db`: one machine, nothing to start), or a database URL
(PostgreSQL) that sweeps on several hosts share.

Both sides open the study here: the sweep (engine/sweep.py), which asks
for trials and tells their ends, and each trial's rank 0
(engine/loop/trial.py), which reports its figure after each evaluated
epoch and asks whether it is pruned. So a trial needs nothing of the sweep
but its directory and its number, and goes on reporting while the sweep
is stopped.
"""
import dataclasses
import json
import os
import re
import time
import zlib
from typing import Optional

from engine.core.errors import UserError
from engine.sweeps import space as spaces

SWEEP_FILE = "sweep.json"
TRIALS_DIR = "trials"
SQLITE_FILE = "study.db"
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("asha", "median", "none")
# SQLite's wait for a lock another trial holds, in seconds: several trials
# and the sweep write to one file.
SQLITE_TIMEOUT = 60
# Seconds to reach a database server.
CONNECT_TIMEOUT = 15
# Opening a database another sweep is setting up: how often, how far apart.
OPEN_ATTEMPTS = 5
OPEN_RETRY_SECONDS = 0.5


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What defines a study: a sweep started again with other values is
  another sweep, and is refused."""
  storage: str       # Optuna's storage URL
  study_name: str
  space: tuple       # of space.Parameter
  base_flags: tuple  # the engine flags every trial runs with
  metric: str        # the deciding figure, as --best_metric: val_mae:min
  sampler: str       # one of SAMPLERS
  pruner: str        # one of PRUNERS
  seed: int          # the sampler's
  processes: int     # each trial's

  @property
  def minimize(self) -> bool:
    return self.metric.endswith(":min")

  @property
  def figure(self) -> str:
    """The figure's key in metrics.jsonl (val_mae)."""
    return self.metric.partition(":")[0]

  def as_dict(self) -> dict:
    record = dataclasses.asdict(self)
    record["space"] = [parameter.as_dict() for parameter in self.space]
    record["base_flags"] = list(self.base_flags)
    return record

  @classmethod
  def from_dict(cls, record: dict) -> "Sweep":
    record = dict(record)
    record["space"] = tuple(spaces.parse(
        {k: v for item in record["space"] for k, v in item.items()},
        where=SWEEP_FILE))
    record["base_flags"] = tuple(record["base_flags"])
    return cls(**record)


def default_storage(study_dir: str) -> str:
  return "sqlite:///" + os.path.join(os.path.abspath(study_dir), SQLITE_FILE)


def shown(url: str) -> str:
  """A storage URL as errors and logs show it: no password, also in a URL
  too malformed to open (postgresql:/user:password@host)."""
  return re.sub(r"^([^:/@]*:/*[^:/@]*):.*@", r"\1:***@", url)


def read_sweep(study_dir: str) -> Optional[Sweep]:
  """The sweep recorded in `study_dir`; None if it holds none."""
  path = os.path.join(study_dir, SWEEP_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      return Sweep.from_dict(json.load(f))
  except FileNotFoundError:
    return None
  except (OSError, ValueError, KeyError, TypeError, UserError) as e:
    raise UserError(f"{path}: unreadable ({e}); is {study_dir} a sweep's "
                    "study directory?") from None


def write_sweep(study_dir: str, sweep: Sweep) -> None:
  os.makedirs(os.path.join(study_dir, TRIALS_DIR), exist_ok=True)
  path = os.path.join(study_dir, SWEEP_FILE)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(sweep.as_dict(), f, indent=1)
    f.write("\n")
  os.replace(path + ".tmp", path)


def trial_dir(study_dir: str, number: int) -> str:
  """A trial's model_dir."""
  return os.path.join(study_dir, TRIALS_DIR, f"{number:04d}")


def storage(url: str):
  """Optuna's storage at `url`, connected: an unreachable database is one
  line."""
  import optuna  # pylint: disable=g-import-not-at-top
  import sqlalchemy.exc  # pylint: disable=g-import-not-at-top
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  kwargs = {}
  if url.startswith("postgresql"):
    # A server that drops packets is refused in seconds, not after TCP's
    # two minutes.
    kwargs = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT}}
  if url.startswith("sqlite:///"):
    kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT}}
    directory = os.path.dirname(url.removeprefix("sqlite:///"))
    try:
      os.makedirs(directory, exist_ok=True)
    except OSError as e:
      raise UserError(f"--storage={shown(url)}: cannot create {directory} "
                      f"({e.strerror})") from None
  for attempt in range(1, OPEN_ATTEMPTS + 1):
    try:
      return optuna.storages.RDBStorage(_with_driver(url),
                                        engine_kwargs=kwargs)
    except (sqlalchemy.exc.IntegrityError,
            sqlalchemy.exc.ProgrammingError) as e:
      # Sweeps started at once on a new database race to create Optuna's
      # tables (SQLAlchemy looks, then creates): a loser's duplicate means
      # the winner's tables are there now.
      if attempt == OPEN_ATTEMPTS:
        raise _unopened(url, e) from None
      time.sleep(OPEN_RETRY_SECONDS)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as e:
      raise _unopened(url, e) from None


def database_error(url: str, error: Exception) -> UserError:
  """A study's database failing after it opened (a server gone, a disk
  full), as one line."""
  first = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return UserError(f"the study's database {shown(url)} failed ({first}); "
                   "run the same command again once it answers")


def _unopened(url: str, error: Exception) -> UserError:
  first = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return UserError(f"--storage={shown(url)}: cannot open the study's "
                   f"database ({first})")


def _with_driver(url: str) -> str:
  """`url` naming the PostgreSQL driver requirements.txt installs,
  psycopg2: SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3's."""
  if url.startswith("postgresql://"):
    return "postgresql+psycopg2://" + url.removeprefix("postgresql://")
  return url


def sampler(sweep: Sweep, drawn: int = 0, worker: str = ""):
  """The sweep's sampler for a start of it that finds `drawn` trials in
  the study, on `worker` (given where several hosts share the study).

  A sampler's draws follow from its seed alone until it learns from
  results (random always; TPE's first 10), so each start seeds it anew:
  a continued sweep with the seed it began with would draw its first
  trials again, and two hosts starting together would draw each other's.
  A new study on one host draws from --sampler_seed itself, so two sweeps
  of one space and seed draw the same trials (a fair test of pruners).

  A grid keeps its seed on every start: it orders its points by the seed
  and gives trial k the k-th, so another seed would give a continued
  sweep's trials points tried already."""
  import optuna  # pylint: disable=g-import-not-at-top
  if sweep.sampler == "grid":
    return optuna.samplers.GridSampler(
        spaces.grid(list(sweep.space), where="--sampler=grid"),
        seed=sweep.seed)
  seed = sweep.seed + drawn + (zlib.crc32(worker.encode()) if worker else 0)
  if sweep.sampler == "random":
    return optuna.samplers.RandomSampler(seed=seed)
  return optuna.samplers.TPESampler(seed=seed)


def pruner(sweep: Sweep):
  """ASHA: successive halving at epochs 1, 3, 9, ... (a reduction by 3,
  each rung keeping the best third), each trial judged when it reaches a
  rung, never waiting for others; median: a trial worse than the median
  of the others at the same epoch, after the first 4 trials."""
  import optuna  # pylint: disable=g-import-not-at-top
  if sweep.pruner == "asha":
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=1,
                                                  reduction_factor=3)
  if sweep.pruner == "median":
    return optuna.pruners.MedianPruner(n_startup_trials=4)
  return optuna.pruners.NopPruner()


def open_study(sweep: Sweep, where=None, create: bool = False):
  """The sweep's Optuna study (created if `create` and not there yet), in
  `where` (a storage(); by default, the sweep's own)."""
  import optuna  # pylint: disable=g-import-not-at-top
  where = where or storage(sweep.storage)
  if create:
    return optuna.create_study(
        storage=where, study_name=sweep.study_name, load_if_exists=True,
        direction="minimize" if sweep.minimize else "maximize",
        sampler=sampler(sweep), pruner=pruner(sweep))
  try:
    return optuna.load_study(storage=where, study_name=sweep.study_name,
                             sampler=sampler(sweep), pruner=pruner(sweep))
  except KeyError:
    raise UserError(f"the study {sweep.study_name!r} is not in "
                    f"{shown(sweep.storage)}") from None


def trial(sweep: Sweep, number: int):
  """Trial `number` of the sweep's study, to report to, and its state."""
  import optuna  # pylint: disable=g-import-not-at-top
  where = storage(sweep.storage)
  study = open_study(sweep, where)
  trial_id = trial_id_of(where, sweep, number)
  return optuna.trial.Trial(study, trial_id), where.get_trial(trial_id).state


def trial_id_of(where, sweep: Sweep, number: int) -> int:
  """The storage's id of the study's trial `number`."""
  try:
    return where.get_trial_id_from_study_id_trial_number(
        where.get_study_id_from_name(sweep.study_name), number)
  except KeyError:
    raise UserError(f"the study {sweep.study_name!r} has no trial "
                    f"{number}") from None


def set_trial_attr(where, sweep: Sweep, number: int, key: str,
                   value) -> None:
  """A user attribute of trial `number`: which sweep runs it, its host
  and process or job, why it failed."""
  where.set_trial_user_attr(trial_id_of(where, sweep, number), key, value)


def best_trial(study):
  """The study's best complete trial (Optuna's FrozenTrial), or None."""
  import optuna  # pylint: disable=g-import-not-at-top
  complete = study.get_trials(deepcopy=False,
                              states=(optuna.trial.TrialState.COMPLETE,))
  return study.best_trial if complete else None
