"""Flags: what is learnt (the task) and which figure judges it."""
from absl import flags

from engine import tasks

flags.DEFINE_string(
    "task", "classification",
    f"What the model learns: one of {', '.join(tasks.names())}, or your own "
    "task class as package.module:Class or path/to/file.py:Class: its loss, "
    "its metrics as sums, the figure that decides the best checkpoint "
    "(docs/your-task.md).")
flags.register_validator(
    "task", tasks.is_known,
    f"value should be one of {', '.join(tasks.names())}, or "
    "package.module:Class or path/to/file.py:Class")
flags.DEFINE_string(
    "best_metric", "",
    "The validation figure that decides best/, early stopping and --target, "
    "and whether higher or lower is better: val_accuracy:max, val_mae:min. "
    "Empty: the task's own (classification: val_accuracy:max).")
flags.DEFINE_float(
    "target", 0.0,
    "Stop early after --patience consecutive epochs with the deciding "
    "validation figure (--best_metric) at or beyond this. 0: never. "
    "--target_accuracy is this for val_accuracy.")
flags.DEFINE_integer(
    "ignore_label", -1,
    "segmentation: a mask value that labels no class (255 in Cityscapes "
    "and Pascal VOC): no loss, not counted in the figures. -1: none.",
    lower_bound=-1)
flags.DEFINE_string(
    "loss", "",
    "The task's loss, where it offers several: regression mse, mae or "
    "huber; reconstruction mse or mae. Empty: the task's default (mse).")
flags.DEFINE_float(
    "noise", 0.5,
    "reconstruction: the standard deviation of the Gaussian noise added to "
    "each (normalized) input image, which the model removes; 0: a plain "
    "autoencoder.", lower_bound=0.0)
flags.DEFINE_bool(
    "standardize_targets", True,
    "regression: the model predicts each target standardized (minus its "
    "training mean, over its std; the statistics recorded in model_dir). "
    "false: the targets as stored, for targets already scaled to the "
    "model's output range (CosmoFlow's, in [-1, 1], for its tanh outputs "
    "scaled by 1.2).")
