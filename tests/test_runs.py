"""engine.runs: the table of runs, from synthetic metrics.jsonl and flags
files (no TensorFlow, no training)."""
import json
import os
import subprocess
import sys

import pytest

from engine import runs
from engine.records import runs_plot
from engine.core import run_files
from engine.core.errors import UserError
from tests import fixtures
from tests import timeouts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOW = 1_800_000_000.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

BASE_FLAGS = {"dataset": "fashion_mnist", "model": "cnn", "base_lr": "0.001",
              "batch_size": "128", "epochs": "3", "target_accuracy": "0.0",
              "nesterov": False, "data_dir": ""}


def epoch_record(epoch, **values):
  """A record as engine.train writes it; `values` override its figures."""
  record = {
      "epoch": epoch, "global_step": 100 * epoch, "train_loss": 1.0 / epoch,
      "train_accuracy": 0.5 + 0.1 * epoch, "val_loss": 1.1 / epoch,
      "val_accuracy": 0.5 + 0.1 * epoch, "learning_rate": 0.001,
      "images_per_sec": 1000.0, "input_seconds": 0.5, "step_seconds": 9.0,
      "epoch_seconds": 10.0, "cumulative_seconds": 10.0 * epoch,
      "world_size": 2, "skipped_steps": 0, "epochs": 3,
      "time": NOW - 1000 + 10 * epoch}
  record.update(values)
  return record


def flagfile(values):
  lines = []
  for name, value in values.items():
    if isinstance(value, bool):
      lines.append(f"--{name}" if value else f"--no{name}")
    else:
      lines.append(f"--{name}={value}")
  return "\n".join(lines) + "\n"


def write_run(directory, records=(), flags=None, latest_flags=None,
              tail=""):
  """A model_dir: flags.txt (BASE_FLAGS with `flags` over them, and
  model_dir), flags.latest.txt if `latest_flags`, and metrics.jsonl with
  `records` and then the text `tail`."""
  os.makedirs(directory, exist_ok=True)
  values = dict(BASE_FLAGS, model_dir=str(directory), **(flags or {}))
  with open(os.path.join(directory, "flags.txt"), "w") as f:
    f.write(flagfile(values))
  if latest_flags:
    with open(os.path.join(directory, "flags.latest.txt"), "w") as f:
      f.write(flagfile(dict(values, **latest_flags)))
  if records or tail:
    with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in records)
      f.write(tail)
  return str(directory)


def three_epochs(**values):
  return [epoch_record(epoch, **values) for epoch in (1, 2, 3)]


# summary


def test_summary_gives_best_final_epochs_and_processes():
  records = [epoch_record(1, val_accuracy=0.6),
             epoch_record(2, val_accuracy=0.8, world_size=4),
             epoch_record(3, val_accuracy=0.7, world_size=4)]
  figures = run_files.summary(records)
  assert figures["best_val_accuracy"] == 0.8
  assert figures["final_val_accuracy"] == 0.7
  assert figures["epochs"] == 3
  assert figures["world_size"] == 4
  assert figures["seconds_to_target"] is None


def test_images_per_sec_is_the_median_without_epoch_1():
  rates = [100.0, 200.0, 300.0, 1000.0]  # epoch 1 in would give 250
  records = [epoch_record(epoch, images_per_sec=rate)
             for epoch, rate in enumerate(rates, start=1)]
  assert run_files.summary(records)["images_per_sec"] == 300.0
  # A single epoch is all there is.
  assert run_files.summary(records[:1])["images_per_sec"] == 100.0


def test_summary_of_no_records():
  figures = run_files.summary([])
  assert figures["epochs"] == 0
  assert figures["best_val_accuracy"] is None
  assert figures["images_per_sec"] is None


def test_seconds_to_target_from_the_last_record(tmp_path):
  reached = [epoch_record(1, target_accuracy_first_epoch=None,
                          target_accuracy_first_seconds=None),
             epoch_record(2, target_accuracy_first_epoch=2,
                          target_accuracy_first_seconds=21.5)]
  assert run_files.summary(reached)["seconds_to_target"] == 21.5
  assert run_files.summary(reached[:1])["seconds_to_target"] is None
  write_run(tmp_path / "reached", reached, {"target_accuracy": "0.7"})
  write_run(tmp_path / "not_reached", reached[:1],
            {"target_accuracy": "0.7"})
  rows = table_rows(tmp_path)
  assert rows["reached"]["s to target"] == "21.5"
  assert rows["not_reached"]["s to target"] == "-"


def test_no_target_column_without_a_target(tmp_path):
  write_run(tmp_path / "a", three_epochs())
  write_run(tmp_path / "b", three_epochs(), {"base_lr": "0.01"})
  assert "s to target" not in table(tmp_path).splitlines()[0]


# States


def state_of(tmp_path, records, flags=None, tail="", now=NOW):
  return runs.read_run(write_run(tmp_path / "run", records, flags, tail=tail),
                       now=now).state


def test_finished_when_the_last_epoch_is_the_planned_one(tmp_path):
  assert state_of(tmp_path, three_epochs()) == "finished"


def test_early_stopped_is_finished(tmp_path):
  records = three_epochs(epochs=10)
  records[-1]["stopped_early"] = True
  assert state_of(tmp_path, records) == "finished"


@pytest.mark.parametrize("end, state", [
    ({"state": "stopped", "signal": "SIGTERM"}, "stopped by SIGTERM"),
    ({"state": "diverged", "reason": "training diverged at step 7"},
     "diverged"),
    ({"state": "error", "reason": "a write to model_dir failed"},
     "error: a write to model_dir failed"),
    ({"state": "error", "reason": "x" * 80 + "\ny"}, "error: " + "x" * 47 +
     "..."),
])
def test_an_end_record_says_how_the_run_ended(tmp_path, end, state):
  end = dict(end, event="end", time=NOW - 1)
  # Even after the last epoch: stopped while saving its checkpoint, say.
  assert state_of(tmp_path, three_epochs() + [end]) == state
  assert state_of(tmp_path, three_epochs(epochs=10)[:2] + [end]) == state


def test_epochs_after_an_end_record_are_a_later_start(tmp_path):
  records = three_epochs()
  records.insert(1, {"event": "end", "state": "stopped", "signal": "SIGTERM",
                     "time": NOW - 5000})
  assert state_of(tmp_path, records) == "finished"


def test_running_while_the_last_record_is_recent(tmp_path):
  # 3 x 10 s epochs + 120 s: 150 s.
  records = three_epochs(epochs=10, time=NOW - 149)
  assert state_of(tmp_path, records) == "running"
  records = three_epochs(epochs=10, time=NOW - 151)
  assert state_of(tmp_path, records) == "no end recorded (killed?)"
  # A long epoch allows longer.
  records[1]["epoch_seconds"] = 100.0
  assert state_of(tmp_path, records) == "running"


def test_a_rollback_is_not_an_end(tmp_path):
  records = three_epochs(epochs=10)
  records.append({"event": "rollback", "epoch": 3, "time": NOW - 10})
  assert state_of(tmp_path, records) == "running"


def test_starting_with_flags_and_no_metrics(tmp_path):
  write_run(tmp_path / "new")
  write_run(tmp_path / "old", three_epochs())
  rows = table_rows(tmp_path)
  assert rows["new"]["state"] == "starting"
  assert rows["new"]["epochs"] == "0/3"
  assert rows["new"]["best"] == "-"


# Reading the files


def test_flags_latest_override_flags(tmp_path):
  path = write_run(tmp_path / "run", three_epochs(), {"epochs": "3"},
                   latest_flags={"epochs": "6", "nesterov": True})
  run = runs.read_run(path, now=NOW)
  assert run.flags["epochs"] == "6"
  assert run.flags["nesterov"] == "true"
  assert run.flags["data_dir"] == ""


def test_a_damaged_last_line_is_skipped(tmp_path):
  records = three_epochs(epochs=4)
  half = json.dumps(epoch_record(4))[:40]
  path = write_run(tmp_path / "run", records, tail="[1, 2]\n\"x\"\n" + half)
  run = runs.read_run(path, now=NOW)
  assert [r["epoch"] for r in run.records] == [1, 2, 3]
  assert run.state == "no end recorded (killed?)"


def test_a_redone_epoch_replaces_its_record_and_later_ones(tmp_path):
  records = three_epochs(epochs=5)
  records += [{"event": "rollback", "epoch": 1},
              epoch_record(2, val_accuracy=0.2, epochs=5)]
  run = runs.read_run(write_run(tmp_path / "run", records), now=NOW)
  assert [r["epoch"] for r in run.records] == [1, 2]
  assert run_files.summary(run.records)["final_val_accuracy"] == 0.2


# The table


def table(directory):
  return runs.table({label: runs.read_run(path, now=NOW) for label, path in
                     runs.find_runs([str(directory)]).items()})


def table_rows(directory):
  """The table's rows by run, each {column: cell}; cells are split at
  runs of 2+ spaces, so none may hold two spaces."""
  header, *lines = table(directory).splitlines()
  names = [name.strip() for name in header.split("  ") if name.strip()]
  rows = {}
  for line in lines:
    cells = [cell.strip() for cell in line.split("  ") if cell.strip()]
    assert len(cells) == len(names), (names, cells)
    rows[cells[0]] = dict(zip(names, cells))
  return rows


def test_only_differing_flags_are_columns(tmp_path):
  write_run(tmp_path / "b", three_epochs(), {"base_lr": "0.01"})
  write_run(tmp_path / "a", three_epochs())
  write_run(tmp_path / "c", three_epochs(), {"nesterov": True})
  lines = table(tmp_path).splitlines()
  assert lines[0].split() == ["run", "--base_lr", "--nesterov", "epochs",
                              "best", "final", "img/s", "procs", "state"]
  assert [line.split()[:3] for line in lines[1:]] == [
      ["a", "0.001", "false"], ["b", "0.01", "false"],
      ["c", "0.001", "true"]]
  # Aligned: every column starts where its header does.
  for line in lines[1:]:
    assert line[lines[0].index("--nesterov")] != " "


def test_scaling_adds_speedup_and_efficiency_against_the_fewest_processes(
    tmp_path):
  # As scripts/slurm/scaling.sh names them: nodes_10 sorts before nodes_2.
  for nodes, rate in ((1, 1000.0), (10, 8000.0), (2, 1900.0)):
    write_run(tmp_path / f"nodes_{nodes}",
              three_epochs(world_size=4 * nodes, images_per_sec=rate))
  write_run(tmp_path / "nodes_4")  # not started: no speed
  lines = runs.table({label: runs.read_run(path, now=NOW) for label, path in
                      runs.find_runs([str(tmp_path)]).items()},
                     scaling=True).splitlines()
  assert lines[0].split()[-4:] == ["procs", "speedup", "efficiency", "state"]
  assert [line.split()[0] for line in lines[1:]] == [
      "nodes_4", "nodes_1", "nodes_2", "nodes_10"]
  assert [line.split()[-4:-1] for line in lines[1:]] == [
      ["-", "-", "-"], ["4", "1.00x", "100%"], ["8", "1.90x", "95%"],
      ["40", "8.00x", "80%"]]


def test_one_run_has_no_flag_columns(tmp_path):
  path = write_run(tmp_path / "only", three_epochs(), {"base_lr": "0.01"})
  lines = table(path).splitlines()
  assert lines[0].split() == ["run", "epochs", "best", "final", "img/s",
                              "procs", "state"]
  assert lines[1].split() == ["only", "3/3", "0.8000", "0.8000", "1000",
                              "2", "finished"]


def test_a_flag_a_resume_changed_is_a_column_of_its_values(tmp_path):
  # Resumed at epoch 2 with --base_lr 0.001 → 0.0005, at epoch 3 with
  # --epochs 3 → 6 and --base_lr 0.0005 → 0.001 again.
  records = three_epochs(epochs=6)
  records[1]["flags_changed"] = {"step": 0,
                                 "flags": {"base_lr": ["0.001", "0.0005"]}}
  records[2]["flags_changed"] = {"step": 0, "flags": {
      "epochs": ["3", "6"], "base_lr": ["0.0005", "0.001"]}}
  path = write_run(tmp_path / "only", records,
                   latest_flags={"epochs": "6"})
  assert table_rows(path)["only"] == {
      "run": "only", "--base_lr": "0.001→0.0005→0.001", "--epochs": "3→6",
      "epochs": "3/6", "best": "0.8000", "final": "0.8000", "img/s": "1000",
      "procs": "2", "state": "no end recorded (killed?)"}


def write_checkpoints(directory, version, where="checkpoints"):
  """A checkpoint's index file in `where` (its bytes are never read), and
  checkpoints/format.json with `version`, unless it is 0 (as written before
  the format was recorded)."""
  os.makedirs(os.path.join(directory, where), exist_ok=True)
  with open(os.path.join(directory, where, "ckpt-3.index"), "wb") as f:
    f.write(b"\0")
  if version:
    with open(os.path.join(directory, "checkpoints", "format.json"),
              "w") as f:
      json.dump({"version": version}, f)


def test_runs_of_another_checkpoint_format_are_listed_with_it(tmp_path):
  write_checkpoints(write_run(tmp_path / "ours", three_epochs()), 3)
  write_run(tmp_path / "fresh", three_epochs())  # no checkpoint yet
  assert runs.read_run(str(tmp_path / "ours")).checkpoint_format == 3
  assert runs.read_run(str(tmp_path / "fresh")).checkpoint_format is None
  assert "format" not in table(tmp_path)  # this engine's, or none
  write_checkpoints(write_run(tmp_path / "old", three_epochs()), 0)
  write_checkpoints(write_run(tmp_path / "keras2", three_epochs()), 1)
  # Format 2, which this engine still reads where it holds every variable.
  write_checkpoints(write_run(tmp_path / "graph", three_epochs()), 2)
  write_checkpoints(write_run(tmp_path / "later", three_epochs()), 4,
                    where=os.path.join("checkpoints", "best"))
  rows = table_rows(tmp_path)
  assert {label: (row["ckpt format"], row["state"])
          for label, row in rows.items()} == {
              "fresh": ("-", "finished"), "later": ("4", "finished"),
              "keras2": ("1", "finished"), "old": ("0", "finished"),
              "graph": ("2", "finished"), "ours": ("3", "finished")}
  assert list(rows["ours"])[-2:] == ["ckpt format", "state"]


def test_runs_are_found_at_any_depth(tmp_path):
  write_run(tmp_path / "sweep" / "lr1", three_epochs())
  write_run(tmp_path / "sweep" / "deeper" / "lr2", three_epochs())
  os.makedirs(tmp_path / "sweep" / "empty")
  assert list(runs.find_runs([str(tmp_path / "sweep")])) == [
      os.path.join("deeper", "lr2"), "lr1"]
  # Several DIRs: labels start with each DIR's name.
  write_run(tmp_path / "other" / "lr1", three_epochs())
  assert list(runs.find_runs([str(tmp_path / "sweep"),
                              str(tmp_path / "other")])) == [
      os.path.join("other", "lr1"), os.path.join("sweep", "deeper", "lr2"),
      os.path.join("sweep", "lr1")]


def test_a_dir_without_runs_is_an_error(tmp_path):
  os.makedirs(tmp_path / "nothing" / "here")
  with pytest.raises(UserError, match="holds no run"):
    runs.find_runs([str(tmp_path / "nothing")])


def test_plot_is_a_png(tmp_path):
  runs_by_label = {
      "a": runs.read_run(write_run(tmp_path / "a", three_epochs()), now=NOW),
      "b": runs.read_run(write_run(tmp_path / "b", three_epochs(
          val_accuracy=0.4)), now=NOW)}
  path = tmp_path / "runs.png"
  runs_plot.plot(runs_by_label, str(path))
  with open(path, "rb") as f:
    assert f.read(8) == PNG_SIGNATURE
  assert os.path.getsize(path) > 5000


# The command line: a process each, so only a few.


def run_cli(*args):
  return subprocess.run([sys.executable, *args], cwd=REPO,
                        capture_output=True, text=True,
                        timeout=timeouts.bound(60))


def test_cli_prints_the_table_and_writes_the_plot(tmp_path):
  write_run(tmp_path / "runs" / "a", three_epochs())
  write_run(tmp_path / "runs" / "b", three_epochs(), {"base_lr": "0.01"})
  plot_path = tmp_path / "plot.png"
  result = run_cli("-m", "engine.runs", str(tmp_path / "runs"),
                   f"--plot={plot_path}")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].split()[:2] == ["run", "--base_lr"]
  assert [line.split()[0] for line in lines[1:3]] == ["a", "b"]
  assert lines[3] == f"wrote {plot_path}"
  assert os.path.getsize(plot_path) > 5000


def test_cli_nonexistent_dir_is_one_error_line(tmp_path):
  result = run_cli("-m", "engine.runs", str(tmp_path / "missing"))
  assert result.returncode == 2
  assert result.stdout == ""
  assert len(result.stderr.splitlines()) == 1
  assert result.stderr.startswith("engine.runs: error: ")


def test_importing_it_imports_neither_tensorflow_nor_matplotlib():
  assert fixtures.packages_imported_by(
      "engine.runs", {"tensorflow", "matplotlib", "numpy"}) == []


def test_the_final_accuracy_is_the_last_evaluated_epochs():
  records = [epoch_record(1, val_accuracy=0.6), epoch_record(2,
             val_accuracy=None, val_loss=None)]
  figures = run_files.summary(records)
  assert figures["final_val_accuracy"] == 0.6
  assert figures["best_val_accuracy"] == 0.6


def test_a_run_with_a_step_report_shows_what_bounded_its_step(tmp_path):
  write_run(tmp_path / "profiled", three_epochs())
  write_run(tmp_path / "plain", three_epochs())
  os.makedirs(tmp_path / "profiled" / "profile")
  (tmp_path / "profiled" / "profile" / "step_report.json").write_text(
      json.dumps({"verdict": {"bound": "communication"}}))
  rows = table_rows(tmp_path)
  assert rows["profiled"]["bound"] == "communication"
  assert rows["plain"]["bound"] == "-"
  (tmp_path / "profiled" / "profile" / "step_report.json").write_text("{")
  with pytest.raises(UserError, match=r"step_report.json: unreadable .*; "
                     "it records the step report of the run's profiled "
                     "window"):
    table(tmp_path)
  os.remove(tmp_path / "profiled" / "profile" / "step_report.json")
  assert "bound" not in table(tmp_path).splitlines()[0]
