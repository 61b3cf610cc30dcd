"""What a run says as it starts, beside what it builds (engine/build.py):
its processes and kernels, its optimizer, precision and allreduce, and
the GPU options that would slow it on a CPU."""
import collections
import os
import time
from typing import Optional

from absl import logging
import keras
import tensorflow as tf

from engine import distributed
from engine.compute import communication
from engine.compute import precision
from engine.compute import weight_decay
from engine.core.config import TrainConfig
from models import winograd3d


def numerics(config: TrainConfig, choice: precision.Choice,
             sent: communication.Choice, world: distributed.World,
             model: keras.Model, optimizer: str) -> None:
  """Says which optimizer (`optimizer`: --optimizer's, or a fit script's
  compiled one), precision and allreduce the run uses, and how `model`'s
  weights are decayed; warns of GPU options that slow a CPU run."""
  performance = config.performance
  logging.info("%s; precision %s%s%s; allreduce %s, compression %s%s",
               optimizer, choice.mode
               if choice.mode != "none" else "float32",
               f" (auto: {choice.why})" if choice.why else "",
               ", XLA" if performance.xla else "", performance.allreduce_op,
               sent.compression, f" (auto: {sent.why})" if sent.why else "")
  decay = weight_decay.described(model, config)
  if decay:
    logging.info("%s", decay)
  if world.device == "CPU":
    _warn_about_slow_options_on_cpu(config, choice)


def _warn_about_slow_options_on_cpu(config: TrainConfig,
                                    choice: precision.Choice) -> None:
  """GPU options that cost a CPU run dearly (measured by
  bench/cpu_defaults.py: bench/RESULTS.md)."""
  if choice.mode == "float16":
    logging.warning("--mixed_precision=float16 on CPU: CPUs have no float16 "
                    "arithmetic, and emulating it makes steps many times "
                    "slower than float32; use bfloat16 (faster on CPUs with "
                    "AVX512-BF16) or none")
  if config.performance.xla:
    logging.warning("--xla on CPU: steps are slower than with TensorFlow's "
                    "oneDNN kernels")


def processes(world: distributed.World, kernels: str) -> str:
  """Where each process runs, and on what: on GPUs, how Horovod reduces
  their tensors; on the CPU, also whether TensorFlow's CUDA build found
  no GPU (a GPU venv on a CPU node)."""
  if world.device == "GPU":
    return "one GPU per process, " + (
        "Horovod's collectives on NCCL" if distributed.nccl_built() else
        "Horovod without NCCL: collectives through host memory")
  return (("TensorFlow's CUDA build found no GPU: "
           if tf.test.is_built_with_cuda() else "")
          + f"CPU, {world.intra_op_threads} intra-op and "
          f"{world.inter_op_threads} inter-op threads per process, {kernels}"
          " kernels, " + ("Horovod's threads at idle priority, "
                          if world.idle_horovod_threads else "")
          + f"Horovod cycle {os.environ['HOROVOD_CYCLE_TIME']} ms")


def cpu_kernels(config: TrainConfig, model: keras.Model) -> Optional[dict]:
  """Which of our CPU kernels the model's blocks take on each rank (what
  its own CPU runs), logged and for metrics.jsonl; None if no block fits
  them. Under --elastic (workers meet in the loop), this rank's alone."""
  fitting, taking = winograd3d.blocks(model)
  if not fitting:
    return None
  ours = f"winograd3d_{winograd3d.loaded()}" if taking else "tensorflow"
  by_rank = ([ours] if config.faults.elastic
             else distributed.gathered(ours, name="cpu_kernels"))
  ran = collections.Counter(by_rank).items()
  logging.info("%d blocks fit our Winograd kernels (--cpu_kernels=%s); they "
               "run %s", fitting, config.performance.cpu_kernels, ", ".join(
                   f"{name} on {n} of {len(by_rank)} ranks" for name, n in ran))
  return dict(event="cpu_kernels", blocks=fitting, by_rank=by_rank,
              choice=config.performance.cpu_kernels, time=round(time.time(), 3))
