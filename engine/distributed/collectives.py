"""The few collectives the engine asks of every rank, on tensors and on
small Python values: exact sums for the reported figures, the chief's
variables broadcast, agreement on an action's outcome, every rank's
value gathered.

`sum_across_ranks()` is the exact reduction every reported figure goes
through; `on_chief()` and `agree()` make one rank's failure every rank's
one-line error rather than a hang at the next collective.
"""
import pickle
from typing import Any, Callable, Optional

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from engine.core.errors import UserError
from engine.distributed.world import is_chief


def sum_across_ranks(values, name: str) -> np.ndarray:
  """Sums a vector of float64 values over all ranks, exactly.

  Reported figures are built from sums and counts (loss sum, correct
  predictions, examples) rather than per-rank means, so the result is the
  figure of the whole data set however unevenly it was split across ranks.
  """
  tensor = tf.constant(values, dtype=tf.float64)
  return hvd.allreduce(tensor, op=hvd.Sum, name=name).numpy()


def max_across_ranks(value: float, name: str) -> float:
  """The largest of every rank's `value`: the slowest rank's seconds."""
  return float(hvd.allreduce(tf.constant(value, tf.float64), op=hvd.Max,
                             name=name).numpy())


def tensorflow_variables(variables) -> list[tf.Variable]:
  """The `tf.Variable`s behind Keras' variables, which Horovod's tape and
  broadcast take: they key variables by `Variable.ref()`, which Keras 3's
  variables lack (horovod/horovod#4290). On TensorFlow's backend each
  Keras variable holds one (`value`); reads and gradients go through it."""
  return [v.value if isinstance(v, keras.Variable) else v for v in variables]


def broadcast_from_chief(variables) -> None:
  """Makes every rank's copy of `variables` equal to rank 0's."""
  hvd.broadcast_variables(tensorflow_variables(variables), root_rank=0)


def average_across_ranks(variables) -> None:
  """Replaces each variable by its mean over ranks (in place)."""
  for index, variable in enumerate(tensorflow_variables(variables)):
    variable.assign(hvd.allreduce(variable, op=hvd.Average,
                                  name=f"average/{index}"))


def on_chief(action: Optional[Callable[[], Any]], name: str) -> Any:
  """Runs `action` on rank 0 only; every rank gets its result or its error.

  Other ranks pass None. Without this, rank 0 would exit on a bad
  --model_dir or a full disk alone and the others would learn of it at
  their next collective, as a Horovod shutdown error. The error keeps its
  kind (a WriteFailed stays one), so every rank exits with its code.
  """
  outcome = (None, None)
  if is_chief():
    try:
      outcome = (action(), None)
    except UserError as e:
      outcome = (None, e)
  result, error = hvd.broadcast_object(outcome, root_rank=0, name=name)
  if error:
    raise error
  return result


def gathered(value: Any, name: str) -> list:
  """Every rank's `value` (a picklable object), in rank order, on every
  rank."""
  if hvd.size() == 1:
    return [value]
  return hvd.allgather_object(value, name=name)


def gathered_on_chief(value: Any, name: str) -> Optional[list]:
  """Every rank's `value` (a picklable object), in rank order, on rank 0;
  None on the others. One alltoall in which each rank sends its bytes to
  rank 0 alone: N values cross the network, where an allgather sends
  every rank every value (N squared: at 512 ranks, a step report's series
  256 times over)."""
  if hvd.size() == 1:
    return [value]
  sent = np.frombuffer(pickle.dumps(value), np.uint8)
  received, sizes = hvd.alltoall(
      tf.constant(sent), splits=[len(sent)] + [0] * (hvd.size() - 1),
      name=name)
  if not is_chief():
    return None
  sizes, data = sizes.numpy(), received.numpy()
  return [pickle.loads(data[end - size:end].tobytes())
          for end, size in zip(np.cumsum(sizes), sizes)]


def agree(action: Callable[[], Any], name: str,
          collective: bool = True) -> Any:
  """Runs `action` on every rank; if it fails on any, fails on every one.

  Each rank gets its own result. A UserError on some ranks (a file missing
  on one host) becomes, on the others, a UserError naming the lowest rank
  that failed, so every process stops with one line instead of waiting at
  its next collective. `collective=False` runs `action` alone (no
  agreement), where a collective is not allowed yet.
  """
  try:
    result, message = action(), ""
  except UserError as e:
    result, message = None, str(e)
  if collective:
    messages = gathered(message, name=name)
    failed = [(rank, m) for rank, m in enumerate(messages) if m]
    if failed and not message:
      rank, first = failed[0]
      message = f"on rank {rank}: {first}"
  if message:
    raise UserError(message)
  return result


def is_peer_failure(error: Exception) -> bool:
  """Whether a collective failed because another process has stopped.

  The collective that was running when the peer went fails with Gloo's own
  error ("[.../gloo/transport/tcp/pair.cc:589] Read error [...]: Connection
  reset by peer"); Horovod then shuts down, and every later one fails with
  "Horovod has been shut down".
  """
  return isinstance(error, tf.errors.OpError) and (
      "Horovod has been shut down" in error.message
      or "/gloo/transport/" in error.message)
