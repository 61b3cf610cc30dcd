"""Single-label classification: the engine's first task, and its default.

Cross-entropy on logits, accuracy, and the confusion matrix (per-class
accuracy in engine.evaluate, and its image in TensorBoard). Views of the
same images (--eval_flip, --eval_shift) are averaged as probabilities.
"""
import numpy as np
import keras
import tensorflow as tf

from engine.datasets import LabelKind
from engine.tasks.task import Task


class Classification(Task):
  """Integer class labels [batch]; float32 logits [batch, classes]."""

  best_metric = "accuracy:max"
  # A flip or a shift keeps an image's class.
  augmentation_keeps_targets = True
  labels = LabelKind.CLASSES

  def __init__(self, info=None, *, label_smoothing: float = 0.0,
               num_classes: int = 0):
    """`num_classes`: without `info`, the number of classes (or 0: the
    logits' width, for a model that is called before `sums`)."""
    super().__init__(info)
    self.label_smoothing = label_smoothing
    self.num_classes = num_classes or (info.num_classes if info else 0)

  def output_shape(self) -> tuple:
    return (self.num_classes,)

  def loss(self, labels, outputs):
    if self.label_smoothing:
      return smoothed_cross_entropy(labels, outputs, self.label_smoothing)
    return cross_entropy(labels, outputs)

  def sums(self):
    return {"loss": (), "correct": (),
            "confusion": (self.num_classes, self.num_classes)}

  def batch_sums(self, labels, outputs, loss):
    # The figure is the plain cross-entropy, comparable with validation's,
    # whatever --label_smoothing makes the objective.
    if self.label_smoothing:
      loss = cross_entropy(labels, outputs)
    predictions = tf.argmax(outputs, axis=-1, output_type=labels.dtype)
    return {"loss": tf.reduce_sum(tf.cast(loss, tf.float64)),
            "correct": tf.reduce_sum(tf.cast(predictions == labels,
                                             tf.float64)),
            "confusion": tf.math.confusion_matrix(
                labels, predictions, self.num_classes, dtype=tf.float64)}

  def figures(self, sums):
    examples = max(float(sums["examples"]), 1.0)
    return {"loss": float(sums["loss"]) / examples,
            "accuracy": float(sums["correct"]) / examples}

  def average_views(self, outputs):
    """Logits whose softmax is the views' mean probabilities."""
    return tf.math.log(tf.add_n([tf.nn.softmax(view) for view in outputs])
                       / len(outputs))

  def serve(self, outputs):
    classes = tf.argmax(outputs, axis=-1)
    names = tf.constant(self.info.classes())
    return {"logits": outputs, "probabilities": tf.nn.softmax(outputs),
            "classes": classes, "class_names": tf.gather(names, classes)}

  def summary_images(self, sums):
    return {"confusion_matrix": (
        confusion_image(sums["confusion"]),
        "Rows: true class, columns: predicted class, in label order "
        "(classes.txt); each row normalized, white 0 to dark blue 1.")}


def per_class_accuracy(counts: np.ndarray) -> np.ndarray:
  """Each class's share of its examples predicted right (nan: none)."""
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.diag(counts) / counts.sum(axis=1)


def cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
  """Per-example loss; logits are float32 whatever the compute dtype."""
  return keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True)


def smoothed_cross_entropy(labels: tf.Tensor, logits: tf.Tensor,
                           smoothing: float) -> tf.Tensor:
  """Per-example cross-entropy against targets with `smoothing` of the
  probability spread evenly over the classes (Szegedy et al. 2016): the
  objective under --label_smoothing. The figures reported stay the plain
  cross-entropy, comparable with validation's."""
  uniform = -tf.reduce_mean(tf.nn.log_softmax(logits), axis=-1)
  return ((1.0 - smoothing) * cross_entropy(labels, logits)
          + smoothing * uniform)


def confusion_image(counts: np.ndarray, size: int = 320) -> np.ndarray:
  """The row-normalized confusion matrix as a [1, H, W, 3] uint8 image:
  each cell a square of pixels, white for 0 to dark blue for 1, with grey
  lines between cells when they are large enough to show them."""
  classes = len(counts)
  with np.errstate(invalid="ignore", divide="ignore"):
    shares = np.nan_to_num(counts / counts.sum(axis=1, keepdims=True))
  cell = max(1, size // classes)
  pixels = np.kron(shares, np.ones((cell, cell)))
  white, blue = np.array([255.0, 255.0, 255.0]), np.array([8.0, 48.0, 107.0])
  image = white + pixels[..., None] * (blue - white)
  if cell >= 4:
    image[::cell, :] = image[:, ::cell] = 160
  return image.astype(np.uint8)[None]
