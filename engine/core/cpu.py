"""The CPU this process runs on, as the kernels that depend on it ask:
its feature flags, as Linux lists them (/proc/cpuinfo), and whose kernels
TensorFlow runs on it (oneDNN's or Eigen's); its cores, and a process's
share of them for TensorFlow's thread pools. Read from the CPU
running the process, never recorded from the one that built or set up
the venv: one venv serves nodes of several kinds."""
import functools
import os
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


def tensorflow_kernels() -> tuple[str, str]:
  """(which CPU kernels TensorFlow runs, advice if they are not oneDNN's).

  engine/__init__.py asks for oneDNN's, but TensorFlow reads the request
  once, the first time it needs it: a script that used TensorFlow before
  importing the engine may run Eigen's, 2.5x slower on AVX2 CPUs (BUILD.md,
  "CPU kernels").
  """
  # (compat imports TensorFlow, which nothing else in engine/core does.)
  from engine.core import compat  # pylint: disable=import-outside-toplevel
  if compat.onednn_enabled():
    return "oneDNN", ""
  if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0":
    return "Eigen", ""  # the user's choice
  return "Eigen", ("TensorFlow was used before the engine was imported, too "
                   "late for oneDNN's kernels: import engine first, or "
                   "export TF_ENABLE_ONEDNN_OPTS=1")


def available_cores() -> int:
  """Cores this process may run on (respects taskset, cgroups via affinity)."""
  return len(os.sched_getaffinity(0))


def cpu_threads(cores: int, processes_on_host: int) -> tuple[int, int]:
  """Thread pools for one of `processes_on_host` processes sharing `cores`.

  TensorFlow sizes both pools to every core by default, so N processes on one
  host run N times as many busy threads as cores and lose time to context
  switches. Each process gets an equal share of the cores for its kernels
  (oneDNN runs in the intra-op pool), and as many inter-op threads, so that
  independent ops (a block's branches, a layer's two gradients) run side by
  side on the share: on one core that is one thread; on two, MobileNetV2
  trained 1.30x faster in the one round interleaved with one thread, and
  the ResNets measured 0.99-1.05x. BUILD.md gives the measurements behind
  this choice.
  """
  share = max(1, cores // processes_on_host)
  return share, share
