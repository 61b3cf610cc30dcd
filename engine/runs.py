r"""A table of training runs, to compare them and see how each one ended.

  .venv/bin/python -m engine.runs DIR [DIR...] [--plot=FILE.png] [--scaling]
  .venv/bin/python -m engine.runs DIR --scaling --link_gbit=10 \
      --link_latency_us=20

One line per run under the DIRs (a run is a directory, at any depth, holding
a metrics.jsonl or, before its first epoch, a flags.txt; a DIR may be a run
itself): the flags that differ between the runs (or that a resume
changed: its values over the starts, 0.1→0.05), epochs done of those
planned, best and final validation accuracy (or the figure a task decides
by), seconds to --target,
median images/s, processes, what bounded its step in its profiled window
(--profile_steps' step report: input, compute, communication or host),
and the run's state (finished, stopped by a signal, diverged, an error,
running, or ended without a word: killed).
A sweep's study directory (engine.sweep) lists its trials so: the values
drawn are the flags that differ, and the state is the study's (complete,
pruned, or failed with its reason) from each trial's trial.json.
--scaling orders them by processes and adds each one's speedup and
efficiency against the run with the fewest (scripts/slurm/scaling.sh);
with a link between nodes (--link_gbit, --link_latency_us) it also
predicts each run's efficiency on 8 to 512 nodes (engine/records/scaling.py).
Runs whose checkpoints are of another format than this engine's, which it
neither resumes nor evaluates, are listed like the others, with a column
of each run's checkpoint format.

It reads only metrics.jsonl, flags.txt, flags.latest.txt, trial.json,
profile/step_report.json and the checkpoints' format.json, never
checkpoints or TensorBoard files, and does not import TensorFlow: it
starts in a fraction of a second, and works on a copy of a model_dir or
while the run trains. --plot draws validation accuracy against training
time.

Its figures are engine.core.run_files.summary's, which engine.records.report
logs to TensorBoard's HParams dashboard too.
"""
import dataclasses
import os
import sys
import time
from typing import Optional

from absl import app
from absl import flags

from engine.records import runs_plot
from engine.records import scaling
from engine.core import run_files
from engine.core.errors import UserError

FLAGS = flags.FLAGS

# A run that has not recorded its end is taken as still running while its
# last record is younger than this many of its longest epochs, plus
# RUNNING_GRACE_SECONDS for a resume's start-up or a slow evaluation.
RUNNING_EPOCHS = 3
RUNNING_GRACE_SECONDS = 120
# An error's reason is cut to about this many characters in the table.
REASON_CHARS = 50
# The table's columns that hold numbers, aligned right.
NUMERIC_COLUMNS = {"epochs", "best", "final", "s to target", "img/s",
                   "procs", "speedup", "efficiency", "ckpt format"}


@dataclasses.dataclass
class Run:
  """One run, as its metrics.jsonl and flags files describe it."""
  path: str
  flags: dict[str, str]  # flags.txt's values, flags.latest.txt's over them
  records: list[dict]    # epoch records in epoch order (see read_run)
  events: list[dict]     # event records (rollbacks, an end), as written
  state: str             # "finished", "running", "stopped by SIGTERM", ...
  # Of its checkpoints (run_files.checkpoint_format); None: it has none.
  checkpoint_format: Optional[int] = None
  # What bounded its profiled window's step (its step report's verdict);
  # None: no window reported.
  bound: Optional[str] = None

  def planned_epochs(self) -> Optional[int]:
    """The last record's `epochs` (a resume may change them); before the
    first, --epochs; None for a trial that failed before writing its
    flags."""
    if self.records:
      return self.records[-1]["epochs"]
    return int(self.flags["epochs"]) if "epochs" in self.flags else None

  def flag_values(self, name: str) -> list[Optional[str]]:
    """The values flag `name` took over the run's starts, in order: the
    one in force (flags.latest.txt's, or flags.txt's) if no resume changed
    it, else the first start's and each resume's change (in its first
    epoch's record in metrics.jsonl)."""
    changes = [changed["flags"][name] for changed in (
        record.get(run_files.FLAGS_CHANGED) for record in self.records)
               if isinstance(changed, dict)
               and isinstance(changed.get("flags"), dict)
               and name in changed["flags"]]
    if not changes:
      return [self.flags.get(name)]
    return [changes[0][0], *(now for _, now in changes)]

  def target_set(self) -> bool:
    """Whether it ran with a --target or --target_accuracy (0, the
    default, is none)."""
    try:
      return any(float(self.flags.get(name, "0")) > 0
                 for name in ("target", "target_accuracy"))
    except ValueError:
      return False


def read_run(path: str, now: Optional[float] = None) -> Run:
  """The run in directory `path`, its state judged at unix time `now`
  (by default, the present).

  Its records are run_files.epochs_and_events's.
  """
  flags_path = os.path.join(path, run_files.FLAGS_FILE)
  trial = run_files.read_record(path, run_files.TRIAL_FILE, dict,
                                keeps="what engine.sweep knows of the trial")
  if not (os.path.exists(os.path.join(path, run_files.METRICS_FILE))
          or os.path.exists(flags_path) or trial):
    raise UserError(f"{path}: not a run: it holds no "
                    f"{run_files.METRICS_FILE} or {run_files.FLAGS_FILE}; "
                    "pass a model_dir written by engine.train")
  run_flags = run_files.read_flags(flags_path)
  run_flags.update(run_files.read_flags(
      os.path.join(path, run_files.LATEST_FLAGS_FILE)))
  if trial:  # its values, if the run failed before writing its flags
    run_flags = {**{name: str(value) for name, value in
                    trial.get("params", {}).items()}, **run_flags}
  records, events, end = run_files.epochs_and_events(path)
  state = _state(records, events, end, time.time() if now is None else now)
  if trial and trial.get("state") in ("complete", "pruned", "failed"):
    # A sweep's trial: as its study has it (a failure with its reason).
    state = trial["state"] + (f": {_shortened(str(trial['reason']))}"
                              if trial["state"] == "failed" else "")
  bound = run_files.read_record(
      run_files.profile_dir(path, rank=0), run_files.STEP_REPORT_FILE,
      lambda found: str(found["verdict"]["bound"]),
      keeps="the step report of the run's profiled window")
  return Run(path=path, flags=run_flags, records=records, events=events,
             state=state, checkpoint_format=run_files.checkpoint_format(
                 os.path.join(path, run_files.CHECKPOINT_DIR)),
             bound=bound)


def find_runs(directories: list[str]) -> dict[str, str]:
  """The runs under `directories`: {label: path}, sorted by label.

  A run's label is its path relative to the DIR it was found in; if that
  DIR is a run itself, or several DIRs are given, relative to the DIR's
  parent, so the label starts with the DIR's name and tells apart runs of
  the same name in different DIRs.
  """
  runs, seen = {}, set()
  for directory in directories:
    if not os.path.isdir(directory):
      what = ("not a directory" if os.path.exists(directory) else
              "no such directory")
      raise UserError(f"{directory}: {what}; pass model_dirs or directories "
                      "holding them")
    found = []
    for root, subdirectories, files in os.walk(directory):
      subdirectories.sort()
      if {run_files.METRICS_FILE, run_files.FLAGS_FILE,
          run_files.TRIAL_FILE} & set(files):
        found.append(root)
    if not found:
      raise UserError(f"{directory}: holds no run (no directory in it has a "
                      f"{run_files.METRICS_FILE} or {run_files.FLAGS_FILE}); "
                      "pass model_dirs written by engine.train or "
                      "directories holding them")
    base = os.path.abspath(directory)
    if len(directories) > 1 or found[0] == directory:
      base = os.path.dirname(base)
    for path in found:
      if os.path.realpath(path) in seen:  # under two of the DIRs given
        continue
      seen.add(os.path.realpath(path))
      label = os.path.relpath(os.path.abspath(path), base)
      # DIRs of the same name (a/runs b/runs): the path as given.
      runs[os.path.normpath(path) if label in runs else label] = path
  return dict(sorted(runs.items()))


def table(runs: dict[str, Run], *, scaling: bool = False) -> str:
  """The runs as aligned text columns under a header line, one row per run
  in the order given (`scaling`: by processes).

  Of the flags, only those whose values differ between the runs get a
  column (headed --name): they are what the comparison is about; so do
  those a resume of a run changed (docs/checkpoints-and-faults.md), whose
  cell gives its values over the starts, the first start's first
  (0.1→0.05). A flag a run has no value of (a trial that failed before
  writing its flags) shows as "-", an empty value as ''. Best and final
  are of the figure that decided each run's best epoch: validation
  accuracy, or (in a column of its own when some run has another) the
  task's (val_mae). Each run's checkpoint format gets a column when some
  run's is not this engine's.

  `scaling` adds a scaling study's figures against the run with the
  fewest processes: speedup (its img/s over that run's) and efficiency
  (the speedup over the ratio of processes; 100% is linear scaling).
  """
  summaries = {label: run_files.summary(run.records)
               for label, run in runs.items()}
  if scaling:
    runs = dict(sorted(runs.items(), key=lambda item: (
        summaries[item[0]]["world_size"] or 0, item[0])))
  columns = _Columns.of(runs, summaries, scaling)
  speedups = _speedups(summaries) if scaling else {}
  return _aligned(columns.header(), [
      columns.row(label, run, summaries[label], speedups.get(label))
      for label, run in runs.items()])


@dataclasses.dataclass(frozen=True)
class _Columns:
  """Which of the table's optional columns the runs get: a column no run
  has a value for is left out."""
  flag_names: list[str]  # the flags whose values differ
  metric: bool           # some run is decided by a figure other than accuracy
  target: bool           # some run has a --target
  scaling: bool
  checkpoint_format: bool  # some run's checkpoints are not this engine's
  bound: bool  # some run has a step report

  @classmethod
  def of(cls, runs: dict[str, Run], summaries: dict[str, dict],
         scaling: bool) -> "_Columns":
    return cls(
        flag_names=_differing_flags(list(runs.values())),
        metric=any(figures["metric"] != "val_accuracy"
                   for figures in summaries.values()),
        target=any(run.target_set() or any(
            "target_accuracy_first_seconds" in r for r in run.records)
                   for run in runs.values()),
        scaling=scaling,
        checkpoint_format=any(run.checkpoint_format not in (
            None, run_files.CHECKPOINT_FORMAT) for run in runs.values()),
        bound=any(run.bound for run in runs.values()))

  def header(self) -> list[str]:
    return ["run", *(f"--{name}" for name in self.flag_names), "epochs",
            *(["metric"] if self.metric else []), "best", "final",
            *(["s to target"] if self.target else []), "img/s", "procs",
            *(["speedup", "efficiency"] if self.scaling else []),
            *(["ckpt format"] if self.checkpoint_format else []),
            *(["bound"] if self.bound else []), "state"]

  def row(self, label: str, run: Run, figures: dict,
          speedup: Optional[tuple[float, float]]) -> list[str]:
    """The run's cells, in header()'s order."""
    metric, planned = figures["metric"], run.planned_epochs()
    row = [label, *("→".join(map(_shown_flag, run.flag_values(name)))
                    for name in self.flag_names),
           f"{figures['epochs']}/{'?' if planned is None else planned}"]
    row += [metric] if self.metric else []
    row += [_number(figures[f"best_{metric}"], ".4f"),
            _number(figures[f"final_{metric}"], ".4f")]
    if self.target:
      row.append(_number(figures["seconds_to_target"], ".1f"))
    row += [_number(figures["images_per_sec"], ".0f"),
            _number(figures["world_size"])]
    if self.scaling:
      times, efficiency = speedup or (None, None)
      row += [_number(times, ".2f") + ("x" if times else ""),
              _number(efficiency, ".0%")]
    row += [_number(run.checkpoint_format)] if self.checkpoint_format else []
    row += [run.bound or "-"] if self.bound else []
    return row + [run.state]


def _aligned(header: list[str], rows: list[list[str]]) -> str:
  """The header and rows as text columns: numbers right, the rest left."""
  widths = [max(len(row[i]) for row in [header, *rows])
            for i in range(len(header))]
  return "\n".join(
      "  ".join(cell.rjust(width) if name in NUMERIC_COLUMNS
                else cell.ljust(width)
                for name, cell, width in zip(header, row, widths)).rstrip()
      for row in [header, *rows])


def _speedups(summaries: dict[str, dict]) -> dict[str, tuple[float, float]]:
  """Each run's speedup and efficiency against the run with the fewest
  processes (of those with a speed), by label; none without such a run."""
  measured = {label: figures for label, figures in summaries.items()
              if figures["images_per_sec"] and figures["world_size"]}
  if not measured:
    return {}
  base = min(measured.values(), key=lambda figures: figures["world_size"])
  speedups = {}
  for label, figures in measured.items():
    speedup = figures["images_per_sec"] / base["images_per_sec"]
    speedups[label] = (speedup, speedup * base["world_size"]
                       / figures["world_size"])
  return speedups


# Reading a run's files.


def _state(records: list[dict], events: list[dict], end: Optional[dict],
           now: float) -> str:
  """Finished, ended otherwise (`end`: the end record, if it is the run's
  last word), or not ended: running if its last record is recent, else
  probably killed, since a run stopped any other way records its end."""
  if end is not None:
    state = end.get("state")
    if state == "stopped":
      return f"stopped by {end['signal']}" if end.get("signal") else "stopped"
    if state == "error":
      return f"error: {_shortened(str(end.get('reason', '')))}"
    return str(state or "ended")
  if not records:
    return "starting"
  last = records[-1]
  if last.get("stopped_early") is True or last["epoch"] >= last["epochs"]:
    return "finished"
  # Every epoch's record has its time; a rollback's event has none.
  written = max(r["time"] for r in records + events if "time" in r)
  longest_epoch = max(r["epoch_seconds"] for r in records)
  if written > now - (RUNNING_EPOCHS * longest_epoch +
                      RUNNING_GRACE_SECONDS):
    return "running"
  return "no end recorded (killed?)"


# The table's cells.


def _differing_flags(runs: list[Run]) -> list[str]:
  """The flags whose values differ between `runs`, or that a resume of
  one changed, in the order the flags files list them."""
  names = {}  # a dict for its order
  for run in runs:
    names.update(dict.fromkeys(run.flags))
  return [name for name in names if name not in run_files.PLACE_FLAGS and (
      len({run.flags.get(name) for run in runs}) > 1
      or any(len(run.flag_values(name)) > 1 for run in runs))]


def _shown_flag(value: Optional[str]) -> str:
  if value is None:
    return "-"
  return value if value else "''"


def _number(value, format_spec: str = "") -> str:
  return "-" if value is None else format(value, format_spec)


def _shortened(reason: str) -> str:
  """One line of at most about REASON_CHARS characters."""
  line = " ".join("".join(c if c.isprintable() else " "
                          for c in reason).split())
  if len(line) <= REASON_CHARS:
    return line
  return line[:REASON_CHARS - 3].rstrip() + "..."


# The command line.


def _link() -> Optional[scaling.Link]:
  """The link --link_gbit and --link_latency_us give, for --scaling's
  predictions; None without them."""
  given = (FLAGS.link_gbit, FLAGS.link_latency_us)
  if given == (None, None):
    return None
  if None in given or not FLAGS.scaling:
    raise UserError("--link_gbit and --link_latency_us go together, with "
                    "--scaling: the link between nodes that the scaling "
                    "model predicts over (e.g. --scaling --link_gbit=10 "
                    "--link_latency_us=20)")
  return scaling.Link.of(FLAGS.link_gbit, FLAGS.link_latency_us)


def main(argv):
  directories = argv[1:]
  try:
    if not directories:
      raise UserError("no DIR given; usage: python -m engine.runs DIR "
                      "[DIR...] [--plot=FILE.png]")
    if FLAGS.plot and not FLAGS.plot.lower().endswith(".png"):
      raise UserError(f"--plot={FLAGS.plot}: the plot is a PNG file; give "
                      "a path ending in .png")
    link = _link()
    runs = {label: read_run(path)
            for label, path in find_runs(directories).items()}
    print(table(runs, scaling=FLAGS.scaling))
    if link:
      print(f"\nPredicted on more nodes, one process each, over "
            f"{FLAGS.link_gbit:g} Gbit/s and {FLAGS.link_latency_us:g} us "
            "(weak scaling, ring allreduce; engine/records/scaling.py):")
      for label, run in runs.items():
        print(scaling.described(label, scaling.measured(run.records), link))
    if FLAGS.plot:
      runs_plot.plot(runs, FLAGS.plot)
      print(f"wrote {FLAGS.plot}")
  except UserError as e:
    print(f"engine.runs: error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)


if __name__ == "__main__":
  # Defined here, not at import: a script or bench that imports this module
  # for its table takes no flags of it.
  flags.DEFINE_string("plot", None, "A PNG file to draw the runs' validation "
                      "accuracy against training time into.")
  flags.DEFINE_bool("scaling", False, "A scaling study: the runs in order "
                    "of processes, with each one's speedup and efficiency "
                    "against the run with the fewest "
                    "(scripts/slurm/scaling.sh).")
  flags.DEFINE_float("link_gbit", None, "With --scaling: the bandwidth in "
                     "Gbit/s of the link between nodes, to predict each "
                     "run's efficiency on 8 to 512 nodes over it "
                     "(engine/records/scaling.py).")
  flags.DEFINE_float("link_latency_us", None, "With --link_gbit: the "
                     "link's latency in microseconds.")
  app.run(main)
