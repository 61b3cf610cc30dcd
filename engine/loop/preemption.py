"""Preemption: SIGTERM, SIGINT or SIGUSR1 ends the run at a step boundary,
saved.

Schedulers (SLURM, Kubernetes, spot instances) announce a preemption with
SIGTERM, and Ctrl-C sends SIGINT; horovodrun passes either on to every rank
as SIGTERM and kills them 5 s later. Open MPI's mpirun passes neither: it
sends the ranks SIGTERM itself only to kill them, a second before SIGKILL,
too soon for a step and a save; it passes SIGUSR1 on as it comes, and
SLURM's `--signal=USR1@SECONDS` sends it too, so SIGUSR1 asks for the same
stop (scripts/slurm/train.sbatch sends it to mpirun). The handler only
records the signal. The train step reduces that record across ranks with the
gradients, so all ranks learn of it after the same step, even if the signal
reached them a step apart; then they agree on which signal it was
(horovodrun's SIGTERM can reach one rank after the others agreed), rank 0
saves a checkpoint and every rank exits with 128 + its number. A second
signal interrupts at once, for a user who does not want to wait.
"""
import signal
from typing import Callable, Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class Preempted(Exception):
  """Raised on every rank once all have agreed to stop."""

  def __init__(self, signum: int, message: str):
    super().__init__(message)
    self.signum = signum


def stop(signum: int, where: str, save: Optional[Callable[[], str]]):
  """Ends the run on every rank, with Preempted: rank 0 (`save` given)
  after saving where it stands; `signum` is the signal the ranks agreed
  on."""
  name = signal.Signals(signum).name
  if save:
    path = save()
    raise Preempted(signum, f"stopped by {name} at {where}; saved {path}; "
                    "run the same command again to continue")
  raise Preempted(signum, f"stopped by {name} at {where}")


def exiting() -> None:
  """A rank that agreed to stop is on its way out with 128 + the signal's
  number: a later signal no longer cuts its exit short. horovodrun sends
  its SIGTERM to the ranks still exiting as soon as one has exited
  non-zero, and a rank it killed would lose its exit status."""
  for signum in SIGNALS:
    signal.signal(signum, signal.SIG_IGN)


class StopRequests:
  """Records SIGTERM, SIGINT and SIGUSR1 instead of dying on them."""

  def __init__(self):
    self.signum = 0
    self._previous = {}

  def install(self) -> None:
    for signum in SIGNALS:
      self._previous[signum] = signal.signal(signum, self._record)

  def uninstall(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  @property
  def requested(self) -> bool:
    return bool(self.signum)

  def _record(self, signum, frame):
    del frame
    self.signum = self.signum or signum
    # The next signal takes the usual way out.
    signal.signal(signum, signal.default_int_handler
                  if signum == signal.SIGINT else signal.SIG_DFL)
