"""examples/ runs as README shows it, on small generated data (the
keras.applications example: tests/test_keras_models.py, which shares its
run)."""
import json
import os

import pytest

from tests import fixtures

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
