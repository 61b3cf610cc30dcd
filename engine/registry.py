"""Builders by name, for the flags that choose one (--model, --dataset)."""
import inspect
from typing import Callable

from engine.errors import UserError


class Registry:
  """Named builders; `build` passes each only the parameters it declares.

  The flags of several builders share one namespace: --dropout means
  something to every model, --depth only to wrn. A builder's signature says
  which flags it takes, and the others are not its concern.
  """

  def __init__(self, flag: str, builders: dict[str, Callable]):
    self._flag = flag
    self._builders = builders

  def names(self) -> list[str]:
    return sorted(self._builders)

  def build(self, name: str, *args, **params):
    if name not in self._builders:
      raise UserError(f"--{self._flag}={name} is unknown; choose one of "
                      f"{', '.join(self.names())}")
    builder = self._builders[name]
    accepted = inspect.signature(builder).parameters
    return builder(*args, **{k: v for k, v in params.items() if k in accepted})
