"""Learning rates: scaling with the number of processes, warmup, then decay.

The rate is a function of the global step. Keras optimizers evaluate their
schedule at their own step counter inside the compiled train step, so a
changing rate never retraces the step, and a run resumed from a checkpoint
(which restores the counter) continues on the same curve.
"""
import math

from absl import logging
import keras
import tensorflow as tf

from engine.core.errors import UserError

SCALINGS = ("linear", "sqrt", "none")
DECAYS = ("constant", "step", "table", "cosine", "linear")
TABLE_EXAMPLE = "32:0.25,64:0.125"  # MLPerf HPC CosmoFlow's decay_schedule


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


def decay_table(text: str) -> tuple:
  """--lr_decay_table's EPOCH:FACTOR,... as ((epoch, factor), ...), or a
  UserError naming the flag: epochs whole and increasing, factors
  positive."""
  table = []
  for entry in filter(None, (e.strip() for e in text.split(","))):
    epoch, _, factor = entry.partition(":")
    try:
      if not epoch.strip().isdigit():
        raise ValueError(epoch)
      table.append((int(epoch), float(factor)))
    except ValueError:
      raise UserError(f"--lr_decay_table={text}: {entry!r} is not "
                      "EPOCH:FACTOR; give whole epochs and factors, e.g. "
                      f"{TABLE_EXAMPLE}") from None
  check_table(tuple(table), text)
  return tuple(table)


def check_table(table: tuple, text: str = "") -> None:
  """A UserError unless `table`'s epochs increase and its factors are
  positive (finite: a rate of infinity is no rate)."""
  text = text or ",".join(f"{e}:{f:g}" for e, f in table)
  epochs = [epoch for epoch, _ in table]
  if epochs != sorted(set(epochs)) or (epochs and epochs[0] < 0):
    raise UserError(f"--lr_decay_table={text}: its epochs must increase, "
                    f"each once, from 0 on, e.g. {TABLE_EXAMPLE}")
  bad = [factor for _, factor in table if not 0 < factor < math.inf]
  if bad:
    raise UserError(f"--lr_decay_table={text}: factor {bad[0]:g}: each "
                    "factor must be a positive number (it multiplies the "
                    "peak rate)")


class WarmupThenDecay(keras.optimizers.schedules.LearningRateSchedule):
  """Gradual warmup from base_lr to the scaled rate, then constant, step,
  table, cosine or linear decay.

  Warmup (Goyal et al. 2017; Horovod's LearningRateWarmupCallback) raises the
  rate linearly per step, from the one-process rate at step 0 to the scaled
  rate after `warmup_epochs`, so a large global batch does not start with a
  large step from random weights. Step decay multiplies the rate by
  `decay_factor` at each epoch listed in `decay_epochs` (counted from the
  start of training, as the lab's 15, 25, 35), so factors compound. A
  table, `decay_table` ((epoch, factor), ...), is MLPerf HPC CosmoFlow's
  `decay_schedule` as its reference applies it (mlcommons/hpc,
  cosmoflow/utils/optimizers.py, through Keras' LearningRateScheduler,
  which counts epochs from 0): the rate is the peak x the factor of the
  last key before the current epoch, so `32: 0.25` makes the peak rule
  epochs 0-32 and a quarter of it epoch 33 on (the 34th), a step later than
  `decay_epochs=32` would; the factors replace each other, they do not
  compound (`64: 0.125` is an eighth of the peak). Cosine and linear decay fall
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
               decay_factor: float = 0.1, decay_table=()):
    super().__init__()
    scaled_rate(base_lr, 1, scaling)  # an unknown scaling fails here, early
    if decay not in DECAYS:
      raise UserError(f"--lr_schedule={decay} is unknown; choose one of "
                      f"{', '.join(DECAYS)}")
    if decay == "table" and not decay_table:
      raise UserError("--lr_schedule=table needs --lr_decay_table=EPOCH:"
                      f"FACTOR,..., e.g. the CosmoFlow reference's "
                      f"{TABLE_EXAMPLE}")
    check_table(tuple(decay_table))
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
    self.decay_table = tuple((int(e), float(f)) for e, f in decay_table)
    self.world_size = 0  # set_world() must come first
    variable = lambda name: tf.Variable(0.0, trainable=False, name=name)
    self._peak_lr = variable("peak_lr")
    self._steps_per_epoch = variable("steps_per_epoch")
    self._warmup_steps = variable("warmup_steps")
    self._total_steps = variable("total_steps")
    self.factor = tf.Variable(1.0, trainable=False, name="lr_factor")

  def set_world(self, *, world_size: int, steps_per_epoch: int) -> None:
    """The rate for `world_size` processes taking `steps_per_epoch` steps
    per epoch, from the next step on; logged, with the scaling rule."""
    self.world_size = world_size
    self._peak_lr.assign(self.peak_lr)
    self._steps_per_epoch.assign(steps_per_epoch)
    self._warmup_steps.assign(round(self.warmup_epochs * steps_per_epoch))
    self._total_steps.assign(self.epochs * steps_per_epoch)
    logging.info("learning rate %g x %d processes (%s) = %g%s", self.base_lr,
                 world_size, self.scaling, self.peak_lr,
                 f" after {self.warmup_epochs:g} warmup epochs"
                 if self.warmup_epochs else "")

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
    if self.decay == "table":
      # Boundaries in steps, compared with the step itself: exact wherever
      # float32 counts steps exactly (below 2^24).
      factor = tf.ones([])
      for epoch, value in self.decay_table:
        after = step >= (epoch + 1) * self._steps_per_epoch
        factor = tf.where(after, tf.constant(value, tf.float32), factor)
      return self._peak_lr * factor
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
                decay_factor=self.decay_factor, decay_table=self.decay_table)


class AsCompiled:
  """A compiled optimizer's learning rate, as a fit script set it
  (engine.fit): a float, held in the optimizer's variable, which Keras'
  ReduceLROnPlateau and LearningRateScheduler assign on every rank alike,
  or the script's own schedule of the optimizer's step. In WarmupThenDecay's
  place in the loop, which asks it the rate of a step for the records.

  Not scaled with the processes: the script's rate is the script's, as in
  Horovod's examples, which scale it themselves (docs/from-fit.md says
  how). `factor` is the checkpoint's rollback factor, 1 here:
  --on_nonfinite=rollback, which lowers it, is refused (engine/given.py).
  """

  def __init__(self, optimizer: keras.optimizers.Optimizer):
    self._optimizer = optimizer
    self.factor = tf.Variable(1.0, trainable=False, name="lr_factor")

  def set_world(self, *, world_size: int, steps_per_epoch: int) -> None:
    del steps_per_epoch  # the script's schedule counts its own steps
    logging.info("learning rate as compiled: %s on %d processes, not scaled "
                 "(docs/from-fit.md)", self._described(), world_size)

  def __call__(self, step):
    rate = self._optimizer._learning_rate  # pylint: disable=protected-access
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
      return rate(step)
    return tf.convert_to_tensor(rate)

  def _described(self) -> str:
    rate = self._optimizer._learning_rate  # pylint: disable=protected-access
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
      return f"{type(rate).__name__} of the step"
    return f"{float(tf.convert_to_tensor(rate)):g}"
