"""--steps_per_call: several steps in one call of the compiled step, under
`horovodrun -np 2` (one launch, tests/workers/steps_per_call.py), against
one step a call."""
import json
import re

import numpy as np
import pytest

from engine.loop import actions
from engine.loop import profiling
from tests import fixtures

WORKER = "tests/workers/steps_per_call.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
  data_dir = fixtures.write_fashion_mnist(
      str(tmp_path_factory.mktemp("fm")), num_train=200, num_test=50)
  out = tmp_path_factory.mktemp("out")
  result = fixtures.launch([WORKER, str(out), data_dir], processes=2)
  assert result.returncode == 0, result.stderr[-3000:]
  return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_k_steps_a_call_train_exactly_as_one_step_a_call(ranks):
  for rank in ranks:
    one, four = rank["k1"], rank["k4"]
    np.testing.assert_array_equal(four["weights"], one["weights"])
    timings = ("images_per_sec", "input_seconds", "step_seconds",
               "eval_seconds", "epoch_seconds", "cumulative_seconds", "time")
    assert four["history"] == [
        dict(r, **{k: four["history"][i][k] for k in timings})
        for i, r in enumerate(one["history"])]
    # Calls of several steps, one trace for calls of any size.
    assert one["calls"] == [1] * 20 and max(four["calls"]) > 1
    assert sum(four["calls"]) == 20 and four["traces"] == 1


def test_weights_are_identical_on_every_rank_at_every_k(ranks):
  assert [rank[run]["max_weight_difference_across_ranks"]
          for rank in ranks for run in ("k1", "k4", "k4_resumed")] == [0] * 6


def test_checkpoints_and_summaries_come_at_the_same_steps_at_any_k(ranks):
  chief = ranks[0]
  assert chief["k1"]["saves"] == [3, 6, 9, 12, 15, 18]
  assert chief["k4"]["saves"] == chief["k1"]["saves"]
  assert chief["k1"]["summaries"] == [5, 10, 15, 20]
  assert chief["k4"]["summaries"] == chief["k1"]["summaries"]
  # The calls end where something is due, and the start's first step is
  # a call of its own (its optimizer state is broadcast after it).
  assert chief["k4"]["calls"] == [1, 2, 2, 1, 3, 1, 2, 3, 3, 2]


def test_under_determinism_the_input_wait_is_step_time_at_any_k(ranks):
  """The step reads its batches inside the call, at one step a call too;
  op determinism (these runs') refuses the stamps that time their wait
  apart (TrainStep.train; tests/test_step.py times it)."""
  for run in ("k1", "k4"):
    assert all(r["input_seconds"] == 0 and r["step_seconds"] > 0
               for r in ranks[0][run]["history"])


def test_a_stop_on_one_rank_ends_a_call_and_the_resume_is_exact(ranks):
  for rank in ranks:
    stopped = rank["k4_stopped"]
    # Asked for after step 6, seen by the next call (steps 7-9): it ends
    # after its first step, on both ranks.
    assert stopped["calls"][-1] == 3 and stopped["steps_run"] == 7
    assert "at epoch 1, step 7" in stopped["stopped"]
    resumed, straight = rank["k4_resumed"], rank["k4"]
    np.testing.assert_array_equal(resumed["weights"], straight["weights"])
    assert ([r["val_loss"] for r in resumed["history"]]
            == [r["val_loss"] for r in straight["history"]])
    assert resumed["traces"] == 1


def test_images_resized_by_epoch_train_alike_at_any_k_and_resume_exactly(
    ranks):
  for rank in ranks:
    one, four = rank["resized_k1"], rank["resized_k4"]
    np.testing.assert_array_equal(four["weights"], one["weights"])
    # One step a call is traced once, for images of any size, as the calls
    # of several steps read them (it traced once per size, 12, 20 and 28,
    # on Keras 2, whose fused batch normalization rounded alike either
    # way): both compute the same steps bit for bit.
    assert (one["traces"], four["traces"]) == (1, 1)
    for k in (1, 4):
      # Asked for after step 12, stopped after step 13: in the second
      # epoch (of 20 pixels).
      assert "at epoch 2, step 3" in rank[f"resized_k{k}_stopped"]["stopped"]
      resumed = rank[f"resized_k{k}_resumed"]
      # BatchNorm's statistics included: rank 1's are rank 0's at every
      # step, so rank 0's checkpoint holds both ranks' state.
      np.testing.assert_array_equal(resumed["weights"], one["weights"])
      assert ([r["val_loss"] for r in resumed["history"]]  # epochs 2 and 3
              == [r["val_loss"] for r in one["history"][1:]])
  assert [rank[f"resized_{run}"]["max_weight_difference_across_ranks"]
          for rank in ranks for run in ("k1", "k4", "k1_resumed", "k4_resumed")
          ] == [0] * 8


def test_a_nonfinite_step_inside_a_call_is_named_as_at_one_step_a_call(
    ranks):
  for rank in ranks:
    one, four = rank["diverged_k1"], rank["diverged_k4"]
    assert one["stopped"].startswith(
        "training diverged at global step 4 (epoch 1, step 4) with learning "
        "rate 400: the gradients of ")
    # The start's first step alone, then steps 2-5 in one call: its third
    # failed, and the call ended there.
    assert four["calls"] == [1, 4]
    said = [re.sub(r"dense_\d+|diverged_k\d", "", run["stopped"])
            for run in (one, four)]
    assert said[1] == said[0]


def test_a_task_with_its_own_step_trains_alike_at_any_k(ranks):
  for rank in ranks:
    one, four = rank["gan_k1"], rank["gan_k4"]
    np.testing.assert_array_equal(four["weights"], one["weights"])
    assert ([r["val_fooled"] for r in four["history"]]
            == [r["val_fooled"] for r in one["history"]])
    assert max(four["calls"]) > 1
  assert [rank[run]["max_weight_difference_across_ranks"] for rank in ranks
          for run in ("gan_k1", "gan_k4")] == [0] * 4


@pytest.mark.parametrize("step, count, expected", [
    (1, 4, 4), (3, 4, 2), (4, 4, 1), (5, 4, 2), (6, 4, 1), (7, 4, 4)])
def test_a_profiled_window_runs_the_runs_own_calls(tmp_path, step, count,
                                                   expected):
  """A window of steps 5-6 at 4 steps a call: a call ends before it and
  at its end, and within it runs as many steps as the run's calls do."""
  profiler = profiling.StepProfiler(
      str(tmp_path), steps=(5, 6), rank=0, all_ranks=False, timeline=False,
      settings=fixtures.step_settings(steps_per_call=count))
  assert actions.steps_in_call([profiler], step - 1, at_most=count) \
      == expected


def test_windows_repeat_every_so_many_steps_in_their_order(tmp_path):
  """Windows 3-4 and 8-9, again every 10 steps: at 100 steps a call the
  calls end before each window and at its end, cycle after cycle."""
  profiler = profiling.StepProfiler(
      str(tmp_path), steps=(3, 4, 8, 9), every=10, rank=0, all_ranks=False,
      timeline=False, settings=fixtures.step_settings(steps_per_call=100))
  ends, global_step = [], 0
  while global_step < 30:
    global_step += actions.steps_in_call([profiler], global_step,
                                         at_most=30 - global_step)
    ends.append(global_step)
  assert ends == [2, 4, 7, 9, 12, 14, 17, 19, 22, 24, 27, 29, 30]
