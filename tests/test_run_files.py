"""engine.core.run_files: a model_dir's names, and the readers and writers
of its small files that several modules share (no TensorFlow)."""
import os

import pytest

from engine.core import run_files
from engine.core.errors import UserError
from tests import fixtures


def test_importing_it_imports_no_tensorflow():
  assert fixtures.packages_imported_by(
      "engine.core.run_files", {"tensorflow", "numpy", "absl"}) == []


def test_the_first_starts_flags_are_kept_and_a_resumes_go_beside_them(
    tmp_path):
  assert run_files.latest_flags_file(str(tmp_path)) is None
  run_files.record_flags(str(tmp_path), "--epochs=2\n")
  assert run_files.latest_flags_file(str(tmp_path)) == str(
      tmp_path / run_files.FLAGS_FILE)
  run_files.record_flags(str(tmp_path), "--epochs=4\n--nodeterministic\n")
  run_files.record_flags(str(tmp_path), "--epochs=6\n--deterministic\n")
  assert run_files.read_flags(str(tmp_path / run_files.FLAGS_FILE)) == {
      "epochs": "2"}
  latest = run_files.latest_flags_file(str(tmp_path))
  assert latest == str(tmp_path / run_files.LATEST_FLAGS_FILE)
  assert run_files.read_flags(latest) == {"epochs": "6",
                                          "deterministic": "true"}
  assert run_files.read_flags(str(tmp_path / "none.txt")) == {}


def test_metrics_lines_come_with_their_records_or_none(tmp_path):
  assert run_files.read_metrics(str(tmp_path)) == []
  (tmp_path / run_files.METRICS_FILE).write_bytes(
      b'{"epoch": 1, "val_accuracy": 0.5}\n\n'
      b'{"event": "end", "state": "error"}\n'
      b'[1, 2]\n{"epoch": "2"}\n\xff\n{"epoch": 2, "val_acc')
  assert [record for _, record in run_files.read_metrics(str(tmp_path))] == [
      {"epoch": 1, "val_accuracy": 0.5}, {"event": "end", "state": "error"},
      None, None, None, None]


def test_an_unreadable_record_is_one_line_saying_what_it_keeps(tmp_path):
  (tmp_path / "choice.json").write_text('{"mode": ')
  with pytest.raises(UserError, match=r"choice\.json: unreadable \(.*\); it "
                     "records the choice: restore it"):
    run_files.read_record(str(tmp_path), "choice.json", dict,
                          "the choice: restore it")
  assert run_files.read_record(str(tmp_path), "none.json", dict, "") is None


def test_a_checkpoints_directory_is_its_own_or_for_best_its_parent():
  assert run_files.checkpoint_dir_of("/run/checkpoints/ckpt-40") == \
      "/run/checkpoints"
  assert run_files.checkpoint_dir_of("/run/checkpoints/best/best-20") == \
      "/run/checkpoints"
  assert run_files.checkpoint_dir_of("ckpt-40") == os.getcwd()
