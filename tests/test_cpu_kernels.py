"""The engine runs oneDNN's CPU kernels, and says when it cannot."""
import os
import subprocess
import sys

import pytest

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


def test_tensorflow_used_first_runs_eigen_and_is_told_why():
  kernels = kernels_of(DECIDED_BY_TENSORFLOW + KERNELS)
  if kernels.startswith("oneDNN|"):
    pytest.skip("TensorFlow turns oneDNN on by itself on this CPU "
                "(AVX512_VNNI, AVX512_BF16 or AMX)")
  assert kernels.startswith(
      "Eigen|TensorFlow was used before the engine was imported")
  assert "import engine first" in kernels


def test_the_users_own_choice_of_eigen_is_kept_without_advice():
  assert kernels_of(KERNELS, exported="0") == "Eigen|"
