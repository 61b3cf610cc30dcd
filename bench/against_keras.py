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
"""
import json
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
flags.DEFINE_integer("repeats", 3, "Rounds; each runs both configurations.",
                     lower_bound=1)
flags.DEFINE_integer("processes", 2, "Processes per run.", lower_bound=1)
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "against_keras"),
                    "Each run's model_dir, emptied before it runs.")


def run(config: str, seed: int) -> dict:
  model_dir = os.path.join(FLAGS.out_dir, f"{config}_{seed}")
  shutil.rmtree(model_dir, ignore_errors=True)
  interleaved.launch([
      interleaved.HOROVODRUN, "--gloo", "-np", str(FLAGS.processes),
      interleaved.PYTHON, "-m", CONFIGS[config], f"--flagfile={FLAGS.recipe}",
      f"--seed={seed}", f"--model_dir={model_dir}", "--progress=none"])
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f
               if line.strip() and "event" not in line]
  return {"config": config, "seed": seed,
          "images_per_sec": statistics.median(
              r["images_per_sec"] for r in records[1:]),
          **{figure: records[-1][figure] for figure in FLAGS.figures},
          "seconds": records[-1]["cumulative_seconds"]}


def main(argv):
  del argv
  results = []
  for seed in range(FLAGS.repeats):
    order = list(CONFIGS)[::-1] if seed % 2 else list(CONFIGS)
    for config in order:
      result = run(config, seed)
      results.append(result)
      print(f"  seed {seed} {config}: {result['images_per_sec']:.0f} img/s, "
            + ", ".join(f"{figure} {result[figure]:.4f}"
                        for figure in FLAGS.figures)
            + f", {result['seconds']:.1f} s", flush=True)
  decides = FLAGS.figures[0]
  for config in CONFIGS:
    mine = [r for r in results if r["config"] == config]
    values = [r[decides] for r in mine]
    print(f"{config}: median "
          f"{statistics.median(r['images_per_sec'] for r in mine):.0f} "
          f"img/s; {decides} median {statistics.median(values):.4f} "
          f"(seeds {min(values):.4f}-{max(values):.4f})")
  ratios = [e["images_per_sec"] / k["images_per_sec"] for e, k in zip(
      *([r for r in results if r["config"] == c] for c in CONFIGS))]
  print("engine / keras_fit img/s by seed: "
        + ", ".join(f"{r:.3f}" for r in ratios))


if __name__ == "__main__":
  app.run(main)
