"""The train step's collectives: how gradients and the step's shared
figures are reduced across ranks, inside the compiled step.

The step (engine/compute/step.py) says what to reduce and when; this module
says how (`StepReduction`: the protocol the built-in step and a task's own
step share), and is the only place that asks Horovod to: on the tensors
themselves. A change of collective library is a change of this package.
"""
import dataclasses
from typing import Optional

import horovod.tensorflow as hvd
import tensorflow as tf

from engine.core.errors import UserError

OPS = ("average", "adasum")
_OPS = {"average": hvd.Average, "adasum": hvd.Adasum}
_COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
# What calls Horovod from inside the step is left as written, not converted
# by AutoGraph: Horovod's graph code makes its own tf.cond and needs no
# conversion, and converting it (its tape, its ops, a hundred small
# functions) cost each process about a second of start-up.
_AS_WRITTEN = tf.autograph.experimental.do_not_convert


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

  @_AS_WRITTEN
  def each(self, gradients: list, several) -> list:
    """`gradients`, each handed to an allreduce of its own as the backward
    pass has it, so that its transfer overlaps the rest of the backward
    pass (what hvd.DistributedGradientTape does, on the tensors). A
    process alone (`several` false: `several_processes`) skips Horovod's
    queue."""
    return [None if gradient is None else tf.cond(
        several,
        lambda gradient=gradient: hvd.allreduce(gradient, **self._options),
        lambda gradient=gradient: gradient) for gradient in gradients]

  @_AS_WRITTEN
  def grouped(self, tensors: list, several, *,
              alone_skips: bool = True) -> list:
    """`tensors` reduced in one grouped allreduce: one negotiation and one
    collective. A process alone (`several` false) skips Horovod's queue
    (as DistributedGradientTape does), which would add a cycle of its
    background thread to every step; unless not `alone_skips`, where a
    process alone takes the same float16 rounding as many would."""
    if not alone_skips:
      return hvd.grouped_allreduce(tensors, **self._options)
    return tf.cond(several,
                   lambda: hvd.grouped_allreduce(tensors, **self._options),
                   lambda: tensors)


@_AS_WRITTEN
def several_processes() -> tf.Tensor:
  """Whether the step is shared with other processes, read once a step
  before its work: HorovodSize is stateful, and a compiled step runs its
  stateful ops in the order they were written, so one read at each
  allreduce waited for what was written before it (the profiled step's
  stamp after the backward pass, which held every overlapped allreduce
  until the backward pass ended)."""
  return hvd.size_op() > 1


@_AS_WRITTEN
def averaged(tensor: tf.Tensor, name: str, several) -> tf.Tensor:
  """`tensor` averaged over ranks, inside a compiled step; submitted beside
  gradients reduced one by one, Horovod fuses it into one of their
  allreduces. A process alone (`several` false) skips Horovod's queue."""
  return tf.cond(several,
                 lambda: hvd.allreduce(tensor, op=hvd.Average, name=name),
                 lambda: tensor)


class StepReduction:
  """What a train step reduces across ranks, and how: its gradients with
  `op` and `compression` (Reduction), and what it shares besides
  (`shared`): its flags and the model's statistics.

  How the gradients are reduced (`overlap_allreduce`): on GPU, each as soon
  as the backward pass has it (`Reduction.each`), so the
  transfers overlap the rest of the backward pass. On CPU the transfers
  and the backward pass share the same cores and nothing overlaps, so the
  gradients and the step's flags go in one grouped allreduce after the
  backward pass (`together`): one negotiation and one collective a step
  instead of one per Horovod cycle that finds something ready
  (bench/RESULTS.md, "Horovod on CPU"). With accumulation the gradients
  exist only after the last micro-batch, so they are reduced that way on
  GPU too.
  """

  def __init__(self, model, *, op: str, compression: str,
               accumulation_steps: int, overlap_allreduce: bool):
    self._reduction = Reduction(op, compression)
    # The flags and statistics must be averaged, and neither Adasum nor a
    # float16 copy is an average: under those they take an allreduce of
    # their own.
    self.together = (op == "average" and compression == "none" and
                     (accumulation_steps > 1 or not overlap_allreduce))
    # Else, without accumulation, each gradient's allreduce starts as the
    # backward pass has it: the transfers overlap the backward pass.
    self.overlaps = accumulation_steps == 1 and not self.together
    # Frozen layers' variables (trainable=False: a frozen backbone, its
    # BatchNorm in inference mode) do not change in a step, and averaging
    # equal values is not exact on 3 or more ranks (one ulp in 10-50% of
    # float32 values): they are left as they are, not averaged.
    # (Keras' own walk of the layers, lists and dicts of them included.)
    frozen = {id(v) for layer in model._flatten_layers(include_self=False)  # pylint: disable=protected-access
              if not layer.trainable for v in layer.variables}
    self._statistics = [v for v in model.non_trainable_variables
                        if v.dtype == tf.float32 and id(v) not in frozen]

  def step(self, local: Optional[list], stop_requested, loss,
           several) -> "Reduced":
    """A step's one reduction across ranks: its local gradients (None for
    a task's own step, which reduced its gradients itself: `gradients`),
    its flags and the model's statistics (`_shared`), reduced as
    `together` and `overlaps` say; the statistics set to their average;
    the averaged gradients and the shares of ranks that asked to stop and
    whose loss was not finite returned. `several`: the step's
    `several_processes()`, read before its work."""
    shared = self._shared(stop_requested, loss)
    if local is None:
      gradients, shared = None, self._averaged_alone(shared, several)
    else:
      gradients, shared = self._reduced(local, several, shared)
    # [flags | statistics], as _shared packed them.
    parts = tf.split(shared, [FLAGS] + [v.shape.num_elements()
                                        for v in self._statistics])
    for variable, average in zip(self._statistics, parts[1:]):
      variable.assign(tf.reshape(average, variable.shape))
    stop_share, nonfinite_loss_share = tf.unstack(parts[0])
    return Reduced(gradients, stop_share, nonfinite_loss_share)

  def gradients(self, local: list) -> list:
    """Gradients a task's own step computed (engine/tasks/own_step.py),
    averaged across ranks as the built-in step's are."""
    return self._reduced(local, several_processes())[0]

  def _shared(self, stop_requested, loss) -> tf.Tensor:
    """What a step averages over ranks besides its gradients: its flags
    (step_flags), then the model's statistics, its float32 non-trainable
    variables (BatchNorm's moving means and variances), flattened.

    Each rank updates the statistics from its own batches. Averaged after
    every step they are the same on every rank at every step, so that rank
    0's checkpoint holds every rank's state and a run resumed mid-epoch
    continues exactly as it would have. Moving averages are linear in the
    batches: the average of the ranks' own is the same whether taken once
    an epoch or every step.
    """
    return tf.concat([step_flags(stop_requested, loss)]
                     + [tf.reshape(v, [-1]) for v in self._statistics], 0)

  def _reduced(self, local: list, several, shared=None):
    """The local gradients averaged across ranks, and `shared` (if given)
    averaged, or None: in one grouped allreduce (`together`); else each
    gradient as the backward pass has it (`overlaps`), or, with
    accumulation, all at once, and `shared` beside them."""
    if self.together:
      return self._reduced_together(local, several, shared)
    if self.overlaps:
      gradients = self._reduction.each(local, several)
    else:
      gradients = self._reduction.grouped(local, several, alone_skips=False)
    return gradients, None if shared is None else self._averaged_alone(
        shared, several)

  def _averaged_alone(self, shared: tf.Tensor, several) -> tf.Tensor:
    """`shared` averaged over ranks, beside gradients reduced one by one:
    submitted when the gradients start to be (it depends on the forward
    pass only), as an average like theirs, so Horovod fuses it into one of
    their allreduces instead of running a collective of its own.

    Alone, a process skips Horovod's queue (as DistributedGradientTape
    does), which would add a cycle of its background thread to every step.
    """
    return averaged(shared, "step_flags", several)

  def _reduced_together(self, local: list, several, shared=None):
    """The local gradients and `shared` (if given), averaged over ranks in
    one grouped allreduce; a process alone skips Horovod's queue."""
    present = [i for i, gradient in enumerate(local) if gradient is not None]
    # Dense: a grouped allreduce takes tensors, not IndexedSlices.
    tensors = [tf.convert_to_tensor(local[i]) for i in present]
    if shared is not None:
      tensors.append(shared)
    reduced = self._reduction.grouped(tensors, several)
    gradients = list(local)  # a variable the loss does not use keeps None
    for i, gradient in zip(present, reduced):
      gradients[i] = gradient
    return gradients, reduced[-1] if shared is not None else None


@dataclasses.dataclass(frozen=True)
class Reduced:
  """What a step's reduction gives it: the averaged gradients (None when
  the step reduced its own), and the shares of ranks that asked to stop
  and whose loss was not finite."""
  gradients: Optional[list]
  stop_share: tf.Tensor
  nonfinite_loss_share: tf.Tensor


FLAGS = 2  # step_flags' length


def step_flags(stop_requested, loss) -> tf.Tensor:
  """What every rank must learn of the others' step, so that all take the
  same decisions after the same step: [asked to stop, loss not finite], as
  0.0 or 1.0; their average over ranks is the share of ranks."""
  return tf.stack([stop_requested,
                   1.0 - tf.cast(tf.math.is_finite(loss), tf.float32)])

