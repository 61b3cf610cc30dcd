"""(launcher) `python -m bench.host_core MODULE [ARGS...]`: MODULE run as
`python -m MODULE ARGS...`, pinned first to its simulated host's own core.

On tests/simulated_hosts.py's hosts, named `host<i>`, host i's process is
pinned to core i (modulo the cores it may use), as `taskset -c i` would,
before anything starts a thread, so that every thread TensorFlow and
Horovod start later stays on that core. Elsewhere nothing is pinned.
Used by bench/allreduce_worker.py, and by bench/step_split.py around
engine.train (whose own core binding refines an affinity, never widens
it).
"""
import os
import re
import runpy
import socket
import sys


def pin() -> list[int]:
  """This process (and every thread it starts later) on its host's core;
  the cores it may use after."""
  match = re.fullmatch(r"host(\d+)", socket.gethostname())
  if match:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(match.group(1)) % len(cores)]})
  return sorted(os.sched_getaffinity(0))


if __name__ == "__main__":
  pin()
  module, *args = sys.argv[1:]
  sys.argv = [module, *args]
  runpy.run_module(module, run_name="__main__", alter_sys=True)
