"""The compiled train step: its math. How it reduces across ranks is
engine/distributed/gradients.py's; what the host learns of each step,
step_outcome.py's; the eval step, eval_step.py.

The train step is where Horovod enters the math: each rank's gradients are
averaged over all ranks (on GPU each by an allreduce of its own as the
backward pass has it, on CPU in one grouped allreduce; see `TrainStep`).
With every rank holding the same weights, that is the gradient of the mean
loss over the global batch, so N processes with batch B take the step one
process with batch N*B would.
"""
import dataclasses
from typing import Optional

import keras
import tensorflow as tf

from engine.compute import eval_step
from engine.compute import metrics
from engine.compute import optimizers
from engine.compute import precision
from engine.compute import step_outcome
from engine.compute.step_outcome import NonFinite
from engine.distributed import gradients as allreduce
from engine.tasks import Task


@dataclasses.dataclass(frozen=True)
class Trained:
  """What the host learns of one call of `TrainStep.train`: how many steps
  ran, whether the ranks agreed to stop, this rank's seconds waiting for
  its batches, and in a profiled call the phases' seconds on this rank's
  clock, summed over its steps (step_outcome.py)."""
  steps: int
  stop_agreed: bool
  input_seconds: float
  phases: dict


class TrainStep:
  """One optimizer step on one batch per rank; traced once per run.

  The step, in order: the forward pass and the task's loss (its mean over
  the batch, plus the model's own losses; scaled under float16),
  the backward pass, the gradients' allreduce, unscaling, the update. With
  `accumulation_steps` K > 1 the batch is split into K micro-batches whose
  local gradients are averaged before the one allreduce.

  How the gradients, the step's flags and the model's statistics are
  reduced across ranks, each as the backward pass has it or in one grouped
  allreduce (`overlap_allreduce`), is engine/distributed/gradients.py's
  StepReduction, which a task's own step shares.

  A step whose loss (on any rank) or averaged gradients are not finite is
  not applied, and raises NonFinite on every rank. Under float16 that is the
  loss scaler's business first: it skips the step and halves its scale, and
  the step counts it in `skipped_steps`; only a non-finite step at the
  minimum scale of 1 raises. That also bounds the steps skipped in a row:
  halving from 2^15, the 16th is at the minimum.

  It owns its input, as Orbit's StandardTrainer does: `start` gives it
  this rank's batches, and `train(num_steps)` takes up to that many steps
  in one call, reading each batch inside it (Keras' steps_per_execution,
  Orbit's use_tf_while_loop, beyond one step a call): one host round trip
  per call, one trace for any count and for images of any size
  (--progressive_resizing: the batches' spec leaves it open). Every step's status is read inside the
  loop, and a step that asks to stop or was not finite ends the call
  after it, on every rank alike, so the host learns of it after the very
  step it would have at one step a call.

  Counts its traces (`traces`) because a retrace per step or per epoch is a
  silent, large slowdown that tests should catch.
  """

  def __init__(self, *, model: keras.Model,
               optimizer: keras.optimizers.Optimizer,
               task: Optional[Task] = None,
               allreduce_op: str = "average", compression: str = "none",
               accumulation_steps: int = 1, weight_average=None,
               xla: bool = False, overlap_allreduce: Optional[bool] = None,
               steps_per_call: int = 1, deterministic: bool = False):
    """`task`: what is learnt (engine/tasks); by default classification
    into the model's outputs. `weight_average`: an ema.WeightAverage,
    updated after each update applied. `overlap_allreduce`: None, as suits the
    device (above). `steps_per_call`: the most steps a call of `train`
    takes (--steps_per_call). `deterministic`: under op determinism
    (--deterministic), which refuses tf.timestamp, the wait for input is
    not stamped apart: it is the step's time."""
    self.model = model
    self.task = task or eval_step.classification_of(model)
    self._weight_average = weight_average
    self.optimizer = optimizer
    self._build_optimizer_state()
    self.totals = metrics.Totals("train_totals", self.task)
    self.traces = 0
    self.timed_traces = 0  # of the copy a profiled window runs
    # By the float16 loss scaler, since the counts were reset.
    self.skipped_steps = 0
    self._accumulation_steps = accumulation_steps
    self._compression = compression
    if overlap_allreduce is None:
      overlap_allreduce = bool(tf.config.list_logical_devices("GPU"))
    self._reduce = allreduce.StepReduction(
        model, op=allreduce_op, compression=compression,
        accumulation_steps=accumulation_steps,
        overlap_allreduce=overlap_allreduce)
    self._scales_loss = precision.scales_loss(optimizer)
    # XLA compiles the forward pass, and TensorFlow compiles its gradient
    # with it; Horovod's allreduce has no XLA kernel on CPU, so it and the
    # update run outside, between compiled pieces.
    self._forward = (tf.function(self._forward_pass, jit_compile=True)
                     if xla else self._forward_pass)
    # Tensors, not Python floats: a Python argument would be traced in.
    self._flags = {False: tf.constant(0.0), True: tf.constant(1.0)}
    self._batches = None  # an iterator over this rank's batches (`start`)
    self._steps_per_call = steps_per_call
    self._deterministic = deterministic
    # One function for any number of steps a call: the count is a tensor.
    self._steps = tf.function(self._train_steps)
    self._timed_steps = tf.function(self._clocked_train_steps)

  def reset_counts(self) -> None:
    """Its counts from zero: its running sums and the steps the loss
    scaler skipped. They count the steps since the epoch began or was
    committed (or since a restart or a rollback); the run's state holds
    what was counted before (engine/loop/run_state.LoopState)."""
    self.totals.reset()
    self.skipped_steps = 0

  @property
  def gradient_bytes(self) -> int:
    """The bytes of one update's gradients as the allreduce carries them
    (float16 under --gradient_compression=fp16): what the scaling model
    (engine/records/scaling.py) sends around the ring at more nodes."""
    values = sum(variable.shape.num_elements()
                 for variable in self.model.trainable_variables)
    bytes_per_value = {"none": tf.float32.size, "fp16": tf.float16.size}
    return values * bytes_per_value[self._compression]

  def _build_optimizer_state(self) -> None:
    optimizers.build_state(self.optimizer, self.model.trainable_variables)

  def start(self, batches: tf.data.Dataset) -> None:
    """The batches its calls read from (this rank's, from where the run
    stands: a start's, a rollback's), each call going on from where the
    last ended, as Orbit's trainer owns its dataset's iterator."""
    self._batches = iter(batches)

  def train(self, num_steps: int, stop_requested: bool = False,
            timed: bool = False) -> Trained:
    """Up to `num_steps` steps in one call, each on the next batch; the
    call's one read of its status. A stop or a non-finite step ends the
    call after that step, on every rank alike (NonFinite says which step
    it was). `timed`: the copy with a StepClock, whose phases a profiled
    window reports (step_outcome.py), traced the first time it is
    called."""
    if not 1 <= num_steps <= self._steps_per_call:
      raise ValueError(f"{num_steps} steps a call: this step takes 1 to "
                       f"{self._steps_per_call}")
    function = self._timed_steps if timed else self._steps
    outcome = function(self._batches, tf.constant(num_steps),
                       self._flags[stop_requested])
    ran = int(outcome["steps"])
    phases = {phase: float(seconds)
              for phase, seconds in outcome.get("phases", {}).items()}
    return Trained(steps=ran, stop_agreed=self._read(outcome, step=ran),
                   input_seconds=float(outcome["input_seconds"]),
                   phases=phases)

  def _read(self, outcome, step: int = 1) -> bool:
    """The host's one read of a call's status: whether the ranks agreed to
    stop; raises NonFinite (or counts a step the loss scaler skipped)."""
    status = int(outcome["status"])
    if status & step_outcome.NONFINITE:
      self._nonfinite(outcome, step)
    return bool(status & step_outcome.STOP_AGREED)

  def _train_steps(self, batches, count, stop_requested):
    self.traces += 1  # Python side effect: runs only while tracing.
    return self._steps_of_a_call(batches, count, stop_requested, timed=False)

  def _clocked_train_steps(self, batches, count, stop_requested):
    """The steps with a StepClock: a copy for a profiled window, traced
    once by design, and counted apart from the step's own traces, whose
    count catches retracing."""
    self.timed_traces += 1
    return self._steps_of_a_call(batches, count, stop_requested, timed=True)

  def _steps_of_a_call(self, batches, count, stop_requested, timed: bool):
    """A call's steps: in a while loop beyond one step a call, else the
    step alone (whose steps TensorBoard's profile overview lists: it lists
    none run inside a while loop)."""
    if self._steps_per_call > 1:
      return self._loop(batches, count, stop_requested, timed)
    clock = step_outcome.StepClock() if timed else step_outcome.NO_CLOCK
    outcome, waited = self._next_step(batches, stop_requested, clock)
    return dict(outcome, steps=tf.constant(1), input_seconds=waited,
                **({"phases": clock.seconds()} if timed else {}))

  def _loop(self, batches, count, stop_requested, timed: bool):
    """`count` steps in a while loop, ended early by a step whose status is
    not 0; returns the last step's outcome, how many steps ran and their
    wait for input, and if `timed`, each step's phases on a StepClock of
    its own, summed."""
    outcome = step_outcome.no_outcome(self._gradient_checks())
    ran = tf.constant(0)
    input_seconds = tf.constant(0.0, tf.float64)
    summed = {phase: tf.constant(0.0, tf.float64)
              for phase in step_outcome.PHASES} if timed else {}
    ran_phases = []  # the phases a step runs, known once its body is traced
    for _ in tf.range(count):
      clock = step_outcome.StepClock(after=tf.nest.flatten(summed)) if (
          timed) else step_outcome.NO_CLOCK
      outcome, waited = self._next_step(batches, stop_requested, clock)
      input_seconds += waited
      if timed:
        seconds = clock.seconds()
        ran_phases[:] = list(seconds)
        summed = {phase: summed[phase] + seconds.get(phase, 0.0)
                  for phase in step_outcome.PHASES}
      ran += 1
      if outcome["status"] != 0:
        break
    phases = {phase: summed[phase] for phase in ran_phases}
    return dict(outcome, steps=ran, input_seconds=input_seconds,
                **({"phases": phases} if timed else {}))

  def _next_step(self, batches, stop_requested, clock):
    """One step on the next of `batches`: its outcome, and its wait for
    the batch. The wait is stamped timed or not: two stamps a step, around
    reading the batch, the step's math after the second (else the
    executor may take it after the math, which then counts as input: 13
    of an epoch's 16 s on 2 processes of 2 cores); not under op
    determinism (`deterministic`), whose wait is 0."""
    stamped = not self._deterministic
    began = [tf.timestamp()] if stamped else []
    with tf.control_dependencies(began), clock.phase("input"):
      images, labels = next(batches)
    waited = tf.constant(0.0, tf.float64)
    if stamped:
      with tf.control_dependencies(tf.nest.flatten((images, labels))):
        ended = tf.timestamp()
      waited = ended - began[0]
      with tf.control_dependencies([ended]):
        images, labels = tf.nest.map_structure(tf.identity, (images, labels))
    return self._train_step(images, labels, stop_requested, clock), waited

  def _gradient_checks(self) -> int:
    """How many gradients' finiteness a step's outcome gives."""
    return len(self.model.trainable_variables)

  def _gradient_names(self) -> Optional[list]:
    """The names of the variables whose gradients' finiteness a step's
    outcome gives, in its order."""
    return [variable.path for variable in self.model.trainable_variables]

  def _train_step(self, images, labels, stop_requested,
                  clock=step_outcome.NO_CLOCK):
    """One step's math, each phase in `clock.phase` (step_outcome.py)."""
    variables = self.model.trainable_variables
    reduce = self._reduce
    several = allreduce.several_processes()  # before the step's work
    if self._accumulation_steps == 1:
      with tf.GradientTape() as tape:
        with clock.phase("forward"):
          loss = self._loss(images, labels)
      with clock.phase("backward"):
        local = tape.gradient(loss, variables)
    else:
      with clock.phase("backward"):  # the forward passes in backward's
        local, loss = self._accumulated_gradients(images, labels, variables)
    with clock.phase("communication", overlaps_previous=reduce.overlaps):
      # The gradients averaged; BatchNorm's moving statistics set to their
      # average; the shares of ranks that asked to stop and whose loss was
      # not finite.
      reduced = reduce.step(local, stop_requested, loss, several)
    gradients = reduced.gradients
    stop_share = reduced.stop_share
    nonfinite_loss_share = reduced.nonfinite_loss_share
    with clock.phase("optimizer"):
      # The same on every rank: every rank holds the same averaged
      # gradients (under float16, scaled: finite where the unscaled ones
      # are).
      gradients_finite = tf.stack([is_finite(g) for g in gradients])
      finite = tf.logical_and(nonfinite_loss_share == 0,
                              tf.reduce_all(gradients_finite))
      loss_scale = (
          tf.convert_to_tensor(precision.loss_scale(self.optimizer))
          if self._scales_loss else tf.constant(0.0))
      with tf.control_dependencies([loss_scale]):  # the scale of this step
        # Under float16 the loss scaler decides: it unscales the
        # (allreduced) gradients and applies them, or skips the update and
        # lowers its scale.
        if self._scales_loss:
          self.optimizer.apply_gradients(zip(gradients, variables))
          applied = self.optimizer.check_finite(gradients)
        else:
          applied = finite
        # The update (unless the loss scaler made it) and the weights'
        # average, where it was applied; a step skipped is still counted
        # (count_skipped).
        tf.cond(applied, lambda: self._update(gradients, variables),
                lambda: count_skipped(self.optimizer))
      return step_outcome.outcome(
          stop_share=stop_share, finite=finite, loss=loss,
          nonfinite_loss_share=nonfinite_loss_share,
          gradients_finite=gradients_finite, loss_scale=loss_scale)

  def _update(self, gradients, variables) -> None:
    """The update (the loss scaler's own under float16) and the weights'
    average, which counts applied updates (ema.py)."""
    if not self._scales_loss:
      self.optimizer.apply_gradients(zip(gradients, variables))
    if self._weight_average:
      self._weight_average.update()

  def _nonfinite(self, outcome, step: int) -> None:
    """Counts a step the loss scaler skipped, or raises NonFinite (of the
    call's `step`-th step)."""
    what = step_outcome.described(outcome, self._gradient_names())
    if not self._scales_loss:
      raise NonFinite(what, step)
    self.skipped_steps += 1
    if float(outcome["loss_scale"]) <= 1:
      raise NonFinite(f"{what}, at the float16 loss scale's minimum of 1",
                      step)

  def _loss(self, images, labels):
    """The batch's loss to differentiate (times the loss scale under
    float16); counts the batch in the epoch's totals."""
    inputs, targets = self.task.inputs_and_targets(images, labels)
    per_example_loss, outputs, loss = self._forward(inputs, targets)
    self.totals.update(targets, outputs, per_example_loss)
    if self._scales_loss:
      return self.optimizer.scale_loss(loss)
    return loss

  def _forward_pass(self, images, labels):
    outputs = self.model(images, training=True)
    per_example_loss = self.task.loss(labels, outputs)
    loss = tf.reduce_mean(per_example_loss)
    if self.model.losses:  # weight decay, as the layers' regularizers say
      loss += tf.add_n(self.model.losses)
    return per_example_loss, outputs, loss

  def _accumulated_gradients(self, images, labels, variables):
    """The mean of the micro-batches' local gradients (the gradient of the
    whole batch's mean loss, with the activations of one micro-batch alive
    at a time), and the mean of their losses."""
    k = self._accumulation_steps
    # Any image size: under --progressive_resizing it is known only when
    # the batch is read. A fit script's batch may nest: features in a
    # dict, labels with their sample weights (engine/datasets/pipelines.py).
    def micro_batches(batch):
      return tf.reshape(batch, tf.concat([[k, -1], tf.shape(batch)[1:]], 0))

    images = tf.nest.map_structure(micro_batches, images)
    labels = tf.nest.map_structure(micro_batches, labels)
    sums = [tf.zeros_like(v) for v in variables]
    loss_sum = tf.constant(0.0)
    for i in tf.range(k):
      # One micro-batch at a time: a while loop may otherwise run several
      # iterations' forward passes at once, and hold their activations.
      tf.autograph.experimental.set_loop_options(parallel_iterations=1)
      with tf.GradientTape() as tape:
        loss = self._loss(*tf.nest.map_structure(lambda batch: batch[i],
                                                 (images, labels)))
      loss_sum += tf.cast(loss, tf.float32)
      sums = [s + g for s, g in zip(sums, tape.gradient(loss, variables))]
    return [s / k for s in sums], loss_sum / k


def count_skipped(optimizer) -> None:
  """A step whose update was skipped still counts on the optimizer's step
  counter: it counts batches. (Under float16 the loss scaler's inner
  optimizer's counter stays when it skips.)"""
  optimizer.iterations.assign_add(1)


def is_finite(gradient) -> tf.Tensor:
  if gradient is None:  # a variable the loss does not depend on
    return tf.constant(True)
  if isinstance(gradient, tf.IndexedSlices):
    gradient = gradient.values
  return tf.reduce_all(tf.math.is_finite(gradient))
