"""A TensorFlow 2 training engine for data-parallel training with Horovod.

Three settings that TensorFlow reads once, early (the log level as it
loads; the kernels the first time it asks which to use; the Keras behind
`tf.keras` the first time `tf.keras` is touched), so they must be made
before TensorFlow is imported or used, which is why they live here: every
entry point, worker and test imports the engine first.

- TF_USE_LEGACY_KERAS=1, always: `tf.keras` is tf_keras, Keras 2. The
  engine, its models and Horovod's TensorFlow bindings are written for it
  (Horovod broadcasts through `Variable.ref`, which Keras 3's variables
  lack); on TensorFlow 2.16 and later `tf.keras` would otherwise be Keras 3.
  A script that imports TensorFlow and touches `tf.keras` before importing
  the engine has Keras 3 as `tf.keras` for good: the import below stops it
  with what to do. A Keras 3 model from `import keras` is refused in one
  line at start-up (models/__init__.py, `refuse_keras3`).
- TF_CPP_MIN_LOG_LEVEL=2, a default: the runtime logs every kernel
  registration and oneDNN notice at start-up, once per process; with N
  processes under horovodrun that buries the engine's own output.
- TF_ENABLE_ONEDNN_OPTS=1, a default: oneDNN's convolution, pooling and
  normalization kernels. TensorFlow turns them on by itself only on CPUs
  with AVX512_VNNI, AVX512_BF16 or AMX and runs Eigen's elsewhere; on an
  AVX2 AMD EPYC oneDNN's step of ResNet-9 was 2.5x faster at width 8 and
  1.45x at width 16 (BUILD.md, "CPU kernels"). GPU kernels are not
  affected.

TensorFlow's own import prints nothing that TF_CPP_MIN_LOG_LEVEL hides
(engine/core/quiet_import.py says why that takes more than the setting).
"""
import os
import sys

from engine.core import quiet_import

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

quiet_import.install()
if "tensorflow" in sys.modules and not sys.modules[
    "tensorflow"].keras.__name__.startswith("tf_keras"):
  raise ImportError("tf.keras is Keras 3: it was used before the engine was "
                    "imported, too late for TF_USE_LEGACY_KERAS=1; import "
                    "engine before TensorFlow, or export "
                    "TF_USE_LEGACY_KERAS=1")
