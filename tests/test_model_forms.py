"""A model as Keras users write one, in each form, trains, resumes, is
evaluated and exported with nothing lost: in this process, with the
engine's own train step (tests/test_loop.py's run_loop), on the models of
tests/workers/model_forms.py, each with BatchNorm statistics (the
variables no optimizer holds); and the subclassed one on two processes,
from a script (tests/workers/model_forms_run.py).

A run stopped at an epoch's end and again mid-epoch, and resumed each
time, must end bit-identical in every variable and every figure,
validation included, to the run that went on; engine.evaluate of its
checkpoint gives its last validation figures; its best export predicts as
its best epoch did.
"""
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from engine import evaluate
from engine import train as train_lib
from engine.datasets import fashion_mnist
from engine.loop import preemption
from tests import fixtures
from tests.test_loop import STEPS_PER_EPOCH
from tests.test_loop import peer_sent_sigterm  # pylint: disable=unused-import
from tests.test_loop import records
from tests.test_loop import run_loop

FORMS = os.path.join(fixtures.REPO, "tests", "workers", "model_forms.py")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("data")))


def trained(parts):
  return [*parts.model.variables, *parts.optimizer.variables]


def stored_test_split(data_dir):
  """The test split as stored, and its labels."""
  def read(kind):
    return fashion_mnist.read_idx(os.path.join(
        data_dir, fashion_mnist.FILES[f"test_{kind}"] + ".gz"))
  return read("images")[..., None], read("labels")


@pytest.mark.usefixtures("peer_sent_sigterm")
@pytest.mark.parametrize("form", ["listed", "sequential", "functional",
                                  "applications"])
def test_a_model_in_each_form_resumes_evaluates_and_exports_as_it_trained(
    data_dir, tmp_path, form):
  run = dict(model=dict(name=f"{FORMS}:{form}"),
             performance=dict(steps_per_call=1),
             training=dict(epochs=2))
  went_on, _, parts = run_loop(data_dir, tmp_path / "on", faulty={}, **run)
  # Stopped (another rank's SIGTERM, agreed) after the first epoch's last
  # step, then at step 5 of the second.
  for stop_at, where in ((STEPS_PER_EPOCH, "epoch 1, step 18"),
                         (STEPS_PER_EPOCH + 5, "epoch 2, step 5")):
    with pytest.raises(preemption.Preempted, match=f"by SIGTERM at {where}"):
      run_loop(data_dir, tmp_path / "stopped",
               faulty=dict(peer_stop_at=stop_at), **run)
  # The last start as engine.train runs it: to its end, and its exports.
  config = parts.config.replace(
      training=dict(model_dir=str(tmp_path / "stopped")))
  ended = train_lib.train(config)
  resumed = ended.history
  assert [r["epoch"] for r in went_on] == [1, 2]
  assert [r["epoch"] for r in resumed] == [2]
  figures = [{k: v for k, v in r.items() if k.startswith(("train_", "val_"))}
             for r in records(tmp_path / "stopped")]
  assert figures == [{k: v for k, v in r.items()
                      if k.startswith(("train_", "val_"))}
                     for r in records(tmp_path / "on")]
  for ours, theirs in zip([*ended.model.variables,
                           *ended.train_step.optimizer.variables],
                          trained(parts), strict=True):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy(),
                                  err_msg=ours.path)
  # engine.evaluate of the latest checkpoint: the last epoch's validation.
  _, result, _ = evaluate.evaluate(config, "latest")
  for name, value in result.figures.items():
    assert value == pytest.approx(resumed[-1][f"val_{name}"], rel=1e-6,
                                  abs=1e-7), name
  # The best export, on the test split as stored: the best epoch's figures.
  best = max(went_on, key=lambda r: r["val_accuracy"])
  images, labels = stored_test_split(data_dir)
  served = tf.saved_model.load(str(tmp_path / "stopped" / "export" / "best")
                               ).signatures["serving_default"](
                                   tf.constant(images))
  logits = served["logits"].numpy()
  assert np.mean(logits.argmax(-1) == labels) == pytest.approx(
      best["val_accuracy"], abs=1e-9)
  assert float(np.mean(keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True))) == pytest.approx(
          best["val_loss"], rel=1e-4)


# Two processes: the subclassed model run straight, and stopped mid-epoch
# by a SIGTERM on rank 1 then resumed.

WORKER = os.path.join(fixtures.REPO, "tests", "workers", "model_forms_run.py")
STOP_AT = STEPS_PER_EPOCH + 5  # 601 examples in global batches of 2 x 16


@pytest.fixture(scope="module")
def two_processes(data_dir, tmp_path_factory):
  out = tmp_path_factory.mktemp("two")

  def launch(name, stop_at=0):
    return fixtures.launch([WORKER, data_dir, str(out / name), str(stop_at)],
                           processes=2)

  straight = launch("straight")
  assert straight.returncode == 0, straight.stderr[-3000:]
  stopped = launch("stopped", STOP_AT)
  assert stopped.returncode != 0
  # (at the step boundary after the signal: mid-epoch)
  assert re.search(r"stopped by SIGTERM at epoch 2, step [5-9]; saved",
                   stopped.stderr), stopped.stderr[-3000:]
  resumed = launch("stopped")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  return out


def checkpointed(model_dir):
  reader = tf.train.load_checkpoint(str(model_dir / "checkpoints"))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith(("model_variables/", "optimizer_variables/"))}


def test_two_processes_resume_a_subclassed_model_as_it_went_on(
    two_processes):
  straight, stopped = two_processes / "straight", two_processes / "stopped"
  figures = [[{k: v for k, v in r.items() if k.startswith(("train_", "val_"))}
              for r in records(run)] for run in (straight, stopped)]
  assert len(figures[0]) == 2 and figures[0] == figures[1]
  ours, theirs = checkpointed(stopped), checkpointed(straight)
  assert ours.keys() == theirs.keys()
  # Every variable, the BatchNorm statistics among them.
  assert len([k for k in ours if k.startswith("model_variables/")]) == 26
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  # And on both ranks alike.
  ranks = [np.load(stopped / f"rank{r}.npz") for r in (0, 1)]
  assert len(ranks[0].files) == 26
  for name in ranks[0].files:
    np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
