"""Builders by name, for the flags that choose one (--model, --dataset)."""
import inspect
from typing import Callable

from engine.core import user_code
from engine.core.errors import first_line
from engine.core.errors import UserError


# What flags.txt names a fit script's own model, data and task by
# (engine/given.py): known to the flags, built by the script alone.
GIVEN = "fit"


class Registry:
  """Named builders; `build` passes each only the parameters it declares.

  The flags of several builders share one namespace: --dropout means
  something to several models, --depth only to wrn. A builder's signature
  says which flags it takes, and the others are not its concern; but a flag
  the user set that this run's builder does not take is refused before
  anything is built (`takes`, `not_taken`; flags/reached.py), since dropping
  it would leave them believing it took effect. A name of the form
  `module:function` is a user's own builder (engine/core/user_code.py),
  passed its parameters the same way.
  """

  def __init__(self, flag: str, builders: dict[str, Callable],
               kind: str = "function"):
    """`kind`: what a user's builder is, in messages (a task's is a
    class)."""
    self._flag = flag
    self._builders = builders
    self._kind = kind

  def names(self) -> list[str]:
    return sorted(self._builders)

  def is_known(self, name: str) -> bool:
    """A registered name, a user's `module:function`, or a fit script's."""
    return (name in self._builders or user_code.is_spec(name)
            or name == GIVEN)

  def builder(self, name: str) -> Callable:
    if name == GIVEN:
      raise UserError(f"--{self._flag}={GIVEN}: a run of a fit script "
                      "(engine.fit), whose model and data are the script's: "
                      "start the script again (docs/from-fit.md)")
    if user_code.is_spec(name):
      return user_code.load(name, self._flag)
    if name not in self._builders:
      raise UserError(f"--{self._flag}={name} is unknown; choose one of "
                      f"{', '.join(self.names())} or give "
                      f"package.module:{self._kind}")
    return self._builders[name]

  def takes(self, name: str, param: str) -> bool:
    """Whether `name`'s builder declares `param` (one with **kwargs takes
    every one)."""
    accepted = _accepted(self.builder(name))
    return accepted is None or param in accepted

  def not_taken(self, name: str, param: str) -> str:
    """Why `param` does not reach `name`'s builder, and which registered
    builders it would reach: the end of a one-line error."""
    takers = [other for other in self.names() if self.takes(other, param)]
    others = (f" ({', '.join(takers)} take{'s' if len(takers) == 1 else ''}"
              " it)" if takers else f" (no --{self._flag} takes it)")
    if user_code.is_spec(name):
      builder = self.builder(name)
      return (f"--{self._flag}={name} takes no {param}: "
              f"{getattr(builder, '__name__', name)}'s signature does not "
              f"declare it{others}")
    return f"--{self._flag}={name} takes no {param}{others}"

  def build(self, name: str, *args, **params):
    builder = self.builder(name)
    accepted = _accepted(builder)
    if accepted is not None:
      params = {k: v for k, v in params.items() if k in accepted}
    try:
      return builder(*args, **params)
    except Exception as e:
      # The user's code: one line, not a traceback. Ours: a bug, shown whole.
      if isinstance(e, UserError) or not user_code.is_spec(name):
        raise
      raise UserError(f"--{self._flag}={name}: {builder.__name__}("
                      f"{', '.join(params)}) raised {type(e).__name__}: "
                      f"{first_line(e)}") from None


def _accepted(builder: Callable):
  """The parameters `builder` declares, or None for one with **kwargs,
  which takes any."""
  try:
    parameters = inspect.signature(builder).parameters
  except (TypeError, ValueError):  # a builtin or an odd callable
    return set()
  if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
    return None
  return set(parameters)
