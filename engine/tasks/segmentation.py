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
import keras
import tensorflow as tf

from engine.tasks.classification import confusion_image
from engine.datasets import LabelKind
from engine.tasks.task import Task

# Tableau's 10 colours; the background (class 0) is black.
_PALETTE = np.array([
    [0, 0, 0], [31, 119, 180], [255, 127, 14], [44, 160, 44],
    [214, 39, 40], [148, 103, 189], [140, 86, 75], [227, 119, 194],
    [127, 127, 127], [188, 189, 34], [23, 190, 207]], np.uint8)


class Segmentation(Task):
  """Integer masks [batch, H, W]; float32 logits [batch, H, W, classes]."""

  best_metric = "mean_iou:max"
  # Masks are flipped and shifted with their images (engine/datasets).
  augmentation_keeps_targets = True
  labels = LabelKind.MASKS

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
    each = keras.losses.sparse_categorical_crossentropy(
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
    # None: a class in no mask and no prediction, whose IoU is undefined.
    figures.update({f"iou/{name}": None if np.isnan(value) else float(value)
                    for name, value in zip(self.info.classes(), iou)})
    return figures

  def serve(self, outputs):
    return {"logits": outputs,
            "masks": tf.argmax(outputs, axis=-1, output_type=tf.int32)}

  def sample_images(self, model, images, labels):
    outputs = model(images, training=False).numpy()
    return {"masks": (
        masks_picture(self.stored(images), labels.numpy(),
                      outputs.argmax(axis=-1),
                      self.ignore_label),
        "Each row a test example: the image, its true mask, the predicted "
        "mask; a colour per class (background black, ignored white).")}

  def summary_images(self, sums):
    return {"confusion_matrix": (
        confusion_image(sums["confusion"]),
        "Pixels. Rows: true class, columns: predicted class, in label "
        "order (classes.txt); each row normalized, white 0 to dark blue 1.")}


def masks_picture(images: np.ndarray, true: np.ndarray, predicted: np.ndarray,
                  ignore_label: int = -1, scale: int = 0) -> np.ndarray:
  """A [1, H', W', 3] uint8 picture: a row per example, its image (0-255
  scale), true mask and predicted mask side by side; small images scaled
  up to about 96 pixels high."""
  scale = scale or max(1, 96 // images.shape[1])

  def coloured(masks):
    pixels = _PALETTE[np.asarray(masks) % len(_PALETTE)]
    pixels[np.asarray(masks) == ignore_label] = 255
    return pixels

  if images.max(initial=0) <= 1.0:  # float images on a 0-1 scale
    images = images * 255.0
  shown = np.clip(images, 0, 255).astype(np.uint8)
  if shown.shape[-1] == 1:
    shown = np.repeat(shown, 3, axis=-1)
  rows = np.concatenate([shown[..., :3], coloured(true), coloured(predicted)],
                        axis=2)
  picture = np.concatenate(list(rows), axis=0)
  return np.kron(picture, np.ones((scale, scale, 1), np.uint8))[None]
