"""scripts/setup.sh's refusals: a Python that TensorFlow 2.21 does not
support, or a venv made with another, are one line and exit 2, before
anything is created or installed. What it builds: Horovod with our
patch's hunks in effect. And what it never fails on: our CPU kernels
(scripts/build_kernels.sh), which without a compiler that builds them are
one line, and set-up goes on."""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from engine.core import cpu
from tests import fixtures
from tests import timeouts

SETUP = os.path.join(fixtures.REPO, "scripts", "setup.sh")
BUILD_KERNELS = os.path.join(fixtures.REPO, "scripts", "build_kernels.sh")


def interpreter(directory, version: str) -> str:
  """A stand-in for a Python of `version`: all setup.sh asks it first is
  its version."""
  path = directory / f"python{version}"
  path.write_text(f"#!/bin/sh\necho {version}\n")
  path.chmod(0o755)
  return str(path)


def setup(**env):
  return subprocess.run(["bash", SETUP], env=dict(os.environ, **env),
                        text=True, capture_output=True,
                        timeout=timeouts.bound(60))


@pytest.mark.parametrize("version", ["3.10", "3.14"])
def test_an_unsupported_python_is_one_line(tmp_path, version):
  venv = tmp_path / "venv"
  ran = setup(PYTHON=interpreter(tmp_path, version), VENV=str(venv))
  assert ran.returncode == 2
  assert ran.stderr.splitlines() == [
      f"[setup] Python {version} ({tmp_path}/python{version}) is not "
      "supported: TensorFlow 2.21 and NumPy 2.4 need 3.11, 3.12 or 3.13; "
      "pass one as PYTHON=python3.12"]
  assert not venv.exists()


def test_a_python_that_does_not_run_is_one_line(tmp_path):
  ran = setup(PYTHON=str(tmp_path / "nowhere"), VENV=str(tmp_path / "venv"))
  assert ran.returncode == 2
  assert ran.stderr.splitlines() == [
      f"[setup] PYTHON={tmp_path}/nowhere does not run here; name an "
      "interpreter of Python 3.11, 3.12 or 3.13 (PYTHON=python3.12)"]


def test_a_venv_of_another_python_is_one_line_and_kept(tmp_path):
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  os.rename(interpreter(tmp_path, "3.12"), venv / "bin" / "python")
  ran = setup(PYTHON=interpreter(tmp_path, "3.13"), VENV=str(venv))
  assert ran.returncode == 2
  assert ran.stderr.splitlines() == [
      f"[setup] {venv} has Python 3.12, not 3.13 ({tmp_path}/python3.13): "
      f"remove it (rm -rf {venv}) to rebuild it, or pass VENV=another/dir"]
  assert sorted(os.listdir(venv / "bin")) == ["python"]


# Gloo's float16 sum, as Horovod's library names it.
GLOO_FLOAT16_SUM = "_ZN4gloo3sumINS_7float16EEEvPvPKvS4_m"


def test_gloo_sums_float16_gradients_with_f16c():
  """Patch hunk 6: where the build compiles with AVX and F16C, Gloo's sum
  of float16 buffers (--gradient_compression=fp16) converts with F16C's
  instructions, not in software (BUILD.md, "Horovod's patch")."""
  if not {"avx", "f16c"} <= cpu.features():
    pytest.skip("the CPU has no AVX or F16C: the build compiles neither")
  if not shutil.which("objdump"):
    pytest.skip("no objdump (binutils) to read Horovod's library")
  # Found, not imported: reading the library needs no TensorFlow loaded.
  horovod, = importlib.util.find_spec("horovod").submodule_search_locations
  library, = glob.glob(os.path.join(horovod, "tensorflow", "mpi_lib*.so"))
  code = subprocess.run(
      ["objdump", "-d", "--no-show-raw-insn",
       f"--disassemble={GLOO_FLOAT16_SUM}", library],
      text=True, capture_output=True, check=True,
      timeout=timeouts.bound(60)).stdout
  assert GLOO_FLOAT16_SUM in code  # the sum is in the library
  assert "vcvtph2ps" in code  # ... and converts with F16C


def build_kernels(out, **env):
  return subprocess.run(["bash", BUILD_KERNELS, sys.executable, str(out)],
                        env=dict(os.environ, **env), text=True,
                        capture_output=True, timeout=timeouts.bound(120))


def failing_compiler(directory, version: str) -> str:
  """A stand-in for a C++ compiler that says its version and then
  compiles nothing, as GCC 11 fails on an option it does not know."""
  path = directory / "c++"
  path.write_text(f"""#!/bin/sh
[ "$1" = --version ] && {{ echo '{version}'; exit 0; }}
echo "c++: error: unrecognized command-line option '-mfancy'" >&2
exit 1
""")
  path.chmod(0o755)
  return str(path)


LOST = "CosmoFlow's 3x3x3 blocks will train at TensorFlow's speed"


@pytest.mark.parametrize("cxx", ["missing", "failing"])
def test_kernels_a_compiler_cannot_build_are_one_line_and_no_failure(
    tmp_path, cxx):
  out = tmp_path / "kernels"
  out.mkdir()
  # A build of before, for another TensorFlow: not left to load.
  (out / "winograd3d_avx2.so").write_bytes(b"stale")
  if cxx == "missing":
    env = dict(CXX=str(tmp_path / "no-such-compiler"))
    says = [f"[setup] no C++ compiler ({tmp_path}/no-such-compiler; set "
            f"CXX= to name one): no CPU kernels, {LOST}"]
  else:
    env = dict(CXX=failing_compiler(tmp_path, "g++-11 (Debian 11.3.0-12) "
                                    "11.3.0"))
    cannot = ("g++-11 (Debian 11.3.0-12) 11.3.0 could not compile the "
              "{} kernels (c++: error: unrecognized command-line option "
              "'-mfancy')")
    built = ("[setup] compiling models/kernels/winograd3d.cc for AVX2 and "
             "AVX-512 with g++-11 (Debian 11.3.0-12) 11.3.0 against "
             "TensorFlow ")
    says = [built, "[setup] " + "; ".join(
        [cannot.format("avx2"), cannot.format("avx512"),
         f"no CPU kernels: {LOST}"])]
  ran = build_kernels(out, **env)
  assert ran.returncode == 0
  lines = ran.stderr.splitlines()
  assert len(lines) == len(says)
  assert lines[0].startswith(says[0]) and lines[1:] == says[1:]
  assert not list(out.glob("*.so"))
  # Again with the same compiler: nothing is tried again, the same line.
  again = build_kernels(out, **env)
  assert again.returncode == 0 and again.stderr.splitlines() == says[-1:]

