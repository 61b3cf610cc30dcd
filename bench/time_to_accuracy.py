r"""Time to accuracy: the engine's fastest recipe against its rivals.

Runs, in interleaved rounds (bench/interleaved.py), on real Fashion-MNIST
with --processes:
- `engine`: the engine with the recipe (--recipe, a flagfile);
- `engine_lab`: the engine with the recipe's model, data and epochs but the
  Horovod lab's method: SGD with momentum 0.9, the rate 0.01 scaled
  linearly with the processes, 5 warmup epochs, then x0.1 at epochs 15, 25
  and 35, float32, no label smoothing, no weight average, no flipped views;
- `keras_fit`: Keras `model.fit` with Horovod's callbacks given the whole
  recipe (bench/keras_recipe.py: same model, batches, precision, schedule,
  label smoothing, weight average, evaluation);
- `baseline` (when named in --configs): the engine with another recipe
  (--baseline), to compare recipes on one machine; the table then gives,
  per seed, the recipe's seconds to the last target over the baseline's.

Round r gives every configuration seed r, so the rounds are repeats over
seeds as well as over the machine's moods. Each run's figures come from its
metrics.jsonl, read by engine.runs: the seconds (`cumulative_seconds`:
training, evaluation, saves) at which the test accuracy first reached each
of --targets, the final accuracy, the median images/s, and beside them the
whole process's wall time (start-up and the engine's export included).

  .venv/bin/python -m bench.time_to_accuracy \
    --recipe=flags/fashion_mnist_fast.cfg --repeats=2

prints every run as it ends, then the table; writes every run's figures to
bench/out/time_to_accuracy/runs.json, the table into bench/RESULTS.md
(between its markers) and the curves to bench/time_to_accuracy.png.
`--report` redraws table, PNG and RESULTS.md from runs.json (of an
interrupted invocation too) without running anything.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import time

from absl import app
from absl import flags

from bench import interleaved
from engine import runs
from engine.core import run_files

RESULTS = os.path.join(interleaved.REPO, "bench", "RESULTS.md")
BEGIN, END = "<!-- time_to_accuracy -->", "<!-- /time_to_accuracy -->"

# The Horovod lab's method (shared/seeds), as engine flags.
LAB_METHOD = ["--optimizer=sgd", "--momentum=0.9", "--nonesterov",
              "--base_lr=0.01", "--lr_scaling=linear", "--warmup_epochs=5",
              "--lr_schedule=step", "--lr_decay_epochs=15,25,35",
              "--lr_decay_factor=0.1", "--mixed_precision=none",
              "--label_smoothing=0", "--ema_decay=0", "--noeval_flip",
              "--eval_shift=0"]
# Each configuration's module, and its flags over the recipe's.
CONFIGS = {
    "engine": ("engine.train", []),
    "engine_lab": ("engine.train", LAB_METHOD),
    "keras_fit": ("bench.keras_recipe", []),
    "baseline": ("engine.train", []),
}
DEFAULT_CONFIGS = ["engine", "engine_lab", "keras_fit"]

FLAGS = flags.FLAGS
flags.DEFINE_string("recipe", "flags/fashion_mnist_fast.cfg",
                    "The engine's recipe (a flagfile) all three train by.")
flags.DEFINE_string("baseline", "flags/fashion_mnist_94.cfg",
                    "The recipe the `baseline` configuration trains by.")
flags.DEFINE_list("configs", DEFAULT_CONFIGS, "Which configurations to run.")
flags.DEFINE_integer("repeats", 2, "Rounds over the configurations; round r "
                     "uses --seed=r.")
flags.DEFINE_integer("processes", 2, "Processes per run (horovodrun -np).")
flags.DEFINE_list("targets", ["0.90", "0.92", "0.93", "0.94"],
                  "Test accuracies whose first arrival is timed.")
flags.DEFINE_list("extra", [], "More engine flags for every run, e.g. "
                  "--extra=--epochs=2 for a quick check.")
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench",
                                            "out", "time_to_accuracy"),
                    "Run directories and runs.json.")
flags.DEFINE_string("plot", os.path.join(interleaved.REPO, "bench",
                                         "time_to_accuracy.png"),
                    "PNG of test accuracy against seconds.")
flags.DEFINE_bool("write_results", True, "Write the table into "
                  "bench/RESULTS.md.")
flags.DEFINE_bool("report", False, "Only redraw the table and PNG from "
                  "--out_dir's runs.json.")


def main(argv):
  del argv
  runs_path = os.path.join(FLAGS.out_dir, "runs.json")
  if FLAGS.report:
    with open(runs_path) as f:
      results = json.load(f)
  else:
    unknown = set(FLAGS.configs) - set(CONFIGS)
    if unknown:
      raise app.UsageError(f"unknown --configs {sorted(unknown)}; choose "
                           f"from {sorted(CONFIGS)}")
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    results = []

    def measure(config: str, seed: int) -> dict:
      results.append(_run(config, seed=seed))
      with open(runs_path, "w") as f:  # every run kept as it ends
        json.dump(results, f, indent=1)
      return results[-1]

    # Round r is seed r, for every configuration.
    interleaved.rounds(FLAGS.configs, measure, FLAGS.repeats,
                       show=lambda config, seed, run: _run_line(run))
  table = _table(results)
  print("\n" + table)
  _plot(results)
  if FLAGS.write_results:
    _write_results(table)


def _run(config: str, *, seed: int) -> dict:
  """One whole run; its figures."""
  model_dir = os.path.join(FLAGS.out_dir, f"{config}-seed{seed}")
  shutil.rmtree(model_dir, ignore_errors=True)  # a fresh run, not a resume
  module, overrides = CONFIGS[config]
  recipe = FLAGS.baseline if config == "baseline" else FLAGS.recipe
  command = [interleaved.HOROVODRUN, "--gloo", "-np", str(FLAGS.processes),
             interleaved.PYTHON, "-m", module, f"--flagfile={recipe}",
             *overrides, *FLAGS.extra, f"--seed={seed}",
             f"--model_dir={model_dir}", "--progress=none"]
  started = time.perf_counter()
  # os.environ carries engine/__init__.py's settings (imported with
  # engine.runs), so Keras gets the engine's oneDNN kernels too.
  finished = subprocess.run(command, cwd=interleaved.REPO,
                            capture_output=True, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  wall = time.perf_counter() - started
  with open(model_dir + ".log", "w") as f:
    f.write(" ".join(command) + "\n" + finished.stdout + finished.stderr)
  if finished.returncode:
    raise SystemExit(f"{config} seed {seed} failed (exit "
                     f"{finished.returncode}); see {model_dir}.log")
  records = runs.read_run(model_dir).records
  return {"config": config, "seed": seed, "wall_seconds": wall,
          "command": command,
          "curve": [(r["cumulative_seconds"], r["val_accuracy"])
                    for r in records if r.get("val_accuracy") is not None],
          **run_files.summary(records)}


def _seconds_to(run: dict, target: float):
  return next((seconds for seconds, accuracy in run["curve"]
               if accuracy >= target), None)


def _run_line(run: dict) -> str:
  reached = ", ".join(f"{target}: {_seconds(_seconds_to(run, float(target)))}"
                      for target in FLAGS.targets)
  return (f"{run['config']} seed {run['seed']}: final "
          f"{run['final_val_accuracy']:.4f}, {reached} s; "
          f"{run['images_per_sec']:.0f} img/s, "
          f"wall {run['wall_seconds']:.0f} s")


def _seconds(value) -> str:
  return "-" if value is None else f"{value:.0f}"


def _table(results: list[dict]) -> str:
  """Every run a row, grouped by configuration: no best-of."""
  head = ("| configuration | seed | " + " | ".join(
      f"s to {float(t):.0%}" for t in FLAGS.targets)
      + " | final accuracy | img/s | epochs | wall s |")
  rows = [head, "|" + "---|" * (head.count("|") - 1)]
  for config in CONFIGS:
    for run in (r for r in results if r["config"] == config):
      rows.append(
          f"| {config} | {run['seed']} | " + " | ".join(
              _seconds(_seconds_to(run, float(t))) for t in FLAGS.targets)
          + f" | {run['final_val_accuracy']:.4f} | "
          f"{run['images_per_sec']:.0f} | {run['epochs']} | "
          f"{run['wall_seconds']:.0f} |")
  medians = []
  for config in CONFIGS:
    finals = [r["final_val_accuracy"] for r in results
              if r["config"] == config]
    if finals:
      medians.append(f"{config} {statistics.median(finals):.4f}")
  return "\n".join(rows) + "\n\nMedian final accuracy: " + ", ".join(
      medians) + "." + _against_baseline(results)


def _against_baseline(results: list[dict]) -> str:
  """Per seed, the recipe's seconds to the last target over the
  baseline's ("-" where either never reached it)."""
  target = float(FLAGS.targets[-1])
  seconds = {(r["config"], r["seed"]): _seconds_to(r, target)
             for r in results}
  ratios = []
  for seed in sorted({seed for _, seed in seconds}):
    if ("engine", seed) in seconds and ("baseline", seed) in seconds:
      engine, baseline = seconds["engine", seed], seconds["baseline", seed]
      ratios.append(f"seed {seed} " + (f"{engine / baseline:.2f}"
                                       if engine and baseline else "-"))
  if not ratios:
    return ""
  return (f"\nSeconds to {target:.0%}, the recipe over the baseline "
          f"({FLAGS.baseline}): " + ", ".join(ratios) + ".")


def _plot(results: list[dict]) -> None:
  curves = {f"{r['config']} seed {r['seed']}": runs.Run(
      path="", flags={}, events=[], state="finished",
      records=[{"cumulative_seconds": s, "val_accuracy": a}
               for s, a in r["curve"]]) for r in results}
  runs.plot(curves, FLAGS.plot)


def _write_results(table: str) -> None:
  """The table between RESULTS.md's markers, with the command and date."""
  section = (f"{BEGIN}\n`.venv/bin/python -m bench.time_to_accuracy "
             f"--recipe={FLAGS.recipe} --repeats={FLAGS.repeats}"
             + (f" --configs={','.join(FLAGS.configs)}"
                if FLAGS.configs != DEFAULT_CONFIGS else "")
             + (f" --baseline={FLAGS.baseline}"
                if "baseline" in FLAGS.configs else "")
             + (f" --extra={','.join(FLAGS.extra)}" if FLAGS.extra else "")
             + f"`, {time.strftime('%Y-%m-%d')}:\n\n{table}\n{END}")
  with open(RESULTS) as f:
    text = f.read()
  if BEGIN in text:
    text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END),
                  lambda _: section, text, flags=re.S)
  else:
    text += ("\n## Time to accuracy: the engine's recipe, the lab's method, "
             "Keras fit\n\n" + section + "\n")
  with open(RESULTS, "w") as f:
    f.write(text)


if __name__ == "__main__":
  app.run(main)
