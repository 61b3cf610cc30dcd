"""engine.sweep: the search space, how a trial ended, bad input in one
line, and a real study of 2-process trials that prunes, records a failing
trial, resumes after the sweep is killed and picks the best."""
import functools
import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from engine import runs
from engine.core.errors import UserError
from engine.sweeps import space as spaces
from engine.sweeps import study as studies
from engine.sweeps import trials
from engine.sweeps.sweeper import Budget
from engine.sweeps.sweeper import Sweeper
from tests import fixtures
from tests import timeouts


def sweep_command(*args):
  return [fixtures.PYTHON, "-m", "engine.sweep", *args]


def run(command, timeout=60):
  return subprocess.run(command, cwd=fixtures.REPO, env=fixtures.engine_env(),
                        text=True, capture_output=True,
                        timeout=timeouts.bound(timeout))


def one_line_error(result, program="engine.sweep"):
  """The one line a refused command printed (and nothing else)."""
  assert result.returncode == 2, result.stderr[-2000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"{program}: error: "), \
      result.stderr[-2000:]
  return lines[0]


# --- The space ---------------------------------------------------------------

def test_a_space_parses_each_distribution_and_refuses_malformed_ones():
  space = spaces.parse({"base_lr": {"log_uniform": [0.01, 0.5]},
                        "--label_smoothing": {"uniform": [0, 0.2]},
                        "warmup_epochs": {"int": [0, 3]},
                        "optimizer": {"choice": ["sgd", "adam"]}}, "here")
  assert [(p.flag, p.kind, p.values) for p in space] == [
      ("base_lr", "log_uniform", (0.01, 0.5)),
      ("label_smoothing", "uniform", (0, 0.2)),
      ("warmup_epochs", "int", (0, 3)),
      ("optimizer", "choice", ("sgd", "adam"))]
  assert spaces.as_flags({"base_lr": 0.1, "nesterov": True}) == [
      "--base_lr=0.1", "--nesterov=true"]
  assert spaces.grid(space[2:], "here") == {"warmup_epochs": [0, 1, 2, 3],
                                            "optimizer": ["sgd", "adam"]}
  with pytest.raises(UserError, match="--sampler=grid needs choice or int"):
    spaces.grid(space, "here")
  for document, complaint in (
      ([1, 2], "give a mapping of flags"),
      ({}, "give a mapping of flags"),
      ({"base_lr": 0.1}, "give one distribution"),
      ({"base_lr": {"normal": [0, 1]}}, "'normal' is no distribution"),
      ({"base_lr": {"uniform": 0.1}}, "uniform takes a list"),
      ({"base_lr": {"uniform": [0.1]}}, "two numbers"),
      ({"base_lr": {"uniform": [0.5, 0.1]}}, "low 0.5 must be below"),
      ({"base_lr": {"log_uniform": [0, 0.1]}}, "log_uniform needs low > 0"),
      ({"epochs": {"int": [1, 2.5]}}, "int takes two integers"),
      ({"base_lr": {"uniform": [True, 2]}}, "two numbers")):
    with pytest.raises(UserError, match=complaint):
      spaces.parse(document, "here")


def test_a_space_is_checked_against_the_flags_types_and_values():
  types = {"base_lr": "float", "epochs": "int", "optimizer": "string enum"}

  def parses(name, text):
    return None if name != "optimizer" or text in ("sgd", "adam") else \
        "not one of sgd, adam"

  def check(document):
    spaces.check(spaces.parse(document, "s"), types.get, parses, "s")

  check({"base_lr": {"int": [1, 2]}, "epochs": {"choice": [1, 2]},
         "optimizer": {"choice": ["sgd"]}})
  with pytest.raises(UserError, match="nosuch: the engine has no flag"):
    check({"nosuch": {"uniform": [0, 1]}})
  with pytest.raises(UserError, match="epochs: the flag is of type int, "
                     "which uniform does not fit; use int or choice"):
    check({"epochs": {"uniform": [1, 2]}})
  with pytest.raises(UserError, match="optimizer: the flag is of type string enum, "
                     "which log_uniform does not fit; use choice"):
    check({"optimizer": {"log_uniform": [1, 2]}})
  with pytest.raises(UserError, match="optimizer: 'rmsprop': not one of"):
    check({"optimizer": {"choice": ["sgd", "rmsprop"]}})


def test_a_sweep_round_trips_through_its_file_and_hides_passwords(tmp_path):
  sweep = studies.Sweep(
      storage="postgresql://me:secret@db:5432/optuna", study_name="s",
      space=tuple(spaces.parse({"base_lr": {"uniform": [0.1, 0.2]}}, "s")),
      base_flags=("--epochs=2",), metric="val_mae:min", sampler="tpe",
      pruner="asha", seed=0, processes=2)
  studies.write_sweep(str(tmp_path), sweep)
  assert studies.read_sweep(str(tmp_path)) == sweep
  assert sweep.minimize and sweep.figure == "val_mae"
  assert studies.shown(sweep.storage) == "postgresql://me:***@db:5432/optuna"
  assert studies.shown("sqlite:////a/b.db") == "sqlite:////a/b.db"
  (tmp_path / studies.SWEEP_FILE).write_text("{")
  with pytest.raises(UserError, match="unreadable"):
    studies.read_sweep(str(tmp_path))
  assert studies.read_sweep(str(tmp_path / "none")) is None


# --- How a trial ended -------------------------------------------------------

def write_run(model_dir, records, log=""):
  os.makedirs(model_dir, exist_ok=True)
  with open(os.path.join(model_dir, "metrics.jsonl"), "w") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  with open(os.path.join(model_dir, "trial.log"), "w") as f:
    f.write(log)
  return str(model_dir)


def epoch(n, accuracy, epochs=3):
  return {"epoch": n, "epochs": epochs, "val_accuracy": accuracy}


def test_how_a_trial_ended_comes_from_its_records_and_exit_code(tmp_path):
  def ending(records, exit_code, log=""):
    model_dir = write_run(tmp_path / str(len(os.listdir(tmp_path))),
                          records, log)
    return trials.ending(model_dir, "val_accuracy", False, exit_code)

  done = [epoch(1, 0.5), epoch(2, 0.7), epoch(3, 0.6)]
  # Complete: the best epoch's figure; the lower figure, with minimize.
  assert ending(done, 0) == trials.Ending("complete", 0.7, 3)
  assert trials.ending(str(tmp_path / "0"), "val_accuracy", True, 0).value \
      == 0.5
  # A record redone after a resume replaces the one it redid.
  assert ending([epoch(1, 0.5), epoch(2, 0.9), epoch(2, 0.6)], 0) == \
      trials.Ending("complete", 0.6, 2)
  pruned = {"event": "end", "state": "pruned", "reason": "pruned after 1"}
  assert ending([epoch(1, 0.2), pruned], 0) == trials.Ending(
      "pruned", 0.2, 1, "pruned after 1")
  stopped = {"event": "end", "state": "stopped", "signal": "SIGTERM",
             "reason": "stopped by SIGTERM"}
  assert ending([epoch(1, 0.2), stopped], 143).state == "running"
  error = {"event": "end", "state": "diverged", "reason": "training diverged"}
  assert ending([epoch(1, 0.2), error], 3) == trials.Ending(
      "failed", 0.2, 1, "training diverged")
  # Refused at start-up: the engine's line from the log, horovodrun's
  # prefix and all.
  assert ending([], 2, log="noise\n[1]<stderr>:engine.train: error: --target "
                "and --target_accuracy: give one\n[0]<stderr>:more\n") == \
      trials.Ending("failed", None, 0, "--target and --target_accuracy: "
                    "give one")
  assert ending([], 1, log="").reason == "exited with 1"
  assert "no val_accuracy was recorded" in ending(
      [{"epoch": 1, "epochs": 1}], 0).reason
  # An earlier sweep's run, exit code unknown: finished, or to resume.
  assert ending(done, None).state == "complete"
  assert ending(done[:2], None).state == "running"
  assert ending([epoch(1, 0.3), dict(epoch(2, 0.9), stopped_early=True)],
                None) == trials.Ending("complete", 0.9, 2)
  assert ending([epoch(1, 0.2), pruned], None).state == "pruned"


def test_the_runs_table_shows_a_trial_as_its_study_has_it(tmp_path):
  failed = tmp_path / "trials" / "0001"
  failed.mkdir(parents=True)
  trials.write(str(failed), {"number": 1, "params": {"base_lr": 0.5},
                             "state": "failed", "reason": "--target and "
                             "--target_accuracy: give one"})
  complete = write_run(tmp_path / "trials" / "0000",
                       [epoch(1, 0.5), epoch(2, 0.7), epoch(3, 0.6)])
  trials.write(complete, {"number": 0, "params": {"base_lr": 0.1},
                          "state": "complete", "value": 0.7})
  found = runs.find_runs([str(tmp_path)])
  assert list(found) == ["trials/0000", "trials/0001"]
  read = {label: runs.read_run(path) for label, path in found.items()}
  assert read["trials/0000"].state == "complete"
  assert read["trials/0001"].state.startswith("failed: --target and")
  assert read["trials/0001"].flags == {"base_lr": "0.5"}
  table = runs.table(read)
  assert "complete" in table and "failed: --target" in table


# --- The sweeper and its budget ----------------------------------------------

class EndedTrial:
  """A trial whose run has ended."""
  attrs = {}

  def poll(self):
    return 0

  def stop(self):
    pass


class AtOnce:
  """A launcher whose trials end as they start: one epoch each, its
  val_accuracy the trial's --base_lr."""
  where = "here"

  def start(self, model_dir, args):
    value = float(next(arg for arg in args if arg.startswith("--base_lr="))
                  .partition("=")[2])
    write_run(model_dir, [epoch(1, value, epochs=1)])
    return EndedTrial()

  def adopt(self, attrs):
    del attrs


class SavedWhenStopped:
  """A trial that runs until the sweep stops it, then saves, as the
  engine's run does on SIGTERM; polling it the first time sends the
  sweep's process SIGTERM."""
  attrs = {}

  def __init__(self, model_dir):
    self._model_dir = model_dir
    self._exit_code = None

  def poll(self):
    if self._exit_code is None:
      os.kill(os.getpid(), signal.SIGTERM)
    return self._exit_code

  def stop(self):
    write_run(self._model_dir, [epoch(1, 0.5), {
        "event": "end", "state": "stopped", "signal": "SIGTERM"}])
    self._exit_code = 0


class UntilStopped(AtOnce):
  def start(self, model_dir, args):
    del args
    return SavedWhenStopped(model_dir)


def sweeper_and_study(study_dir):
  """A Sweeper of a new study in `study_dir` (given a launcher, a budget
  and the trials at once), and the study."""
  sweep = studies.Sweep(
      storage=studies.default_storage(str(study_dir)), study_name="s",
      space=tuple(spaces.parse({"base_lr": {"uniform": [0.0, 1.0]}}, "s")),
      base_flags=(), metric="val_accuracy:max", sampler="random",
      pruner="none", seed=0, processes=1)
  storage = studies.storage(sweep.storage)
  study = studies.open_study(sweep, storage, create=True)
  return functools.partial(Sweeper, sweep=sweep, storage=storage,
                           study=study, study_dir=str(study_dir)), study


@pytest.fixture
def signal_handlers():
  """SIGTERM's and SIGINT's handlers as they were, after the sweeper's."""
  handlers = {signum: signal.getsignal(signum)
              for signum in (signal.SIGTERM, signal.SIGINT)}
  yield
  for signum, handler in handlers.items():
    signal.signal(signum, handler)


@pytest.mark.usefixtures("signal_handlers")
def test_a_sweeper_starts_trials_while_the_budget_it_is_given_lasts(
    tmp_path):
  sweeper, study = sweeper_and_study(tmp_path)
  # Counted over every start of the sweep; no time left, none started.
  for budget, parallel, total in ((Budget(trials=3), 2, 3),
                                  (Budget(trials=5), 1, 5),
                                  (Budget(hours=1e-9), 2, 5)):
    assert sweeper(launcher=AtOnce(), budget=budget,
                   parallel=parallel).run() == 0
    assert len(study.get_trials()) == total
  values = [t.value for t in study.get_trials()]
  assert [t.state.name for t in study.get_trials()] == ["COMPLETE"] * 5
  assert studies.best_trial(study).value == max(values)
  assert trials.read(studies.trial_dir(str(tmp_path), 4))["state"] == (
      trials.COMPLETE)


@pytest.mark.usefixtures("signal_handlers")
def test_a_stopped_sweeper_returns_the_signal_and_its_next_start_resumes(
    tmp_path):
  sweeper, study = sweeper_and_study(tmp_path)
  assert sweeper(launcher=UntilStopped(), budget=Budget(trials=2),
                 parallel=2).run() == signal.SIGTERM
  assert [t.state.name for t in study.get_trials()] == ["RUNNING"] * 2
  # The same trials, resumed, end; none is drawn anew.
  assert sweeper(launcher=AtOnce(), budget=Budget(trials=2),
                 parallel=2).run() == 0
  assert [(t.number, t.state.name) for t in study.get_trials()] == [
      (0, "COMPLETE"), (1, "COMPLETE")]


# --- Bad input: one line, nothing written ------------------------------------

def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
  space = tmp_path / "space.yaml"
  study_dir = tmp_path / "study"
  base = ["--", f"--data_dir={tmp_path}", "--epochs=1"]

  def refused(space_text, *args, base_flags=base):
    space.write_text(space_text)
    line = one_line_error(run(sweep_command(
        f"--space={space}", f"--study_dir={study_dir}", "--trials=2", *args,
        *base_flags)))
    assert not study_dir.exists()
    return line

  assert "nosuch: the engine has no flag" in refused(
      "nosuch: {uniform: [0, 1]}")
  assert "optimizer: the flag is of type string enum, which log_uniform does not " \
      "fit" in refused("optimizer: {log_uniform: [0.1, 1]}")
  assert "optimizer: 'rmsprop': " in refused(
      "optimizer: {choice: [sgd, rmsprop]}")
  assert "model_dir: the sweep sets it" in refused(
      "model_dir: {choice: [a, b]}")
  assert "not YAML (line 1)" in refused("base_lr: [: }")
  assert "--model_dir after --: the sweep sets it" in refused(
      "base_lr: {uniform: [0.1, 0.2]}",
      base_flags=[*base, "--model_dir=/tmp/x"])
  assert "the engine's flags after --: " in refused(
      "base_lr: {uniform: [0.1, 0.2]}", base_flags=[*base, "--epochs=many"])
  assert "--depth=28 reaches nothing: --model=cnn takes no depth" in refused(
      "base_lr: {uniform: [0.1, 0.2]}", base_flags=[*base, "--depth=28"])
  assert "--sampler=grid needs choice or int" in refused(
      "base_lr: {uniform: [0.1, 0.2]}", "--sampler=grid")
  assert "cannot create /proc/none" in refused(
      "base_lr: {uniform: [0.1, 0.2]}", "--storage=sqlite:////proc/none/s.db")
  assert "--best: " in one_line_error(run(sweep_command("--best")))
  assert "--trials or --hours: give the sweep's budget" in one_line_error(
      run(sweep_command(f"--study_dir={study_dir}")))

  # A study directory of another sweep: refused, its sweep.json unchanged.
  sweep = studies.Sweep(
      storage=studies.default_storage(str(study_dir)), study_name="study",
      space=tuple(spaces.parse({"base_lr": {"uniform": [0.1, 0.2]}}, "s")),
      base_flags=tuple(base[1:]), metric="val_accuracy:max", sampler="tpe",
      pruner="asha", seed=0, processes=2)
  studies.write_sweep(str(study_dir), sweep)
  before = (study_dir / studies.SWEEP_FILE).read_text()
  space.write_text("base_lr: {uniform: [0.1, 0.3]}")
  line = one_line_error(run(sweep_command(
      f"--space={space}", f"--study_dir={study_dir}", "--trials=2", *base)))
  assert "holds another sweep (its space differ)" in line
  assert (study_dir / studies.SWEEP_FILE).read_text() == before
  assert sorted(os.listdir(study_dir)) == [studies.SWEEP_FILE, "trials"]

  # The trial's side: both flags or neither; a directory with no sweep.
  assert "--trial_study_dir and --trial_number: give both" in one_line_error(
      run([fixtures.PYTHON, "-m", "engine.train", "--trial_number=1"]),
      program="engine.train")


# --- A real study -----------------------------------------------------------

SPACE = """\
# a rate that learns and one that does not; a target the engine refuses
base_lr: {choice: [0.003, 0.0000001]}
target_accuracy: {choice: [0.0, 0.99]}
"""


def trial_processes(study_dir):
  """The processes of the study's trials still alive."""
  alive = []
  for process in psutil.process_iter(["cmdline"]):
    try:
      if any(str(study_dir) in part for part in process.info["cmdline"] or ()):
        alive.append(process)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      pass
  return alive


def first_epoch_recorded(study_dir):
  """A trial with an epoch recorded and more to train, or None."""
  for model_dir in sorted((study_dir / "trials").glob("*")):
    metrics = model_dir / "metrics.jsonl"
    if not metrics.exists():
      continue
    records = [json.loads(line) for line in metrics.read_text().splitlines()
               if line.endswith("}")]
    epochs = [r for r in records if "event" not in r]
    if epochs and epochs[-1]["epoch"] < epochs[-1]["epochs"]:
      return model_dir
  return None


@pytest.mark.serial  # it kills the sweep and its trials save on SIGTERM
def test_a_study_prunes_records_a_failure_resumes_after_a_kill_and_picks_the_best(
    tmp_path):
  import optuna  # pylint: disable=import-outside-toplevel
  data_dir = fixtures.write_fashion_mnist(str(tmp_path / "data"),
                                          num_train=601, num_test=101)
  space = tmp_path / "space.yaml"
  space.write_text(SPACE)
  study_dir = tmp_path / "study"
  command = sweep_command(
      f"--space={space}", f"--study_dir={study_dir}", "--trials=4",
      "--sampler=grid", "--pruner=asha", "--processes=2", "--",
      f"--data_dir={data_dir}", "--epochs=4", "--target=0.999",
      "--mixed_precision=none", "--optimizer=adam", "--batch_size=16",
      "--seed=0")

  # Killed (SIGKILL: no word from it) once a trial has trained an epoch.
  sweep = subprocess.Popen(command, cwd=fixtures.REPO,
                           env=fixtures.engine_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.monotonic() + timeouts.bound(180)
  killed_in = None
  while killed_in is None and time.monotonic() < deadline:
    assert sweep.poll() is None, sweep.stdout.read()
    killed_in = first_epoch_recorded(study_dir)
    time.sleep(0.1)
  assert killed_in is not None, "no trial trained an epoch"
  sweep.send_signal(signal.SIGKILL)
  sweep.communicate(timeout=timeouts.bound(30))
  # Its trial got SIGTERM as the sweep died, and saves and stops.
  deadline = time.monotonic() + timeouts.bound(60)
  while trial_processes(study_dir) and time.monotonic() < deadline:
    time.sleep(0.5)
  assert not trial_processes(study_dir)
  stopped = [json.loads(line) for line in
             (killed_in / "metrics.jsonl").read_text().splitlines()]
  assert stopped[-1]["state"] == "stopped", stopped[-1]

  # The same command continues the study.
  result = run(command, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert f"trial {int(killed_in.name)} resumed" in result.stdout

  storage = studies.storage(studies.default_storage(str(study_dir)))
  study = optuna.load_study(study_name="study", storage=storage)
  ended = {t.number: t for t in study.get_trials()}
  # Four trials, each counted once, each ended.
  assert sorted(ended) == [0, 1, 2, 3]
  states = {n: t.state for n, t in ended.items()}
  assert all(s.is_finished() for s in states.values()), states
  by_values = {(t.params["base_lr"], t.params["target_accuracy"]): t
               for t in ended.values()}
  assert len(by_values) == 4  # the grid, once over
  # The flags the engine refuses: failed, with its one line.
  for rate in (0.003, 0.0000001):
    refused = by_values[(rate, 0.99)]
    assert refused.state == optuna.trial.TrialState.FAIL
    assert refused.user_attrs["reason"] == (
        "--target and --target_accuracy: give one (--target is for any "
        "figure, --target_accuracy for val_accuracy)")
  learns, stalls = by_values[(0.003, 0.0)], by_values[(0.0000001, 0.0)]
  assert learns.state == optuna.trial.TrialState.COMPLETE
  # ASHA's first rung is epoch 1: a trial after the one that learns, and
  # below it there, is stopped after its first epoch.
  if stalls.number > learns.number:
    assert stalls.state == optuna.trial.TrialState.PRUNED
    stalls_dir = study_dir / "trials" / f"{stalls.number:04d}"
    records = [json.loads(line) for line in
               (stalls_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["state"] == "pruned"
    assert [r["epoch"] for r in records if "event" not in r][-1] == 1
  # The killed trial resumed from its checkpoint, keeping the epochs it had
  # trained, and ended once.
  records = [json.loads(line) for line in
             (killed_in / "metrics.jsonl").read_text().splitlines()]
  trained = [r for r in stopped if "event" not in r]
  assert [r for r in records if "event" not in r][:len(trained)] == trained
  assert ended[int(killed_in.name)].state.is_finished()
  assert learns.value == max(r["val_accuracy"] for r in map(
      json.loads, (study_dir / "trials" / f"{learns.number:04d}" /
                   "metrics.jsonl").read_text().splitlines())
      if "val_accuracy" in r)

  # The best trial's flagfile, and the runs table of the study.
  best = run(sweep_command(f"--study_dir={study_dir}", "--best"))
  assert best.returncode == 0, best.stderr
  assert best.stdout.startswith(f"# Trial {learns.number} of the sweep")
  assert "--base_lr=0.003\n" in best.stdout
  assert "--target_accuracy=0.0\n" in best.stdout
  assert f"--data_dir={data_dir}\n" in best.stdout
  table = run([fixtures.PYTHON, "-m", "engine.runs", str(study_dir)])
  assert table.returncode == 0, table.stderr
  rows = table.stdout.splitlines()[1:]
  assert len(rows) == 4
  assert sum("failed: --target and --target_accuracy" in r for r in rows) == 2
  assert any(r.endswith("complete") for r in rows)


def test_a_continued_sweep_draws_new_trials_and_a_new_one_its_seeds(tmp_path):
  def draws(study_dir, starts):
    sweep = studies.Sweep(
        storage=studies.default_storage(str(study_dir)), study_name="s",
        space=tuple(spaces.parse({"base_lr": {"uniform": [0.0, 1.0]}}, "s")),
        base_flags=(), metric="val_accuracy:max", sampler="random",
        pruner="none", seed=0, processes=1)
    study = studies.open_study(sweep, create=True)
    values = []
    for _ in range(starts):  # each start of the sweep, two trials each
      study.sampler = studies.sampler(sweep, drawn=len(study.trials))
      for _ in range(2):
        trial = study.ask()
        values.append(sweep.space[0].suggest(trial))
        study.tell(trial, 0.5)
    return values

  continued = draws(tmp_path / "a", starts=2)
  assert len(set(continued)) == 4  # not the first start's two again
  # A new study of the same space and seed draws the same trials.
  assert draws(tmp_path / "b", starts=1) == continued[:2]
