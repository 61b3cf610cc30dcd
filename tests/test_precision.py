"""--mixed_precision=auto: the modes the hardware computes natively, the
one measured fastest, recorded and reused; on two processes, rank 0's
choice on every rank, for it and for --gradient_compression=auto, which
engine/compute/auto.py decides alike (its own module's checks:
tests/test_communication.py), and a run of the same kind taking the
decision kept, with a busy process beside it."""
import json
import os

import keras
import pytest
import tensorflow as tf

from engine.compute import auto
from engine.compute import precision
from engine.core import run_files
from engine.core.errors import UserError
from tests import fixtures


def test_an_explicit_mode_is_kept():
  for mode in ("none", "float16", "bfloat16"):
    assert precision.resolve(mode) == (mode, "")


def test_a_model_built_in_16_bits_leaves_keras_policy_as_it_was(tmp_path):
  """The run's mode is its model's layers', not the process's: a fit
  script's next model (or the next test) is built in the policy it had."""
  from engine import build  # pylint: disable=import-outside-toplevel
  config = fixtures.train_config(data=dict(
      dir=fixtures.write_fashion_mnist(str(tmp_path), 20, 10)))
  _, _, _, model, _ = build.data_task_and_model(config, "bfloat16")
  assert "bfloat16" in {layer.compute_dtype for layer in model.layers}
  assert keras.config.dtype_policy().name == "float32"


@pytest.mark.parametrize("flags, expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, ("bfloat16", "CPU with AVX512_BF16")),
    ({"avx2", "amx_bf16", "amx_tile"}, ("bfloat16", "CPU with AMX_BF16")),
    ({"avx2", "fma"}, ("none", "CPU without AVX512_BF16 or AMX: 16 bits "
                               "would be emulated")),
])
def test_auto_on_a_cpu_follows_its_bfloat16_instructions(flags, expected):
  assert precision.resolve("auto", cpu_flags=flags) == expected


@pytest.mark.parametrize("capability, mode", [
    ((9, 0), "bfloat16"), ((8, 0), "bfloat16"), ((7, 5), "float16"),
    ((7, 0), "float16"), ((6, 1), "none")])
def test_auto_on_a_gpu_follows_its_compute_capability(monkeypatch,
                                                      capability, mode):
  gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: [gpu] if kind == "GPU" else [])
  monkeypatch.setattr(tf.config.experimental, "get_device_details",
                      lambda device: {"compute_capability": capability})
  chosen, why = precision.resolve("auto", cpu_flags={"avx512_bf16"})
  assert chosen == mode
  assert why.startswith(f"GPU of compute capability {capability[0]}."
                        f"{capability[1]}")


@pytest.mark.parametrize("flags, modes", [
    ({"avx2", "avx512_bf16"}, ("none", "bfloat16")),
    ({"avx2", "fma"}, ("none",)),
])
def test_the_native_modes_are_what_auto_measures(flags, modes):
  assert precision.native(cpu_flags=flags)[0] == modes


@pytest.mark.parametrize("images_per_sec, chosen", [
    # The recipes' own figures: narrow ResNet-9 loses in bfloat16, wide
    # WRN-16-2 wins (an AVX512_BF16 EPYC, issue 29).
    ({"none": 9000, "bfloat16": 7200}, "none"),
    ({"none": 329, "bfloat16": 522}, "bfloat16"),
    # Within the margin: float32, which needs no care.
    ({"none": 1000, "bfloat16": 1040}, "none"),
    ({"none": 1000, "bfloat16": 1200, "float16": 1300}, "float16"),
])
def test_the_fastest_mode_wins_by_a_margin_over_float32(images_per_sec,
                                                        chosen):
  assert auto.choose(dict(images_per_sec=images_per_sec,
                          margin=auto.MARGIN)) == chosen


def test_a_recorded_choice_reads_back_and_a_damaged_one_is_one_line(
    tmp_path):
  assert auto.recorded(auto.PRECISION, str(tmp_path)) is None
  choice = {"mode": "bfloat16", "images_per_sec": {"none": 1.0,
                                                    "bfloat16": 2.0}}
  auto.record(auto.PRECISION, str(tmp_path), "bfloat16",
              {"images_per_sec": choice["images_per_sec"]})
  assert auto.recorded(auto.PRECISION, str(tmp_path)) == choice
  (tmp_path / run_files.PRECISION_FILE).write_text('{"mode": "float8"}')
  with pytest.raises(UserError, match=r"precision.json: unreadable .*"
                     "delete it to measure again"):
    auto.recorded(auto.PRECISION, str(tmp_path))


def test_a_resume_under_auto_keeps_the_mode_of_the_first_start(tmp_path):
  model_dir = str(tmp_path)
  # A new run chooses.
  assert auto.of_first_start(auto.PRECISION, model_dir) is None
  flags_txt = tmp_path / "flags.txt"
  flags_txt.write_text("--epochs=3\n--mixed_precision=auto\n")
  assert auto.of_first_start(auto.PRECISION, model_dir) is None
  flags_txt.write_text("--epochs=3\n--mixed_precision=none\n")
  assert auto.of_first_start(auto.PRECISION, model_dir) == (
      "none", "float32, the mode of the run's first start (flags.txt)")
  auto.record(auto.PRECISION, model_dir, "none", {
      "images_per_sec": {}, "hardware": "CPU without AVX512_BF16 or AMX"})
  assert auto.of_first_start(auto.PRECISION, model_dir) == (
      "none", "float32, unmeasured: CPU without AVX512_BF16 or AMX "
      "(precision.json)")
  auto.record(auto.PRECISION, model_dir, "bfloat16", {"images_per_sec": {
      "none": 1000.0, "bfloat16": 1500.0}})
  assert auto.of_first_start(auto.PRECISION, model_dir) == (
      "bfloat16", "measured float32 1000 img/s, bfloat16 1500 img/s: "
      "bfloat16 (precision.json)")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
  out = tmp_path_factory.mktemp("measured")
  data_dir = fixtures.write_fashion_mnist(str(out / "data"), 101, 37)
  result = fixtures.launch(
      [os.path.join(fixtures.REPO, "tests", "workers",
                    "measured_precision.py"), str(out), data_dir],
      processes=2)
  assert result.returncode == 0, result.stderr[-3000:]
  return out, result, [json.loads((out / f"rank{r}.json").read_text())
                       for r in range(2)]


def test_every_rank_runs_rank_0s_choice_and_records_it(measured):
  out, result, ranks = measured
  assert [r["measured_policy"] for r in ranks] == ["mixed_bfloat16"] * 2
  recorded = json.loads((out / "run" / run_files.PRECISION_FILE).read_text())
  assert recorded["mode"] == "bfloat16"
  assert set(recorded["images_per_sec"]) == {"none", "bfloat16"}
  assert all(rate > 0 for rate in recorded["images_per_sec"].values())
  assert recorded["steps_per_round"] == {"none": 1, "bfloat16": 1}
  assert recorded["seconds"] > 0
  assert "--mixed_precision=auto: measured float32 " in result.stderr


def test_every_rank_sends_rank_0s_compression_and_it_is_recorded(measured):
  out, result, ranks = measured
  assert [r["measured_compression"] for r in ranks] == ["fp16"] * 2
  recorded = json.loads((out / "run" / run_files.COMMUNICATION_FILE
                         ).read_text())
  assert recorded["compression"] == "fp16"
  assert set(recorded["images_per_sec"]) == {"none", "fp16"}
  assert all(rate > 0 for rate in recorded["images_per_sec"].values())
  assert recorded["steps_per_round"] == {"none": 1, "fp16": 1}
  # What Horovod ran with: horovodrun's defaults, the engine's CPU cycle.
  assert recorded["fusion_threshold_bytes"] == 128 * 1024 * 1024
  assert recorded["cycle_time_ms"] == 3.0
  assert ("--gradient_compression=auto: measured float32 gradients "
          in result.stderr)


def test_a_resume_takes_the_recorded_choice_without_measuring(measured):
  _, result, ranks = measured
  assert [r["resumed_policy"] for r in ranks] == ["mixed_bfloat16"] * 2
  assert [r["resumed_compression"] for r in ranks] == ["fp16"] * 2
  assert [r["history"][-1]["epoch"] for r in ranks] == [2, 2]
  assert result.stderr.count("--mixed_precision=auto: measured") == 1
  assert result.stderr.count("--gradient_compression=auto: measured") == 1


def test_a_run_first_started_in_float32_resumes_in_it_under_auto(measured):
  _, _, ranks = measured
  assert [r["resumed_float32_policy"] for r in ranks] == ["float32"] * 2
  assert [r["resumed_uncompressed"] for r in ranks] == ["none"] * 2
  assert [r["resumed_float32_epoch"] for r in ranks] == [2, 2]


def test_float32_alone_is_recorded_unmeasured(measured):
  out, _, ranks = measured
  assert [r["float32_alone_policy"] for r in ranks] == ["float32"] * 2
  assert json.loads((out / "float32_alone" / run_files.PRECISION_FILE
                     ).read_text()) == {
      "mode": "none", "images_per_sec": {},
      "hardware": "CPU without AVX512_BF16 or AMX"}


def test_the_measured_run_keeps_every_rank_identical(measured):
  # In bfloat16, its gradients sent as float16: each rank gets the same
  # reduced gradient all the same.
  _, _, ranks = measured
  assert [r["max_weight_difference_across_ranks"] for r in ranks] == [0, 0]


def test_a_run_of_the_same_kind_takes_the_kept_decision_busy_or_not(
    measured):
  out, result, ranks = measured
  assert [r["kept_policy"] for r in ranks] == ["mixed_bfloat16"] * 2
  assert [r["kept_compression"] for r in ranks] == ["fp16"] * 2
  assert result.stderr.count("--mixed_precision=auto: kept for this kind "
                             "of run") == 1

  def figures(history):
    return [{k: v for k, v in epoch.items()
             if k.startswith(("train_", "val_"))} for epoch in history]
  # It trains as the run whose decision it took.
  assert [figures(r["kept_history"]) for r in ranks] == [
      figures(r["first_history"]) for r in ranks]
  for option in auto.OPTIONS:
    recorded = json.loads((out / "kept" / option.file).read_text())
    assert recorded["kept"].startswith(os.environ.get(
        "HOROVOD_ENGINE_CACHE", ""))
    assert os.path.exists(recorded["kept"])
