r"""Horovod's TF2 synthetic benchmark against the engine, interleaved: the
same ResNet-50 at 224x224, random images, SGD at 0.01, a per-process batch,
float32, on the same processes. Prints every run's images/s per iteration
or epoch and each variant's ratio to the first variant by round.

  .venv/bin/python -m bench.horovod_benchmark --repeats=3

Variants:
- `horovod-N`: the benchmark's method, run here as `--worker` on N
  processes (`horovodrun --gloo`): `keras.applications.ResNet50`
  (`weights=None`, softmax output), one random batch kept on the device,
  a `tf.function` step of `tf.GradientTape` in `hvd.DistributedGradientTape`
  and SGD, the variables broadcast after the first step, TensorFlow's
  default threads; timed in iterations of --batches_per_iter steps after
  as many warm-up steps, images/s over all processes;
- `engine-N`: `engine.train --model=resnet50` on `--dataset=synthetic` at
  the same size, batch and optimizer (no momentum, no weight decay),
  epochs of --batches_per_iter steps, the first one the warm-up;
  `engine-N+FLAG` adds flags (`+model=bench/user_model_files.py:resnet50`:
  the benchmark's own network, with logits), and `-mpi` runs either on
  `horovodrun --mpi`.
"""
import os
import shutil
import statistics

from absl import app
from absl import flags

from bench import epochs
from bench import interleaved

FLAGS = flags.FLAGS
flags.DEFINE_list("variants", ["horovod-2", "engine-2"],
                  "horovod-N, engine-N, engine-N+FLAG..., either with -mpi.")
flags.DEFINE_integer("repeats", 2, "Rounds.", lower_bound=1)
flags.DEFINE_integer("batch_size", 8, "Images a step, each process.")
flags.DEFINE_integer("batches_per_iter", 5, "Steps a timed iteration.")
flags.DEFINE_integer("iters", 3, "Timed iterations a run.", lower_bound=1)
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "horovod_benchmark"),
                    "Each run's directory, emptied before it runs.")
flags.DEFINE_string("worker", "", "(internal) MODEL_DIR: run the benchmark's "
                    "method in this process.")
LEARNING_RATE = 0.01


def main(argv):
  del argv
  if FLAGS.worker:
    return worker(FLAGS.worker)
  print(f"CPU: {interleaved.cpu()}; {os.cpu_count()} cores", flush=True)
  results = interleaved.rounds(
      FLAGS.variants, run, FLAGS.repeats,
      show=lambda variant, round_, found: f"  round {round_ + 1} {variant}: "
      + ", ".join(f"{figure:.2f}" for figure in found))
  reference = results[FLAGS.variants[0]]
  for variant, runs in results.items():
    ratios = [statistics.median(mine) / statistics.median(theirs)
              for mine, theirs in zip(runs, reference)]
    print(f"{variant}: median {statistics.median(sum(runs, [])):.2f} img/s; "
          f"/ {FLAGS.variants[0]} by round "
          + ", ".join(f"{r:.3f}" for r in ratios), flush=True)


def run(variant: str, round_: int) -> list[float]:
  model_dir = os.path.join(FLAGS.out_dir,
                           f"{variant.replace('/', '_')}_{round_}")
  shutil.rmtree(model_dir, ignore_errors=True)
  os.makedirs(model_dir)
  runner, processes, controller, own_flags = interleaved.variant(variant)
  command = [interleaved.HOROVODRUN, f"--{controller}", "-np", str(processes),
             interleaved.PYTHON, "-m"]
  if runner == "horovod":
    interleaved.launch(command + ["bench.horovod_benchmark",
                                  f"--worker={model_dir}", *_shared_flags()])
  else:
    steps = FLAGS.batches_per_iter
    interleaved.launch(command + [
        "engine.train", "--model=resnet50", "--dataset=synthetic",
        "--image_size=224", "--num_classes=1000",
        f"--train_examples={steps * FLAGS.batch_size * processes}",
        f"--test_examples={FLAGS.batch_size * processes}",
        f"--batch_size={FLAGS.batch_size}", f"--steps_per_epoch={steps}",
        f"--epochs={FLAGS.iters + 1}", f"--eval_every_epochs={FLAGS.iters + 1}",
        "--optimizer=sgd", "--momentum=0", f"--base_lr={LEARNING_RATE}",
        "--lr_scaling=none", "--norandom_flip", "--random_shift=0",
        "--mixed_precision=none", f"--model_dir={model_dir}",
        "--progress=none", *(f"--{flag}" for flag in own_flags)])
  return interleaved.images_per_sec(model_dir)


def _shared_flags() -> list[str]:
  return [f"--{name}={getattr(FLAGS, name)}" for name in (
      "batch_size", "batches_per_iter", "iters")]


def worker(model_dir: str) -> None:
  """The benchmark's method; an epoch record per timed iteration (the
  first, the warm-up, as epoch 1)."""
  # pylint: disable=import-outside-toplevel
  import horovod.tensorflow as hvd
  import keras
  import tensorflow as tf
  # pylint: enable=import-outside-toplevel
  hvd.init()
  model = keras.applications.ResNet50(weights=None)
  optimizer = keras.optimizers.SGD(LEARNING_RATE)
  images = tf.random.uniform([FLAGS.batch_size, 224, 224, 3])
  labels = tf.random.uniform([FLAGS.batch_size, 1], maxval=999, dtype=tf.int64)

  @tf.function
  def step(first_batch):
    with tf.GradientTape() as tape:
      loss = keras.losses.sparse_categorical_crossentropy(
          labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    gradients = tape.gradient(loss, _tf_variables(model.trainable_variables))
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    if first_batch:
      hvd.broadcast_variables(_tf_variables(model.variables), root_rank=0)
      hvd.broadcast_variables(_tf_variables(optimizer.variables), root_rank=0)
    return loss

  timer = epochs.EpochTimer(
      os.path.join(model_dir, "metrics.jsonl"),
      images_per_epoch=FLAGS.batches_per_iter * FLAGS.batch_size * hvd.size(),
      world_size=hvd.size(),
      intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads(),
      inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads(),
      chief=hvd.rank() == 0)
  for epoch in range(1, FLAGS.iters + 2):
    timer.start()
    for batch in range(FLAGS.batches_per_iter):
      loss = step(epoch == 1 and batch == 0)
    loss.numpy()
    timer.end(epoch)


def _tf_variables(variables: list) -> list:
  """Keras 3's variables as the tf.Variables Horovod's tape and broadcast
  take: given Keras' own, the script as Horovod wrote it fails under
  TensorFlow 2.16+ ('Variable' object has no attribute 'ref')."""
  return [variable.value for variable in variables]


if __name__ == "__main__":
  app.run(main)
