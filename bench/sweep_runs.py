r"""A sweep's best flags against the recipe it searched, and a run against
the same run as a sweep's trial; interleaved rounds, 2 processes.

  .venv/bin/python -m engine.sweep --study_dir=runs/sweeps/none --best \
      > /tmp/best.cfg
  .venv/bin/python -m bench.sweep_runs --mode=best --best=/tmp/best.cfg \
      [--repeats=2] -- --epochs=10 --steps_per_epoch=0
  .venv/bin/python -m bench.sweep_runs --mode=trial [--repeats=2] -- \
      --flagfile=flags/fashion_mnist_fast.cfg --epochs=4 \
      --mixed_precision=bfloat16

--mode=best: the best trial's flagfile (`engine.sweep --best`), then the
flags after `--` (to undo what made the trials short), against
flags/fashion_mnist_fast.cfg with --best's precision; round r with
--seed=r-1 for both. --mode=trial: the flags after `--` as a plain
`horovodrun ... engine.train` against the same flags as the one trial of
a fresh sweep (`engine.sweep --pruner=none --trials=1`, whose space draws
the fast recipe's own --base_lr, so the trial trains exactly the plain
run): what reporting to the study costs an epoch. Each run prints its
wall seconds, training seconds (the last record's cumulative_seconds),
its epochs' seconds, the last epoch's val_accuracy (Fashion-MNIST's test
split) and the 1-minute load average at its start and end.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from bench import interleaved

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", "best", ["best", "trial"], "What to compare.")
flags.DEFINE_string("best", "", "--mode=best: the best trial's flagfile.")
flags.DEFINE_string("recipe", "flags/fashion_mnist_fast.cfg",
                    "--mode=best: the recipe the sweep searched.")
flags.DEFINE_integer("repeats", 2, "Rounds; each runs both.", lower_bound=1)
flags.DEFINE_string("work_dir", "bench/out/sweep_runs",
                    "Where the runs and studies are written.")

# The trial's space: one value, the fast recipe's own.
TRIAL_SPACE = "base_lr: {choice: [0.1]}\n"


def load() -> float:
  with open("/proc/loadavg") as f:
    return float(f.read().split()[0])


def epoch_records(model_dir: str) -> list[dict]:
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if "event" not in r]


def precision(flagfile: str) -> list[str]:
  with open(flagfile) as f:
    given = [line.strip() for line in f
             if line.startswith("--mixed_precision=")]
  return given[-1:]


def run(command: list[str], name: str) -> list[float]:
  """Runs `command`: its wall seconds, and the load at its start and end."""
  began_load, began = load(), time.monotonic()
  done = subprocess.run(command, cwd=interleaved.REPO,
                        env=interleaved.engine_env(), capture_output=True,
                        text=True, check=False)
  wall = time.monotonic() - began
  if done.returncode:
    errors = [l for l in (done.stdout + done.stderr).splitlines()
              if "error" in l]
    sys.exit(f"{name} failed: {errors[-1] if errors else done.stderr[-800:]}")
  return [wall, began_load, load()]


def main(argv):
  extra = argv[1:]
  work_dir = os.path.join(interleaved.REPO, FLAGS.work_dir)
  os.makedirs(work_dir, exist_ok=True)
  trainer = [interleaved.HOROVODRUN, "--gloo", "-np", "2",
             interleaved.PYTHON, "-m", "engine.train"]
  if FLAGS.mode == "best":
    if not FLAGS.best:
      sys.exit("--mode=best needs --best=FLAGFILE (engine.sweep --best)")
    variants = {
        "best": [f"--flagfile={os.path.abspath(FLAGS.best)}", *extra],
        "recipe": [f"--flagfile={FLAGS.recipe}",
                   *precision(FLAGS.best)]}
  else:
    space = os.path.join(work_dir, "space.yaml")
    with open(space, "w") as f:
      f.write(TRIAL_SPACE)
    variants = {"plain": list(extra), "trial": list(extra)}

  def measure(name: str, round_: int) -> list[float]:
    where = os.path.join(work_dir, f"{name}_{round_}")
    shutil.rmtree(where, ignore_errors=True)
    flags_ = [*variants[name], f"--seed={round_}"]
    if name == "trial":
      command = [interleaved.PYTHON, "-m", "engine.sweep",
                 f"--space={space}", "--trials=1", f"--study_dir={where}",
                 "--pruner=none", "--sampler=random", "--", *flags_]
      model_dir = os.path.join(where, "trials", "0000")
    else:
      command = [*trainer, *flags_, f"--model_dir={where}"]
      model_dir = where
    wall, began_load, end_load = run(command, name)
    records = epoch_records(model_dir)
    seconds = [r["epoch_seconds"] for r in records]
    print(f"  round {round_ + 1} {name} (seed {round_}): wall {wall:.0f} s, "
          f"training {records[-1]['cumulative_seconds']:.1f} s, epochs "
          + " ".join(f"{s:.1f}" for s in seconds)
          + f" (median of 2nd on {statistics.median(seconds[1:]):.2f}), "
          f"val_accuracy {records[-1]['val_accuracy']:.4f}, "
          f"load {began_load:.2f} -> {end_load:.2f}", flush=True)
    return seconds[1:]

  print(f"{FLAGS.mode}: " + "; ".join(
      f"{name}: {' '.join(v)}" for name, v in variants.items()), flush=True)
  figures = interleaved.rounds(list(variants), measure, FLAGS.repeats)
  for name, found in figures.items():
    print(f"{name}: median epoch (2nd on) {statistics.median(found):.2f} s "
          f"over {len(found)} epochs")


if __name__ == "__main__":
  app.run(main)
