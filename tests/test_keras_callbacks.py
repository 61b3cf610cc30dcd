import math

import keras
import pytest
import tensorflow as tf

from engine import distributed
from engine.compute import schedules
from engine.core.errors import UserError
from engine.loop import keras_callbacks
from engine.loop.keras_callbacks import KerasCallbacks


@pytest.fixture(scope="module", autouse=True)
def horovod():
  distributed.start_horovod()  # one process: the collectives are identities


def tiny_model() -> keras.Model:
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  model.build((None, 2))
  return model


def run(callbacks, *, is_chief=True, model=None, **kwargs) -> KerasCallbacks:
  return KerasCallbacks(callbacks, model=model or tiny_model(),
                        is_chief=is_chief, epochs=10, steps_per_epoch=4,
                        **kwargs)


def engine_rate():
  """The engine's schedule, 0.1 constant, on an uncompiled model's
  optimizer: the model, the optimizer and what KerasCallbacks is given."""
  schedule = schedules.WarmupThenDecay(base_lr=0.1, scaling="none",
                                       warmup_epochs=0, decay="constant",
                                       epochs=10)
  schedule.set_world(world_size=1, steps_per_epoch=4)
  model = tiny_model()
  optimizer = keras.optimizers.SGD(schedule)
  optimizer.build(model.trainable_variables)
  return model, optimizer, dict(optimizer=optimizer, learning_rate=schedule)


def compiled_rate():
  model = tiny_model()
  model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  model.optimizer.build(model.trainable_variables)
  return model, model.optimizer, {}


def stepper(model, optimizer):
  """The rate of the optimizer's next update, as a function: SGD's step on
  the bias for a gradient of 1, in one compiled update (as the engine's
  train step is) traced at its first call."""
  kernel, bias = model.trainable_variables
  update = tf.function(lambda: optimizer.apply_gradients(
      [(tf.zeros_like(kernel), kernel), (tf.ones_like(bias), bias)]))

  def step_size() -> float:
    before = float(bias[0])
    update()
    return before - float(bias[0])
  return step_size


def test_early_stopping_stops_after_patience_epochs():
  model = tiny_model()
  callbacks = run([keras.callbacks.EarlyStopping(monitor="val_loss",
                                                 patience=2)], model=model)
  assert not callbacks.train_begin(0)
  stops = [callbacks.epoch_end(epoch, {"val_loss": loss})
           for epoch, loss in enumerate([1.0, 0.9, 0.95, 0.96])]
  assert stops == [False, False, False, True]
  assert model.stop_training


@pytest.mark.parametrize("setup", [engine_rate, compiled_rate])
def test_reduce_lr_on_plateau_lowers_the_rate_the_optimizer_uses(setup):
  model, optimizer, bridge = setup()
  step_size = stepper(model, optimizer)
  callbacks = run([keras.callbacks.ReduceLROnPlateau(
      monitor="val_loss", factor=0.5, patience=1, min_lr=0)], model=model,
                  **bridge)
  callbacks.train_begin(0)
  callbacks.epoch_end(0, {"val_loss": 1.0})
  assert step_size() == pytest.approx(0.1)
  callbacks.epoch_end(1, {"val_loss": 1.0})  # a plateau: halved
  assert float(model.optimizer.learning_rate) == pytest.approx(0.05)
  assert step_size() == pytest.approx(0.05)
  if "learning_rate" in bridge:  # the checkpointed factor holds it
    assert float(bridge["learning_rate"].factor) == pytest.approx(0.5)
  else:  # the optimizer's own variable, checkpointed with its state
    assert any(float(v) == pytest.approx(0.05) and "learning_rate" in v.name
               for v in optimizer.variables)


@pytest.mark.parametrize("setup", [engine_rate, compiled_rate])
def test_learning_rate_scheduler_sets_the_rate_each_epoch(setup):
  model, optimizer, bridge = setup()
  step_size = stepper(model, optimizer)
  callbacks = run([keras.callbacks.LearningRateScheduler(
      lambda epoch, rate: 0.1 * 0.5 ** epoch)], model=model, **bridge)
  callbacks.train_begin(0)
  for epoch in range(3):
    callbacks.epoch_begin(epoch)
    assert step_size() == pytest.approx(0.1 * 0.5 ** epoch)


def test_the_engine_rate_keeps_its_curve_scaled():
  schedule = schedules.WarmupThenDecay(base_lr=0.1, scaling="none",
                                       warmup_epochs=0, decay="step",
                                       decay_epochs=(1,), epochs=10)
  schedule.set_world(world_size=1, steps_per_epoch=1)
  model, optimizer = tiny_model(), keras.optimizers.SGD(schedule)
  step_size = stepper(model, optimizer)
  keras_callbacks.RunRate(schedule, optimizer).assign(0.05)  # at step 0
  assert step_size() == pytest.approx(0.05)
  assert step_size() == pytest.approx(0.005)  # decayed x0.1


def test_terminate_on_nan_stops_on_a_nan_loss():
  callbacks = run([keras.callbacks.TerminateOnNaN()])
  callbacks.train_begin(0)
  assert callbacks.per_batch
  assert not callbacks.batch_end(0, {"loss": 0.5})
  assert callbacks.batch_end(1, {"loss": math.nan})


def test_epoch_callbacks_pay_no_collective_per_step(monkeypatch):
  callbacks = run([keras.callbacks.EarlyStopping()])
  callbacks.train_begin(0)
  collectives = []
  monkeypatch.setattr(distributed, "max_across_ranks",
                      lambda value, name: collectives.append(name) or value)
  assert not callbacks.per_batch
  callbacks.batch_begin(0)
  callbacks.batch_end(0, {"loss": 1.0})
  assert collectives == []
  callbacks.epoch_end(0, {"val_loss": 1.0})
  assert collectives == ["keras_callbacks/on_epoch_end"]


def test_a_lambda_callbacks_batch_hook_is_called_and_agreed_on(monkeypatch):
  # LambdaCallback sets its hooks on the instance, not its class.
  seen = []
  callbacks = run([keras.callbacks.LambdaCallback(
      on_train_batch_end=lambda batch, logs: seen.append((batch, logs)))])
  collectives = []
  monkeypatch.setattr(distributed, "max_across_ranks",
                      lambda value, name: collectives.append(name) or value)
  assert callbacks.per_batch
  callbacks.train_begin(0)
  callbacks.batch_end(3, {"loss": 1.0})
  assert seen == [(3, {"loss": 1.0})]
  assert "keras_callbacks/on_train_batch_end" in collectives


@pytest.mark.parametrize("is_chief", [True, False])
def test_csv_logger_writes_on_the_chief_alone(tmp_path, is_chief):
  path = tmp_path / "log.csv"
  callbacks = run([keras.callbacks.CSVLogger(str(path))], is_chief=is_chief)
  callbacks.train_begin(0)
  callbacks.epoch_end(0, {"loss": 0.5, "val_loss": 0.7})
  callbacks.train_end({"loss": 0.5})
  assert path.exists() == is_chief
  if is_chief:
    assert path.read_text().splitlines() == ["epoch,loss,val_loss",
                                             "0,0.5,0.7"]


@pytest.mark.parametrize("is_chief", [True, False])
def test_model_checkpoint_saves_on_the_chief_alone(tmp_path, is_chief):
  path = tmp_path / "epoch{epoch}.weights.h5"
  callbacks = run([keras.callbacks.ModelCheckpoint(
      str(path), save_weights_only=True)], is_chief=is_chief)
  callbacks.train_begin(0)
  callbacks.epoch_begin(0)
  callbacks.epoch_end(0, {"loss": 0.5})
  assert (tmp_path / "epoch1.weights.h5").exists() == is_chief


class Recorder(keras.callbacks.Callback):
  """A user's callback: what it was given."""

  def __init__(self):
    super().__init__()
    self.seen = []

  def on_epoch_end(self, epoch, logs=None):
    self.seen.append((epoch, dict(logs), self.params, self.model))


class WritesFiles(Recorder):
  writes_files = True


@pytest.mark.parametrize("is_chief", [True, False])
def test_a_user_callback_declares_it_writes_files(is_chief):
  every_rank, chief_only = Recorder(), WritesFiles()
  callbacks = run([every_rank, chief_only], is_chief=is_chief)
  callbacks.epoch_end(0, {"loss": 1.0})
  assert len(every_rank.seen) == 1
  assert len(chief_only.seen) == (1 if is_chief else 0)


def test_a_user_callback_receives_the_logs_params_and_model():
  model, recorder = tiny_model(), Recorder()
  callbacks = run([recorder], model=model)
  record = {"epoch": 3, "train_loss": 0.5, "train_accuracy": 0.8,
            "train_examples": 100, "val_loss": 0.6, "val_accuracy": 0.75,
            "learning_rate": 0.01, "images_per_sec": 1e3}
  callbacks.train_begin(2)
  callbacks.epoch_begin(2)
  callbacks.epoch_end(2, keras_callbacks.epoch_logs(record))
  assert recorder.seen == [(2, {
      "loss": 0.5, "accuracy": 0.8, "val_loss": 0.6, "val_accuracy": 0.75,
      "learning_rate": 0.01}, {"epochs": 10, "steps": 4, "verbose": 0},
                            model)]
  with pytest.raises(ValueError, match="finished before this start"):
    callbacks.epoch_begin(1)


def test_an_unevaluated_epoch_has_no_val_logs():
  logs = keras_callbacks.epoch_logs({"train_loss": 0.5, "val_loss": None,
                                     "learning_rate": 0.1})
  assert logs == {"loss": 0.5, "learning_rate": 0.1}


@pytest.mark.parametrize("callback, named", [
    (lambda tmp: keras.callbacks.BackupAndRestore(str(tmp)),
     "BackupAndRestore is refused: the engine resumes from --model_dir"),
    (lambda tmp: keras.callbacks.TensorBoard(str(tmp)),
     "TensorBoard is refused: the engine writes TensorBoard summaries"),
    (lambda tmp: keras.callbacks.ProgbarLogger(), "ProgbarLogger is refused"),
    (lambda tmp: keras.callbacks.History(), "History is refused"),
    (lambda tmp: print, "a builtin_function_or_method is no keras"),
])
def test_refused_callbacks_in_one_line(tmp_path, callback, named):
  with pytest.raises(UserError, match=named) as error:
    run([callback(tmp_path)])
  assert "\n" not in str(error.value)


class Raises(keras.callbacks.Callback):

  def on_epoch_end(self, epoch, logs=None):
    raise ValueError("no such figure\nand more")


def test_a_raising_callback_is_named_in_one_line():
  callbacks = run([Recorder(), Raises()])
  with pytest.raises(UserError) as error:
    callbacks.epoch_end(0, {"loss": 1.0})
  assert str(error.value) == ("keras callback Raises.on_epoch_end raised "
                              "ValueError: no such figure")


def test_stop_training_is_reset_at_the_start():
  model = tiny_model()
  model.stop_training = True
  assert not run([Recorder()], model=model).train_begin(0)
  assert model.stop_training is False
