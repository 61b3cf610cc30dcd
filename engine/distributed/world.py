"""The world of processes: Horovod's start-up on its controller, each
process's device, cores and threads, where it stands among the others
(rank, host, chief), and Horovod's timeline.

`init()` starts Horovod and places the process on its device; `is_chief()`
names the one process that talks and writes. The collectives the engine
asks of the others are collectives.py's.
"""
import dataclasses
import os

from absl import logging
import horovod.tensorflow as hvd
import tensorflow as tf

from engine.core.cpu import available_cores, cpu_threads
from engine.core.errors import UserError
from engine.distributed import liveness


# Horovod's background thread wakes every HOROVOD_CYCLE_TIME ms (1 by
# default) to look for tensors to reduce, and at every wake the processes
# agree on what is ready in a small collective, busy or not: 8-9% of a
# core and about 3,000 context switches a second per process, idle, on 2
# processes here. On CPU those wakes come out of the step's kernels, on
# the same cores. Every 3 ms: a third of that, and 6% more images/s on 2
# processes (2 cores); every 10 ms gained nothing, a ready gradient waiting
# longer for the next cycle (BUILD.md, bench/cpu_defaults.py). On GPU the
# kernels run elsewhere, and Horovod's default stays.
CPU_CYCLE_TIME_MS = 3


@dataclasses.dataclass(frozen=True)
class World:
  """Where this process stands among the others."""
  rank: int
  size: int
  device: str            # "GPU" or "CPU"
  intra_op_threads: int  # 0 = TensorFlow's default (on GPU)
  inter_op_threads: int
  # Horovod takes process sets made after its start: each level of the
  # links can be probed (link_probe.py).
  dynamic_process_sets: bool = False
  # Horovod's threads run at idle priority (`to_idle_priority`).
  idle_horovod_threads: bool = False


def init(*, intra_op_threads: int = 0, inter_op_threads: int = 0,
         bind_cpus: bool = True, idle_horovod_threads: bool = True,
         deterministic: bool = False, timeline: bool = False,
         link_levels: bool = False) -> World:
  """Starts Horovod and gives this process its device and its share of cores.

  On CPU, thread counts of 0 mean "this process's share" (`cpu_threads`);
  `idle_horovod_threads`, Horovod's own threads yield to the step's
  (`to_idle_priority`). `timeline` lets the run start and stop Horovod's
  timeline for a range of steps (profiling.StepProfiler); `link_levels`,
  probe each level of the links at its windows' ends (link_probe.py).
  Must run before TensorFlow executes anything: devices and thread pools
  are fixed at the first op.
  """
  gpus = tf.config.list_physical_devices("GPU")
  _settings_for_horovod(timeline=timeline, on_cpu=not gpus)
  before_horovod = _threads()
  start_horovod(dynamic_process_sets=link_levels)
  horovods = _threads() - before_horovod
  # So a survivor of a failed collective can name the rank that stopped.
  liveness.start_heartbeat(hvd.rank(), hvd.size())
  if deterministic:
    # Same inputs, same results, op by op (slower on GPUs); what makes a
    # resumed run land on exactly the weights of an uninterrupted one.
    tf.config.experimental.enable_op_determinism()
  if gpus:
    # One GPU per process, chosen by local rank; memory growth so a process
    # takes what it uses rather than the whole card at start-up.
    gpu = gpus[hvd.local_rank() % len(gpus)]
    tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpu, "GPU")
    return World(hvd.rank(), hvd.size(), device="GPU", intra_op_threads=0,
                 inter_op_threads=0, dynamic_process_sets=link_levels)
  if idle_horovod_threads:
    to_idle_priority(horovods)
  # The cores the launch gave this host's processes, before this one binds
  # to its slice of them.
  cores = available_cores()
  if bind_cpus:
    bind_to_own_cores(hvd.local_rank(), hvd.local_size())
  auto_intra, auto_inter = cpu_threads(cores, hvd.local_size())
  intra, inter = _thread_pools(intra_op_threads or auto_intra,
                               inter_op_threads or auto_inter)
  return World(hvd.rank(), hvd.size(), device="CPU", intra_op_threads=intra,
               inter_op_threads=inter, dynamic_process_sets=link_levels,
               idle_horovod_threads=idle_horovod_threads)


def _thread_pools(intra: int, inter: int) -> tuple[int, int]:
  """Gives TensorFlow's two pools `intra` and `inter` threads, unless they
  are fixed already; the threads they have."""
  try:
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    return intra, inter
  except RuntimeError:
    # TensorFlow ran before (a script's own ops, or an earlier run in this
    # process): its threads are fixed for the process's life, as `import
    # engine` set them under a launcher (engine/__init__.py) or TensorFlow's
    # default (0).
    kept = (tf.config.threading.get_intra_op_parallelism_threads()
            or int(os.environ.get("TF_NUM_INTRAOP_THREADS", 0)),
            tf.config.threading.get_inter_op_parallelism_threads()
            or int(os.environ.get("TF_NUM_INTEROP_THREADS", 0)))
    if kept != (intra, inter):
      logging.warning(
          "TensorFlow ran before the engine set up this process, so it "
          "keeps its threads rather than %d intra-op and %d inter-op; run "
          "nothing of TensorFlow's before training for the engine's choice",
          intra, inter)
    return kept


def _settings_for_horovod(*, timeline: bool, on_cpu: bool) -> None:
  """What hvd.init reads from the environment; a user's own settings win."""
  if timeline:
    # Read by hvd.init: a timeline that hvd.start_timeline can switch on.
    os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
  if on_cpu:
    # Read by hvd.init; a user's (horovodrun --cycle-time-ms) wins.
    os.environ.setdefault("HOROVOD_CYCLE_TIME", str(CPU_CYCLE_TIME_MS))
    # Read by Open MPI's MPI_Init (in hvd.init, under horovodrun --mpi); a
    # user's wins. Horovod's thread shares this process's core with the
    # step's: waiting in a collective, MPI polls without yielding unless
    # told to, and takes that core from the step (CosmoFlow on 2 processes:
    # 1.15x the volumes/s yielding; BUILD.md).
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


def bind_to_own_cores(local_rank: int, local_size: int) -> None:
  """Gives each process on a host its own slice of the host's cores.

  Unbound, the processes wake each other over loopback at every allreduce,
  and the scheduler's wake-affinity keeps pulling them onto one core: on two
  cores we measured epochs at exactly half speed about a third of the time
  (bench/cpu_defaults.py). Binding, as `mpirun --bind-to core` does, removes
  that mode. The slice is taken from the cores this process may already use,
  and only when there is at least one per process, so a launcher's own
  binding is refined, never widened.
  """
  cores = sorted(os.sched_getaffinity(0))
  share = len(cores) // local_size
  if share == 0:
    return
  mine = set(cores[local_rank * share:(local_rank + 1) * share])
  # Threads inherit affinity from their creator; Horovod's and TensorFlow's
  # already exist, so set it on every thread of the process.
  for thread in _threads():
    try:
      os.sched_setaffinity(thread, mine)
    except ProcessLookupError:  # it ended since the listing
      pass


def to_idle_priority(threads: set[int]) -> None:
  """Gives `threads` Linux's idle scheduling class: they take a core when
  no thread of normal priority wants it (and a small share when one
  does), and never preempt one.

  For Horovod's threads on a CPU (its background loop and Gloo's
  transport, all that hvd.init starts). The loop wakes every cycle, busy
  or not, and agrees with the other processes in a small collective; on
  a core bound to one step's thread, each wake preempts the step's
  kernels and evicts their data from the caches. Idle, they run while
  the step waits for the allreduce, which is when they have work: on 2
  processes of 2 cores the guide's ResNet stepped in 0.80-0.98x the time,
  Horovod's synthetic benchmark 1.22x the images a second (BUILD.md, "on
  CPU"). Never starved for long: the class keeps a small share of a busy
  core, and a rank busy past Gloo's timeout still answers. Threads they
  start inherit the class; an elastic reset starts Horovod anew, at
  normal priority.
  """
  for thread in threads:
    try:
      os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
    except ProcessLookupError:  # it ended since the listing
      pass


def _threads() -> set[int]:
  """This process's threads, by their ids."""
  return {int(thread) for thread in os.listdir("/proc/self/task")}


def current(world: World) -> World:
  """`world` with this process's rank and the number of processes now, which
  change at each reset of an elastic run (its device and threads do not)."""
  return dataclasses.replace(world, rank=hvd.rank(), size=hvd.size())


def start_horovod(dynamic_process_sets: bool = False) -> None:
  """hvd.init(), on Gloo's controller unless an MPI launcher started us;
  taking process sets made after it if `dynamic_process_sets`.

  A UserError for processes that would each train alone, unaware of the
  others: started by an MPI launcher with a Horovod built without MPI, or
  as srun's tasks without a PMI to find each other.

  A Horovod built with MPI takes MPI's controller whenever it is built in.
  A process alone, or started by `horovodrun --gloo`, keeps Gloo, as a
  Gloo-only build would: the same collectives and timeouts, and Horovod
  can start again in the same process (MPI cannot, once finished). These
  settings are read by hvd.init alone and not left in the environment, so
  the processes this one launches, and a later start in this one, choose
  for themselves.
  """
  chosen = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"} if (
      dynamic_process_sets) else {}
  if _started_by_mpi():
    if not hvd.mpi_built():
      raise UserError("an MPI launcher started this process, but this "
                      "Horovod was built without MPI, so each process "
                      "would train alone: launch with horovodrun, or build "
                      "Horovod with MPI (BUILD.md)")
  else:
    _check_srun_has_pmi()
    chosen.update({name: os.environ.get(name, "gloo")  # a user's wins
                   for name in ("HOROVOD_CONTROLLER",
                                "HOROVOD_CPU_OPERATIONS")})
  before = {name: os.environ.get(name) for name in chosen}
  for name, value in chosen.items():
    os.environ[name] = value
  try:
    hvd.init()
  finally:
    for name, value in before.items():
      if value is None:
        del os.environ[name]
      else:
        os.environ[name] = value


def _check_srun_has_pmi() -> None:
  """A UserError for srun's tasks that could not find each other."""
  tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))
  if "SLURM_STEP_ID" in os.environ and tasks > 1:
    raise UserError(f"srun started {tasks} tasks with no PMI (--mpi=none, "
                    "the default of many sites), so each would train "
                    "alone: launch with srun --mpi=pmix (srun --mpi=list "
                    "shows this cluster's) or through "
                    "scripts/slurm/train.sbatch")


def controller() -> str:
  """The controller Horovod runs on: "Gloo" or "MPI". A plain `horovodrun`
  picks MPI whenever Horovod has it (`horovodrun --gloo` picks Gloo), and
  what a frozen process does to the others depends on it (BUILD.md,
  "A process that stops answering")."""
  return "MPI" if hvd.mpi_enabled() else "Gloo"


def nccl_built() -> bool:
  """Whether Horovod has NCCL for GPU tensors (a GPU venv's build:
  BUILD.md, "GPUs"); without it, TensorFlow copies a GPU tensor to host
  memory for Gloo's or MPI's collective."""
  return bool(hvd.nccl_built())


# Said once at start-up on MPI's controller, where a guarantee differs.
MPI_FROZEN_PROCESS = (
    "Horovod runs on MPI's controller: a process that freezes holds up the "
    "others until Horovod's stall shutdown "
    "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS) or the scheduler's time limit, "
    "and no rank is named; on Gloo (horovodrun --gloo) they give up after "
    "its timeout and the engine names the silent rank "
    "(docs/scaling-out.md, \"Controllers\")")


def _started_by_mpi() -> bool:
  """Whether an MPI launcher started this process: Open MPI's mpirun, or
  srun (or another launcher) through PMI or PMIx."""
  return any(name in os.environ for name in
             ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"))


def hosts() -> tuple[int, int]:
  """(hosts, processes on this one): Horovod's cross and local sizes, as
  seen from this process (the same everywhere on hosts of equal slots)."""
  return hvd.cross_size(), hvd.local_size()


def start_timeline(path: str) -> None:
  """Horovod's timeline of its collectives, into `path` (a Chrome trace),
  from now on; the job must have been started with one (init's
  `timeline`)."""
  hvd.start_timeline(path)


def stop_timeline() -> None:
  hvd.stop_timeline()


def local_rank() -> int:
  """This process's rank among those on its host."""
  return hvd.local_rank()


def rank_and_size() -> tuple[int, int]:
  """This process's rank, and how many there are."""
  return hvd.rank(), hvd.size()


def is_chief() -> bool:
  """The one process that logs, writes files and owns checkpoints."""
  return hvd.rank() == 0
