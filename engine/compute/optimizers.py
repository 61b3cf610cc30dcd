"""Optimizers by name, and their state.

sgd and adam are Keras' own optimizers. novograd and lamb, the large-batch
optimizers of the Horovod lab, are the engine's own, written on the same
Keras optimizer API: the lab took them from tensorflow-addons, which is
end-of-life, does not import on TensorFlow 2.16 and later, and has no
wheels past Python 3.11. Ours compute what addons 0.23.0's compute with
their default hyperparameters, to float32 rounding (tests/test_optimizers.py
runs both on the same steps), so recipes tuned with addons keep their
learning rates.

Weight decay is not an optimizer option here: it is the L2 term the models'
kernel regularizers add to the loss (--weight_decay), so its gradient
2 * weight_decay * w joins every gradient before the optimizer sees it:
- sgd: classic weight decay, scaled by the learning rate (and momentum);
- adam: L2 regularization, divided by Adam's second-moment estimate like the
  rest of the gradient (not AdamW's decoupled decay);
- novograd: normalized per layer together with the gradient;
- lamb: part of the update whose per-layer trust ratio LAMB computes.
NovoGrad and LAMB here have no decay of their own (addons' `weight_decay`,
which the lab left at 0), and Keras' decoupled `weight_decay` stays off, so
decay is never applied twice.
"""
import tensorflow as tf

from engine.core.errors import UserError


def names() -> list[str]:
  return ["adam", "lamb", "novograd", "sgd"]


def build(name: str, *, learning_rate, momentum: float, nesterov: bool,
          xla: bool = False) -> tf.keras.optimizers.Optimizer:
  """`learning_rate` is a float or a LearningRateSchedule of the step.

  `xla` compiles each variable's update (which Keras does on GPUs only);
  XLA is the run's choice (--xla), not Keras' default.
  """
  if name == "sgd":
    return tf.keras.optimizers.SGD(learning_rate, momentum=momentum,
                                   nesterov=nesterov, jit_compile=xla)
  if name == "adam":
    return tf.keras.optimizers.Adam(learning_rate, jit_compile=xla)
  if name == "novograd":
    return NovoGrad(learning_rate, jit_compile=xla)
  if name == "lamb":
    return LAMB(learning_rate, jit_compile=xla)
  raise UserError(f"--optimizer={name} is unknown; choose one of "
                  f"{', '.join(names())}")


def build_state(optimizer, variables) -> None:
  """Creates the optimizer's slots for `variables` now, not at its first step.

  A tf.function whose first call creates variables is traced twice; with the
  slots made beforehand the train step is traced once.
  """
  optimizer.build(variables)


def state(optimizer) -> list[tf.Variable]:
  """The optimizer's variables: its step counter first, then its slots."""
  return list(optimizer.variables)


class Several(tf.Module):
  """Named optimizers for a task's own train step (a GAN's generator and
  discriminator), each built from the optimizer flags: checkpointed,
  restored and broadcast as one optimizer is. Each applies its update once
  a step, so their step counters (and learning rates) go alike."""

  def __init__(self, by_name: dict):
    super().__init__(name="optimizers")
    self.by_name = dict(by_name)

  def build(self, variables: dict) -> None:
    """`variables`: each optimizer's name -> the variables it updates."""
    for name, optimizer in self.by_name.items():
      build_state(optimizer, variables[name])

  @property
  def variables(self) -> list[tf.Variable]:
    return [v for optimizer in self.by_name.values() for v in state(optimizer)]

  @property
  def iterations(self) -> tf.Variable:
    """The step counter (the first optimizer's; the others' go alike)."""
    return next(iter(self.by_name.values())).iterations


def step(optimizer) -> int:
  """The step counter: the steps taken (the first of Several's; they go
  alike)."""
  return int(optimizer.iterations.numpy())


def set_step(optimizer, step: int) -> None:
  """Sets the step counter (of each of Several optimizers), which the
  learning-rate schedule reads."""
  for each in (optimizer.by_name.values() if isinstance(optimizer, Several)
               else [optimizer]):
    each.iterations.assign(step)


class _TwoMoments(tf.keras.optimizers.Optimizer):
  """What NovoGrad and LAMB share: a learning rate, two moment decays and
  an epsilon, and two slots per variable, its first moment (of its shape)
  and its second (of `_SECOND_MOMENT_SHAPE`, or of its shape if None).

  `options` are Keras' own (jit_compile, clipping, use_ema): Horovod's
  DistributedOptimizer rebuilds an optimizer from its config, which holds
  them. Keras' decoupled weight decay defaults to None rather than Keras'
  0, which would still multiply every variable by 0 at every step.
  """
  _SECOND_MOMENT_SHAPE = None

  def __init__(self, learning_rate, *, beta_1: float, beta_2: float,
               epsilon: float, name: str, **options):
    options.setdefault("weight_decay", None)
    super().__init__(name=name, **options)
    self._learning_rate = self._build_learning_rate(learning_rate)
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon

  def build(self, var_list):
    super().build(var_list)
    if getattr(self, "_built", False):
      return
    self._built = True
    self._first_moments = [self.add_variable_from_reference(v, "m")
                           for v in var_list]
    self._second_moments = [
        self.add_variable_from_reference(v, "v",
                                         shape=self._SECOND_MOMENT_SHAPE)
        for v in var_list]

  def _moments(self, variable):
    index = self._index_dict[self._var_key(variable)]
    return self._first_moments[index], self._second_moments[index]

  def _constants(self, dtype):
    """The learning rate, betas and epsilon in `dtype`, so that 1 - beta
    is taken in `dtype` too, as addons did: 1 - float32(0.999) differs from
    0.001 by 1.3e-5 of itself, far more than a float32 rounding."""
    return (tf.cast(self.learning_rate, dtype), tf.cast(self.beta_1, dtype),
            tf.cast(self.beta_2, dtype), tf.cast(self.epsilon, dtype))

  def get_config(self):
    return dict(super().get_config(),
                learning_rate=self._serialize_hyperparameter(
                    self._learning_rate),
                beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)


class NovoGrad(_TwoMoments):
  """NovoGrad (Ginsburg et al. 2019, arXiv:1905.11286): momentum on
  gradients normalized per layer.

  The second moment is one scalar per variable, a moving average of the
  squared norm of its gradient, which is why a layer's step does not grow
  with its gradients' scale, and why the state is half Adam's. It starts
  at the first gradient's squared norm, not at zero, so it needs no bias
  correction. The momentum is addons' (Keras' velocity form): the learning
  rate multiplies each gradient as it enters, m = beta_1 * m - lr * g', and
  w += m, so momentum gathered earlier keeps the rate it was taken at;
  m = beta_1 * m + g', w -= lr * m would differ under a schedule.
  """
  _SECOND_MOMENT_SHAPE = ()

  def __init__(self, learning_rate=0.001, *, beta_1=0.9, beta_2=0.999,
               epsilon=1e-7, name="NovoGrad", **options):
    super().__init__(learning_rate, beta_1=beta_1, beta_2=beta_2,
                     epsilon=epsilon, name=name, **options)

  def update_step(self, gradient, variable):
    momentum, squared_norm = self._moments(variable)
    lr, beta_1, beta_2, epsilon = self._constants(variable.dtype)
    this_norm = tf.reduce_sum(tf.square(gradient))
    squared_norm.assign(tf.where(
        tf.equal(self.iterations, 0), this_norm,
        squared_norm * beta_2 + this_norm * (1 - beta_2)))
    normalized = gradient / (tf.sqrt(squared_norm) + epsilon)
    momentum.assign(momentum * beta_1 - normalized * lr)
    variable.assign_add(momentum)


class LAMB(_TwoMoments):
  """LAMB (You et al. 2019, arXiv:1904.00962): Adam's step, rescaled per
  layer by the trust ratio ||w|| / ||step||.

  Every layer then moves by the learning rate relative to its own weights,
  whatever its gradients' scale, which is what keeps very large batches
  (and their large learning rates) stable. A layer whose weights or step
  are all zero (a fresh bias) takes Adam's step unscaled.
  """

  def __init__(self, learning_rate=0.001, *, beta_1=0.9, beta_2=0.999,
               epsilon=1e-6, name="LAMB", **options):
    super().__init__(learning_rate, beta_1=beta_1, beta_2=beta_2,
                     epsilon=epsilon, name=name, **options)

  def update_step(self, gradient, variable):
    m, v = self._moments(variable)
    lr, beta_1, beta_2, epsilon = self._constants(variable.dtype)
    step = tf.cast(self.iterations + 1, variable.dtype)
    m.assign(m * beta_1 + gradient * (1 - beta_1))
    v.assign(v * beta_2 + tf.square(gradient) * (1 - beta_2))
    adam_step = ((m / (1 - tf.pow(beta_1, step)))
                 / (tf.sqrt(v / (1 - tf.pow(beta_2, step))) + epsilon))
    weight_norm = tf.norm(variable)
    step_norm = tf.norm(adam_step)
    trust_ratio = tf.where((weight_norm > 0) & (step_norm > 0),
                           weight_norm / step_norm, 1.0)
    variable.assign_sub(trust_ratio * lr * adam_step)
