"""`compile()` honoured as a task: the loss and metrics a Keras user gave
`model.compile`, trained and reported data-parallel by the engine.

A fit script's model says what is learned through `compile(optimizer,
loss, metrics)`; `Compiled.of(model, ...)` turns that into the engine's
Task, so no --task is needed and nothing the user compiled is ignored.

The batch the step gets is `(x, y)`, or `(x, (y, sample_weight))` where the
data have sample weights (`weighted`): x as the user's data gives it (a
tensor or a dict of features), y the labels of the model's one output,
sample_weight float32 [batch].

The loss is the compiled one, resolved as Keras resolves it (a string, a
keras.losses.Loss with its from_logits and label_smoothing, a user's
function), per example and times its sample weight, so the engine's mean
over a batch is Keras' "sum_over_batch_size" loss. The loss figure adds
the weight regularizers' penalty, as Keras' reported loss does.

The metrics are Keras' own compiled metrics, kept as their state variables:
each batch's share of each state is computed with Keras' stateless API from
the initial state, the shares are summed across ranks like any task's sums
(engine/compute/metrics.py), and each metric's result is read once from
the summed state. So "accuracy", AUC or a user's metric is the whole
split's, exactly, on any number of ranks. A metric whose state does not
add up that way (a running maximum) is refused when the task is made.
"""
import numpy as np
import keras
import tensorflow as tf
from keras.src import backend as keras_backend
from keras.src import tree

from engine.core.errors import first_line
from engine.core.errors import UserError
from engine.tasks.task import Task

LOSS = "loss"
# The reductions whose batch loss is the mean of the examples' losses
# (what the engine's step takes); "sum" and "mean_with_sample_weight" are
# not.
_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")
# The size of each of the two batches the metrics' states are checked on.
_CHECK_BATCH = 4


def is_compiled(model: keras.Model) -> bool:
  """Whether the user compiled `model` with a loss (which the engine then
  trains when no --task is given)."""
  return bool(getattr(model, "compiled", False)) and \
      getattr(model, "_compile_loss", None) is not None


class Compiled(Task):
  """The loss and metrics of a model the user compiled; labels are y, or
  `(y, sample_weight)` where the task is `weighted`. Made by
  `Compiled.of`."""

  # Keras users monitor val_loss: ModelCheckpoint's and EarlyStopping's
  # default.
  best_metric = "loss:min"

  def __init__(self, info=None, *, model: keras.Model, loss_fn, loss_weight,
               output_shape: tuple, weighted: bool):
    super().__init__(info)
    self._model = model
    self._weighted = weighted
    self._loss_fn = loss_fn
    self._loss_weight = loss_weight
    self._output_shape = tuple(output_shape)
    # Keras' CompileMetrics (built by `of`): the compiled metrics, resolved
    # for this loss and output as `fit` resolves them, which metrics take
    # the sample weights (weighted_metrics) and how the figures are named.
    self._metrics = model._compile_metrics  # pylint: disable=protected-access
    variables = self._metrics.variables if self._metrics else []
    self._initial = [np.asarray(value) for value in
                     (self._metrics.stateless_reset_state()
                      if self._metrics else [])]
    self._dtypes = [variable.dtype for variable in variables]
    # Each state variable's metric, which a refusal names.
    self._owners = [metric.name for metric in self._metrics.metrics
                    for _ in metric.variables] if self._metrics else []
    self._keys = [f"state/{k}:{owner}/{variable.name}" for k, (owner, variable)
                  in enumerate(zip(self._owners, variables))]

  @classmethod
  def of(cls, model: keras.Model, info=None, *, x_spec, y_spec,
         weighted: bool = False) -> "Compiled":
    """The task of `model` as the user compiled it, for batches whose
    features are `x_spec` (a tf.TensorSpec, or a dict of them) and labels
    `y_spec` (a tf.TensorSpec), with sample weights if `weighted`: the
    batch dimension may be None. Calls the
    model on two blank examples; each thing the engine cannot honour
    (no loss, several outputs, a loss that does not fit the outputs, a
    metric whose state cannot be summed) is one UserError line."""
    if not is_compiled(model):
      raise UserError(f"model {model.name!r} was not compiled with a loss: "
                      "call model.compile(optimizer=..., loss=...) first, "
                      "or give --task")
    given = _named(model.loss)
    if tree.is_nested(y_spec):
      raise UserError(f"labels {tree.map_structure(lambda _: '*', y_spec)}: "
                      "the engine trains a model with one output; give y "
                      "as one tensor")
    if tree.is_nested(model.loss):
      raise UserError(f"model.compile(loss={given}): the engine trains a "
                      "model with one output and one loss; give one loss "
                      "(a string, a keras.losses.Loss or a function)")
    outputs = model(tree.map_structure(_blank, x_spec), training=False)
    if tree.is_nested(outputs):
      raise UserError(f"model {model.name!r} has "
                      f"{len(tree.flatten(outputs))} outputs "
                      f"{tree.map_structure(lambda o: list(o.shape), outputs)}"
                      "; the engine trains a model with one output")
    if keras_backend.get_keras_mask(outputs) is not None:
      raise UserError(f"model {model.name!r} outputs a Keras mask, which the "
                      "engine's per-example loss does not apply; drop the "
                      "masking from its output")
    rng = np.random.default_rng(0)
    y, y_pred, _ = _random_batch(rng, y_spec, outputs, 2)
    loss_fn, loss_weight = _built(model, y, y_pred)
    if loss_fn.reduction not in _MEAN_REDUCTIONS:
      raise UserError(f"model.compile(loss={given}): reduction="
                      f"{loss_fn.reduction!r}; the engine averages the "
                      "examples' losses, so leave the loss's default "
                      "reduction 'sum_over_batch_size'")
    task = cls(info, model=model, loss_fn=loss_fn, loss_weight=loss_weight,
               output_shape=outputs.shape[1:], weighted=weighted)
    task._specs = (x_spec, y_spec)
    task._check_loss(given, y, y_pred)
    task._check_summable(rng, y_spec, outputs)
    return task

  def output_shape(self) -> tuple:
    return self._output_shape

  def batch_signature(self, image_shape: tuple) -> tuple:
    """The pipeline's own: its features as it yields them, and its labels
    (with their sample weights, if weighted)."""
    del image_shape  # the features' own shapes
    x_spec, y_spec = tree.map_structure(_of_any_batch, self._specs)
    return x_spec, ((y_spec, tf.TensorSpec([None], tf.float32))
                    if self._weighted else y_spec)

  def loss(self, labels, outputs):
    """Each example's compiled loss (the mean over its values, for a loss
    that keeps more than the batch axis) times its sample weight and the
    compiled loss weight: their mean over a batch is Keras' loss."""
    y, sample_weight = self._unpacked(labels)
    values = self._values(y, outputs)
    per_example = tf.reduce_mean(
        tf.reshape(values, [tf.shape(values)[0], -1]), axis=1)
    if sample_weight is not None:
      per_example *= tf.cast(sample_weight, per_example.dtype)
    if self._loss_weight is not None:
      per_example *= self._loss_weight
    return tf.cast(per_example, tf.float32)

  def sums(self):
    return {LOSS: (), **{key: (int(np.prod(initial.shape)),) for key, initial
                         in zip(self._keys, self._initial)}}

  def batch_sums(self, labels, outputs, loss):
    examples = tf.cast(tf.shape(outputs)[0], tf.float64)
    sums = {LOSS: tf.reduce_sum(tf.cast(loss, tf.float64))
            + examples * tf.cast(self._penalty(), tf.float64)}
    if self._metrics:
      y, sample_weight = self._unpacked(labels)
      sums.update(zip(self._keys, self._shares(
          self._metrics.stateless_update_state(
              self._initial_state(), y, outputs,
              sample_weight=sample_weight))))
    return sums

  def figures(self, sums):
    figures = {LOSS: float(sums[LOSS]) / max(float(sums["examples"]), 1.0)}
    if self._metrics:
      state = [tf.constant(np.reshape(sums[key], initial.shape) + initial,
                           dtype) for key, initial, dtype in
               zip(self._keys, self._initial, self._dtypes)]
      for name, value in self._metrics.stateless_result(state).items():
        figures.update(_figures_of(name, value))
    return figures

  @staticmethod
  def optimizer_of(model: keras.Model):
    """The optimizer the user compiled `model` with (with its learning-rate
    schedule), or None for a model never compiled."""
    if not getattr(model, "compiled", False):
      return None
    return model.optimizer

  def _unpacked(self, labels) -> tuple:
    """(y, sample_weight) of a batch's labels; sample_weight None where
    the data have none."""
    return labels if self._weighted else (labels, None)

  def _penalty(self) -> tf.Tensor:
    """The weight regularizers' penalty at the current weights, which
    Keras adds into the loss it reports (activity regularizers' losses,
    from `add_loss` in a call, are not in the figure)."""
    penalties = [tf.cast(keras.ops.sum(variable.regularizer(variable)),
                         tf.float32)
                 for variable in self._model.trainable_weights
                 if getattr(variable, "regularizer", None) is not None]
    return tf.add_n(penalties) if penalties else tf.constant(0.0)

  def _initial_state(self) -> list:
    return [tf.constant(initial, dtype) for initial, dtype in
            zip(self._initial, self._dtypes)]

  def _shares(self, state: list) -> list:
    """A state's difference from the initial one, each variable flat."""
    return [tf.reshape(tf.cast(value, tf.float64) - initial.astype(np.float64),
                       [-1]) for value, initial in zip(state, self._initial)]

  def _values(self, y, outputs) -> tf.Tensor:
    """The compiled loss's values, unreduced: its `call`, on labels and
    outputs converted to its dtype as its `__call__` converts them."""
    return self._loss_fn.call(
        keras.ops.convert_to_tensor(y, self._loss_fn.dtype),
        keras.ops.convert_to_tensor(outputs, self._loss_fn.dtype))

  def _check_loss(self, given, y, y_pred) -> None:
    """The compiled loss on two examples gives a value per example, or a
    UserError naming the loss and the shapes."""
    where = (f"model.compile(loss={given}) on outputs "
             f"{y_pred.shape.as_list()} and labels {y.shape.as_list()}")
    try:
      values = self._values(y, y_pred)
    except Exception as e:  # the user's loss, or labels it does not fit
      raise UserError(f"{where}: {type(e).__name__}: {first_line(e)}"
                      ) from None
    if len(values.shape) == 0 or values.shape[0] != y_pred.shape[0]:
      raise UserError(f"{where}: it returned shape {values.shape.as_list()}"
                      "; the engine needs each example's loss, [batch]")

  def _check_summable(self, rng, y_spec, outputs) -> None:
    """Each metric's state after two batches is the initial state plus
    each batch's share, or a UserError naming the metric: only then is
    its figure exact from states summed across ranks."""
    if not self._metrics:
      return
    first, second = (_random_batch(rng, y_spec, outputs, _CHECK_BATCH)
                     for _ in range(2))
    update = self._metrics.stateless_update_state
    both = update(update(self._initial_state(), *first[:2],
                         sample_weight=first[2]),
                  *second[:2], sample_weight=second[2])
    added = [a + b for a, b in zip(
        self._shares(update(self._initial_state(), *first[:2],
                            sample_weight=first[2])),
        self._shares(update(self._initial_state(), *second[:2],
                            sample_weight=second[2])))]
    for owner, after, share in zip(self._owners, self._shares(both), added):
      if not np.allclose(after.numpy(), share.numpy(), rtol=1e-4, atol=1e-6):
        raise UserError(f"metric {owner!r}: its state does not add up "
                        "across batches (as a running maximum's), so it "
                        "cannot be summed across ranks; use a metric made "
                        "of sums or counts (a Mean, AUC, Precision, Recall)")


def _built(model: keras.Model, y, y_pred) -> tuple:
  """The compiled loss and its loss weight, with the compiled loss and
  metrics built on a batch's shapes as `fit` builds them: Keras' own
  resolution ("crossentropy" and "accuracy" chosen by the outputs' shape,
  a function wrapped in a Loss). Keras keeps it in the model's private
  _compile_loss and _compile_metrics (keras.src.trainers.compile_utils),
  the one place it exists."""
  # pylint: disable=protected-access
  compile_loss, compile_metrics = model._compile_loss, model._compile_metrics
  if not compile_loss.built:
    compile_loss.build(y, y_pred)
  if compile_metrics is not None and not compile_metrics.built:
    compile_metrics.build(y, y_pred)
  (_, loss_fn, loss_weight, _), = compile_loss._flat_losses
  return loss_fn, loss_weight


def _of_any_batch(spec: tf.TensorSpec) -> tf.TensorSpec:
  return tf.TensorSpec([None, *spec.shape[1:]], spec.dtype)


def _blank(spec) -> tf.Tensor:
  """Two blank examples of a feature's spec (unknown sizes as 1)."""
  shape = [dim if dim is not None else 1 for dim in spec.shape[1:]]
  return tf.zeros([2, *shape], spec.dtype)


def _random_batch(rng, y_spec, outputs, size: int) -> tuple:
  """Random labels shaped as `y_spec` (class ids below the outputs' width,
  for integer labels), outputs in [0, 1) shaped as `outputs`, and sample
  weights, for `size` examples."""
  shape = [size, *[dim or 1 for dim in y_spec.shape[1:]]]
  if y_spec.dtype.is_integer:
    y = rng.integers(0, max(2, outputs.shape[-1] or 2), shape)
  else:
    y = rng.random(shape)
  y_pred = rng.random([size, *outputs.shape[1:]])
  return (tf.constant(y, y_spec.dtype), tf.constant(y_pred, outputs.dtype),
          tf.constant(rng.uniform(0.5, 1.5, size), tf.float32))


def _named(loss) -> str:
  """The compiled loss as the user wrote it, for a message: a string
  quoted, a loss class's or a function's name, a dict or list of them."""
  if isinstance(loss, dict):
    return "{" + ", ".join(f"{key!r}: {_named(value)}"
                           for key, value in loss.items()) + "}"
  if isinstance(loss, (list, tuple)):
    return "[" + ", ".join(map(_named, loss)) + "]"
  if isinstance(loss, str):
    return repr(loss)
  return getattr(loss, "__name__", type(loss).__name__)


def _figures_of(name: str, value) -> dict:
  """A metric's result as figures: one, or `name/i` for each value of a
  metric that gives several (F1Score without averaging)."""
  value = np.asarray(value, np.float64)
  if value.size == 1:
    return {name: float(value.reshape(()))}
  return {f"{name}/{i}": float(v) for i, v in enumerate(value.reshape(-1))}
