r"""CosmoFlow's network alone: the engine's blocks against the reference's
layers, forward and backward, on one thread (or --threads).

  .venv/bin/python -m bench.cosmoflow_network --conv_layers=5 --repeats=3
  .venv/bin/python -m bench.cosmoflow_network --size=128 --batch_size=1 \
      --variants=taps,engine,engine-avx2 --steps=3 --repeats=2

What it answers: how much of the engine's lead over a Keras fit trainer
of the MLPerf HPC reference's network its network gives, with no loop,
input or allreduce around it. Each variant times, in a fresh process on
one intra- and one inter-op thread (as the engine gives each of 2
processes on 2 cores), one batch's forward pass and its gradients (MSE
against random targets, no optimizer) in a compiled function, the median
of --steps after two warm-up calls, and the process's peak memory:
- `keras`: the reference's layers in Keras 3 (Conv3D with its bias,
  LeakyReLU, MaxPool3D a block; Dense 128 and 64);
- `direct`: models/cosmoflow.py with every block convolved by oneDNN;
- `taps`: the same, but a block of at most MAX_SIDE_BY_TAPS voxels a side
  convolved by taps: the engine with --cpu_kernels=off;
- `engine`: models/cosmoflow.py as it builds itself (taps there, and
  Winograd's algorithm on blocks of at least MIN_SIDE_BY_WINOGRAD, by the
  widest build of our kernels the CPU runs); `engine-avx2` with the
  portable build (--cpu_kernels=avx2).
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
import resource
import statistics
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
VARIANTS = ("keras", "direct", "taps", "engine", "engine-avx2")
flags.DEFINE_integer("size", 32, "The volumes' side.")
flags.DEFINE_integer("filters", 32, "The first block's; doubled a block.")
flags.DEFINE_integer("kernel_size", 3, "The Conv3D kernels' side.")
flags.DEFINE_integer("conv_layers", 5, "Blocks.")
flags.DEFINE_integer("batch_size", 8, "Volumes a pass.")
flags.DEFINE_integer("channels", 4, "The volumes' channels.")
flags.DEFINE_integer("steps", 9, "Timed calls a variant and round.")
flags.DEFINE_integer("repeats", 3, "Rounds.")
flags.DEFINE_integer("threads", 1, "Intra-op threads.")
flags.DEFINE_list("variants", ["keras", "direct", "taps", "engine"],
                  f"Of {', '.join(VARIANTS)}; the first is the reference.")
flags.DEFINE_enum("variant", None, VARIANTS, "(worker) Time this variant.")
flags.DEFINE_bool("ops", False, "Trace one variant and list its kernels' "
                  "time in a call (above).")
flags.DEFINE_integer("top", 25, "--ops: the kernels listed.")


def engines(variant: str):
  """models/cosmoflow.py's network; `direct` with no block by taps or
  Winograd, `taps` with none by Winograd."""
  from models import cosmoflow  # pylint: disable=g-import-not-at-top
  from models import winograd3d  # pylint: disable=g-import-not-at-top
  winograd3d.use({"direct": "off", "taps": "off",
                  "engine-avx2": "avx2"}.get(variant, "auto"))
  if variant == "direct":
    cosmoflow.MAX_SIDE_BY_TAPS = 0
  return cosmoflow.build(
      input_shape=(FLAGS.size,) * 3 + (FLAGS.channels,), num_classes=4,
      filters=FLAGS.filters, conv_layers=FLAGS.conv_layers,
      kernel_size=FLAGS.kernel_size)


def reference(shape):
  """CosmoFlow's network as the reference orders its layers, in Keras 3."""
  import keras  # pylint: disable=g-import-not-at-top
  from models import cosmoflow  # pylint: disable=g-import-not-at-top
  layers = keras.layers
  stack = [keras.Input(shape)]
  for i in range(FLAGS.conv_layers):
    stack += [layers.Conv3D(FLAGS.filters * 2 ** i, FLAGS.kernel_size,
                            padding="same"),
              layers.LeakyReLU(cosmoflow.LEAKY_SLOPE), layers.MaxPool3D(2)]
  stack.append(layers.Flatten())
  for size in cosmoflow.DENSE_SIZES:
    stack += [layers.Dense(size), layers.LeakyReLU(cosmoflow.LEAKY_SLOPE)]
  stack += [layers.Dense(4, activation="tanh"),
            layers.Rescaling(cosmoflow.OUTPUT_SCALE)]
  return keras.Sequential(stack)


def compiled_pass(variant: str):
  """The variant's forward and backward pass of one batch as a compiled
  function, on --threads intra- and one inter-op thread, called twice."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  shape = (FLAGS.size,) * 3 + (FLAGS.channels,)
  model = reference(shape) if variant == "keras" else engines(variant)
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


def time_variant(variant: str) -> tuple[float, float]:
  """One batch's forward and backward pass, ms (the median of --steps),
  and the process's peak resident memory, MB."""
  gradients = compiled_pass(variant)
  seconds = []
  for _ in range(FLAGS.steps):
    start = time.perf_counter()
    gradients()
    seconds.append(time.perf_counter() - start)
  peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return statistics.median(seconds) * 1e3, peak_kb / 1024


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
    print("%.2f %.0f" % time_variant(FLAGS.variant))
    return
  from bench import interleaved  # pylint: disable=g-import-not-at-top
  del argv
  passed = [a for a in sys.argv[1:] if a.startswith("--")]

  def measure(variant: str, round_: int) -> tuple[float, float]:
    del round_
    out = interleaved.launch([interleaved.PYTHON, "-m",
                              "bench.cosmoflow_network", *passed,
                              f"--variant={variant}"])
    ms, peak_mb = out.split()[-2:]
    return float(ms), float(peak_mb)

  print(f"{interleaved.cpu()}; {FLAGS.size}^3 x {FLAGS.channels}, "
        f"{FLAGS.conv_layers} blocks from {FLAGS.filters} filters, kernel "
        f"{FLAGS.kernel_size}, batch {FLAGS.batch_size}, {FLAGS.threads} "
        "threads: ms a forward and backward pass, peak MB", flush=True)
  results = interleaved.rounds(
      FLAGS.variants, measure, FLAGS.repeats,
      show=lambda variant, round_, found: f"  round {round_ + 1} {variant}: "
                                          "%.1f ms, %.0f MB" % found)
  reference = FLAGS.variants[0]
  first = statistics.median(ms for ms, _ in results[reference])
  for variant, found in results.items():
    median = statistics.median(ms for ms, _ in found)
    print(f"{variant}: median {median:.1f} ms, peak "
          f"{max(mb for _, mb in found):.0f} MB; {reference} / {variant} "
          f"{first / median:.3f}")


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main)
