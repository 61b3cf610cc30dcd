"""Timeouts as bounds on a hang: a test's nominal seconds, stretched here.

A test gives, in seconds, how long what it waits for may take on the
reference machine, quiet, with room to spare; `bound(seconds)` is how long
it then waits. A timeout says "this hung", never "this was slow": a slower
CPU or a busy machine (a fresh clone's `make test` beside other work on two
cores) must make the suite slower, not red. So the nominal seconds are
multiplied by two factors, each at least 1:

  slowness  this machine's CPU time for a fixed workload over the
            reference machine's (REFERENCE_SECONDS): how much slower a
            core is here, whatever else runs, since CPU time does not count
            the waits for a core;
  busyness  the load average over the number of cores: how many processes
            share each core, which is those waits.

`ENGINE_TEST_TIMEOUT_SCALE=F` replaces their product by F (at least 1),
for machines known to be slower than they measure (a CPU quota, a
hypervisor's steal): BUILD.md, "Testing".

A launched run's output is not taken as progress that earns it more time:
a hung Horovod job writes too (its stall check warns every 60 s).
"""
import functools
import math
import os
import time

SCALE_VARIABLE = "ENGINE_TEST_TIMEOUT_SCALE"
# calibration_seconds() on a 2-core AMD EPYC with AVX512_BF16 (CPU family
# 26), a kind BUILD.md's `make test` timings were taken on; Python 3.11.7,
# quiet: 0.105-0.114 s in nine runs.
REFERENCE_SECONDS = 0.11
_ITERATIONS = 3_000_000


def bound(nominal: float) -> float:
  """The seconds to wait for what takes at most `nominal` seconds on the
  reference machine, quiet: at least `nominal`, more on a slower or busier
  machine."""
  return nominal * scale()


def scale() -> float:
  """The factor `bound` applies now: ENGINE_TEST_TIMEOUT_SCALE, or
  slowness times busyness (the module's docstring).

  The load is read at each call, not once: it changes over a suite of
  minutes, and a pytest worker starts before the suite's own processes
  have raised it. The busier of the last minute and the last five, since a
  run outlasts a lull between tests.
  """
  override = os.environ.get(SCALE_VARIABLE)
  if override is not None:
    return _overridden(override)
  slowness = calibration_seconds() / REFERENCE_SECONDS
  load = max(os.getloadavg()[:2])
  busyness = load / (os.cpu_count() or 1)
  return max(1.0, slowness) * max(1.0, busyness)


def _overridden(value: str) -> float:
  try:
    factor = float(value)
  except ValueError:
    factor = None
  if factor is None or not 1 <= factor < math.inf:  # NaN too
    raise ValueError(
        f"{SCALE_VARIABLE}={value!r}: expected a number of at least 1, the "
        "factor by which tests' timeouts are stretched on a slow machine; "
        "unset it to have the machine measured")
  return factor


@functools.cache
def calibration_seconds() -> float:
  """This thread's CPU seconds for a fixed pure-Python loop, the best of
  three (about 0.35 s on the reference machine); measured once a process.

  CPU time of this thread only: a busy machine delays the loop but does not
  lengthen it, so the load is counted once, by busyness.
  """
  def once() -> float:
    start = time.thread_time()
    total = 0
    for i in range(_ITERATIONS):
      total += i * i % 7
    return time.thread_time() - start
  return min(once() for _ in range(3))
