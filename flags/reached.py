"""The flags a user set that reach no builder of the run, refused.

A flag's value goes to the builders that declare it (engine/core/
registry.py): the model's, the data set's loader's, the task's. One that
none of them takes would be dropped quietly, and its user would believe it
took effect; so it is refused, in one line naming who would take it.
"""
from engine import datasets
from engine import tasks
from engine.core.config import TrainConfig
from engine.core.errors import UserError
import models


# The builders' parameters the engine reads too: --seed seeds the whole
# run, --weight_decay reaches the optimizer under AdamW (weight_decay.py).
_READ_BY_THE_ENGINE = ("seed", "weight_decay")


def refuse_unreached_flags(config: TrainConfig) -> None:
  """A UserError for a flag the user set that no builder of the run takes
  (the model's, the data set's loader's, the task's), naming the builders
  that would: a flag dropped quietly leaves them believing it took effect.

  Each builder's flags are its section's params (flags/__init__.py), so a
  flag its builder does not take reaches no other either. Checked before
  anything is built, by every command that builds the run's parts.
  """
  for registry, section in ((models, config.model),
                            (datasets, config.data), (tasks, config.task)):
    for param, value in section.params.items():
      if (param in config.given and param not in _READ_BY_THE_ENGINE
          and not registry.takes(section.name, param)):
        raise UserError(f"--{param}={_as_given(value)} reaches nothing: "
                        f"{registry.not_taken(section.name, param)}")


def _as_given(value) -> str:
  """A flag's value as the command line spells it."""
  if isinstance(value, (list, tuple)):
    return ",".join(map(str, value))
  return str(value).lower() if isinstance(value, bool) else str(value)
