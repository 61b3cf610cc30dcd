"""--model and --dataset as a user's own `module:function`."""
import sys

import pytest
import keras
import tensorflow as tf

from engine import datasets
from engine.compute import precision
from engine.core import user_code
from engine.core.errors import UserError
import models
from tests import fixtures


@pytest.fixture
def module_dir(tmp_path):
  fixtures.write_user_code(str(tmp_path))
  return tmp_path


def write(directory, name, source):
  path = directory / name
  path.write_text(source)
  return str(path)


def build(spec, **params):
  return models.build(spec, input_shape=(8, 8, 1), num_classes=3,
                      **{"dropout": 0.2, "weight_decay": 1e-4, **params})


def test_a_model_from_a_file_gets_the_flags_it_declares(module_dir):
  model = build(f"{module_dir}/users_model.py:build")
  assert model.name == "users_model"
  assert len(model.losses) == 1  # its own loss
  assert [l.rate for l in model.layers
          if isinstance(l, keras.layers.Dropout)] == [0.2]


def test_a_model_from_a_module_on_the_path(module_dir, monkeypatch):
  monkeypatch.syspath_prepend(str(module_dir))
  model = build("users_model:build_subclassed")
  assert model.name == "users_subclassed"
  assert model.built


def test_a_file_is_imported_once(module_dir):
  spec = f"{module_dir}/users_model.py:build"
  assert user_code.load(spec, "model") is user_code.load(spec, "model")


def test_spec_of_names_a_function_so_that_load_finds_it_again():
  spec = user_code.spec_of(fixtures.write_user_code)
  assert spec == "tests.fixtures:write_user_code"
  assert user_code.load(spec, "model") is fixtures.write_user_code
  with pytest.raises(UserError, match="not a module-level function"):
    user_code.spec_of(lambda: None)


@pytest.mark.parametrize("source, spec, message", [
    ("import numpy_not_here\n", "m.py:build",
     "--model=DIR/m.py:build: cannot import DIR/m.py: "
     "ModuleNotFoundError: No module named 'numpy_not_here'"),
    ("x = 1\n", "m.py:build", "--model=DIR/m.py:build: DIR/m.py has no "
     "build"),
    ("build = 3\n", "m.py:build", "build is a int, not a function"),
    ("def build(input_shape, num_classes):\n  return 'a model'\n",
     "m.py:build", "returned a str, not a keras.Model"),
    ("import keras\n"
     "def build(input_shape, num_classes):\n"
     "  i = keras.Input(input_shape)\n"
     "  return keras.Model(i, keras.layers.Dense(5)(\n"
     "      keras.layers.Flatten()(i)))\n",
     "m.py:build", r"outputs shape \[2, 5\] for 2 images; it must output "
     r"\[batch, 3\] logits"),
    # A model of tf_keras (Keras 2), which the engine no longer installs:
    # a class of its modules stands for it.
    ("import keras\n"
     "class Sequential(keras.Sequential):\n"
     "  pass\n"
     "Sequential.__module__ = 'tf_keras.src.engine.sequential'\n"
     "def build(input_shape, num_classes):\n"
     "  return Sequential([keras.Input(input_shape),\n"
     "      keras.layers.Flatten(), keras.layers.Dense(num_classes)])\n",
     "m.py:build", r"--model=DIR/m.py:build built a Keras 2 model "
     r"\(Sequential, from tf_keras\); the engine trains Keras 3 models: "
     r"build it with `import keras`"),
    ("def build(shape):\n  pass\n", "m.py:build",
     r"build\(\) raised TypeError: build\(\) missing 1 required "
     "positional argument: 'shape'"),
    ("", "m.py:not an identifier", "give package.module:function"),
], ids=["import", "missing", "not_callable", "not_a_model", "shape",
        "keras2", "signature", "malformed"])
def test_a_bad_model_is_one_line_naming_it(tmp_path, source, spec, message):
  write(tmp_path, "m.py", source)
  spec = spec.replace("m.py", f"{tmp_path}/m.py")
  with pytest.raises(UserError, match=message.replace("DIR", str(tmp_path))):
    build(spec)
  sys.modules.pop("user_code.m", None)


def test_a_missing_file_is_named(tmp_path):
  with pytest.raises(UserError, match=f"{tmp_path}/none.py: no such file"):
    build(f"{tmp_path}/none.py:build")


def test_a_mixed_precision_model_ends_in_float32(tmp_path):
  """A functional model's output layer computes in float32 under a 16-bit
  policy, written with a dtype or not; a subclassed model whose outputs
  are 16-bit is refused, with what to write."""
  write(tmp_path, "half.py",
        "import keras\n"
        "def build(input_shape, num_classes):\n"
        "  i = keras.Input(input_shape)\n"
        "  x = keras.layers.Dense(8)(keras.layers.Flatten()(i))\n"
        "  return keras.Model(i, keras.layers.Dense(num_classes)(x))\n"
        "class Half(keras.Model):\n"
        "  def __init__(self, num_classes):\n"
        "    super().__init__()\n"
        "    self.dense = keras.layers.Dense(num_classes)\n"
        "  def call(self, x):\n"
        "    return self.dense(keras.ops.reshape(x, (-1, 64)))\n"
        "def subclassed(num_classes):\n"
        "  return Half(num_classes)\n")
  with precision.policy("bfloat16"):
    model = build(f"{tmp_path}/half.py:build")
    assert [layer.compute_dtype for layer in model.layers[-2:]] == [
        "bfloat16", "float32"]
    assert model(tf.zeros((2, 8, 8, 1))).dtype == tf.float32
    with pytest.raises(UserError, match="outputs bfloat16 logits; end the "
                       "model with a float32 layer"):
      build(f"{tmp_path}/half.py:subclassed")


def test_a_dataset_function_must_return_splits(tmp_path):
  write(tmp_path, "data.py", "def load(data_dir):\n  return [data_dir]\n")
  with pytest.raises(UserError, match="returned a list; a data set "
                     "function returns engine.datasets.Splits"):
    datasets.load(f"{tmp_path}/data.py:load", data_dir="x")
