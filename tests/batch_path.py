r"""The route of one training batch through the repository: every function
the data passes through, from the loader to the optimizer's
apply_gradients, data construction included, found by following the data
as a run makes it rather than by reading the code.

  .venv/bin/python -m tests.batch_path --flagfile=flags/fashion_mnist_fast.cfg \
      --epochs=2 --steps_per_epoch=2 --model_dir=/tmp/route

runs engine.train in this process, one process, under a trace, and at the
first apply_gradients of the train step prints the route as JSON lines,
`{"file": ..., "function": ..., "graph": ...}` in the order the functions
were first entered, then exits. (Give the flags a finished run in a fresh
model_dir: a finished run takes no step. --mixed_precision=none: `auto`
would time steps of its own first, whose apply_gradients is not the
run's.)

A function of engine/, models/ or flags/ is on the route when, before
that apply_gradients:
* it runs inside the data set's loader (its construction), or
* an argument (other than `self`) is the data or holds it, or
* it reads the data its object holds (an attribute holding it, named in
  its code), or
* it returns the data, or a function it called returned the data to it
  (the route climbs through it).
The data: the loader's arrays, the `Splits` and its sources, a
tf.data.Dataset or its iterator (and what the iterator yields), a
symbolic tensor of a graph being traced from the route (the step's batch,
its loss, its gradients), and records or containers holding any of them.
Lambdas and comprehensions count as the function that wrote them, as do
the helper functions AutoGraph makes of a function's branches and loops;
a function AutoGraph converted counts as the function written. `graph`:
entered while a graph was traced (the tf.data pipeline's functions and the
step's), whose Python runs once; the rest is the host's hand-off of the
data.
"""
import dataclasses
import json
import os
import re
import runpy
import sys

import numpy as np
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOTS = tuple(os.path.join(REPO, d) + os.sep
               for d in ("engine", "models", "flags"))
# Code that counts as the function around it.
_INNER = re.compile(r"<(lambda|listcomp|dictcomp|setcomp|genexpr)>|"
                    r"(if|else|loop)_body(_\d+)?|loop_test(_\d+)?|"
                    r"[gs]et_state(_\d+)?")
_LOADER = ("engine/datasets/fashion_mnist.py", "load")


def function_of(frame):
  """(file, function) of a frame of the repository's code, or None; a
  function AutoGraph converted is named as written."""
  code = frame.f_code
  path = code.co_filename
  name = code.co_qualname
  if "__autograph_generated" in path:
    path = frame.f_globals.get("__file__") or ""
    name = name.split(".")[-1].removeprefix("tf__")
  if not path.startswith(_ROOTS):
    return None
  return os.path.relpath(path, REPO), name


class Route:
  """The functions the data has passed through so far, and what is data."""

  def __init__(self):
    self.functions = {}  # (file, function): entered while tracing a graph
    self._data = {}  # id: object, kept alive so that no id is reused
    self._holders = set()  # frames on the route
    self._in_loader = 0

  def is_data(self, value, depth: int = 0) -> bool:
    if id(value) in self._data or isinstance(value, (tf.data.Dataset,
                                                      tf.data.Iterator)):
      return True
    if depth >= 2 or value is None or _is_variable(value):
      return False
    return any(self.is_data(part, depth + 1) for part in _parts(value))

  def _qualifies(self, value) -> bool:
    from engine.datasets.splits import Source, Splits  # pylint: disable=import-outside-toplevel
    if _is_variable(value):
      return False
    return (isinstance(value, (Splits, Source))
            or _is_symbolic(value)
            or (isinstance(value, np.ndarray) and self._in_loader > 0)
            or self.is_data(value))

  def add(self, value, depth: int = 0) -> None:
    """`value` is data if it qualifies, and so are its parts that do."""
    if value is None or isinstance(value, (int, float, str, bool, bytes)):
      return
    if isinstance(value, (tuple, list, dict, set)) and not value:
      return  # () is one object everywhere
    if id(value) not in self._data and self._qualifies(value):
      self._data[id(value)] = value
    if depth < 3:
      for part in _parts(value):
        self.add(part, depth + 1)

  def enter(self, frame, name) -> None:
    if name == _LOADER:
      self._in_loader += 1
    code = frame.f_code
    count = (code.co_argcount + code.co_kwonlyargcount
             + bool(code.co_flags & 4) + bool(code.co_flags & 8))
    arguments = [frame.f_locals.get(n) for n in code.co_varnames[:count]
                 if n != "self"]
    # A graph's own tensors, handed to a function by what a function on
    # the route called (tf.data's map, tf.function), are the data too.
    called_by_route = self.holds(_repository_caller(frame))
    if (self._in_loader or any(self.is_data(a) for a in arguments)
        or any(called_by_route and _is_symbolic(a) for a in arguments)
        or self._reads_data_of_self(frame)):
      self._hold(frame, name)

  def leave(self, frame, name, value) -> None:
    held = frame in self._holders
    if held:
      self._holders.discard(frame)
      self.add(value)
      self._add_locals(frame)
    if held or self.is_data(value):
      self.add(value)
      self._mark(name)
      self._caller_holds(frame)
    if name == _LOADER:
      self._in_loader -= 1

  def yielded(self, frame, value) -> None:
    """What an iterator over the data yields is the data."""
    self.add(value)
    for tensor in tf.nest.flatten(value):
      if isinstance(tensor, tf.Tensor):
        self._data[id(tensor)] = tensor
    self._caller_holds(frame)

  def holds(self, frame) -> bool:
    return frame in self._holders

  def line(self, frame) -> None:
    if frame in self._holders:
      self._add_locals(frame)

  def _hold(self, frame, name) -> None:
    self._holders.add(frame)
    self._mark(name)
    frame.f_trace_lines = True

  def _mark(self, name) -> None:
    if not _INNER.fullmatch(name[1].split(".")[-1]):
      graph = self.functions.get(name, False)
      self.functions[name] = graph or tf.inside_function()

  def _caller_holds(self, frame) -> None:
    caller = _repository_caller(frame)
    if caller is not None and caller not in self._holders:
      self._hold(caller, function_of(caller))

  def _add_locals(self, frame) -> None:
    for key, value in list(frame.f_locals.items()):
      if key != "self":
        self.add(value)

  def _reads_data_of_self(self, frame) -> bool:
    code = frame.f_code
    if not code.co_argcount or code.co_varnames[0] != "self":
      return False
    attributes = getattr(frame.f_locals.get("self"), "__dict__", None)
    if not isinstance(attributes, dict):
      return False
    for key, value in list(attributes.items()):
      if key not in code.co_names:
        continue
      if dataclasses.is_dataclass(value):  # a record: the field it reads
        if any(field.name in code.co_names
               and self.is_data(getattr(value, field.name, None))
               for field in dataclasses.fields(value)):
          return True
      elif id(value) in self._data or isinstance(
          value, (tf.data.Dataset, tf.data.Iterator)):
        return True
    return False


def _repository_caller(frame):
  """The nearest frame of the repository's code below `frame`, or None."""
  caller = frame.f_back
  while caller is not None and function_of(caller) is None:
    caller = caller.f_back
  return caller


def _is_symbolic(value) -> bool:
  return (isinstance(value, tf.Tensor) and not _is_variable(value)
          and tf.inside_function())


def _is_variable(value) -> bool:
  return "Variable" in type(value).__name__


def _parts(value) -> list:
  if isinstance(value, (list, tuple)):
    return list(value[:50])
  if isinstance(value, dict):
    return list(value.values())[:50]
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return [getattr(value, field.name, None)
            for field in dataclasses.fields(value)]
  return []


def traced(route: Route, on_apply):
  """The trace function: follows the data, and calls `on_apply` at the
  first apply_gradients."""

  def iterator_trace(frame, event, arg):
    if event == "return":
      route.yielded(frame, arg)
    return iterator_trace

  def trace(frame, event, arg):
    del arg
    if event != "call":
      return None
    if frame.f_code.co_name == "apply_gradients":
      on_apply()
    name = function_of(frame)
    if name is None:
      if (frame.f_code.co_name in ("__iter__", "__next__", "get_next")
          and route.is_data(frame.f_locals.get("self"))):
        return iterator_trace
      return None
    route.enter(frame, name)
    frame.f_trace_lines = route.holds(frame)

    def local(frame, event, arg):
      if event == "line":
        route.line(frame)
      elif event == "return":
        route.leave(frame, name, arg)
      return local

    return local

  return trace


def main():
  route = Route()

  def on_apply():
    sys.settrace(None)
    for (path, function), graph in route.functions.items():
      print(json.dumps(dict(file=path, function=function, graph=graph)))
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access

  sys.argv = ["engine.train", *sys.argv[1:]]
  sys.settrace(traced(route, on_apply))
  runpy.run_module("engine.train", run_name="__main__")
  sys.settrace(None)
  sys.exit("the run took no step: give it a fresh --model_dir")


if __name__ == "__main__":
  main()
