"""Distributed training's processes and what they ask of each other, by
concern:

  world.py        Horovod's start-up, each process's device, cores and
                  threads, its rank and host, the chief, the timeline
  collectives.py  the collectives the engine uses outside the step: exact
                  sums, the chief's broadcast, agreement, gathering
  gradients.py    the step's reduction of the gradients
  elastic.py      a run that goes on when workers come and go
  liveness.py     naming the rank that stopped answering
  link_probe.py   timing each level of the links (the step report's)

The package's own names are world's and collectives' (`distributed.init`,
`distributed.on_chief`): what the rest of the engine calls.
"""
try:
  import horovod.tensorflow  # pylint: disable=unused-import
except ModuleNotFoundError as e:
  if e.name not in ("horovod", "horovod.tensorflow"):
    raise
  # pip installs the engine without it: Horovod is compiled against the
  # installed TensorFlow, with our patch.
  raise ModuleNotFoundError(
      "Horovod is not installed in this environment: it is built against "
      "its TensorFlow with the engine's patch; run VENV=<this venv> bash "
      "scripts/setup.sh from the engine's checkout (BUILD.md, \"Horovod\")",
      name="horovod") from None
from engine.distributed.collectives import agree
from engine.distributed.collectives import average_across_ranks
from engine.distributed.collectives import broadcast_from_chief
from engine.distributed.collectives import gathered
from engine.distributed.collectives import gathered_on_chief
from engine.distributed.collectives import is_peer_failure
from engine.distributed.collectives import max_across_ranks
from engine.distributed.collectives import on_chief
from engine.distributed.collectives import sum_across_ranks
from engine.distributed.collectives import tensorflow_variables
from engine.distributed.world import available_cores
from engine.distributed.world import controller
from engine.distributed.world import cpu_threads
from engine.distributed.world import current
from engine.distributed.world import hosts
from engine.distributed.world import init
from engine.distributed.world import is_chief
from engine.distributed.world import local_rank
from engine.distributed.world import MPI_FROZEN_PROCESS
from engine.distributed.world import nccl_built
from engine.distributed.world import rank_and_size
from engine.distributed.world import start_horovod
from engine.distributed.world import start_timeline
from engine.distributed.world import stop_timeline
from engine.distributed.world import World
