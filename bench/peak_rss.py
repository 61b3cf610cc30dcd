r"""Runs engine.train in this process and records its peak memory at exit.

  horovodrun --gloo -np 2 .venv/bin/python -m bench.peak_rss PREFIX [engine flags]

writes PREFIX.rank<r>: this rank's peak resident set size in KB
(getrusage's ru_maxrss), however the run ends.
"""
import atexit
import os
import resource
import runpy
import sys


def _record(prefix: str) -> None:
  rank = os.environ.get("HOROVOD_RANK", "0")
  with open(f"{prefix}.rank{rank}", "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


if __name__ == "__main__":
  atexit.register(_record, sys.argv[1])
  sys.argv = ["engine.train", *sys.argv[2:]]
  runpy.run_module("engine.train", run_name="__main__")
