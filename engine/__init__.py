"""A TensorFlow 2 training engine for data-parallel training with Horovod.

Two settings of TensorFlow's C++ runtime, which TensorFlow reads once, early
(the log level as it loads; the kernels the first time it asks which to
use), so they must be made before TensorFlow is imported or used, which is
why they live here. Each is a default: a value the user exported wins.

- TF_CPP_MIN_LOG_LEVEL=2: the runtime logs every kernel registration and
  oneDNN notice at start-up, once per process; with N processes under
  horovodrun that buries the engine's own output.
- TF_ENABLE_ONEDNN_OPTS=1: oneDNN's convolution, pooling and normalization
  kernels. TensorFlow turns them on by itself only on CPUs with AVX512_VNNI,
  AVX512_BF16 or AMX and runs Eigen's elsewhere; on an AVX2 AMD EPYC
  oneDNN's step of ResNet-9 was 2.5x faster at width 8 and 1.45x at width
  16 (BUILD.md, "CPU kernels"). GPU kernels are not affected.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
