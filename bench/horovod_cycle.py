r"""What Horovod's cycle time costs and buys when training on CPU.

Horovod's background thread wakes every HOROVOD_CYCLE_TIME milliseconds (1
by default) to look for tensors to reduce, and at every wake the processes
agree, in a small collective of their own, on what is ready, whether or not
anything is. On CPU that thread shares its process's cores with the step's
kernels, so its wakes come out of the step; a longer cycle wakes less often,
but a tensor that becomes ready waits longer for the next cycle. Two
measurements, at each cycle time:

  idle  2 processes that only run hvd.init() and sleep for --idle_seconds:
        the CPU time and voluntary context switches each spends per second
  runs  whole runs of the throughput benchmark's workload (bench/workload.py:
        the CPU preset's cnn, batch 128, synthetic data) on 2 processes,
        interleaved over --repeats rounds (bench.interleaved)

The cycle time is set in each launch's environment, which the engine's own
default for CPU (engine/distributed.py) leaves alone.

  .venv/bin/python -m bench.horovod_cycle
"""
import json
import os
import resource
import shutil
import subprocess
import time

from absl import app
from absl import flags

from bench import interleaved
from bench import workload

FLAGS = flags.FLAGS
interleaved.define_flags(out_name="horovod_cycle", repeats=3)
flags.DEFINE_list("cycle_ms", ["1", "2", "3", "5"], "Cycle times to "
                  "compare, in milliseconds (1 is Horovod's default).")
flags.DEFINE_integer("idle_seconds", 10, "How long the idle processes sleep.")
flags.DEFINE_bool("idle_worker", False, "Internal: be one idle process.")


def main(argv):
  del argv
  if FLAGS.idle_worker:
    _idle()
    return
  print("idle: CPU and voluntary context switches per process per second")
  for ms in FLAGS.cycle_ms:
    for rank in _idle_launch(ms):
      print(f"  {ms} ms, rank {rank['rank']}: {rank['cpu_per_second']:.1%} "
            f"of a core, {rank['switches_per_second']:.0f} switches/s",
            flush=True)
  print("\nruns: images/s of epochs 2 on, 2 processes, synthetic data")
  medians = interleaved.compare([f"{ms}_ms" for ms in FLAGS.cycle_ms], _run)
  reference = medians[f"{FLAGS.cycle_ms[0]}_ms"]
  for config, median in medians.items():
    print(f"{config} / {FLAGS.cycle_ms[0]}_ms: {median / reference:.3f}")


def _idle_launch(ms: str) -> list[dict]:
  """Two idle processes at cycle time `ms`; what each reports."""
  result = subprocess.run(
      [interleaved.HOROVODRUN, "-np", "2", interleaved.PYTHON, "-m",
       "bench.horovod_cycle", "--idle_worker",
       f"--idle_seconds={FLAGS.idle_seconds}"],
      cwd=interleaved.REPO, capture_output=True, text=True, check=True,
      env=interleaved.engine_env(HOROVOD_CYCLE_TIME=ms))
  reports = [json.loads(line.split(":", 1)[1]) for line in
             result.stdout.splitlines() if "<stdout>:{" in line]
  return sorted(reports, key=lambda report: report["rank"])


def _idle() -> None:
  """hvd.init(), then nothing: what Horovod's thread alone costs."""
  import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
  hvd.init()
  before, start = resource.getrusage(resource.RUSAGE_SELF), time.time()
  time.sleep(FLAGS.idle_seconds)
  after = resource.getrusage(resource.RUSAGE_SELF)
  seconds = time.time() - start
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  print(json.dumps({
      "rank": hvd.rank(), "cpu_per_second": cpu / seconds,
      "switches_per_second": (after.ru_nvcsw - before.ru_nvcsw) / seconds}),
        flush=True)


def _run(config: str, round_: int, checkout: str) -> list[float]:
  """One run at cycle time `config`; its images/s after epoch 1."""
  model_dir = os.path.join(FLAGS.out_dir, f"{config}_{round_}")
  shutil.rmtree(model_dir, ignore_errors=True)
  ms = config.removesuffix("_ms")
  command = [interleaved.HOROVODRUN, "-np", "2", interleaved.PYTHON, "-m",
             "engine.train", f"--model_dir={model_dir}",
             *workload.engine_flags("synthetic"), "--batch_size=128",
             f"--epochs={FLAGS.epochs}",
             f"--steps_per_epoch={FLAGS.steps_per_epoch}"]
  return interleaved.images_per_sec(
      command, cwd=checkout, model_dir=model_dir,
      env=dict(os.environ, HOROVOD_CYCLE_TIME=ms))


if __name__ == "__main__":
  app.run(main)
