"""--dataset=FILE.py:function returning tf.data datasets, for engine.train:
the fit script's run (engine.fit) by flags alone, its model from
--model=FILE.py:function, compiled. In-process, one process; what is
refused, in one line."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from engine import evaluate as evaluate_lib
from engine import train as train_lib
from engine.core.errors import UserError
from tests import fixtures
from tests import test_fit

DATA = f'''
import numpy as np
import tensorflow as tf

def examples(count, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(count, 6)).astype("float32")
  y = (x[:, 0] + x[:, 1] > 0).astype("int64") + (x[:, 2] > 1)
  return x, y

def batches(seed):  # (unshuffled: the same batches however often read)
  return tf.data.Dataset.from_tensor_slices(examples({test_fit.EXAMPLES},
                                                     seed)).batch({test_fit.BATCH})

def datasets():
  return batches(0), batches(1)

def three():
  return datasets() + (None,)
'''

MODEL = '''
import keras

def classifier(input_shape):
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input(input_shape),
                            keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dense(3, activation="softmax")])
  model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
  return model

def flattened(input_shape, num_classes):  # (for the engine's images)
  model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                            keras.layers.Dense(num_classes)])
  model.compile(optimizer="sgd", loss="mse")
  return model

def of_classes(input_shape, num_classes):
  return of_ten(input_shape, num_classes)

def of_ten(input_shape, num_classes=10):
  model = keras.Sequential([keras.Input(input_shape),
                            keras.layers.Dense(num_classes)])
  model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  return model
'''


@pytest.fixture
def code(tmp_path):
  (tmp_path / "data.py").write_text(DATA)
  (tmp_path / "model.py").write_text(MODEL)
  return tmp_path


def config(code, *, data="datasets", model="classifier", given=(), **changes):
  """The flags' defaults where not `given`: a batch of 128 and auto
  precision, which the datasets' run settles to their batch and the
  model's own precision."""
  changes.setdefault("performance", dict(mixed_precision="auto",
                                         gradient_compression="none",
                                         steps_per_call=1))
  return fixtures.train_config(
      data=dict(name=f"{code / 'data.py'}:{data}"),
      model=dict(name=model if model == "cnn"  # (built in)
                 else f"{code / 'model.py'}:{model}"),
      training=dict(model_dir=str(code / "run"), batch_size=128, epochs=2,
                    progress="none", steps_per_epoch=0),
      given=frozenset(given), **changes)


def test_the_flags_run_is_the_fit_scripts_and_evaluates_as_it_trained(code):
  keras.backend.clear_session()
  by_flags = train_lib.train(config(code))
  def batches(seed):
    return tf.data.Dataset.from_tensor_slices(test_fit.examples(
        seed=seed)).batch(test_fit.BATCH)
  by_fit = test_fit.fit(code / "fit", test_fit.classifier(), batches(0),
                        batches(1))
  assert test_fit.figures(by_flags.history) == pytest.approx(
      test_fit.figures(by_fit.history), rel=1e-6)
  # Each process's batch is the dataset's, the precision the model's own.
  assert by_flags.history[-1]["global_batch"] == test_fit.BATCH
  assert by_flags.model.dtype_policy.name == "float32"
  assert set(by_flags.history[-1]) >= {"train_accuracy", "val_accuracy",
                                       "val_loss"}
  # engine.evaluate rebuilds it from the flags, restores the checkpoint.
  _, scored, _ = evaluate_lib.evaluate(config(code), "latest")
  assert scored.figures == pytest.approx(
      {k[len("val_"):]: v for k, v in by_flags.history[-1].items()
       if k.startswith("val_")}, rel=1e-6)
  # A second start into the model_dir trains nothing again.
  again = train_lib.train(config(code))
  assert again.history == []
  np.testing.assert_array_equal(again.model.get_weights()[0],
                                by_flags.model.get_weights()[0])


@pytest.mark.parametrize("change, message", [
    (dict(model="cnn"), "--model=cnn is compiled by nobody"),
    (dict(data="three"), "returned 3 values"),
    (dict(given=("task",)), "--task reaches nothing for --dataset's tf.data"),
    (dict(given=("base_lr",)), "--base_lr reaches nothing"),
    (dict(given=("mixed_precision",),
          performance=dict(mixed_precision="bfloat16",
                           gradient_compression="none")),
     "--mixed_precision reaches nothing for --dataset's tf.data datasets"),
    (dict(given=("batch_size",)), "--batch_size=128 for a dataset batched "
     "by 8"),
    (dict(model="of_classes"), "takes num_classes, which tf.data datasets do "
     "not tell: give it a default"),
])
def test_what_cannot_be_honoured_is_one_line(code, change, message):
  with pytest.raises(UserError) as raised:
    train_lib.train(config(code, **change))
  assert message in str(raised.value) and "\n" not in str(raised.value)
  assert not (code / "run" / "checkpoints").exists()


def test_a_models_function_with_num_classes_builds_at_its_default(code):
  result = train_lib.train(config(code, model="of_ten").replace(
      training=dict(epochs=1)))
  assert result.model.output_shape == (None, 10)


def test_a_compiled_model_on_the_engines_own_data_is_refused(code, tmp_path):
  # Its compile() would be dropped: the engine's data trains by --task.
  made = config(code, model="flattened").replace(data=dict(
      name="fashion_mnist",
      dir=fixtures.write_fashion_mnist(str(tmp_path / "fm"), num_train=64,
                                       num_test=16)))
  with pytest.raises(UserError) as raised:
    train_lib.train(made)
  assert (f"--model={code / 'model.py'}:flattened returns a model trained "
          "by compile()'s loss, which --dataset=fashion_mnist's data would "
          "not use") in str(raised.value)
  assert "\n" not in str(raised.value)
