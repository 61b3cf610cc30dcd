r"""What two sweeps of the same space spent and found: ASHA against none.

  .venv/bin/python -m bench.sweep_compute runs/sweeps/asha runs/sweeps/none

Reads each study directory as engine.sweep leaves it (sweep.json, study.db,
trials/NNNN/{trial.json,metrics.jsonl}) and prints, for each: trials
complete, pruned and failed; trial-epochs (the epochs each trial ran,
summed); seconds of training (each trial's last epoch record's
cumulative_seconds, summed); the trials' wall seconds in the study
(Optuna's start to end, summed: training plus each trial's start-up,
evaluation and export); the best figure and its trial. Then, trial by
trial, the values each drew and the figure after each epoch in either
sweep, so a configuration one sweep pruned can be read against what it
reached in the other. With --sampler=random and the same --sampler_seed,
trial k draws the same values in both (the draws do not depend on the
results); the table says whether they did.
"""
import json
import os
import sys

from engine.core import run_files
from engine.sweeps import study as studies


def epoch_records(model_dir: str) -> list[dict]:
  """The trial's epoch records, a resumed epoch's latest kept (as
  engine/sweeps/trials.py reads them)."""
  return run_files.epochs_and_events(model_dir)[0]


def read_study(study_dir: str) -> dict:
  """The sweep's trials, by number: state, values, figures per epoch,
  training seconds and wall seconds."""
  sweep = studies.read_sweep(study_dir)
  if sweep is None:
    sys.exit(f"{study_dir}: no sweep.json; is it a study directory?")
  frozen = {t.number: t for t in
            studies.open_study(sweep).get_trials(deepcopy=False)}
  trials = {}
  for number, trial in sorted(frozen.items()):
    model_dir = studies.trial_dir(study_dir, number)
    records = epoch_records(model_dir)
    wall = None
    if trial.datetime_start and trial.datetime_complete:
      wall = (trial.datetime_complete - trial.datetime_start).total_seconds()
    trials[number] = dict(
        state=trial.state.name.lower(), params=trial.params,
        value=trial.value,
        figures=[r.get(sweep.figure) for r in records],
        epochs=records[-1]["epoch"] if records else 0,
        seconds=records[-1]["cumulative_seconds"] if records else 0.0,
        wall=wall)
  return dict(sweep=sweep, trials=trials)


def summary(name: str, found: dict) -> dict:
  trials = found["trials"].values()
  count = {state: sum(t["state"] == state for t in trials)
           for state in ("complete", "pruned", "fail")}
  complete = [(t["value"], n) for n, t in found["trials"].items()
              if t["state"] == "complete" and t["value"] is not None]
  best_value, best_number = max(complete) if complete else (None, None)
  return dict(
      name=name, **count,
      trial_epochs=sum(t["epochs"] for t in trials),
      train_seconds=sum(t["seconds"] for t in trials),
      trial_wall_seconds=sum(t["wall"] or 0.0 for t in trials),
      best_value=best_value, best_trial=best_number)


def main(argv: list[str]) -> None:
  if len(argv) != 3:
    sys.exit(__doc__)
  dirs = argv[1:]
  found = [read_study(d) for d in dirs]
  names = [os.path.basename(os.path.abspath(d)) for d in dirs]
  rows = [summary(n, f) for n, f in zip(names, found)]
  print("| sweep | complete | pruned | failed | trial-epochs | training s "
        "| trials' wall s | best (trial) |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    best = (f"{r['best_value']:.4f} ({r['best_trial']})"
            if r["best_value"] is not None else "none")
    print(f"| {r['name']} | {r['complete']} | {r['pruned']} | {r['fail']} "
          f"| {r['trial_epochs']} | {r['train_seconds']:.0f} "
          f"| {r['trial_wall_seconds']:.0f} | {best} |")
  print()
  print(f"| trial | base_lr | weight_decay | label_smoothing | warmup "
        f"| {names[0]}: state, figure per epoch | {names[1]}: state, figure "
        "per epoch | same values |")
  print("|---|---|---|---|---|---|---|---|")
  a, b = (f["trials"] for f in found)
  for number in sorted(set(a) | set(b)):
    ta, tb = a.get(number), b.get(number)
    p = (ta or tb)["params"]

    def cell(t):
      if t is None:
        return "-"
      return f"{t['state']}: " + ", ".join(
          f"{v:.4f}" if v is not None else "-" for v in t["figures"])

    same = ta is not None and tb is not None and ta["params"] == tb["params"]
    print(f"| {number} | {p.get('base_lr', 0):.4f} "
          f"| {p.get('weight_decay', 0):.2e} "
          f"| {p.get('label_smoothing', 0):.3f} | {p.get('warmup_epochs')} "
          f"| {cell(ta)} | {cell(tb)} | {'yes' if same else 'no'} |")
  print()
  print(json.dumps(rows))


if __name__ == "__main__":
  main(sys.argv)
