"""The train step of a task with a step of its own (engine/tasks/task.py:
`Task.train_step`), as a GAN's: the task's math, the engine's agreement
across ranks around it."""
from typing import Optional

import tensorflow as tf

from engine.compute import optimizers
from engine.compute import step
from engine.compute import step_outcome
from engine.compute import weight_decay
from engine.core.errors import UserError
from engine.distributed import gradients as allreduce


class TaskTrainStep(step.TrainStep):
  """The step of a task with a train step of its own: several models (one
  Keras model holding them) and several optimizers (optimizers.Several),
  several tapes, as a GAN's. The task computes and applies its updates
  with two helpers, `average_gradients` and `apply_gradients`; the engine
  keeps the rest of the step: the stop flag and the non-finite check
  agreed across ranks, the metrics' sums, the weights' average, the
  trace count.

  A non-finite gradient is not applied (the optimizer's step counter still
  counts it), and the step raises NonFinite on every rank afterwards, as
  the built-in step does. Not with gradient accumulation, nor float16
  (engine.build refuses it: a loss scale is one optimizer's).
  """

  def __init__(self, **options):
    if options.get("accumulation_steps", 1) > 1:
      raise UserError("--grad_accum_steps: a task with its own train step "
                      "accumulates nothing; leave it at 1")
    self._gradients_finite = tf.Variable(True, trainable=False)
    super().__init__(**options)

  def _build_optimizer_state(self) -> None:
    optimizers.build_state(self.optimizer,
                           self.task.optimized_variables(self.model))

  def average_gradients(self, tape: tf.GradientTape, loss: tf.Tensor,
                        variables: list) -> list:
    """The gradients of `loss` and of the variables' regularizers (weight
    decay, which the built-in step adds to its loss as the model's
    `losses`: a task's loss is its own), averaged across ranks as the
    built-in step averages them: each as the backward pass has it (GPU),
    or all in one grouped allreduce (CPU)."""
    return self.averaged(weight_decay.with_regularization(
        tape.gradient(loss, variables), variables))

  def averaged(self, gradients: list) -> list:
    """Gradients a step computed itself (a model's own train_step:
    engine/tasks/own_step.py), averaged across ranks as they are."""
    return self._reduce.gradients(gradients)

  def apply_gradients(self, optimizer, gradients: list,
                      variables: list) -> None:
    """Applies averaged gradients, unless one is not finite (the same on
    every rank: the gradients are)."""
    finite = tf.reduce_all(tf.stack([step.is_finite(g) for g in gradients]))
    self._gradients_finite.assign(
        tf.logical_and(self._gradients_finite, finite))
    def update() -> None:
      optimizer.apply_gradients(zip(gradients, variables))

    tf.cond(finite, update, lambda: step.count_skipped(optimizer))

  def _train_step(self, images, labels, stop_requested,
                  clock=step_outcome.NO_CLOCK):
    """The task's step (in a profiled window one phase, `task_step`: what
    it does inside is the task's), then the flags agreed across ranks."""
    several = allreduce.several_processes()  # before the step's work
    with clock.phase("task_step"):
      self._gradients_finite.assign(True)
      loss, sums = self.task.train_step(self.model, self.optimizer.by_name,
                                        images, labels, self)
      # (A fit script's features may be a dict of them.)
      self.totals.add(sums, tf.shape(tf.nest.flatten(images)[0])[0])
      if self._weight_average:
        self._weight_average.update()
    with clock.phase("communication"):
      # Its flags and the models' BatchNorm statistics.
      reduced = self._reduce.step(None, stop_requested, loss, several)
      gradients_finite = self._gradients_finite.read_value()
      finite = tf.logical_and(reduced.nonfinite_loss_share == 0,
                              gradients_finite)
      return step_outcome.outcome(
          stop_share=reduced.stop_share, finite=finite, loss=loss,
          nonfinite_loss_share=reduced.nonfinite_loss_share,
          gradients_finite=gradients_finite[None],
          loss_scale=tf.constant(0.0))

  def _gradient_checks(self) -> int:
    return 1  # all of the task's gradients together

  def _gradient_names(self) -> Optional[list]:
    return None  # checked together: no variable to name
