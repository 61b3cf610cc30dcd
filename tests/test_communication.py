"""--gradient_compression=auto: fp16 chosen only where it clearly pays,
the choice and what Horovod ran with recorded and reused, a process alone
unmeasured. On two processes (rank 0's choice on every rank, a resume
reusing it): tests/test_precision.py, which launches both measurements
at once."""
import json

import pytest

from engine import distributed
from engine.compute import auto
from engine.compute import communication
from engine.compute import precision
from engine.core import run_files
from engine.core.errors import UserError
from tests import fixtures


@pytest.mark.parametrize("images_per_sec, chosen", [
    ({"none": 1000, "fp16": 900}, "none"),     # the cast costs more
    ({"none": 1000, "fp16": 1040}, "none"),    # within the margin
    ({"none": 1000, "fp16": 1200}, "fp16"),    # the link bounds the step
])
def test_fp16_wins_only_by_the_margin(images_per_sec, chosen):
  assert auto.choose(dict(images_per_sec=images_per_sec,
                          margin=auto.MARGIN)) == chosen


def test_what_horovod_runs_with_is_the_environments_or_its_defaults(
    monkeypatch):
  monkeypatch.delenv("HOROVOD_FUSION_THRESHOLD", raising=False)
  monkeypatch.delenv("HOROVOD_CYCLE_TIME", raising=False)
  assert communication.in_effect() == {
      "fusion_threshold_bytes": 128 * 1024 * 1024, "cycle_time_ms": 1.0}
  # As horovodrun --fusion-threshold-mb=32 --cycle-time-ms=2.5 sets them.
  monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", str(32 * 1024 * 1024))
  monkeypatch.setenv("HOROVOD_CYCLE_TIME", "2.5")
  assert communication.in_effect() == {
      "fusion_threshold_bytes": 32 * 1024 * 1024, "cycle_time_ms": 2.5}


def test_a_recorded_choice_reads_back_and_a_damaged_one_is_one_line(
    tmp_path):
  assert auto.recorded(auto.COMPRESSION, str(tmp_path)) is None
  choice = communication.Choice("fp16", "measured", dict(
      images_per_sec={"none": 1.0, "fp16": 2.0},
      fusion_threshold_bytes=1024, cycle_time_ms=3.0))
  auto.record(auto.COMPRESSION, str(tmp_path), choice.compression,
              choice.figures)
  assert auto.recorded(auto.COMPRESSION, str(tmp_path)) == dict(
      compression="fp16", **choice.figures)
  (tmp_path / run_files.COMMUNICATION_FILE).write_text(
      '{"compression": "fp8"}')
  with pytest.raises(UserError, match=r"communication.json: unreadable .*"
                     "delete it to measure again"):
    auto.recorded(auto.COMPRESSION, str(tmp_path))


def test_a_resume_under_auto_keeps_the_compression_of_the_first_start(
    tmp_path):
  model_dir = str(tmp_path)
  # A new run chooses.
  assert auto.of_first_start(auto.COMPRESSION, model_dir) is None
  flags_txt = tmp_path / run_files.FLAGS_FILE
  flags_txt.write_text("--epochs=3\n--gradient_compression=auto\n")
  assert auto.of_first_start(auto.COMPRESSION, model_dir) is None
  flags_txt.write_text("--epochs=3\n--gradient_compression=fp16\n")
  assert auto.of_first_start(auto.COMPRESSION, model_dir) == (
      "fp16", "fp16, the compression of the run's first start (flags.txt)")
  auto.record(auto.COMPRESSION, model_dir, "none", dict(
      images_per_sec={}, unmeasured="a process alone has no allreduce"))
  assert auto.of_first_start(auto.COMPRESSION, model_dir) == (
      "none", "none, unmeasured: a process alone has no allreduce "
      "(communication.json)")
  auto.record(auto.COMPRESSION, model_dir, "fp16", dict(
      images_per_sec={"none": 1000.0, "fp16": 1500.0}))
  assert auto.of_first_start(auto.COMPRESSION, model_dir) == (
      "fp16", "measured float32 gradients 1000 img/s, float16 gradients "
      "1500 img/s: fp16 (communication.json)")


def test_a_process_alone_sends_none_unmeasured_and_says_why(tmp_path):
  distributed.start_horovod()
  world = distributed.World(rank=0, size=1, device="CPU",
                            intra_op_threads=1, inter_op_threads=1)
  config = fixtures.train_config(
      training=dict(model_dir=str(tmp_path)),
      performance=dict(gradient_compression="auto"))

  def step_of(mode, compression):
    raise AssertionError("measured")

  _, choice = auto.decide(config, world, precision.Choice("none"), None,
                          None, step_of, model=None)
  assert choice.compression == "none"
  assert choice.why == "none, unmeasured: a process alone has no allreduce"
  assert choice.figures["images_per_sec"] == {}
  assert set(choice.figures) >= {"fusion_threshold_bytes", "cycle_time_ms"}
  # Asked for: taken as it is, nothing to record.
  assert auto.decide(
      config.replace(performance=dict(gradient_compression="fp16")),
      world, precision.Choice("none"), None, None, step_of,
      model=None)[1] == communication.Choice("fp16")
  json.dumps(choice.figures)  # recordable as it is
