"""Real multi-process runs: `horovodrun -np 2` on small generated data.

Four launches for the whole module (module-scoped fixtures), each asserted
on by several tests: the checks worker at 2 processes and at 1 (the
reference), the command line at 2 processes, and a run with one rank
slowed on purpose.
"""
import json
import os
import re

import numpy as np
import pytest
from xprof.convert import raw_to_tool_data

from engine.records import step_report
from tests import fixtures

WORKER = os.path.join(fixtures.REPO, "tests", "workers",
                      "multiprocess_checks.py")
NUM_TRAIN, NUM_TEST = 601, 101  # odd: shards of unequal size
# What `horovodrun --cycle-time-ms=2` sets; not the engine's default on CPU.
USERS_CYCLE_TIME_MS = "2"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      NUM_TRAIN, NUM_TEST)


def run_worker(processes, out_dir, *data_dirs):
  result = fixtures.launch([WORKER, str(out_dir), *data_dirs],
                           processes=processes)
  assert result.returncode == 0, result.stderr[-3000:]
  return [json.loads((out_dir / f"rank{r}.json").read_text())
          for r in range(processes)]


@pytest.fixture(scope="module")
def two(data_dir, tmp_path_factory):
  out = tmp_path_factory.mktemp("two")
  cifar10 = fixtures.write_cifar10(str(tmp_path_factory.mktemp("cifar")),
                                   num_per_batch=9, num_test=11, layout="tar")
  records = fixtures.write_tfrecords(str(tmp_path_factory.mktemp("records")),
                                     num_files=3, per_file=10)
  return out, run_worker(2, out, data_dir, cifar10, records)


@pytest.fixture(scope="module")
def one(data_dir, tmp_path_factory):
  out = tmp_path_factory.mktemp("one")
  return out, run_worker(1, out, data_dir)


def test_weights_are_identical_on_every_rank_after_training(two):
  _, ranks = two
  assert [r["max_weight_difference_across_ranks"] for r in ranks] == [0, 0]


def test_validation_figures_are_exactly_the_full_test_sets(two):
  _, ranks = two
  for r in ranks:
    assert r["reported_val_loss"] == pytest.approx(r["full_test_loss"],
                                                   rel=1e-5)
    assert r["reported_val_accuracy"] == r["full_test_accuracy"]
  reduced = ("train_loss", "train_accuracy", "val_loss", "val_accuracy")
  assert [[h[k] for k in reduced] for h in ranks[0]["history"]] == \
         [[h[k] for k in reduced] for h in ranks[1]["history"]]


def test_every_rank_ran_the_same_whole_epochs(one, two):
  for processes, (_, ranks) in ((1, one), (2, two)):
    steps = NUM_TRAIN // (16 * processes)
    assert [r["global_step"] for r in ranks] == [2 * steps] * processes
    assert [h["world_size"] for h in ranks[0]["history"]] == [processes] * 2


def test_a_scripts_action_runs_on_every_rank_at_the_same_steps(one, two):
  # engine.train.run(actions=[actions.Every(2, ...)]): a collective in it
  # meets every rank's at each even step, at the position the loop holds.
  for processes, (_, ranks) in ((1, one), (2, two)):
    steps = NUM_TRAIN // (16 * processes)
    expected = [[g, (g - 1) // steps, g - (g - 1) // steps * steps,
                 processes, processes * (processes + 1) / 2]
                for g in range(2, 2 * steps + 1, 2)]
    assert [r["action_runs"] for r in ranks] == [expected] * processes


def test_steps_are_traced_once_per_run(two):
  _, ranks = two
  assert [(r["train_traces"], r["eval_traces"]) for r in ranks] == [(1, 1)] * 2


def test_keras_3_variables_are_broadcast_and_averaged_across_ranks(two):
  """Each rank's held rank + 1: the broadcast kernel is rank 0's on both,
  the averaged bias the mean of 1 and 2."""
  _, ranks = two
  assert [r["keras_variables"] for r in ranks] == [
      {"broadcast": [[1.0, 1.0]] * 3, "averaged": [1.5, 1.5]}] * 2


def test_rank_0_alone_gathers_every_ranks_value(one, two):
  """One alltoall that sends each rank's bytes to rank 0 alone (the step
  report's series): rank 0 holds both ranks' values, rank 1 none."""
  assert [r["gathered_on_chief"] for r in two[1]] == [
      [{"rank": 0, "series": [0, 1]}, {"rank": 1, "series": [0, 1, 2]}], None]
  assert one[1][0]["gathered_on_chief"] == [{"rank": 0, "series": [0, 1]}]


def test_a_stop_one_rank_asks_for_stops_every_rank(one, two):
  # Rank 1 alone asked to stop, then no rank did.
  assert [r["stops"] for r in two[1]] == [[True, False]] * 2
  assert [r["stops"] for r in one[1]] == [[False, False]]  # rank 0 did not


def step_weights(out_dir, variant):
  saved = np.load(out_dir / f"step_weights_{variant}.npz")
  assert saved["traces"] == 1
  assert saved["max_difference_across_ranks"] == 0
  return saved["weights"]


def test_two_processes_with_batch_b_step_like_one_with_batch_2b(one, two):
  reference = step_weights(one[0], "plain")
  np.testing.assert_allclose(step_weights(two[0], "plain"), reference,
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["accumulated", "xla", "overlapped"])
def test_accumulation_xla_and_overlap_take_the_same_step(one, two, variant):
  """Two micro-batches of B/2 per rank, an XLA-compiled pass, or each
  gradient reduced on its own as on GPU (CPU reduces them in one group):
  the step of one process on the whole batch, to float32 rounding."""
  np.testing.assert_allclose(step_weights(two[0], variant),
                             step_weights(one[0], "plain"),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant, largest", [
    ("fp16_compressed", 5e-4), ("float16", 1e-2), ("bfloat16", 3e-2)])
def test_16_bit_options_round_but_take_the_same_step(one, two, variant,
                                                     largest):
  """Close to the float32 step (a missing unscale or a wrong reduction would
  be far off), and not equal to it: the 16-bit path was taken."""
  difference = np.abs(step_weights(two[0], variant) -
                      step_weights(one[0], "plain")).max()
  assert 1e-7 < difference < largest


@pytest.fixture(scope="module")
def command_line(data_dir, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("cli") / "run"
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}", "--epochs=2",
       "--batch_size=32", "--steps_per_epoch=12", f"--model_dir={model_dir}",
       "--warmup_epochs=1", "--lr_schedule=step", "--lr_decay_epochs=1",
       "--profile_steps=3,5", "--horovod_timeline"],
      processes=2, env={"HOROVOD_CYCLE_TIME": USERS_CYCLE_TIME_MS})
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir, result


def test_metrics_jsonl_has_one_record_per_epoch(command_line):
  model_dir, _ = command_line
  records = [json.loads(line) for line in
             (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["epoch"] for r in records] == [1, 2]
  assert [r["global_step"] for r in records] == [12, 24]  # 12 > one shard
  for r in records:
    assert {"train_loss", "train_accuracy", "val_loss", "val_accuracy",
            "learning_rate", "images_per_sec", "epoch_seconds",
            "cumulative_seconds"} <= r.keys()
    assert r["world_size"] == 2
    # The train time's split: both measured, within the epoch.
    assert 0 < r["input_seconds"] and 0 < r["step_seconds"]
    assert r["input_seconds"] + r["step_seconds"] < r["epoch_seconds"]
  assert records[1]["cumulative_seconds"] > records[0]["cumulative_seconds"]


def test_reported_learning_rate_is_the_one_applied_last_in_the_epoch(
    command_line):
  model_dir, _ = command_line
  records = [json.loads(line) for line in
             (model_dir / "metrics.jsonl").read_text().splitlines()]
  # base 0.001, x2 processes; warmup over 12 steps, then x0.1 from epoch 1.
  # Step 11 (the last of epoch 1) is still warming up; step 23 is decayed.
  assert records[0]["learning_rate"] == pytest.approx(0.001 + 0.001 * 11 / 12)
  assert records[1]["learning_rate"] == pytest.approx(0.0002)


def test_only_rank_zero_writes_tensorboard_summaries(command_line):
  model_dir, _ = command_line
  for run in ("", "train", "validation"):  # report.Reporter's layout
    assert len(list((model_dir / "tensorboard" / run).glob("events.*"))) == 1


def test_tensorboard_gets_the_confusion_matrix_each_epoch_and_classes_txt(
    command_line):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  model_dir, _ = command_line
  [events] = (model_dir / "tensorboard" / "validation").glob("events.*")
  epochs = [event.step for event in tf.compat.v1.train.summary_iterator(
      str(events)) for value in event.summary.value
            if value.tag == "confusion_matrix"]
  assert epochs == [1, 2]
  assert (model_dir / "classes.txt").read_text().splitlines()[-1] == \
      "Ankle boot"


def xplanes(profile_dir):
  """The profiler's files, in the layout TensorBoard's profile plugin reads."""
  return list(profile_dir.glob("plugins/profile/*/*.xplane.pb"))


def overview_steps(xplane):
  """The steps TensorBoard's profile overview lists, with their times."""
  page, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)],
                                                 "overview_page^", {})
  [steps] = [table for table in json.loads(page)
             if [c["id"] for c in table.get("cols", [])][:1] == ["stepnum"]]
  return [row["c"][0]["v"] for row in steps["rows"]]


def marked_steps(xplane):
  """The step markers the trace viewer shows."""
  trace, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)],
                                                  "trace_viewer^", {})
  return [int(event["args"]["step_num"])
          for event in json.loads(trace)["traceEvents"]
          if "step_num" in event.get("args", {})]


def test_profile_steps_trace_rank_zero_with_step_markers(command_line):
  model_dir, result = command_line
  [trace] = xplanes(model_dir / "profile")
  assert overview_steps(trace) == ["train 3", "train 4", "train 5"]
  assert marked_steps(trace) == [3, 4, 5]
  assert not list((model_dir / "profile").glob("rank_*"))
  assert "profiling steps 3 to 5" in result.stderr


def test_the_profiled_steps_report_each_ranks_step_split(command_line):
  """Every rank times its own window; rank 0 writes the ranks side by
  side: the first profiled step (which traces the timed step) left out,
  each part of the step on the host or in the graph, the phases inside
  the call that ran them, and the slowest rank named."""
  model_dir, result = command_line
  report = json.loads((model_dir / "profile" / "step_report.json")
                      .read_text())
  assert report["window"] == [4, 5] and len(report["ranks"]) == 2
  for rank, figures in enumerate(report["ranks"]):
    parts = figures["parts"]
    assert figures["rank"] == rank and figures["steps"] == 2
    assert list(parts) == ["input", "forward", "backward", "communication",
                           "optimizer", "launch_and_read", "between_calls"]
    assert all(seconds > 0 for seconds in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(figures["step"])
    assert 0 < figures["in_graph"] <= 1
    assert figures["waiting"] == pytest.approx(
        parts["communication"] - report["transfer"])
  assert min(r["waiting"] for r in report["ranks"]) == 0
  busy = [r["busy"] for r in report["ranks"]]
  assert busy[report["slowest_rank"]] == max(busy)
  assert "step report of steps 4-5 in " in result.stderr
  assert f"slowest rank {report['slowest_rank']}, busy " in result.stderr
  # The verdict is the largest part of the slowest rank's step.
  slowest = report["ranks"][report["slowest_rank"]]["parts"]
  groups = {bound: sum(slowest[part] for part in parts)
            for bound, parts in step_report.BOUNDS.items()}
  assert report["verdict"]["bound"] == max(groups, key=groups.get)
  assert f"{report['verdict']['bound']}-bound: " in result.stderr
  assert b"profile/report" in b"".join(
      path.read_bytes() for path in (model_dir / "tensorboard" / "train")
      .glob("events.*"))


@pytest.fixture(scope="module")
def slowed(data_dir, tmp_path_factory):
  """Rank 1's forward pass sleeps 80 ms; two micro-batches a step, two
  steps a call, and a window that runs past the run's 8 steps, recorded in
  Horovod's timeline too. (At 30 ms a busy machine once slowed rank 0
  more, in a CI run.)"""
  model_dir = tmp_path_factory.mktemp("slowed") / "run"
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}", "--epochs=2",
       "--batch_size=16", "--grad_accum_steps=2", "--steps_per_epoch=4",
       "--steps_per_call=2", f"--model_dir={model_dir}",
       "--model=tests/workers/slowed_model.py:conv_net",
       "--profile_steps=3,20", "--horovod_timeline"],
      processes=2, env=dict(SLOWED_RANK="1", SLOWED_MS="80"))
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir, result


def test_a_slowed_rank_is_named_with_where_its_time_goes(slowed):
  """Reported at the run's end, on the calls the window had (its first,
  which traced the timed call, left out): the run's own calls of two
  steps, with the slowest rank's extra time where the sleep put it: the
  others wait for it in the allreduce."""
  model_dir, result = slowed
  report = json.loads((model_dir / "profile" / "step_report.json")
                      .read_text())
  assert report["window"] == [5, 8]
  assert [(r["steps"], r["calls"]) for r in report["ranks"]] == [(4, 2)] * 2
  assert report["slowest_rank"] == 1 and report["slowest_in"] == "compute"
  # Two forward passes a step, 80 ms each, on rank 1 alone.
  assert report["slowest_by"] > 0.04
  assert report["ranks"][0]["waiting"] > 0.04
  assert report["ranks"][1]["waiting"] == 0
  # What bounds it is the figures' (on a busy machine, the transfer can
  # outgrow rank 1's compute): the largest part of rank 1's step.
  slowest = report["ranks"][1]["parts"]
  groups = {bound: sum(slowest[part] for part in parts)
            for bound, parts in step_report.BOUNDS.items()}
  assert report["verdict"]["bound"] == max(groups, key=groups.get)
  assert report["verdict"]["straggler"].startswith(
      "rank 1 computes longer than the others")
  assert "step report of steps 5-8 in " in result.stderr
  assert "a straggler: rank 1 computes longer" in result.stderr


def test_the_timeline_splits_a_waiting_ranks_communication(slowed):
  """Rank 0 waits for rank 1's sleep in its negotiation: its communication
  grows, and the collective itself, from Horovod's timeline, does not."""
  model_dir, result = slowed
  report = json.loads((model_dir / "profile" / "step_report.json")
                      .read_text())
  collective = report["collective"]
  assert collective["source"] == "Horovod's timeline"
  assert len(collective["series"]) == 2  # the window's calls
  assert 0 < collective["seconds"] < 0.04
  first, second = report["ranks"]
  assert first["negotiation"] > 0.04 + second["negotiation"]
  assert first["negotiation"] + collective["seconds"] == pytest.approx(
      first["parts"]["communication"], abs=1e-3)
  assert ("communication, from Horovod's timeline: the collective itself "
          in result.stderr)


def test_horovod_timeline_records_the_profiled_steps_allreduces(
    command_line):
  model_dir, _ = command_line
  events = json.loads((model_dir / "timeline.json").read_text())
  names = {e.get("name") for e in events}
  assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= names
  # Steps 3 to 5 only: a few dozen allreduces, not the run's 24 steps' worth.
  allreduces = [e for e in events if e.get("name") == "ALLREDUCE"]
  assert 3 <= len(allreduces) < 24 * 3


def test_horovod_cycles_every_3_ms_on_cpu_unless_the_user_says(two,
                                                              command_line):
  """And MPI, should the run use it, yields its core while it waits."""
  _, ranks = two
  assert [r["horovod_cycle_time"] for r in ranks] == ["3", "3"]
  assert [r["mpi_yield_when_idle"] for r in ranks] == ["1", "1"]
  _, result = command_line
  assert re.search(r"^\[0\]<stderr>:I.*Horovod cycle 2 ms$",
                   result.stderr, re.MULTILINE)


def test_horovods_threads_run_at_idle_priority_on_cpu(two):
  """Its background loop and Gloo's transport (at least one transport
  loop); TensorFlow's threads and the rest stay at normal priority."""
  _, ranks = two
  for r in ranks:
    assert r["threads_by_policy"]["idle"] >= 2, r["threads_by_policy"]
    assert r["threads_by_policy"]["normal"] > r["threads_by_policy"]["idle"]
    assert "other" not in r["threads_by_policy"]


def test_only_rank_zero_narrates(command_line):
  _, result = command_line
  lines = result.stdout.splitlines() + result.stderr.splitlines()
  assert any(l.startswith("[0]") and "epoch 2/2" in l for l in lines)
  assert any(l.startswith("[0]") and "final test loss" in l for l in lines)
  assert not [l for l in lines if l.startswith("[1]<stderr>:I")]


@pytest.mark.parametrize("dataset", ["cifar10", "synthetic", "tfrecord",
                                     "users_model"])
def test_each_data_set_trains_on_two_processes(two, dataset):
  _, ranks = two
  runs = [r["datasets"][dataset] for r in ranks]
  assert [r["global_step"] for r in runs] == [6, 6]
  assert [r["max_weight_difference_across_ranks"] for r in runs] == [0, 0]
  for r in runs:
    assert r["reported_val_loss"] == pytest.approx(r["full_test_loss"],
                                                   rel=1e-5)
    assert r["reported_val_accuracy"] == r["full_test_accuracy"]
    assert (r["train_traces"], r["eval_traces"]) == (1, 1)
  # synthetic runs with --ema_decay: the average, updated once a step, is
  # part of what must be identical across ranks (above), and what the
  # reported figures evaluated.
  assert [r["weight_average_updates"] for r in runs] == (
      [6, 6] if dataset == "synthetic" else [None, None])


def test_a_users_model_trains_its_batch_norm_fused_on_two_processes(two):
  """A subclassed model of a user's (the "users_model" run above: the same
  weights and moving statistics on both ranks, validation figures of the
  whole test set), its keras.layers.BatchNormalization trained through
  the fused kernel on both."""
  _, ranks = two
  assert [r["datasets"]["users_model"]["fused_batch_norms"]
          for r in ranks] == [1, 1]


def test_performance_options_train_together_on_two_processes(two):
  """float16 with loss scaling, fp16 gradient compression and 2 micro-batches
  per step, profiled on every rank: a real run, on one model everywhere."""
  out, ranks = two
  runs = [r["options"] for r in ranks]
  # 601 examples / (8 per micro-batch x 2 micro-batches x 2 processes).
  assert [r["global_step"] for r in runs] == [2 * 18] * 2
  assert [r["max_weight_difference_across_ranks"] for r in runs] == [0, 0]
  assert [(r["train_traces"], r["eval_traces"]) for r in runs] == [(1, 1)] * 2
  history = runs[0]["history"]
  assert history[-1]["train_loss"] < history[0]["train_loss"]
  profile = out / "options" / "profile"
  for rank_dir in (profile, profile / "rank_1"):
    [trace] = xplanes(rank_dir)
    # With --grad_accum_steps the overview lists no steps (TensorFlow 2.15's
    # profiler); the trace viewer has them.
    assert marked_steps(trace) == [2, 3]
