"""The train loop's decisions, in this process, with a fake train step
(engine/loop/loop.py's TrainLoop, engine/loop/actions.py,
engine/loop/epoch_end.py, engine/loop/run_state.py).

The fake step takes no gradient: it moves the optimizer's step counter,
counts its batches in the epoch's sums, records each call's steps and the
first batch each call reads, and fails or stops at the steps a test says.
Everything else is the engine's own: the data, the model_dir and its
checkpoints, evaluation, the actions. What needs ranks (identical weights,
agreement on a stop or a failure) is pinned by the multi-process tests.
"""
import dataclasses
import json
import os
import signal

import numpy as np
import optuna
import pytest
import tensorflow as tf

from engine import build
from engine import distributed
from engine import train as train_lib
from engine.compute import metrics
from engine.compute import optimizers
from engine.compute import step as steps
from engine.core.errors import Diverged
from engine.core.errors import UserError
from engine.datasets import Augmentation, Epochs, Shard
from engine.distributed import elastic
from engine import datasets
from engine.loop import actions
from engine.loop import preemption
from engine.loop.loop import TrainLoop
from engine.loop.parts import TrainingParts
from engine.sweeps import space, study
from tests import fixtures

# fixtures.write_fashion_mnist's 601 training examples in batches of 32.
STEPS_PER_EPOCH = 18


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("data")))


class FakeStep:
  """The train step's interface, without training."""

  def __init__(self, parts: TrainingParts, *, nonfinite_at=(),
               peer_stop_at=None):
    self.task = parts.task
    self._optimizer = parts.optimizer
    self.totals = metrics.Totals("train_totals", parts.task)
    self.skipped_steps = 0
    self.gradient_bytes = parts.train_step.gradient_bytes
    self.calls = []  # (first global step, steps taken)
    self.first_batches = []  # the labels of each call's first batch
    self._nonfinite_at = set(nonfinite_at)
    self._peer_stop_at = peer_stop_at

  def reset_counts(self) -> None:
    self.totals.reset()
    self.skipped_steps = 0

  def start(self, batches) -> None:
    self._batches = iter(batches)

  def train(self, num_steps, stop_requested=False, timed=False):
    del timed
    first = optimizers.step(self._optimizer) + 1
    ran = 0
    for ran in range(1, num_steps + 1):
      images, labels = next(self._batches)
      if ran == 1:
        self.first_batches.append(labels.numpy().tolist())
      self._optimizer.iterations.assign_add(1)
      self.totals.update(labels, tf.one_hot(labels, 10),
                         tf.zeros(tf.shape(labels)[0]))
      global_step = first + ran - 1
      if global_step in self._nonfinite_at:
        self._nonfinite_at.remove(global_step)
        self.calls.append((first, ran))
        raise steps.NonFinite("the loss was nan", step=ran)
      if global_step == self._peer_stop_at:
        # Another rank asked to stop, and this step agreed on it: not this
        # rank's request, which has none.
        self.calls.append((first, ran))
        return trained_call(ran, True)
    self.calls.append((first, ran))
    return trained_call(ran, bool(stop_requested))  # this rank's: all agree


def trained_call(ran: int, stop_agreed: bool) -> steps.Trained:
  return steps.Trained(steps=ran, stop_agreed=stop_agreed, input_seconds=0.0,
                       phases={})


class FaultyStep:
  """The engine's train step, which asks to stop and reports non-finite
  steps at the global steps a test says (after taking them: the rollback
  that follows undoes them), where a call ends (at one step a call, every
  step)."""

  def __init__(self, step, *, nonfinite_at=(), peer_stop_at=None):
    self._step = step
    self._nonfinite_at = set(nonfinite_at)
    self._peer_stop_at = peer_stop_at

  def __getattr__(self, name):
    return getattr(self._step, name)

  def train(self, num_steps, stop_requested=False, timed=False):
    done = self._step.train(num_steps, stop_requested, timed)
    global_step = optimizers.step(self._step.optimizer)
    if global_step in self._nonfinite_at:
      self._nonfinite_at.remove(global_step)
      raise steps.NonFinite("the loss was nan")
    if global_step == self._peer_stop_at:
      return trained_call(done.steps, True)  # another rank's, agreed
    return done


@pytest.fixture
def peer_sent_sigterm(monkeypatch):
  """The other rank's SIGTERM, which the agreed stop names: the largest of
  every rank's signal numbers, this one's being 0."""
  of_ranks = distributed.max_across_ranks
  monkeypatch.setattr(distributed, "max_across_ranks", lambda value, name: (
      max(of_ranks(value, name), signal.SIGTERM) if name == "stop_signal"
      else of_ranks(value, name)))


def run_loop(data_dir, model_dir, *, user_actions=(), fake=None,
             faulty=None, **changes):
  """The loop over fixtures' Fashion-MNIST with `changes` to its config
  (by section, as TrainConfig.replace takes them): its history and its
  fake step (`fake`'s faults), or the engine's (`faulty`'s)."""
  config = fixtures.train_config(
      data=dict(name="fashion_mnist", dir=data_dir), model=dict(name="cnn"),
      training=dict(model_dir=str(model_dir), batch_size=32,
                    progress="none", epochs=2)).replace(**changes)
  parts = build.training_parts(config)
  step = (FaultyStep(parts.train_step, **faulty) if faulty is not None
          else FakeStep(parts, **(fake or {})))
  loop = TrainLoop(dataclasses.replace(parts, train_step=step),
                   user_actions=user_actions)
  history = loop(elastic.TrainingState(loop.variables, run_state=None))
  return history, step, parts


def recorded(steps_seen):
  """An action's function that records the steps it ran at."""
  return lambda at: steps_seen.append((at.global_step, at.epoch, at.step))


def test_calls_end_where_an_action_is_due_and_at_the_epochs_end(data_dir,
                                                                tmp_path):
  seen = []
  history, step, _ = run_loop(
      data_dir, tmp_path, performance=dict(steps_per_call=4),
      checkpoints=dict(checkpoint_every_steps=5),
      training=dict(summary_every_steps=3, epochs=1),
      user_actions=[actions.Every(7, recorded(seen))])
  # The first call is one step (the optimizer state's broadcast follows
  # it); then up to 4, ending at every 3rd, 5th and 7th step.
  assert step.calls == [(1, 1), (2, 2), (4, 2), (6, 1), (7, 1), (8, 2),
                        (10, 1), (11, 2), (13, 2), (15, 1), (16, 3)]
  assert seen == [(7, 0, 7), (14, 0, 14)]
  assert [r["global_step"] for r in history] == [STEPS_PER_EPOCH]


def test_the_step_counter_is_the_optimizers_and_each_epoch_is_whole(
    data_dir, tmp_path):
  history, step, parts = run_loop(data_dir, tmp_path,
                                  performance=dict(steps_per_call=5))
  assert optimizers.step(parts.optimizer) == 2 * STEPS_PER_EPOCH
  assert [r["global_step"] for r in history] == [18, 36]
  assert [r["train_examples"] for r in history] == [18 * 32, 18 * 32]
  assert [c for c in step.calls if c[0] > 18][0] == (19, 5)
  assert all(first + taken - 1 <= 18 or first > 18
             for first, taken in step.calls)  # no call crosses an epoch


@pytest.mark.usefixtures("peer_sent_sigterm")
def test_a_stop_saves_where_it_stands_and_the_rerun_reads_on_from_there(
    data_dir, tmp_path):
  """Another rank's SIGTERM, agreed in step 3 of epoch 2, the third of a
  call of 4: this rank, which had no signal, stops there too."""
  with pytest.raises(preemption.Preempted, match=r"stopped by SIGTERM at "
                     r"epoch 2, step 3; saved .*ckpt"):
    run_loop(data_dir, tmp_path, performance=dict(steps_per_call=4),
             fake=dict(peer_stop_at=STEPS_PER_EPOCH + 3))
  history, step, parts = run_loop(data_dir, tmp_path,
                                  performance=dict(steps_per_call=4))
  assert step.calls[0] == (STEPS_PER_EPOCH + 4, 1)
  assert [r["epoch"] for r in history] == [2]
  # The batch after the stop: step 3 of epoch 2 onwards, as a run that had
  # not stopped reads it.
  expected = datasets.train_stream(
      parts.splits.train, parts.splits.info,
      shard=Shard(0, 1),
      epochs=Epochs(batch_size=32, steps=STEPS_PER_EPOCH,
                    seed=parts.config.training.seed),
      augmentation=Augmentation.requested(parts.config.data),
      first_epoch=1,
      first_step=3)
  _, labels = next(iter(expected))
  assert step.first_batches[0] == labels.numpy().tolist()


def test_a_nonfinite_step_rolls_back_to_the_last_checkpoint(data_dir,
                                                            tmp_path):
  history, step, parts = run_loop(
      data_dir, tmp_path, performance=dict(steps_per_call=4),
      checkpoints=dict(checkpoint_every_steps=5),
      faults=dict(on_nonfinite="rollback", rollback_lr_factor=0.5),
      fake=dict(nonfinite_at={8}))
  # Steps 6-9 failed at 8; back to the checkpoint at 5: step 6 on.
  failed = step.calls.index((6, 3))
  assert step.calls[failed + 1] == (6, 4)
  assert [r["epoch"] for r in history] == [1, 2]
  assert [r["global_step"] for r in history] == [18, 36]
  assert float(parts.learning_rate.factor.numpy()) == 0.5
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    events = [r for r in map(json.loads, f) if r.get("event") == "rollback"]
  assert [(e["global_step"], e["diverged_at_step"]) for e in events] \
      == [(5, 8)]


def test_a_nonfinite_step_without_rollback_stops_naming_the_step(data_dir,
                                                                 tmp_path):
  with pytest.raises(Diverged, match=r"^training diverged at global step 21 "
                     r"\(epoch 2, step 3\) with learning rate .*: the loss "
                     r"was nan; the step was not applied and nothing was "
                     r"saved after \S+, the last good checkpoint"):
    run_loop(data_dir, tmp_path, performance=dict(steps_per_call=2), fake=dict(
        nonfinite_at={STEPS_PER_EPOCH + 3}))


def records(model_dir):
  """metrics.jsonl's records, but for what depends on the time taken and
  the start (steps_run: since it); a checkpoint by its name."""
  per_start = ("time", "images_per_sec", "steps_run")
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [{key: os.path.basename(value) if key == "checkpoint" else value
             for key, value in record.items()
             if key not in per_start and not key.endswith("_seconds")}
            for record in map(json.loads, f)]


def test_a_signal_mid_epoch_stops_at_the_calls_end_and_saves_there(
    data_dir, tmp_path):
  """SIGTERM, as a scheduler sends at a job's time limit, after step 21
  (epoch 2, step 3; an action there sends it): the next step carries the
  request to every rank, so the loop stops after it (step 4), saves there,
  and the rerun reads on from step 5, having taken no step after it."""
  def terminate(at):
    del at
    os.kill(os.getpid(), signal.SIGTERM)
  handler = signal.getsignal(signal.SIGTERM)
  with pytest.raises(preemption.Preempted, match=r"at epoch 2, step 4; "
                     r"saved .*ckpt"):
    run_loop(data_dir, tmp_path,
             user_actions=[actions.Every(STEPS_PER_EPOCH + 3, terminate)])
  assert signal.getsignal(signal.SIGTERM) is handler  # given back
  history, step, _ = run_loop(data_dir, tmp_path)
  assert step.calls[0] == (STEPS_PER_EPOCH + 5, 1)
  assert [r["epoch"] for r in history] == [2]


def early_stopping(epochs):
  """A target every epoch reaches (accuracy 0.01: the untrained model's
  is about a tenth), for 2 epochs in a row."""
  return dict(training=dict(epochs=epochs, target=0.01, target_accuracy=True,
                            patience=2))


def test_early_stopping_ends_the_run_after_patience_epochs_at_target(
    data_dir, tmp_path):
  history, step, _ = run_loop(data_dir, tmp_path, **early_stopping(5))
  assert [r["epoch"] for r in history] == [1, 2]
  assert [r.get("stopped_early", False) for r in history] == [False, True]
  assert history[-1]["target_accuracy_first_epoch"] == 1
  # Epochs 3-5 take no step.
  assert sum(ran for _, ran in step.calls) == 2 * STEPS_PER_EPOCH
  # The stop is the run's end: the same command again takes no step.
  again, step, _ = run_loop(data_dir, tmp_path, **early_stopping(5))
  assert again == [] and sum(ran for _, ran in step.calls) == 0


def test_early_stoppings_count_goes_on_in_a_resumed_run(data_dir, tmp_path):
  """1 epoch at the target, and the run ends (its epochs done); the same
  command for 5 resumes with that epoch counted: it stops after epoch 2,
  not 3, and still says the target was first reached in epoch 1."""
  first, _, _ = run_loop(data_dir, tmp_path, **early_stopping(1))
  assert [r.get("stopped_early", False) for r in first] == [False]
  history, step, _ = run_loop(data_dir, tmp_path, **early_stopping(5))
  assert [r["epoch"] for r in history] == [2]
  assert history[-1]["stopped_early"]
  assert history[-1]["target_accuracy_first_epoch"] == 1
  assert sum(ran for _, ran in step.calls) == STEPS_PER_EPOCH


@pytest.mark.usefixtures("peer_sent_sigterm")
def test_a_run_stopped_and_resumed_ends_as_the_run_that_went_on(data_dir,
                                                                tmp_path):
  # Early stopping (val_loss <= 100 for 3 epochs: after the third), two
  # rollbacks (at steps 8 and 30, back to the checkpoints at 5 and 25, at
  # most 2), the weights' average; and the stop at step 21, in the second
  # epoch, between the rollbacks.
  run = dict(
      performance=dict(steps_per_call=1),
      task=dict(best_metric="val_loss:min"),
      optimization=dict(ema_decay=0.9),
      training=dict(epochs=5, target=100.0, patience=3),
      checkpoints=dict(checkpoint_every_steps=5),
      faults=dict(on_nonfinite="rollback", rollback_lr_factor=0.5,
                  max_rollbacks=2))
  went_on, _, parts = run_loop(data_dir, tmp_path / "on",
                               faulty=dict(nonfinite_at={8, 30}), **run)
  with pytest.raises(preemption.Preempted, match=r"at epoch 2, step 3"):
    run_loop(data_dir, tmp_path / "stopped",
             faulty=dict(nonfinite_at={8}, peer_stop_at=21), **run)
  resumed, _, resumed_parts = run_loop(
      data_dir, tmp_path / "stopped", faulty=dict(nonfinite_at={30}), **run)
  assert [r["epoch"] for r in went_on] == [1, 2, 3]
  assert went_on[-1]["stopped_early"]
  assert [r["epoch"] for r in resumed] == [2, 3]
  assert records(tmp_path / "stopped") == records(tmp_path / "on")
  assert [(r.get("event"), r.get("rollback"))
          for r in records(tmp_path / "on") if "event" in r] \
      == [("rollback", 1), ("rollback", 2)]
  assert float(resumed_parts.learning_rate.factor.numpy()) == 0.25
  def trained(parts):
    return [*parts.model.variables, *parts.weight_average.variables,
            *parts.optimizer.variables]

  for ours, theirs in zip(trained(resumed_parts), trained(parts)):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_a_scripts_actions_must_be_actions(data_dir, tmp_path):
  with pytest.raises(UserError, match=r"^run\(actions=...\): .* is not an "
                     r"action; make one with engine.loop.actions.Every"):
    train_lib.train(fixtures.train_config(
        training=dict(model_dir=str(tmp_path))),
                    user_actions=[print])


def test_every_is_due_at_its_multiples_and_once_after_the_first_call():
  ran = []
  every = actions.Every(5, ran.append)
  once = actions.Once(ran.append)
  assert [every.next_due(g) for g in (0, 4, 5, 9)] == [5, 5, 10, 10]
  assert actions.steps_in_call([every, once], 3, at_most=8) == 1
  assert actions.due([every, once], 3, 4) == [once]
  once.run("at step 4")
  assert ran == ["at step 4"] and once.next_due(4) is None
  assert actions.steps_in_call([every, once], 4, at_most=8) == 1
  assert actions.due([every, once], 4, 5) == [every]
  assert actions.due([every], 5, 9) == []
  with pytest.raises(ValueError, match="steps must be 1 or more"):
    actions.Every(0, print)


def test_each_window_reports_the_runs_own_calls(data_dir, tmp_path):
  """Windows 3-10 and, every 18 steps, 21-28, at 4 steps a call: each
  window times the run's calls of 4 (their batches read inside: their
  input), one record each in step_reports.jsonl and in TensorBoard at its
  last step, a trace each; the first call, which traced the timed step,
  left out. The timed calls take the run's steps: the step counter and
  the epochs are whole."""
  history, step, _ = run_loop(
      data_dir, tmp_path, faulty={}, performance=dict(steps_per_call=4),
      profiling=dict(profile_steps=(3, 10), profile_every=18))
  assert [r["global_step"] for r in history] == [18, 36]
  with open(tmp_path / "profile" / "step_reports.jsonl") as f:
    reports = [json.loads(line) for line in f]
  assert [r["window"] for r in reports] == [[7, 10], [21, 28]]
  assert [(r["ranks"][0]["calls"], r["ranks"][0]["steps"])
          for r in reports] == [(1, 4), (2, 8)]
  assert [r["late_in"] for r in reports] == ["calls of 4 steps"] * 2
  for report in reports:
    parts = report["ranks"][0]["parts"]
    assert all(parts[part] > 0 for part in (
        "input", "forward", "backward", "optimizer", "launch_and_read")), parts
    assert report["settings"]["steps_per_call"] == 4
  assert reports[1]["ranks"][0]["parts"]["between_calls"] > 0
  assert json.loads((tmp_path / "profile" / "step_report.json")
                    .read_text()) == reports[1]
  assert (step.traces, step.timed_traces) == (1, 1)
  assert len(list((tmp_path / "profile").glob(
      "plugins/profile/*/*.xplane.pb"))) == 2
  tensorboard = b"".join(path.read_bytes() for path in (
      tmp_path / "tensorboard" / "train").glob("events.*"))
  assert tensorboard.count(b"profile/step_p95_ms") == 2


def test_a_trial_its_study_prunes_ends_after_that_epoch_saved(data_dir,
                                                              tmp_path):
  """Four finished trials at 0.99 after epoch 1: the median pruner stops
  a trial at the untrained model's accuracy (about a tenth) after its
  first epoch, which is recorded and saved, and takes no further step."""
  study_dir = str(tmp_path / "sweep")
  sweep = study.Sweep(
      storage=study.default_storage(study_dir), study_name="pruning",
      space=tuple(space.parse({"base_lr": {"uniform": [0.1, 0.2]}}, "s")),
      base_flags=(), metric="val_accuracy:max", sampler="random",
      pruner="median", seed=0, processes=1)
  study.write_sweep(study_dir, sweep)
  trials = study.open_study(sweep, create=True)
  for _ in range(4):
    trials.add_trial(optuna.trial.create_trial(
        value=0.99, intermediate_values={1: 0.99}, params={},
        distributions={}))
  number = trials.ask().number
  model_dir = tmp_path / "run"
  history, step, _ = run_loop(
      data_dir, model_dir, training=dict(epochs=3),
      task=dict(best_metric="val_accuracy:max"), trial=dict(study_dir=study_dir, number=number))
  assert [r["epoch"] for r in history] == [1]
  assert history[-1]["pruned"]
  assert sum(ran for _, ran in step.calls) == STEPS_PER_EPOCH
  assert records(model_dir)[-1]["reason"] == (
      "pruned after epoch 1 by the study's median pruner")
  assert os.path.exists(model_dir / "checkpoints" /
                        f"ckpt-{STEPS_PER_EPOCH}.index")
  assert trials.trials[number].intermediate_values == {
      1: history[0]["val_accuracy"]}
