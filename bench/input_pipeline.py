r"""image_folder against its TFRecords: when does converting pay?

  .venv/bin/python -m bench.input_pipeline [--images=20000] [--repeats=3]

One folder of 32x32 JPEG images (10 classes) is generated into --out_dir
and converted with engine.tools.to_tfrecords. Then, interleaved over
--repeats rounds:

1. The input pipeline alone: one process with all cores pulls
   --pipeline_batches batches of 128 from engine.datasets.train_stream, as
   training would, and nothing else: images/s.
2. A real run: `horovodrun --gloo -np 2 engine.train --model=M --image_size=32`
   on each, for each of --models (resnet_small, and the far cheaper cnn),
   --run_steps steps of 64 per process; the share of each epoch the step
   waited for input (metrics.jsonl's input_seconds over epoch_seconds,
   epochs after the first).

The first says how fast each format can feed a step; the second whether it
does, for a model with a slow step and one with a fast step on two CPU
cores, where decoding and training share the cores.
"""
import json
import os
import shutil
import statistics
import time

from absl import app
from absl import flags

from bench import generated_images
from bench import interleaved


FLAGS = flags.FLAGS
flags.DEFINE_integer("images", 20000, "Training images in the folder.")
flags.DEFINE_integer("repeats", 3, "Interleaved rounds.")
flags.DEFINE_integer("pipeline_batches", 150, "Batches per pipeline run.")
flags.DEFINE_integer("run_steps", 50, "Steps per epoch of a real run.")
flags.DEFINE_list("models", ["resnet_small", "cnn"], "Models of the runs.")
flags.DEFINE_integer("run_epochs", 3, "Epochs of a real run.")
flags.DEFINE_string("out_dir", "bench/out/input_pipeline", "Data and runs.")
flags.DEFINE_string("json", "", "Also write every figure here.")

FORMATS = {"image_folder": "images", "tfrecord": "records"}


def data_flags(fmt: str) -> list[str]:
  path = os.path.join(FLAGS.out_dir, FORMATS[fmt])
  return [f"--dataset={fmt}", f"--data_dir={path}", "--image_size=32"]


PIPELINE = """
import sys, time
from absl import flags
from engine import datasets
from engine.datasets import Augmentation
import flags as engine_flags
FLAGS = flags.FLAGS
FLAGS(["pipeline", *sys.argv[2:]])
splits = datasets.load(FLAGS.dataset, data_dir=FLAGS.data_dir,
    image_size=32, channels=3, validation_split=0.0, skip_bad_files=False,
    num_classes=10, label_offset=0, train_examples=0, test_examples=0)
batches = iter(datasets.train_stream(splits.train, splits.info,
    shard=datasets.Shard(0, 1),
    epochs=datasets.Epochs(batch_size=128,
                           steps=splits.info.num_train // 128, seed=0),
    augmentation=Augmentation(flip=True, shift=0.1)))
for _ in range(10):
  next(batches)  # warm-up: threads, first files
count = int(sys.argv[1])
start = time.perf_counter()
for _ in range(count):
  next(batches)
print(count * 128 / (time.perf_counter() - start))
"""


def pipeline_rate(fmt: str) -> float:
  return float(interleaved.launch(
      [interleaved.PYTHON, "-c", PIPELINE, str(FLAGS.pipeline_batches),
       *data_flags(fmt)]).split()[-1])


def input_share(fmt: str, model: str, run_dir: str) -> list[tuple]:
  """Each epoch's input wait over its time, and its images/s, epochs after
  the first."""
  command = [interleaved.HOROVODRUN, "--gloo", "-np", "2",
             interleaved.PYTHON, "-m",
             "engine.train", *data_flags(fmt), f"--model={model}",
             "--batch_size=64", "--mixed_precision=none",
             f"--steps_per_epoch={FLAGS.run_steps}",
             f"--epochs={FLAGS.run_epochs}", "--progress=none",
             f"--model_dir={run_dir}", "--resume=never"]
  interleaved.launch(command)
  return [(r["input_seconds"] / r["epoch_seconds"], r["images_per_sec"])
          for r in interleaved.epochs(run_dir)[1:]]


def measure(fmt: str, round_: int) -> dict:
  """The pipeline's images/s alone, and each model's epochs."""
  found = {"pipeline": pipeline_rate(fmt)}
  for model in FLAGS.models:
    run_dir = os.path.join(FLAGS.out_dir, "runs", f"{fmt}-{model}-r{round_}")
    shutil.rmtree(run_dir, ignore_errors=True)
    found[model] = input_share(fmt, model, run_dir)
  return found


def _lines(fmt: str, round_: int, found: dict) -> str:
  return "\n".join(
      [f"round {round_ + 1} {fmt:12}: pipeline {found['pipeline']:.0f} img/s"]
      + [f"round {round_ + 1} {fmt:12}: {model}: " + ", ".join(
          f"{share:.1%} input wait at {ips:.0f} img/s"
          for share, ips in found[model]) for model in FLAGS.models])


def main(argv):
  del argv
  folder = os.path.join(FLAGS.out_dir, FORMATS["image_folder"])
  records = os.path.join(FLAGS.out_dir, FORMATS["tfrecord"])
  if not os.path.isdir(folder):
    start = time.perf_counter()
    generated_images.write_folder(folder, FLAGS.images, "jpg")
    print(f"wrote {FLAGS.images} JPEG images in "
          f"{time.perf_counter() - start:.0f}s", flush=True)
  start = time.perf_counter()
  interleaved.launch([interleaved.PYTHON, "-m", "engine.tools.to_tfrecords",
                      f"--from={folder}", f"--to={records}", "--shards=16"])
  print(f"converted to TFRecords in {time.perf_counter() - start:.0f}s "
        "(or found them converted)", flush=True)
  by_round = interleaved.rounds(list(FORMATS), measure, FLAGS.repeats,
                                show=_lines)
  figures = {fmt: {key: [found[key] for found in found_by_round]
                   for key in ("pipeline", *FLAGS.models)}
             for fmt, found_by_round in by_round.items()}
  print("\n| format | pipeline alone, img/s (every run) | "
        + " | ".join(f"{m}: input wait per epoch, img/s" for m in
                     FLAGS.models) + " |")
  print("|---|---|" + "---|" * len(FLAGS.models))
  for fmt, found in figures.items():
    cells = []
    for model in FLAGS.models:
      shares = [s for run in found[model] for s, _ in run]
      rates = [r for run in found[model] for _, r in run]
      cells.append(f"median {statistics.median(shares):.1%}, max "
                   f"{max(shares):.1%}; {statistics.median(rates):.0f}")
    print(f"| {fmt} | {statistics.median(found['pipeline']):.0f} ("
          f"{', '.join(f'{r:.0f}' for r in found['pipeline'])}) | "
          + " | ".join(cells) + " |")
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  app.run(main)
