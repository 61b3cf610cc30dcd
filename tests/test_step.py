import time

import horovod.tensorflow as hvd
import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import distributed
from engine.compute import ema
from engine.compute import eval_step as eval_steps
from engine.compute import precision
from engine.compute import step as steps
from engine.core.errors import UserError
from engine.tasks import classification
import models
from tests import fixtures
from tests.workers import slowed_model


@pytest.fixture(scope="module", autouse=True)
def horovod():
  distributed.start_horovod()  # one process: allreduce is the identity


def tiny_model():
  keras.utils.set_random_seed(1)
  return models.build("cnn", input_shape=(28, 28, 1), num_classes=10,
                      filters=4, weight_decay=1e-4)


# Pixels so large that the first convolution overflows, which makes the loss
# NaN under Eigen's kernels and oneDNN's alike. NaN pixels would not do it
# under oneDNN, whose fused convolution and ReLU maps NaN to 0: only the
# first kernel's gradient would be non-finite.
OVERFLOWING = 3e38


def batch(size, seed):
  rng = np.random.default_rng(seed)
  return (tf.constant(rng.normal(size=(size, 28, 28, 1)), tf.float32),
          tf.constant(rng.integers(0, 10, size), tf.int64))


def test_train_step_lowers_the_loss_and_is_traced_once():
  model = tiny_model()
  step = steps.TrainStep(model=model,
                         optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
  images, labels = batch(32, 0)
  losses = []
  for _ in range(20):
    step.totals.reset()
    fixtures.one_step(step, images, labels)
    losses.append(step.totals.result().loss)
  # Other values, same shapes: no retrace.
  fixtures.one_step(step, *batch(32, 1))
  assert losses[-1] < 0.5 * losses[0]
  assert step.traces == 1


def test_train_loss_includes_weight_decay_in_the_gradient():
  model = tiny_model()
  before = [w.numpy() for w in model.trainable_weights]
  images, labels = batch(8, 2)
  with tf.GradientTape() as tape:
    data_loss = tf.reduce_mean(classification.cross_entropy(labels, model(images)))
    loss = data_loss + tf.add_n(model.losses)
  expected = tape.gradient(loss, model.trainable_weights)
  fixtures.one_step(steps.TrainStep(
      model=model, optimizer=keras.optimizers.SGD(1.0)), images, labels)
  for old, new, gradient in zip(before, model.trainable_weights, expected):
    np.testing.assert_allclose(old - new.numpy(), gradient.numpy(),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("overlap_allreduce", [False, True])
def test_a_weight_the_loss_does_not_use_is_left_alone(overlap_allreduce):
  """Its gradient is None, which the grouped allreduce (CPU) keeps out of
  the group, as the per-gradient one (GPU) does."""
  inputs = keras.Input((28, 28, 1))
  used = keras.layers.Dense(10)
  model = keras.Model(inputs, used(keras.layers.Flatten()(inputs)))
  model.unused = keras.layers.Dense(3)  # tracked, never on the path
  model.unused.build((None, 5))
  assert len(model.trainable_weights) == 4
  before = {id(w): w.numpy() for w in model.trainable_weights}
  fixtures.one_step(steps.TrainStep(
      model=model, optimizer=keras.optimizers.SGD(0.1),
      overlap_allreduce=overlap_allreduce), *batch(8, 3))
  for w in model.unused.weights:
    np.testing.assert_array_equal(w.numpy(), before[id(w)])
  for w in used.weights:
    assert not np.array_equal(w.numpy(), before[id(w)])


def test_eval_is_exact_over_uneven_batches_and_traced_once():
  model = tiny_model()
  images, labels = batch(50, 3)
  step = eval_steps.EvalStep(model=model)
  dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(16)
  result = eval_steps.evaluate(step, dataset)  # batches of 16, 16, 16 and 2
  logits = model(images, training=False).numpy()
  loss = classification.cross_entropy(labels, logits).numpy()
  assert result.examples == 50
  assert result.loss == pytest.approx(loss.mean(), rel=1e-6)
  assert result.accuracy == np.mean(logits.argmax(1) == labels.numpy())
  assert eval_steps.evaluate(step, dataset) == result  # totals reset per call
  assert step.traces == 1


def test_adasum_without_mpi_is_refused_in_one_line():
  assert not hvd.mpi_enabled()  # this Horovod is built with Gloo only
  with pytest.raises(UserError, match="--allreduce_op=adasum needs Horovod's "
                     "MPI controller"):
    steps.TrainStep(model=tiny_model(),
                    optimizer=keras.optimizers.SGD(0.1),
                    allreduce_op="adasum")


def compiled_functions(step, images, labels):
  """Names of the functions the step's graph calls that XLA must compile."""
  # pylint: disable=protected-access
  batches = iter(tf.data.Dataset.from_tensors((images, labels)))
  graph = step._steps.get_concrete_function(
      batches, tf.constant(1), tf.constant(0.0)).graph
  return [f.definition.signature.name for f in graph._functions.values()
          if f.definition.attr["_XlaMustCompile"].b]


def test_xla_compiles_the_forward_and_backward_pass_only_with_xla():
  images, labels = batch(8, 4)
  plain = steps.TrainStep(model=tiny_model(),
                          optimizer=keras.optimizers.SGD(0.1))
  assert not compiled_functions(plain, images, labels)
  compiled = steps.TrainStep(model=tiny_model(),
                             optimizer=keras.optimizers.SGD(0.1), xla=True)
  names = compiled_functions(compiled, images, labels)
  assert any("forward" in n for n in names)
  assert any("backward" in n for n in names)


def float16_step():
  """A float16 model's TrainStep, with Keras' dynamic loss scaler."""
  with precision.policy("float16"):
    model = tiny_model()
  optimizer = precision.with_loss_scaling(keras.optimizers.SGD(0.1),
                                          "float16")
  return model, optimizer, steps.TrainStep(model=model, optimizer=optimizer)


def test_float16_skips_a_step_whose_gradients_overflow_and_lowers_the_scale():
  model, optimizer, step = float16_step()
  images, labels = batch(8, 5)
  fixtures.one_step(step, images, labels)
  assert float(precision.loss_scale(optimizer)) == 2.0 ** 15  # finite: applied
  before = [w.numpy() for w in model.trainable_weights]
  fixtures.one_step(step, images * 1e6, labels)  # float16 activations overflow
  assert float(precision.loss_scale(optimizer)) == 2.0 ** 14
  for old, new in zip(before, model.trainable_weights):
    np.testing.assert_array_equal(old, new.numpy())
  # The skipped step is counted: the step counter counts batches.
  assert int(optimizer.iterations) == 2
  assert step.traces == 1


def test_the_step_returns_a_stop_requested_on_one_process():
  # Across ranks, where one asks and the other does not:
  # tests/test_multiprocess.py.
  step = steps.TrainStep(model=tiny_model(),
                         optimizer=keras.optimizers.SGD(0.1))
  images, labels = batch(8, 6)
  assert fixtures.one_step(step, images, labels).stop_agreed is False
  assert fixtures.one_step(step, images, labels,
                           stop_requested=True).stop_agreed is True
  assert step.traces == 1


def test_eval_counts_the_confusion_matrix_and_per_class_accuracy():
  model = keras.Sequential([keras.Input((2,)),
                               keras.layers.Lambda(lambda x: x * 10.0)])
  step = eval_steps.EvalStep(model=model)
  images = tf.constant([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
  labels = tf.constant([0, 0, 1, 1], tf.int64)
  eval_steps.evaluate(step, tf.data.Dataset.from_tensor_slices(
      (images, labels)).batch(3))
  counts = step.totals.result().sums["confusion"]
  np.testing.assert_array_equal(counts, [[2, 0], [1, 1]])
  np.testing.assert_array_equal(classification.per_class_accuracy(counts),
                                [1.0, 0.5])


def test_a_nonfinite_loss_is_not_applied_and_raises_naming_it():
  model = tiny_model()
  optimizer = keras.optimizers.SGD(0.1)
  step = steps.TrainStep(model=model, optimizer=optimizer)
  images, labels = batch(8, 7)
  before = [w.numpy() for w in model.trainable_weights]
  with pytest.raises(steps.NonFinite, match=r"the loss was non-finite on 1 "
                     r"of 1 processes \(rank 0's: nan\) and the gradients "
                     r"of \d+ of \d+ variables were non-finite \(conv"):
    fixtures.one_step(step, images * OVERFLOWING, labels)
  for old, new in zip(before, model.trainable_weights):
    np.testing.assert_array_equal(old, new.numpy())
  assert int(optimizer.iterations) == 1  # counted, as the loss scaler does
  fixtures.one_step(step, images, labels)  # a finite step after it is applied
  assert not np.array_equal(before[0], model.trainable_weights[0].numpy())
  assert step.traces == 1


def test_a_nonfinite_gradient_of_a_finite_loss_names_its_variable():
  inputs = keras.Input((3,))
  hidden = keras.layers.Dense(4, name="dense")(inputs)
  # sqrt's gradient at 0 is infinite: times relu's 0 at 0, NaN.
  zero_root = keras.layers.Lambda(
      lambda x: tf.sqrt(tf.nn.relu(-tf.abs(x))))(hidden)
  logits = keras.layers.Dense(2, name="logits")(
      keras.layers.Concatenate()([inputs, zero_root]))
  model = keras.Model(inputs, logits)
  step = steps.TrainStep(model=model, optimizer=keras.optimizers.SGD(0.1))
  with pytest.raises(steps.NonFinite) as raised:
    fixtures.one_step(step, tf.ones([4, 3]),
                      tf.constant([0, 1, 0, 1], tf.int64))
  message = str(raised.value)
  assert message.startswith("the gradients of 2 of 4 variables were "
                            "non-finite (dense/kernel"), message
  assert "loss" not in message


def test_a_nonfinite_step_leaves_momentum_and_the_weight_average_alone():
  model = tiny_model()
  optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  average = ema.WeightAverage(model, 0.9)
  step = steps.TrainStep(model=model, optimizer=optimizer,
                         weight_average=average)
  images, labels = batch(8, 10)
  # Momentum and average no longer at their start.
  fixtures.one_step(step, images, labels)
  state = [*model.trainable_weights, *optimizer.variables,
           *average.variables]
  before = [v.numpy() for v in state]
  with pytest.raises(steps.NonFinite, match="the loss was non-finite"):
    fixtures.one_step(step, images * OVERFLOWING, labels)
  for old, variable in zip(before, state):
    if variable is optimizer.iterations:
      assert int(variable) == int(old) + 1
    else:
      np.testing.assert_array_equal(old, variable.numpy(), variable.name)
  fixtures.one_step(step, images, labels)
  assert step.traces == 1


def test_float16_counts_skipped_steps_and_raises_at_the_minimum_scale():
  _, optimizer, step = float16_step()
  images, labels = batch(8, 8)
  for skipped in range(1, 16):  # 2^15 halved 15 times: the minimum, 1
    fixtures.one_step(step, images * np.nan, labels)
    assert step.skipped_steps == skipped
  assert float(precision.loss_scale(optimizer)) == 1.0
  with pytest.raises(steps.NonFinite, match="at the float16 loss scale's "
                     "minimum of 1"):
    fixtures.one_step(step, images * np.nan, labels)
  assert step.traces == 1


def test_accumulated_micro_batches_are_checked_for_a_nonfinite_loss():
  step = steps.TrainStep(model=tiny_model(),
                         optimizer=keras.optimizers.SGD(0.1),
                         accumulation_steps=2)
  images, labels = batch(8, 9)
  fixtures.one_step(step, images, labels)
  poisoned = tf.concat([images[:4], images[4:] * OVERFLOWING], axis=0)
  with pytest.raises(steps.NonFinite, match="the loss was non-finite on 1 "
                     "of 1 processes"):
    fixtures.one_step(step, poisoned, labels)  # the second micro-batch's
  assert step.traces == 1


def test_label_smoothing_changes_the_objective_not_the_reported_loss():
  logits = tf.constant([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
  labels = tf.constant([0, 1], tf.int64)
  plain = classification.cross_entropy(labels, logits).numpy()
  log_p = tf.nn.log_softmax(logits).numpy()
  # Targets 0.9 on the label plus 0.1 / 3 on every class.
  targets = 0.9 * np.eye(3)[[0, 1]] + 0.1 / 3
  np.testing.assert_allclose(
      classification.smoothed_cross_entropy(labels, logits, 0.1).numpy(),
      -(targets * log_p).sum(axis=1), rtol=1e-6)
  # In a step: the gradient is the smoothed objective's, the figures
  # reported are plain cross-entropy.
  images, labels = batch(8, 3)
  model = tiny_model()
  before = [w.numpy() for w in model.trainable_weights]
  with tf.GradientTape() as tape:
    outputs = model(images)
    objective = tf.reduce_mean(classification.smoothed_cross_entropy(
        labels, outputs, 0.2)) + tf.add_n(model.losses)
  expected = tape.gradient(objective, model.trainable_weights)
  reported = tf.reduce_mean(classification.cross_entropy(labels, outputs)).numpy()
  step = steps.TrainStep(model=model, optimizer=keras.optimizers.SGD(1.0),
                         task=classification.Classification(
                             label_smoothing=0.2, num_classes=10))
  fixtures.one_step(step, images, labels)
  for old, new, gradient in zip(before, model.trainable_weights, expected):
    np.testing.assert_allclose(old - new.numpy(), gradient.numpy(),
                               rtol=1e-4, atol=1e-6)
  assert step.totals.result().loss == pytest.approx(reported, rel=1e-5)
  assert not np.allclose(plain, classification.smoothed_cross_entropy(
      tf.constant([0, 1], tf.int64), logits, 0.1).numpy())


def test_eval_flip_predicts_the_mean_of_an_image_and_its_mirror():
  model = tiny_model()
  images, labels = batch(6, 4)
  step = eval_steps.EvalStep(model=model, flip=True)
  step(images, labels)
  probabilities = (tf.nn.softmax(model(images)) + tf.nn.softmax(
      model(tf.image.flip_left_right(images)))) / 2
  loss = -np.log(np.take_along_axis(probabilities.numpy(),
                                    labels.numpy()[:, None], axis=1))
  assert step.totals.result().loss == pytest.approx(loss.mean(), rel=1e-5)
  correct = (np.argmax(probabilities, axis=1) == labels.numpy()).sum()
  assert step.totals.result().accuracy == pytest.approx(correct / 6)
  plain = eval_steps.EvalStep(model=model)
  plain(images, labels)
  assert plain.totals.result().loss != pytest.approx(loss.mean(), rel=1e-5)
  # Mirror-symmetric images: the two views agree.
  symmetric = (images + tf.image.flip_left_right(images)) / 2
  both, one = eval_steps.EvalStep(model=model, flip=True), eval_steps.EvalStep(
      model=model)
  both(symmetric, labels)
  one(symmetric, labels)
  assert both.totals.result().loss == pytest.approx(
      one.totals.result().loss, rel=1e-5)


def test_eval_shift_adds_each_view_moved_left_and_right():
  model = tiny_model()
  images, labels = batch(6, 5)
  step = eval_steps.EvalStep(model=model, flip=True, shift=2)
  step(images, labels)
  # The six views, made another way: crops of the edge-padded batch.
  padded = np.pad(images.numpy(), [(0, 0), (0, 0), (2, 2), (0, 0)],
                  mode="edge")
  views = [padded[:, :, start:start + 28] for start in (0, 2, 4)]
  views += [view[:, :, ::-1] for view in views]
  probabilities = np.mean([tf.nn.softmax(model(view)).numpy()
                           for view in views], axis=0)
  loss = -np.log(np.take_along_axis(probabilities, labels.numpy()[:, None],
                                    axis=1))
  assert step.totals.result().loss == pytest.approx(loss.mean(), rel=1e-5)
  flipped = eval_steps.EvalStep(model=model, flip=True)
  flipped(images, labels)
  assert flipped.totals.result().loss != pytest.approx(loss.mean(), rel=1e-5)
  with pytest.raises(UserError, match=r"EvalStep\(shift=14\): must be less "
                     "than half the images' width"):
    eval_steps.EvalStep(model=model, shift=14)


@pytest.mark.parametrize("options, phases", [
    (dict(overlap_allreduce=False),
     ["forward", "backward", "communication", "optimizer"]),
    (dict(overlap_allreduce=True),
     ["forward", "backward", "communication", "optimizer"]),
    (dict(accumulation_steps=2), ["backward", "communication", "optimizer"]),
])
def test_a_timed_step_updates_as_the_step_does_and_its_phases_fit_its_call(
    options, phases):
  """A profiled window's steps (TrainStep.train, timed) train exactly as
  the others, and their phases, stamped inside the graph, fit inside the
  call that ran them."""
  plain, timed = tiny_model(), tiny_model()
  plain_step, timed_step = (
      steps.TrainStep(model=model, optimizer=keras.optimizers.SGD(0.1),
                      **options) for model in (plain, timed))
  for seed in range(3):
    fixtures.one_step(plain_step, *batch(16, seed))
    began = tf.timestamp()
    trained = fixtures.one_step(timed_step, *batch(16, seed), timed=True)
    call = float(tf.timestamp() - began)
    seconds = trained.phases
    assert not trained.stop_agreed and list(seconds) == ["input", *phases]
    assert all(s >= 0 for s in seconds.values())
    assert 0 < sum(seconds.values()) <= call
  for a, b in zip(plain.weights, timed.weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert (plain_step.traces, timed_step.traces, timed_step.timed_traces) \
      == (1, 0, 1)


class SleepsAside(keras.layers.Layer):
  """Passes its input on at once, and as a side effect (a count its output
  does not depend on, as BatchNorm's moving statistics) sleeps `seconds`
  in each training pass."""

  def __init__(self, seconds: float, **options):
    super().__init__(**options)
    self.seconds = seconds

  def build(self, input_shape):
    self.passes = self.add_weight(shape=(), initializer="zeros",
                                  trainable=False, name="passes")

  def call(self, inputs, training=None):
    if training:
      slept = tf.py_function(lambda: time.sleep(self.seconds) or 1.0, [],
                             tf.float32)
      self.passes.assign_add(tf.reshape(slept, []))
    return inputs


def model_with(delay=None):
  keras.utils.set_random_seed(1)
  inputs = x = keras.Input((28, 28, 1))
  if delay:
    x = delay(x)
  x = keras.layers.Conv2D(4, 3, activation="relu")(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  return keras.Model(inputs, keras.layers.Dense(10)(x))


@pytest.mark.parametrize("delay", [slowed_model.Sleep, SleepsAside])
def test_a_delay_in_the_forward_pass_grows_that_phase_alone(delay):
  """150 ms slept in the forward pass, on its data path or as a side
  effect of it (which the loss does not wait for): the forward phase
  grows by it, and no other phase takes any of it."""
  seconds = 0.15
  def phases(model):
    step = steps.TrainStep(model=model, optimizer=keras.optimizers.SGD(0.1))
    timed = [fixtures.one_step(step, *batch(16, seed), timed=True).phases
             for seed in range(4)][1:]
    return {phase: float(np.median([t[phase] for t in timed]))
            for phase in timed[0]}
  plain, slowed = phases(model_with()), phases(model_with(delay(seconds)))
  grown = {phase: slowed[phase] - plain[phase] for phase in plain}
  assert seconds * 0.9 < grown["forward"] < seconds * 1.5, grown
  for phase in ("backward", "communication", "optimizer"):
    assert grown[phase] < 0.2 * seconds, grown


def test_a_call_stamps_its_input_wait_timed_or_not():
  """Its batches read inside, the call times their wait (an epoch's
  input_seconds), at one step a call and at several."""
  step = steps.TrainStep(model=tiny_model(),
                         optimizer=keras.optimizers.SGD(0.1),
                         steps_per_call=3)
  slow = tf.data.Dataset.from_tensors(batch(8, 0)).repeat().map(
      lambda images, labels: (tf.numpy_function(
          lambda x: time.sleep(0.1) or x, [images], tf.float32), labels))
  step.start(slow.map(lambda images, labels: (
      tf.ensure_shape(images, [8, 28, 28, 1]), labels)))
  step.train(1)  # traced
  for count in (1, 3):
    began = time.perf_counter()
    trained = step.train(count)
    call = time.perf_counter() - began
    # (Less than all of it: tf.data reads the next ahead between calls.)
    assert 0.05 * count < trained.input_seconds < call, trained
  assert step.traces == 1


def traced_graph(step, count=1, timed=False):
  """The graph of `step`'s call of `count` steps (its timed copy if
  `timed`), traced on batches in memory."""
  step.start(tf.data.Dataset.from_tensors(batch(8, 0)).repeat())
  step.train(count, timed=timed)
  function = step._timed_steps if timed else step._steps  # pylint: disable=protected-access
  return function.get_concrete_function(
      step._batches, tf.constant(count), tf.constant(0.0)).graph  # pylint: disable=protected-access


@pytest.mark.parametrize("count", [1, 3])
def test_a_calls_input_wait_ends_before_its_math_begins(count):
  """The wait for input is stamped around the batch's read, and the step
  takes the batch only after the second stamp: every op that reads the
  batch is an identity that waits for a timestamp. (Where the stamp
  waited on the batch alone, the executor took it after the math on 2
  processes of 2 cores, and an epoch's input_seconds counted 13 of its
  16 s of steps.)"""
  step = steps.TrainStep(model=tiny_model(),
                         optimizer=keras.optimizers.SGD(0.1),
                         steps_per_call=count)
  graph = traced_graph(step, count)
  graphs = [graph, *(f.graph for f in graph._functions.values()  # pylint: disable=protected-access
                     if hasattr(f, "graph"))]
  reads = [op for g in graphs for op in g.get_operations()
           if op.type == "IteratorGetNext"]
  assert reads
  for read in reads:
    takers = {consumer for output in read.outputs
              for consumer in output.consumers()}
    assert takers and all(
        op.type == "Identity" and any(c.type == "Timestamp"
                                      for c in op.control_inputs)
        for op in takers), [(op.type, op.name) for op in takers]


def ancestors(op) -> set:
  """Every op `op` waits for, by data or control, within its graph."""
  found, todo = set(), [op]
  while todo:
    current = todo.pop()
    for before in [t.op for t in current.inputs] + current.control_inputs:
      if before not in found:
        found.add(before)
        todo.append(before)
  return found


@pytest.mark.parametrize("timed", [False, True])
def test_overlapped_allreduces_wait_for_their_gradient_alone(timed):
  """Where each gradient goes to an allreduce of its own (GPUs), none
  waits for the backward pass to end, timed or not; the timed step's
  stamps run in order. (Each allreduce read Horovod's size, a stateful op
  run in the order written: after the stamp that ends the backward pass,
  which held every allreduce of the profiled step until then.)"""
  step = steps.TrainStep(model=tiny_model(),
                         optimizer=keras.optimizers.SGD(0.1),
                         overlap_allreduce=True)
  operations = traced_graph(step, timed=timed).get_operations()
  backward = [op for op in operations if op.name.startswith("gradient_tape/")]
  # Each gradient's allreduce, and the step's flags' and statistics'
  # beside them: the conds on whether processes share the step.
  reductions = [op for op in operations if op.type in ("If", "StatelessIf")
                and any(i.op.type == "HorovodSize"
                        for i in op.inputs[0].op.inputs)]
  assert len(reductions) == len(step.model.trainable_variables) + 1
  stamps = [op for op in operations if op.type == "Timestamp"]
  # The stamp that ends the backward pass waits on its ops.
  ends_backward = [stamp for stamp in stamps
                   if any(c in backward for c in stamp.control_inputs)]
  assert bool(ends_backward) == timed
  for reduction in reductions:
    assert not ancestors(reduction) & set(ends_backward), reduction.name
  for before, after in zip(stamps, stamps[1:]):
    assert before in ancestors(after)


def test_calls_of_several_timed_steps_train_as_the_run_does():
  """A profiled window's calls at K steps a call train exactly as the
  run's, read their batches inside (their `input`), and their phases,
  summed over the steps, fit inside the call."""
  plain, timed = tiny_model(), tiny_model()
  plain_step, timed_step = (
      steps.TrainStep(model=model, optimizer=keras.optimizers.SGD(0.1),
                      steps_per_call=3)
      for model in (plain, timed))
  batches = [batch(16, seed) for seed in range(6)]
  dataset = tf.data.Dataset.from_tensor_slices((
      tf.stack([b[0] for b in batches]), tf.stack([b[1] for b in batches])))
  plain_step.start(dataset)
  plain_step.train(3)
  plain_step.train(3)
  timed_step.start(dataset)
  for _ in range(2):
    began = tf.timestamp()
    trained = timed_step.train(3, timed=True)
    call = float(tf.timestamp() - began)
    seconds = trained.phases
    assert (trained.steps, trained.stop_agreed) == (3, False)
    assert 0 < trained.input_seconds < call
    assert list(seconds) == ["input", "forward", "backward",
                             "communication", "optimizer"]
    assert all(s > 0 for s in seconds.values()), seconds
    assert sum(seconds.values()) <= call
  for a, b in zip(plain.weights, timed.weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert (timed_step.traces, timed_step.timed_traces) == (0, 1)
