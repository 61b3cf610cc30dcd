"""Real multi-process runs: `horovodrun -np 2` on small generated data.

Three launches for the whole module (module-scoped fixtures), each asserted
on by several tests: the checks worker at 2 processes and at 1 (the
reference), and the command line at 2 processes.
"""
import json
import os

import numpy as np
import pytest

from tests import fixtures

WORKER = os.path.join(fixtures.REPO, "tests", "workers",
                      "multiprocess_checks.py")
NUM_TRAIN, NUM_TEST = 601, 101  # odd: shards of unequal size


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


def test_steps_are_traced_once_per_run(two):
  _, ranks = two
  assert [(r["train_traces"], r["eval_traces"]) for r in ranks] == [(1, 1)] * 2


def test_two_processes_with_batch_b_step_like_one_with_batch_2b(one, two):
  reference = np.load(one[0] / "step_weights.npz")
  distributed = np.load(two[0] / "step_weights.npz")
  assert len(reference.files) == len(distributed.files) > 0
  for name in reference.files:
    np.testing.assert_allclose(distributed[name], reference[name],
                               rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def command_line(data_dir, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("cli") / "run"
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}", "--epochs=2",
       "--batch_size=32", "--steps_per_epoch=12", f"--model_dir={model_dir}",
       "--warmup_epochs=1", "--lr_schedule=step", "--lr_decay_epochs=1"],
      processes=2)
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
  assert len(list((model_dir / "tensorboard").glob("events.*"))) == 1


def test_only_rank_zero_narrates(command_line):
  _, result = command_line
  lines = result.stdout.splitlines() + result.stderr.splitlines()
  assert any(l.startswith("[0]") and "epoch 2/2" in l for l in lines)
  assert any(l.startswith("[0]") and "final test loss" in l for l in lines)
  assert not [l for l in lines if l.startswith("[1]<stderr>:I")]


@pytest.mark.parametrize("dataset", ["cifar10", "synthetic", "tfrecord"])
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
