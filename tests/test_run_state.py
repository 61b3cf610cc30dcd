"""The state a resume, a rollback and an elastic restart continue from
(engine/loop/run_state.py), and a start's clock built on it."""
import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import datasets
from engine import distributed
from engine.compute import metrics
from engine.compute import precision
from engine.datasets import Augmentation
from engine.loop import stopping
from engine.loop.keras_callbacks import KerasCallbacks
from engine.loop.run_state import Counts
from engine.loop.run_state import LoopState
from engine.loop.run_state import RunState
from engine.loop.run_state import starting_point
from engine.loop.session import Session
from engine.records.checkpoint import Position
from engine.tasks.classification import Classification
from tests import fixtures


def test_a_start_continues_at_the_step_after_the_position():
  assert starting_point(Position(2, 7, 64, 2), 100, 64, 2) == (2, 7)
  # A stop after an epoch's last step: no steps left, still evaluated.
  assert starting_point(Position(2, 120, 64, 2), 100, 64, 2) == (2, 100)


def test_on_other_processes_the_steps_done_convert_through_examples():
  # 10 steps of 64 examples are 5 of 128 (twice the processes) ...
  assert starting_point(Position(1, 10, 64, 2), 50, 128, 4) == (1, 5)
  # ... and 20 of 32; a partial step is redone.
  assert starting_point(Position(1, 10, 64, 2), 200, 32, 1) == (1, 20)
  assert starting_point(Position(1, 3, 64, 2), 50, 128, 4) == (1, 1)


def test_a_checkpoints_state_counts_the_epoch_from_its_position():
  state = RunState.at(Position(3, 4, 64, 2, seconds=12.5))
  assert state.epoch_began_seconds == 12.5
  assert not state.epoch_sums.any() and state.history == ()
  assert RunState.beginning(64, 2).position == Position(0, 0, 64, 2, 0.0)


def test_a_start_from_a_mid_epoch_commit_keeps_the_epochs_time(tmp_path):
  # The commit was taken 100 s into the run, 40 s into its epoch: the
  # restarted start's clock and the epoch's time go on from there.
  distributed.start_horovod()
  world = distributed.World(rank=0, size=1, device="CPU",
                            intra_op_threads=1, inter_op_threads=1)
  committed = RunState(position=Position(1, 10, 8, 2, seconds=100.0),
                       epoch_began_seconds=60.0,
                       epoch_sums=np.array([3.0, 4.0, 5.0]),
                       history=({"epoch": 1},))
  state = LoopState(optimizer=keras.optimizers.SGD(0.1),
                    learning_rate=lambda step: 0.1, start=committed,
                    steps_per_epoch=10, global_batch=8, world_size=1,
                    gradient_bytes=40, epochs=3, best_metric="val_accuracy:max")
  # 80 examples, each image filled with its number.
  numbered = np.arange(80, dtype=np.uint8)[:, None, None, None] * np.ones(
      (1, 4, 4, 1), np.uint8)
  splits = datasets.from_arrays(numbered, np.arange(80) % 2, numbered[:8],
                                np.arange(8) % 2)
  config = fixtures.train_config(training=dict(
      model_dir=str(tmp_path), progress="none", batch_size=8,
      steps_per_epoch=10))
  task = Classification(num_classes=2)

  class Reader:  # what a session asks of the train step: where it reads
    totals = metrics.Totals("train", task)
    gradient_bytes = 40

    def start(self, batches):
      self.batches = iter(batches)

  reader = Reader()
  session = Session(config=config,
                    precision_choice=precision.Choice(mode="none"),
                    compression="none", world=world, directory=None, state=state,
                    stream=datasets.TrainingStream.of(
                        config, splits, rank=0, world_size=1, task=task),
                    train_step=reader,
                    callbacks=KerasCallbacks([], model=keras.Sequential(),
                                             is_chief=True, epochs=3,
                                             steps_per_epoch=10))
  try:
    def batch_at(epoch, step):  # the first, read from there on
      images, _ = next(iter(datasets.train_stream(
          splits.train, splits.info, shard=datasets.Shard(0, 1),
          epochs=datasets.Epochs(batch_size=8, steps=10,
                                 seed=config.training.seed),
          augmentation=Augmentation.requested(config.data, task),
          first_epoch=epoch, first_step=step)))
      return images.numpy()
    first = next(reader.batches)[0].numpy()
    # The commit's position, epoch 1 (from 0), step 10; not the run's start.
    assert np.array_equal(first, batch_at(1, 10))
    assert not np.array_equal(first, batch_at(0, 0))
    assert state.seconds() >= 100.0
    assert state.history == ({"epoch": 1},)
    record = state.end_epoch(
        metrics.Result(figures=dict(loss=0.6, accuracy=0.8), examples=5),
        None, train_seconds=1.0, input_seconds=0.0, step_seconds=1.0,
        eval_seconds=None, skipped_steps=0)
    assert record["cumulative_seconds"] >= 100.0
    assert record["epoch_seconds"] == pytest.approx(
        record["cumulative_seconds"] - 60.0)
    assert state.history[-1] is record
    # The next commit carries the epoch's new start.
    assert state.snapshot().epoch_began_seconds \
        == record["cumulative_seconds"]
    assert (state.epoch, state.step) == (2, 0)
  finally:
    session.close()


class Rate:
  """A learning rate of 0.1, and the factor rollbacks lower."""

  def __init__(self):
    self.factor = tf.Variable(1.0)

  def __call__(self, step):
    return 0.1 * self.factor


def test_the_state_rolls_back_stops_early_and_keeps_its_counts():
  counts, rate = Counts(3), Rate()
  state = LoopState(optimizer=keras.optimizers.SGD(0.1), learning_rate=rate,
                    start=RunState.beginning(8, 1), steps_per_epoch=10,
                    global_batch=8, world_size=1, gradient_bytes=40,
                    epochs=3, best_metric="val_accuracy:max",
                    stop=stopping.Target(0.5, patience=2), counts=counts)
  state.committed(np.array([1.0, 2.0, 3.0]), skipped_steps=1)
  state.keep(np.array([1.0, 1.0, 1.0]), skipped_steps=1)  # before a save
  assert counts.epoch_sums.numpy().tolist() == [2.0, 3.0, 4.0]
  assert int(counts.skipped_steps.numpy()) == 2

  def restore():  # a checkpoint at step 5, its factor 1 and its counts
    rate.factor.assign(1.0)
    counts.epoch_sums.assign([9.0, 9.0, 9.0])
    counts.skipped_steps.assign(3)
    return Position(0, 5, 8, 1), "ckpt-5"

  rate.factor.assign(0.5)  # lowered by a rollback since that checkpoint
  assert state.roll_back(restore, lr_factor=0.5) == "ckpt-5"
  assert (state.rollbacks, state.learning_rate_factor) == (1, 0.25)
  snapshot = state.snapshot()
  assert (snapshot.epoch_sums.tolist(), snapshot.skipped_steps,
          snapshot.rollbacks) == ([9.0, 9.0, 9.0], 3, 1)
  assert (state.epoch, state.step, state.global_step) == (0, 5, 5)
  figures = metrics.Result(figures=dict(loss=0.6, accuracy=0.6), examples=5)
  records = [state.end_epoch(figures, figures, train_seconds=1.0,
                             input_seconds=0.0, step_seconds=1.0,
                             eval_seconds=0.1, skipped_steps=0)
             for _ in range(2)]
  assert [r.get("stopped_early") for r in records] == [None, True]
  assert records[0]["skipped_steps"] == 3 and records[1]["skipped_steps"] == 0
  assert records[1]["target_accuracy_first_epoch"] == 1
