"""examples/ runs as README shows it, on small generated data (the
keras.applications example: tests/test_keras_models.py, which shares its
run)."""
import json
import os
import subprocess

import pytest

from tests import fixtures
from tests import timeouts

EXAMPLES = os.path.join(fixtures.REPO, "examples")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      301, 51)


def epochs_of(model_dir):
  return [json.loads(line)["epoch"] for line in
          (model_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_script_with_its_own_model_and_data_then_evaluate(data_dir,
                                                            tmp_path):
  """The script's values are defaults; its command line wins (--epochs)."""
  model_dir = tmp_path / "run"
  result = fixtures.launch(
      [os.path.join(EXAMPLES, "train_script.py"), f"--data_dir={data_dir}",
       "--epochs=1", "--batch_size=16", f"--model_dir={model_dir}"],
      processes=2)
  assert result.returncode == 0, result.stderr[-3000:]
  assert epochs_of(model_dir) == [1]
  assert "threads per process, oneDNN kernels" in result.stderr
  recorded = (model_dir / "flags.txt").read_text().splitlines()
  assert f"--model={EXAMPLES}/train_script.py:conv_net" in recorded
  assert (f"--dataset={EXAMPLES}/train_script.py:load_fashion_mnist"
          in recorded)
  assert "--optimizer=adam" in recorded  # the script's own value
  # Not pinned to float32 (tests/fixtures.ENGINE_FLAGS): the default, auto,
  # chose, measured or not as the hardware has it, and recorded its choice.
  assert "--mixed_precision=auto" in recorded
  assert (model_dir / "precision.json").exists()
  evaluated = fixtures.launch(["-m", "engine.evaluate",
                               f"--model_dir={model_dir}"])
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert "(51 examples)" in evaluated.stdout
  assert "Ankle boot" in evaluated.stdout


def test_a_script_naming_a_flag_that_does_not_exist(tmp_path):
  script = tmp_path / "typo.py"
  script.write_text("from engine import train\n"
                    "train.run(epochz=3)\n")
  result = fixtures.launch([str(script)])
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(
      "engine.train: error: run(): ")
  assert "epochz" in result.stderr


def test_readmes_model_file_trains_as_written(data_dir, tmp_path):
  """README's quick start, its model file and its command, from the
  directory the file is in."""
  with open(os.path.join(fixtures.REPO, "README.md")) as f:
    readme = f.read()
  model_file = readme.split("```python\n# my_model.py\n", 1)[1]
  (tmp_path / "my_model.py").write_text(model_file.split("```", 1)[0])
  command = readme.split("--model=my_model.py:", 1)[1].split("\n")[0].split()
  assert command == ["small_cnn", "--dropout=0.2", "--model_dir=runs/mine"]
  result = subprocess.run(
      [fixtures.PYTHON, "-m", "engine.train", *fixtures.ENGINE_FLAGS,
       f"--model=my_model.py:{command[0]}", *command[1:],
       f"--data_dir={data_dir}", "--epochs=1", "--batch_size=32",
       "--progress=none"],
      cwd=tmp_path, env=fixtures.engine_env(), text=True, capture_output=True,
      timeout=timeouts.bound(300))
  assert result.returncode == 0, result.stderr[-3000:]
  model_dir = tmp_path / "runs" / "mine"
  assert epochs_of(model_dir) == [1]
  assert "--dropout=0.2" in (model_dir / "flags.txt").read_text().split()
  assert (model_dir / "export" / "final.keras").is_file()
