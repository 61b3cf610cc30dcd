"""A TensorFlow 2 training engine for data-parallel training with Horovod.

Settings read once, early (Keras' backend as Keras loads;
TensorFlow's log level as it loads; the kernels the first time it asks
which to use), so they must be made before Keras or TensorFlow is
imported, which is why they live here: every
entry point, worker and test imports the engine first.

- KERAS_BACKEND=tensorflow, always: the engine's Keras is Keras 3, the one
  `import keras` gives (and `tf.keras` on TensorFlow 2.16 and later), on
  TensorFlow's backend, where every Keras variable holds a `tf.Variable`
  that the compiled step, Horovod's collectives and `tf.train.Checkpoint`
  work on. A script that imported Keras on another backend (JAX, PyTorch)
  before the engine is stopped here with what to do; a model built with
  tf_keras (Keras 2) is refused in one line at start-up
  (models/__init__.py, `refuse_keras2`).
- TF_CPP_MIN_LOG_LEVEL=2, a default: the runtime logs every kernel
  registration and oneDNN notice at start-up, once per process; with N
  processes under horovodrun that buries the engine's own output.
- TF_ENABLE_ONEDNN_OPTS=1, a default: oneDNN's convolution, pooling and
  normalization kernels. TensorFlow turns them on by itself only on CPUs
  with AVX512_VNNI, AVX512_BF16 or AMX and runs Eigen's elsewhere; on an
  AVX2 AMD EPYC oneDNN's step of ResNet-9 was 2.5x faster at width 8 and
  1.45x at width 16 (BUILD.md, "CPU kernels"). GPU kernels are not
  affected.

- TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS, defaults under a
  launcher (horovodrun, mpirun): this process's share of the host's cores,
  as the engine sets its thread pools (engine/distributed/world.py,
  `cpu_threads`). A fit script runs TensorFlow (its tf.data pipelines)
  before the engine starts, which fixes the pools for the process's life:
  without these, each of N processes on a host would take every core.

TensorFlow's own import prints nothing that TF_CPP_MIN_LOG_LEVEL hides
(engine/core/quiet_import.py says why that takes more than the setting).
"""
import os
import sys

from engine.core import cpu
from engine.core import quiet_import

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_PROCESSES_ON_HOST = (os.environ.get("HOROVOD_LOCAL_SIZE")
                      or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE"))
if _PROCESSES_ON_HOST:
  _THREADS = cpu.cpu_threads(cpu.available_cores(), int(_PROCESSES_ON_HOST))
  os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(_THREADS[0]))
  os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(_THREADS[1]))

quiet_import.install()
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != \
    "tensorflow":
  raise ImportError(
      f"Keras was imported on the {sys.modules['keras'].backend.backend()} "
      "backend before the engine; the engine trains on TensorFlow's: "
      "import engine before keras, or export KERAS_BACKEND=tensorflow")


def __getattr__(name: str):
  """`engine.fit`, a fit script's entry (engine/fit_script.py), imported
  when first asked for: `import engine` itself must not load TensorFlow
  (above)."""
  if name == "fit":
    from engine.fit_script import fit  # pylint: disable=import-outside-toplevel
    return fit
  raise AttributeError(f"module 'engine' has no attribute {name!r}")
