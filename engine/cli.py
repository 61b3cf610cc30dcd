"""The command line: flags in, one line out when something is wrong.

engine.train, engine.evaluate and engine.find_lr parse the engine's flags
here and end here: an error a user can act on (a flag, a file, a checkpoint,
a lost process) is one line, `PROGRAM: error: ...`, and its kind's exit code
(engine.core.errors); a preemption exits with 128 + the signal's number. Under
horovodrun a traceback would be printed N times and bury that line.

The training loop is passed in (`train_or_exit(train)`), not imported, so
the other commands parse flags without loading it.
"""
import os
import signal
import sys
import traceback
from typing import Callable, TypeVar

from absl import flags
from absl import logging
import tensorflow as tf

from engine import distributed
from engine.core import config as config_lib
from engine.core import run_files
from engine.core import user_code
from engine.core.errors import op_detail
from engine.core.errors import UserError
from engine.core.errors import WorkerLost
from engine.datasets import record_features
from engine.distributed import liveness
from engine.loop import preemption
# The engine's flags, defined for the commands that parse them here.
import flags as engine_flags

FLAGS = flags.FLAGS
Result = TypeVar("Result")


def run(train: Callable[[config_lib.TrainConfig], Result], *, model=None,
        dataset=None, **flag_values) -> Result:
  """Trains from a Python script, launched as `horovodrun --gloo -np N python
  SCRIPT.py [--flag=value ...]`: the engine's flags, with the script's
  values as their defaults and its command line over them.

  `model` and `dataset` are module-level functions, or names as their
  flags take: a model builder called as --model's, and a data set loader
  returning `engine.datasets.Splits` (for arrays a script holds:
  `engine.datasets.from_arrays`); so is `task=`, a task class
  (engine/tasks). They are recorded in flags.txt as
  `path/to/SCRIPT.py:function`, so resuming and engine.evaluate find them.
  Any other keyword is a flag: `epochs=3`, `batch_size=64`. Errors end the
  process with one line and a non-zero exit, as the command line does.
  """
  logging.use_absl_handler()  # as app.run does: absl's log format
  values = dict(flag_values, model=model, dataset=dataset)
  try:
    for name, value in values.items():
      if value is not None:
        FLAGS.set_default(name, user_code.spec_of(value)
                          if callable(value) else value)
    FLAGS(sys.argv)
  except UserError as e:
    exit_with_error(str(e))
  except (flags.Error, KeyError) as e:
    exit_with_error(f"run(): {e}")
  return train_or_exit(train)


def refuse_arguments(argv) -> None:
  """What absl leaves of the command line after its flags: nothing."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments: {' '.join(argv[1:])} (flags "
                    "take the form --name=value)")


def parse_flags(argv: list[str], program: str = "engine.train") -> list[str]:
  """absl's parsing, its errors (a bad value, an unknown flag, a flagfile
  that is not text) as one line, headed by `program`: engine.evaluate and
  engine.find_lr parse the engine's flags too."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    exit_with_error(str(e), program=program)
  except UnicodeDecodeError as e:
    exit_with_error(f"a --flagfile is not UTF-8 text ({e.reason} at byte "
                    f"{e.start}); flagfiles hold one --name=value a line",
                    program=program)


def train_or_exit(train: Callable[[config_lib.TrainConfig], Result],
                  argv: tuple = ()) -> Result:
  """Trains with the flags; an error the user can act on ends the process
  with one line (`engine.train: error: ...`) and its kind's exit code
  (engine.core.errors), a preemption with 128 + the signal's number."""
  try:
    refuse_arguments(argv)
    config = engine_flags.config_from_flags()
    return train(config)
  except UserError as e:
    exit_with_error(str(e), e.exit_code)
  except preemption.Preempted as e:
    preemption.exiting()
    print(f"engine.train: {e}", file=sys.stderr)
    sys.exit(128 + e.signum)
  except tf.errors.DataLossError as e:
    # A TFRecord file found corrupt while streaming: its counts came from
    # flags, so it was not read at start-up, where the check names the file.
    exit_with_error(
        f"corrupt input data ({op_detail(e)}), found while training; run "
        "with --train_examples=0 --test_examples=0 to check every file at "
        "start-up and name it")
  except tf.errors.InvalidArgumentError as e:
    exit_with_error(_bad_input_found_while_training(e))
  except UnicodeDecodeError as e:
    # TensorFlow quoting a record's raw bytes in its error message.
    if "tensorflow" not in traceback.extract_tb(e.__traceback__)[-1].filename:
      raise
    exit_with_error("invalid input data found while training: TensorFlow "
                    f"quoted bytes of it that are not text ({e.reason}); a "
                    "TFRecord file whose records are not tf.train.Example?")
  except tf.errors.OpError as e:
    if not distributed.is_peer_failure(e):
      raise
    # horovodrun sends the survivors SIGTERM as soon as one process exits,
    # and SIGKILL 5 s later: the line below takes a few seconds to find.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exit_with_error(liveness.describe_lost_process(
        tf.train.latest_checkpoint(os.path.join(config.training.model_dir,
                                                run_files.CHECKPOINT_DIR))),
                    WorkerLost.exit_code)


def _bad_input_found_while_training(error: tf.errors.InvalidArgumentError
                                    ) -> str:
  """Data the start-up checks could not see: an image whose first bytes
  looked right (image_folder checks only those), a label beyond the
  classes, a record that does not match its declared features."""
  detail = op_detail(error)
  mismatch = record_features.mismatch(error)
  if mismatch:  # its file, index and field (counts from flags skip the check)
    return mismatch
  if "image" in error.message.lower():
    return (f"an image failed to decode while training ({detail}); its "
            "first bytes looked right at start-up: replace or remove the "
            "damaged file")
  if "label value" in error.message:
    return (f"a label out of range found while training ({detail}); labels "
            "are class ids 0..N-1 for N classes (--num_classes, classes.txt)")
  return f"invalid input data found while training ({detail})"


def exit_with_error(message: str, exit_code: int = UserError.exit_code,
                    program: str = "engine.train") -> None:
  # One line, whatever a file or flag put in it: control characters
  # (newlines among them) as escapes.
  printable = "".join(c if c.isprintable() else repr(c)[1:-1]
                      for c in message)
  print(f"{program}: error: {printable}", file=sys.stderr)
  sys.exit(exit_code)
