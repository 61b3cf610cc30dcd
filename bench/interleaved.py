"""Launching benchmark processes, and variants measured in interleaved rounds.

A benchmark that compares variants (thread settings, cycle times, kernels)
runs them one at a time, in fresh processes, and each round runs every
variant once, in the reverse order every other round: a slow spell of the
machine then lands on every variant alike, and no variant always follows
the same one. Every figure is printed as it comes.
"""
import json
import os
import subprocess
import sys
from typing import Callable, Sequence

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


def images_per_sec(model_dir: str) -> list[float]:
  """A finished engine run's images/s for each epoch after the first
  (tracing, warm-up), from its metrics.jsonl."""
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r["images_per_sec"] for r in records if "event" not in r][1:]


def rounds(variants: Sequence[str], measure: Callable[[str, int], list[float]],
           repeats: int) -> dict[str, list[float]]:
  """`measure(variant, round)` for every variant in each of `repeats`
  rounds, the order reversed every other round; every variant's figures."""
  figures = {variant: [] for variant in variants}
  for round_ in range(repeats):
    for variant in variants[::-1] if round_ % 2 else variants:
      found = measure(variant, round_)
      figures[variant] += found
      print(f"  round {round_ + 1} {variant}: "
            + ", ".join(f"{figure:.0f}" for figure in found), flush=True)
  return figures
