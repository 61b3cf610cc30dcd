r"""--steps_per_call K = 1, 4, 16 at 1 and 2 processes, interleaved.

  .venv/bin/python -m bench.steps_per_call [--repeats=3] [--workload=cnn]

Each variant trains --epochs of --steps steps under engine.train (under
`horovodrun --gloo -np 2` for 2 processes) on real Fashion-MNIST: the throughput
workload (`cnn`: bench/workload.py, batch 128 per process) or the fast
recipe (`fast`: flags/fashion_mnist_fast.cfg, ResNet-9 of width 8, batch
256), with the engine's default summaries every 50 steps (which end a call
there). All six variants run in each of --repeats rounds, the order
reversed every other round. Prints each run's images/s and the share of
its train time outside the calls of the compiled step (1 - (step seconds +
input seconds) / train seconds: Python, the host's reads, the loop's
bookkeeping), medians of the epochs after the first; then each variant's
median over rounds and its ratio to K = 1 at the same processes.
"""
import os
import shutil
import statistics

from absl import app
from absl import flags

from bench import interleaved
from bench import workload

FLAGS = flags.FLAGS
WORKLOADS = {
    "cnn": workload.engine_flags(workload.DATASETS["real"]) + ["--batch_size=128"],
    "fast": ["--flagfile=flags/fashion_mnist_fast.cfg",
             "--mixed_precision=none"],
}
VARIANTS = tuple(f"np{processes}_k{k}" for processes in (1, 2)
                 for k in (1, 4, 16))
flags.DEFINE_enum("workload", "cnn", list(WORKLOADS), "What is trained.")
flags.DEFINE_integer("repeats", 3, "Rounds.", lower_bound=1)
flags.DEFINE_integer("epochs", 3, "Epochs per run.", lower_bound=2)
flags.DEFINE_integer("steps", 100, "Steps per epoch.", lower_bound=1)
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "steps_per_call"), "Runs.")


def run(variant: str, round_: int) -> dict:
  processes, k = (int(part.lstrip("npk")) for part in variant.split("_"))
  model_dir = os.path.join(FLAGS.out_dir, f"{variant}_{round_}")
  shutil.rmtree(model_dir, ignore_errors=True)
  launcher = ([interleaved.HOROVODRUN, "--gloo", "-np", str(processes)]
              if processes > 1 else [])
  interleaved.launch([
      *launcher, interleaved.PYTHON, "-m", "engine.train",
      *WORKLOADS[FLAGS.workload], f"--steps_per_call={k}",
      f"--epochs={FLAGS.epochs}", f"--steps_per_epoch={FLAGS.steps}",
      "--eval_every_epochs=1000", "--progress=none",
      f"--model_dir={model_dir}"])
  epochs = interleaved.epochs(model_dir)[1:]
  train_seconds = [r["train_examples"] / r["images_per_sec"] for r in epochs]
  return {"images_per_sec": statistics.median(
              r["images_per_sec"] for r in epochs),
          "outside": statistics.median(
              1 - (r["step_seconds"] + r["input_seconds"]) / seconds
              for r, seconds in zip(epochs, train_seconds))}


def _line(variant: str, round_: int, found: dict) -> str:
  return (f"  round {round_ + 1} {variant}: {found['images_per_sec']:.0f} "
          f"img/s, {found['outside']:.1%} outside the calls")


def main(argv):
  del argv
  results = interleaved.rounds(VARIANTS, run, FLAGS.repeats, show=_line)
  for variant in VARIANTS:
    rate = statistics.median(r["images_per_sec"] for r in results[variant])
    one = statistics.median(r["images_per_sec"] for r in
                            results[variant.split("_")[0] + "_k1"])
    outside = statistics.median(r["outside"] for r in results[variant])
    print(f"{variant}: {rate:.0f} img/s ({rate / one:.3f} of K = 1), "
          f"{outside:.1%} outside the calls")


if __name__ == "__main__":
  app.run(main)
