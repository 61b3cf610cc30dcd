r"""CosmoFlow trained by Keras `fit` and Horovod alone: the engine's
independent rival (issue 41).

What a competent Keras user writes after the MLPerf HPC reference
(mlcommons/hpc, cosmoflow/): nothing here is the engine's (no engine
import: its model, input pipeline, schedules and evaluation are not used),
so an engine lever that also speeds up the model or the input does not
reach this trainer. As the reference:
- the model: blocks of Conv3D (kernel, "same", bias) -> LeakyReLU ->
  MaxPool3D(2), --conv_layers of them (0: as many as halve 32^3 down to
  2 voxels, 4; the reference's 5 on its 128^3 volumes), filters
  doubling from --filters; Flatten; Dense 128 and 64, each LeakyReLU and
  Dropout(--dropout); Dense(targets, tanh) scaled by 1.2;
- the data: GZIP TFRecords listed, sharded by rank (files, as the
  reference's `data.shard`), interleaved, parsed (`x` raw int16, `y` 4
  floats), log(1 + x), shuffled, batched, prefetched;
- the distribution: `hvd.DistributedOptimizer`,
  `BroadcastGlobalVariablesCallback(0)`, `MetricAverageCallback`; the rate
  scaled by the processes and warmed up from the base rate over
  --warmup_epochs (what `hvd.callbacks.LearningRateWarmupCallback` does),
  then decayed; MSE on the targets as stored.

and as fast as Keras and tf.data let a skilled user make it: every map
parallel and AUTOTUNE'd, the files read by a parallel interleave, the
decoded volumes `.cache()`d in memory (--cache; both are reported), the
warmup and decay as a schedule object in the optimizer rather than a
callback each batch, `steps_per_execution` (--steps_per_execution),
XLA (--jit_compile), one intra- and inter-op thread a process and each
process bound to its own core (--bind_cores: what `mpirun --bind-to core`
does; horovodrun --gloo binds nothing).

Besides the reference's: a per-channel normalization after log(1 + x)
(--normalize: mean and std from the first record of up to 64 training
files spread over the set), and --random_flip and --random_transpose of
the three axes per volume, since the engine's recipe
(flags/cosmoflow_mini.cfg) trains with them.

It reads the engine's flagfile: the settings both share keep the engine's
names and meanings (--data_dir, --batch_size per process, --epochs,
--seed, --optimizer sgd|adam, --momentum, --base_lr, --lr_scaling,
--warmup_epochs, --lr_schedule cosine|linear|constant, --filters,
--kernel_size, --conv_layers, --dropout, --log_transform, --random_flip,
--random_transpose); the engine's others are ignored, and named on rank 0.

Validation after each epoch, exactly over the whole validation set: each
rank predicts its shard of the validation files, and the sums of absolute
and squared errors and of the targets are summed across ranks (float64),
so MAE, RMSE and R² are the whole set's, as the engine's. Rank 0 appends a
record per epoch to --model_dir/metrics.jsonl in the engine's shape
(`epoch`, `val_mae`, `val_rmse`, `val_r2`, `images_per_sec` of the
training steps alone, `cumulative_seconds`), so bench/against_keras.py and
engine.runs read both alike.

  horovodrun --gloo -np 2 .venv/bin/python -m bench.keras_cosmoflow \
    --flagfile=bench/cosmoflow_speed.cfg --cache --model_dir=/tmp/kc
"""
import glob
import json
import os
import sys
import time

# Keras 2 as tf.keras (Horovod's Keras bindings need it), oneDNN, quiet:
# before TensorFlow loads.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

FLAGS = flags.FLAGS
# The engine's names and meanings.
flags.DEFINE_string("data_dir", "data/cosmo41",
                    "CosmoFlow's layout: train/ and validation/ GZIP "
                    "TFRecords, features.txt.")
flags.DEFINE_string("model_dir", "/tmp/keras_cosmoflow",
                    "Where rank 0 writes metrics.jsonl.")
flags.DEFINE_integer("batch_size", 8, "Per process.")
flags.DEFINE_integer("epochs", 8, "Epochs.")
flags.DEFINE_integer("seed", 0, "Initial weights, shuffles, augmentation.")
flags.DEFINE_enum("optimizer", "sgd", ["sgd", "adam"], "Optimizer.")
flags.DEFINE_float("momentum", 0.9, "SGD's momentum.")
flags.DEFINE_float("base_lr", 0.01, "The rate for one process.")
flags.DEFINE_enum("lr_scaling", "linear", ["linear", "sqrt", "none"],
                  "The rate for N processes: base_lr x N, x sqrt(N), or not.")
flags.DEFINE_float("warmup_epochs", 0.0, "From base_lr to the scaled rate, "
                   "per step, over these epochs.")
flags.DEFINE_enum("lr_schedule", "constant", ["constant", "cosine", "linear"],
                  "After warmup, per step, to 0 at the end (or constant).")
flags.DEFINE_integer("filters", 16, "The first block's filters.")
flags.DEFINE_integer("kernel_size", 3, "Conv3D's kernel side.")
flags.DEFINE_integer("conv_layers", 0, "Blocks; 0 = as many as leave 2 "
                     "voxels or more along the smallest axis, at most 5.",
                     lower_bound=0)
flags.DEFINE_float("dropout", 0.0, "Dropout after each dense layer.")
flags.DEFINE_bool("log_transform", True, "log(1 + x), the reference's "
                  "apply_log.")
flags.DEFINE_bool("random_flip", False, "Flip each volume along each axis "
                  "with probability 1/2.")
flags.DEFINE_bool("random_transpose", False, "A random order of each "
                  "volume's three axes.")
flags.DEFINE_string("progress", "none", "Accepted for the engine's command "
                    "line; this trainer prints one line an epoch on rank 0.")
# This trainer's own levers.
flags.DEFINE_bool("cache", False, "Cache each rank's decoded, transformed "
                  "volumes in memory after the first epoch (.cache()).")
flags.DEFINE_bool("normalize", True, "Each channel to mean 0 and std 1 "
                  "after log(1 + x), by a sample of the training files.")
flags.DEFINE_integer("steps_per_execution", 1, "Keras' steps per call of "
                     "its train function.", lower_bound=1)
flags.DEFINE_bool("jit_compile", False, "XLA-compile the train step.")
flags.DEFINE_enum("mixed_precision", "none", ["none", "bfloat16"],
                  "Keras' mixed_bfloat16 policy (variables float32, the "
                  "layers' math bfloat16, the output layers float32), as a "
                  "Keras user who knows the CPU has AVX512-BF16 sets it.")
flags.DEFINE_bool("bind_cores", True, "Bind each process to its own share "
                  "of the cores; one intra- and inter-op thread for each.")
flags.DEFINE_integer("num_groups", 0, "hvd.DistributedOptimizer's "
                     "num_groups: 0 lets Horovod fuse as it goes; 1 sends "
                     "all the gradients in one allreduce.")
flags.DEFINE_float("cycle_time_ms", 0, "HOROVOD_CYCLE_TIME for hvd.init(), "
                   "as a user who has read Horovod's tuning guide sets it; "
                   "0 leaves Horovod's default (1 ms).", lower_bound=0)
flags.DEFINE_bool("mpi_yield_when_idle", False, "OMPI_MCA_mpi_yield_when_idle"
                  "=1 for hvd.init() under horovodrun --mpi, as the engine "
                  "sets it on CPU (BUILD.md).")

NORMALIZATION_FILES = 64
OUTPUT_SCALE = 1.2


# --- Distribution: Horovod, threads, cores --------------------------------

def init_horovod() -> None:
  if FLAGS.cycle_time_ms:
    os.environ["HOROVOD_CYCLE_TIME"] = str(FLAGS.cycle_time_ms)
  if FLAGS.mpi_yield_when_idle:
    os.environ["OMPI_MCA_mpi_yield_when_idle"] = "1"
  hvd.init()
  if FLAGS.bind_cores:
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // hvd.local_size())
    mine = set(cores[hvd.local_rank() * share:][:share]) or set(cores)
    for thread in os.listdir("/proc/self/task"):  # Horovod's threads too
      try:
        os.sched_setaffinity(int(thread), mine)
      except ProcessLookupError:
        pass
    tf.config.threading.set_intra_op_parallelism_threads(len(mine))
    tf.config.threading.set_inter_op_parallelism_threads(1)


# --- Input pipeline -------------------------------------------------------

def read_spec(data_dir: str) -> tuple:
  """The volume's shape and the targets' count, from features.txt."""
  with open(os.path.join(data_dir, "features.txt")) as f:
    x, y = (line.split(":") for line in f.read().split())
  return tuple(int(n) for n in x[2].split("x")), int(y[2])


def split_files(split: str) -> list:
  files = sorted(glob.glob(os.path.join(FLAGS.data_dir, split, "*")))
  if len(files) < hvd.size():
    sys.exit(f"keras_cosmoflow: {len(files)} files in {split}/ for "
             f"{hvd.size()} processes")
  return files


def parser(shape, targets, mean=None, std=None):
  def parse(record):
    example = tf.io.parse_single_example(record, {
        "x": tf.io.FixedLenFeature([], tf.string),
        "y": tf.io.FixedLenFeature([targets], tf.float32)})
    x = tf.cast(tf.reshape(tf.io.decode_raw(example["x"], tf.int16), shape),
                tf.float32)
    if FLAGS.log_transform:
      x = tf.math.log1p(x)
    if mean is not None:
      x = (x - mean) / std
    return x, example["y"]
  return parse


def channel_statistics(files, shape, targets):
  """Each channel's mean and std over the first record of up to 64 files
  spread over the training set: every rank reads the same ones."""
  chosen = files[::max(1, len(files) // NORMALIZATION_FILES)][
      :NORMALIZATION_FILES]
  volumes = np.stack([x.numpy() for x, _ in tf.data.TFRecordDataset(
      chosen, "GZIP").map(parser(shape, targets))])
  axes = tuple(range(volumes.ndim - 1))
  return (volumes.mean(axes).astype(np.float32),
          np.maximum(volumes.std(axes), 1e-6).astype(np.float32))


def augment(x, y):
  """Flips along each axis, then a random order of the three axes: one
  reverse and one transpose a volume."""
  if FLAGS.random_flip:
    flips = tf.random.uniform([3]) < 0.5
    x = tf.reverse(x, tf.boolean_mask(tf.range(3), flips))
  if FLAGS.random_transpose:
    x = tf.transpose(x, tf.concat([tf.random.shuffle(tf.range(3)), [3]], 0))
  return x, y


def dataset(files, parse, *, training: bool) -> tf.data.Dataset:
  autotune = tf.data.AUTOTUNE
  data = tf.data.Dataset.from_tensor_slices(files).shard(hvd.size(),
                                                        hvd.rank())
  if training and not FLAGS.cache:
    data = data.shuffle(len(files), seed=FLAGS.seed,
                        reshuffle_each_iteration=True)
  data = data.interleave(
      lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
      cycle_length=4, num_parallel_calls=autotune, deterministic=False)
  data = data.map(parse, num_parallel_calls=autotune, deterministic=False)
  if FLAGS.cache:
    data = data.cache()
  if not training:
    return data.batch(FLAGS.batch_size).prefetch(autotune)
  if FLAGS.cache:  # shuffled in memory, the whole shard each epoch
    data = data.shuffle(len(files) // hvd.size(), seed=FLAGS.seed,
                        reshuffle_each_iteration=True)
  data = data.repeat()
  if FLAGS.random_flip or FLAGS.random_transpose:
    data = data.map(augment, num_parallel_calls=autotune,
                    deterministic=False)
  return data.batch(FLAGS.batch_size, drop_remainder=True).prefetch(autotune)


# --- Model ----------------------------------------------------------------

def build_model(shape, targets) -> tf.keras.Model:
  layers = tf.keras.layers
  model = tf.keras.Sequential([tf.keras.Input(shape)])
  blocks = FLAGS.conv_layers or max(1, min(5, int(np.log2(min(shape[:3])))
                                           - 1))
  for i in range(blocks):
    model.add(layers.Conv3D(FLAGS.filters * 2 ** i, FLAGS.kernel_size,
                            padding="same"))
    model.add(layers.LeakyReLU())
    model.add(layers.MaxPool3D(2))
  model.add(layers.Flatten())
  for size in (128, 64):
    model.add(layers.Dense(size))
    model.add(layers.LeakyReLU())
    model.add(layers.Dropout(FLAGS.dropout))
  # The output in float32, as Keras' mixed precision guide advises.
  model.add(layers.Dense(targets, activation="tanh", dtype="float32"))
  model.add(layers.Rescaling(OUTPUT_SCALE, dtype="float32"))
  return model


def learning_rate(steps_per_epoch: int):
  peak = FLAGS.base_lr * {"linear": hvd.size(), "sqrt": hvd.size() ** 0.5,
                          "none": 1}[FLAGS.lr_scaling]
  warmup = round(FLAGS.warmup_epochs * steps_per_epoch)
  total = FLAGS.epochs * steps_per_epoch
  if FLAGS.lr_schedule == "cosine":
    return tf.keras.optimizers.schedules.CosineDecay(
        FLAGS.base_lr if warmup else peak, total - warmup,
        warmup_target=peak if warmup else None, warmup_steps=warmup)
  decay = tf.keras.optimizers.schedules.PolynomialDecay(
      peak, total - warmup, 0.0) if FLAGS.lr_schedule == "linear" else None
  if not warmup and decay is None:
    return peak

  class WarmupThen(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
      step = tf.cast(step, tf.float32)
      warm = FLAGS.base_lr + (peak - FLAGS.base_lr) * step / max(warmup, 1)
      after = decay(step - warmup) if decay else tf.constant(peak)
      return tf.where(step < warmup, warm, after)

  return WarmupThen()


# --- Evaluation and records -----------------------------------------------

class EvaluateAndRecord(tf.keras.callbacks.Callback):
  """After each epoch: the whole validation set's MAE, RMSE and R² (each
  rank its shard, sums across ranks), and rank 0's record."""

  def __init__(self, validation, *, samples_per_epoch: int):
    super().__init__()
    self._validation = validation
    self._samples = samples_per_epoch
    self._records = os.path.join(FLAGS.model_dir, "metrics.jsonl")
    self._started = self._epoch_started = 0.0
    self._predict = None

  def on_train_begin(self, logs=None):
    self._started = time.perf_counter()
    self._predict = tf.function(lambda x: self.model(x, training=False))
    if hvd.rank() == 0:
      os.makedirs(FLAGS.model_dir, exist_ok=True)
      open(self._records, "w").close()

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch_started = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    train_seconds = time.perf_counter() - self._epoch_started
    sums = None
    for x, y in self._validation:
      error = self._predict(x).numpy().astype(np.float64) - y.numpy()
      y = y.numpy().astype(np.float64)
      batch = np.stack([np.abs(error).sum(0), np.square(error).sum(0),
                        y.sum(0), np.square(y).sum(0),
                        np.full(y.shape[1], len(y), np.float64)])
      sums = batch if sums is None else sums + batch
    sums = hvd.allreduce(sums, op=hvd.Sum, name="validation_sums")
    absolute, squared, total, total_squared, n = np.asarray(sums)
    variance = total_squared / n - np.square(total / n)
    record = {"epoch": epoch + 1, "epochs": FLAGS.epochs,
              "train_loss": float(logs["loss"]),
              "val_mae": float((absolute / n).mean()),
              "val_rmse": float(np.sqrt((squared / n).mean())),
              "val_r2": float((1 - squared / n / variance).mean()),
              "val_examples": int(n[0]),
              "images_per_sec": self._samples / train_seconds,
              "train_seconds": train_seconds,
              "cumulative_seconds": time.perf_counter() - self._started,
              "world_size": hvd.size()}
    if hvd.rank() == 0:
      with open(self._records, "a") as f:
        f.write(json.dumps(record) + "\n")
      print(f"epoch {epoch + 1}: {record['images_per_sec']:.1f} volumes/s, "
            f"val MAE {record['val_mae']:.4f}", flush=True)


# --- Training -------------------------------------------------------------

def main(argv):
  init_horovod()
  if hvd.rank() == 0 and len(argv) > 1:
    print("keras_cosmoflow: the engine's flags ignored: "
          + " ".join(argv[1:]), flush=True)
  tf.keras.utils.set_random_seed(FLAGS.seed)
  shape, targets = read_spec(FLAGS.data_dir)
  train_files, validation_files = split_files("train"), split_files(
      "validation")
  mean = std = None
  if FLAGS.normalize:
    mean, std = channel_statistics(train_files, shape, targets)
  parse = parser(shape, targets, mean, std)
  steps_per_epoch = len(train_files) // hvd.size() // FLAGS.batch_size
  train = dataset(train_files, parse, training=True)
  validation = dataset(validation_files, parse, training=False)

  if FLAGS.mixed_precision == "bfloat16":
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
  model = build_model(shape, targets)
  optimizer = (tf.keras.optimizers.SGD(0.0, momentum=FLAGS.momentum)
               if FLAGS.optimizer == "sgd" else tf.keras.optimizers.Adam(0.0))
  # hvd.DistributedOptimizer rebuilds the optimizer from its config, which
  # carries no schedule object of our own: the rate is set on the rebuilt.
  optimizer = hvd.DistributedOptimizer(optimizer, num_groups=FLAGS.num_groups)
  optimizer.learning_rate = learning_rate(steps_per_epoch)
  model.compile(optimizer=optimizer,
                loss="mse", metrics=["mae"],
                steps_per_execution=FLAGS.steps_per_execution,
                jit_compile=FLAGS.jit_compile)
  model.fit(train, epochs=FLAGS.epochs, steps_per_epoch=steps_per_epoch,
            verbose=0, callbacks=[
                hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                hvd.callbacks.MetricAverageCallback(),
                EvaluateAndRecord(validation, samples_per_epoch=(
                    steps_per_epoch * FLAGS.batch_size * hvd.size()))])


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: FLAGS(argv, known_only=True))
