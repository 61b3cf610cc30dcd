"""engine.fit on two processes (`horovodrun -np 2`): the goal's fit script
(examples/fit_script.py: a tf.data pipeline, a compiled Sequential model,
CSVLogger, ReduceLROnPlateau, EarlyStopping and a callback of the user's)
with its two lines changed, started twice into one model_dir; and Keras'
GAN guide's model, its own train_step, whose ranks must stay identical."""
import csv
import json
import os

import numpy as np
import pytest

from tests import fixtures

SCRIPT = os.path.join(fixtures.REPO, "examples", "fit_script.py")
GAN = os.path.join(fixtures.REPO, "tests", "workers", "fit_gan.py")
BY_FLAGS = os.path.join(fixtures.REPO, "tests", "workers",
                        "tfdata_by_flags.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  out = tmp_path_factory.mktemp("fit")
  data = fixtures.write_fashion_mnist(str(out / "data"), num_train=512,
                                      num_test=128)
  (out / "seen").mkdir()
  env = dict(FASHION_MNIST=data, FIT_SCRIPT_CSV=str(out / "epochs.csv"),
             FIT_SCRIPT_SEEN=str(out / "seen"))
  flags = [f"--model_dir={out / 'run'}", "--epochs=3", "--progress=none"]
  first = fixtures.launch([SCRIPT, *flags], processes=2, env=env)
  assert first.returncode == 0, first.stderr[-3000:]
  # (Read before the second start, into which CSVLogger writes afresh, as
  # Keras' does without append=True.)
  with open(out / "epochs.csv") as f:
    first.csv_rows = list(csv.DictReader(f))
  again = fixtures.launch([SCRIPT, *flags], processes=2, env=env)
  assert again.returncode == 0, again.stderr[-3000:]
  gan = fixtures.launch([GAN, str(out / "gan"), "--progress=none"],
                        processes=2)
  assert gan.returncode == 0, gan.stderr[-3000:]
  (out / "by_flags").mkdir()
  by_flags = fixtures.launch(
      ["-m", "engine.train", f"--dataset={BY_FLAGS}:datasets",
       f"--model={BY_FLAGS}:classifier", f"--callbacks={BY_FLAGS}:callbacks",
       f"--model_dir={out / 'by_flags' / 'run'}", "--epochs=2",
       "--progress=none"], processes=2,
      env=dict(TFDATA_OUT=str(out / "by_flags")))
  assert by_flags.returncode == 0, by_flags.stderr[-3000:]
  return out, first, again


def test_the_fit_script_trains_on_two_processes_with_keras_callbacks(runs):
  out, first, _ = runs
  assert "2 processes on Horovod's Gloo controller" in first.stderr
  with open(out / "run" / "metrics.jsonl") as f:
    epochs = [r for r in map(json.loads, f) if "epoch" in r
              and "train_loss" in r]
  assert [r["epoch"] for r in epochs] == [1, 2, 3]
  assert epochs[-1]["val_accuracy"] > 0.5  # (10 classes: chance is 0.1)
  # CSVLogger's file, written by rank 0 alone: one row an epoch.
  rows = first.csv_rows
  assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
  assert float(rows[-1]["val_accuracy"]) == epochs[-1]["val_accuracy"]
  # The user's callback saw the same logs on both ranks.
  seen = [json.loads((out / "seen" / f"seen.{rank}.json").read_text())
          for rank in (0, 1)]
  assert seen[0] == seen[1] and len(seen[0]) == 3
  assert seen[0][-1]["val_loss"] == pytest.approx(epochs[-1]["val_loss"])


def test_a_second_start_resumes_and_trains_no_epoch_again(runs):
  out, _, again = runs
  assert "resuming" in again.stderr
  assert "epoch 1/3" not in again.stderr and "epoch 3/3" not in again.stderr
  seen = json.loads((out / "seen" / "seen.0.json").read_text())
  assert len(seen) == 3  # (not written again: no epoch ended)


def test_a_models_own_train_step_keeps_its_ranks_identical(runs):
  out, _, _ = runs
  ranks = [np.load(out / "gan" / f"rank{r}.npz") for r in (0, 1)]
  assert len(ranks[0].files) == 7  # two models' weights and a seed's state
  for name in ranks[0].files:
    np.testing.assert_array_equal(ranks[0][name], ranks[1][name])


def test_batch_hooks_get_the_epochs_figures_so_far_over_both_ranks(runs):
  out, _, _ = runs
  ranks = [json.loads((out / "gan" / f"batches{r}.json").read_text())
           for r in (0, 1)]
  assert ranks[0] == ranks[1]  # reduced: the same on both ranks
  with open(out / "gan" / "metrics.jsonl") as f:
    epochs = [r for r in map(json.loads, f) if "train_d_loss" in r]
  # 256 images, batches of 16 on 2 ranks: 8 steps an epoch; each epoch's
  # last batch logs are its figures.
  steps = [batch for batch, _ in ranks[0]]
  assert steps == list(range(8)) * 2
  for epoch, record in enumerate(epochs):
    last = ranks[0][8 * epoch + 7][1]
    assert last["d_loss"] == pytest.approx(record["train_d_loss"], rel=1e-6)
    assert last["g_loss"] == pytest.approx(record["train_g_loss"], rel=1e-6)




def test_a_tfdata_run_by_flags_keeps_its_ranks_identical_and_exact(runs):
  # --dataset's tf.data datasets, --model's compiled model, --callbacks'.
  out, _, _ = runs
  ranks = [np.load(out / "by_flags" / f"rank{r}.npz") for r in (0, 1)]
  for name in ranks[0].files:
    np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
  with open(out / "by_flags" / "run" / "metrics.jsonl") as f:
    last = [r for r in map(json.loads, f) if "val_loss" in r][-1]
  # 256 examples, batches of 16 on each of 2 ranks: 8 steps an epoch.
  assert (last["epoch"], last["global_batch"], last["global_step"]) == (
      2, 32, 16)
  # Every validation example once across the ranks: Keras' own evaluate.
  evaluated = json.loads((out / "by_flags" / "evaluated0.json").read_text())
  assert last["val_loss"] == pytest.approx(evaluated["loss"], rel=1e-5)
  assert last["val_accuracy"] == pytest.approx(evaluated["accuracy"],
                                               abs=1e-7)
