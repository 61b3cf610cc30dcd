"""Builders by name, for the flags that choose one (--model, --dataset)."""
import inspect
from typing import Callable

from engine.core import user_code
from engine.core.errors import first_line
from engine.core.errors import UserError


class Registry:
  """Named builders; `build` passes each only the parameters it declares.

  The flags of several builders share one namespace: --dropout means
  something to every model, --depth only to wrn. A builder's signature says
  which flags it takes, and the others are not its concern. A name of the
  form `module:function` is a user's own builder (engine/core/user_code.py),
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
    """A registered name, or a user's `module:function`."""
    return name in self._builders or user_code.is_spec(name)

  def builder(self, name: str) -> Callable:
    if user_code.is_spec(name):
      return user_code.load(name, self._flag)
    if name not in self._builders:
      raise UserError(f"--{self._flag}={name} is unknown; choose one of "
                      f"{', '.join(self.names())} or give "
                      f"package.module:{self._kind}")
    return self._builders[name]

  def build(self, name: str, *args, **params):
    builder = self.builder(name)
    try:
      accepted = inspect.signature(builder).parameters
    except (TypeError, ValueError):  # a builtin or an odd callable
      accepted = {}
    if not any(p.kind == p.VAR_KEYWORD for p in accepted.values()):
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
