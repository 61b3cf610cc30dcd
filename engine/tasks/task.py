"""A task: what a run learns, and how it is judged; the engine does the rest.

The engine owns everything that makes training distributed, exact and
resumable: the input pipeline, the step and its allreduce, the checkpoints,
the reporting. A task owns what differs from one problem to the next,
in the shape of Orbit's Task (official/core/base_task.py):

* `output_shape()`: what the model outputs per example; the built-in
  models size their heads by its last dimension.
* `loss(labels, outputs)`: the loss of each example, float32 [batch]. The
  engine averages it, adds the model's own losses (weight decay), scales it
  under float16 and averages the gradients across ranks.
* `sums()` and `batch_sums(labels, outputs, loss)`: the metrics, declared as
  sums (a name and a shape each) and counted per batch inside the step.
  Each rank adds up its own; when a figure is read, the sums are added
  across ranks once, and `figures(sums)` turns them into the figures
  (ratios of sums: a mean, a root mean square, R², mean IoU). So every
  figure is exactly the whole split's, whatever the number of ranks.
  The engine counts `examples` itself.
* `best_metric`: the validation figure that decides best/, early stopping
  and --target, and whether higher or lower is better.
* `serve(outputs)`: what the exported SavedModel returns.

Optional hooks widen the contract: `inputs_and_targets` (a denoiser's noisy
inputs), `sample_images` (pictures in TensorBoard), `build_model` and
`serving` (a GAN's two models and its generator's export), and, for steps
one loss cannot say, `optimizers`, `optimized_variables` and `train_step`:
the task's own step, with the engine's helpers to average gradients across
ranks and apply them (engine/compute/task_step.py), and `eval_sums`, an
evaluation batch's sums computed whole (a model's own test_step:
engine/tasks/own_step.py).

A task is built with the data set's DatasetInfo, and with whichever of the
task flags (--label_smoothing, --loss, ...) its __init__ declares.
"""
from typing import Optional

import numpy as np
import keras
import tensorflow as tf

from engine.datasets import DatasetInfo, LabelKind


class Task:
  """The base of every task. Subclasses override `loss`, `sums`,
  `batch_sums` and `figures`, and usually `best_metric`."""

  # "<figure>:max" or "<figure>:min", a name `figures` returns: the
  # validation figure that decides best/, --target and early stopping.
  best_metric = "loss:min"
  # What the task learns from (a LabelKind, or its name), which loaders
  # that read several kinds of labels take (--dataset=arrays): CLASSES (an
  # integer class id per image), TARGETS (float values, [k] per image),
  # MASKS (a class id per pixel, [H, W] per image), or None: any.
  labels: Optional[LabelKind] = None
  # Whether flips, shifts and a volume's axis orders (--random_flip,
  # --random_shift, --random_transpose) keep the targets right: they do
  # not change with them (a class) or move with the images (masks, which
  # the engine moves too; a reconstruction's images). A task that does not
  # say so trains without them unless a flag asks, with a warning: they
  # would move an image and leave its position or angle targets behind.
  augmentation_keeps_targets = False
  # A task with a train step of its own names the optimizers it applies
  # (a GAN: "generator", "discriminator"); the engine builds each from the
  # optimizer flags, and checkpoints and broadcasts them.
  optimizers: tuple = ()

  def __init__(self, info: Optional[DatasetInfo] = None):
    self.info = info

  @property
  def name(self) -> str:
    return type(self).__name__.lower()

  # The model.

  def build_model(self, build) -> keras.Model:
    """The model: by default --model's, `build(self.output_shape())`. A
    task with several models returns one Keras model holding them (its
    call is what evaluation runs)."""
    return build(self.output_shape())

  def output_shape(self) -> tuple:
    """The model's output for one example, without the batch dimension:
    by default one value per label (or per class, for class labels)."""
    if self.info.label_shape:
      return tuple(self.info.label_shape)
    return (self.info.num_classes,)

  def label_shape(self) -> tuple:
    """One example's label, without the batch dimension."""
    return tuple(self.info.label_shape) if self.info else ()

  def label_dtype(self) -> tf.DType:
    return tf.as_dtype(self.info.label_dtype if self.info else "int64")

  def batch_signature(self, image_shape: tuple) -> tuple:
    """The specs of a batch (images, labels), of any batch size, which the
    evaluation step is traced for once: normalized float32 images of
    `image_shape` and the task's labels. A fit script's task (engine/tasks/
    compiled.py) takes its pipeline's own."""
    return (tf.TensorSpec([None, *image_shape], tf.float32),
            tf.TensorSpec([None, *self.label_shape()], self.label_dtype()))

  def inputs_and_targets(self, images: tf.Tensor, labels: tf.Tensor
                         ) -> tuple[tf.Tensor, tf.Tensor]:
    """What the model is given and what `loss` compares its outputs with,
    from a batch (normalized images, labels); inside the step, in training
    and evaluation alike. By default the images and the labels; a denoising
    autoencoder gives noisy images and the images."""
    return images, labels

  # The loss and the metrics.

  def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """Each example's loss, float32 [batch]."""
    raise NotImplementedError

  def sums(self) -> dict[str, tuple]:
    """The sums the metrics are made of: their names and shapes."""
    raise NotImplementedError

  def batch_sums(self, labels: tf.Tensor, outputs: tf.Tensor,
                 loss: tf.Tensor) -> dict[str, tf.Tensor]:
    """One batch's share of each sum in `sums()`; runs inside the step.
    `loss` is what `loss` returned for the batch."""
    raise NotImplementedError

  def figures(self, sums: dict[str, np.ndarray]) -> dict[str, float]:
    """The figures, from sums over a whole split (or an epoch's steps) on
    every rank; `sums["examples"]` counts the examples. A figure that is
    undefined (the IoU of a class nowhere) is None. A figure named
    `group/detail` (mae/<target>) goes to metrics.jsonl and TensorBoard
    (grouped with `group`) but not to the log line."""
    raise NotImplementedError

  # A train step of the task's own, for steps one loss cannot say.

  def optimized_variables(self, model: keras.Model) -> dict[str, list]:
    """With `optimizers`: each optimizer's name -> the variables it
    updates."""
    raise NotImplementedError

  def train_step(self, model: keras.Model, optimizers: dict,
                 images: tf.Tensor, labels: tf.Tensor, step
                 ) -> tuple[tf.Tensor, dict]:
    """With `optimizers`: one step on this rank's batch, inside the
    compiled step. Computes each update under its own tape, averages the
    gradients across ranks with `step.average_gradients(tape, loss,
    variables)`, which adds the gradients of the variables' regularizers
    (weight decay: leave the models' `losses` out of `loss`), and applies
    them with `step.apply_gradients(optimizer, gradients, variables)`.
    Returns the step's loss (a scalar, checked for being finite on every
    rank) and the batch's share of `sums()`."""
    raise NotImplementedError

  # Evaluation and serving.

  def average_views(self, outputs: list[tf.Tensor]) -> tf.Tensor:
    """One output from the outputs of several views of the same examples
    (--eval_flip, --eval_shift); tasks that have no such average leave
    this and the engine refuses those flags."""
    raise NotImplementedError

  def serve(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
    """What the exported SavedModel returns for a batch of outputs."""
    return {"outputs": outputs}

  def serving(self, model: keras.Model):
    """The exported SavedModel's function: images as stored (uint8, or
    float32 for float arrays) in, through `normalization()`, `serve` of
    the model's outputs out. A GAN's takes noise instead."""
    info = self.info
    normalization = self.normalization()

    @tf.function(input_signature=[tf.TensorSpec(
        [None, *info.image_shape], info.image_dtype, name="images")])
    def serve(images):
      return self.serve(model(normalization(images), training=False))

    return serve

  def normalization(self) -> keras.Model:
    """The training set's normalization (DatasetInfo.normalized) in Keras'
    own layers: images as stored in, as the model receives them out. Both
    exports apply this one model, the SavedModel's signature and the
    `.keras` file in front of the trained model (engine/records/
    export.py), so the two take the same images and agree; built of
    Keras' built-in layers and ops alone, the `.keras` file loads where
    the engine does not."""
    info = self.info
    images = keras.Input(info.image_shape, dtype=info.image_dtype,
                         name="images")
    # The variance is the float32 std squared in float32, whose square root
    # (what the layer divides by) is that std exactly: the input
    # pipeline's arithmetic, to the bit.
    std = np.asarray(info.std, np.float32)
    normalized = keras.layers.Normalization(
        mean=info.mean, variance=std * std, dtype="float32")(
            info.transformed(keras.ops.cast(images, "float32")))
    return keras.Model(images, normalized, name="normalization")

  def summary_images(self, sums: dict[str, np.ndarray]) -> dict:
    """TensorBoard images of the validation sums: {tag: (image [1, H, W,
    3] uint8, description)}."""
    return {}

  def sample_images(self, model: keras.Model, images: tf.Tensor,
                    labels: tf.Tensor) -> dict:
    """TensorBoard images of the model on a few test examples (normalized
    images and their labels, as the pipeline gives them), drawn each
    evaluated epoch on rank 0: {tag: (image [1, H, W, 3] uint8,
    description)}. `stored` gives images back on their stored scale."""
    return {}

  def stored(self, images: tf.Tensor) -> np.ndarray:
    """Normalized images on their stored scale (0-255 for uint8 images),
    for pictures of them."""
    return (np.asarray(images) * np.array(self.info.std)
            + np.array(self.info.mean))
