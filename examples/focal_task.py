"""Your own task: classification with the focal loss and top-2 accuracy.

  horovodrun --gloo -np 2 .venv/bin/python -m engine.train \
      --task=examples/focal_task.py:FocalLoss --epochs=2

The focal loss (Lin et al. 2017) weighs each example's cross-entropy by
(1 - p)^gamma, p the probability of its true class: examples the model
already gets right count less. The metrics are sums the engine adds up
across ranks; `figures` turns them into ratios, exactly the whole split's.
"""
import keras
import tensorflow as tf

from engine.tasks import Task


class FocalLoss(Task):
  best_metric = "top2_accuracy:max"  # decides best/ and --target
  labels = "classes"  # integer class ids, one per image
  augmentation_keeps_targets = True  # a flipped or shifted image: same class
  gamma = 2.0

  def loss(self, labels, outputs):
    cross_entropy = keras.losses.sparse_categorical_crossentropy(
        labels, outputs, from_logits=True)
    p = tf.exp(-cross_entropy)  # the probability of the true class
    return (1.0 - p) ** self.gamma * cross_entropy

  def sums(self):
    return {"loss": (), "correct": (), "top2": ()}

  def batch_sums(self, labels, outputs, loss):
    def hits(k):
      return tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, outputs, k),
                                   tf.float64))
    return {"loss": tf.reduce_sum(tf.cast(loss, tf.float64)),
            "correct": hits(1), "top2": hits(2)}

  def figures(self, sums):
    n = max(sums["examples"], 1)
    return {"loss": sums["loss"] / n, "accuracy": sums["correct"] / n,
            "top2_accuracy": sums["top2"] / n}
