"""Errors a user can cause or act on, reported in one line at the entry point.

Each kind has its own exit code, so a script or scheduler around the engine
can tell them apart (docs/checkpoints-and-faults.md): 2 bad input,
3 training diverged, 4 a write to model_dir failed, 5 a process stopped
answering. A preemption exits with 128 + the signal's number
(engine.loop.preemption).
"""
import re


class UserError(Exception):
  """Bad input from the user: a flag, a file or a checkpoint.

  The message names the flag, file or checkpoint and says what to do. The
  entry point prints it as one line and exits non-zero; a traceback would only
  bury that line (N times over under horovodrun).
  """
  exit_code = 2


class Diverged(UserError):
  """The loss or the gradients became non-finite and training cannot go on
  (--on_nonfinite=stop, or its rollbacks are spent)."""
  exit_code = 3


class WriteFailed(UserError):
  """A write to model_dir failed: a full disk, a removed or read-only
  directory. Earlier checkpoints are intact; rerun once it is fixed."""
  exit_code = 4


class WorkerLost(UserError):
  """A process stopped answering: frozen, killed, or its host gone."""
  exit_code = 5


def first_line(error: BaseException) -> str:
  """The first line of `error`'s message, for a one-line report of it.

  TensorFlow's OpErrors keep their bare message in `.message` (str() adds
  the op's context); a message-less error is named by its repr. An error
  raised in a tf.function's Python (a user's train_step) heads its message
  with "in user code:" and the traceback, and ends with what went wrong:
  that last line is the one.
  """
  message = (getattr(error, "message", None) or str(error)).strip()
  if not message:
    return repr(error)
  lines = message.splitlines()
  return lines[-1].strip() if lines[0].strip() == "in user code:" else (
      lines[0])


def op_detail(error) -> str:
  """A TensorFlow op error's message on one line, without its op and graph
  names, nor the Python lines that built the op (an error inside a
  tf.function's graph names them: the train step reads its own
  batches)."""
  message = re.sub(r"^Graph execution error:\s*|Detected at node \S+ defined "
                   r"at \(most recent call last\):\n(?:\s*File .*\n+)*", "",
                   error.message)
  return " ".join(re.sub(r"\{\{.*?\}\}|\[\[.*?\]\]|\[Op:.*", "",
                         message, flags=re.DOTALL).split())
