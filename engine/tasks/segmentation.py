"""Semantic segmentation: a class per pixel.

Per-pixel cross-entropy, each image's mean over its labelled pixels (a
pixel labelled `ignore_label` counts for nothing: no loss, no figure). The
figures come from one sum, the confusion matrix of every labelled pixel,
added across ranks: pixel accuracy (its diagonal over its total) and the
intersection over union of each class (true positives over true, false
positives and false negatives), whose mean over the classes present is
mean IoU, as Keras' MeanIoU and the Cityscapes benchmark compute it.
"""
import numpy as np
import tensorflow as tf

from engine import report
from engine.tasks.task import Task


class Segmentation(Task):
  """Integer masks [batch, H, W]; float32 logits [batch, H, W, classes]."""

  best_metric = "mean_iou:max"
  labels = "masks"

  def __init__(self, info, *, ignore_label: int = -1):
    """`ignore_label` (--ignore_label): a mask value that labels no class
    (255 in Cityscapes and Pascal VOC); -1: none."""
    super().__init__(info)
    self.num_classes = info.num_classes
    self.ignore_label = ignore_label

  def output_shape(self):
    return (*self.info.label_shape, self.num_classes)

  def _labelled(self, labels):
    """The labels as int32, and where they label a class."""
    labels = tf.cast(labels, tf.int32)
    if self.ignore_label < 0:
      return labels, tf.ones_like(labels, tf.bool)
    labelled = labels != self.ignore_label
    return tf.where(labelled, labels, 0), labelled

  def loss(self, labels, outputs):
    labels, labelled = self._labelled(labels)
    each = tf.keras.losses.sparse_categorical_crossentropy(
        labels, outputs, from_logits=True)
    weight = tf.cast(labelled, tf.float32)
    return (tf.reduce_sum(each * weight, axis=[1, 2])
            / tf.maximum(tf.reduce_sum(weight, axis=[1, 2]), 1.0))

  def sums(self):
    return {"loss": (), "confusion": (self.num_classes, self.num_classes)}

  def batch_sums(self, labels, outputs, loss):
    labels, labelled = self._labelled(labels)
    predictions = tf.argmax(outputs, axis=-1, output_type=tf.int32)
    return {"loss": tf.reduce_sum(tf.cast(loss, tf.float64)),
            "confusion": tf.math.confusion_matrix(
                tf.boolean_mask(labels, labelled),
                tf.boolean_mask(predictions, labelled), self.num_classes,
                dtype=tf.float64)}

  def figures(self, sums):
    confusion = sums["confusion"]
    hits = np.diag(confusion)
    union = confusion.sum(axis=0) + confusion.sum(axis=1) - hits
    with np.errstate(divide="ignore", invalid="ignore"):
      iou = np.where(union > 0, hits / union, np.nan)
    present = union > 0
    figures = {
        "loss": float(sums["loss"]) / max(float(sums["examples"]), 1.0),
        "pixel_accuracy": float(hits.sum() / max(confusion.sum(), 1.0)),
        "mean_iou": float(iou[present].mean()) if present.any() else 0.0}
    figures.update({f"iou/{name}": float(value)
                    for name, value in zip(self.info.classes(), iou)})
    return figures

  def serve(self, outputs):
    return {"logits": outputs,
            "masks": tf.argmax(outputs, axis=-1, output_type=tf.int32)}

  def summary_images(self, sums):
    return {"confusion_matrix": (
        report.confusion_image(sums["confusion"]),
        "Pixels. Rows: true class, columns: predicted class, in label "
        "order (classes.txt); each row normalized, white 0 to dark blue 1.")}
