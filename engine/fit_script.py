r"""`engine.fit`: a Keras fit script, trained data-parallel by the engine.

A script that calls `model.fit(train, validation_data=val, epochs=...,
callbacks=[...])` becomes distributed with two lines changed, `import
engine` and `model.fit(` -> `engine.fit(model, `, and is launched as

  horovodrun --gloo -np 2 .venv/bin/python SCRIPT.py [--flag=value ...]

Its model, compile(), tf.data pipelines and callbacks stay as written
(engine/given.py says what each becomes); the engine adds what it adds to
any run: ranks identical, exact validation, checkpoints and resume from
model_dir, one-line errors, the step report, TensorBoard
(docs/from-fit.md).
"""
import functools
from typing import Optional

import keras

from engine import cli
from engine import given as given_lib
from engine import train as train_lib
from engine.core.errors import UserError


def fit(model: keras.Model, x, *, validation_data=None, epochs: int = 1,
        callbacks=None, steps_per_epoch: Optional[int] = None,
        model_dir: Optional[str] = None, init_from: Optional[str] = None,
        batch_size: Optional[int] = None,
        **flag_values) -> keras.callbacks.History:
  """Trains `model`, as compiled, on `x` (a tf.data.Dataset of (x, y) or
  (x, y, sample_weight)), evaluating on `validation_data` every epoch, as
  `model.fit` would, on every process horovodrun started. Its batches are
  each process's (an unbatched dataset is batched by `batch_size`).

  `model_dir` holds the run: a second start into it resumes, and trains
  no finished epoch again. `init_from` warm-starts a new run's weights
  (a .keras, a .weights.h5, another run's model_dir). Any other keyword is
  an engine flag's default (`checkpoint_every_steps=100`), and the
  command line's flags are over them. Returns the History `model.fit`
  would: the compiled metrics and their `val_` figures, per epoch run.
  """
  try:
    batch_size = given_lib.batch_size_of(x, model, batch_size)
  except UserError as e:
    cli.exit_with_error(str(e))
  defaults = dict(flag_values, epochs=epochs, model_dir=model_dir,
                  init_from=init_from, batch_size=batch_size,
                  steps_per_epoch=steps_per_epoch, task=given_lib.NAME,
                  mixed_precision="none")
  result = cli.run(functools.partial(_train, model, x, validation_data,
                                     tuple(callbacks or ())),
                   model=given_lib.NAME, dataset=given_lib.NAME, **defaults)
  return history(model, result.history)


def _train(model, train, validation, callbacks, config):
  """Inside the command line's error handling: a bad model or dataset is
  one line, as a bad flag is."""
  return train_lib.train(config, given=given_lib.Given(
      model=model, train=train, validation=validation, callbacks=callbacks))


def history(model: keras.Model, records: list[dict]
            ) -> keras.callbacks.History:
  """The epochs' records as `model.fit`'s History: per epoch, the train
  figures by their compiled names (loss, accuracy), the validation ones as
  val_loss, val_accuracy, and the learning rate."""
  kept = keras.callbacks.History()
  kept.set_model(model)
  kept.on_train_begin()
  for record in records:
    kept.epoch.append(record["epoch"] - 1)
    logs = {**{key[len("train_"):]: value for key, value in record.items()
               if key.startswith("train_") and key != "train_examples"},
            **{key: value for key, value in record.items()
               if key.startswith("val_")},
            "learning_rate": record["learning_rate"]}
    for key, value in logs.items():
      kept.history.setdefault(key, []).append(value)
  return kept
