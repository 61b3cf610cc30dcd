r"""A recipe trained by the engine and by Keras `fit`, interleaved.

  .venv/bin/python -m bench.against_keras \
      --recipe=flags/fashion_mnist_segmentation.cfg --repeats=3
  .venv/bin/python -m bench.against_keras \
      --recipe=flags/cosmoflow_mini.cfg --figures=val_mae,val_r2 --repeats=3

Each round trains the recipe once with the engine (`engine.train`) and once
with Keras `model.fit` and Horovod's callbacks given the same model, data,
batches, optimizer and schedule (bench/keras_recipe.py: Keras' MeanIoU for
segmentation, its MSE and MAE for regression), on --processes, the order
reversed every other round; round r gives both seed r. Both are evaluated
alike (the engine's exact evaluation), so the --figures compare the
training, and images/s (the median of the epochs after the first) the
steps. Prints every run as it ends, then each configuration's medians and
the seeds' spread of the first figure.

--variant="LABEL=CONFIG FLAG..." runs a configuration under a label of its
own with flags added to the recipe's (several variants of one
configuration race in the same rounds); the first variant is the one the
others are divided by. Each run also reports the 1-minute load average
before and after it, and every epoch's images/s.
"""
import os
import shutil
import statistics

from absl import app
from absl import flags

from bench import interleaved

CONFIGS = {"engine": "engine.train", "keras_fit": "bench.keras_recipe"}
FLAGS = flags.FLAGS
flags.DEFINE_string("recipe", "flags/fashion_mnist_segmentation.cfg",
                    "The recipe's flagfile.")
flags.DEFINE_list("figures", ["val_mean_iou", "val_pixel_accuracy"],
                  "The last epoch's figures to compare, the first deciding.")
flags.DEFINE_list("configs", ["engine", "keras_fit"],
                  f"Configurations to run, the first the reference of the "
                  f"ratios: of {', '.join(CONFIGS)}.")
flags.DEFINE_multi_string("variant", [],
                          "LABEL=CONFIG FLAG...: a configuration under its "
                          "own label with flags added to the recipe's; "
                          "replaces --configs when given.")
flags.DEFINE_integer("repeats", 3, "Rounds; each runs both configurations.",
                     lower_bound=1)
flags.DEFINE_integer("processes", 2, "Processes per run.", lower_bound=1)
flags.DEFINE_list("env", [], "NAME=VALUE pairs set for every run, both "
                  "sides (HOROVOD_CYCLE_TIME=5: Horovod reads it at "
                  "hvd.init()).")
flags.DEFINE_enum("controller", "gloo", ["gloo", "mpi"],
                  "horovodrun's controller for every run: Gloo's TCP, or "
                  "Open MPI, whose processes on one host reduce through "
                  "shared memory.")
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "against_keras"),
                    "Each run's model_dir, emptied before it runs.")


def variants() -> dict:
  """Each label's configuration and its own flags, in --variant's order,
  or --configs' without flags of their own."""
  if not FLAGS.variant:
    chosen = {config: (config, []) for config in FLAGS.configs}
  else:
    chosen = {}
    for text in FLAGS.variant:
      label, _, rest = text.partition("=")
      config, *extra = rest.split()
      chosen[label.strip()] = (config, extra)
  for label, (config, _) in chosen.items():
    if config not in CONFIGS:
      raise app.UsageError(f"{label}: no configuration {config!r}; one of "
                           f"{', '.join(CONFIGS)}")
  return chosen


def run(label: str, config: str, extra: list, seed: int) -> dict:
  model_dir = os.path.join(FLAGS.out_dir, f"{label}_{seed}")
  shutil.rmtree(model_dir, ignore_errors=True)
  load_before = interleaved.load()
  interleaved.launch([
      interleaved.HOROVODRUN, f"--{FLAGS.controller}",
      "-np", str(FLAGS.processes),
      interleaved.PYTHON, "-m", CONFIGS[config], f"--flagfile={FLAGS.recipe}",
      *extra, f"--seed={seed}", f"--model_dir={model_dir}",
      "--progress=none"], **dict(pair.split("=", 1) for pair in FLAGS.env))
  load_after = interleaved.load()
  records = interleaved.epochs(model_dir)
  return {"images_per_sec": statistics.median(interleaved.measured(records)),
          "epochs": [r["images_per_sec"] for r in records],
          **{figure: records[-1][figure] for figure in FLAGS.figures},
          "seconds": records[-1]["cumulative_seconds"],
          "load": (load_before, load_after)}


def _line(label: str, seed: int, result: dict) -> str:
  return (f"  seed {seed} {label}: {result['images_per_sec']:.1f} img/s, "
          + ", ".join(f"{figure} {result[figure]:.4f}"
                      for figure in FLAGS.figures)
          + f", {result['seconds']:.1f} s; epochs "
          + " ".join(f"{r:.0f}" for r in result["epochs"])
          + "; load %.2f -> %.2f" % result["load"])


def main(argv):
  del argv
  chosen = variants()
  labels = list(chosen)
  # Round r is seed r, for every configuration.
  results = interleaved.rounds(
      labels, lambda label, seed: run(label, *chosen[label], seed),
      FLAGS.repeats, show=_line)
  decides = FLAGS.figures[0]
  for label in labels:
    mine = results[label]
    values = [r[decides] for r in mine]
    print(f"{label}: median "
          f"{statistics.median(r['images_per_sec'] for r in mine):.1f} "
          f"img/s; {decides} median {statistics.median(values):.4f} "
          f"(seeds {min(values):.4f}-{max(values):.4f})")
  first = results[labels[0]]
  for label in labels[1:]:
    other = results[label]
    ratios = [a["images_per_sec"] / b["images_per_sec"]
              for a, b in zip(first, other)]
    print(f"{labels[0]} / {label} img/s by seed: "
          + ", ".join(f"{r:.3f}" for r in ratios)
          + f" (median {statistics.median(ratios):.3f})")


if __name__ == "__main__":
  app.run(main)
