"""What a survivor says about a process that stopped (engine/distributed/liveness.py).

The frozen case, with horovodrun's key-value store, runs for real in
tests/test_faults.py.
"""
import tensorflow as tf

from engine import distributed
from engine.distributed import liveness


def test_without_heartbeats_the_line_says_what_it_can():
  assert liveness.silent_ranks() == []  # no horovodrun here
  assert liveness.describe_lost_process(None) == (
      "another process stopped the job (its error, if any, is above); run "
      "the same command again: it starts from the beginning (no checkpoint "
      "yet)")


def test_under_mpi_the_line_points_to_horovods_stall_warning(monkeypatch):
  # No key-value store (mpirun, srun); scripts/slurm/train.sbatch sets the
  # stall shutdown. Under a real SLURM: tests/test_slurm_cluster.py.
  monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "600")
  assert liveness.describe_lost_process(None).startswith(
      "another process stopped the job (its error, if any, is above), or "
      "stopped answering: Horovod's stall check ends a job whose ranks wait "
      "600 s for one (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS), and its last "
      "warning above marks that rank with '!'; run the same command again")


def test_a_process_that_exited_rather_than_froze_is_named_so(monkeypatch):
  monkeypatch.setattr(liveness, "silent_ranks", lambda: [(2, 3.2), (3, 7.0)])
  assert liveness.describe_lost_process("runs/x/checkpoints/ckpt-40") == (
      "rank 2 and rank 3 stopped 7 s ago (its error, if any, is above); run "
      "the same command again: it resumes from runs/x/checkpoints/ckpt-40")


def test_a_peer_lost_mid_collective_or_after_is_a_peer_failure():
  def error(message):
    return tf.errors.UnknownError(None, None, message)
  # The collective running when the peer went (seen killing a worker in
  # test_resume), then every later one.
  assert distributed.is_peer_failure(error(
      "[/tmp/pip-install-x/horovod/third_party/compatible17_gloo/gloo/"
      "transport/tcp/pair.cc:589] Read error [127.0.0.1]:33175: Connection "
      "reset by peer\n\t [[{{node DistributedGradientTape_Allreduce}}]]"))
  assert distributed.is_peer_failure(error(
      "Horovod has been shut down. This was caused by an exception on one "
      "of the ranks or an attempt to allreduce, allgather or broadcast a "
      "tensor after one of the ranks finished execution."))
  assert not distributed.is_peer_failure(error("Input is empty."))
  assert not distributed.is_peer_failure(ValueError("Horovod has been shut "
                                                    "down"))
