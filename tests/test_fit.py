"""engine.fit end to end in-process: a compiled model, its tf.data
pipelines and its Keras callbacks, through the engine's build and loop
(engine/given.py), on one process. Two processes: test_fit_ranks.py."""
import csv
import json
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from engine import train as train_lib
from engine.core.errors import UserError
from engine.given import Given
from engine.loop import actions
from engine.loop import preemption
from tests import fixtures

EXAMPLES, BATCH = 96, 8  # 12 steps an epoch


def examples(count=EXAMPLES, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(count, 6)).astype("float32")
  y = (x[:, 0] + x[:, 1] > 0).astype("int64") + (x[:, 2] > 1)
  return x, y


def tensors(seed=0, count=EXAMPLES):
  return tf.data.Dataset.from_tensor_slices(examples(count, seed)).shuffle(
      count, seed=1).batch(BATCH)


def files(directory, count=EXAMPLES):
  """The same examples in 4 TFRecord files, read by a pipeline."""
  x, y = examples(count)
  os.makedirs(directory, exist_ok=True)
  paths = [os.path.join(directory, f"part-{i}.tfrecord") for i in range(4)]
  for i, path in enumerate(paths):
    with tf.io.TFRecordWriter(path) as writer:
      for k in range(i, count, 4):
        writer.write(tf.io.serialize_tensor(
            tf.concat([x[k], [float(y[k])]], 0)).numpy())

  def parsed(record):
    row = tf.io.parse_tensor(record, tf.float32)
    return tf.ensure_shape(row[:6], [6]), tf.cast(tf.ensure_shape(row[6], []),
                                                   tf.int64)

  return tf.data.Dataset.from_tensor_slices(paths).interleave(
      tf.data.TFRecordDataset, cycle_length=2).map(parsed).shuffle(
          32, seed=2).batch(BATCH)


def classifier(frozen_first=False):
  # Names afresh (a checkpoint names its model), as a script started again.
  keras.backend.clear_session()
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((6,)),
                            keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dense(3, activation="softmax")])
  model.layers[0].trainable = not frozen_first
  model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"])
  return model


def fit(model_dir, model, train, validation, *, callbacks=(), user_actions=(),
        init_from="", **training):
  config = fixtures.train_config(
      checkpoints=dict(init_from=init_from),
      model=dict(name="fit"), data=dict(name="fit"),
      training=dict(dict(model_dir=str(model_dir), batch_size=BATCH,
                         epochs=2, progress="none", steps_per_epoch=0),
                    **training),
      performance=dict(mixed_precision="none", gradient_compression="none",
                       steps_per_call=1))
  return train_lib.train(config, user_actions, given=Given(
      model=model, train=train, validation=validation,
      callbacks=tuple(callbacks)))


def figures(records):
  return [{k: v for k, v in r.items() if k.startswith(("train_", "val_"))}
          for r in records]


def test_a_compiled_model_reports_what_fit_and_evaluate_would(tmp_path):
  result = fit(tmp_path, classifier(), tensors(), tensors(seed=1))
  assert [r["epoch"] for r in result.history] == [1, 2]
  # Validation is exact: Keras' own evaluate of the trained weights.
  loss, accuracy = result.model.evaluate(tensors(seed=1), verbose=0)
  last = result.history[-1]
  assert last["val_loss"] == pytest.approx(loss, rel=1e-5)
  assert last["val_accuracy"] == pytest.approx(accuracy, abs=1e-7)
  # The figures fit's History would name.
  keras_history = classifier().fit(tensors(), validation_data=tensors(1),
                                   epochs=1, verbose=0)
  assert {f"{k}" for r in result.history for k in r
          if k.startswith("val_")} == {
              k for k in keras_history.history if k.startswith("val_")}


def preempted_at(step):
  """An action that signals this process at `step`, as a preemption."""
  def signal_at(at):
    if at.global_step == step:
      signal.raise_signal(signal.SIGTERM)
  return actions.Every(1, signal_at)


@pytest.mark.parametrize("pipeline", ["tensors", "files"])
def test_a_pipeline_stopped_mid_epoch_resumes_to_the_straight_runs_figures(
    tmp_path, pipeline):
  def data():
    return (tensors() if pipeline == "tensors" else files(tmp_path / "data"),
            tensors(seed=1))

  straight = fit(tmp_path / "straight", classifier(), *data())
  with pytest.raises(preemption.Preempted, match="epoch 2, step"):
    fit(tmp_path / "stopped", classifier(), *data(),
        user_actions=[preempted_at(12 + 5)])
  resumed = fit(tmp_path / "stopped", classifier(), *data())
  assert [r["epoch"] for r in resumed.history] == [2]
  assert figures(resumed.history) == figures(straight.history[1:])
  for ours, theirs in zip(resumed.model.variables, straight.model.variables,
                          strict=True):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_a_python_pipeline_resumes_on_a_fresh_pass_saying_so(tmp_path,
                                                             caplog):
  def data():
    doubled = tensors().map(lambda x, y: (tf.py_function(
        lambda v: v * 2, [x], tf.float32), y)).map(
            lambda x, y: (tf.ensure_shape(x, [None, 6]), y))
    return doubled, tensors(seed=1)

  with pytest.raises(preemption.Preempted):
    fit(tmp_path, classifier(), *data(), user_actions=[preempted_at(12 + 5)])
  with caplog.at_level("INFO"):
    resumed = fit(tmp_path, classifier(), *data())
  assert [r["epoch"] for r in resumed.history] == [2]
  assert "on a fresh pass of the dataset: the dataset runs a tf.py_function" \
      in caplog.text


class Seen(keras.callbacks.Callback):
  """A user's callback: the epochs and logs it saw."""

  def __init__(self):
    super().__init__()
    self.began, self.epochs = [], []

  def on_train_begin(self, logs=None):
    self.began.append(self.params["epochs"])

  def on_epoch_end(self, epoch, logs=None):
    self.epochs.append((epoch, dict(logs)))


def test_keras_callbacks_act_on_the_run(tmp_path):
  seen, log = Seen(), tmp_path / "epochs.csv"
  callbacks = [
      keras.callbacks.CSVLogger(str(log)),
      keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 / (1 + epoch)),
      # Never better by 10: stops after its second epoch without.
      keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=10,
                                    patience=1),
      keras.callbacks.ModelCheckpoint(str(tmp_path / "kept.weights.h5"),
                                      save_weights_only=True),
      keras.callbacks.TerminateOnNaN(), seen]
  result = fit(tmp_path / "run", classifier(), tensors(), tensors(seed=1),
               callbacks=callbacks, epochs=5)
  assert [r["epoch"] for r in result.history] == [1, 2]
  assert [r["learning_rate"] for r in result.history] == pytest.approx(
      [0.1, 0.05])
  with open(log) as f:
    rows = list(csv.DictReader(f))
  assert [int(row["epoch"]) for row in rows] == [0, 1]
  assert float(rows[1]["val_loss"]) == pytest.approx(
      result.history[1]["val_loss"])
  assert (tmp_path / "kept.weights.h5").exists()
  assert [epoch for epoch, _ in seen.epochs] == [0, 1]
  assert seen.epochs[1][1]["val_accuracy"] == result.history[1][
      "val_accuracy"]
  assert result.history[-1]["stopped_early"] is True
  # A second start, as the first: EarlyStopping's stop is the run's end,
  # so nothing is trained, no epoch seen again, no checkpoint written.
  checkpoints = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
  again = Seen()
  fit(tmp_path / "run", classifier(), tensors(), tensors(seed=1),
      callbacks=[again], epochs=5)
  assert again.epochs == [] and again.began == [5]
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == checkpoints


def test_reduce_lr_on_plateau_lowers_the_runs_rate(tmp_path):
  plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss",
                                              min_delta=10, patience=1,
                                              factor=0.5)
  result = fit(tmp_path, classifier(), tensors(), tensors(seed=1),
               callbacks=[plateau], epochs=3)
  assert [r["learning_rate"] for r in result.history] == pytest.approx(
      [0.1, 0.1, 0.05])


def test_init_from_warm_starts_and_a_frozen_layer_stays_as_loaded(tmp_path):
  source = classifier()
  source.layers[0].kernel.assign(source.layers[0].kernel + 1.0)
  source.save_weights(str(tmp_path / "source.weights.h5"))
  model = classifier(frozen_first=True)
  fit(tmp_path / "warm", model, tensors(), tensors(seed=1), epochs=1,
      init_from=str(tmp_path / "source.weights.h5"))
  np.testing.assert_array_equal(model.layers[0].kernel.numpy(),
                                source.layers[0].kernel.numpy())
  assert not np.array_equal(model.layers[1].kernel.numpy(),
                            source.layers[1].kernel.numpy())


class Raises(keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    raise ValueError("the user's bug")


@pytest.mark.parametrize("given, message", [
    (lambda: dict(train=tensors().filter(lambda x, y: False)),
     "yields nothing"),
    (lambda: dict(train=tensors().map(lambda x, y: x)), "yields x alone, "
     "and model sequential is compiled with a loss, which needs labels"),
    (lambda: dict(model=keras.Sequential([keras.Input((6,)),
                                          keras.layers.Dense(3)]),
                  compile_loss="binary_crossentropy"), "loss"),
    (lambda: dict(callbacks=[Raises()]), "Raises.on_epoch_end raised "
     "ValueError: the user's bug"),
    (lambda: dict(callbacks=[keras.callbacks.BackupAndRestore("/tmp/x")]),
     "BackupAndRestore"),
    (lambda: dict(model=keras.Sequential([keras.Input((6,)),
                                          keras.layers.Dense(3)])),
     "not compiled"),
])
def test_bad_input_is_one_line(tmp_path, given, message):
  parts = {**dict(model=classifier(), train=tensors(),
                 validation=tensors(seed=1), callbacks=[]), **given()}
  loss = parts.pop("compile_loss", None)
  if loss:
    parts["model"].compile(optimizer="sgd", loss=loss)
  with pytest.raises(UserError) as raised:
    fit(tmp_path, parts["model"], parts["train"], parts["validation"],
        callbacks=parts["callbacks"], epochs=1)
  assert message in str(raised.value) and "\n" not in str(raised.value)


def test_init_from_another_model_is_one_line_and_loses_nothing(tmp_path):
  other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  other.save_weights(str(tmp_path / "other.weights.h5"))
  with pytest.raises(UserError, match="holds another model") as raised:
    fit(tmp_path / "run", classifier(), tensors(), tensors(seed=1), epochs=1,
        init_from=str(tmp_path / "other.weights.h5"))
  assert "\n" not in str(raised.value)
  assert (tmp_path / "other.weights.h5").exists()


CALLBACKS = '''
import json
import keras

class Seen(keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    with open(__file__ + ".seen", "a") as f:
      f.write(json.dumps([epoch, logs["val_accuracy"]]) + "\\n")

def callbacks():
  return [keras.callbacks.LearningRateScheduler(lambda e, lr: 0.01 * (e + 1)),
          Seen()]
'''


def test_callbacks_flag_gives_an_engine_train_run_keras_callbacks(tmp_path):
  (tmp_path / "mine.py").write_text(CALLBACKS)
  config = fixtures.train_config(
      data=dict(name="fashion_mnist",
                dir=fixtures.write_fashion_mnist(str(tmp_path / "data"))),
      model=dict(name="cnn"),
      training=dict(model_dir=str(tmp_path / "run"), batch_size=32, epochs=2,
                    steps_per_epoch=3, progress="none",
                    callbacks=f"{tmp_path / 'mine.py'}:callbacks"))
  result = train_lib.train(config)
  assert [r["learning_rate"] for r in result.history] == pytest.approx(
      [0.01, 0.02])
  seen = (tmp_path / "mine.py.seen").read_text().splitlines()
  assert [json.loads(line) for line in seen] == [
      [r["epoch"] - 1, r["val_accuracy"]] for r in result.history]


def test_a_dataset_repeating_forever_takes_steps_per_epoch(tmp_path):
  # Horovod's tensorflow2_keras_mnist.py: .repeat().shuffle(), and fit's
  # steps_per_epoch.
  repeated = tf.data.Dataset.from_tensor_slices(examples()).repeat().shuffle(
      32, seed=3).batch(BATCH)
  result = fit(tmp_path, classifier(), repeated, tensors(seed=1),
               steps_per_epoch=5)
  assert [(r["epoch"], r["train_examples"]) for r in result.history] == [
      (1, 5 * BATCH), (2, 5 * BATCH)]
  with pytest.raises(UserError, match="repeats forever: give steps_per_epoch"):
    fit(tmp_path / "unbounded", classifier(), repeated, tensors(seed=1))
