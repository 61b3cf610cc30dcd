"""A user's own function, named on the command line: `module:function`.

`--model` and `--dataset` take the engine's own names or a function of the
user's, as `package.module:function` (importable from the working directory
or PYTHONPATH) or `path/to/file.py:function`. So a user trains their own
model on their own data without editing the engine, and the run's
flags.txt names the function, so a resume or `engine.evaluate` finds it
again.
"""
import importlib
import importlib.util
import os
import sys
from typing import Callable

from engine.core.errors import first_line
from engine.core.errors import UserError


def is_spec(name: str) -> bool:
  """Whether `name` names a user's function rather than a registered one."""
  return ":" in name


def spec_of(function: Callable) -> str:
  """The `module:function` spec that finds `function` again.

  A function of the script being run (`__main__`) is named by the script's
  path, so that flags.txt can be used by another command.
  """
  name = getattr(function, "__qualname__", "")
  module = sys.modules.get(getattr(function, "__module__", None))
  if (not name or "<" in name or "." in name or module is None
      or getattr(module, name, None) is not function):
    raise UserError(f"{function!r} is not a module-level function; define "
                    "it with def at the top level of a module or script")
  if module.__name__ == "__main__":
    return f"{os.path.abspath(module.__file__)}:{name}"
  return f"{module.__name__}:{name}"


def load(spec: str, flag: str) -> Callable:
  """The function `spec` names; a UserError naming `--flag` otherwise."""
  where, _, name = spec.rpartition(":")
  if not where or not name.isidentifier():
    raise UserError(f"--{flag}={spec}: give package.module:function or "
                    "path/to/file.py:function")
  module = _import(where, spec, flag)
  function = getattr(module, name, None)
  if function is None:
    raise UserError(f"--{flag}={spec}: {where} has no {name}")
  if not callable(function):
    raise UserError(f"--{flag}={spec}: {name} is a "
                    f"{type(function).__name__}, not a function")
  return function


def _import(where: str, spec: str, flag: str):
  if where.endswith(".py") and not os.path.isfile(where):
    raise UserError(f"--{flag}={spec}: {where}: no such file")
  try:
    if where.endswith(".py"):
      return _import_file(where)
    return importlib.import_module(where)
  except Exception as e:  # the user's code: any error at import
    raise UserError(f"--{flag}={spec}: cannot import {where}: "
                    f"{type(e).__name__}: {first_line(e)}") from None


def _import_file(path: str):
  """Imports a .py file by path, once (as its own module, so a second
  lookup finds the same objects). The script being run is `__main__`."""
  path = os.path.abspath(path)
  main = sys.modules.get("__main__")
  if os.path.abspath(getattr(main, "__file__", "") or "") == path:
    return main
  name = "user_code." + os.path.splitext(os.path.basename(path))[0]
  if name in sys.modules and sys.modules[name].__file__ == path:
    return sys.modules[name]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  # Its own directory first, so it can import the files beside it.
  sys.path.insert(0, os.path.dirname(path))
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  finally:
    sys.path.remove(os.path.dirname(path))
  return module
