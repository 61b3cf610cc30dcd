"""The compiled eval step: inference on a split, its figures reduced
exactly across ranks (metrics.Totals), for the train loop's evaluation and
engine.evaluate."""
from typing import Optional

import keras
import tensorflow as tf

from engine import tasks
from engine.compute import metrics
from engine.core.errors import UserError
from engine.tasks import Task
from engine.tasks.classification import Classification


class EvalStep:
  """Inference on one batch of any size; traced once per run.

  Counts the task's sums (for classification also the confusion matrix,
  for per-class accuracy in engine.evaluate and TensorBoard's image of it).

  With `flip`, each image is also seen mirrored (test-time augmentation),
  and the prediction is the task's average of the views' outputs (for
  classification, of their probabilities): for data whose classes look
  alike mirrored, as --random_flip assumes. With `shift`, each view is also
  seen moved that many pixels left and right (the border repeated, as
  --random_shift fills it): three times the views, for models trained with
  shifts.
  """

  def __init__(self, *, model: keras.Model, task: Optional[Task] = None,
               xla: bool = False, image_shape=None, flip: bool = False,
               shift: int = 0):
    """`task` defaults to classification into the model's outputs, and
    `image_shape` to the model's own, which only a functional model knows
    before it is called."""
    self.model = model
    self.task = task or classification_of(model)
    self._flip = flip
    self._shift = shift
    image_shape = image_shape or model.input_shape[1:]
    if shift and 2 * shift >= image_shape[1]:
      raise UserError(f"EvalStep(shift={shift}): must be less than half "
                      f"the images' width ({image_shape[1]})")
    if (flip or shift) and not tasks.defines(self.task, "average_views"):
      raise UserError(f"--eval_flip, --eval_shift: the {self.task.name} "
                      "task has no average of several views' outputs; "
                      "leave them out")
    self.totals = metrics.Totals("eval_totals", self.task)
    self.traces = 0
    # A batch dimension of None: the last, shorter batch reuses the trace
    # (XLA compiles it once more, for its shape).
    self._step = tf.function(
        self._eval_step, jit_compile=xla,
        input_signature=list(self.task.batch_signature(image_shape)))

  def __call__(self, images: tf.Tensor, labels: tf.Tensor) -> None:
    self._step(images, labels)

  def _eval_step(self, images, labels):
    self.traces += 1
    images, labels = self.task.inputs_and_targets(images, labels)
    if tasks.defines(self.task, "eval_sums"):  # a model's own test_step
      self.totals.add(self.task.eval_sums(self.model, images, labels),
                      tf.shape(tf.nest.flatten(images)[0])[0])
      return
    views = [images]
    if self._flip:
      views.append(tf.image.flip_left_right(images))
    if self._shift:
      views += [_shifted(view, pixels) for view in views
                for pixels in (self._shift, -self._shift)]
    each_view = [self.model(view, training=False) for view in views]
    outputs = (each_view[0] if len(each_view) == 1
               else self.task.average_views(each_view))
    self.totals.update(labels, outputs, self.task.loss(labels, outputs))


def evaluate(step: EvalStep, batches: tf.data.Dataset) -> metrics.Result:
  """The task's figures over the whole split (each rank passes its
  shard)."""
  step.totals.reset()
  for images, labels in batches:
    step(images, labels)
  return step.totals.result()


def classification_of(model: keras.Model) -> Classification:
  """Classification into the model's outputs: a step built without a task
  (tests, benchmarks)."""
  return Classification(num_classes=model.output_shape[-1])


def _shifted(images: tf.Tensor, pixels: int) -> tf.Tensor:
  """A batch moved `pixels` to the right (left if negative), the edge column
  repeated into the gap."""
  if pixels > 0:
    edge = tf.repeat(images[:, :, :1], pixels, axis=2)
    return tf.concat([edge, images[:, :, :-pixels]], axis=2)
  edge = tf.repeat(images[:, :, -1:], -pixels, axis=2)
  return tf.concat([images[:, :, -pixels:], edge], axis=2)
