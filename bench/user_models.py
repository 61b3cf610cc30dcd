r"""A user's model file trained by Keras 3 `fit` and by the engine,
interleaved: is the engine ahead of `fit` on the model a user brings?

  .venv/bin/python -m bench.user_models --models=guide_resnet --repeats=2
  .venv/bin/python -m bench.user_models \
      --models=guide_resnet,mobilenet_v2,resnet50_v2 --repeats=3

Each model of bench/user_model_files.py (Keras' layers only, no engine
import) trains on real Fashion-MNIST for --epochs of --steps_per_epoch
steps at a global batch of --global_batch, Adam at 1e-3, no augmentation,
by each variant:

- `fit`: Keras 3's `model.fit` in one process on all cores, as a user
  runs it (`--worker` below, TensorFlow's own thread pools), with
  `steps_per_execution` --steps_per_execution, in float32;
  `fit-xla` with `jit_compile`, `fit-bfloat16` under Keras'
  `mixed_bfloat16` policy;
- `engine-1` and `engine-2`: `engine.train` on 1 and 2 processes
  (`horovodrun --gloo`; `engine-2-mpi`: `horovodrun --mpi`, Horovod's
  MPI controller), at its defaults (`--mixed_precision=auto`
  measures float32 against bfloat16 where the CPU has AVX512_BF16 or AMX);
  `--engine_flags` adds flags to every engine run, and a variant
  `engine-1+mixed_precision=none+fused_batch_norm=off` to its own (that
  one: the engine before it fused a user's batch norm, in float32).

Every run prints its images/s per epoch (the median of the epochs after
the first is its figure) and the training accuracy of its last epoch;
then each variant's medians and its ratio to `fit` per round.
"""
import os
import shutil
import statistics

from absl import app
from absl import flags

from bench import epochs
from bench import interleaved

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["guide_resnet"],
                  "Functions of bench/user_model_files.py.")
flags.DEFINE_list("variants", ["fit", "fit-bfloat16", "engine-1", "engine-2"],
                  "fit, fit-xla, fit-bfloat16, engine-N (N processes on "
                  "Gloo), engine-N-mpi (on MPI), and engine-N+FLAG "
                  "(+FLAG...) with flags of its own: "
                  "engine-1+fused_batch_norm=off.")
flags.DEFINE_integer("repeats", 2, "Rounds.", lower_bound=1)
flags.DEFINE_integer("epochs", 3, "Epochs a run.", lower_bound=2)
flags.DEFINE_integer("steps_per_epoch", 80, "Steps an epoch.", lower_bound=1)
flags.DEFINE_integer("global_batch", 128, "Images a step, all processes.")
flags.DEFINE_integer("steps_per_execution", 8, "fit's steps a call.")
flags.DEFINE_list("engine_flags", [], "Flags added to every engine run.")
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "user_models"),
                    "Each run's directory, emptied before it runs.")
flags.DEFINE_string("worker", "", "(internal) MODEL,MODEL_DIR,VARIANT: "
                    "train with fit in this process.")
MODEL_FILE = "bench/user_model_files.py"
LEARNING_RATE = 1e-3


def main(argv):
  del argv
  if FLAGS.worker:
    return fit_worker(*FLAGS.worker.split(","))
  print(f"CPU: {interleaved.cpu()}; {os.cpu_count()} cores", flush=True)
  for model in FLAGS.models:
    results = interleaved.rounds(
        FLAGS.variants, lambda variant, round_: run(model, variant, round_),
        FLAGS.repeats, show=lambda variant, round_, result: (
            f"  {model} round {round_ + 1} {variant}: "
            f"{result['images_per_sec']:.0f} img/s, train accuracy "
            f"{result['train_accuracy']:.3f}; epochs "
            + " ".join(f"{r:.0f}" for r in result["epochs"])
            + "; load %.2f -> %.2f" % result["load"]))
    reference = results[FLAGS.variants[0]]
    for variant, runs in results.items():
      ratios = [mine["images_per_sec"] / theirs["images_per_sec"]
                for mine, theirs in zip(runs, reference)]
      print(f"{model} {variant}: median "
            f"{statistics.median(r['images_per_sec'] for r in runs):.0f} "
            f"img/s; / {FLAGS.variants[0]} by round "
            + ", ".join(f"{r:.3f}" for r in ratios), flush=True)


def run(model: str, variant: str, round_: int) -> dict:
  model_dir = os.path.join(FLAGS.out_dir, f"{model}_{variant}_{round_}")
  shutil.rmtree(model_dir, ignore_errors=True)
  os.makedirs(model_dir)
  load_before = interleaved.load()
  if variant.startswith("fit"):
    interleaved.launch([interleaved.PYTHON, "-m", "bench.user_models",
                        f"--worker={model},{model_dir},{variant}",
                        *_shared_flags()])
  else:
    _, processes, controller, own_flags = interleaved.variant(variant)
    interleaved.launch([
        interleaved.HOROVODRUN, f"--{controller}", "-np", str(processes),
        interleaved.PYTHON, "-m", "engine.train",
        f"--model={MODEL_FILE}:{model}", "--dataset=fashion_mnist",
        f"--batch_size={FLAGS.global_batch // processes}",
        f"--epochs={FLAGS.epochs}",
        f"--steps_per_epoch={FLAGS.steps_per_epoch}",
        "--optimizer=adam", f"--base_lr={LEARNING_RATE / processes}",
        "--norandom_flip", "--random_shift=0",
        f"--eval_every_epochs={FLAGS.epochs}",
        f"--model_dir={model_dir}", "--progress=none",
        *FLAGS.engine_flags, *(f"--{flag}" for flag in own_flags)])
  records = interleaved.epochs(model_dir)
  return {"images_per_sec": statistics.median(interleaved.measured(records)),
          "epochs": [r["images_per_sec"] for r in records],
          "train_accuracy": records[-1]["train_accuracy"],
          "load": (load_before, interleaved.load())}


def _shared_flags() -> list[str]:
  return [f"--{name}={getattr(FLAGS, name)}" for name in (
      "epochs", "steps_per_epoch", "global_batch", "steps_per_execution")]


def fit_worker(model_name: str, model_dir: str, variant: str) -> None:
  """Keras `fit` as a user writes it: the model file's function, the data
  normalized as the engine normalizes it, batches of --global_batch
  shuffled from the whole training set; an epoch record per epoch in the
  engine's shape (bench/epochs.py's keys, and train_accuracy)."""
  # pylint: disable=import-outside-toplevel
  import keras
  import tensorflow as tf

  from bench import user_model_files
  from engine.datasets import fashion_mnist
  # pylint: enable=import-outside-toplevel
  splits = fashion_mnist.load("")
  info = splits.info
  train = (tf.data.Dataset.from_tensor_slices((splits.train.images,
                                               splits.train.labels))
           .shuffle(10000, seed=0).repeat()
           .map(lambda x, y: (info.normalized(x), y),
                num_parallel_calls=tf.data.AUTOTUNE)
           .batch(FLAGS.global_batch, drop_remainder=True)
           .prefetch(tf.data.AUTOTUNE))
  keras.utils.set_random_seed(0)
  if variant == "fit-bfloat16":  # Keras' mixed precision, as its guide sets it
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
  model = getattr(user_model_files, model_name)(info.image_shape,
                                                info.num_classes)
  model.compile(
      optimizer=keras.optimizers.Adam(LEARNING_RATE),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=["accuracy"], steps_per_execution=FLAGS.steps_per_execution,
      jit_compile=variant == "fit-xla")
  timer = epochs.EpochTimer(
      os.path.join(model_dir, "metrics.jsonl"),
      images_per_epoch=FLAGS.steps_per_epoch * FLAGS.global_batch,
      world_size=1,
      intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads(),
      inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads(),
      chief=True)
  model.fit(train, epochs=FLAGS.epochs, steps_per_epoch=FLAGS.steps_per_epoch,
            callbacks=[epochs.TimeEpochs(timer, figures=("accuracy",))],
            verbose=0)


if __name__ == "__main__":
  app.run(main)
