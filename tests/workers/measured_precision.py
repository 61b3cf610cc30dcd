"""Run by tests/test_precision.py under `horovodrun -np 2`:
--mixed_precision=auto's and --gradient_compression=auto's measurements
(engine/compute/auto.py) on two processes, on hardware of two native modes
(float32 and bfloat16: `precision.native` replaced rather than the CPU
read, so that any machine runs it). Each rank writes OUT/rank<r>.json.

1. A run measures and chooses both; rank 0 is made to choose bfloat16 and
   fp16 gradients and rank 1 float32 and none (`auto.choose` replaced),
   so what both run says whose choice wins. Rank 0's time budget fits one step a round and rank 1's all
   eight: each step holds an allreduce, so unless every rank runs rank 0's
   count the ranks' collectives would not match.
2. The run resumed: `choose` now fails if called, so the resume must
   take the recorded choices without measuring.
3. A run first started in float32 and without compression (as every run
   was before auto), resumed under auto: it keeps both, unmeasured.
4. A first start under auto on hardware of float32 alone: float32,
   unmeasured, recorded for a resume on other hardware.
5. The first run's command again, in another model_dir, with a busy
   process beside each rank: it takes the decision kept for this kind of
   run (measuring now fails), and trains as the first did.
"""
import json
import os
import subprocess
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from engine import train as engine_train
from engine.compute import auto
from engine.compute import precision
from tests import fixtures


def policy(model) -> str:
  return next(layer.dtype_policy.name for layer in model.layers
              if layer.weights)


def compression(result) -> str:
  """What the run's gradients were sent as: fp16 halves their bytes."""
  values = sum(v.shape.num_elements() for v in result.model.trainable_variables)
  return {4 * values: "none", 2 * values: "fp16"}[
      result.train_step.gradient_bytes]


def weights(model) -> np.ndarray:
  return np.concatenate([v.numpy().ravel() for v in model.variables])


def main(out_dir: str, data_dir: str) -> None:
  config = fixtures.train_config(
      data=dict(dir=data_dir),
      model=dict(name="cnn", params={
          **fixtures.train_config().model.params, "filters": 4}),
      training=dict(batch_size=16, epochs=1, steps_per_epoch=4,
                    progress="none", model_dir=os.path.join(out_dir, "run")),
      devices=dict(deterministic=True),
      performance=dict(mixed_precision="auto", gradient_compression="auto"))
  asked = {"--mixed_precision=none": "--mixed_precision=auto",
           "--gradient_compression=none": "--gradient_compression=auto"}
  auto_flags = config.command_line  # the flags.txt an auto run records
  for explicit, asked_auto in asked.items():
    auto_flags = auto_flags.replace(explicit, asked_auto)
  config = config.replace(command_line=auto_flags)
  precision.native = lambda cpu_flags=None: (("none", "bfloat16"),
                                             "CPU with AVX512_BF16")
  # Rank 0 chooses bfloat16 and fp16 gradients, rank 1 neither.
  auto.choose = lambda figures: "none" if hvd.rank() else (
      "bfloat16" if "bfloat16" in figures["images_per_sec"] else "fp16")
  # Before Horovod starts: the rank horovodrun gave this process.
  rank = int(os.environ["HOROVOD_RANK"])
  auto.MEASURED_SECONDS = 1e-6 if rank == 0 else 1e6
  first = engine_train.train(config)
  measured = policy(first.model)

  def measured_again(*args, **kwargs):
    raise AssertionError(f"measured again: {args} {kwargs}")

  auto.choose = measured_again
  second = engine_train.train(config.replace(training=dict(epochs=2)))
  float32_run = config.replace(
      training=dict(model_dir=os.path.join(out_dir, "float32_run")))
  engine_train.train(float32_run.replace(
      performance=dict(mixed_precision="none", gradient_compression="none"),
      command_line=fixtures.train_config().command_line))
  resumed_float32 = engine_train.train(float32_run.replace(
      training=dict(epochs=2)))
  precision.native = lambda cpu_flags=None: (
      ("none",), "CPU without AVX512_BF16 or AMX")
  float32_alone = engine_train.train(config.replace(
      training=dict(model_dir=os.path.join(out_dir, "float32_alone")),
      performance=dict(gradient_compression="none")))
  precision.native = lambda cpu_flags=None: (("none", "bfloat16"),
                                             "CPU with AVX512_BF16")
  auto.timed = measured_again
  busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
  try:
    kept = engine_train.train(config.replace(
        training=dict(model_dir=os.path.join(out_dir, "kept"))))
  finally:
    busy.kill()
    busy.wait()
  flat = weights(second.model)
  everyone = hvd.allgather(tf.constant(flat[None]), name="weights").numpy()
  with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump({"measured_policy": measured,
               "measured_compression": compression(first),
               "resumed_policy": policy(second.model),
               "resumed_compression": compression(second),
               "resumed_float32_policy": policy(resumed_float32.model),
               "resumed_uncompressed": compression(resumed_float32),
               "resumed_float32_epoch": resumed_float32.history[-1]["epoch"],
               "float32_alone_policy": policy(float32_alone.model),
               "max_weight_difference_across_ranks":
                   float(np.abs(everyone - everyone[0]).max()),
               "history": second.history,
               "first_history": first.history,
               "kept_policy": policy(kept.model),
               "kept_compression": compression(kept),
               "kept_history": kept.history}, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
