"""What the train loop does every so many steps: actions, as Orbit's
controller and Keras' callbacks have them.

The loop takes its steps in calls of up to --steps_per_call steps. Each
action says when it is next due (`next_due`): the loop ends its next call
at the nearest of those steps, so every cadence holds step by step at any
K, and after the call runs the actions due there (`run`). An action due
after every call, whatever its length (progress, the stop check), has no
steps of its own (`next_due` None) and `after_every_call` set.

Every rank runs every action at the same step (the steps are the same on
every rank), so an action may use collectives; one that writes files does
it on rank 0 (`At.is_chief`). A user's script adds its own through
`engine.train.run(actions=[...])` (docs/training.md, "Your own actions").
"""
import dataclasses
from typing import Callable, Optional

import keras


@dataclasses.dataclass(frozen=True)
class At:
  """Where the run stands after a call: what an action is given."""
  global_step: int  # steps taken over the run, the optimizer's iterations
  epoch: int        # the epoch being trained, from 0
  step: int         # steps of that epoch done
  model: keras.Model
  rank: int
  world_size: int   # the number of processes
  is_chief: bool    # this is rank 0, which owns model_dir
  model_dir: str
  stop_agreed: bool = False  # every rank received a stop request


class Action:
  """Something the loop does at some steps."""

  # Due after each call, whatever steps it took.
  after_every_call = False

  def next_due(self, global_step: int) -> Optional[int]:
    """The first step after `global_step` at which this is due; None if
    none is ahead."""
    raise NotImplementedError

  def run(self, at: At) -> None:
    raise NotImplementedError


class Every(Action):
  """`function(at)` after every `steps` steps of the run (global steps
  `steps`, 2 * `steps`, ...), on every rank.

  Subclass it and override `run`, or pass `function`: for a user's own
  evaluation, a log line, a file rank 0 writes."""

  def __init__(self, steps: int, function: Optional[Callable[[At], None]]
               = None):
    if steps < 1:
      raise ValueError(f"Every(steps={steps}): steps must be 1 or more")
    self.steps = steps
    self._function = function

  def next_due(self, global_step: int) -> Optional[int]:
    return (global_step // self.steps + 1) * self.steps

  def run(self, at: At) -> None:
    self._function(at)


def every(steps: int, action: Callable[[At], None]) -> list[Action]:
  """`action` every `steps` steps; none if `steps` is 0 (the flag's off)."""
  return [Every(steps, action)] if steps else []


class Once(Action):
  """`function(at)` once, after the first call (a start's: its optimizer
  state is broadcast after its first update)."""

  def __init__(self, function: Callable[[At], None]):
    self._function = function
    self._done = False

  def next_due(self, global_step: int) -> Optional[int]:
    return None if self._done else global_step + 1

  def run(self, at: At) -> None:
    self._function(at)
    self._done = True


class AfterEveryCall(Action):
  """`function(at)` after each call, ending none early."""

  after_every_call = True

  def __init__(self, function: Callable[[At], None]):
    self._function = function

  def next_due(self, global_step: int) -> Optional[int]:
    return None

  def run(self, at: At) -> None:
    self._function(at)


def steps_in_call(actions: list[Action], global_step: int, *,
                  at_most: int) -> int:
  """How many steps the next call takes after `global_step`: `at_most`
  (--steps_per_call, or fewer to the epoch's end), ending at the first
  step at which an action is due."""
  count = at_most
  for action in actions:
    due = action.next_due(global_step)
    if due is not None:
      count = min(count, due - global_step)
  return count


def due(actions: list[Action], before: int, now: int) -> list[Action]:
  """The actions due after a call that went from step `before` to `now`,
  in their order."""
  return [action for action in actions
          if action.after_every_call or action.next_due(before) == now]
