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
import os
import shutil

from absl import app
from absl import flags

from bench import interleaved

FLAGS = flags.FLAGS
interleaved.define_flags(before="elastic training", out_name="elastic",
                         repeats=3)
flags.DEFINE_integer("commit_every_steps", 50, "The elastic runs' commits.")

CONFIGS = ("base", "static", "two_names", "elastic")
HOSTS = ("localhost", "127.0.0.1")


def run(config: str, round_: int, base_dir: str) -> list[float]:
  """One run; its images/s for each epoch after the first."""
  model_dir = os.path.join(FLAGS.out_dir, f"{config}_{round_}")
  shutil.rmtree(model_dir, ignore_errors=True)
  engine = [interleaved.PYTHON, "-m", "engine.train",
            f"--model_dir={model_dir}", f"--epochs={FLAGS.epochs}",
            f"--steps_per_epoch={FLAGS.steps_per_epoch}", "--progress=none"]
  launcher = [interleaved.HOROVODRUN, "-np", "2"]
  env = dict(os.environ)
  if config == "two_names":
    launcher += ["-H", ",".join(f"{host}:1" for host in HOSTS)]
  if config == "elastic":
    hosts = os.path.join(FLAGS.out_dir, "hosts")
    with open(hosts, "w") as f:
      f.writelines(f"{host}:1\n" for host in HOSTS)
    launcher += ["--min-np", "1", "--max-np", "2", "--host-discovery-script",
                 os.path.join(interleaved.REPO, "scripts",
                              "discover_hosts.sh"),
                 "--network-interface", "lo"]
    engine += ["--elastic",
               f"--commit_every_steps={FLAGS.commit_every_steps}"]
    env["ELASTIC_HOSTS"] = hosts
  return interleaved.images_per_sec(
      launcher + engine, cwd=base_dir if config == "base" else
      interleaved.REPO, model_dir=model_dir, env=env)


def main(argv):
  del argv
  medians = interleaved.compare(CONFIGS, run)
  print(f"\nstatic / base:         {medians['static'] / medians['base']:.3f}")
  print(f"two_names / static:    "
        f"{medians['two_names'] / medians['static']:.3f}")
  print(f"elastic / two_names:   "
        f"{medians['elastic'] / medians['two_names']:.3f} "
        f"(a commit every {FLAGS.commit_every_steps} steps)")


if __name__ == "__main__":
  app.run(main)
