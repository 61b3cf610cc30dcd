"""The train step's collectives: how gradients and the step's shared
figures are reduced across ranks, inside the compiled step.

The step (engine/compute/step.py) says what to reduce and when; this module
says how, and is the only place that asks Horovod to: on the tensors
themselves, and on the `tf.Variable`s behind Keras 3's variables where
Horovod's tape keys gradients by variable (`tensorflow_variables`). A change
of collective library is a change of this package.
"""
import horovod.tensorflow as hvd
import tensorflow as tf

from engine import distributed
from engine.core.errors import UserError

OPS = ("average", "adasum")
_OPS = {"average": hvd.Average, "adasum": hvd.Adasum}
_COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}


class Reduction:
  """Gradients reduced with `op` (average or Adasum), sent with
  `compression` (none, or float16 copies)."""

  def __init__(self, op: str = "average", compression: str = "none"):
    if op == "adasum" and not hvd.mpi_enabled():
      raise UserError("--allreduce_op=adasum needs Horovod's MPI controller, "
                      "and this job runs on Gloo; build Horovod with MPI and "
                      "launch with mpirun or horovodrun --mpi (BUILD.md), or "
                      "use --allreduce_op=average")
    self._options = dict(op=_OPS[op], compression=_COMPRESSIONS[compression])

  def gradients_of(self, tape: tf.GradientTape, target, variables) -> list:
    """The gradients of `target`, each reduced as soon as the backward pass
    has it (hvd.DistributedGradientTape), so that its transfer overlaps the
    rest of the backward pass."""
    return hvd.DistributedGradientTape(tape, **self._options).gradient(
        target, distributed.tensorflow_variables(variables))

  def grouped(self, tensors: list, *, alone_skips: bool = True) -> list:
    """`tensors` reduced in one grouped allreduce: one negotiation and one
    collective. A process alone skips Horovod's queue (as
    DistributedGradientTape does), which would add a cycle of its
    background thread to every step; unless not `alone_skips`, where a
    process alone takes the same float16 rounding as many would."""
    if not alone_skips:
      return hvd.grouped_allreduce(tensors, **self._options)
    return tf.cond(hvd.size_op() > 1,
                   lambda: hvd.grouped_allreduce(tensors, **self._options),
                   lambda: tensors)


def averaged(tensor: tf.Tensor, name: str) -> tf.Tensor:
  """`tensor` averaged over ranks, inside a compiled step; submitted beside
  gradients reduced one by one, Horovod fuses it into one of their
  allreduces. A process alone skips Horovod's queue."""
  return tf.cond(hvd.size_op() > 1,
                 lambda: hvd.allreduce(tensor, op=hvd.Average, name=name),
                 lambda: tensor)
