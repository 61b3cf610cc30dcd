r"""A Keras fit script's speed under engine.fit against model.fit, and its
tf.data pipeline against the engine's own arrays source.

  .venv/bin/python -m bench.fit_script --repeats=2 [--train_examples=30000]

Does `engine.fit` cost a fit script anything, and is a user's tf.data
pipeline, given to engine.train by --dataset=FILE.py:function, slower than
the engine's in-memory arrays on the same data? One script,
bench/fit_script_parts.py (real Fashion-MNIST, the first --train_examples
training images; a small CNN in Keras' layers, Adam at 1e-3, sparse
cross-entropy, accuracy; batches of 64 a process; validation on the 10000
test images every epoch), trains --epochs epochs in each variant:

- `fit`: `model.fit`, one process, no Horovod, the engine's threads for
  one process on this machine (`distributed.cpu_threads`);
- `engine.fit-N`: the same script with `engine.fit(model, `, under
  `horovodrun --gloo -np N` (a batch of 64 on each: the global images/s).
  The script's pipelines run TensorFlow before engine.fit starts the
  engine, so the thread pools are those fixed by then (engine/__init__.py,
  engine/distributed/world.py; the engine warns where they are not its
  choice);
- `train-tfdata-1`: `engine.train --dataset=...:datasets
  --model=...:compiled_cnn`, the same pipelines and compiled model by flags;
- `train-gathered-1`: the same by `--dataset=...:gathered_datasets`, its
  training batches gathered from the images in memory as the arrays
  source gathers them: what the tf.data route costs apart from how the
  script's pipeline is written;
- `train-arrays-1`: `engine.train --dataset=fashion_mnist --model=...:cnn`,
  the same CNN uncompiled on the engine's arrays source, the task's own
  loss and metrics, Adam at 1e-3, no augmentation; with --train_examples,
  an epoch of as many full batches, drawn from all 60000 images.

An epoch's images/s is its training images over its training steps' time,
validation left out (the engine's `images_per_sec`; `fit`'s timed from the
epoch's start to its validation's); a run's figure is the median of the
epochs after the first. Every run is printed as it comes, with the load
before and after; then the table of every round, each variant's ratio to
`fit` and each tf.data variant's to arrays, by round.
"""
import os
import re
import shutil
import statistics

from absl import app
from absl import flags

from bench import fit_script_parts as parts
from bench import interleaved
from engine import distributed
from engine.core import cpu

FLAGS = flags.FLAGS
VARIANTS = ("fit", "engine.fit-1", "engine.fit-2", "train-tfdata-1",
            "train-gathered-1", "train-arrays-1")
flags.DEFINE_list("variants", list(VARIANTS[:4] + VARIANTS[5:]),
                  "fit, engine.fit-N (N processes), train-tfdata-1, "
                  "train-gathered-1, train-arrays-1; the first is the "
                  "ratios' reference.")
flags.register_validator(
    "variants", lambda names: names and all(
        name in VARIANTS or re.fullmatch(r"engine\.fit-[1-9]\d*", name)
        for name in names),
    f"each one of {', '.join(VARIANTS)} or engine.fit-N")
flags.DEFINE_integer("repeats", 2, "Rounds.", lower_bound=1)
flags.DEFINE_integer("epochs", 3, "Epochs a run (the first is warm-up).",
                     lower_bound=2)
flags.DEFINE_integer("train_examples", 0,
                     "Training images a run reads (the first ones); 0: all "
                     f"{parts.NUM_TRAIN}.", lower_bound=0,
                     upper_bound=parts.NUM_TRAIN)
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "fit_script"),
                    "Each run's directory, emptied before it runs.")
PARTS = "bench/fit_script_parts.py"
TFDATA, GATHERED = "train-tfdata-1", "train-gathered-1"
ARRAYS = "train-arrays-1"
# engine.train's --dataset function of each tf.data variant.
DATASETS = {TFDATA: "datasets", GATHERED: "gathered_datasets"}


def main(argv):
  del argv
  isa = [name for name in ("avx512f", "avx2") if name in cpu.features()]
  print(f"CPU: {interleaved.cpu()}; {os.cpu_count()} cores; "
        f"{', '.join(isa) or 'neither AVX512F nor AVX2'}; load "
        f"{interleaved.load():.2f}", flush=True)
  results = interleaved.rounds(FLAGS.variants, run, FLAGS.repeats,
                               show=_shown)
  report(results)


def command(variant: str, model_dir: str) -> tuple[list[str], dict]:
  """The variant's command line and its environment's additions."""
  shared_env = {"FIT_SCRIPT_EPOCHS": str(FLAGS.epochs),
                "FIT_SCRIPT_EXAMPLES": str(FLAGS.train_examples)}
  if variant == "fit":
    threads = distributed.cpu_threads(distributed.available_cores(), 1)
    return [interleaved.PYTHON, PARTS], dict(
        shared_env, FIT_SCRIPT_FORM="fit", FIT_SCRIPT_DIR=model_dir,
        FIT_SCRIPT_THREADS=",".join(map(str, threads)))
  if variant.startswith("engine.fit-"):
    return [interleaved.HOROVODRUN, "--gloo", "-np", variant.split("-")[1],
            interleaved.PYTHON, PARTS, f"--model_dir={model_dir}",
            "--progress=none"], dict(shared_env, FIT_SCRIPT_FORM="engine.fit")
  train = [interleaved.PYTHON, "-m", "engine.train", f"--batch_size="
           f"{parts.BATCH}", f"--epochs={FLAGS.epochs}",
           f"--model_dir={model_dir}", "--progress=none",
           "--mixed_precision=none"]
  if variant in DATASETS:
    return train + [f"--dataset={PARTS}:{DATASETS[variant]}",
                    f"--model={PARTS}:compiled_cnn",
                    f"--train_examples={FLAGS.train_examples}"], {}
  steps = ([f"--steps_per_epoch={FLAGS.train_examples // parts.BATCH}"]
           if FLAGS.train_examples else [])
  return train + [
      "--dataset=fashion_mnist", f"--data_dir={parts.DATA_DIR}",
      f"--model={PARTS}:cnn", "--task=classification", "--norandom_flip",
      "--random_shift=0", "--optimizer=adam",
      f"--base_lr={parts.LEARNING_RATE}", "--gradient_compression=none",
      *steps], {}


def run(variant: str, round_: int) -> dict:
  """One run of `variant` into its own directory: its figure (the median
  of its measured epochs), every epoch's images/s and the load."""
  model_dir = os.path.join(FLAGS.out_dir, f"{variant}-r{round_ + 1}")
  shutil.rmtree(model_dir, ignore_errors=True)
  os.makedirs(model_dir)
  load_before = interleaved.load()
  line, env = command(variant, model_dir)
  interleaved.launch(line, **env)
  records = interleaved.epochs(model_dir)
  return {"images_per_sec": statistics.median(interleaved.measured(records)),
          "epochs": [r["images_per_sec"] for r in records],
          "load": (load_before, interleaved.load())}


def _shown(variant: str, round_: int, result: dict) -> str:
  return (f"  round {round_ + 1} {variant}: {result['images_per_sec']:.0f} "
          "img/s; epochs " + " ".join(f"{r:.0f}" for r in result["epochs"])
          + "; load %.2f -> %.2f" % result["load"])


def report(results: dict[str, list[dict]]) -> None:
  """Images/s by variant and round, each variant's ratio to the first
  variant by round, and each tf.data variant's to arrays by round."""
  figures = {variant: [run_["images_per_sec"] for run_ in runs]
             for variant, runs in results.items()}
  reference = FLAGS.variants[0]
  rounds = range(1, FLAGS.repeats + 1)
  print(f"\nimages/s (median of epochs 2-{FLAGS.epochs}), by round; "
        f"/ {reference} by round")
  print(f"{'variant':<16}" + "".join(f"{f'round {r}':>10}" for r in rounds)
        + f"   / {reference}")
  for variant, found in figures.items():
    ratios = _ratios(found, figures[reference])
    print(f"{variant:<16}" + "".join(f"{figure:>10.0f}" for figure in found)
          + "   " + ", ".join(f"{ratio:.3f}" for ratio in ratios))
  for pipeline in DATASETS:
    if pipeline in figures and ARRAYS in figures:
      print(f"{pipeline} / {ARRAYS} by round: " + ", ".join(
          f"{ratio:.3f}" for ratio in _ratios(figures[pipeline],
                                              figures[ARRAYS])))
  print(f"load after: {interleaved.load():.2f}")


def _ratios(mine: list[float], theirs: list[float]) -> list[float]:
  return [a / b for a, b in zip(mine, theirs)]


if __name__ == "__main__":
  app.run(main)
