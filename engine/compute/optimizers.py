"""Optimizers by name, and their state.

adam, adamw, sgd and lamb are Keras' own optimizers, the first three with
each variable's update run by one TensorFlow kernel (`Adam`, `AdamW`,
`SGD`); novograd, a
large-batch optimizer of the Horovod lab, is the engine's own, written on
Keras 3's optimizer API (`build`, `update_step`). The lab took NovoGrad and
LAMB from tensorflow-addons, which is end-of-life and does not import on
Keras 3. Ours and Keras' Lamb (at addons' epsilon, 1e-6) compute what the
engine's tf_keras versions computed, which were addons' own to float32
rounding (tests/test_optimizers.py runs them on the same steps as those
recorded at the last tf_keras revision), so recipes tuned with addons keep
their learning rates.

Weight decay is not an optimizer option here, except AdamW's: it is the L2
term the kernels' regularizers add to the loss (--weight_decay; the
built-in models' own, the engine's for any other model: weight_decay.py),
so its gradient 2 * weight_decay * w joins every gradient before the
optimizer sees it:
- sgd: classic weight decay, scaled by the learning rate (and momentum);
- adam: L2 regularization, divided by Adam's second-moment estimate like the
  rest of the gradient;
- adamw: AdamW's decoupled decay (Loshchilov and Hutter 2019) instead: the
  decay, weight_decay * lr * w, is taken from the weights apart from Adam's
  step, and no L2 term is added anywhere (weight_decay.py);
- novograd: normalized per layer together with the gradient;
- lamb: part of the update whose per-layer trust ratio LAMB computes.
NovoGrad and LAMB here have no decay of their own (addons' `weight_decay`,
which the lab left at 0), so decay is never applied twice.
"""
import keras
import tensorflow as tf

from engine.core.errors import UserError

# Optimizers whose weight decay is their own (decoupled), not the models'
# L2 term.
DECOUPLED_DECAY = ("adamw",)


def names() -> list[str]:
  return ["adam", "adamw", "lamb", "novograd", "sgd"]


def build(name: str, *, learning_rate, momentum: float, nesterov: bool,
          weight_decay: float = 0.0) -> keras.optimizers.Optimizer:
  """`learning_rate` is a float or a LearningRateSchedule of the step;
  `weight_decay` is AdamW's decoupled decay (other optimizers take theirs
  from the loss: above)."""
  if name == "sgd":
    return SGD(learning_rate, momentum=momentum, nesterov=nesterov)
  if name == "adam":
    return Adam(learning_rate)
  if name == "adamw":
    return AdamW(learning_rate, weight_decay=weight_decay)
  if name == "novograd":
    return NovoGrad(learning_rate)
  if name == "lamb":
    return keras.optimizers.Lamb(learning_rate, epsilon=1e-6)
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


class SGD(keras.optimizers.SGD):
  """Keras' SGD, each variable's update in one TensorFlow kernel
  (ResourceApplyKerasMomentum, ResourceApplyGradientDescent: tf_keras'
  SGD ran them) rather than Keras 3's five elementwise ops a variable,
  each a pass over the weights' memory: on CosmoFlow's reference network
  (4.8M weights) 3.5 ms a step against 8.0 on one thread
  (bench/RESULTS.md, "CosmoFlow's reference network"). The same update,
  m = momentum * m - lr * g and w += m (Nesterov's: w += momentum * m -
  lr * g), on the same slots, so checkpoints of either read alike."""

  def update_step(self, gradient, variable, learning_rate):
    learning_rate = tf.cast(learning_rate, variable.dtype)
    gradient = tf.cast(gradient, variable.dtype)
    if not self.momentum:
      tf.raw_ops.ResourceApplyGradientDescent(
          var=_handle(variable), alpha=learning_rate, delta=gradient)
      return
    tf.raw_ops.ResourceApplyKerasMomentum(
        var=_handle(variable),
        accum=_handle(self.momentums[self._get_variable_index(variable)]),
        lr=learning_rate, grad=gradient,
        momentum=tf.cast(self.momentum, variable.dtype),
        use_nesterov=self.nesterov)


class _AdamInOneKernel:
  """Keras' Adam update, each variable's in one TensorFlow kernel
  (ResourceApplyAdam, which TensorFlow 1's and tf_keras' legacy Adam ran)
  rather than Keras 3's twelve elementwise ops, each a pass over a
  variable's memory: ResNet50V2's 23.5M weights in 52-59 ms a step against
  106-129, 2 processes on a core each (bench/RESULTS.md, "Processes of one
  host"). The same slots, so checkpoints of either read alike, and Keras'
  update to the bit at the betas rounded to float32: the kernel takes 1 -
  beta in float32 (1 - float32(0.999) is 0.001 * (1 - 1.3e-5)) where Keras
  takes it in Python's float, which moves a step by up to 1.3e-5 of
  itself. Not amsgrad, which the engine does not build."""

  def update_step(self, gradient, variable, learning_rate):
    dtype = variable.dtype
    index = self._get_variable_index(variable)
    step = tf.cast(self.iterations + 1, dtype)
    beta_1, beta_2 = (tf.cast(beta, dtype) for beta in (self.beta_1,
                                                        self.beta_2))
    tf.raw_ops.ResourceApplyAdam(
        var=_handle(variable), m=_handle(self._momentums[index]),
        v=_handle(self._velocities[index]),
        beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
        lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
        epsilon=tf.cast(self.epsilon, dtype),
        grad=tf.cast(gradient, dtype))


class Adam(_AdamInOneKernel, keras.optimizers.Adam):
  """Keras' Adam, its update in one kernel a variable."""


class AdamW(_AdamInOneKernel, keras.optimizers.AdamW):
  """Keras' AdamW: its decoupled decay is Keras' own, taken from the
  weights before each update (`apply`), apart from Adam's step."""


class NovoGrad(keras.optimizers.Optimizer):
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

  The rate, betas and epsilon are taken in the variable's dtype, so that
  1 - beta is too, as addons did: 1 - float32(0.999) differs from 0.001 by
  1.3e-5 of itself, far more than a float32 rounding.
  """

  def __init__(self, learning_rate=0.001, *, beta_1=0.9, beta_2=0.999,
               epsilon=1e-7, name="NovoGrad", **options):
    super().__init__(learning_rate, name=name, **options)
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon

  def build(self, variables):
    if self.built:
      return
    super().build(variables)
    self._momentums = [self.add_variable_from_reference(v, "momentum")
                       for v in variables]
    self._squared_norms = [
        self.add_variable(shape=(), dtype=v.dtype,
                          name=f"{_name(v)}_squared_norm")
        for v in variables]

  def update_step(self, gradient, variable, learning_rate):
    index = self._get_variable_index(variable)
    momentum, squared_norm = (self._momentums[index],
                              self._squared_norms[index])
    dtype = variable.dtype
    lr, beta_1, beta_2, epsilon = (
        tf.cast(value, dtype) for value in
        (learning_rate, self.beta_1, self.beta_2, self.epsilon))
    gradient = tf.cast(gradient, dtype)
    this_norm = tf.reduce_sum(tf.square(gradient))
    self.assign(squared_norm, tf.where(
        tf.equal(self.iterations, 0), this_norm,
        squared_norm * beta_2 + this_norm * (1 - beta_2)))
    normalized = gradient / (tf.sqrt(squared_norm) + epsilon)
    self.assign(momentum, momentum * beta_1 - normalized * lr)
    self.assign_add(variable, momentum)

  def get_config(self):
    return dict(super().get_config(), beta_1=self.beta_1,
                beta_2=self.beta_2, epsilon=self.epsilon)


def _handle(variable) -> tf.Tensor:
  """The resource handle of a Keras variable or of the tf.Variable it
  holds (Keras' TensorFlow optimizer passes the latter)."""
  return (variable.value if isinstance(variable, keras.Variable)
          else variable).handle


def _name(variable) -> str:
  """A variable's name without TensorFlow's ":0"."""
  return variable.name.split(":")[0].replace("/", "_")
