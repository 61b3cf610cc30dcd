"""The compiled train and eval steps.

The train step is where Horovod enters the math: the tape that computes the
gradient is wrapped in `hvd.DistributedGradientTape`, whose `gradient()`
returns each gradient averaged over all ranks. With every rank holding the
same weights, that is the gradient of the mean loss over the global batch, so
N processes with batch B take the step one process with batch N*B would.
"""
import horovod.tensorflow as hvd
import tensorflow as tf

from engine import metrics
from engine import optimizers


class TrainStep:
  """One optimizer step on one batch per rank; traced once per run.

  Counts its traces (`traces`) because a retrace per step or per epoch is a
  silent, large slowdown that tests should catch.
  """

  def __init__(self, *, model: tf.keras.Model,
               optimizer: tf.keras.optimizers.Optimizer):
    self.model = model
    self.optimizer = optimizer
    optimizers.build_state(optimizer, model.trainable_variables)
    self.totals = metrics.Totals("train_totals")
    self.traces = 0
    # Tensors, not Python floats: a Python argument would be traced in.
    self._flags = {False: tf.constant(0.0), True: tf.constant(1.0)}
    self._step = tf.function(self._train_step)

  def __call__(self, images: tf.Tensor, labels: tf.Tensor,
               stop_requested: bool = False) -> bool:
    """One step; returns whether any rank asked to stop (see preemption)."""
    return bool(self._step(images, labels, self._flags[stop_requested]))

  def _train_step(self, images, labels, stop_requested):
    self.traces += 1  # Python side effect: runs only while tracing.
    with tf.GradientTape() as tape:
      logits = self.model(images, training=True)
      per_example_loss = cross_entropy(labels, logits)
      loss = tf.reduce_mean(per_example_loss)
      if self.model.losses:  # weight decay, as the layers' regularizers say
        loss += tf.add_n(self.model.losses)
    tape = hvd.DistributedGradientTape(tape)
    variables = self.model.trainable_variables
    gradients = tape.gradient(loss, variables)
    self.optimizer.apply_gradients(zip(gradients, variables))
    self.totals.update(per_example_loss, logits, labels)
    # Fused with the gradients' allreduce: the stop decision costs no
    # extra round trip, and every rank takes it after the same step.
    return hvd.allreduce(stop_requested, op=hvd.Max,
                         name="stop_requested") > 0


class EvalStep:
  """Inference on one batch of any size; traced once per run."""

  def __init__(self, *, model: tf.keras.Model):
    self.model = model
    self.totals = metrics.Totals("eval_totals")
    self.traces = 0
    # A batch dimension of None: the last, shorter batch reuses the trace.
    shape = [None, *model.input_shape[1:]]
    self._step = tf.function(self._eval_step, input_signature=[
        tf.TensorSpec(shape, tf.float32), tf.TensorSpec([None], tf.int64)])

  def __call__(self, images: tf.Tensor, labels: tf.Tensor) -> None:
    self._step(images, labels)

  def _eval_step(self, images, labels):
    self.traces += 1
    logits = self.model(images, training=False)
    self.totals.update(cross_entropy(labels, logits), logits, labels)


def cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
  """Per-example loss; logits are float32 whatever the compute dtype."""
  return tf.keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True)


def evaluate(step: EvalStep, batches: tf.data.Dataset) -> metrics.Result:
  """Loss and accuracy over the whole split (each rank passes its shard)."""
  step.totals.reset()
  for images, labels in batches:
    step(images, labels)
  return step.totals.result()
