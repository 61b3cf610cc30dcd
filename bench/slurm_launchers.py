r"""Each SLURM launcher's start-up time, and what a requeue loses.

  .venv/bin/python -m bench.slurm_launchers [--repeats=3]

As root, on tests/simulated_slurm.py's real SLURM across two simulated
hosts: jobs of `sbatch -N 2 --ntasks-per-node=1 scripts/slurm/train.sbatch`
training the cnn (width 4) for one epoch on a generated Fashion-MNIST of
601 images, the launchers taking turns (horovodrun over ssh, mpirun, srun
with PMIx), the order reversed every other round. For each job:

  start-up   from the job's start (RUNNING, polled every 0.1 s) to the
             engine's first line after Horovod started on every rank
             ("N processes on ...")
  to epoch 1 from the job's start to the end of its first epoch

Then a requeue, as a preemptible queue does it: a 30-epoch job signalled
(`scancel --batch --signal=TERM`) after its first epoch; it saves, exits
and requeues itself, SLURM holds it for the credentials' lifetime
(simulated_slurm.CRED_EXPIRE_SECONDS; 120 s by default on a real cluster)
and starts it again. Lost: from the signal to the resumed run's "resuming
... at epoch" line, and to its next epoch's end.
"""
import datetime
import os
import re
import statistics
import tempfile
import time

from absl import app
from absl import flags

from tests import fixtures
from tests import simulated_hosts
from tests import simulated_slurm

FLAGS = flags.FLAGS
flags.DEFINE_integer("repeats", 3, "Rounds of the three launchers.")

LAUNCHERS = ("horovodrun", "mpirun", "srun")
ENGINE = [*fixtures.ENGINE_FLAGS, "--model=cnn", "--filters=4",
          "--batch_size=32", "--progress=none"]
# absl's log prefix: I1125 04:26:25.905321
_LOGGED = re.compile(r"[IWE](\d{4}) (\d\d:\d\d:\d\d\.\d{6}) ")


def logged_at(line: str) -> float:
  """The unix time of an absl log line (this year, local time)."""
  day, clock = _LOGGED.search(line).groups()
  stamp = datetime.datetime.strptime(
      f"{datetime.date.today().year}{day} {clock}", "%Y%m%d %H:%M:%S.%f")
  return stamp.timestamp()


def first_line_after(output: str, pattern: str, after: float = 0.0) -> float:
  for line in output.splitlines():
    if re.search(pattern, line) and _LOGGED.search(line):
      at = logged_at(line)
      if at >= after:
        return at
  raise ValueError(f"no line matching {pattern!r} after {after}")


def submit(slurm, out: str, launcher: str, data_dir: str, *engine):
  os.makedirs(out)
  return slurm.submit_training(
      out, [f"--data_dir={data_dir}", f"--model_dir={out}/run", *ENGINE,
            *engine], env=fixtures.engine_env(LAUNCHER=launcher))


def wait_running(slurm, job_id: int) -> float:
  while slurm.job(job_id).get("JobState") != "RUNNING":
    time.sleep(0.1)
  return time.time()


def read(path: str) -> str:
  with open(path, errors="replace") as f:
    return f.read()


def launcher_round(slurm, tmp: str, data_dir: str, launcher: str,
                   index: int) -> tuple[float, float]:
  out = os.path.join(tmp, f"{launcher}{index}")
  job_id = submit(slurm, out, launcher, data_dir, "--epochs=1")
  started = wait_running(slurm, job_id)
  fields = slurm.wait(job_id)
  output = read(f"{out}/job.out")
  if fields["JobState"] != "COMPLETED":
    raise RuntimeError(f"{launcher}: {fields['JobState']}\n{output[-2000:]}")
  return (first_line_after(output, r"\d+ processes on ") - started,
          first_line_after(output, r"epoch 1/1 ") - started)


def requeue(slurm, tmp: str, data_dir: str) -> tuple[float, float]:
  out = os.path.join(tmp, "requeued")
  job_id = submit(slurm, out, "horovodrun", data_dir, "--epochs=30")
  metrics = os.path.join(out, "run", "metrics.jsonl")
  while not os.path.exists(metrics) or not read(metrics).strip():
    time.sleep(0.1)
  signalled = time.time()
  slurm.run(["scancel", "--batch", "--signal=TERM", str(job_id)])
  fields = slurm.wait(job_id)
  output = read(f"{out}/job.out")
  if fields["JobState"] != "COMPLETED" or fields["Restarts"] != "1":
    raise RuntimeError(f"requeue: {fields['JobState']}\n{output[-2000:]}")
  resumed = first_line_after(output, r"resuming .* at epoch", signalled)
  next_epoch = first_line_after(output, r"epoch \d+/30 ", resumed)
  return resumed - signalled, next_epoch - signalled


def main(argv):
  del argv
  reason = simulated_slurm.unavailable()
  if reason:
    raise app.UsageError(reason)
  tmp = tempfile.mkdtemp(prefix="slurm_launchers_")
  data_dir = fixtures.write_fashion_mnist(os.path.join(tmp, "data"))
  figures = {launcher: [] for launcher in LAUNCHERS}
  with simulated_hosts.SimulatedHosts(2) as hosts, \
      simulated_slurm.SimulatedSlurm(hosts) as slurm:
    for index in range(FLAGS.repeats):
      order = LAUNCHERS if index % 2 == 0 else LAUNCHERS[::-1]
      for launcher in order:
        figures[launcher].append(
            launcher_round(slurm, tmp, data_dir, launcher, index))
        print(f"round {index + 1} {launcher}: start-up "
              f"{figures[launcher][-1][0]:.1f} s, to epoch 1 "
              f"{figures[launcher][-1][1]:.1f} s", flush=True)
    lost = requeue(slurm, tmp, data_dir)
  for launcher, runs in figures.items():
    print(f"{launcher}: start-up median "
          f"{statistics.median(r[0] for r in runs):.1f} s "
          f"({', '.join(f'{r[0]:.1f}' for r in runs)}); to epoch 1 median "
          f"{statistics.median(r[1] for r in runs):.1f} s "
          f"({', '.join(f'{r[1]:.1f}' for r in runs)})")
  print(f"requeue (SLURM's hold {simulated_slurm.CRED_EXPIRE_SECONDS} s): "
        f"signal to resumed {lost[0]:.1f} s, to the next epoch's end "
        f"{lost[1]:.1f} s")


if __name__ == "__main__":
  app.run(main)
