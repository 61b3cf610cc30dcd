"""Tasks by name (--task), a user's task class, and their checks.

`--task=classification` (the default), a built-in task's name, or a user's
class as `package.module:Class` or `path/to/file.py:Class`, found again
from flags.txt by a resume and engine.evaluate. A task is checked at
start-up on every rank, as a model is: its methods, on the model's output
for two blank images and two blank labels, each failure one line.
"""
import dataclasses
import math

import numpy as np
import keras
import tensorflow as tf

from engine.core.errors import first_line
from engine.core.errors import UserError
from engine.core.registry import Registry
from engine.datasets import DatasetInfo, LabelKind
from engine.tasks.classification import Classification
from engine.tasks.reconstruction import Reconstruction
from engine.tasks.regression import Regression
from engine.tasks.segmentation import Segmentation
from engine.tasks.task import Task
import models

_TASKS = Registry("task", {
    "classification": Classification,
    "reconstruction": Reconstruction,
    "regression": Regression,
    "segmentation": Segmentation,
}, kind="Class")
names = _TASKS.names
is_known = _TASKS.is_known
takes = _TASKS.takes
not_taken = _TASKS.not_taken
# What a task must define; a Task subclass inherits only stubs of them.
_REQUIRED = ("loss", "sums", "batch_sums", "figures")
# What a task with optimizers of its own (a train step of its own) defines.
_OWN_STEP = ("optimized_variables", "train_step")
# The sum the engine counts itself.
EXAMPLES = "examples"


def build_model(task: Task, spec: str, build) -> keras.Model:
  """The task's model (`build(output_shape)` builds --model's); a failure
  of the task's own build_model is one line."""
  model = _called(f"--task={spec}", "build_model", task.build_model, build)
  models.refuse_keras2(model, f"--task={spec}")
  return model


def defines(task: Task, method: str) -> bool:
  """Whether `task` has `method` of its own, not the base class's stub
  (or, for a task that is no Task subclass, at all)."""
  own = getattr(type(task), method, None)
  return callable(own) and own is not getattr(Task, method, None)


def task_class(spec: str) -> type:
  """The class `spec` names: what data it learns from (`labels`) is read
  before the data are loaded."""
  return _TASKS.builder(spec)


def build(spec: str, info: DatasetInfo, **params) -> Task:
  """The task `spec` names, for data `info`, given whichever of `params`
  (the task flags) its __init__ declares."""
  _check_labels(spec, getattr(task_class(spec), "labels", None), info)
  task = _TASKS.build(spec, info, **params)
  if not isinstance(task, Task):
    raise UserError(f"--task={spec}: {type(task).__name__} is no task; "
                    "subclass engine.tasks.Task (docs/your-task.md)")
  required = _REQUIRED + (_OWN_STEP if task.optimizers else ())
  missing = [name for name in required if not defines(task, name)]
  if missing:
    raise UserError(f"--task={spec}: {type(task).__name__} does not define "
                    f"{', '.join(missing)} (docs/your-task.md)")
  return task


def _check_labels(spec: str, kind, info: DatasetInfo) -> None:
  """Labels of the kind the task learns from (any, for None), or a
  UserError."""
  kind = LabelKind.of(kind)
  if kind is None or info.label_kind == kind:
    return
  integer = tf.as_dtype(info.label_dtype).is_integer
  shape = list(info.label_shape)
  given = ("class ids" if not shape and integer else
           f"labels of shape [N, {', '.join(map(str, shape))}] "
           f"{info.label_dtype}" if shape else f"{info.label_dtype} labels")
  height, width = info.image_shape[:2]
  wanted = {
      LabelKind.CLASSES: "learns from class ids, one integer per image",
      LabelKind.TARGETS: "learns float targets [N, k]",
      LabelKind.MASKS: f"learns integer masks [N, {height}, {width}], a "
                       "class per pixel of the images",
      LabelKind.OTHER: "learns from labels of its own"}[kind]
  hint = (" (arrays: float y_train and y_test)"
          if kind == LabelKind.TARGETS else "")
  raise UserError(f"--task={spec} {wanted}; {info.name} gives {given}{hint}")


def check(task: Task, spec: str, model: keras.Model,
          input_shape: tuple) -> None:
  """The task's methods on the model's outputs for two blank images and
  two blank labels, or a UserError naming what is wrong."""
  where = f"--task={spec}"
  inputs, labels = _called(
      where, "inputs_and_targets", task.inputs_and_targets,
      tf.zeros((2, *input_shape)),
      tf.zeros((2, *task.label_shape()), task.label_dtype()))
  outputs = _called(where, "the model's call",
                    lambda images: model(images, training=False), inputs)
  loss = _called(where, "loss", task.loss, labels, outputs)
  if getattr(loss, "dtype", None) != tf.float32 or tuple(loss.shape) != (2,):
    raise UserError(f"{where}: loss must return each example's float32 "
                    f"loss, [batch]; it returned "
                    f"{_described(loss)} for a batch of 2")
  declared = {name: tuple(shape) for name, shape in
              _called(where, "sums", task.sums).items()}
  if EXAMPLES in declared:
    raise UserError(f"{where}: sums declares {EXAMPLES!r}, which the engine "
                    "counts itself; drop it")
  sums = _called(where, "batch_sums", task.batch_sums, labels, outputs, loss)
  if not isinstance(sums, dict) or set(sums) != set(declared):
    raise UserError(f"{where}: batch_sums returned "
                    f"{sorted(sums) if isinstance(sums, dict) else sums!r}; "
                    f"it must return the sums declared by sums(): "
                    f"{sorted(declared)}")
  for name, value in sums.items():
    if tuple(tf.shape(value).numpy()) != declared[name]:
      raise UserError(f"{where}: batch_sums gives {name!r} of "
                      f"{_described(value)}; sums() declares shape "
                      f"{list(declared[name])}")
  totals = {name: np.asarray(value, np.float64) for name, value in
            sums.items()}
  totals[EXAMPLES] = np.float64(2)
  figures = _called(where, "figures", task.figures, totals)
  metric = Decider.of(task.best_metric, task).figure
  if not isinstance(figures, dict) or metric not in figures:
    raise UserError(f"{where}: figures returned {figures!r}; it must return "
                    f"a dict of figures including {metric!r} "
                    "(the task's best_metric)")


@dataclasses.dataclass(frozen=True)
class Decider:
  """The validation figure that decides best/, early stopping and
  --target, and its direction: `val_<figure>`, higher or lower better."""
  figure: str
  minimize: bool

  @classmethod
  def of(cls, spec: str, task: Task, flag: str = "") -> "Decider":
    """From `figure:max`, `figure:min` or `val_figure:...`; a figure the
    task decides by may leave out the direction. `flag` names where
    `spec` came from in errors (--best_metric), else the task."""
    where = f"--best_metric={spec}" if flag else (
        f"{type(task).__name__}.best_metric={spec!r}")
    figure, _, direction = spec.partition(":")
    figure = figure.removeprefix("val_")
    default = task.best_metric.partition(":")
    if not direction and figure == default[0].removeprefix("val_"):
      direction = default[2]
    if direction not in ("max", "min") or not figure:
      raise UserError(f"{where}: give a validation figure and whether "
                      "higher or lower is better, as val_mae:min or "
                      "val_accuracy:max")
    return cls(figure, direction == "min")

  @property
  def key(self) -> str:
    """The figure's key in metrics.jsonl."""
    return f"val_{self.figure}"

  def __str__(self) -> str:
    return f"{self.key}:{'min' if self.minimize else 'max'}"

  def score(self, value: float) -> float:
    """Higher is better, whichever way the figure goes."""
    return -value if self.minimize else value

  def reached(self, value: float, target: float) -> bool:
    return (value <= target if self.minimize else value >= target) and \
        math.isfinite(value)


def _called(where: str, method: str, function, *args):
  try:
    return function(*args)
  except UserError:
    raise
  except Exception as e:  # the user's code: one line
    raise UserError(f"{where}: {method}() raised {type(e).__name__}: "
                    f"{first_line(e)}") from None


def _described(value) -> str:
  if isinstance(value, tf.Tensor):
    return f"{value.dtype.name} of shape {value.shape.as_list()}"
  return type(value).__name__
