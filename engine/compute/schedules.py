"""Learning rates: scaling with the number of processes, warmup, then decay.

The rate is a function of the global step. Keras optimizers evaluate their
schedule at their own step counter inside the compiled train step, so a
changing rate never retraces the step, and a run resumed from a checkpoint
(which restores the counter) continues on the same curve.
"""
import math

import tensorflow as tf

from engine.core.errors import UserError

SCALINGS = ("linear", "sqrt", "none")
DECAYS = ("constant", "step", "cosine", "linear")


def scaled_rate(base_lr: float, world_size: int, scaling: str) -> float:
  """The rate for `world_size` processes, from the one-process rate.

  Linear (Goyal et al. 2017) keeps the update per example constant as the
  global batch grows with the processes; sqrt keeps the gradient noise
  constant (the central-limit argument of the Horovod lab), a gentler choice
  for adaptive optimizers.
  """
  if scaling == "linear":
    return base_lr * world_size
  if scaling == "sqrt":
    return base_lr * math.sqrt(world_size)
  if scaling == "none":
    return base_lr
  raise UserError(f"--lr_scaling={scaling} is unknown; choose one of "
                  f"{', '.join(SCALINGS)}")


class WarmupThenDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
  """Gradual warmup from base_lr to the scaled rate, then constant, step or
  cosine decay.

  Warmup (Goyal et al. 2017; Horovod's LearningRateWarmupCallback) raises the
  rate linearly per step, from the one-process rate at step 0 to the scaled
  rate after `warmup_epochs`, so a large global batch does not start with a
  large step from random weights. Step decay multiplies the rate by
  `decay_factor` at each epoch listed in `decay_epochs` (counted from the
  start of training, as the lab's 15, 25, 35); cosine and linear decay fall
  from the peak after warmup to 0 at the end of `epochs`, per step
  (warmup then linear decay is the one-cycle schedule's shape).

  The peak rate and the length of an epoch in steps depend on the number of
  processes, which an elastic run changes between two steps: `set_world`
  sets them, in variables the compiled step reads, so it is not retraced.

  `factor` multiplies the whole curve: a rollback after a divergence
  lowers it (--rollback_lr_factor), and checkpoints keep it, so a resumed
  run continues at the lowered rate.
  """

  def __init__(self, *, base_lr: float, scaling: str, warmup_epochs: float,
               decay: str, epochs: int, decay_epochs=(),
               decay_factor: float = 0.1):
    super().__init__()
    scaled_rate(base_lr, 1, scaling)  # an unknown scaling fails here, early
    if decay not in DECAYS:
      raise UserError(f"--lr_schedule={decay} is unknown; choose one of "
                      f"{', '.join(DECAYS)}")
    if decay in ("cosine", "linear") and epochs <= warmup_epochs:
      raise UserError(f"--lr_schedule={decay} needs more epochs than "
                      "--warmup_epochs")
    self.base_lr = base_lr
    self.scaling = scaling
    self.warmup_epochs = warmup_epochs
    self.decay = decay
    self.epochs = epochs
    self.decay_epochs = tuple(decay_epochs)
    self.decay_factor = decay_factor
    self.world_size = 0  # set_world() must come first
    variable = lambda name: tf.Variable(0.0, trainable=False, name=name)
    self._peak_lr = variable("peak_lr")
    self._steps_per_epoch = variable("steps_per_epoch")
    self._warmup_steps = variable("warmup_steps")
    self._total_steps = variable("total_steps")
    self.factor = tf.Variable(1.0, trainable=False, name="lr_factor")

  def set_world(self, *, world_size: int, steps_per_epoch: int) -> None:
    """The rate for `world_size` processes taking `steps_per_epoch` steps
    per epoch, from the next step on."""
    self.world_size = world_size
    self._peak_lr.assign(self.peak_lr)
    self._steps_per_epoch.assign(steps_per_epoch)
    self._warmup_steps.assign(round(self.warmup_epochs * steps_per_epoch))
    self._total_steps.assign(self.epochs * steps_per_epoch)

  @property
  def peak_lr(self) -> float:
    return scaled_rate(self.base_lr, self.world_size, self.scaling)

  def __call__(self, step):
    return self.factor * self._unscaled(tf.cast(step, tf.float32))

  def _unscaled(self, step):
    if self.warmup_epochs:
      warmup_steps = self._warmup_steps
      progress = step / warmup_steps
      warm = self.base_lr + (self._peak_lr - self.base_lr) * progress
      return tf.where(step < warmup_steps, warm, self._decayed(step))
    return self._decayed(step)

  def _decayed(self, step):
    if self.decay == "step":
      epoch = tf.floor(step / self._steps_per_epoch)
      passed = tf.add_n([tf.cast(epoch >= e, tf.float32)
                         for e in self.decay_epochs] or [tf.zeros([])])
      return self._peak_lr * tf.pow(self.decay_factor, passed)
    if self.decay in ("cosine", "linear"):
      fraction = ((step - self._warmup_steps)
                  / (self._total_steps - self._warmup_steps))
      fraction = tf.clip_by_value(fraction, 0.0, 1.0)
      if self.decay == "linear":
        return self._peak_lr * (1.0 - fraction)
      return self._peak_lr * 0.5 * (1.0 + tf.cos(math.pi * fraction))
    return tf.identity(self._peak_lr)

  def get_config(self):
    return dict(base_lr=self.base_lr, scaling=self.scaling,
                warmup_epochs=self.warmup_epochs, decay=self.decay,
                epochs=self.epochs, decay_epochs=self.decay_epochs,
                decay_factor=self.decay_factor)
