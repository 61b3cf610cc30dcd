r"""The engine's training throughput at two git revisions, interleaved,
or at one revision with two sets of flags.

  .venv/bin/python -m bench.revisions --before=a738f32 [--after=HEAD] \
      --repeats=4 -- --model=cnn --epochs=4 --steps_per_epoch=100
  .venv/bin/python -m bench.revisions --before=HEAD \
      --before_flags=--nopool_first --after_flags=--pool_first \
      -- --flagfile=flags/fashion_mnist_94.cfg --epochs=3

  .venv/bin/python -m bench.revisions --before=82c6a49 --own_venvs \
      --seed_per_round --repeats=2 -- --flagfile=flags/fashion_mnist_fast.cfg

Each revision is checked out once (`git worktree`, under --work_dir) and
trained by the same command line (then --before_flags or --after_flags),
`horovodrun --gloo -np --processes` with this checkout's virtualenv, or
with each worktree's own (`--own_venvs`, set up by its own
scripts/setup.sh: for revisions whose pins differ, such as TensorFlow 2.15
against 2.21), one run at a time in interleaved rounds
(bench/interleaved.py); a run's figures are the images/s of its epochs
after the first, and its last epoch's deciding figure (val_accuracy for a
classifier). `--seed_per_round` trains round N with --seed=N-1, both
revisions alike. It prints each run's figures, each revision's median,
and after / before per round: a change that costs speed shows in every
round, the machine's drift in some.
"""
import os
import shutil
import statistics
import subprocess
import sys

from absl import app
from absl import flags

from bench import interleaved
from engine.core import run_files

FLAGS = flags.FLAGS
flags.DEFINE_string("before", "", "The revision to compare against.")
flags.DEFINE_string("after", "HEAD", "The revision measured against it.")
flags.DEFINE_string("before_flags", "", "Engine flags for the runs of "
                    "--before alone, after the command line's.")
flags.DEFINE_string("after_flags", "", "Engine flags for the runs of "
                    "--after alone, after the command line's.")
flags.DEFINE_integer("repeats", 4, "Rounds; each runs both revisions.",
                     lower_bound=1)
flags.DEFINE_integer("processes", 2, "Processes per run.", lower_bound=1)
flags.DEFINE_string("work_dir", "/tmp/bench_revisions",
                    "Where the revisions are checked out and run.")
flags.DEFINE_bool("own_venvs", False, "Run each revision with its own "
                  "worktree's .venv, set up by its scripts/setup.sh.")
flags.DEFINE_bool("seed_per_round", False, "Train round N with --seed=N-1.")


def checkout(revision: str) -> str:
  """A worktree of `revision` under --work_dir, using this virtualenv."""
  sha = subprocess.run(["git", "rev-parse", "--short", revision],
                       cwd=interleaved.REPO, check=True, text=True,
                       capture_output=True).stdout.strip()
  path = os.path.join(FLAGS.work_dir, sha)
  if not os.path.isdir(path):
    subprocess.run(["git", "worktree", "add", "--detach", path, sha],
                   cwd=interleaved.REPO, check=True, capture_output=True)
  return path


def virtualenv_bin(tree: str) -> str:
  """The directory of the python and horovodrun a revision runs with."""
  if not FLAGS.own_venvs:
    return os.path.dirname(interleaved.PYTHON)
  # Its own set-up, as a fresh clone of it would run (a second once done).
  subprocess.run(["bash", "scripts/setup.sh"], cwd=tree, check=True,
                 env=dict(os.environ, PYTHON="", VENV=""))
  return os.path.join(tree, ".venv", "bin")


def last_figure(model_dir: str) -> str:
  """The deciding figure of a finished run's last epoch, as `name value`."""
  records = interleaved.epochs(model_dir)
  name, _ = run_files.decided_by(records)
  return f"{name} {records[-1][name]:.4f}"


def main(argv):
  if not FLAGS.before:
    sys.exit("--before=REVISION is required")
  engine_flags = argv[1:]
  trees = {name: checkout(revision) for name, revision in
           (("before", FLAGS.before), ("after", FLAGS.after))}
  own_flags = {"before": FLAGS.before_flags.split(),
               "after": FLAGS.after_flags.split()}
  bins = {name: virtualenv_bin(tree) for name, tree in trees.items()}

  def measure(name: str, round_: int) -> list[float]:
    model_dir = os.path.join(FLAGS.work_dir, "runs", f"{name}_{round_}")
    shutil.rmtree(model_dir, ignore_errors=True)
    seed = [f"--seed={round_}"] if FLAGS.seed_per_round else []
    run = subprocess.run(
        [os.path.join(bins[name], "horovodrun"), "--gloo",
         "-np", str(FLAGS.processes),
         os.path.join(bins[name], "python"), "-m", "engine.train",
         "--progress=none",
         # Last, so that a recipe's --model_dir in a flagfile is overridden.
         *engine_flags, *own_flags[name], *seed, f"--model_dir={model_dir}"],
        cwd=trees[name], env=dict(interleaved.engine_env(),
                                  PYTHONPATH=trees[name]),
        capture_output=True, text=True)
    if run.returncode:
      errors = [line for line in run.stderr.splitlines() if "error:" in line]
      sys.exit(f"{name} ({trees[name]}) failed: "
               f"{errors[0] if errors else run.stderr[-500:]}")
    print(f"  round {round_ + 1} {name}: {last_figure(model_dir)}",
          flush=True)
    return interleaved.images_per_sec(model_dir)

  print(f"{FLAGS.before} {FLAGS.before_flags} (before) and {FLAGS.after} "
        f"{FLAGS.after_flags} (after), {FLAGS.processes} processes: "
        f"{' '.join(engine_flags)}")
  per_round = interleaved.rounds(list(trees), measure, FLAGS.repeats)
  for name, found in interleaved.pooled(per_round).items():
    print(f"{name}: median {statistics.median(found):.0f} img/s over "
          f"{len(found)} epochs")
  medians = {name: [statistics.median(found) for found in by_round]
             for name, by_round in per_round.items()}
  ratios = [after / before for before, after in
            zip(medians["before"], medians["after"])]
  print("after / before by round: " + ", ".join(f"{r:.3f}" for r in ratios)
        + f"; geometric mean {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
  app.run(main)
