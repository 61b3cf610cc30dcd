"""Horovod Elastic: a run that shrinks and grows with its workers.

Launched by `horovodrun --min-np M --max-np N --host-discovery-script S`,
Horovod restarts the train loop (`restarting`) whenever a worker is lost or
added, instead of ending the job:

* A lost worker makes the next collective fail on the others. They go back to
  the state last committed (`TrainingState.commit`: every
  --commit_every_steps steps and at each epoch end), form a new ring without
  it, and train on.
* A worker added by the discovery script is noticed at the next commit. The
  others form a new ring with it, and it receives their committed state.

A commit is a copy in host memory. The checkpoints rank 0 writes stay the
durable copy, which a restarted job resumes from. Collectives happen only
inside the restarted function, as Horovod requires: a new worker meets the
others first at the state's broadcast, never at some other collective.
"""
import os
from typing import Callable, TypeVar

import horovod.tensorflow as hvd
from horovod.common.exceptions import HorovodInternalError
import tensorflow as tf

from engine import distributed
from engine.core.errors import UserError

Result = TypeVar("Result")


def check_launch(elastic: bool) -> None:
  """--elastic and an elastic launch go together.

  horovodrun marks elastic workers with HOROVOD_ELASTIC=1; it is also what
  makes Horovod's ops read the number of processes at run time rather than
  at trace time.
  """
  launched = os.environ.get("HOROVOD_ELASTIC") == "1"
  if elastic and not launched:
    raise UserError("--elastic needs an elastic launch: horovodrun -np N "
                    "--min-np M --max-np N --host-discovery-script SCRIPT "
                    "(docs/scaling-out.md, Elastic training)")
  if launched and not elastic:
    raise UserError("horovodrun launched this job elastic (--min-np, "
                    "--max-np or --host-discovery-script); pass --elastic, "
                    "so the train loop can follow its workers")


class TrainingState(hvd.elastic.ObjectState):
  """The state a reset goes back to: the variables, and training's
  position and bookkeeping (keyword arguments, read as attributes).

  `variables` is called at each save, restore and sync, so it sees the
  variables as they are then. Attributes are saved by reference: give them
  new values rather than changing them in place.
  """

  def __init__(self, variables: Callable[[], list[tf.Variable]], **values):
    self._variables = variables
    self._saved_variables = []
    super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank,
                     **values)

  def commit(self, **values) -> None:
    """Sets `values` and commits: a copy in host memory, then a check
    (a broadcast) for workers to add, which raises Horovod's
    HostsUpdatedInterrupt on every rank if there are some."""
    for name, value in values.items():
      setattr(self, name, value)
    super().commit()

  def save(self) -> None:
    self._save_variables()
    super().save()

  def restore(self) -> None:
    for variable, value in zip(self._variables(), self._saved_variables):
      variable.assign(value)
    super().restore()

  def sync(self) -> None:
    """Rank 0's variables and committed values, on every rank."""
    distributed.broadcast_from_chief(self._variables())
    self._save_variables()
    super().sync()

  def _save_variables(self) -> None:
    self._saved_variables = [v.numpy() for v in self._variables()]


def restarting(loop: Callable[[TrainingState], Result]
               ) -> Callable[[TrainingState], Result]:
  """`loop(state)`, restarted by Horovod after each reset.

  Horovod restarts on its own errors; a peer that died shows up in our
  steps as Gloo's error or "Horovod has been shut down"
  (distributed.is_peer_failure), which is the same event.
  """

  def restartable(state: TrainingState) -> Result:
    try:
      return loop(state)
    except tf.errors.OpError as e:
      if distributed.is_peer_failure(e):
        raise HorovodInternalError(e) from e
      raise

  return hvd.elastic.run(restartable)
