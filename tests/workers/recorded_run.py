"""The engine, recording what each process did: its rank, host, steps and
final weights; under elastic horovodrun with a worker lost or added, across
simulated hosts, and under SLURM.

Run as `python tests/workers/recorded_run.py ENGINE_FLAGS...` on every
process, by tests/test_elastic.py, tests/test_multihost.py and
tests/test_slurm_cluster.py. The environment says what to do:

  RECORD_OUT         each process writes OUT/<pid>.json at the end: the
                     steps it ran (number of processes, the optimizer's step
                     counter and learning rate before each), its rank and
                     host, and OUT/<pid>.npz, its final weights
                     (fixtures.recorded_processes reads them).
  ELASTIC_KILL_HOST  the worker on this host (HOROVOD_HOSTNAME) kills itself
  ELASTIC_KILL_AT    with SIGKILL after its Nth step, as a lost machine would.
  ELASTIC_ADD_HOST   rank 0 appends this host to $ELASTIC_HOSTS, the file
  ELASTIC_ADD_AT     scripts/discover_hosts.sh prints, after its Nth step, and
                     waits until horovodrun has announced it to this worker
                     (it looks every second), so that the next commit adds
                     it however fast the remaining steps are.
  ELASTIC_SLEEP_AT   every worker sleeps ELASTIC_SLEEP_SECONDS after its
                     Nth step: time the run's clock must keep.
  RECORD_STUCK_RANK  the process of this rank sleeps an hour after its Nth
  RECORD_STUCK_AT    step, as one stuck on a hung file system would: alive,
                     Horovod's thread still answering, never reaching the
                     next collective.
  RECORD_CRASH_RANK  the process of this rank dies of SIGSEGV after its Nth
  RECORD_CRASH_AT    step, as one hit by a native crash would.
  RECORD_STEP_SECONDS every process sleeps this long after each step, and
  RECORD_SAVE_SECONDS rank 0 before each save: a large model's step and
                     save, slower than a launcher's grace.
"""
import json
import os
import signal
import socket
import sys
import time

from absl import app
from horovod.common.elastic import notification_manager
import horovod.tensorflow as hvd
import numpy as np

from engine import train as engine_train
from engine.compute import step as steps
from engine.datasets import RecordFiles
from engine.records import checkpoint
from tests import fixtures
from tests import timeouts

OUT = os.environ["RECORD_OUT"]
_journal = []
_record_files = []
_saved = []


def _step_with_events(original):
  """A call of the step (TrainStep.train: one step, the tests' runs take
  one a call; timed in a profiled window) journaled, and the events the
  environment asks for after it."""
  def step(self, num_steps, stop_requested=False, timed=False):
    entry = dict(size=hvd.size(),
                 iteration=int(self.optimizer.iterations.numpy()))
    _journal.append(entry)  # a step that fails is journaled too
    outcome = original(self, num_steps, stop_requested, timed)
    # Keras' optimizer keeps the rate of its last update.
    entry["learning_rate"] = float(self.optimizer.learning_rate)
    done = len(_journal)
    time.sleep(float(os.environ.get("RECORD_STEP_SECONDS", 0)))
    if done == int(os.environ.get("ELASTIC_SLEEP_AT", 0)):
      time.sleep(float(os.environ["ELASTIC_SLEEP_SECONDS"]))
    if (os.environ.get("ELASTIC_KILL_HOST") and os.environ.get(
        "HOROVOD_HOSTNAME") == os.environ["ELASTIC_KILL_HOST"]
        and done == int(os.environ["ELASTIC_KILL_AT"])):
      os.kill(os.getpid(), signal.SIGKILL)
    if (done == int(os.environ.get("RECORD_STUCK_AT", 0))
        and hvd.rank() == int(os.environ["RECORD_STUCK_RANK"])):
      time.sleep(3600)
    if (done == int(os.environ.get("RECORD_CRASH_AT", 0))
        and hvd.rank() == int(os.environ["RECORD_CRASH_RANK"])):
      os.kill(os.getpid(), signal.SIGSEGV)
    if (os.environ.get("ELASTIC_ADD_HOST") and hvd.rank() == 0
        and done == int(os.environ["ELASTIC_ADD_AT"])):
      with open(os.environ["ELASTIC_HOSTS"], "a") as f:
        f.write(os.environ["ELASTIC_ADD_HOST"] + "\n")
      _wait_for_announced_hosts()
    return outcome
  return step


def _wait_for_announced_hosts(timeout: float = 120) -> None:
  deadline = time.monotonic() + timeouts.bound(timeout)
  while not any(not state._host_messages.empty()  # pylint: disable=protected-access
                for state in notification_manager._listeners):  # pylint: disable=protected-access
    if time.monotonic() > deadline:
      raise TimeoutError("horovodrun did not announce the added host")
    time.sleep(0.1)


def _rank_files_recorded(original):
  def rank_files(source, shard):
    files = original(source, shard)
    _record_files.append(list(files))
    return files
  return rank_files


def _save_recorded(original):
  def save(self, position, global_step):
    _saved.append(dict(rank=hvd.rank(), global_step=global_step))
    time.sleep(float(os.environ.get("RECORD_SAVE_SECONDS", 0)))
    return original(self, position, global_step)
  return save


def _train_and_record(original):
  def train(config):
    result = original(config)
    np.savez(os.path.join(OUT, f"{os.getpid()}.npz"),
             *[v.numpy() for v in result.model.variables])
    with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as f:
      json.dump(dict(rank=hvd.rank(), size=hvd.size(),
                     local_rank=hvd.local_rank(),
                     local_size=hvd.local_size(),
                     cross_rank=hvd.cross_rank(),
                     cross_size=hvd.cross_size(),
                     host=os.environ.get("HOROVOD_HOSTNAME"),
                     hostname=socket.gethostname(), steps=_journal,
                     train_files=_record_files[0] if _record_files else [],
                     saved=_saved), f)
    return result
  return train


if __name__ == "__main__":
  steps.TrainStep.train = _step_with_events(steps.TrainStep.train)
  RecordFiles.rank_files = _rank_files_recorded(RecordFiles.rank_files)
  checkpoint.Checkpoints.save = _save_recorded(checkpoint.Checkpoints.save)
  engine_train.train = _train_and_record(engine_train.train)
  app.run(engine_train.main,
          argv=[sys.argv[0], *fixtures.ENGINE_FLAGS, *sys.argv[1:]])
