r"""An `auto` option against its values forced, per model.

  .venv/bin/python -m bench.auto_precision [--repeats=2] [--option=precision]
  .venv/bin/python -m bench.auto_precision --option=compression

For each model (--models: the fast recipe's ResNet-9 of width 8, the 94%
recipe's of width 12, and WRN-16-2 at batch 128, the flags' other
settings their defaults), three variants train --epochs of --steps steps
on real Fashion-MNIST under `horovodrun --gloo -np 2`. --option=precision:
--mixed_precision `none` (float32), `bfloat16`, and `auto`, which measures
both before training (engine/compute/precision.py) and runs its choice.
--option=compression: --gradient_compression `none` (the default), `fp16`
and `auto` (engine/compute/communication.py). Variants alternate over
--repeats rounds. Prints each run's images/s (epochs after the first),
`auto`'s choice, its figures and the seconds its measurement took; then
per model whether `auto` ran at least as fast as the better of the two
forced ones.
"""
import functools
import os
import shutil
import statistics

from absl import app
from absl import flags

from bench import interleaved
from engine.core import run_files

FLAGS = flags.FLAGS
MODELS = {
    "resnet9_w8": ["--model=resnet9", "--filters=8", "--batch_size=128"],
    "resnet9_w12": ["--model=resnet9", "--filters=12", "--batch_size=128"],
    "wrn_16_2": ["--model=wrn", "--depth=16", "--width=2",
                 "--batch_size=128"],
}
# Per option: its flag, its variants (`auto` last), and the record of
# auto's choice in model_dir with the key of the choice in it.
OPTIONS = {
    "precision": ("mixed_precision", ("none", "bfloat16", "auto"),
                  "precision.json", "mode"),
    "compression": ("gradient_compression", ("none", "fp16", "auto"),
                    "communication.json", "compression"),
}
flags.DEFINE_enum("option", "precision", list(OPTIONS), "The auto option.")
flags.DEFINE_list("models", list(MODELS), "Models to measure.")
flags.DEFINE_integer("repeats", 2, "Rounds.", lower_bound=1)
flags.DEFINE_integer("epochs", 3, "Epochs per run.", lower_bound=2)
flags.DEFINE_integer("steps", 40, "Steps per epoch.", lower_bound=1)
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "auto_precision"),
                    "Runs, in a folder per option.")


def run(model: str, variant: str, round_: int) -> dict:
  flag, _, record, key = OPTIONS[FLAGS.option]
  model_dir = os.path.join(FLAGS.out_dir, FLAGS.option,
                           f"{model}_{variant}_{round_}")
  shutil.rmtree(model_dir, ignore_errors=True)
  interleaved.launch([
      interleaved.HOROVODRUN, "--gloo", "-np", "2", interleaved.PYTHON,
      "-m", "engine.train", *MODELS[model], f"--{flag}={variant}",
      f"--epochs={FLAGS.epochs}", f"--steps_per_epoch={FLAGS.steps}",
      "--progress=none", f"--model_dir={model_dir}"])
  found = {"images_per_sec": statistics.median(
      interleaved.images_per_sec(model_dir))}
  choice = run_files.read_record(model_dir, record, dict, "auto's choice")
  if choice:
    found.update(mode=choice[key], measured=choice["images_per_sec"],
                 seconds=choice["seconds"])
  return found


def _line(model: str, variant: str, round_: int, found: dict) -> str:
  return (f"  {model} round {round_ + 1} {variant}: "
          f"{found['images_per_sec']:.0f} img/s"
          + (f"; chose {found['mode']}, measured "
             + ", ".join(f"{m} {r:.0f}" for m, r in found["measured"].items())
             + f" in {found['seconds']:.1f} s"
             if "mode" in found else "")
          + f"; load {interleaved.load():.1f}")


def main(argv):
  del argv
  _, variants, _, _ = OPTIONS[FLAGS.option]
  print(f"{FLAGS.option}: CPU {interleaved.cpu()}; load "
        f"{interleaved.load():.2f}", flush=True)
  results = {model: interleaved.rounds(
      variants, functools.partial(run, model), FLAGS.repeats,
      show=functools.partial(_line, model)) for model in FLAGS.models}
  for model in FLAGS.models:
    medians = {variant: statistics.median(
        r["images_per_sec"] for r in results[model][variant])
        for variant in variants}
    better = max(medians[variant] for variant in variants[:-1])
    print(f"{model}: " + ", ".join(f"{v} {m:.0f}" for v, m in
                                   medians.items())
          + f" img/s; auto / better forced {medians['auto'] / better:.3f}")


if __name__ == "__main__":
  app.run(main)
