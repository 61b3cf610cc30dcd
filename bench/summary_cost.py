r"""What TensorBoard summaries within epochs cost a run.

--summary_every_steps writes rank 0's loss, accuracy, step time and learning
rate every N steps, from sums the step keeps anyway, read on the host after
a step whose result was read already: no collective and no extra sync. This
times whole runs of the CPU recipe (2 processes, real Fashion-MNIST), one at
a time and interleaved over --repeats rounds, in four configurations:

  base      the engine at git revision --base (a worktree under --out_dir):
            before summaries within epochs, and the Keras layout
  none      this checkout, --summary_every_steps=0
  every_50  this checkout, the default --summary_every_steps=50
  every_1   this checkout, a summary after every step: the worst case

Each figure is a run's images/s after its first epoch (bench.interleaved).

  .venv/bin/python -m bench.summary_cost --base=5f3e4de
"""
import os
import shutil

from absl import app
from absl import flags

from bench import interleaved

FLAGS = flags.FLAGS
interleaved.define_flags(before="summaries within epochs", out_name="summary",
                         repeats=2)

# Configuration -> --summary_every_steps (None: the base revision's engine).
CONFIGS = {"base": None, "none": 0, "every_50": 50, "every_1": 1}


def run(config: str, round_: int, base_dir: str) -> list[float]:
  """One run; its images/s for each epoch after the first."""
  model_dir = os.path.join(FLAGS.out_dir, f"{config}_{round_}")
  shutil.rmtree(model_dir, ignore_errors=True)
  every = CONFIGS[config]
  command = [interleaved.HOROVODRUN, "-np", "2", interleaved.PYTHON, "-m",
             "engine.train", "--flagfile=flags/fashion_mnist_cpu.cfg",
             f"--model_dir={model_dir}", f"--epochs={FLAGS.epochs}",
             f"--steps_per_epoch={FLAGS.steps_per_epoch}", "--progress=none"]
  if every is not None:
    command.append(f"--summary_every_steps={every}")
  return interleaved.images_per_sec(
      command, cwd=base_dir if every is None else interleaved.REPO,
      model_dir=model_dir, env=dict(os.environ))


def main(argv):
  del argv
  medians = interleaved.compare(CONFIGS, run)
  for config in CONFIGS:
    print(f"{config} / none: {medians[config] / medians['none']:.3f}")


if __name__ == "__main__":
  app.run(main)
