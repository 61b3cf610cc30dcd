"""What a fit script hands the engine (engine.fit): its model as built and
compiled, its tf.data pipelines and its Keras callbacks.

Objects, not values: they travel beside the TrainConfig, not in it, and
flags.txt records them as `--model=fit --dataset=fit`; the same script,
started again into the same model_dir, gives them again and resumes. What
the engine would otherwise build from flags comes from them instead: the
data (engine/datasets/pipelines.py), the task (the compiled loss and
metrics, engine/tasks/compiled.py, or the model's own train_step,
engine/tasks/own_step.py), the optimizer (compile's) and the model. So the
flags that would have built those reach nothing here, and one the user set
is refused in one line naming what the script gave instead.
"""
import dataclasses
from typing import Optional

from absl import logging
import keras
import tensorflow as tf

from engine import datasets
from engine import tasks
from engine.core import registry
from engine.core import user_code
from engine.core.config import TrainConfig
from engine.core.errors import UserError
from engine.datasets import pipelines
from engine.tasks import compiled
from engine.tasks import own_step
import models

# What flags.txt names the script's model, data and task by.
NAME = registry.GIVEN

# The flags whose part the script gives, and what it gives instead.
_GIVEN_BY_THE_SCRIPT = {
    "model": "the model engine.fit was given",
    "dataset": "the tf.data.Dataset engine.fit was given",
    "task": "the model's compile() (loss and metrics) or its train_step",
    "data_dir": "the tf.data.Dataset engine.fit was given",
    "random_flip": "the tf.data pipeline (augment there)",
    "random_shift": "the tf.data pipeline (augment there)",
    "random_transpose": "the tf.data pipeline (augment there)",
    "mixed_precision": ("the model as built (set keras.mixed_precision's "
                        "policy before building it)"),
}
# These would build the engine's optimizer, which a fit run has not.
_OPTIMIZER_FLAGS = ("optimizer", "base_lr", "lr_scaling", "warmup_epochs",
                    "lr_schedule", "lr_decay_epochs", "lr_decay_factor",
                    "lr_decay_table", "momentum", "nesterov",
                    "label_smoothing")


@dataclasses.dataclass(frozen=True)
class Given:
  """A fit script's model, training and validation pipelines and
  callbacks."""
  model: keras.Model
  train: tf.data.Dataset
  validation: Optional[tf.data.Dataset] = None
  callbacks: tuple = ()
  # Given by engine.train's flags, not a script: --model's function built
  # the model, --dataset's returned the datasets (of_flags).
  by_flags: bool = False

  @classmethod
  def of_flags(cls, config: TrainConfig,
               given: pipelines.Datasets) -> "Given":
    """--dataset's tf.data datasets and the model --model's function
    builds for them, which trains as compiled or by its own train_step;
    a built-in model, compiled by nobody, is refused."""
    name = config.model.name
    if not user_code.is_spec(name):
      raise UserError(
          f"--dataset={config.data.name} returns tf.data datasets, which "
          f"train a model as its compile() or train_step says, and "
          f"--model={name} is compiled by nobody: give --model=FILE.py:"
          "function returning a compiled model, or return "
          "engine.datasets.Splits (docs/your-data.md)")
    train = pipelines.Pipeline.of(given.train,
                                  batch_size=config.training.batch_size,
                                  name="the training dataset")
    # Keras' names afresh, as any start of the run has them (a checkpoint
    # names its model), and the builder's seed.
    keras.backend.clear_session()
    keras.utils.set_random_seed(config.training.seed)
    model = models.build_as_written(
        name, input_shape=train.example_shape(), **config.model.params)
    return cls(model=model, train=given.train, validation=given.validation,
               by_flags=True)

  def __post_init__(self):
    if not isinstance(self.model, keras.Model):
      raise UserError(f"engine.fit(model=...): a {type(self.model).__name__}"
                      " is no keras.Model")
    for name in ("train", "validation"):
      value = getattr(self, name)
      if value is not None and not isinstance(value, tf.data.Dataset):
        raise UserError(
            f"engine.fit({'x' if name == 'train' else 'validation_data'}="
            f"...): a {type(value).__name__}; give a tf.data.Dataset of (x, "
            "y) or (x, y, sample_weight) (docs/from-fit.md)")

  def settled(self, config: TrainConfig) -> TrainConfig:
    """`config` with the defaults a fit script's run has where the flags
    left them (engine.fit sets them so): each process's batch a batched
    dataset's own, and the model's own precision."""
    training, performance = {}, {}
    if "batch_size" not in config.given:
      training["batch_size"] = batch_size_of(
          self.train, self.model, None) or config.training.batch_size
    if "mixed_precision" not in config.given:
      performance["mixed_precision"] = "none"
    return config.replace(training=training, performance=performance)

  def refuse_flags(self, config: TrainConfig) -> None:
    """A flag set for a part the script (or --model's and --dataset's
    functions) gives is refused in one line naming what it gives
    instead."""
    where = ("for --dataset's tf.data datasets" if self.by_flags
             else "under engine.fit")
    # What engine.train's flags name the parts by, or hand their functions.
    named = ("model", "dataset", "data_dir") if self.by_flags else ()
    for flag, instead in _GIVEN_BY_THE_SCRIPT.items():
      if flag in config.given and flag not in named and not (
          flag == "mixed_precision"
          and config.performance.mixed_precision == "none"):  # (fit's own)
        raise UserError(f"--{flag} reaches nothing {where}, which "
                        f"trains {instead}; drop the flag")
    for section in (() if self.by_flags else
                    (config.model, config.data, config.task)):
      for param in section.params:
        if param in config.given and param != "seed":
          raise UserError(f"--{param} reaches nothing under engine.fit: the "
                          "model and the data are the script's; drop it")
    if config.faults.on_nonfinite == "rollback":
      raise UserError(f"--on_nonfinite=rollback lowers the engine's learning "
                      f"rate, and a run {where} trains at the model's own; "
                      "use --on_nonfinite=stop (or TerminateOnNaN)")
    for flag in _OPTIMIZER_FLAGS:
      if flag in config.given:
        raise UserError(
            f"--{flag} reaches nothing {where}, which trains with the "
            "model's optimizer (compile()'s, or those its train_step "
            "applies); change it there, or drop the flag")

  def splits_and_task(self, config: TrainConfig
                      ) -> tuple[datasets.Splits, tasks.Task]:
    """The pipelines as the engine's splits, and what is learned from
    them: the model's own train_step, else its compiled loss and
    metrics."""
    self.refuse_flags(config)
    splits = pipelines.splits_of(
        self.train, self.validation, batch_size=config.training.batch_size,
        model=self.model, steps_per_epoch=config.training.steps_per_epoch)
    if splits.train.batch_size != config.training.batch_size:
      raise UserError(f"--batch_size={config.training.batch_size} for a "
                      f"dataset batched by {splits.train.batch_size}: its "
                      "batches are each process's; drop the flag")
    x_spec, y_spec, parts = splits.train.batch_specs()
    if own_step.overrides_train_step(self.model):
      task = own_step.OwnStep.of(self.model, splits.info, x_spec=x_spec,
                                 y_spec=y_spec, parts=parts)
      if self.validation is not None and not task.evaluates:
        raise UserError(f"engine.fit(validation_data=...): model "
                        f"{self.model.name!r} cannot evaluate (its "
                        "test_step cannot run without call()); override "
                        "test_step, or give no validation_data")
    elif compiled.is_compiled(self.model):
      if parts == 1:
        raise UserError(f"the training dataset yields x alone, and model "
                        f"{self.model.name} is compiled with a loss, which "
                        "needs labels: yield (x, y), or override train_step")
      task = compiled.Compiled.of(self.model, splits.info, x_spec=x_spec,
                                  y_spec=y_spec, weighted=parts == 3)
    else:
      raise UserError(f"engine.fit: model {self.model.name} is not "
                      "compiled; call model.compile(optimizer, loss, "
                      "metrics) first, as for model.fit")
    logging.info("%s", splits.train.described())
    return splits, task


def refuse_its_own_training(config: TrainConfig, model: keras.Model) -> None:
  """A model compiled with a loss, or with its own train_step, trains as
  it says on tf.data datasets (Given.of_flags); on the engine's data its
  --task trains it, so what it says would be dropped: refused."""
  own = ("its own train_step" if own_step.overrides_train_step(model) else
         "compile()'s loss" if compiled.is_compiled(model) else "")
  if own:
    raise UserError(
        f"--model={config.model.name} returns a model trained by {own}, "
        f"which --dataset={config.data.name}'s data would not use (--task="
        f"{config.task.name} trains it): return the model uncompiled, or "
        "return tf.data datasets from a --dataset function "
        "(docs/from-fit.md)")


def optimizers_of(task: tasks.Task, model: keras.Model) -> dict:
  """The optimizers a compiled model or its own train_step trains with:
  compile()'s (named ""), or those its train_step applies, by the
  attribute holding each (own_step.py); none for the engine's tasks,
  whose optimizer the flags build."""
  if isinstance(task, own_step.OwnStep):
    return {name: getattr(model, name) for name in task.optimizers}
  if isinstance(task, compiled.Compiled):
    return {"": model.optimizer}
  return {}


def batch_size_of(train: tf.data.Dataset, model: keras.Model,
                  asked: Optional[int]) -> Optional[int]:
  """Each process's batch: a batched pipeline's own, as in Horovod's
  examples; an unbatched one's is `asked` (engine.fit's batch_size, or
  --batch_size). Both for a batched pipeline is refused, unless equal."""
  if not isinstance(train, tf.data.Dataset):
    return asked  # (refused as it is built: Given)
  pipeline = pipelines.Pipeline.of(train, batch_size=asked or 0, model=model,
                                   name="the training dataset")
  if not pipeline.batched:
    return asked
  if asked and asked != pipeline.batch_size:
    raise UserError(f"engine.fit(batch_size={asked}) for a dataset batched "
                    f"by {pipeline.batch_size}: its batches are each "
                    "process's; drop batch_size, or batch it by that")
  return pipeline.batch_size


class AsBuilt:
  """The one model of a fit run, as the script built it, in the builder's
  place (engine/build.py's ModelBuilder): nothing is built again, in
  another precision or for auto to measure (refused: _GIVEN_BY_THE_SCRIPT)."""

  def __init__(self, model: keras.Model):
    self._model = model

  def model(self, mode: str) -> keras.Model:
    del mode  # "none": the model's own dtype policy
    return self._model

  def measured_step(self, mode: str, compression: str):
    raise UserError(f"--mixed_precision={mode} --gradient_compression="
                    f"{compression}: auto measures models built afresh, and "
                    "engine.fit has the script's one model; give "
                    "--gradient_compression=none or fp16")
