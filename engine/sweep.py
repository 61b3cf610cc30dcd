r"""Hyperparameter search over engine runs, on Optuna.

  .venv/bin/python -m engine.sweep --space=flags/fashion_mnist_sweep.yaml \
      --trials=24 --study_dir=sweeps/fmnist -- \
      --flagfile=flags/fashion_mnist_fast.cfg --epochs=4
  .venv/bin/python -m engine.sweep --study_dir=sweeps/fmnist --best
  .venv/bin/python -m engine.runs sweeps/fmnist

Each trial is an ordinary engine run with the flags after `--`, the values
Optuna draws from the space (engine/sweeps/space.py) and its own
--model_dir under the study directory: `horovodrun --gloo -np
--processes` on this machine, --parallel of them at once
(--launcher=local), or a job of scripts/slurm/train.sbatch
(--launcher=slurm). The study is decided by the run's deciding figure
(--best_metric, or the task's: val_accuracy for classification), its
best epoch's; each trial reports it after every evaluated epoch, and the
pruner (ASHA by default) stops a poor trial there, saved.

Read `main()` to follow a sweep: the study opened (or continued: trials
that ended are kept, trials a stopped sweep left running are started
again from their checkpoints, or watched again if their SLURM jobs are
still queued or running), then trials started while the budget lasts,
each told to the study as it ends (engine/sweeps/sweeper.py): complete
with its figure, pruned, or failed with its one-line reason. SIGTERM or
Ctrl-C stops the running trials at their next step, saved; the same
command continues the study.
The study is kept in SQLite in the study directory, or in a database that
sweeps on several hosts share (--storage=postgresql://...). docs/sweeps.md
has a worked example.
"""
import os
import signal
import sys
from typing import Optional

from absl import app
from absl import flags
import sqlalchemy.exc

from engine import cli
from engine.core.errors import UserError
from engine.sweeps import space as spaces
from engine.sweeps import study as studies
from engine.sweeps import trials
from engine.sweeps.study import Sweep
from engine.sweeps.sweeper import Budget
from engine.sweeps.sweeper import Sweeper
from engine.sweeps.sweeper import where_it_stands
import flags as engine_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("study_dir", "", "The study's directory: its "
                    "description (sweep.json), SQLite database and trials' "
                    "model_dirs.")
flags.DEFINE_string("space", "", "The search space: a YAML file of engine "
                    "flags and their distributions (docs/sweeps.md). Not "
                    "needed to continue a study.")
flags.DEFINE_integer("trials", 0, "Trials in the study, counted over every "
                     "start of the sweep and every host sharing it. 0: "
                     "until --hours.", lower_bound=0)
flags.DEFINE_float("hours", 0.0, "Start no trial after this many hours of "
                   "this sweep's start (running ones finish). 0: none.",
                   lower_bound=0.0)
flags.DEFINE_string("storage", "", "Optuna's storage URL: a database that "
                    "sweeps on several hosts share, as postgresql://user:"
                    "password@host/db. Empty: SQLite in --study_dir.")
flags.DEFINE_string("study_name", "", "The study's name in --storage. "
                    "Empty: --study_dir's last component.")
flags.DEFINE_enum("sampler", "tpe", studies.SAMPLERS,
                  "Optuna's sampler: tpe (Tree-structured Parzen "
                  "Estimator), random, or grid (every combination of "
                  "choice and int parameters).",
                  case_sensitive=False)
flags.DEFINE_enum("pruner", "asha", studies.PRUNERS,
                  "Optuna's pruner, judging each trial after each epoch: "
                  "asha (successive halving at epochs 1, 3, 9, ...), "
                  "median, or none.",
                  case_sensitive=False)
flags.DEFINE_integer("sampler_seed", 0, "The sampler's seed.")
flags.DEFINE_integer("processes", 2, "Processes per trial.", lower_bound=1)
flags.DEFINE_integer("parallel", 1, "Trials at once on this machine "
                     "(--launcher=local); under SLURM, jobs in the queue "
                     "at once.", lower_bound=1)
flags.DEFINE_enum("launcher", "local", ["local", "slurm"],
                  "local: horovodrun --gloo on this machine; slurm: each "
                  "trial a job of scripts/slurm/train.sbatch.",
                  case_sensitive=False)
flags.DEFINE_bool("best", False, "Print the best trial's flagfile, ready "
                  "to run with --flagfile, and exit.")

# What the sweep sets for each trial: a space or base flag cannot.
SET_BY_THE_SWEEP = ("model_dir", "trial_study_dir", "trial_number")


def main(argv):
  try:
    if FLAGS.best:
      print(best_flagfile(FLAGS.study_dir), end="")
      return
    if not FLAGS.trials and not FLAGS.hours:
      raise UserError("--trials or --hours: give the sweep's budget")
    sweep = the_sweep(argv[1:])
    storage = studies.storage(sweep.storage)
    study = studies.open_study(sweep, storage, create=True)
    studies.write_sweep(FLAGS.study_dir, sweep)
    try:
      stopped_by = Sweeper(
          sweep=sweep, storage=storage, study=study,
          launcher=launcher(sweep), study_dir=FLAGS.study_dir,
          budget=Budget(trials=FLAGS.trials, hours=FLAGS.hours),
          parallel=FLAGS.parallel).run()
      if not stopped_by:
        print(where_it_stands(study, sweep, FLAGS.study_dir), flush=True)
    except sqlalchemy.exc.SQLAlchemyError as e:
      raise studies.database_error(sweep.storage, e) from None
    if stopped_by:
      print(f"engine.sweep: stopped by {signal.Signals(stopped_by).name}; "
            "the running trials saved; run the same command again to "
            "continue the study", file=sys.stderr, flush=True)
      sys.exit(128 + stopped_by)
  except UserError as e:
    cli.exit_with_error(str(e), e.exit_code, program="engine.sweep")


# --- The study: what it searches, checked before anything is written ------

def the_sweep(base_flags: list[str]) -> Sweep:
  """The sweep the flags describe, or the one --study_dir holds, if the
  flags give no other."""
  if not FLAGS.study_dir:
    raise UserError("--study_dir: give the study's directory")
  recorded = studies.read_sweep(FLAGS.study_dir)
  if recorded and not FLAGS.space and not base_flags:
    return recorded
  if not FLAGS.space:
    raise UserError("--space: give the search space's YAML file "
                    "(docs/sweeps.md)")
  space = spaces.read(FLAGS.space)
  spaces.check(space, _flag_type, _complaint, where=f"--space={FLAGS.space}")
  base_flags = _absolute_flagfiles(base_flags)
  metric = _deciding_metric(base_flags, space)
  sweep = Sweep(
      storage=FLAGS.storage or studies.default_storage(FLAGS.study_dir),
      study_name=FLAGS.study_name or os.path.basename(
          os.path.abspath(FLAGS.study_dir)),
      space=tuple(space), base_flags=tuple(base_flags), metric=metric,
      sampler=FLAGS.sampler, pruner=FLAGS.pruner, seed=FLAGS.sampler_seed,
      processes=FLAGS.processes)
  if FLAGS.sampler == "grid":
    spaces.grid(space, where="--sampler=grid")
  if recorded and recorded != sweep:
    differ = [name for name in Sweep.__dataclass_fields__
              if getattr(recorded, name) != getattr(sweep, name)]
    raise UserError(f"--study_dir={FLAGS.study_dir} holds another sweep "
                    f"(its {', '.join(differ)} differ); continue it with "
                    "--study_dir alone, or give a new directory")
  return sweep


def _engine_flag(name: str):
  """The engine's flag `name` (flags/), or None: not the sweep's own."""
  for module in engine_flags.MODULES:
    for flag in FLAGS.get_flags_for_module(module.__name__):
      if flag.name == name:
        return flag
  return None


def _flag_type(name: str) -> Optional[str]:
  if name in SET_BY_THE_SWEEP:
    raise UserError(f"--space={FLAGS.space}: {name}: the sweep sets it for "
                    "each trial")
  flag = _engine_flag(name)
  return flag.flag_type() if flag is not None else None


def _complaint(name: str, text: str) -> Optional[str]:
  try:
    _engine_flag(name).parser.parse(text)
  except (ValueError, TypeError) as e:
    return str(e)
  return None


def _absolute_flagfiles(base_flags: list[str]) -> list[str]:
  """--flagfile=PATH made absolute: a continued sweep, or a SLURM job, may
  start elsewhere."""
  return [f"--flagfile={os.path.abspath(arg.partition('=')[2])}"
          if arg.startswith("--flagfile=") else arg for arg in base_flags]


def _deciding_metric(base_flags: list[str],
                     space: list[spaces.Parameter]) -> str:
  """The base flags checked as the engine checks them, and the figure
  they decide by: --best_metric, or the task's.

  A base flag no builder takes is refused here, as the trials would refuse
  it; unless the space varies the model, data set or task, whose trials
  each take the flags of their own (each checks them at its start).
  """
  from engine import tasks  # pylint: disable=g-import-not-at-top
  from flags import reached  # pylint: disable=g-import-not-at-top
  for arg in base_flags:
    name = arg.lstrip("-").partition("=")[0]
    if name in SET_BY_THE_SWEEP:
      raise UserError(f"--{name} after --: the sweep sets it for each "
                      "trial")
  try:
    FLAGS([sys.argv[0], *base_flags])
  except flags.Error as e:
    raise UserError(f"the engine's flags after --: {e}") from None
  config = engine_flags.config_from_flags()
  if not {"model", "dataset", "task"} & {p.flag for p in space}:
    reached.refuse_unreached_flags(config)
  task = tasks.task_class(config.task.name)
  best_metric = config.task.best_metric
  return str(tasks.Decider.of(best_metric or task.best_metric, task,
                              flag="best_metric" if best_metric else ""))


def launcher(sweep: Sweep):
  """Where the trials run, each on the sweep's processes."""
  if FLAGS.launcher == "slurm":
    from engine.sweeps import slurm  # pylint: disable=g-import-not-at-top
    return slurm.Slurm(sweep.processes)
  return trials.Local(sweep.processes)


def best_flagfile(study_dir: str) -> str:
  """The best complete trial's flags, as a flagfile."""
  if not study_dir:
    raise UserError("--best: give the study's --study_dir")
  sweep = studies.read_sweep(study_dir)
  if sweep is None:
    raise UserError(f"--study_dir={study_dir}: no sweep there "
                    f"({studies.SWEEP_FILE} is missing)")
  best = studies.best_trial(studies.open_study(sweep))
  if best is None:
    raise UserError(f"--study_dir={study_dir}: no trial has completed yet")
  return "\n".join([
      f"# Trial {best.number} of the sweep in {study_dir}: {sweep.figure} "
      f"{best.value:.4f}, the best of its study.",
      *sweep.base_flags, *spaces.as_flags(best.params)]) + "\n"


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: cli.parse_flags(
      argv, program="engine.sweep"))
