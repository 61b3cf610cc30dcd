"""Which process stopped answering: heartbeats in horovodrun's key-value store.

A process that freezes (SIGSTOP, a hung file system, a host swapping) holds
up every collective. Under Gloo the others give up after
HOROVOD_GLOO_TIMEOUT_SECONDS (30 s by default) with an error that names no
rank: Horovod shuts down, and each survivor's next op fails with "Horovod
has been shut down". So each process writes the time, every second, from a
daemon thread, into the HTTP key-value server horovodrun runs for Gloo's
rendezvous (HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT, for the life of the
job). A frozen or dead process stops beating; after a failed collective a
survivor watches every rank's beat for a few seconds and names the ranks
whose beat did not move.

Under mpirun or srun there is no such server, and MPI has no timeout: a
frozen process hangs the job until Horovod's stall shutdown
(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, set in scripts/slurm/train.sbatch)
or the scheduler's time limit ends it. Nor under --elastic, whose ranks
change: Horovod replaces a lost worker there rather than ending the job.
"""
import os
import threading
import time
from typing import Optional
import urllib.request

INTERVAL_SECONDS = 1.0
# A live process beats at least once in this time, even on a loaded host;
# well within the 5 s horovodrun gives the others once one has exited.
WATCH_SECONDS = 2.5
_SCOPE = "engine_heartbeat"
_started = False


def start_heartbeat(rank: int, size: int) -> None:
  """Beats for this process until it exits, when launched by horovodrun
  (Gloo, not elastic) on more than one process; once per process."""
  global _started  # pylint: disable=global-statement
  if _started or size < 2 or not _store() or os.environ.get(
      "HOROVOD_ELASTIC") == "1":
    return
  _started = True

  def beat_forever():
    while True:
      _put(rank, f"{time.time():.3f}")
      time.sleep(INTERVAL_SECONDS)

  _put(rank, f"{time.time():.3f}")  # the first before any collective
  threading.Thread(target=beat_forever, name="heartbeat", daemon=True).start()


def silent_ranks() -> list[tuple[int, float]]:
  """The other ranks whose beat did not move in WATCH_SECONDS, with their
  silence in seconds; empty without a key-value store.

  Watching rather than reading once: a process killed a moment ago beat
  as recently as the live ones.
  """
  if not _started:
    return []
  rank, size = int(os.environ["HOROVOD_RANK"]), int(
      os.environ["HOROVOD_SIZE"])
  others = [other for other in range(size) if other != rank]
  before = {other: _get(other) for other in others}
  time.sleep(WATCH_SECONDS)
  now, silent = time.time(), []
  for other in others:
    beat = _get(other)
    if beat is None or beat == before[other]:
      silent.append((other, now - beat if beat is not None else float("inf")))
  return silent


def describe_lost_process(latest_checkpoint: Optional[str]) -> str:
  """One line for a survivor of a failed collective: which rank stopped,
  how long it has been silent, whether it froze or exited, and where a
  rerun resumes."""
  silent = silent_ranks()
  timeout = float(os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "30"))
  stall = float(os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0"))
  if not silent and not _store() and stall > 0:
    # MPI (mpirun, srun): no heartbeats, but Horovod's stall check names
    # a rank that stopped short of a collective as it ends the job.
    what = ("another process stopped the job (its error, if any, is "
            "above), or stopped answering: Horovod's stall check ends a "
            f"job whose ranks wait {stall:g} s for one "
            "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS), and its last warning "
            "above marks that rank with '!'")
  elif not silent:
    what = "another process stopped the job (its error, if any, is above)"
  else:
    who = " and ".join(f"rank {rank}" for rank, _ in silent)
    longest = max(silence for _, silence in silent)
    if longest >= timeout:
      what = (f"{who} stopped answering: silent for {longest:.0f} s; this "
              f"process waited for it for Gloo's timeout of {timeout:g} s "
              "(HOROVOD_GLOO_TIMEOUT_SECONDS) and stopped")
    else:
      what = (f"{who} stopped {longest:.0f} s ago (its error, if any, is "
              "above)")
  where = (f"it resumes from {latest_checkpoint}" if latest_checkpoint
           else "it starts from the beginning (no checkpoint yet)")
  return f"{what}; run the same command again: {where}"


def _store() -> Optional[str]:
  address = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
  port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
  return f"http://{address}:{port}/{_SCOPE}" if address and port else None


def _put(rank: int, value: str) -> None:
  request = urllib.request.Request(f"{_store()}/{rank}", method="PUT",
                                   data=value.encode())
  try:
    urllib.request.urlopen(request, timeout=2).read()
  except OSError:
    pass  # horovodrun going away, or a slow moment: never fail training


def _get(rank: int) -> Optional[float]:
  try:
    with urllib.request.urlopen(f"{_store()}/{rank}", timeout=2) as reply:
      return float(reply.read())
  except (OSError, ValueError):  # 404 (an HTTPError): it never beat
    return None
