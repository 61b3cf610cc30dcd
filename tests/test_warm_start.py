import os

import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import distributed
from engine.compute import step as steps
from engine.core.errors import UserError
from engine.records import checkpoint
from engine.records import warm_start
from tests import fixtures


@pytest.fixture(scope="module", autouse=True)
def horovod():
  distributed.start_horovod()  # one process: allreduce is the identity


def net(seed, hidden=3, frozen=False):
  """A tiny model with a convolution and a batch normalization in front,
  frozen if `frozen` (a pretrained backbone's)."""
  keras.utils.set_random_seed(seed)
  images = keras.Input((6, 6, 1))
  convolution = keras.layers.Conv2D(2, 3, name="backbone_conv")
  normalization = keras.layers.BatchNormalization(name="backbone_bn")
  x = normalization(convolution(images))
  x = keras.layers.Dense(hidden, name="hidden")(keras.layers.Flatten()(x))
  model = keras.Model(images, keras.layers.Dense(4, name="head")(x))
  convolution.trainable = normalization.trainable = not frozen
  return model


def batch(size=8, seed=0):
  rng = np.random.default_rng(seed)
  return (tf.constant(rng.normal(3.0, 2.0, (size, 6, 6, 1)), tf.float32),
          tf.constant(rng.integers(0, 4, size), tf.int64))


def trained(model):
  """`model` after two steps of the engine's, its statistics moved too."""
  step = steps.TrainStep(model=model,
                         optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
  for seed in range(2):
    fixtures.one_step(step, *batch(seed=seed))
  return step


def values(model):
  return [v.numpy() for v in model.variables]


def assert_same(loaded, source):
  assert len(loaded.variables) == len(source.variables)
  for got, want in zip(values(loaded), values(source)):
    np.testing.assert_array_equal(got, want)


def keras_file(model, directory):
  path = os.path.join(directory, "model.keras")
  model.save(path)
  return path


def exported_keras_file(model, directory):
  """Written as engine/records/export.py writes it: the model behind a
  normalization of Keras' own layers."""
  images = keras.Input((6, 6, 1), dtype="uint8", name="images")
  normalized = keras.layers.Normalization(mean=3.0, variance=4.0)(
      keras.ops.cast(images, "float32"))
  normalization = keras.Model(images, normalized, name="normalization")
  path = os.path.join(directory, "export.keras")
  keras.Model(normalization.input, model(normalization.output),
              name=model.name).save(path)
  return path


def weights_file(model, directory):
  path = os.path.join(directory, "model.weights.h5")
  model.save_weights(path)
  return path


def checkpoint_dir(model, directory):
  """A model_dir holding an engine checkpoint of the model."""
  saved = checkpoint.Checkpoints(
      directory, model=model, optimizer=keras.optimizers.SGD(0.1), keep=1,
      identity="tiny")
  saved.save(checkpoint.Position(0, 2, 8, 1), 2)
  return directory


KINDS = {"a .keras file": keras_file,
         "exported": exported_keras_file,
         "a .weights.h5 file": weights_file,
         "checkpoint": checkpoint_dir}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_file_loads_the_weights_it_holds(kind, tmp_path):
  source = net(1)
  trained(source)  # BatchNormalization's statistics away from 0 and 1
  path = KINDS[kind](source, str(tmp_path))
  model = net(2)
  assert not np.array_equal(values(model)[0], values(source)[0])
  line = warm_start.warm_start(model, path)
  assert_same(model, source)
  assert line.startswith(f"warm start: {len(model.variables)} weights from "
                         f"{path} (")
  assert ("a .keras file" if kind == "exported" else kind) in line


def test_a_compiled_models_keras_file_loads_without_its_optimizer(tmp_path):
  source = net(1)
  source.compile(optimizer="adam",
                 loss=keras.losses.SparseCategoricalCrossentropy(True))
  source.fit(*batch(), verbose=0)  # the file holds Adam's slots too
  model = net(2)
  warm_start.warm_start(model, keras_file(source, str(tmp_path)))
  assert_same(model, source)


def test_a_checkpoint_is_found_from_its_directory_and_prefix(tmp_path):
  source = net(1)
  model_dir = checkpoint_dir(source, str(tmp_path))
  directory = os.path.join(model_dir, "checkpoints")
  for path in (directory, os.path.join(directory, "ckpt-2")):
    model = net(2)
    assert f"checkpoint {os.path.join(directory, 'ckpt-2')}" in \
        warm_start.warm_start(model, path)
    assert_same(model, source)


@pytest.mark.parametrize("kind", KINDS)
def test_another_models_file_names_the_first_variable_that_differs(
    kind, tmp_path):
  path = KINDS[kind](net(1, hidden=5), str(tmp_path))
  model = net(2)
  before = values(model)
  with pytest.raises(UserError) as raised:
    warm_start.warm_start(model, path)
  message = str(raised.value)
  assert message == (f"--init_from={path} holds another model: hidden/kernel "
                     "of shape (32, 3) is of shape (32, 5) there; give "
                     "weights of this model")
  for got, want in zip(values(model), before):  # nothing half-loaded
    np.testing.assert_array_equal(got, want)


def test_a_smaller_model_than_the_files_is_refused_by_count(tmp_path):
  images = keras.Input((6, 6, 1))
  smaller = keras.Model(images, keras.layers.Conv2D(2, 3)(images))
  path = checkpoint_dir(net(1), str(tmp_path))
  with pytest.raises(UserError, match=r"holds another model: it holds 10 "
                     "weights, this model 2;"):
    warm_start.warm_start(smaller, path)


def test_a_path_of_no_weights_is_one_line_naming_the_flag(tmp_path):
  missing = str(tmp_path / "nowhere.keras")
  with pytest.raises(UserError, match=r"^--init_from=.*nowhere.keras does "
                     "not exist; give a .keras file"):
    warm_start.warm_start(net(1), missing)
  other = tmp_path / "notes.txt"
  other.write_text("not weights")
  with pytest.raises(UserError, match=r"notes.txt is none of a .keras file"):
    warm_start.warm_start(net(1), str(other))
  damaged = tmp_path / "broken.weights.h5"
  damaged.write_text("not hdf5")
  with pytest.raises(UserError, match=r"broken.weights.h5: unreadable"):
    warm_start.warm_start(net(1), str(damaged))


def test_a_run_that_resumes_ignores_init_from_and_says_so(tmp_path):
  path = weights_file(net(1), str(tmp_path))
  model = net(2)
  before = values(model)
  assert warm_start.start_from(model, "", resuming=False) is None
  assert warm_start.start_from(model, path, resuming=True) == (
      f"--init_from={path} ignored: resuming from the checkpoint in "
      "model_dir")
  for got, want in zip(values(model), before):
    np.testing.assert_array_equal(got, want)
  assert warm_start.start_from(model, path, resuming=False).startswith(
      "warm start: 10 weights")


def test_a_frozen_backbone_stays_as_loaded_while_the_rest_trains(tmp_path):
  source = net(1)
  trained(source)
  model = net(2, frozen=True)
  warm_start.warm_start(model, weights_file(source, str(tmp_path)))
  backbone = [model.get_layer("backbone_conv"), model.get_layer("backbone_bn")]
  frozen = [v for layer in backbone for v in layer.variables]
  loaded = [v.numpy() for v in frozen]
  head = [v.numpy() for v in model.get_layer("head").variables]
  step = trained(model)
  for got, want in zip(frozen, loaded):  # BatchNorm's statistics too
    np.testing.assert_array_equal(got.numpy(), want)
  for got, want in zip(model.get_layer("head").variables, head):
    assert not np.array_equal(got.numpy(), want)
  # Momentum slots for the trainable variables alone.
  slots = [v for v in step.optimizer.variables if v.shape.rank]
  assert len(slots) == len(model.trainable_variables) == 4
  assert not any("backbone" in v.path for v in slots)
