"""The engine runs oneDNN's CPU kernels, and says when it cannot."""
import os
import subprocess
import sys

from engine.core import cpu
from tests import fixtures

KERNELS = ("from engine.core import cpu; "
           "print('|'.join(cpu.tensorflow_kernels()))")
# TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, the first time it asks
# whether oneDNN is on; this asks before the engine is imported.
DECIDED_BY_TENSORFLOW = ("from tensorflow.python.util import "
                         "_pywrap_util_port; "
                         "_pywrap_util_port.IsMklEnabled(); ")


def kernels_of(script: str, exported: str | None = None) -> str:
  """What `script` prints, with TF_ENABLE_ONEDNN_OPTS as the user exported
  it (None: not at all)."""
  env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
  if exported is not None:
    env["TF_ENABLE_ONEDNN_OPTS"] = exported
  result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, cwd=fixtures.REPO, check=True,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"})
  return result.stdout.strip()


def test_importing_the_engine_first_gives_onednn():
  assert cpu.tensorflow_kernels() == ("oneDNN", "")  # conftest's import


# Where TensorFlow turns oneDNN on by itself (its port.cc): these CPUs,
# the AVX512_BF16 hosts measured on among them.
ONEDNN_BY_DEFAULT = {"avx512_vnni", "avx512_bf16", "amx_tile"}


def test_tensorflow_used_first_keeps_its_own_default_and_is_told_why():
  kernels = kernels_of(DECIDED_BY_TENSORFLOW + KERNELS)
  if cpu.features() & ONEDNN_BY_DEFAULT:
    assert kernels == "oneDNN|"  # nothing lost, nothing to tell
  else:  # AVX2 only: Eigen's, 2.5x slower
    assert kernels.startswith(
        "Eigen|TensorFlow was used before the engine was imported")
    assert "import engine first" in kernels


def test_eigen_not_chosen_by_the_user_is_told_why_on_every_cpu():
  """TensorFlow decided on Eigen's kernels before the engine was imported,
  and the user's TF_ENABLE_ONEDNN_OPTS=0 is gone by then: the advice."""
  decided_on_eigen = (
      "import os; os.environ['TF_ENABLE_ONEDNN_OPTS'] = '0'; "
      f"{DECIDED_BY_TENSORFLOW} del os.environ['TF_ENABLE_ONEDNN_OPTS']; ")
  assert kernels_of(decided_on_eigen + KERNELS) == (
      "Eigen|TensorFlow was used before the engine was imported, too late "
      "for oneDNN's kernels: import engine first, or export "
      "TF_ENABLE_ONEDNN_OPTS=1")


def test_the_users_own_choice_of_eigen_is_kept_without_advice():
  assert kernels_of(KERNELS, exported="0") == "Eigen|"
