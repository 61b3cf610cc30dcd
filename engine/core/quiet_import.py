"""TensorFlow's import without the start-up lines TF_CPP_MIN_LOG_LEVEL hides.

TensorFlow 2.21 logs through abseil as it loads, before abseil's logging is
initialized, and abseil then writes every line to standard error whatever
TF_CPP_MIN_LOG_LEVEL says: "WARNING: All log messages before
absl::InitializeLog() is called are written to STDERR", then the oneDNN
notice, twice. Without this, each process's one-line error would follow
four lines of notices.

`install()` puts a finder first on `sys.meta_path` that, for `tensorflow`
alone and once, hands back TensorFlow's own spec with its loader wrapped:
the module executes as it would, with file descriptor 2 captured; then the
captured lines of a severity the level hides are dropped and the rest is
written out, in order. The import stays where it was: a process that never
imports TensorFlow (`python -m engine.runs`) never pays for it.

TensorFlow's CUDA build on a host with no NVIDIA driver (a GPU venv's
smoke on a CPU node) logs an error the first time anything asks for its
devices, "failed call to cuInit", at any level: the import asks then,
that line dropped. No GPU is no error; the engine's start-up line says
where the run trains (engine/records/start_up.py).
"""
import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

# What a CUDA build logs without a driver to find GPUs with, and where a
# driver would be.
_NO_DRIVER = "failed call to cuInit"
_NVIDIA_DRIVER = "/proc/driver/nvidia"
# abseil's C++ log lines: severity, date, time, thread, file:line]. Before
# its initialization the date is 0000 and the time seconds since the epoch.
_ABSL_LINE = re.compile(r"([IWE])\d{4} [\d:.]+ +\d+ \S+:\d+\] ")
_ABSL_UNINITIALIZED = ("WARNING: All log messages before absl::InitializeLog()"
                       " is called are written to STDERR")


def install() -> None:
  """Until TensorFlow is imported, its import is quiet (if the level hides
  anything)."""
  if "tensorflow" not in sys.modules and _min_level() > 0:
    sys.meta_path.insert(0, _TensorFlowFinder())


def _min_level() -> int:
  try:
    return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
  except ValueError:
    return 0


def shown(line: str, min_level: int) -> bool:
  """Whether TF_CPP_MIN_LOG_LEVEL = `min_level` lets `line` through."""
  if line.rstrip("\n") == _ABSL_UNINITIALIZED:
    return min_level == 0
  severity = _ABSL_LINE.match(line)
  return not severity or "IWE".index(severity.group(1)) >= min_level


@contextlib.contextmanager
def _standard_error_filtered(min_level: int, dropped: str = ""):
  """File descriptor 2 captured while the block runs (C++ writes to it
  directly), then what `shown` lets through, but lines holding `dropped`
  (if given), written out."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as printed:
    os.dup2(printed.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      printed.seek(0)
      for line in printed.read().decode(errors="replace").splitlines(True):
        if shown(line, min_level) and not (dropped and dropped in line):
          sys.stderr.write(line)
      sys.stderr.flush()


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` as the other finders do, once, and wraps its
  loader."""

  def find_spec(self, name, path=None, target=None):
    del path, target
    if name != "tensorflow":
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.loader is not None:
      spec.loader = _QuietLoader(spec.loader)
    return spec


class _QuietLoader(importlib.abc.Loader):
  """TensorFlow's loader, executing its module with standard error
  filtered; anything else asked of it is its own."""

  def __init__(self, loader):
    self._loader = loader

  def __getattr__(self, name):
    return getattr(self._loader, name)

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    with _standard_error_filtered(_min_level()):
      self._loader.exec_module(module)
    if (module.test.is_built_with_cuda()
        and not os.path.exists(_NVIDIA_DRIVER)):
      with _standard_error_filtered(_min_level(), dropped=_NO_DRIVER):
        module.config.list_physical_devices("GPU")
