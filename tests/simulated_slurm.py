r"""A real SLURM on the simulated hosts: munge, slurmctld and a slurmd each.

tests/simulated_hosts.py gives each host its network, hostname and sshd;
this starts Debian's SLURM on them, as a small cluster would run it: one
munged (authentication) whose socket every host shares, slurmctld on the
first host, and one slurmd per host, each known to the others by its name
and address. Its configuration is a cluster's plainest: `auth/munge`,
`proctrack/linuxproc`, `task/none`, no accounting, and the site default
`MpiDefault=none` unless told otherwise, which is what makes a job's
`srun` choose a PMI itself (scripts/slurm/train.sbatch).

Every file (slurm.conf, the munge key, state, spool, logs) lives in one
temporary directory named by SLURM_CONF for every command run on a host;
nothing under /etc, /var or /run is touched. Everything is stopped and
removed at the end, also when a test fails.

By hand (as root), sbatch on the first host of two:

  .venv/bin/python tests/simulated_slurm.py --hosts=2 -- \
      sbatch -N 2 --wrap=hostname
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

from tests import simulated_hosts
from tests import timeouts

SLURM_DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")
TRAIN_SBATCH = os.path.join(simulated_hosts.REPO, "scripts", "slurm",
                            "train.sbatch")
# How long a job's credentials live, which is also how long SLURM holds a
# requeued job before it may start again (120 s by default): short, for
# tests that requeue. Starting it sooner by hand (scontrol update
# StartTime=now) can race the revoked credential of its first run.
CRED_EXPIRE_SECONDS = 10


def unavailable() -> Optional[str]:
  """Why a SLURM cannot be simulated here, or None if it can."""
  for daemon in SLURM_DAEMONS:
    if not shutil.which(daemon):
      return (f"a simulated SLURM needs `{daemon}`: apt-get install "
              "slurmctld slurmd slurm-client munge (scripts/setup.sh does, "
              "as root)")
  return simulated_hosts.unavailable()


class SimulatedSlurm:
  """`with SimulatedSlurm(hosts) as slurm: slurm.submit([...])`, on the
  hosts of a running simulated_hosts.SimulatedHosts."""

  def __init__(self, hosts: simulated_hosts.SimulatedHosts, *,
               mpi_default: str = "none"):
    self.hosts = hosts
    self._mpi_default = mpi_default
    self._daemons = []
    self._dir = None

  @property
  def conf(self) -> str:
    return os.path.join(self._dir, "slurm.conf")

  def env(self, **extra) -> dict:
    """The environment of a command that talks to this SLURM."""
    return dict(os.environ, SLURM_CONF=self.conf, **extra)

  def __enter__(self) -> "SimulatedSlurm":
    try:
      self._dir = tempfile.mkdtemp(prefix="simulated_slurm_")
      self._start_munge()
      self._write_conf()
      self._start(["slurmctld", "-D", "-c", "-i"], host=0)
      for i, name in enumerate(self.hosts.names):
        # The hosts share the machine's /tmp, where each slurmd keeps its
        # steps' PMIx directories, named by job and step alone: each gets
        # a directory of its own on TmpFS's path.
        os.makedirs(f"{self._dir}/spool.{name}")
        os.makedirs(f"{self._dir}/tmp.{name}")
        self._start(["sh", "-c", f"mount --bind {self._dir}/tmp.{name} "
                     f"{self._dir}/tmp && exec slurmd -D -N {name}"], host=i)
      self._wait_for_nodes()
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def __exit__(self, *exc_info) -> None:
    for daemon in reversed(self._daemons):
      simulated_hosts.kill_group(daemon)
    self._daemons = []
    if self._dir:
      shutil.rmtree(self._dir, ignore_errors=True)

  def run(self, command: list[str], *, host: int = 0, env=None,
          timeout: float = 60) -> subprocess.CompletedProcess:
    """`command` on a host, talking to this SLURM; `timeout` in nominal
    seconds (tests/timeouts.py)."""
    return self.hosts.run(command, host=host, env=env or self.env(),
                          timeout=timeout)

  def start(self, command: list[str], *, host: int = 0, env=None,
            **popen_args) -> subprocess.Popen:
    """`command` on a host in the background, talking to this SLURM."""
    return self.hosts.start(command, host=host, env=env or self.env(),
                            **popen_args)

  def submit(self, args: list[str], *, env=None) -> int:
    """sbatch with `args` on the first host; the job's id."""
    result = self.run(["sbatch", "--parsable", *args], env=env)
    if result.returncode:
      raise RuntimeError(f"sbatch {' '.join(args)}: {result.stderr.strip()}")
    return int(result.stdout.strip().split(";")[0])

  def submit_training(self, out: str, engine_args: list[str], *,
                      env: dict) -> int:
    """scripts/slurm/train.sbatch with `engine_args` on every host, a
    process each, its output in OUT/job.out; the job's id. `env` is the
    job's environment (LAUNCHER, PROGRAM, ...), to which this adds this
    SLURM, the hosts' interface, and Open MPI's consent to run as root
    (asked for twice)."""
    env = dict(env, SLURM_CONF=self.conf, IFACE=simulated_hosts.INTERFACE,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return self.submit(
        ["-N", str(len(self.hosts.names)), "--ntasks-per-node=1",
         f"--chdir={simulated_hosts.REPO}", f"--output={out}/job.out",
         TRAIN_SBATCH, *engine_args], env=env)

  def job(self, job_id: int) -> dict:
    """`scontrol show job`'s fields, as strings."""
    shown = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)])
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))

  def wait(self, job_id: int, *, states=("COMPLETED", "FAILED", "CANCELLED",
                                         "TIMEOUT", "NODE_FAIL",
                                         "PREEMPTED", "OUT_OF_MEMORY"),
           timeout: float = 300) -> dict:
    """Until the job reaches one of `states`, for `timeout` nominal seconds
    (tests/timeouts.py); its fields then."""
    seconds = timeouts.bound(timeout)
    deadline = time.monotonic() + seconds
    while True:
      fields = self.job(job_id)
      if fields.get("JobState") in states:
        return fields
      if time.monotonic() > deadline:
        raise TimeoutError(f"job {job_id} still {fields.get('JobState')} "
                           f"after {seconds:.0f} s: {self.logs()}")
      time.sleep(0.5)

  def logs(self, lines: int = 5) -> str:
    """The daemons' last lines, for a failing test's message."""
    tails = []
    for name in sorted(os.listdir(self._dir)):
      if name.endswith(".log"):
        with open(os.path.join(self._dir, name), errors="replace") as f:
          tails.append(f"{name}: {''.join(f.readlines()[-lines:])}")
    return "\n".join(tails)

  # Set-up.

  def _start_munge(self) -> None:
    d = self._dir
    key = os.path.join(d, "munge.key")
    with open(key, "wb") as f:
      f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    # As root, with --force: the key and socket are root's, in our
    # directory; a system munged would run as user munge from /etc/munge.
    self._daemons.append(subprocess.Popen(
        ["munged", "--foreground", "--force", f"--socket={d}/munge.socket",
         f"--key-file={key}", f"--log-file={d}/munged.log",
         f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True))
    deadline = time.monotonic() + timeouts.bound(10)
    while not os.path.exists(f"{d}/munge.socket"):
      if time.monotonic() > deadline:
        raise RuntimeError(f"munged did not start: {self.logs()}")
      time.sleep(0.1)

  def _write_conf(self) -> None:
    d = self._dir
    cpus = os.cpu_count() or 1
    nodes = "".join(
        f"NodeName={name} NodeAddr={simulated_hosts.SUBNET}.{i + 1} "
        f"CPUs={cpus} State=UNKNOWN\n"
        for i, name in enumerate(self.hosts.names))
    with open(self.conf, "w") as f:
      f.write(f"""ClusterName=simulated
SlurmctldHost={self.hosts.names[0]}({simulated_hosts.SUBNET}.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket,cred_expire={CRED_EXPIRE_SECONDS}
CredType=cred/munge
MpiDefault={self._mpi_default}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation={d}/state
TmpFS={d}/tmp
SlurmdSpoolDir={d}/spool.%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
{nodes}PartitionName=simulated Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    # Which cgroup version is not detected: `ip netns exec` mounts a /sys
    # of its own, without the machine's cgroups, and with
    # proctrack/linuxproc and task/none no job uses them.
    with open(os.path.join(d, "cgroup.conf"), "w") as f:
      f.write("CgroupPlugin=cgroup/v1\n")
    os.makedirs(f"{d}/state")
    os.makedirs(f"{d}/tmp")

  def _start(self, command: list[str], *, host: int) -> None:
    full = self.hosts.on_host(host, command)
    self._daemons.append(subprocess.Popen(
        full, env=self.env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True))

  def _wait_for_nodes(self, timeout: float = 30) -> None:
    seconds = timeouts.bound(timeout)
    deadline = time.monotonic() + seconds
    while True:
      shown = self.run(["sinfo", "--noheader", "--format=%T"], timeout=10)
      states = shown.stdout.split()
      if shown.returncode == 0 and states and all(
          s == "idle" for s in states):
        return
      if time.monotonic() > deadline:
        raise RuntimeError(f"SLURM's nodes not idle after {seconds:.0f} s "
                           f"({shown.stdout.strip() or shown.stderr.strip()})"
                           f": {self.logs()}")
      time.sleep(0.3)


def _run_on_first_host(count: int, command: list[str], link: str):
  with simulated_hosts.SimulatedHosts(count) as hosts, \
      SimulatedSlurm(hosts) as slurm:
    hosts.shape(link)
    return slurm.run(command, timeout=600)


if __name__ == "__main__":
  sys.exit(simulated_hosts.command_line_main(
      __doc__, "simulated_slurm", unavailable, _run_on_first_host))
