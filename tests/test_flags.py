"""The recipes parse, and the CPU recipe is what the flags' defaults say."""
import glob
import os

from absl import flags
import pytest

from engine import build
from engine import config as engine_config
from engine import datasets
from engine.errors import UserError
from tests import fixtures

FLAGS = flags.FLAGS
RECIPES = sorted(glob.glob(os.path.join(fixtures.REPO, "flags", "*.cfg")))


@pytest.fixture
def parsed():
  def parse(*args):
    FLAGS.unparse_flags()
    FLAGS(["engine.train", *args])
    return engine_config.config_from_flags()
  yield parse
  FLAGS.unparse_flags()


def test_there_are_recipes():
  names = [os.path.basename(r) for r in RECIPES]
  assert {"fashion_mnist_cpu.cfg", "fashion_mnist_wrn16_10.cfg"} <= set(names)


@pytest.mark.parametrize("recipe", RECIPES, ids=os.path.basename)
def test_recipe_parses_and_starts_with_its_command(recipe, parsed):
  config = parsed(f"--flagfile={recipe}")
  assert config.model_dir.startswith("runs/")
  with open(recipe) as f:
    header = f.read().split("\n--", 1)[0]
  assert "engine.train" in header or "make train" in header
  assert "Measured" in header or "measured" in header


def test_cpu_recipe_is_the_defaults(parsed):
  defaults = parsed()
  recipe = parsed(f"--flagfile={fixtures.REPO}/flags/fashion_mnist_cpu.cfg")
  assert recipe == engine_config.TrainConfig(**{
      **defaults.__dict__, "model_dir": "runs/fashion_mnist_cpu",
      "command_line": recipe.command_line})


def test_the_recorded_flags_are_a_flagfile_of_the_engines_flags(parsed):
  config = parsed("--epochs=3", "--model=wrn")
  lines = config.command_line.splitlines()
  assert "--epochs=3" in lines and "--model=wrn" in lines
  assert "--lr_decay_epochs=15,25,35" in lines
  assert not [l for l in lines if "verbosity" in l or "pdb" in l]
  assert parsed(*lines) == config


def test_flags_after_the_flagfile_override_it(parsed):
  config = parsed(f"--flagfile={fixtures.REPO}/flags/fashion_mnist_cpu.cfg",
                  "--epochs=2", "--model=wrn")
  assert (config.epochs, config.model) == (2, "wrn")


def test_a_users_model_and_data_name_the_default_model_dir(parsed):
  config = parsed("--model=examples/keras_applications.py:mobilenet_v2",
                  "--dataset=my_package.data:load")
  assert config.model_dir == "runs/load_mobilenet_v2"
  assert config.model == "examples/keras_applications.py:mobilenet_v2"


def test_every_loader_reads_one_spelling_of_size_classes_and_channels(
    parsed):
  config = parsed("--dataset=synthetic", "--image_size=16",
                  "--num_classes=5", "--channels=1", "--train_examples=8",
                  "--test_examples=4")
  assert not config.deprecations
  splits = datasets.load(config.dataset, data_dir="", **config.data_params)
  assert (splits.info.image_shape, splits.info.num_classes) == ((16, 16, 1),
                                                                 5)
  # 0, the default: each data set's own size, synthetic's small one.
  splits = datasets.load("synthetic", data_dir="", **parsed(
      "--dataset=synthetic", "--train_examples=8",
      "--test_examples=4").data_params)
  assert (splits.info.image_shape, splits.info.num_classes) == ((32, 32, 3),
                                                                 10)


def test_old_spellings_still_work_with_a_line_and_record_as_given(parsed):
  new = parsed("--dataset=synthetic", "--image_size=16", "--channels=1",
               "--num_classes=5")
  old = parsed("--dataset=synthetic", "--synthetic_image_shape=16,16,1",
               "--synthetic_classes=5")
  assert old.data_params == new.data_params
  assert [line.split()[0] for line in old.deprecations] == [
      "--synthetic_image_shape", "--synthetic_classes"]
  assert "use --num_classes" in old.deprecations[1]
  # Recorded as given, so a resume reads them again; not when not given.
  assert "--synthetic_classes=5" in old.command_line.splitlines()
  assert "synthetic_classes" not in new.command_line
  assert parsed(*old.command_line.splitlines()).data_params == \
      new.data_params
  with pytest.raises(UserError, match="synthetic images are square"):
    parsed("--dataset=synthetic", "--synthetic_image_shape=16,8,3")


def test_a_flags_txt_from_before_the_new_spellings_resumes_alike(parsed):
  # It holds every flag: the old synthetic ones and the old defaults of
  # the new ones, --num_classes=1000 among them.
  config = parsed("--dataset=synthetic", "--image_size=224",
                  "--num_classes=1000", "--synthetic_image_shape=28,28,1",
                  "--synthetic_classes=10", "--eval_shift_pixels=0")
  assert (config.data_params["image_size"], config.data_params["channels"],
          config.data_params["num_classes"]) == (28, 1, 10)
  tfrecord = parsed("--dataset=tfrecord", "--image_size=224",
                    "--num_classes=1000", "--synthetic_classes=10",
                    "--synthetic_image_shape=32,32,3", "--eval_shift_pixels=0")
  assert tfrecord.data_params["num_classes"] == 1000
  # The old spellings at their defaults, as every such flags.txt lists
  # them: nothing to warn of.
  assert not tfrecord.deprecations


def test_eval_shift_is_a_fraction_of_the_width_as_random_shift_is(parsed):
  assert build.eval_shift_pixels(parsed("--eval_shift=0.04"),
                                 (28, 28, 1)) == 1
  assert build.eval_shift_pixels(parsed("--eval_shift=0.1"),
                                 (32, 32, 3)) == 3
  old = parsed("--eval_shift_pixels=2")
  assert build.eval_shift_pixels(old, (28, 28, 1)) == 2
  assert old.deprecations[0].startswith("--eval_shift_pixels is deprecated")
  for fraction in ("0.01", "0.5"):
    with pytest.raises(UserError, match=f"--eval_shift={fraction}: "):
      build.eval_shift_pixels(parsed(f"--eval_shift={fraction}"),
                              (28, 28, 1))
  with pytest.raises(UserError, match="give one"):
    parsed("--eval_shift=0.1", "--eval_shift_pixels=2")


def test_a_scripts_old_spellings_count_as_given_and_its_command_line_wins(
    tmp_path):
  script = tmp_path / "old_names.py"
  script.write_text(
      "from engine import cli\n"
      "def show(config):\n"
      "  print(config.data_params['num_classes'],\n"
      "        config.data_params['image_size'], len(config.deprecations))\n"
      "cli.run(show, dataset='synthetic', synthetic_classes=5,\n"
      "        synthetic_image_shape='8,8,1')\n")
  result = fixtures.launch([str(script)])
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == ["5", "8", "2"]
  result = fixtures.launch([str(script), "--synthetic_classes=7"])
  assert result.stdout.split() == ["7", "8", "2"]
