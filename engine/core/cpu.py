"""The CPU this process runs on, as the kernels that depend on it ask:
its feature flags, as Linux lists them (/proc/cpuinfo). Read from the CPU
running the process, never recorded from the one that built or set up
the venv: one venv serves nodes of several kinds."""
import functools
import platform


@functools.cache
def model_name() -> str:
  """The CPU's model name ("AMD EPYC 9R14 96-Core Processor"), or its
  architecture where Linux names none."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.machine()


@functools.cache
def features() -> frozenset:
  """The CPU's feature flags ("avx2", "avx512f", "avx512_bf16", ...);
  none where /proc/cpuinfo is not there to read."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return frozenset(line.split(":", 1)[1].split())
  except OSError:
    pass
  return frozenset()
