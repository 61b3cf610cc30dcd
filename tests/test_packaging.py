"""pyproject.toml: the engine as a package for an environment of a user's
own. Its pins are requirements.txt's, and its wheel holds what the engine
needs to run without the checkout: engine, models, flags and the recipes."""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

from tests import fixtures
from tests import timeouts


def _requirements() -> list[str]:
  with open(os.path.join(fixtures.REPO, "requirements.txt")) as f:
    return [line.strip() for line in f
            if line.strip() and not line.startswith("#")]


def _project() -> dict:
  with open(os.path.join(fixtures.REPO, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]


def test_the_package_pins_requirements_txts_releases():
  project = _project()
  pinned = [*project["dependencies"],
            *(pin for extra in project["optional-dependencies"].values()
              for pin in extra if pin not in project["dependencies"])]
  # setuptools and wheel are both a build extra and the build's own.
  assert sorted(set(pinned)) == sorted(_requirements())
  assert len(pinned) == len(set(pinned)), pinned


def test_the_wheel_runs_the_engine_without_the_checkout(tmp_path):
  source = tmp_path / "source"
  for name in ("engine", "models", "flags"):
    shutil.copytree(os.path.join(fixtures.REPO, name), source / name,
                    ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(os.path.join(fixtures.REPO, name), source)
  built = subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "--no-deps",
       "--no-build-isolation", "--quiet", str(source), "-w",
       str(tmp_path / "wheel")], capture_output=True, text=True,
      timeout=timeouts.bound(120))
  assert built.returncode == 0, built.stderr[-3000:]
  site = tmp_path / "site"
  with zipfile.ZipFile(glob.glob(str(tmp_path / "wheel" / "*.whl"))[0]) as w:
    assert not [n for n in w.namelist() if n.startswith("tests/")]
    w.extractall(site)
  # No site processing (-S): the venv's .pth, which puts the checkout on
  # the path, is not read; its packages are given by name.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
      [str(site), sysconfig.get_paths()["purelib"]]))
  where = subprocess.run(
      [sys.executable, "-S", "-c", "import engine, flags, models; "
       "print(engine.__file__, flags.__file__, models.__file__)"],
      env=env, cwd=tmp_path, capture_output=True, text=True,
      timeout=timeouts.bound(120))
  assert where.returncode == 0, where.stderr[-3000:]
  assert where.stdout.split() == [
      str(site / "engine" / "__init__.py"),
      str(site / "flags" / "__init__.py"),
      str(site / "models" / "__init__.py")]
  assert (site / "flags" / "fashion_mnist_fast.cfg").is_file()
  # absl's help exits 1, after the flags of every module of the wheel's.
  helped = subprocess.run(
      [sys.executable, "-S", "-m", "engine.train", "--helpfull"], env=env,
      cwd=tmp_path, capture_output=True, text=True,
      timeout=timeouts.bound(120))
  assert (helped.returncode, helped.stderr) == (1, ""), helped.stderr[-3000:]
  assert helped.stdout.startswith("Data-parallel training with Horovod")
  for module in ("flags.data", "flags.training", "flags.checkpoints"):
    assert f"\n{module}:\n" in helped.stdout


def test_an_environment_without_horovod_is_told_how_to_build_it():
  """pip installs the engine without Horovod, which setup builds with our
  patch: importing the engine's command says so on its last line. (An
  environment without horovod: its import made to fail.)"""
  result = subprocess.run(
      [sys.executable, "-c", "import sys; sys.modules['horovod'] = None; "
       "import engine.train"], cwd=fixtures.REPO, capture_output=True,
      text=True, timeout=timeouts.bound(120), env=fixtures.engine_env())
  assert result.returncode == 1
  assert result.stderr.splitlines()[-1] == (
      "ModuleNotFoundError: Horovod is not installed in this environment: "
      "it is built against its TensorFlow with the engine's patch; run "
      "VENV=<this venv> bash scripts/setup.sh from the engine's checkout "
      "(BUILD.md, \"Horovod\")")
