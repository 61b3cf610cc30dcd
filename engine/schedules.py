"""Learning rates: scaling with the number of processes, warmup, then decay.

The rate is a function of the global step. Keras optimizers evaluate their
schedule at their own step counter inside the compiled train step, so a
changing rate never retraces the step, and a run resumed from a checkpoint
(which restores the counter) continues on the same curve.
"""
import math

import tensorflow as tf

from engine.errors import UserError

SCALINGS = ("linear", "sqrt", "none")
DECAYS = ("constant", "step", "cosine")


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
  """Gradual warmup from base_lr to peak_lr, then constant, step or cosine.

  Warmup (Goyal et al. 2017; Horovod's LearningRateWarmupCallback) raises the
  rate linearly per step, from the one-process rate at step 0 to the scaled
  rate after `warmup_steps`, so a large global batch does not start with a
  large step from random weights. Step decay multiplies the rate by
  `decay_factor` at each epoch listed in `decay_epochs` (counted from the
  start of training, as the lab's 15, 25, 35); cosine decay falls from the
  peak after warmup to 0 at `total_steps`.
  """

  def __init__(self, *, base_lr: float, peak_lr: float, warmup_steps: int,
               decay: str, steps_per_epoch: int, decay_epochs=(),
               decay_factor: float = 0.1, total_steps: int = 0):
    super().__init__()
    if decay not in DECAYS:
      raise UserError(f"--lr_schedule={decay} is unknown; choose one of "
                      f"{', '.join(DECAYS)}")
    if decay == "cosine" and total_steps <= warmup_steps:
      raise UserError("--lr_schedule=cosine needs more epochs than "
                      "--warmup_epochs")
    self.base_lr = base_lr
    self.peak_lr = peak_lr
    self.warmup_steps = warmup_steps
    self.decay = decay
    self.steps_per_epoch = steps_per_epoch
    self.decay_epochs = tuple(decay_epochs)
    self.decay_factor = decay_factor
    self.total_steps = total_steps

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    if self.warmup_steps:
      progress = step / self.warmup_steps
      warm = self.base_lr + (self.peak_lr - self.base_lr) * progress
      return tf.where(step < self.warmup_steps, warm, self._decayed(step))
    return self._decayed(step)

  def _decayed(self, step):
    if self.decay == "step":
      epoch = tf.floor(step / self.steps_per_epoch)
      passed = tf.add_n([tf.cast(epoch >= e, tf.float32)
                         for e in self.decay_epochs] or [tf.zeros([])])
      return self.peak_lr * tf.pow(self.decay_factor, passed)
    if self.decay == "cosine":
      fraction = ((step - self.warmup_steps)
                  / (self.total_steps - self.warmup_steps))
      fraction = tf.clip_by_value(fraction, 0.0, 1.0)
      return self.peak_lr * 0.5 * (1.0 + tf.cos(math.pi * fraction))
    return tf.fill([], tf.cast(self.peak_lr, tf.float32))

  def get_config(self):
    return dict(base_lr=self.base_lr, peak_lr=self.peak_lr,
                warmup_steps=self.warmup_steps, decay=self.decay,
                steps_per_epoch=self.steps_per_epoch,
                decay_epochs=self.decay_epochs,
                decay_factor=self.decay_factor, total_steps=self.total_steps)
