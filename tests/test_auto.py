"""The `auto` options' decisions kept for a kind of run
(engine/compute/auto.py), in this process: the same kind takes the kept
decision unmeasured, another kind (model, batch, processes) measures anew,
--remeasure_auto measures again, and a measurement's own spread widens
the margin. On two processes, with a busy process beside them:
tests/test_precision.py."""
import json
import os

import keras
import pytest
import tensorflow as tf

from engine import distributed
from engine.compute import auto
from engine.compute import precision
from tests import fixtures


def cnn(filters=4):
  keras.utils.set_random_seed(0)
  inputs = keras.Input((28, 28, 1))
  x = keras.layers.Conv2D(filters, 3)(inputs)
  x = keras.layers.GlobalAveragePooling2D()(x)
  return keras.Model(inputs, keras.layers.Dense(10)(x))


def world(size=1):
  return distributed.World(rank=0, size=size, device="CPU",
                           intra_op_threads=2, inter_op_threads=2)


@pytest.fixture
def measurements(monkeypatch, tmp_path):
  """Each measurement `timed` makes (bfloat16 measured 1.5x float32),
  on hardware of both modes, with a cache of this test's own."""
  distributed.start_horovod()
  monkeypatch.setenv("HOROVOD_ENGINE_CACHE", str(tmp_path / "cache"))
  monkeypatch.setattr(precision, "native", lambda cpu_flags=None: (
      ("none", "bfloat16"), "CPU with AVX512_BF16"))
  made = []

  def timed(config, world_, splits, train_steps, name):
    made.append((name, config.training.batch_size))
    return dict(images_per_sec={"none": 1000.0, "bfloat16": 1500.0},
                steps_per_round={"none": 2, "bfloat16": 2}, margin=0.05)

  monkeypatch.setattr(auto, "timed", timed)
  return made


def decided(config, model, size=1):
  mode, _ = auto.decide(config, world(size), precision.Choice("bfloat16"),
                        None, plain_task(), lambda *a: None, model)
  return mode


def plain_task():
  class Task:  # what decide asks of a task: its own optimizers, if any
    optimizers = ()
  return Task()


def test_a_run_of_the_same_kind_takes_the_kept_decision(measurements,
                                                        tmp_path):
  config = fixtures.train_config(performance=dict(mixed_precision="auto"))
  first = decided(config, cnn())
  assert first.mode == "bfloat16" and len(measurements) == 1
  again = decided(config, cnn())
  assert again.mode == "bfloat16" and len(measurements) == 1
  assert again.why.startswith("kept for this kind of run (")
  assert again.figures["images_per_sec"] == first.figures["images_per_sec"]
  kept, = os.listdir(tmp_path / "cache" / "auto")
  assert kept.startswith("mixed_precision-")
  assert json.loads((tmp_path / "cache" / "auto" / kept).read_text())[
      "kind"]["batch_size"] == config.training.batch_size


@pytest.mark.parametrize("change", ["model", "batch", "processes", "remeasure"])
def test_another_kind_of_run_or_remeasure_auto_measures_anew(measurements,
                                                             change):
  config = fixtures.train_config(performance=dict(mixed_precision="auto"))
  decided(config, cnn())
  model, size = cnn(), 1
  if change == "model":
    model = cnn(filters=8)
  elif change == "batch":
    config = config.replace(training=dict(
        batch_size=config.training.batch_size * 2))
  elif change == "processes":
    size = 2
  else:
    config = config.replace(performance=dict(remeasure_auto=True))
  kind = auto.kind_of_run(config, world(size), model)
  assert kind != auto.kind_of_run(
      fixtures.train_config(performance=dict(mixed_precision="auto")),
      world(), cnn()) or change == "remeasure"
  if change == "processes":  # a process alone measures; two need peers
    assert auto.kept_path(auto.PRECISION, kind) != auto.kept_path(
        auto.PRECISION, auto.kind_of_run(config, world(), cnn()))
    return
  decided(config, model)
  assert len(measurements) == 2


def test_a_damaged_kept_decision_is_measured_again_and_replaced(
    measurements, tmp_path):
  config = fixtures.train_config(performance=dict(mixed_precision="auto"))
  decided(config, cnn())
  kept, = (tmp_path / "cache" / "auto").iterdir()
  kept.write_text('{"mode": "float8"')
  assert decided(config, cnn()).mode == "bfloat16"
  assert len(measurements) == 2
  assert json.loads(kept.read_text())["mode"] == "bfloat16"


def test_a_cache_that_cannot_be_written_is_one_warning(measurements,
                                                      monkeypatch, tmp_path,
                                                      caplog):
  (tmp_path / "file").write_text("")
  monkeypatch.setenv("HOROVOD_ENGINE_CACHE", str(tmp_path / "file"))
  config = fixtures.train_config(performance=dict(mixed_precision="auto"))
  assert decided(config, cnn()).mode == "bfloat16"
  warnings = [r.getMessage() for r in caplog.records
              if "is not kept" in r.getMessage()]
  assert len(warnings) == 1
  assert warnings[0].startswith("--mixed_precision=auto: its decision is not "
                                "kept (")


@pytest.mark.parametrize("rounds, chosen", [
    # 8% faster, its rounds within 3%: it pays.
    ({"none": [1.0, 1.01, 1.03], "bfloat16": [0.93, 0.92, 0.925]},
     "bfloat16"),
    # 8% faster, but a round 20% off its median: not resolved.
    ({"none": [1.0, 1.2, 1.0], "bfloat16": [0.92, 0.93, 0.92]}, "none"),
])
def test_a_measurement_wins_only_beyond_its_own_spread(monkeypatch, rounds,
                                                       chosen):
  clock = iter([0.0, 1.0] * 2 + [t for r in range(3) for v in (
      ("none", "bfloat16") if r % 2 == 0 else ("bfloat16", "none"))
      for t in (0.0, rounds[v][r])])
  monkeypatch.setattr(auto.time, "perf_counter", lambda: next(clock))
  monkeypatch.setattr(auto.datasets.TrainingStream, "batches", lambda *a, **k: (
      tf.data.Dataset.from_tensors((tf.zeros([4, 2]), [0] * 4)).repeat(8)))
  monkeypatch.setattr(auto, "MEASURED_SECONDS", 1e-9)  # one step a round
  monkeypatch.setattr(auto, "MEASURED_ROUNDS", 3)
  distributed.start_horovod()
  config = fixtures.train_config()
  class Step:  # a variant's train step, as long as the clock says
    def start(self, batches):
      del batches

    def train(self, num_steps):
      del num_steps

  figures = auto.timed(config, world(), no_splits(), {
      "none": Step(), "bfloat16": Step()}, "t")
  assert auto.choose(figures) == chosen


def no_splits():
  class Splits:  # what timed's stream is set up from, never read here
    train = info = None
  return Splits()
