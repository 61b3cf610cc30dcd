r"""CosmoFlow's train step alone: where its time goes, and what each lever
of the step does to it, one process on in-memory batches.

  .venv/bin/python -m bench.cosmoflow_step --variants=leaky,max --rounds=5
  .venv/bin/python -m bench.cosmoflow_step --variants=leaky --profile=5

Builds the network of models/cosmoflow.py (its block written several ways,
`--variants`), the engine's TrainStep (regression, MSE, SGD with momentum
0.9, float32) and times `--steps` steps a round on one fixed batch of
`--batch_size` volumes held in memory (no input pipeline: what the step
costs alone), the variants interleaved over `--rounds`, the order reversed
every other round. A variant is a name of `VARIANTS` or several joined by
`+` (`max+k3`). With `--profile=N`, traces N steps of each variant with
TensorFlow's profiler and prints the ops' total self time, largest first.

Threads as the engine gives each of 2 processes on 2 cores: 1 intra-op and
1 inter-op thread (`--intra`, `--inter` to change).
"""
import collections
import json
import os
import statistics
import tempfile
import time

from absl import app
from absl import flags

import engine  # noqa: F401  (oneDNN, Keras on TensorFlow)
import keras  # pylint: disable=wrong-import-order

FLAGS = flags.FLAGS
flags.DEFINE_list("variants", ["leaky"], "Variants to time (see VARIANTS).")
flags.DEFINE_integer("rounds", 3, "Rounds of every variant.")
flags.DEFINE_integer("steps", 20, "Steps a round (after 3 warm-up steps).")
flags.DEFINE_integer("batch_size", 8, "Volumes a step.")
flags.DEFINE_integer("size", 32, "Voxels a side.")
flags.DEFINE_integer("filters", 16, "Filters of the first block.")
flags.DEFINE_integer("intra", 1, "Intra-op threads.")
flags.DEFINE_integer("inter", 1, "Inter-op threads.")
flags.DEFINE_integer("profile", 0, "Trace this many steps of each variant.")
flags.DEFINE_integer("top", 25, "Ops shown per profile.")
flags.DEFINE_bool("by_layer", False, "Profile by op and layer.")
flags.DEFINE_enum("mixed_precision", "none", ["none", "bfloat16"],
                  "Keras' policy for every variant's model: bfloat16 as "
                  "the engine's --mixed_precision sets it.")
flags.DEFINE_string("input_dir", "", "With a data directory of volumes "
                    "(make_volumes): time rank 0 of 2's input instead, in "
                    "stages (GZIP records read; parsed and checked; the "
                    "engine's whole training pipeline; the same with "
                    "--cache_records), bound to one core.")

# Each variant's changes to the default block (LeakyReLU layer, kernel 2,
# channels last, no XLA, one step a call).
VARIANTS = {
    "leaky": {},                         # the reference's layers
    "model": {"order": "model"},         # models/cosmoflow.py's build
    "max": {"activation": "max"},        # tf.maximum(x, slope x)
    "relu": {"activation": "relu"},      # not the network: the bound
    "k3": {"kernel": 3},
    "xla": {"xla": True},
    "spc4": {"steps_per_call": 4},
    "spc8": {"steps_per_call": 8},
    "cfirst": {"channels_first": True},
    "nobias": {"bias": False},           # not the network: the bias' cost
    "nopool": {"pool": "stride"},        # not the network: strided convs
    # Max-pooling first, then the bias and LeakyReLU on an eighth of the
    # voxels: the same function (both are monotonic, per channel).
    "poolfirst": {"order": "pool_first"},
    # LeakyReLU's gradient from its output (the sign is the input's).
    "fromout": {"activation": "from_output"},
}


def options(variant: str) -> dict:
  chosen = {"activation": "leaky", "kernel": 2, "xla": False,
            "steps_per_call": 1, "channels_first": False, "bias": True,
            "pool": "max", "order": "reference"}
  for part in variant.split("+"):
    chosen.update(VARIANTS[part])
  return chosen


def build_model(tf, opts, input_shape):
  from models import cosmoflow
  layers = keras.layers
  slope = cosmoflow.LEAKY_SLOPE
  fmt = "channels_first" if opts["channels_first"] else "channels_last"

  def activation(x):
    if opts["activation"] == "leaky":
      return layers.LeakyReLU(slope)(x)
    if opts["activation"] == "relu":
      return layers.ReLU()(x)
    if opts["activation"] == "from_output":
      return layers.Lambda(leaky_from_output)(x)
    return layers.Lambda(lambda t: tf.maximum(t, slope * t))(x)

  @tf.custom_gradient
  def leaky_from_output(t):
    y = tf.nn.leaky_relu(t, slope)
    def grad(g):
      from tensorflow.python.ops import gen_nn_ops
      return gen_nn_ops.leaky_relu_grad(g, y, alpha=slope)
    return y, grad

  class BiasAfter(layers.Layer):
    def build(self, shape):
      self.bias = self.add_weight("bias", shape[-1:], initializer="zeros")
    def call(self, t):
      return tf.nn.bias_add(t, self.bias)

  if opts["order"] == "model":
    return cosmoflow.build(input_shape=input_shape, num_classes=4,
                           filters=FLAGS.filters, kernel_size=opts["kernel"])
  inputs = keras.Input(input_shape)
  x = inputs
  if opts["channels_first"]:
    x = layers.Permute((4, 1, 2, 3))(x)
  for i in range(cosmoflow.default_conv_layers(input_shape)):
    stride = 2 if opts["pool"] == "stride" else 1
    if opts["order"] == "pool_first":
      x = layers.Conv3D(FLAGS.filters * 2 ** i, opts["kernel"],
                        padding="same", use_bias=False)(x)
      x = layers.MaxPool3D(2)(x)
      x = activation(BiasAfter()(x))
      continue
    x = layers.Conv3D(FLAGS.filters * 2 ** i, opts["kernel"], strides=stride,
                      padding="same", use_bias=opts["bias"],
                      data_format=fmt)(x)
    x = activation(x)
    if opts["pool"] == "max":
      x = layers.MaxPool3D(2, data_format=fmt)(x)
  x = layers.Flatten()(x)
  for size in cosmoflow.DENSE_SIZES:
    x = activation(layers.Dense(size)(x))
  x = layers.Dense(4, activation="tanh")(x)
  outputs = layers.Rescaling(cosmoflow.OUTPUT_SCALE, dtype="float32")(x)
  return keras.Model(inputs, outputs)


class Runner:
  def __init__(self, tf, variant):
    from engine.compute import step as steps
    from engine.datasets.splits import DatasetInfo
    from engine.tasks.regression import Regression
    self.tf = tf
    self.opts = options(variant)
    shape = (FLAGS.size,) * 3 + (4,)
    keras.utils.set_random_seed(0)
    model = build_model(tf, self.opts, shape)
    info = DatasetInfo(name="volumes", image_shape=shape, num_classes=4,
                       num_train=512, num_test=64, mean=(0.0,) * 4,
                       std=(1.0,) * 4, label_shape=(4,), label_dtype="float32")
    task = Regression(info, standardize_targets=False)
    optimizer = keras.optimizers.SGD(0.001, momentum=0.9)
    self.step = steps.TrainStep(model=model, optimizer=optimizer, task=task,
                                xla=self.opts["xla"])
    rng = tf.random.Generator.from_seed(1)
    images = rng.normal((FLAGS.batch_size, *shape))
    labels = rng.uniform((FLAGS.batch_size, 4), -1, 1)
    self.batches = iter(tf.data.Dataset.from_tensors(
        (images, labels)).repeat())
    self.images, self.labels = images, labels
    self.run(3)

  def run(self, count: int) -> None:
    k = self.opts["steps_per_call"]
    done = 0
    while done < count:
      if k == 1:
        images, labels = next(self.batches)
        self.step(images, labels)
        done += 1
      else:
        ran, _ = self.step.steps(self.batches, min(k, count - done))
        done += ran

  def time(self, count: int) -> float:
    start = time.perf_counter()
    self.run(count)
    return (time.perf_counter() - start) / count


def profile(tf, runner, variant: str) -> None:
  logdir = tempfile.mkdtemp(prefix="cosmo_profile_")
  tf.profiler.experimental.start(logdir)
  runner.run(FLAGS.profile)
  tf.profiler.experimental.stop()
  paths = [os.path.join(root, f) for root, _, files in os.walk(logdir)
           for f in files if f.endswith(".xplane.pb")]
  from xprof.convert import raw_to_tool_data
  data, _ = raw_to_tool_data.xspace_to_tool_data(paths, "trace_viewer", {})
  events = json.loads(data)["traceEvents"]
  names = {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "thread_name":
      names[(e["pid"], e["tid"])] = e["args"]["name"]
  totals = collections.Counter()
  counts = collections.Counter()
  for e in events:
    if e.get("ph") != "X":
      continue
    thread = names.get((e["pid"], e["tid"]), "")
    # Kernels: TensorFlow's executor threads (the op's name and type).
    if "tf_" not in thread and "Eigen" not in thread and "tf_Compute" not in \
        thread and "TF" not in thread:
      continue
    name = e["name"]
    if FLAGS.by_layer:
      long = e.get("args", {}).get("long_name", "")
      name = f"{name} {long.split(':')[0][:70]}"
    totals[name] += e.get("dur", 0)
    counts[name] += 1
  print(f"-- {variant}: {FLAGS.profile} steps, ms a step by op (threads: "
        f"{sorted(set(names.values()))[:8]})")
  total = sum(totals.values())
  for name, us in totals.most_common(FLAGS.top):
    print(f"  {us / 1000 / FLAGS.profile:8.2f} ms  {counts[name] // FLAGS.profile:3d}x  {name}")
  print(f"  {total / 1000 / FLAGS.profile:8.2f} ms  all events listed")


def time_input(tf) -> None:
  """ms a batch of each stage of rank 0 of 2's input, on one core."""
  import glob
  from engine.datasets import Epochs, Shard, record_features
  from engine.datasets import tfrecord
  from engine.input import data
  from engine.datasets.augmentation import Augmentation
  os.sched_setaffinity(0, {0})
  files = sorted(glob.glob(os.path.join(FLAGS.input_dir, "train", "*")))[0::2]
  spec = record_features.spec_of(FLAGS.input_dir, "")
  batch = FLAGS.batch_size
  steps = len(files) // batch

  def read():
    return tf.data.TFRecordDataset(files, "GZIP").batch(batch)

  def parsed():
    return tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda f: record_features.records(f, "GZIP"), cycle_length=4,
        num_parallel_calls=4, deterministic=True).map(
            spec.decode, num_parallel_calls=1).batch(batch)

  def pipeline(cache_records=False):
    loaded = tfrecord.load(data_dir=FLAGS.input_dir, image_size=0,
                           num_classes=0, label_offset=0, train_examples=0,
                           test_examples=0, log_transform=True,
                           cache_records=cache_records)
    return data.train_stream(
        loaded.train, loaded.info, shard=Shard(0, 2),
        epochs=Epochs(batch_size=batch, steps=steps, seed=0),
        augmentation=Augmentation(flip=True, transpose=True))

  stages = {"read": read, "parsed": parsed, "pipeline": pipeline,
            "cached": lambda: pipeline(cache_records=True)}
  times = collections.defaultdict(list)
  for r in range(FLAGS.rounds):
    for name, make in (stages.items() if r % 2 == 0
                       else reversed(stages.items())):
      it = iter(make())
      next(it)
      start = time.perf_counter()
      for _ in range(steps - 1):
        next(it)
      times[name].append((time.perf_counter() - start) / (steps - 1))
  for name in stages:
    print(f"{name:>10}: median {statistics.median(times[name]) * 1000:.1f} "
          f"ms a batch of {batch}; rounds "
          + " ".join(f"{t * 1000:.1f}" for t in times[name]))


def main(argv):
  del argv
  import tensorflow as tf
  if FLAGS.input_dir:
    return time_input(tf)
  tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra)
  tf.config.threading.set_inter_op_parallelism_threads(FLAGS.inter)
  import horovod.tensorflow as hvd
  hvd.init()
  from engine.compute import precision
  precision.set_policy(FLAGS.mixed_precision)
  runners = {v: Runner(tf, v) for v in FLAGS.variants}
  for variant, runner in runners.items():
    if FLAGS.profile:
      profile(tf, runner, variant)
  if not FLAGS.rounds:
    return
  times = collections.defaultdict(list)
  for r in range(FLAGS.rounds):
    order = FLAGS.variants[::-1] if r % 2 else FLAGS.variants
    line = []
    for variant in order:
      seconds = runners[variant].time(FLAGS.steps)
      times[variant].append(seconds)
      line.append(f"{variant} {seconds * 1000:.1f}")
    print(f"round {r + 1} (ms a step, load {os.getloadavg()[0]:.2f}): "
          + ", ".join(line), flush=True)
  base = statistics.median(times[FLAGS.variants[0]])
  for variant in FLAGS.variants:
    med = statistics.median(times[variant])
    print(f"{variant:>16}: median {med * 1000:.1f} ms a step "
          f"({FLAGS.batch_size / med:.0f} volumes/s), "
          f"{base / med:.3f}x {FLAGS.variants[0]}; rounds "
          + " ".join(f"{t * 1000:.1f}" for t in times[variant]))


if __name__ == "__main__":
  app.run(main)
