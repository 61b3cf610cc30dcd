"""scripts/setup.sh's refusals: a Python that TensorFlow 2.21 does not
support, or a venv made with another, an unknown DEVICE, a venv of the
other device, GPU pins of another TensorFlow, are one line and exit 2,
before anything is created or installed; the GPU pins are the CPU ones
but for the GPU parts. What it builds: Horovod with our
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



def test_an_unknown_device_is_one_line(tmp_path):
  venv = tmp_path / "venv"
  ran = setup(DEVICE="tpu", VENV=str(venv))
  assert ran.returncode == 2
  assert ran.stderr.splitlines() == [
      "[setup] DEVICE=tpu is unknown: DEVICE=cpu (the default) or DEVICE=gpu"]
  assert not venv.exists()


@pytest.mark.parametrize("kind, installed, device, default", [
    ("cpu", "tensorflow_cpu-2.21.0.dist-info", "gpu", ".venv-gpu"),
    ("gpu", "nvidia/cuda_runtime", "cpu", ".venv")])
def test_a_venv_of_the_other_device_is_one_line_and_kept(
    tmp_path, kind, installed, device, default):
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  os.rename(interpreter(tmp_path, "3.12"), venv / "bin" / "python")
  (venv / "lib" / "python3.12" / "site-packages" / installed).mkdir(
      parents=True)
  ran = setup(DEVICE=device, VENV=str(venv))
  assert ran.returncode == 2
  assert ran.stderr.splitlines() == [
      f"[setup] {venv} is a {kind} venv (its TensorFlow's); DEVICE={device} "
      f"sets up a venv of its own: leave VENV unset for {default}, or pass "
      "another VENV="]
  assert sorted(os.listdir(venv)) == ["bin", "lib"]


def pins(path) -> dict:
  """A requirements file's pins, name to version."""
  with open(path) as f:
    lines = [line.strip() for line in f if line.strip()
             and not line.startswith("#")]
  return dict(line.split("==") for line in lines)


def test_the_gpu_pins_are_the_cpu_ones_but_for_the_gpu_parts():
  cpu_pins = pins(os.path.join(fixtures.REPO, "requirements.txt"))
  gpu_pins = pins(os.path.join(fixtures.REPO, "requirements-gpu.txt"))
  # TensorFlow's CUDA build of the CPU pin's release, and CUDA 12's
  # libraries; nothing else, so every other pin is the CPU set-up's.
  assert gpu_pins.pop("tensorflow[and-cuda]") == cpu_pins["tensorflow-cpu"]
  assert gpu_pins and all(name.startswith("nvidia-") and
                          name.endswith("-cu12") for name in gpu_pins)
  assert "nvidia-nccl-cu12" in gpu_pins


def test_gpu_pins_of_another_tensorflow_are_one_line(tmp_path):
  # (The next TensorFlow's pins, `make smoke-next-tensorflow`'s, are for
  # the CPU set-up.)
  next_pins = tmp_path / "requirements.txt"
  next_pins.write_text("tensorflow-cpu==2.22.0rc0\nkeras==3.15.1\n")
  venv = tmp_path / "venv"
  ran = setup(DEVICE="gpu", VENV=str(venv), REQUIREMENTS=str(next_pins),
              PYTHON=interpreter(tmp_path, "3.12"))
  assert ran.returncode == 2
  assert ran.stderr.splitlines() == [
      "[setup] requirements-gpu.txt pins TensorFlow 2.21.0, "
      f"{os.path.relpath(next_pins, fixtures.REPO)} 2.22.0rc0: pin the same "
      "release in both"]
  assert not venv.exists()
