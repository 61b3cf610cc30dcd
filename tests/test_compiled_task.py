"""engine.tasks.compiled: a model's compile() as a task, whose figures over
a split (on two ranks' sums) are Keras' own `evaluate`, in one process."""
import numpy as np
import pytest
import keras
import tensorflow as tf

from engine.compute import metrics
from engine.core.errors import UserError
from engine.tasks.compiled import Compiled, is_compiled

FEATURES = 3
EXAMPLES = 11  # two ranks of 6 and 5, batches of 4: short last batches


def data(y_shape=(), classes=4, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(EXAMPLES, FEATURES)).astype(np.float32)
  if y_shape:
    y = rng.normal(size=(EXAMPLES, *y_shape)).astype(np.float32)
  else:
    y = rng.integers(0, classes, EXAMPLES)
  weights = rng.uniform(0.2, 2.0, EXAMPLES).astype(np.float32)
  return x, y, weights


def task_of(model, y, weighted=True):
  return Compiled.of(model, x_spec=tf.TensorSpec([None, FEATURES]),
                     y_spec=tf.TensorSpec([None, *y.shape[1:]],
                                          tf.as_dtype(y.dtype)),
                     weighted=weighted)


def two_rank_figures(task, model, x, y, weights, batch_size=4):
  """The figures of the split as the engine reads them: each of two ranks
  counts its half in its own Totals, batch by batch in a tf.function with
  the loss under XLA (as the step runs them), and the ranks' sums are
  added. Labels are (y, weights), or y alone where weights is None."""
  loss = tf.function(task.loss, jit_compile=True)
  ranks = [metrics.Totals(f"rank{rank}", task) for rank in range(2)]
  halves = np.array_split(np.arange(EXAMPLES), 2)
  for totals, half in zip(ranks, halves):
    update = tf.function(
        lambda labels, outputs: totals.update(labels, outputs,
                                              loss(labels, outputs)))
    for start in range(0, len(half), batch_size):
      batch = half[start:start + batch_size]
      labels = tf.constant(y[batch])
      if weights is not None:
        labels = (labels, tf.constant(weights[batch]))
      update(labels, model(x[batch], training=False))
  flat = sum(totals.local_sums() for totals in ranks)
  return ranks[0].result_of(flat).figures


def assert_figures_are_evaluates(figures, model, x, y, weights=None):
  expected = model.evaluate(x, y, sample_weight=weights, batch_size=4,
                            verbose=0, return_dict=True)
  assert set(figures) == set(expected)
  for name, value in expected.items():
    assert figures[name] == pytest.approx(value, rel=1e-6, abs=1e-7), name


def test_a_softmax_model_with_a_string_loss_is_keras_evaluate():
  model = keras.Sequential([keras.Input((FEATURES,)),
                            keras.layers.Dense(4, activation="softmax")])
  model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                metrics=["accuracy"])
  x, y, _ = data()
  task = task_of(model, y, weighted=False)  # data without sample weights
  assert task.output_shape() == (4,)
  assert task.best_metric == "loss:min"
  assert_figures_are_evaluates(two_rank_figures(task, model, x, y, None),
                               model, x, y)


def test_a_loss_object_from_logits_and_two_metrics_are_keras_evaluate():
  model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4)])
  model.compile(
      optimizer="adam",
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)],
      weighted_metrics=["accuracy"])
  x, y, weights = data(seed=1)
  figures = two_rank_figures(task_of(model, y), model, x, y, weights)
  # Keras weighs only weighted_metrics by the sample weights: the two
  # accuracies differ, and the engine's are Keras'.
  assert figures["accuracy"] != pytest.approx(figures["weighted_accuracy"])
  assert_figures_are_evaluates(figures, model, x, y, weights)


def test_a_loss_function_and_mae_with_a_regularizer_are_keras_evaluate():
  def scaled_squares(y_true, y_pred):
    return 0.5 * keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)

  model = keras.Sequential([
      keras.Input((FEATURES,)),
      keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.1))])
  model.compile(optimizer="sgd", loss=scaled_squares, metrics=["mae"])
  x, y, weights = data(y_shape=(2,), seed=2)
  task = task_of(model, y)
  figures = two_rank_figures(task, model, x, y, weights)
  assert_figures_are_evaluates(figures, model, x, y, weights)
  # The loss figure holds the L2 penalty, as Keras' does; the examples'
  # losses (the engine's objective adds model.losses itself) do not.
  labels = (tf.constant(y), tf.constant(weights))
  data_loss = float(tf.reduce_mean(task.loss(labels, model(x))))
  assert figures["loss"] - data_loss == pytest.approx(
      float(tf.add_n(model.losses)), rel=1e-5)


def test_auc_precision_and_recall_of_a_sigmoid_model_are_keras_evaluate():
  model = keras.Sequential([keras.Input((FEATURES,)),
                            keras.layers.Dense(1, activation="sigmoid")])
  model.compile(loss="binary_crossentropy",
                metrics=[keras.metrics.AUC(num_thresholds=50), "precision",
                         keras.metrics.Recall(name="found")])
  x, y, weights = data(classes=2, seed=3)
  y = y.reshape(-1, 1).astype(np.float32)
  figures = two_rank_figures(task_of(model, y), model, x, y, weights)
  assert_figures_are_evaluates(figures, model, x, y, weights)


class RunningMax(keras.metrics.Metric):
  """The largest prediction so far: a state that does not add up."""

  def __init__(self, name="running_max"):
    super().__init__(name=name)
    self.largest = self.add_variable((), initializer="zeros", name="largest")

  def update_state(self, y_true, y_pred, sample_weight=None):
    self.largest.assign(keras.ops.maximum(self.largest,
                                          keras.ops.max(y_pred)))

  def result(self):
    return self.largest


def test_a_metric_whose_state_cannot_be_summed_is_refused_by_name():
  model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(2)])
  model.compile(loss="mse", metrics=["mae", RunningMax()])
  _, y, _ = data(y_shape=(2,))
  with pytest.raises(UserError, match="metric 'running_max': its state "
                     "does not add up") as error:
    task_of(model, y)
  assert "\n" not in str(error.value)


def test_a_model_of_two_outputs_is_refused():
  inputs = keras.Input((FEATURES,))
  model = keras.Model(inputs, [keras.layers.Dense(2)(inputs),
                               keras.layers.Dense(3)(inputs)])
  model.compile(loss="mse")
  _, y, _ = data(y_shape=(2,))
  with pytest.raises(UserError, match=r"has 2 outputs \[\[2, 2\], \[2, 3\]\]"
                     "; the engine trains a model with one output"):
    task_of(model, y)
  model.compile(loss={"a": "mse", "b": "mae"})
  with pytest.raises(UserError, match=r"compile\(loss=\{'a': 'mse'.*one "
                     "output and one loss"):
    task_of(model, y)


def test_a_loss_the_outputs_do_not_fit_is_one_line():
  model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(3)])
  model.compile(loss="categorical_crossentropy")
  _, y, _ = data(y_shape=(5,))
  with pytest.raises(UserError, match=r"compile\(loss='categorical_crossent"
                     r"ropy'\) on outputs \[2, 3\] and labels \[2, 5\]: ") \
      as error:
    task_of(model, y)
  assert "\n" not in str(error.value)


def test_a_model_never_compiled_is_refused_and_has_no_optimizer():
  model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(2)])
  _, y, _ = data(y_shape=(2,))
  assert not is_compiled(model)
  assert Compiled.optimizer_of(model) is None
  with pytest.raises(UserError, match="was not compiled with a loss"):
    task_of(model, y)
  schedule = keras.optimizers.schedules.ExponentialDecay(
      0.1, decay_steps=10, decay_rate=0.5)
  optimizer = keras.optimizers.Adam(schedule)
  model.compile(optimizer=optimizer, loss="mse")
  assert is_compiled(model)
  assert Compiled.optimizer_of(model) is optimizer


def test_a_model_of_a_dict_of_features_is_called_on_it_as_given():
  features = {"size": keras.Input((2,), name="size"),
              "kind": keras.Input((1,), name="kind")}
  model = keras.Model(features, keras.layers.Dense(1)(
      keras.layers.Concatenate()([features["size"], features["kind"]])))
  model.compile(loss="mse", metrics=["mae"])
  task = Compiled.of(model, x_spec={"size": tf.TensorSpec([None, 2]),
                                    "kind": tf.TensorSpec([None, 1])},
                     y_spec=tf.TensorSpec([None, 1]))
  assert task.output_shape() == (1,)
  assert set(task.figures({**{key: np.zeros(shape) for key, shape in
                              task.sums().items()}, "examples": 0.0})) == {
                                  "loss", "mae"}
