"""Writes that fail, and the room checkpoints need (engine/records/storage.py)."""
import os

from absl import logging
import pytest
import tensorflow as tf

from engine.compute import step as steps
from engine.core import run_files
from engine.core.errors import WriteFailed
from engine.loop import actions
from engine.loop import profiling
from engine.records import storage
from tests import fixtures


def test_a_full_device_is_one_line_naming_what_where_size_and_free_space():
  # /dev/full fails every write with ENOSPC, as a full disk does.
  with pytest.raises(WriteFailed) as raised:
    with storage.writing("metrics", "/dev/full", 460):
      with open("/dev/full", "w") as f:
        f.write("x" * 460)
  message = str(raised.value)
  assert message.startswith("could not write metrics /dev/full (460 bytes): "
                            "No space left on device; "), message
  assert message.endswith("free on its file system; free some space")
  assert "\n" not in message


def test_tensorflow_file_errors_are_recognized_by_their_text(tmp_path):
  missing = str(tmp_path / "gone" / "ckpt-3")
  with pytest.raises(WriteFailed, match=r"could not write checkpoint "
                     rf"{missing} \(2\.0 MB\): No such file or directory; "
                     r".* free on its file system; was model_dir removed\? "
                     r"put it back$"):
    with storage.writing("checkpoint", missing, 2 * 2**20):
      raise tf.errors.NotFoundError(None, None, f"{missing}; No such file "
                                    "or directory")


def test_free_space_is_that_of_the_nearest_existing_directory(tmp_path):
  assert storage.free_space(str(tmp_path / "not" / "yet")) == \
      storage.free_space(str(tmp_path))


def test_start_up_warns_when_checkpoints_will_not_fit(tmp_path, caplog):
  caplog.set_level(logging.WARNING)
  storage.warn_if_short_of_space(str(tmp_path), checkpoint_size=2**50,
                                 keep=3)
  assert "5 checkpoints of 1048576.0 GB need 5242880.0 GB " \
      "(--keep_checkpoints=3, one being written, the best)" in caplog.text
  caplog.clear()
  storage.warn_if_short_of_space(str(tmp_path), checkpoint_size=1, keep=3)
  assert not caplog.text


def test_sizes_read_as_people_read_them():
  assert [storage.human(n) for n in (612, 12 * 2**10 + 300, 45 * 2**19,
                                     3 * 2**30)] == [
      "612 bytes", "12.3 KB", "22.5 MB", "3.0 GB"]


def test_remove_takes_files_and_directories_and_ignores_the_missing(tmp_path):
  (tmp_path / "ckpt-3_temp").mkdir()
  (tmp_path / "ckpt-3_temp" / "part").write_text("x")
  (tmp_path / "ckpt-3.index").write_text("x")
  storage.remove(str(tmp_path / "ckpt-3_temp"), str(tmp_path / "ckpt-3.index"),
                 str(tmp_path / "never"))
  assert os.listdir(tmp_path) == []


def test_a_profile_trace_that_cannot_be_written_is_one_line(tmp_path):
  (tmp_path / run_files.PROFILE_DIR).write_text("a file, not a directory")
  profiler = profiling.StepProfiler(str(tmp_path), steps=(1, 1), rank=0,
                                    all_ranks=False, timeline=False,
                                    settings=fixtures.step_settings())
  with pytest.raises(WriteFailed, match=r"^could not write profile trace "
                     rf"{tmp_path}/profile: .* free on its file system"):
    with profiler.step(1):
      tf.constant(1.0) + 1.0
    profiler.run(actions.At(global_step=1, epoch=0, step=1, model=None,
                            rank=0, world_size=1, is_chief=True,
                            model_dir=str(tmp_path)))
  profiler.close()  # after a failed write: nothing left to stop


def test_a_step_report_that_cannot_be_written_is_one_line(tmp_path):
  """The window timed and gathered, the report's file a directory."""
  from engine import distributed  # pylint: disable=import-outside-toplevel
  distributed.start_horovod()
  (tmp_path / run_files.PROFILE_DIR / run_files.STEP_REPORT_FILE).mkdir(
      parents=True)
  profiler = profiling.StepProfiler(str(tmp_path), steps=(1, 2), rank=0,
                                    all_ranks=False, timeline=False,
                                    settings=fixtures.step_settings())

  class TimedStep:  # what the loop's train step gives a profiled call
    timed_traces = 1

    def train(self, num_steps, stop_requested, timed):
      del stop_requested
      assert timed
      return steps.Trained(steps=num_steps, stop_agreed=False,
                           input_seconds=0.0005, phases={
                               "input": 0.0005, "forward": 0.001,
                               "backward": 0.002})

  with pytest.raises(WriteFailed, match=rf"^could not write step report "
                     rf"{tmp_path}: "):
    for global_step in (1, 2):
      with profiler.step(global_step):
        assert profiler.timing
        assert profiler.timed(TimedStep(), 1, False).stop_agreed is False
      profiler.run(actions.At(global_step=global_step, epoch=0,
                              step=global_step, model=None, rank=0,
                              world_size=1, is_chief=True,
                              model_dir=str(tmp_path)))
  profiler.close()
