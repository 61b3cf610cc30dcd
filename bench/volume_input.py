r"""The CosmoFlow recipe's input: the GZIP pipeline alone, and staging.

  .venv/bin/python -m bench.volume_input --flagfile=flags/cosmoflow_mini.cfg \
      [--repeats=3] [--runs=bench/out/against_keras]

1. The input pipeline alone: one process with all cores pulls
   --pipeline_batches of the recipe's training batches (rank 0 of 2, as a
   process of the recipe reads: GZIP TFRecords, decoded, log(1 + x),
   flipped and transposed, normalized) and nothing else: volumes/s, and
   MB/s of files read (compressed) and of volumes decoded. Against the
   step's demand: each process's volumes/s in the engine's runs of the
   recipe under --runs (bench.against_keras), and the share of each epoch
   their step waited for input (input_seconds over epoch_seconds, epochs
   after the first).
2. Staging (engine/input/staging.py): the recipe's files copied by two ranks at
   once (two threads, as two processes of a node copy their shares) into
   an empty directory under --stage_root, then again (a rerun: nothing to
   copy), each --repeats times: seconds and MB/s. The source files are
   likely in the page cache, so this measures the copy to the local disk.
"""
import concurrent.futures
import glob
import json
import math
import os
import shutil
import statistics
import time

from absl import app
from absl import flags
import numpy as np

from bench import interleaved
from engine import datasets
from engine.core.config import config_from_flags
from engine.datasets import Epochs, Shard
from engine.datasets.augmentation import Augmentation
from engine.input import data
from engine.input import staging
import flags as engine_flags  # noqa: F401  the engine's flags, for the recipe

FLAGS = flags.FLAGS
flags.DEFINE_integer("repeats", 3, "Rounds of each measurement.",
                     lower_bound=1)
flags.DEFINE_integer("pipeline_batches", 64, "Batches per pipeline run.",
                     lower_bound=2)
flags.DEFINE_string("runs", os.path.join(interleaved.REPO, "bench", "out",
                                         "against_keras"),
                    "bench.against_keras's runs of the recipe.")
flags.DEFINE_string("stage_root", "/tmp/bench_staging",
                    "Where each staging round stages, emptied first.")


def pipeline_alone(splits, config) -> dict:
  """Volumes/s of rank 0's training batches, nothing else running."""
  batch_size = config.training.batch_size
  steps = data.steps_per_epoch(num_train=splits.info.num_train,
                               batch_size=batch_size, world_size=2,
                               requested=0)
  batches = iter(data.train_stream(
      splits.train, splits.info, shard=Shard(0, 2),
      epochs=Epochs(batch_size=batch_size, steps=steps,
                    seed=config.training.seed),
      augmentation=Augmentation.requested(config.data, resizing=False)))
  next(batches)  # the pipeline's start, not its rate
  began = time.perf_counter()
  for _ in range(FLAGS.pipeline_batches - 1):
    next(batches)
  seconds = time.perf_counter() - began
  volumes = (FLAGS.pipeline_batches - 1) * batch_size
  files = splits.train.rank_files(datasets.Shard(0, 2))
  file_bytes = statistics.mean(map(os.path.getsize, files))
  volume_bytes = math.prod(splits.info.image_shape) * np.dtype(
      splits.info.image_dtype).itemsize
  return {"volumes_per_sec": volumes / seconds,
          "file_mb_per_sec": volumes * file_bytes / seconds / staging.MB,
          "decoded_mb_per_sec": volumes * volume_bytes / seconds / staging.MB}


def demand() -> list[dict]:
  """Per engine run of the recipe: volumes/s per process, and the input
  wait's share of each epoch after the first."""
  found = []
  for path in sorted(glob.glob(os.path.join(FLAGS.runs, "engine_*",
                                            "metrics.jsonl"))):
    with open(path) as f:
      records = [json.loads(line) for line in f if "event" not in line]
    after_first = records[1:]
    found.append({
        "run": os.path.basename(os.path.dirname(path)),
        "volumes_per_sec_per_process": statistics.median(
            r["images_per_sec"] for r in after_first) / 2,
        "input_wait_share": [round(r["input_seconds"] / r["epoch_seconds"],
                                   4) for r in after_first]})
  return found


def stage_twice(splits, config) -> tuple[float, float, int]:
  """Seconds to stage into an empty directory and to stage again, and the
  bytes staged, two ranks at once."""
  shutil.rmtree(FLAGS.stage_root, ignore_errors=True)
  os.makedirs(FLAGS.stage_root)

  def both_ranks():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      return list(pool.map(lambda rank: staging.stage(
          splits, data_dir=config.data.dir, stage_dir=FLAGS.stage_root,
          rank=rank, world_size=2)[1], (0, 1)))

  seconds = []
  for _ in range(2):
    began = time.perf_counter()
    staged = both_ranks()
    seconds.append(time.perf_counter() - began)
  assert sum(s.copied_bytes for s in staged) == 0
  return seconds[0], seconds[1], sum(s.bytes for s in staged)


def main(argv):
  del argv
  config = config_from_flags()
  splits = datasets.load(config.data.name, data_dir=config.data.dir,
                         **config.data.params)
  for repeat in range(FLAGS.repeats):
    alone = pipeline_alone(splits, config)
    print(f"round {repeat + 1}: pipeline alone "
          f"{alone['volumes_per_sec']:.0f} volumes/s, "
          f"{alone['file_mb_per_sec']:.1f} MB/s of GZIP files, "
          f"{alone['decoded_mb_per_sec']:.1f} MB/s decoded", flush=True)
    first, rerun, size = stage_twice(splits, config)
    print(f"round {repeat + 1}: staging {size / staging.MB:.0f} MB: "
          f"{first:.2f} s ({size / staging.MB / first:.0f} MB/s); rerun "
          f"{rerun:.2f} s", flush=True)
  for run in demand():
    print(f"{run['run']}: {run['volumes_per_sec_per_process']:.0f} volumes/s "
          f"per process; input wait share by epoch "
          f"{min(run['input_wait_share']):.4f}-"
          f"{max(run['input_wait_share']):.4f} (median "
          f"{statistics.median(run['input_wait_share']):.4f})")
  shutil.rmtree(FLAGS.stage_root, ignore_errors=True)


if __name__ == "__main__":
  app.run(main)
