"""(worker) Times Horovod allreduces of messages of --dtype (float32 or
float16, as --gradient_compression=fp16 sends them), one size at a time.

Launched on every host by bench/allreduce_link.py, under horovodrun --gloo
or MPI. Pins itself to its host's core first, before TensorFlow or
Horovod start a thread, so that every thread they start stays there: on
tests/simulated_hosts.py's hosts, named `host<i>`, host i's process goes
to core i (modulo the cores it may use), as `taskset -c i` would;
elsewhere nothing is pinned. One intra-op and one inter-op thread.
For each --sizes (bytes): --warmup allreduces, an allreduce of a scalar
that starts every process together, then the timed allreduces one after
the other, each timed on its own.
Rank 0 prints one line per size, `ALLREDUCE {json}`: the bytes and every
time, and a last line with the controller and each rank's cores.
"""
import json
import os
import re
import socket
import sys
import time


def pin() -> list[int]:
  """This process (and every thread it starts later) on its host's core;
  the cores it may use after."""
  match = re.fullmatch(r"host(\d+)", socket.gethostname())
  if match:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(match.group(1)) % len(cores)]})
  return sorted(os.sched_getaffinity(0))


CORES = pin()

# pylint: disable=wrong-import-position
from absl import app
from absl import flags
import horovod.tensorflow as hvd
import tensorflow as tf

flags.DEFINE_list("sizes", [str(4096 * 4**i) for i in range(8)],
                  "Message sizes in bytes (whole numbers of --dtype).")
flags.DEFINE_enum("dtype", "float32", ["float32", "float16"],
                  "The messages' type: float16's sum is Gloo's own.")
flags.DEFINE_integer("warmup", 3, "Untimed allreduces per size.")
flags.DEFINE_integer("iterations", 20, "Timed allreduces per size, at most.")
flags.DEFINE_integer("min_iterations", 5, "Timed allreduces per size, at "
                     "least.")
flags.DEFINE_float("bytes_per_size", 512e6, "Timed bytes per size: fewer "
                   "iterations for the large messages, down to "
                   "--min_iterations.")
FLAGS = flags.FLAGS


def iterations(nbytes: int) -> int:
  budget = int(FLAGS.bytes_per_size // nbytes)
  return max(FLAGS.min_iterations, min(FLAGS.iterations, budget))


def main(argv):
  del argv
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  hvd.init()
  size = hvd.size()
  dtype = tf.as_dtype(FLAGS.dtype)
  for nbytes in map(int, FLAGS.sizes):
    if nbytes % dtype.size:
      sys.exit(f"--sizes: {nbytes} bytes is not a whole number of "
               f"{FLAGS.dtype}")
    message = tf.ones([nbytes // dtype.size], dtype)
    name = f"allreduce_{nbytes}"

    def reduce():
      reduced = hvd.allreduce(message, op=hvd.Sum, name=name)
      # Eager ops return when done; reading one element checks the sum
      # without copying the message.
      return float(reduced[0])

    for _ in range(FLAGS.warmup):
      reduce()
    hvd.allreduce(tf.constant(0.0), name="start_together")
    seconds = []
    for _ in range(iterations(nbytes)):
      start = time.perf_counter()
      total = reduce()
      seconds.append(time.perf_counter() - start)
      if total != size:
        sys.exit(f"allreduce of {nbytes} bytes summed to {total}, not "
                 f"{size}")
    if hvd.rank() == 0:
      print("ALLREDUCE " + json.dumps({"bytes": nbytes, "seconds": seconds}),
            flush=True)
  cores = hvd.allgather_object(CORES)
  if hvd.rank() == 0:
    print("ALLREDUCE " + json.dumps({
        "processes": size,
        "controller": "gloo" if hvd.gloo_enabled() else "mpi",
        "dtype": FLAGS.dtype,
        "cores": cores,
        "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME", 1)),
    }), flush=True)


if __name__ == "__main__":
  app.run(main)
