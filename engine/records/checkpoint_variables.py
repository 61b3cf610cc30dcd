"""What a checkpoint holds of a model and its optimizer: every variable,
keyed by its place in the list Keras keeps of them.

TensorFlow's object graph does not follow the lists and dicts Keras 3
tracks: a model holding its layers in `self.blocks = [...]` would be saved
without them (their BatchNorm statistics, and all their weights but the
optimizer's copy). Keras' own lists (`model.variables`,
`optimizer.variables`) hold every one, in the order the model's code
creates its layers: the same in every process and every rebuild of that
code, where its layer names carry counters of what the process built
before. So a checkpoint names each variable by its place there (`keyed`),
and one that lacks any is refused, naming them, before anything is
restored.

Checkpoints of format 2 named the model and the optimizer by their object
graphs. They are read still where that graph reaches every variable of
the model's layers (the weights: a layer's random seed's state starts
afresh, as it always did then), and refused where it does not.
"""
import keras
import tensorflow as tf

from engine.compute import optimizers

MODEL = "model_variables"
OPTIMIZER = "optimizer_variables"
_VALUE = ".ATTRIBUTES/VARIABLE_VALUE"  # a variable's tensor in its key


def keyed(variables: list) -> dict:
  """`variables` (Keras' list of a model's or an optimizer's) by the keys
  a checkpoint names them by: their places in the list, as "0012". Not
  their names: an optimizer's slots are named after its model's paths,
  whose layer names count what the process built before."""
  return {f"{index:04d}": variable for index, variable in enumerate(variables)}


class Variables:
  """A model's variables and its optimizer's (None: evaluation, which
  restores none of the optimizer's), as a checkpoint holds them."""

  def __init__(self, model: keras.Model, optimizer=None):
    self._keyed = {MODEL: keyed(model.variables)}
    if optimizer is not None:
      self._keyed[OPTIMIZER] = _optimizer_variables(optimizer)
    self.objects = {name: tf.train.Checkpoint(**variables)
                    for name, variables in self._keyed.items()}
    # What format 2 held instead.
    self._format_2 = dict(model=model, **(
        {} if optimizer is None else {"optimizer": optimizer}))
    self._model = model
    self._optimizer = optimizer

  @property
  def model_variables(self) -> list:
    return list(self._keyed[MODEL].values())

  def objects_for(self, keys, optimizer: bool = True) -> dict:
    """What restores the checkpoint whose tensors are `keys` (its format's
    objects), without the optimizer's if `optimizer` is false."""
    if is_keyed(keys):
      return {name: saved for name, saved in self.objects.items()
              if optimizer or name == MODEL}
    return {name: saved for name, saved in self._format_2.items()
            if optimizer or name == "model"}

  def refusal(self, keys) -> str:
    """Why the checkpoint whose tensors are `keys` cannot be restored:
    the variables it lacks, of how many, and what to do; "" if it holds
    them all."""
    lacking, restored = self._lacking(keys)
    if not lacking:
      return ""
    names = [getattr(v, "path", v.name) for v in lacking[:3]]
    more = len(lacking) - len(names)
    named = ", ".join(names) + (f" and {more} more" if more > 0 else "")
    if not is_keyed(keys):
      why = (": it was written before the engine saved the variables a "
             "model holds in lists and dicts, and would go on with them as "
             "built; train the run again in another --model_dir")
    elif not {id(v) for v in lacking} & {id(v) for v in self.model_variables}:
      why = (": it holds another optimizer's state than this run's (another "
             "--optimizer, or --momentum raised from 0); resume it with the "
             "flags it was saved with, or start a new run in another "
             "--model_dir")
    else:
      why = (": it was damaged or written for other code; give another "
             "checkpoint, or start a new run in another --model_dir")
    return (f"lacks {len(lacking)} of the {restored} variables to restore "
            f"({named}){why}")

  def _lacking(self, keys) -> tuple[list, int]:
    """The variables the checkpoint whose tensors are `keys` does not
    hold, and how many it should: the keyed ones it lacks, or for format
    2, the weights its object graph could not reach (those in Keras' lists
    and dicts)."""
    if is_keyed(keys):
      return [variable for name, variables in self._keyed.items()
              for key, variable in variables.items()
              if f"{name}/{key}/{_VALUE}" not in keys], sum(
                  map(len, self._keyed.values()))
    graph = tf.train.Checkpoint(**self._format_2)  # (the view holds it
    # weakly)
    reached = {id(each) for each in tf.train.TrackableView(graph)
               .descendants()}
    weights = self._model.weights + (
        [] if self._optimizer is None else optimizers.state(self._optimizer))
    return [variable for variable in weights
            if id(variable) not in reached], len(weights)


def is_keyed(keys) -> bool:
  """Whether the checkpoint whose tensors are `keys` keys its variables
  (format 3 on)."""
  return any(key.startswith(f"{MODEL}/") for key in keys)


def _optimizer_variables(optimizer) -> dict:
  """The optimizer's variables `keyed`; a task's several optimizers (a
  GAN's generator's and discriminator's) each under its name, as
  generator_0003."""
  if not isinstance(optimizer, optimizers.Several):
    return keyed(optimizers.state(optimizer))
  return {f"{name}_{key}": variable
          for name, each in optimizer.by_name.items()
          for key, variable in keyed(optimizers.state(each)).items()}
