r"""CosmoFlow's network alone: the engine's blocks against the reference's
layers, forward and backward, on one thread.

  .venv/bin/python -m bench.cosmoflow_network --conv_layers=5 --repeats=3

What it answers: how much of the engine's lead over a Keras fit trainer
(bench/against_keras.py --configs=engine,independent) its network gives,
with no loop, input or allreduce around it. Each variant times, in a fresh
process on one intra- and one inter-op thread (as the engine gives each of
2 processes on 2 cores), one batch's forward pass and its gradients (MSE
against random targets, no optimizer) in a compiled function, the median
of --steps after two warm-up calls:
- `keras`: the reference's layers in tf_keras, bench/keras_cosmoflow.py's
  model (Conv3D with its bias, LeakyReLU, MaxPool3D a block);
- `direct`: models/cosmoflow.py with every block convolved by oneDNN;
- `taps`: the same, but a block of at most MAX_SIDE_BY_TAPS voxels a side
  convolved by taps (the engine before Winograd);
- `engine`: models/cosmoflow.py as it builds itself (taps there, and
  Winograd's algorithm on blocks of at least MIN_SIDE_BY_WINOGRAD).
Rounds interleave the variants (bench/interleaved.py).

With --ops, one variant (--variant, or `engine`) is traced by TensorFlow's
profiler over --steps calls instead, and its kernels listed by their time
in a call: where the network's time goes, by kernel (a block's
convolution forward, and its gradients of the kernel and of the input).

  .venv/bin/python -m bench.cosmoflow_network --ops
"""
import collections
import glob
import os
import statistics
import sys
import time

from absl import app
from absl import flags

# Its model, and its flags: --filters, --kernel_size, --conv_layers,
# --batch_size, --dropout.
from bench import keras_cosmoflow

FLAGS = flags.FLAGS
VARIANTS = ("keras", "direct", "taps", "engine")
flags.DEFINE_integer("size", 32, "The volumes' side.")
flags.DEFINE_integer("channels", 4, "The volumes' channels.")
flags.DEFINE_integer("steps", 9, "Timed calls a variant and round.")
flags.DEFINE_integer("repeats", 3, "Rounds.")
flags.DEFINE_enum("variant", None, VARIANTS, "(worker) Time this variant.")
flags.DEFINE_bool("ops", False, "Trace one variant and list its kernels' "
                  "time in a call (above).")
flags.DEFINE_integer("top", 25, "--ops: the kernels listed.")
FLAGS.set_default("filters", 32)
FLAGS.set_default("conv_layers", 5)


def engines(variant: str):
  """models/cosmoflow.py's network; `direct` with no block by taps or
  Winograd, `taps` with none by Winograd."""
  from models import cosmoflow  # pylint: disable=g-import-not-at-top
  if variant in ("direct", "taps"):
    cosmoflow.MIN_SIDE_BY_WINOGRAD = FLAGS.size + 1
  if variant == "direct":
    cosmoflow.MAX_SIDE_BY_TAPS = 0
  return cosmoflow.build(
      input_shape=(FLAGS.size,) * 3 + (FLAGS.channels,), num_classes=4,
      filters=FLAGS.filters, conv_layers=FLAGS.conv_layers,
      kernel_size=FLAGS.kernel_size)


def compiled_pass(variant: str):
  """The variant's forward and backward pass of one batch as a compiled
  function, on one intra- and one inter-op thread, called twice."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  shape = (FLAGS.size,) * 3 + (FLAGS.channels,)
  model = (keras_cosmoflow.build_model(shape, 4) if variant == "keras"
           else engines(variant))
  volumes = tf.random.normal((FLAGS.batch_size,) + shape)
  targets = tf.random.uniform((FLAGS.batch_size, 4), -1, 1)

  @tf.function
  def gradients():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(volumes, training=True)
                                      - targets))
    return tape.gradient(loss, model.trainable_variables)

  gradients(), gradients()
  return gradients


def time_variant(variant: str) -> float:
  """One batch's forward and backward pass, ms: the median of --steps."""
  gradients = compiled_pass(variant)
  seconds = []
  for _ in range(FLAGS.steps):
    start = time.perf_counter()
    gradients()
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds) * 1e3


def list_ops(variant: str) -> None:
  """--ops: the variant's kernels by their time in a call, from the
  profiler's trace of --steps calls."""
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bench import interleaved  # pylint: disable=g-import-not-at-top
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  gradients = compiled_pass(variant)
  logdir = tempfile.mkdtemp(prefix="cosmoflow_ops_")
  tf.profiler.experimental.start(logdir)
  start = time.perf_counter()
  for _ in range(FLAGS.steps):
    gradients()
  call_ms = (time.perf_counter() - start) / FLAGS.steps * 1e3
  tf.profiler.experimental.stop()
  space = xplane_pb2.XSpace()
  with open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0],
            "rb") as f:
    space.ParseFromString(f.read())
  shutil.rmtree(logdir)
  kernels = collections.Counter()
  for plane in space.planes:
    for line in plane.lines:
      if not line.name.startswith("tf_Compute"):  # the executor's thread
        continue
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        if ":" in name.replace("::", ""):  # a kernel: "op name:op type"
          kernels[name] += event.duration_ps / 1e9 / FLAGS.steps
  print(f"{interleaved.cpu()}; {variant}: {call_ms:.1f} ms a call traced, "
        f"its kernels {sum(kernels.values()):.1f} ms")
  for name, ms in kernels.most_common(FLAGS.top):
    print(f"{ms:8.2f} ms  {name}")


def main(argv):
  if FLAGS.ops:
    list_ops(FLAGS.variant or "engine")
    return
  if FLAGS.variant:
    print(f"{time_variant(FLAGS.variant):.2f}")
    return
  from bench import interleaved  # pylint: disable=g-import-not-at-top
  del argv
  passed = [a for a in sys.argv[1:] if a.startswith("--")]

  def measure(variant: str, round_: int) -> float:
    del round_
    out = interleaved.launch([interleaved.PYTHON, "-m",
                              "bench.cosmoflow_network", *passed,
                              f"--variant={variant}"])
    return float(out.split()[-1])

  print(f"{interleaved.cpu()}; {FLAGS.size}^3 x {FLAGS.channels}, "
        f"{FLAGS.conv_layers} blocks from {FLAGS.filters} filters, kernel "
        f"{FLAGS.kernel_size}, batch {FLAGS.batch_size}: ms a forward and "
        "backward pass", flush=True)
  results = interleaved.rounds(
      VARIANTS, measure, FLAGS.repeats,
      show=lambda variant, round_, ms: f"  round {round_ + 1} {variant}: "
                                       f"{ms:.1f} ms")
  keras = statistics.median(results["keras"])
  for variant, found in results.items():
    median = statistics.median(found)
    print(f"{variant}: median {median:.1f} ms, keras / {variant} "
          f"{keras / median:.3f}")


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main)
