r"""What a sweep's trial pays each epoch to report to its study.

  .venv/bin/python -m bench.sweep_report_cost --study_dir=runs/sweeps/asha \
      [--pruners=asha,none] [--repeats=20]

A trial's rank 0 calls `engine.loop.trial.TrialReports.pruned_after` after
each evaluated epoch: Optuna's `report` (a write to the study's storage)
and `should_prune` (the pruner reads the study's trials), while the other
ranks wait for its answer. Here, in one process: the study of
--study_dir (its sweep.json and SQLite study.db, with the history its
trials left) copied afresh for each repeat into a temporary directory,
with the pruner of each of --pruners; a new trial asked of it, as the
sweep asks one; then `open` (sweep.json, the storage, the trial: once per
run, before its first step, as engine/loop/loop.py calls it) and the
calls for epochs 1 to --epochs, each timed. Optuna is imported before the
timing; a run imports it in `open` (about 0.3 s after TensorFlow). The figures reported are a trial's of
the copied study (the median trial's curve), so ASHA judges them as it
would a real trial's; every epoch is reported whether or not it prunes.
"""
import dataclasses
import os
import shutil
import statistics
import tempfile
import time

from absl import app
from absl import flags

from engine.core.config import TrialConfig
from engine.loop import trial as trial_lib
from engine.sweeps import study as studies

FLAGS = flags.FLAGS
flags.DEFINE_string("study_dir", "", "A finished sweep's study directory, "
                    "whose history the copies hold.")
flags.DEFINE_list("pruners", ["asha", "none"], "Pruners to time.")
flags.DEFINE_integer("repeats", 20, "Fresh copies per pruner.")
flags.DEFINE_integer("epochs", 4, "Epochs each timed trial reports.")


def median_curve(sweep) -> list[float]:
  """The intermediate figures of the study's median complete trial."""
  import optuna  # pylint: disable=g-import-not-at-top
  done = [t for t in studies.open_study(sweep).get_trials(
      deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
          if t.intermediate_values]
  done.sort(key=lambda t: t.value)
  curve = done[len(done) // 2].intermediate_values
  return [curve[e] for e in sorted(curve)]


def copy_study(source_dir: str, pruner: str, where: str):
  """The study of `source_dir` in `where`, with `pruner`: its sweep.json
  rewritten to the copy's database."""
  sweep = studies.read_sweep(source_dir)
  shutil.copy(os.path.join(source_dir, studies.SQLITE_FILE), where)
  sweep = dataclasses.replace(sweep, storage=studies.default_storage(where),
                              pruner=pruner)
  studies.write_sweep(where, sweep)
  return sweep


def one_trial(sweep, where: str, curve: list[float]) -> list[float]:
  """A new trial's seconds to open the study, then in pruned_after for
  each epoch."""
  study = studies.open_study(sweep, create=True)
  number = study.ask().number
  del study
  reports = trial_lib.TrialReports(TrialConfig(study_dir=where,
                                               number=number), sweep.metric)
  began = time.perf_counter()
  reports.open()
  seconds = [time.perf_counter() - began]
  for epoch in range(1, FLAGS.epochs + 1):
    value = curve[min(epoch, len(curve)) - 1]
    began = time.perf_counter()
    reports.pruned_after(epoch, value)
    seconds.append(time.perf_counter() - began)
  return seconds


def main(argv):
  del argv
  source = FLAGS.study_dir
  sweep = studies.read_sweep(source)
  curve = median_curve(sweep)
  history = len(studies.open_study(sweep).get_trials(deepcopy=False))
  print(f"history: {history} trials in {source}; reported curve "
        + ", ".join(f"{v:.4f}" for v in curve))
  times = {}
  for repeat in range(FLAGS.repeats):
    for pruner in (FLAGS.pruners if repeat % 2 == 0
                   else FLAGS.pruners[::-1]):
      with tempfile.TemporaryDirectory() as where:
        copied = copy_study(source, pruner, where)
        seconds = one_trial(copied, where, curve)
      times.setdefault(pruner, []).append(seconds)
  for pruner, runs in times.items():
    opens = [s[0] * 1000 for s in runs]
    epochs = [x * 1000 for s in runs for x in s[1:]]
    print(f"{pruner}: open (once, at the run's start) median "
          f"{statistics.median(opens):.1f} ms, range {min(opens):.1f}-"
          f"{max(opens):.1f}; report + should_prune, epochs 1-"
          f"{FLAGS.epochs}: median {statistics.median(epochs):.1f} ms, "
          f"mean {statistics.mean(epochs):.1f} ms, "
          f"range {min(epochs):.1f}-{max(epochs):.1f} ({len(runs)} trials)")


if __name__ == "__main__":
  app.run(main)
