r"""What elastic training costs: the static path before and after it, and
--elastic itself.

Four configurations of the engine, 2 processes on real Fashion-MNIST, run
one at a time and interleaved over --repeats rounds, so that a slow spell of
the machine does not land on one configuration only:

  base       the engine at git revision --base (checked out in a worktree
             under --out_dir): the static path before elastic training
  static     this checkout, without --elastic
  two_names  the same, launched on two names of this machine
             (-H localhost:1,127.0.0.1:1), as the elastic job is
  elastic    this checkout with --elastic --commit_every_steps=N, under
             horovodrun's elastic launch on those two names

Two names are two hosts to Horovod, one process each, so each process takes
all the machine's cores where the one-host launches split them: two_names
against static is that placement's cost, elastic against two_names the cost
of the elastic machinery itself.

Each figure is images/s over all processes, from the runs' metrics.jsonl,
epoch 1 (tracing, warm-up) left out.

  .venv/bin/python -m bench.elastic_overhead --base=654f66f
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")

FLAGS = flags.FLAGS
flags.DEFINE_string("base", None, "Git revision of the engine before "
                    "elastic training.", required=True)
flags.DEFINE_integer("repeats", 3, "Rounds of the three configurations.")
flags.DEFINE_integer("epochs", 3, "Epochs per run (the first is left out).")
flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch.")
flags.DEFINE_integer("commit_every_steps", 50, "The elastic runs' commits.")
flags.DEFINE_string("out_dir", os.path.join(REPO, "bench", "out", "elastic"),
                    "Run directories, and the base revision's worktree.")

CONFIGS = ("base", "static", "two_names", "elastic")
HOSTS = ("localhost", "127.0.0.1")


def run(config: str, round_: int, base_dir: str) -> list[float]:
  """One run; its images/s for each epoch after the first."""
  model_dir = os.path.join(FLAGS.out_dir, f"{config}_{round_}")
  shutil.rmtree(model_dir, ignore_errors=True)
  engine = [PYTHON, "-m", "engine.train", f"--model_dir={model_dir}",
            f"--epochs={FLAGS.epochs}",
            f"--steps_per_epoch={FLAGS.steps_per_epoch}", "--progress=none"]
  launcher = [HOROVODRUN, "-np", "2"]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  if config == "two_names":
    launcher += ["-H", ",".join(f"{host}:1" for host in HOSTS)]
  if config == "elastic":
    hosts = os.path.join(FLAGS.out_dir, "hosts")
    with open(hosts, "w") as f:
      f.writelines(f"{host}:1\n" for host in HOSTS)
    launcher += ["--min-np", "1", "--max-np", "2", "--host-discovery-script",
                 os.path.join(REPO, "scripts", "discover_hosts.sh"),
                 "--network-interface", "lo"]
    engine += ["--elastic",
               f"--commit_every_steps={FLAGS.commit_every_steps}"]
    env["ELASTIC_HOSTS"] = hosts
  cwd = base_dir if config == "base" else REPO
  env["PYTHONPATH"] = cwd
  subprocess.run(launcher + engine, cwd=cwd, env=env, check=True,
                 capture_output=True)
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line)["images_per_sec"] for line in f][1:]


def main(argv):
  del argv
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  base_dir = os.path.join(FLAGS.out_dir, "base_worktree")
  subprocess.run(["git", "worktree", "add", "--force", "--detach", base_dir,
                  FLAGS.base], cwd=REPO, check=True, capture_output=True)
  rates = {config: [] for config in CONFIGS}
  try:
    for round_ in range(FLAGS.repeats):
      for config in CONFIGS:
        rates[config] += run(config, round_, base_dir)
        print(f"round {round_ + 1} {config}: "
              f"{statistics.median(rates[config]):.0f} img/s so far",
              flush=True)
  finally:
    subprocess.run(["git", "worktree", "remove", "--force", base_dir],
                   cwd=REPO, check=False, capture_output=True)
  medians = {c: statistics.median(r) for c, r in rates.items()}
  print(f"\n{'configuration':<10} {'median img/s':>13} {'min':>7} "
        f"{'max':>7} {'epochs':>7}")
  for config in CONFIGS:
    print(f"{config:<10} {medians[config]:>13.0f} {min(rates[config]):>7.0f} "
          f"{max(rates[config]):>7.0f} {len(rates[config]):>7}")
  print(f"\nstatic / base:         {medians['static'] / medians['base']:.3f}")
  print(f"two_names / static:    "
        f"{medians['two_names'] / medians['static']:.3f}")
  print(f"elastic / two_names:   "
        f"{medians['elastic'] / medians['two_names']:.3f} "
        f"(a commit every {FLAGS.commit_every_steps} steps)")


if __name__ == "__main__":
  app.run(main)
