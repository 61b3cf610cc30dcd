"""The recipes parse, and the CPU recipe is what the flags' defaults say;
the TrainConfig they become (flags.config_from_flags, engine.core.config)."""
import ast
import dataclasses
import glob
import os

from absl import flags
import pytest

from engine import build
from engine import datasets
from engine.core.errors import UserError
from tests import fixtures
import flags as engine_flags
from flags import reached

FLAGS = flags.FLAGS
RECIPES = sorted(glob.glob(os.path.join(fixtures.REPO, "flags", "*.cfg")))


@pytest.fixture
def parsed():
  def parse(*args):
    FLAGS.unparse_flags()
    FLAGS(["engine.train", *args])
    return engine_flags.config_from_flags()
  yield parse
  FLAGS.unparse_flags()


def test_there_are_recipes():
  names = [os.path.basename(r) for r in RECIPES]
  assert {"fashion_mnist_cpu.cfg", "fashion_mnist_wrn16_10.cfg"} <= set(names)


@pytest.mark.parametrize("recipe", RECIPES, ids=os.path.basename)
def test_recipe_parses_and_starts_with_its_command(recipe, parsed):
  config = parsed(f"--flagfile={recipe}")
  assert config.training.model_dir.startswith("runs/")
  with open(recipe) as f:
    header = f.read().split("\n--", 1)[0]
  assert "engine.train" in header or "make train" in header
  assert "Measured" in header or "measured" in header


def test_cpu_recipe_is_the_defaults(parsed):
  defaults = parsed()
  recipe = parsed(f"--flagfile={fixtures.REPO}/flags/fashion_mnist_cpu.cfg")
  assert recipe == defaults.replace(
      training=dict(model_dir="runs/fashion_mnist_cpu"),
      command_line=recipe.command_line)


def test_the_recorded_flags_are_a_flagfile_of_the_engines_flags(parsed):
  config = parsed("--epochs=3", "--model=wrn")
  lines = config.command_line.splitlines()
  assert "--epochs=3" in lines and "--model=wrn" in lines
  assert "--lr_decay_epochs=15,25,35" in lines
  assert not [l for l in lines if "verbosity" in l or "pdb" in l]
  assert parsed(*lines) == config


@pytest.mark.parametrize("recipe", RECIPES, ids=os.path.basename)
def test_every_flag_a_recipe_sets_reaches_a_builder(recipe, parsed):
  reached.refuse_unreached_flags(parsed(f"--flagfile={recipe}"))


def test_a_flag_at_its_default_is_not_refused_one_set_is(parsed):
  """--depth reaches wrn alone: at its default, or restated (as flags.txt
  restates every flag), it asks cnn for nothing; set, it is refused."""
  reached.refuse_unreached_flags(parsed("--model=cnn"))
  reached.refuse_unreached_flags(parsed("--model=cnn", "--depth=16"))
  recorded = parsed("--model=cnn", "--filters=8").command_line
  reached.refuse_unreached_flags(parsed(*recorded.splitlines()))
  with pytest.raises(UserError, match="^--depth=28 reaches nothing: "
                     "--model=cnn takes no depth"):
    reached.refuse_unreached_flags(parsed("--model=cnn", "--depth=28"))


def test_flags_the_engine_reads_itself_always_reach_something(parsed):
  """--seed seeds the run and --weight_decay reaches the optimizer, whatever
  the task's and model's signatures."""
  reached.refuse_unreached_flags(parsed("--task=segmentation", "--seed=3",
                                      "--model=resnet9",
                                      "--weight_decay=0.001"))


def test_flags_after_the_flagfile_override_it(parsed):
  config = parsed(f"--flagfile={fixtures.REPO}/flags/fashion_mnist_cpu.cfg",
                  "--epochs=2", "--model=wrn")
  assert (config.training.epochs, config.model.name) == (2, "wrn")


def test_a_users_model_and_data_name_the_default_model_dir(parsed):
  config = parsed("--model=examples/keras_applications.py:mobilenet_v2",
                  "--dataset=my_package.data:load")
  assert config.training.model_dir == "runs/load_mobilenet_v2"
  assert config.model.name == "examples/keras_applications.py:mobilenet_v2"


def test_every_loader_reads_one_spelling_of_size_classes_and_channels(
    parsed):
  config = parsed("--dataset=synthetic", "--image_size=16",
                  "--num_classes=5", "--channels=1", "--train_examples=8",
                  "--test_examples=4")
  splits = datasets.load(config.data.name, data_dir="", **config.data.params)
  assert (splits.info.image_shape, splits.info.num_classes) == ((16, 16, 1),
                                                                 5)
  # 0, the default: each data set's own size, synthetic's small one.
  splits = datasets.load("synthetic", data_dir="", **parsed(
      "--dataset=synthetic", "--train_examples=8",
      "--test_examples=4").data.params)
  assert (splits.info.image_shape, splits.info.num_classes) == ((32, 32, 3),
                                                                 10)


def test_a_profile_under_op_determinism_is_refused_in_one_line(parsed):
  """Its clocks, tf.timestamp, are refused under op determinism."""
  assert parsed("--profile_steps=3,5").profiling.profile_steps == (3, 5)
  with pytest.raises(UserError, match="^--profile_steps with "
                     "--deterministic: TensorFlow refuses"):
    parsed("--profile_steps=3,5", "--deterministic")


def test_eval_shift_is_a_fraction_of_the_width_as_random_shift_is(parsed):
  assert build.eval_shift_pixels(parsed("--eval_shift=0.04"),
                                 (28, 28, 1)) == 1
  assert build.eval_shift_pixels(parsed("--eval_shift=0.1"),
                                 (32, 32, 3)) == 3
  for fraction in ("0.01", "0.5"):
    with pytest.raises(UserError, match=f"--eval_shift={fraction}: "):
      build.eval_shift_pixels(parsed(f"--eval_shift={fraction}"),
                              (28, 28, 1))


def test_importing_the_config_imports_no_tensorflow():
  assert fixtures.packages_imported_by(
      "engine.core.config", {"tensorflow", "horovod", "numpy"}) == []


def test_the_config_and_its_sections_are_frozen(parsed):
  config = parsed()
  sections = [getattr(config, field.name)
              for field in dataclasses.fields(config)
              if dataclasses.is_dataclass(getattr(config, field.name))]
  assert len(sections) == 12
  for section in [config, *sections]:
    name = dataclasses.fields(section)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
      setattr(section, name, None)


def test_replace_changes_fields_by_section_and_refuses_unknown_ones(parsed):
  config = parsed()
  changed = config.replace(training=dict(epochs=3), command_line="x")
  assert (changed.training.epochs, changed.command_line) == (3, "x")
  assert changed.training.batch_size == config.training.batch_size
  assert changed.data == config.data and config.training.epochs != 3
  with pytest.raises(TypeError, match="epochs"):
    config.replace(data=dict(epochs=3))


def test_every_enum_flag_takes_any_case_of_its_choices():
  # TensorFlow spells compressions "GZIP"; a flag of the engine's keeps its
  # own spelling whatever the case it was given in.
  enums = [flag for module, defined in FLAGS.flags_by_module_dict().items()
           if module.split(".")[0] == "flags" for flag in defined
           if isinstance(flag, flags.EnumFlag)]
  assert len(enums) >= 15
  assert [flag.name for flag in enums if flag.parser.case_sensitive] == []


@pytest.mark.parametrize("given", ["GZIP", "Gzip", "gzip"])
def test_an_enum_flag_given_in_another_case_is_its_own_spelling(given,
                                                                 parsed):
  config = parsed(f"--tfrecord_compression={given}",
                  "--mixed_precision=BFloat16")
  assert config.data.params["tfrecord_compression"] == "gzip"
  assert config.performance.mixed_precision == "bfloat16"
  assert "--tfrecord_compression=gzip" in config.command_line.splitlines()


def test_a_wrong_enum_value_is_one_line_naming_the_choices(parsed):
  with pytest.raises(flags.IllegalFlagValueError) as raised:
    parsed("--tfrecord_compression=xz")
  assert str(raised.value) == ("flag --tfrecord_compression=xz: value should "
                               "be one of <auto|none|gzip|zlib>")


def test_the_commands_enum_flags_take_any_case_too():
  # engine.sweep's and the tools' own flags, defined where they run.
  calls = []
  for directory in ("engine", "flags"):
    for path in glob.glob(os.path.join(fixtures.REPO, directory, "**", "*.py"),
                          recursive=True):
      with open(path) as f:
        calls += [(path, node) for node in ast.walk(ast.parse(f.read()))
                  if isinstance(node, ast.Call)
                  and getattr(node.func, "attr", "") == "DEFINE_enum"]
  assert len(calls) >= 19
  assert [os.path.relpath(path, fixtures.REPO) for path, call in calls
          if not any(k.arg == "case_sensitive" and k.value.value is False
                     for k in call.keywords)] == []
