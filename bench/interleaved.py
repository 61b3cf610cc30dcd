"""Whole runs of the engine in several configurations, interleaved.

For benchmarks that compare configurations of whole runs (elastic_overhead,
summary_cost, horovod_cycle): runs go one at a time, and each round runs
every configuration once, so a slow spell of the machine does not land on
one configuration only. A run's figures are images/s over all processes,
from its metrics.jsonl, epoch 1 (tracing, warm-up) left out.
"""
import contextlib
import json
import os
import statistics
import subprocess
import sys
from typing import Callable, Optional

from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")


def engine_env(checkout: str = REPO, **extra: str) -> dict:
  """The environment of a launched engine or bench process: `checkout` on
  its path, TensorFlow's start-up chatter off, and `extra` variables."""
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=checkout,
              **extra)


def define_flags(*, out_name: str, repeats: int,
                 before: Optional[str] = None) -> None:
  """The flags every such benchmark takes: rounds, run length, where runs
  go; and, for one that compares with the engine `before` something, the
  revision that was."""
  if before:
    flags.DEFINE_string("base", None, "Git revision of the engine before "
                        f"{before}.", required=True)
  flags.DEFINE_integer("repeats", repeats, "Rounds over the configurations.")
  flags.DEFINE_integer("epochs", 3, "Epochs per run (the first is left "
                       "out).")
  flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch.")
  flags.DEFINE_string("out_dir", os.path.join(REPO, "bench", "out", out_name),
                      "Run directories, and the base revision's worktree.")


@contextlib.contextmanager
def worktree(revision: str, out_dir: str):
  """A checkout of the engine at `revision` under `out_dir`, for as long as
  the context lasts: the "before" of a comparison."""
  path = os.path.join(out_dir, "base_worktree")
  subprocess.run(["git", "worktree", "add", "--force", "--detach", path,
                  revision], cwd=REPO, check=True, capture_output=True)
  try:
    yield path
  finally:
    subprocess.run(["git", "worktree", "remove", "--force", path], cwd=REPO,
                   check=False, capture_output=True)


def images_per_sec(command: list[str], *, cwd: str, model_dir: str,
                   env: dict) -> list[float]:
  """Runs `command` (an engine run writing `model_dir`) in checkout `cwd`;
  its images/s for each epoch after the first."""
  env = dict(env, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=cwd)
  subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line)["images_per_sec"] for line in f
            if "event" not in json.loads(line)][1:]


def compare(configs, run: Callable[[str, int, str], list[float]]
            ) -> dict[str, float]:
  """`run(config, round, base_checkout)` for each configuration, --repeats
  rounds over them, with the engine at --base checked out (without --base,
  `base_checkout` is this checkout); prints every run's figures as they
  come, then a table of medians, and returns them."""
  flag_values = flags.FLAGS
  os.makedirs(flag_values.out_dir, exist_ok=True)
  base = (worktree(flag_values.base, flag_values.out_dir)
          if "base" in flag_values else contextlib.nullcontext(REPO))
  with base as base_checkout:
    rates = _rounds(configs, flag_values.repeats,
                    lambda config, round_: run(config, round_, base_checkout))
  return _print_medians(rates)


def _rounds(configs, repeats: int,
            run: Callable[[str, int], list[float]]) -> dict[str, list[float]]:
  rates = {config: [] for config in configs}
  for round_ in range(repeats):
    for config in configs:
      epochs = run(config, round_)
      rates[config] += epochs
      print(f"round {round_ + 1} {config}: "
            + ", ".join(f"{rate:.0f}" for rate in epochs) + " img/s",
            flush=True)
  return rates


def _print_medians(rates: dict[str, list[float]]) -> dict[str, float]:
  medians = {c: statistics.median(r) for c, r in rates.items()}
  print(f"\n{'configuration':<13} {'median img/s':>13} {'min':>7} "
        f"{'max':>7} {'epochs':>7}")
  for config, figures in rates.items():
    print(f"{config:<13} {medians[config]:>13.0f} {min(figures):>7.0f} "
          f"{max(figures):>7.0f} {len(figures):>7}")
  return medians
