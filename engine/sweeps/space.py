"""A sweep's search space: which engine flags it varies, and how.

The space is a YAML file mapping each flag (its name, no dashes) to one
distribution:

  base_lr: {log_uniform: [0.01, 0.5]}     # a float flag
  label_smoothing: {uniform: [0.0, 0.2]}  # a float flag
  warmup_epochs: {int: [0, 3]}            # an integer (or float) flag
  optimizer: {choice: [sgd, adam]}        # any flag, values it parses

Optuna draws a trial's values from these (Optuna's names: suggest_float
with log, suggest_int, suggest_categorical), and the trial passes them as
flags. Each is checked against the engine's own flag before anything is
written: a flag the engine lacks, or a distribution its type cannot take,
is one line.
"""
import dataclasses
from typing import Any, Callable, Optional

import yaml

from engine.core.errors import UserError

KINDS = ("log_uniform", "uniform", "int", "choice")


@dataclasses.dataclass(frozen=True)
class Parameter:
  """One flag's distribution: `kind` one of KINDS; `values` the bounds
  (low, high) or, for choice, the values."""
  flag: str
  kind: str
  values: tuple

  def suggest(self, trial) -> Any:
    """Optuna's draw of this flag's value for `trial`."""
    if self.kind == "choice":
      return trial.suggest_categorical(self.flag, list(self.values))
    low, high = self.values
    if self.kind == "int":
      return trial.suggest_int(self.flag, low, high)
    return trial.suggest_float(self.flag, low, high,
                               log=self.kind == "log_uniform")

  def as_dict(self) -> dict:
    return {self.flag: {self.kind: list(self.values)}}


def read(path: str) -> list[Parameter]:
  """The space in the YAML file at `path`, shape-checked (not yet against
  the engine's flags: `check`)."""
  try:
    with open(path, encoding="utf-8") as f:
      document = yaml.safe_load(f)
  except OSError as e:
    raise UserError(f"--space={path}: cannot read it ({e.strerror})") \
        from None
  except yaml.YAMLError as e:
    where = getattr(e, "problem_mark", None)
    raise UserError(f"--space={path}: not YAML"
                    + (f" (line {where.line + 1})" if where else "")) \
        from None
  return parse(document, where=f"--space={path}")


def parse(document: Any, where: str) -> list[Parameter]:
  """The space a YAML document describes."""
  if not isinstance(document, dict) or not document:
    raise UserError(f"{where}: give a mapping of flags to distributions, "
                    "as base_lr: {log_uniform: [0.01, 0.5]}")
  return [_parameter(str(flag), spec, where)
          for flag, spec in document.items()]


def _parameter(flag: str, spec: Any, where: str) -> Parameter:
  flag = flag.removeprefix("--")
  if not isinstance(spec, dict) or len(spec) != 1:
    raise UserError(f"{where}: {flag}: give one distribution of "
                    f"{', '.join(KINDS)}, as {{uniform: [0.0, 0.2]}}")
  (kind, values), = spec.items()
  if kind not in KINDS:
    raise UserError(f"{where}: {flag}: {kind!r} is no distribution; use "
                    f"one of {', '.join(KINDS)}")
  if not isinstance(values, list) or not values:
    raise UserError(f"{where}: {flag}: {kind} takes a list, as "
                    f"{kind}: [{'sgd, adam' if kind == 'choice' else '0, 3'}]")
  if kind == "choice":
    return Parameter(flag, kind, tuple(values))
  if len(values) != 2 or not all(
      isinstance(v, (int, float)) and not isinstance(v, bool)
      for v in values):
    raise UserError(f"{where}: {flag}: {kind} takes two numbers [low, "
                    f"high], not {values}")
  low, high = values
  if kind == "int" and not all(isinstance(v, int) for v in values):
    raise UserError(f"{where}: {flag}: int takes two integers [low, high], "
                    f"not {values}")
  if not low < high:
    raise UserError(f"{where}: {flag}: {kind}: low {low} must be below "
                    f"high {high}")
  if kind == "log_uniform" and low <= 0:
    raise UserError(f"{where}: {flag}: log_uniform needs low > 0, not "
                    f"{low}")
  return Parameter(flag, kind, (low, high))


# The distributions a flag of each absl type can take.
_FITS = {"float": ("log_uniform", "uniform", "int", "choice"),
         "int": ("int", "choice")}


def check(space: list[Parameter], flag_type: Callable[[str], Optional[str]],
          parses: Callable[[str, str], Optional[str]], where: str) -> None:
  """Each parameter against the engine's flags: `flag_type(name)` is the
  flag's absl type ("float", "integer", "string", "bool", ...; None: no
  such flag) and `parses(name, text)` the flag's complaint about a value
  (None: it takes it)."""
  for parameter in space:
    kind = flag_type(parameter.flag)
    if kind is None:
      raise UserError(f"{where}: {parameter.flag}: the engine has no flag "
                      "of this name (python -m engine.train --helpfull "
                      "lists them)")
    if parameter.kind not in _FITS.get(kind, ("choice",)):
      raise UserError(f"{where}: {parameter.flag}: the flag is of type "
                      f"{kind}, which {parameter.kind} does not fit; use "
                      f"{' or '.join(_FITS.get(kind, ('choice',)))}")
    for value in (parameter.values if parameter.kind == "choice" else ()):
      complaint = parses(parameter.flag, as_flag_value(value))
      if complaint:
        raise UserError(f"{where}: {parameter.flag}: {value!r}: "
                        f"{complaint}")


def as_flag_value(value: Any) -> str:
  """A drawn value as the command line gives it (YAML's true as true)."""
  if isinstance(value, bool):
    return str(value).lower()
  return str(value)


def as_flags(params: dict) -> list[str]:
  """A trial's values as engine flags."""
  return [f"--{flag}={as_flag_value(value)}"
          for flag, value in params.items()]


def grid(space: list[Parameter], where: str) -> dict:
  """The space as Optuna's GridSampler takes it: every parameter a choice
  (an int range counts as its integers)."""
  search_space = {}
  for parameter in space:
    if parameter.kind == "choice":
      search_space[parameter.flag] = list(parameter.values)
    elif parameter.kind == "int":
      low, high = parameter.values
      search_space[parameter.flag] = list(range(low, high + 1))
    else:
      raise UserError(f"{where}: {parameter.flag}: --sampler=grid needs "
                      f"choice or int, not {parameter.kind}")
  return search_space
