"""engine.distributed.start_horovod: which controller a process takes, and
the starts it refuses; Horovod's collectives on Keras 3's variables; the
priority of Horovod's threads, in process and under `horovodrun -np 2`.
Under other launchers: tests/test_slurm_cluster.py."""
import os

import horovod.tensorflow as hvd
import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import distributed
from engine.core.errors import UserError
from tests import fixtures

BUSY_RANK = os.path.join(fixtures.REPO, "tests", "workers", "busy_rank.py")
# Long enough for an idle thread's turn on a core the suite's other
# workers share too (a turn of a few ms every second or more); the rank is
# busy for twice that.
GLOO_TIMEOUT_SECONDS = 10
LAUNCHER_MARKS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                   "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
  for name in LAUNCHER_MARKS:
    monkeypatch.delenv(name, raising=False)


def test_a_process_alone_keeps_gloo_and_leaves_no_setting_behind(
    monkeypatch):
  monkeypatch.delenv("HOROVOD_CONTROLLER", raising=False)
  monkeypatch.delenv("HOROVOD_CPU_OPERATIONS", raising=False)
  distributed.start_horovod()
  assert hvd.gloo_enabled() and not hvd.mpi_enabled()
  assert distributed.controller() == "Gloo"
  assert "HOROVOD_CONTROLLER" not in os.environ
  assert "HOROVOD_CPU_OPERATIONS" not in os.environ


def test_dynamic_process_sets_are_asked_of_horovod_alone(monkeypatch):
  # The probe of the links' levels asks for them (link_probe.py); the
  # processes this one launches, and a later start, choose for themselves.
  monkeypatch.delenv("HOROVOD_DYNAMIC_PROCESS_SETS", raising=False)
  seen = {}
  monkeypatch.setattr(hvd, "init", lambda: seen.update(
      dynamic=os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS")))
  distributed.start_horovod(dynamic_process_sets=True)
  assert seen == {"dynamic": "1"}
  assert "HOROVOD_DYNAMIC_PROCESS_SETS" not in os.environ
  distributed.start_horovod()
  assert seen == {"dynamic": None}


def test_an_mpi_launch_of_a_horovod_without_mpi_is_refused(monkeypatch):
  monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
  monkeypatch.setattr(hvd, "mpi_built", lambda: False)
  with pytest.raises(UserError, match="an MPI launcher started this "
                     "process, but this Horovod was built without MPI"):
    distributed.start_horovod()


def test_srun_tasks_without_a_pmi_are_refused(monkeypatch):
  monkeypatch.setenv("SLURM_STEP_ID", "0")
  monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
  with pytest.raises(UserError, match=r"srun started 4 tasks with no PMI "
                     r"\(--mpi=none"):
    distributed.start_horovod()
  # One task alone (srun -n 1) trains alone anyway.
  monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
  distributed.start_horovod()


def test_horovod_is_handed_the_tensorflow_variables_behind_keras_3s():
  """Horovod keys variables by `Variable.ref()`, which Keras 3's variables
  lack (horovod/horovod#4290): the engine hands it the tf.Variables behind
  them, which the Keras variables read (across two ranks:
  tests/test_multiprocess.py)."""
  kernel = keras.layers.Dense(2)
  kernel.build((None, 3))
  variables = kernel.trainable_variables
  assert not hasattr(variables[0], "ref")
  behind = distributed.tensorflow_variables(variables)
  assert all(isinstance(v, tf.Variable) for v in behind)
  behind[1].assign([1.0, 2.0])
  np.testing.assert_array_equal(variables[1].numpy(), [1.0, 2.0])


def test_init_after_tensorflow_ran_keeps_its_threads_and_says_so(caplog):
  tf.constant(1.0) + 1.0  # pylint: disable=expression-not-assigned
  threads = (tf.config.threading.get_intra_op_parallelism_threads(),
             tf.config.threading.get_inter_op_parallelism_threads())
  with caplog.at_level("WARNING"):
    world = distributed.init(intra_op_threads=threads[0] + 3,
                             inter_op_threads=threads[1] + 3,
                             bind_cpus=False)
  assert (world.intra_op_threads, world.inter_op_threads) == threads
  assert (f"TensorFlow ran before the engine set up this process, so it "
          f"keeps its threads rather than {threads[0] + 3} intra-op and "
          f"{threads[1] + 3} inter-op") in caplog.text


@pytest.mark.parametrize("idle", [True, False])
def test_horovods_threads_and_no_others_yield_to_the_step_on_cpu(idle):
  """The threads hvd.init starts (Horovod's loop, Gloo's transport) at
  Linux's idle priority; this one, and TensorFlow's, at normal; off,
  Horovod's at normal too."""
  hvd.shutdown()
  before = _threads()
  world = distributed.init(idle_horovod_threads=idle, bind_cpus=False)
  horovods = _threads() - before
  assert len(horovods) >= 2, horovods
  assert {os.sched_getscheduler(t) for t in horovods} == {
      os.SCHED_IDLE if idle else os.SCHED_OTHER}
  assert {os.sched_getscheduler(t) for t in before & _threads()} == {
      os.SCHED_OTHER}
  assert world.idle_horovod_threads == idle


def _threads() -> set[int]:
  return {int(thread) for thread in os.listdir("/proc/self/task")}


def test_a_rank_busy_past_gloos_timeout_still_answers_at_idle_priority():
  """Rank 1 keeps its core busy for twice Gloo's timeout while rank 0 waits
  in an allreduce: its Horovod threads, idle, still get turns on that
  core, and the allreduce completes on both."""
  result = fixtures.launch([BUSY_RANK, str(2 * GLOO_TIMEOUT_SECONDS)],
                           processes=2, timeout=120, env={
                               "HOROVOD_GLOO_TIMEOUT_SECONDS":
                                   str(GLOO_TIMEOUT_SECONDS)})
  assert result.returncode == 0, result.stderr[-3000:]
  for rank in (0, 1):
    assert (f"rank {rank}: sum 3.0, Horovod's threads idle: True"
            in result.stdout), result.stdout


@pytest.mark.parametrize("cores, processes, threads", [
    (2, 2, (1, 1)), (2, 1, (2, 2)), (8, 2, (4, 4)), (1, 2, (1, 1))])
def test_each_process_gets_its_share_of_the_cores_in_both_pools(
    cores, processes, threads):
  assert distributed.cpu_threads(cores, processes) == threads
