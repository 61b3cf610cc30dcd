"""Run by tests/test_distributed.py under `horovodrun --gloo -np 2`, with
Gloo's timeout shortened: rank 1 keeps its one core busy for ARGV[1]
seconds, longer than the timeout, while rank 0 waits in an allreduce.
Horovod's threads, at idle priority on that core, must still take their
turns in the collectives the two processes' loops hold every cycle, or
rank 0's wait fails. Each rank prints the sum it got."""
import sys
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from engine import distributed

world = distributed.init()
if world.rank == 1:
  end = time.monotonic() + float(sys.argv[1])
  while time.monotonic() < end:  # Python's own loop: the core stays busy
    pass
total = hvd.allreduce(tf.constant([world.rank + 1.0]), op=hvd.Sum)
print(f"rank {world.rank}: sum {float(total[0])}, Horovod's threads idle: "
      f"{world.idle_horovod_threads}", flush=True)
