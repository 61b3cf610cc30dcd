"""The harness every benchmark shares: launching its processes, variants
measured in interleaved rounds, a finished run's figures, and the machine
it ran on and its load.

A benchmark that compares variants (thread settings, cycle times, kernels,
revisions) runs them one at a time, in fresh processes, and each round
runs every variant once, in the reverse order every other round: a slow
spell of the machine then lands on every variant alike, and no variant
always follows the same one. Every figure is printed as it comes.
"""
import os
import re
import subprocess
import sys
from typing import Callable, Sequence

from engine.core import run_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")


def engine_env(**extra: str) -> dict:
  """The environment of a launched engine or bench process: this checkout
  on its path, TensorFlow's start-up chatter off, Open MPI let run as root
  (it refuses without both variables; Gloo ignores them), and `extra`
  variables."""
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO,
              OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
              **extra)


def launch(command: list[str], **env: str) -> str:
  """Runs `command` from the repository with `engine_env(**env)`; its
  standard output. A failure ends the benchmark with the command and the
  end of what it printed."""
  result = subprocess.run(command, cwd=REPO, env=engine_env(**env),
                          capture_output=True, text=True, check=False)
  if result.returncode:
    sys.exit(f"{' '.join(command)} failed (exit {result.returncode}):\n"
             f"{(result.stdout + result.stderr)[-3000:]}")
  return result.stdout


def variant(name: str) -> tuple[str, int, str, list[str]]:
  """A launched variant's name, RUNNER-N[-mpi][+FLAG...] (engine-2,
  engine-2-mpi+steps_per_call=4): its runner, its N processes, Horovod's
  controller (`gloo` unless `-mpi`) and its own flags (FLAG, without --)."""
  launched, *own_flags = name.split("+")
  runner, processes, *controller = launched.split("-")
  return runner, int(processes), controller[0] if controller else "gloo", \
      own_flags


def epochs(model_dir: str) -> list[dict]:
  """A finished run's epoch records, from its metrics.jsonl (the engine's,
  or a bench worker's written in its shape)."""
  records, _, _ = run_files.epochs_and_events(model_dir)
  if not records:
    sys.exit(f"{model_dir}: no epoch recorded in {run_files.METRICS_FILE}")
  return records


def measured(records: list[dict]) -> list[float]:
  """The images/s of every epoch after the first (its time includes
  tracing and warm-up)."""
  return [r["images_per_sec"] for r in records if r["epoch"] > 1]


def images_per_sec(model_dir: str) -> list[float]:
  """A finished run's measured images/s."""
  return measured(epochs(model_dir))


def _figures(variant: str, round_: int, found: list[float]) -> str:
  return (f"  round {round_ + 1} {variant}: "
          + ", ".join(f"{figure:.0f}" for figure in found))


def rounds(variants: Sequence[str], measure: Callable[[str, int], object],
           repeats: int, show: Callable[[str, int, object], str] = _figures
           ) -> dict[str, list]:
  """`measure(variant, round)` for every variant in each of `repeats`
  rounds, the order reversed every other round; every variant's results,
  one a round. Each is printed as it comes, as `show(variant, round,
  result)` says (by default a list of figures, after its round and
  variant)."""
  results = {variant: [] for variant in variants}
  for round_ in range(repeats):
    for variant in variants[::-1] if round_ % 2 else variants:
      found = measure(variant, round_)
      results[variant].append(found)
      print(show(variant, round_, found), flush=True)
  return results


def pooled(results: dict[str, list[list[float]]]) -> dict[str, list[float]]:
  """Each variant's figures of every round, in one list."""
  return {variant: [figure for found in per_round for figure in found]
          for variant, per_round in results.items()}


# The machine.


def cpu() -> str:
  """The CPU's model name, as lscpu gives it (KVM guests may give none)."""
  lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
  model = re.search(r"^Model name:\s*(.+)$", lscpu, re.MULTILINE)
  return model.group(1).strip() if model else "unknown"


def load() -> float:
  """The machine's load: the 1-minute load average, which counts a
  benchmark's own processes too. The benchmarks that print the load print
  this one beside their figures (against_keras before and after each run,
  allreduce_link after each), so a figure taken on a busy machine shows
  as one. throughput.py measures more: the cores kept busy by anything
  but its run, from /proc/stat."""
  return os.getloadavg()[0]
