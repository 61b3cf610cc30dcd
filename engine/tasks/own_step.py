"""A model's own `train_step` honoured as a task: Keras' GAN and custom-step
guides, trained data-parallel by the engine.

A Keras user who overrides `train_step(self, data)` computes gradients
under tapes of their own and hands them to an optimizer the model holds
(`self.optimizer.apply_gradients(zip(grads, variables))`,
`self.optimizer.apply(grads, variables)`, a GAN's `self.d_optimizer` and
`self.g_optimizer`). Horovod's DistributedOptimizer made such a step
data-parallel on Keras 2 by averaging the gradients inside the optimizer;
`OwnStep` does the same through the engine's step (engine/compute/
task_step.py): while the user's step runs, each optimizer it applies is
wrapped so that its `apply` (which `apply_gradients` calls) first averages
the gradients across ranks with the engine's reduction, then applies them
unless one is not finite on any rank. The wrappers are removed when the
user's step returns.

Which optimizers, and which variables each updates, are learnt once, when
the task is made, by tracing the user's step without running it: those it
applies, in the order it first applies them (a compile() default it never
applies is left out). The engine builds their slots then, and checkpoints
and broadcasts them as an optimizers.Several keyed by attribute name
(`OwnStep.optimizers`).

The batch: the engine's step is given `(x, labels)`, `labels` being y, or
`(y, sample_weight)` of a dataset that yields sample weights
(engine/datasets/pipelines.py). The user's step gets Keras' `data` back in
the shape their dataset yields it (`parts`): x alone (a GAN's images: the
pipeline gives dummy labels, ignored), `(x, y)`, or
`(x, y, sample_weight)`.

The figures are the keys of the dict the user's step returns, flattened as
Keras' logs are. Exact across ranks: a key named as one of `model.metrics`
(the guides' `{m.name: m.result() for m in self.metrics}`, or a tracker
named for its figure): the metric's state is set to its initial one before
each step, so what the step leaves in it is the batch's share; the shares
are summed over every rank's batches like any task's sums, and the
metric's result is read once from the summed state. That is exact for
metrics made of sums and counts (Mean, Sum, accuracies, AUC), not for a
running maximum. Any other value the step returns (a tensor) is the mean,
over the epoch's examples on every rank, of its value at each step. So the
model's metrics hold the last batch's state after a step, not the epoch's;
the engine's figures are the epoch's.

Evaluation runs the model's `test_step` (its override, or Keras' own on
the compiled loss and metrics) the same way (`eval_sums`); a model it
cannot run (a GAN of the guide, with no `call`) has no validation figures,
and asking for them is one line.
"""
import contextlib
from typing import Optional

import keras
import tensorflow as tf

from engine.core.errors import first_line
from engine.core.errors import UserError
from engine.tasks.task import Task

LOSS = "loss"


def overrides_train_step(model: keras.Model) -> bool:
  """Whether `model`'s class writes a `train_step` of its own, which the
  engine then trains instead of a loss."""
  return getattr(type(model), "train_step", None) is not keras.Model.train_step


def held_optimizers(model: keras.Model) -> dict:
  """The optimizers `model` holds as attributes (`optimizer`,
  `d_optimizer`, ...), by attribute name; a mixed_float16 loss-scale
  optimizer is refused in one line."""
  held = {name: value for name, value in vars(model).items()
          if isinstance(value, keras.optimizers.Optimizer)
          and not name.startswith("_")}
  for name, optimizer in held.items():
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
      raise UserError(f"model.{name} is a LossScaleOptimizer (mixed_float16)"
                      ": a train_step of the model's own trains in float32 "
                      "or bfloat16; drop the float16 policy")
  return held


class OwnStep(Task):
  """The train step (and test step) the user's model defines. Made by
  `OwnStep.of`."""

  def __init__(self, info=None, *, model: keras.Model, parts: int,
               applied: dict, train_keys: dict, test_keys: Optional[dict]):
    super().__init__(info)
    self._model = model
    self._parts = parts
    # Attribute name -> the variables that optimizer updates.
    self._applied = applied
    self.optimizers = tuple(applied)
    self._train_keys, self._test_keys = train_keys, test_keys
    metrics = {metric.name: metric for metric in model.metrics}
    keys = {**train_keys, **(test_keys or {})}
    # Each returned key named as a metric: its metric and initial state.
    self._metrics = {key: (metrics[key], [tf.constant(v) for v in
                                          metrics[key].stateless_reset_state()])
                     for key in keys if key in metrics}
    self._values = [key for key in keys if key not in self._metrics]
    for key in self._values:
      if keys[key]:
        raise UserError(f"model {model.name!r}: its step returns a dict "
                        f"under {key!r}, which is none of model.metrics; "
                        "return each figure under a key of its own")
    self.best_metric = (f"{LOSS}:min" if LOSS in keys
                        else f"{next(iter(keys))}:min")

  @classmethod
  def of(cls, model: keras.Model, info=None, *, x_spec=None, y_spec=None,
         parts: int = 2) -> "OwnStep":
    """The task of `model`'s own train step, for batches whose features
    are `x_spec` and labels `y_spec` (tf.TensorSpecs, or a dict of them
    for x; by default the data set's, `info`'s images and labels), given
    to the user's step as `parts` of (x, y, sample_weight). Traces the
    user's train_step (and test_step) once without running them; what
    the engine cannot honour is one UserError line."""
    if parts not in (1, 2, 3):
      raise UserError(f"parts={parts}: a Keras dataset yields x, (x, y) or "
                      "(x, y, sample_weight): 1, 2 or 3")
    if not overrides_train_step(model):
      raise UserError(f"model {model.name!r} does not override train_step;"
                      " compile it with a loss, or give --task")
    if x_spec is None:
      x_spec = tf.TensorSpec([None, *info.image_shape], tf.float32)
      y_spec = tf.TensorSpec([None, *info.label_shape], info.label_dtype)
    specs = (x_spec, (y_spec, tf.TensorSpec([None], tf.float32))
             if parts == 3 else y_spec)
    held = held_optimizers(model)
    applied, train_keys = _traced(model, model.train_step, held, parts,
                                  specs, "train_step")
    if not applied:
      raise UserError(f"model {model.name!r}: its train_step applies none of"
                      f" its optimizers ({', '.join(held) or 'it holds none'}"
                      "); apply its gradients with self.optimizer."
                      "apply_gradients(...) or .apply(...)")
    try:
      _, test_keys = _traced(model, model.test_step, {}, parts, specs,
                             "test_step")
    except UserError:
      test_keys = None  # no evaluation: eval_sums says so if asked
    task = cls(info, model=model, parts=parts, applied=applied,
               train_keys=train_keys, test_keys=test_keys)
    task._specs = specs
    return task

  def build_model(self, build) -> keras.Model:
    return self._model

  @property
  def evaluates(self) -> bool:
    """Whether the model's test_step runs (a GAN of the guide's, with no
    call(), has none to run)."""
    return self._test_keys is not None

  def batch_signature(self, image_shape: tuple) -> tuple:
    del image_shape  # the pipeline's own
    return self._specs

  def optimized_variables(self, model: keras.Model) -> dict[str, list]:
    return dict(self._applied)

  def train_step(self, model, optimizers, images, labels, step):
    """The user's train_step on this rank's batch, its optimizers'
    updates averaged across ranks (see the module's docstring)."""
    with _wrapped(optimizers, lambda optimizer: _averaging(optimizer,
                                                           step)):
      logs = self._run(model.train_step, images, labels)
    return self._loss_of(logs), self._sums_of(logs, images, self._train_keys)

  def eval_sums(self, model, images, labels) -> dict:
    """One evaluation batch's share of `sums()`, from the model's
    test_step; inside the eval step."""
    if self._test_keys is None:
      raise UserError(f"model {model.name!r}: its test_step cannot run (a "
                      "model without call()); override test_step to "
                      "evaluate it, or give no validation data")
    logs = self._run(model.test_step, images, labels)
    return self._sums_of(logs, images, self._test_keys)

  def sums(self) -> dict[str, tuple]:
    sums = {key: () for key in self._values}
    for key, (_, initial) in self._metrics.items():
      sums.update({f"{key}/{i}": (int(tf.size(value)),)
                   for i, value in enumerate(initial)})
    return sums

  def figures(self, sums) -> dict:
    """Each returned key's figure over the summed shares; None for one
    the split's step does not return (a train-only figure in
    validation)."""
    examples = max(float(sums["examples"]), 1.0)
    figures = {}
    for key in self._values:
      figures[key] = float(sums[key]) / examples
    for key, (metric, initial) in self._metrics.items():
      shares = [sums[f"{key}/{i}"] for i in range(len(initial))]
      if not any(share.any() for share in shares):
        figures[key] = None
        continue
      state = [tf.cast(tf.reshape(tf.constant(share), value.shape)
                       + tf.cast(value, tf.float64), value.dtype)
               for share, value in zip(shares, initial)]
      figures.update(_flat(key, metric.stateless_result(state)))
    return figures

  def _run(self, function, images, labels) -> dict:
    """`function` (the user's train_step or test_step) on Keras' `data`,
    with each returned metric's state from its initial one: what the step
    leaves in it is the batch's share."""
    for metric, initial in self._metrics.values():
      for variable, value in zip(metric.variables, initial):
        variable.assign(value)
    return function(_data(images, labels, self._parts))

  def _sums_of(self, logs: dict, images, keys: dict) -> dict:
    """The batch's share of `sums()`: the metrics' states as the step left
    them, the other values times the batch's examples; zero for what the
    step does not return."""
    examples = tf.cast(tf.shape(tf.nest.flatten(images)[0])[0], tf.float64)
    sums = {}
    for key in self._values:
      sums[key] = (examples * tf.cast(logs[key], tf.float64) if key in keys
                   else tf.constant(0.0, tf.float64))
    for key, (metric, initial) in self._metrics.items():
      for i, value in enumerate(initial):
        share = (tf.cast(metric.variables[i], tf.float64)
                 - tf.cast(value, tf.float64)) if key in keys else (
                     tf.zeros(value.shape, tf.float64))
        sums[f"{key}/{i}"] = tf.reshape(share, [-1])
    return sums

  @staticmethod
  def _loss_of(logs: dict) -> tf.Tensor:
    """The step's loss, checked for being finite on every rank: its
    `loss`, else the sum of everything it returns."""
    values = [logs[LOSS]] if LOSS in logs else tf.nest.flatten(logs)
    return tf.add_n([tf.cast(tf.reshape(v, []), tf.float32) for v in values])


def _data(images, labels, parts: int):
  """Keras' `data` for the user's step, of `parts` parts: x, (x, y) or
  (x, y, sample_weight), from the engine's (x, labels), labels y or, of
  three parts, (y, sample_weight)."""
  if parts == 3:
    return (images, *labels)
  return (images, (images, labels))[parts - 1]


def _flat(key: str, result) -> dict:
  """A metric's result as logs: a dict of results (Keras' compiled
  metrics) by their own names, as Keras flattens its logs."""
  if isinstance(result, dict):
    return {name: float(value) for name, value in result.items()}
  return {key: float(result)}


@contextlib.contextmanager
def _wrapped(optimizers: dict, apply_of):
  """Each of `optimizers` with its `apply` (which `apply_gradients`
  calls) replaced by `apply_of(optimizer)` for the block: while the
  user's step is traced."""
  for optimizer in optimizers.values():
    optimizer.apply = apply_of(optimizer)
  try:
    yield
  finally:
    for optimizer in optimizers.values():
      del optimizer.apply


def _averaging(optimizer, step):
  """`optimizer`'s apply, its gradients averaged across ranks by the
  engine's step and applied by it unless not finite. The user's loss is
  their own: its regularization is whatever their step put in it, so no
  penalty is added here (as `step.average_gradients` would)."""
  def apply(gradients, variables=None):
    variables = _variables_of(optimizer, variables)
    # pylint: disable-next=protected-access
    averaged = step.averaged(list(gradients))
    del optimizer.apply  # Keras' own, for the update itself
    try:
      step.apply_gradients(optimizer, averaged, variables)
    finally:
      optimizer.apply = apply
  return apply


def _variables_of(optimizer, variables) -> list:
  """The variables an `apply(gradients, variables)` updates: those given,
  or, for `apply(gradients)`, the built optimizer's."""
  if variables is not None:
    return list(variables)
  if not optimizer.built:
    raise UserError(f"{optimizer.name}.apply(gradients) without its "
                    "variables, before the optimizer is built; pass them: "
                    "apply(gradients, variables)")
  # pylint: disable-next=protected-access
  return list(optimizer._trainable_variables)


def _traced(model, function, held: dict, parts: int, specs, what: str
            ) -> tuple[dict, dict]:
  """`function` (the user's train_step or test_step) traced on `specs`
  without running it: the optimizers of `held` it applies, in order, each
  with the variables it updates, and the keys it returns (as a dict,
  each to whether its value is a dict). A step that fails to trace is
  one line."""
  applied = {}
  def recording(optimizer):
    name = next(n for n, o in held.items() if o is optimizer)
    def apply(gradients, variables=None):
      del gradients
      known = applied.setdefault(name, [])
      known += [v for v in _variables_of(optimizer, variables)
                if not any(v is k for k in known)]
    return apply

  def traced(images, labels):
    return function(_data(images, labels, parts))

  try:
    with _wrapped(held, recording):
      logs = tf.function(traced).get_concrete_function(
          *specs).structured_outputs
  except UserError:
    raise
  except Exception as e:  # the user's step
    raise UserError(f"model {model.name!r}: its {what} raised "
                    f"{type(e).__name__}: {first_line(e)}") from None
  if not isinstance(logs, dict) or not logs:
    raise UserError(f"model {model.name!r}: its {what} returned "
                    f"{type(logs).__name__}; return a dict of its metrics' "
                    "results, as Keras' guides do")
  return applied, {key: isinstance(value, dict)
                   for key, value in logs.items()}
