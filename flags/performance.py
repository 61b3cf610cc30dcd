"""Flags: speed options of the step (precision, XLA, the gradient allreduce,
steps per call).

Their defaults: precision chosen by measurement, no XLA and one step a
call. --mixed_precision=auto is float32 on hardware without native 16-bit
arithmetic and, where there is some, whichever mode measures fastest on
the run's own model: bfloat16 trained to the same accuracy as float32 at
equal epochs on five recipe and seed pairs (bench/RESULTS.md, "Toward
94% in 5 minutes") and is slower for narrow models, so
neither is right everywhere. XLA made the CPU step 1.7-4.7x slower than
TensorFlow's oneDNN kernels (bench/cpu_defaults.py); several steps a call
were no faster on 2 processes (bench/RESULTS.md, "Steps per call"). GPU recipes turn
on --xla.
"""
from absl import flags

from engine.compute import communication
from engine.compute import precision
from engine.distributed import gradients
from models import winograd3d

flags.DEFINE_enum("mixed_precision", "auto", precision.MODES,
                  "Compute in 16 bits with float32 weights (Keras mixed "
                  "precision policy); none: float32 throughout. float16: "
                  "with dynamic loss scaling, "
                  "for GPUs with Tensor Cores (Volta and later). bfloat16: "
                  "no loss scaling needed; TPUs, Ampere+ GPUs and CPUs with "
                  "AVX512-BF16 or AMX. auto: measured; before training "
                  "every rank times a few steps of each mode the hardware "
                  "computes natively (float32; bfloat16 on those GPUs and "
                  "CPUs; float16 on Tensor Core GPUs) on the run's model, "
                  "batch and data, and rank 0's fastest wins if it beats "
                  "float32 by 5% and by its rounds' spread; the decision is "
                  "kept for later runs of the same kind (--remeasure_auto), "
                  "logged and recorded in "
                  "model_dir/precision.json, which a resume and "
                  "engine.evaluate reuse. float32 alone, unmeasured, on "
                  "other hardware. A run resumed under auto keeps the "
                  "mode of its first start. Logits and loss stay float32.",
                  case_sensitive=False)
flags.DEFINE_bool("xla", False,
                  "Compile the forward and backward pass (and a Keras "
                  "optimizer's update) with XLA. Horovod's allreduce stays "
                  "outside the compiled code. Faster on GPUs; slower on CPUs.")
flags.DEFINE_enum("gradient_compression", "none", communication.MODES,
                  "Send gradients through the allreduce as: none, float32; "
                  "fp16, half the bytes (cast back after the reduction). "
                  "Helps when the network, not the device, bounds the step. "
                  "auto: measured; before training every rank times a few "
                  "steps of each on the run's model, batch, data and link, "
                  "and rank 0's figures choose fp16 if it beats none by 5% "
                  "and by its rounds' spread; kept for later runs of the "
                  "same kind (--remeasure_auto) and "
                  "recorded in model_dir/communication.json (with "
                  "Horovod's fusion threshold and cycle), which a resume "
                  "reuses. A process alone runs none, unmeasured.",
                  case_sensitive=False)
flags.register_multi_flags_validator(
    ["gradient_compression", "elastic"],
    lambda values: not (values["gradient_compression"] == "auto"
                        and values["elastic"]),
    "--gradient_compression=auto measures at start-up, before an elastic "
    "run's workers meet; give --gradient_compression=none or fp16")
flags.DEFINE_enum("allreduce_op", "average", gradients.OPS,
                  "How gradients combine across processes: average; adasum "
                  "(Maleki et al. 2020), which needs Horovod built with MPI "
                  "and launched with it (BUILD.md); with adasum the learning "
                  "rate usually needs less scaling (--lr_scaling=none on "
                  "CPU).",
                  case_sensitive=False)
flags.DEFINE_integer("grad_accum_steps", 1,
                     "Accumulate gradients over this many micro-batches of "
                     "--batch_size before one allreduce and one update: "
                     "trains as --batch_size x this would, in the memory of "
                     "--batch_size, with one allreduce per update.",
                     lower_bound=1)
flags.DEFINE_enum("fused_batch_norm", "auto", ["auto", "off"],
                  "auto: every keras.layers.BatchNormalization in the "
                  "model, yours included, trains through TensorFlow's "
                  "fused kernel (FusedBatchNormV3) where it computes what "
                  "Keras' layer does (over the last axis of images or "
                  "volumes, no mask), and is Keras' own layer in every "
                  "other way: variables, checkpoints, moving statistics, "
                  "inference, the .keras export (models/batch_norm.py). "
                  "off: Keras 3's own computation, separate operations.",
                  case_sensitive=False)
flags.DEFINE_enum("pointwise_matmul", "auto", ["auto", "off"],
                  "auto: on a machine without GPUs, every float32 "
                  "keras.layers.Conv2D and Conv3D with a kernel of 1 and "
                  "a stride of 1 (one group, channels last), yours "
                  "included, computes as a matrix product of the "
                  "channels: the same function, faster than oneDNN's "
                  "convolution on small maps, and Keras' own layer in every "
                  "other way: variables, checkpoints, the .keras export "
                  "(models/pointwise.py). off: Keras' convolution.",
                  case_sensitive=False)
flags.DEFINE_bool("remeasure_auto", False,
                  "Measure --mixed_precision=auto and "
                  "--gradient_compression=auto again, and keep what this "
                  "measurement decides for later runs of the same kind "
                  "(this machine's CPU or GPUs, the model, the batch, the "
                  "processes and hosts, TensorFlow's version) in place of "
                  "the decision kept in ~/.cache/horovod-engine/auto. A "
                  "resumed run keeps its own decision regardless.")
flags.DEFINE_enum("cpu_kernels", "auto", winograd3d.CHOICES,
                  "Our CPU kernels (CosmoFlow's 3x3x3 convolutions by "
                  "Winograd's algorithm, models/winograd3d.py), where a "
                  "block qualifies (float32, on a CPU, at least 8 voxels a "
                  "side from 16 channels): auto, the widest build this "
                  "process's CPU runs (AVX-512, else AVX2); off, "
                  "TensorFlow's convolution; avx2 or avx512, that build, "
                  "which the CPU must run. Without a build that loads, "
                  "TensorFlow's convolution, said in one line at start; "
                  "metrics.jsonl records which ran on each rank.",
                  case_sensitive=False)
flags.DEFINE_integer("steps_per_call", 1,
                     "Train steps per call of the compiled step, in a loop "
                     "inside it that reads its own batches (Keras' "
                     "steps_per_execution): one host round trip per call "
                     "instead of per step; faster for a process alone (4: "
                     "+18% on a 30 ms CPU step), not on 2 CPU processes "
                     "(bench/RESULTS.md). Stops, non-finite steps, "
                     "checkpoints, commits, summaries and profiled windows "
                     "still happen at the very step they would at 1 (a call "
                     "ends there); a stop signal is seen at the next call. "
                     "Beyond 1 the wait for input is counted as step time.",
                     lower_bound=1)
