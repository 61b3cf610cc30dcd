"""Flags: batch, epochs, stopping, seed, progress and where the run writes."""
from absl import flags

from engine.loop import progress

flags.DEFINE_integer("batch_size", 128,
                     "Examples per process per step. The global batch is "
                     "batch_size x the number of processes.", lower_bound=1)
flags.DEFINE_integer("epochs", 7, "Epochs to train.", lower_bound=1)
flags.DEFINE_integer("steps_per_epoch", 0,
                     "Steps per epoch, the same on every process. 0: one pass "
                     "over the training set, floor(examples / global batch).",
                     lower_bound=0)
flags.DEFINE_float("target_accuracy", 0.0,
                   "Stop early after --patience consecutive epochs with "
                   "validation accuracy at or above this. 0: never.",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_integer("patience", 2,
                     "Consecutive epochs at --target_accuracy before stopping.",
                     lower_bound=1)
flags.DEFINE_string("model_dir", "",
                    "Directory for the run's outputs: metrics.jsonl and "
                    "TensorBoard summaries (tensorboard/). Empty: "
                    "runs/<dataset>_<model>.")
flags.DEFINE_integer("eval_every_epochs", 1,
                     "Evaluate on the test split every this many epochs, and "
                     "after the last one always. Early stopping and the best "
                     "checkpoint look at evaluated epochs only; the others' "
                     "records have null validation figures.", lower_bound=1)
flags.DEFINE_integer("summary_every_steps", 50,
                     "Every this many global steps, rank 0 writes its loss, "
                     "accuracy and step time over those steps, and the "
                     "learning rate, to TensorBoard (batch_* in "
                     "tensorboard/train). 0: once an epoch only.",
                     lower_bound=0)
flags.DEFINE_integer("seed", 0,
                     "Seed of the initial weights, the data order and the "
                     "augmentation.", lower_bound=0)
flags.DEFINE_string(
    "callbacks", "",
    "Keras callbacks for the run: package.module:function or "
    "path/to/file.py:function returning a list of keras.callbacks.Callback "
    "(EarlyStopping, ReduceLROnPlateau, CSVLogger, your own), run on every "
    "rank with the epoch's exact figures; those writing files on rank 0 "
    "(docs/from-fit.md).")
flags.DEFINE_enum("progress", "auto", progress.MODES,
                  "Progress within an epoch, on rank 0: a bar, log lines "
                  "(one per tenth of an epoch), or none. auto: a bar on a "
                  "terminal, log lines otherwise (as under horovodrun).",
                  case_sensitive=False)
